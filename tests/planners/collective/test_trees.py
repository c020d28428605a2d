"""Spanning-tree packing (Wang, Li, Liberty, Smola, SysML'18): closed forms, the paper's values, brute force,
the column-generation certificate, and the realised collectives."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from mlopt.errors import InfeasibleError
from mlopt.formats.topology import Link, Node, Switch, Topology, from_spec
from mlopt.planners.collective.algorithm import check_algorithm
from mlopt.planners.collective.trees import (
    choose_chunks_per_rank,
    estimate_time,
    largest_remainder,
    lemma21_paper_bound,
    list_schedule,
    packing_lp,
    rounded_rate_GBps,
    tree_allgather,
    tree_allreduce,
    tree_broadcast,
    tree_reduce,
    tree_reducescatter,
)
from mlopt.formats.msccl_xml import write_program
from mlopt.planners.collective.planner import CollectiveOptions, candidates, evaluate
from mlopt.planners.collective.trees_graph import minimum_arborescence
from mlopt.planners.collective.trees_resources import resource_model
from mlopt.planners.collective.trees_schedule import simulated_time_us
from mlopt.planners.options import PlannerOptions
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.network import NetworkModel
from mlopt.sim.report import simulation_rows
from mlopt.solvers import Model, Status, get_solver

LANE = 1000.0 / 46.0  # GB/s of one generated / NDv2 NVLink lane
REL = 1e-6


def graph(n: int, edges: dict[tuple[int, int], float], name: str = "custom") -> Topology:
    """Symmetric links of the given GB/s between the listed pairs, one node, no switch."""
    links = []
    for (a, b), bw in edges.items():
        links += [Link(a, b, 0.7, 1000.0 / bw, "nvlink"), Link(b, a, 0.7, 1000.0 / bw, "nvlink")]
    return Topology(name, (Node("node0", tuple(range(n))),), tuple(sorted(links, key=lambda l: (l.src, l.dst))))


def is_spanning_tree(n: int, edges) -> bool:
    """n - 1 edges joining all of 0..n-1 without a cycle (union-find)."""
    edges = list(edges)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra == rb:
            return False
        parent[ra] = rb
    return len(edges) == n - 1


def spanning_trees(n: int, pairs: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Every spanning tree, as indices into pairs (brute force over (n - 1)-subsets)."""
    return [c for c in itertools.combinations(range(len(pairs)), n - 1) if is_spanning_tree(n, [pairs[i] for i in c])]


def arborescences(n: int, arcs, root: int):
    """Every spanning out-arborescence rooted at root, as {child: parent} (brute force over parent choices)."""
    others = [v for v in range(n) if v != root]
    for parents in itertools.product(range(n), repeat=len(others)):
        par = dict(zip(others, parents))
        if all((p, v) in arcs for v, p in par.items()) and all(_reaches(par, v, root) for v in others):
            yield par


def brute_force_rate(columns: list[dict], caps: dict, groups: list[int] | None = None) -> float:
    """max x s.t. x <= sum of the group's y (one group if None), sum_T use_r(T) y_T <= cap_r: the full LP."""
    model = Model("brute")
    y = model.add_vars("y", len(columns))
    x = model.add_var("x")
    for r, cap in caps.items():
        idx = [k for k, col in enumerate(columns) if col.get(r)]
        if idx:
            model.add_le([y[k] for k in idx], [columns[k][r] for k in idx], cap)
    for g in set(groups or [0] * len(columns)):
        mine = [k for k in range(len(columns)) if (groups or [0] * len(columns))[k] == g]
        model.add_le([x] + [y[k] for k in mine], [1.0] + [-1.0] * len(mine), 0.0)
    model.set_objective([x], [1.0], "max")
    result = get_solver("highs").solve(model)
    assert result.status is Status.OPTIMAL
    return float(result.objective)


# ---------------------------------------------------------------------------------------------------------
# Closed forms


@pytest.mark.parametrize("n", [3, 5, 8])
def test_cycle_packs_n_over_n_minus_1_trees(n):
    p = packing_lp(from_spec(f"ring:{n}"))
    assert p.status is Status.OPTIMAL
    assert p.rate_GBps == pytest.approx(n / (n - 1) * LANE, rel=REL)
    assert p.paper_C(1e6) == pytest.approx(1e6 / (p.rate_GBps * 1e3))


@pytest.mark.parametrize("n", [3, 4, 6])
def test_complete_graph_packs_n_over_2_trees(n):
    p = packing_lp(from_spec(f"fully-connected:{n}"))
    assert p.rate_GBps == pytest.approx(n / 2 * LANE, rel=REL)


def test_a_tree_carries_its_bottleneck_edge():
    topo = graph(5, {(0, 1): 40.0, (1, 2): 25.0, (1, 3): 60.0, (3, 4): 30.0})
    p = packing_lp(topo)
    assert p.rate_GBps == pytest.approx(25.0, rel=REL)
    assert len(p.trees) == 1 and sorted(p.trees[0].edges) == [(0, 1), (1, 2), (1, 3), (3, 4)]
    # the single tree is also the maximum-bottleneck tree of Lemma 2.1
    assert p.lemma.mwst_rate_GBps == pytest.approx(25.0) and p.lemma.min_edge_GBps == pytest.approx(25.0)


def test_directed_capacity_is_the_slower_direction():
    topo = graph(3, {(0, 1): 20.0, (1, 2): 20.0, (0, 2): 20.0})
    slow = [l if (l.src, l.dst) != (1, 0) else Link(1, 0, 0.7, 1000.0 / 5.0, "nvlink") for l in topo.links]
    p = packing_lp(Topology("asym", topo.nodes, tuple(slow)))
    # allreduce sends both ways over every tree edge, so pair {0, 1} is worth min(20, 5) = 5 GB/s; trees
    # {01,12}, {01,02}, {12,02}: y1 + y2 <= 5, y1 + y3 <= 20, y2 + y3 <= 20, optimum 45 / 2
    assert p.rate_GBps == pytest.approx(22.5, rel=REL)
    # one-way broadcast from 0 can use the fast direction 0 -> 1: in-degree bound 40 at... min cut is 40
    assert packing_lp(Topology("asym", topo.nodes, tuple(slow)), mode="broadcast", root=0).rate_GBps == \
        pytest.approx(40.0, rel=REL)


def test_star_through_a_switch_is_ring_bandwidth_not_hub_bandwidth():
    """A switch cannot aggregate: a rank with d tree neighbours through it uses its port d times. The
    allreduce capacity of switch:n is then n B / (2 (n - 1)), as ring allreduce achieves, not the B of a
    star whose hub aggregates."""
    for n in (3, 4, 6):
        p = packing_lp(from_spec(f"switch:{n}"))
        assert p.rate_GBps == pytest.approx(n * LANE / (2 * (n - 1)), rel=REL)
        assert p.lemma.rate_upper_GBps == pytest.approx(p.rate_GBps, rel=REL)  # the uniform dual is tight
        assert all(key[0] in ("tx", "rx") for key in p.binding)
    # the same star with a rank as the hub (direct links, the hub aggregates) is a tree: rate = one edge
    hub = graph(5, {(0, k): LANE for k in range(1, 5)})
    assert packing_lp(hub).rate_GBps == pytest.approx(LANE, rel=REL)


def test_switch_model_against_brute_force_over_rank_trees():
    """4 ranks on a 30 GB/s-per-port switch, the links of rank 2 limited to 10 GB/s: brute force over all
    16 spanning trees of K4, each using link {a, b} once and rank x's port deg_T(x) times per direction."""
    n, speed = 4, {0: 30.0, 1: 30.0, 2: 10.0, 3: 30.0}
    ranks = tuple(range(n))
    switches = (Switch("sw", "generic", ranks, 0.5, 1000.0 / 30.0),)
    links = tuple(Link(a, b, 0.5, 1000.0 / min(speed[a], speed[b]), "switch", switch="sw")
                  for a in ranks for b in ranks if a != b)
    topo = Topology("sw4", (Node("node0", ranks),), links, switches)
    pairs = [(a, b) for a in ranks for b in ranks if a < b]
    columns = []
    for tree in spanning_trees(n, pairs):
        col: dict = {}
        for i in tree:
            a, b = pairs[i]
            col[("link", a, b)] = 1
            for x in (a, b):
                col[("port", x)] = col.get(("port", x), 0) + 1
        columns.append(col)
    caps = {("port", x): 30.0 for x in ranks}
    caps.update({("link", a, b): min(speed[a], speed[b]) for a, b in pairs})
    p = packing_lp(topo)
    assert p.status is Status.OPTIMAL
    assert p.rate_GBps == pytest.approx(brute_force_rate(columns, caps), rel=REL)


# ---------------------------------------------------------------------------------------------------------
# The paper's machines


def test_ndv2_is_the_papers_p3_16xlarge_value():
    """Section 2: P3.16xlarge / DGX-1 (24 NVLink lanes on 8 V100s) has C(G) = 7/24 in units of one lane's
    transfer time, equal to Lemma 2.1's bound; the best single tree (the chain of double NVLinks) takes 1/2."""
    p = packing_lp(from_spec("ndv2"))
    unit = LANE * 1e3  # bytes one lane sends in 1 us: c_e = 1 for a single NVLink
    assert p.paper_C(unit) == pytest.approx(7 / 24, rel=REL)
    assert p.lemma.exact and p.lemma.time_lower_us(unit) == pytest.approx(7 / 24, rel=REL)
    assert lemma21_paper_bound(from_spec("ndv2")) == pytest.approx(24 / 7 * LANE, rel=REL)
    assert unit / (p.lemma.mwst_rate_GBps * 1e3) == pytest.approx(1 / 2, rel=REL)


def test_half_an_ndv2_is_the_papers_p3_8xlarge_value():
    """P3.8xlarge (4 of the GPUs, 9 lanes among them): C(G) = 1/3."""
    p = packing_lp(from_spec("ndv2"), ranks=[0, 1, 2, 3])
    assert p.ranks == (0, 1, 2, 3)
    assert p.paper_C(LANE * 1e3) == pytest.approx(1 / 3, rel=REL)
    assert all(a < 4 and b < 4 for t in p.trees for a, b in t.edges)


def test_dgx2_and_shared_nics():
    p = packing_lp(from_spec("dgx2"))  # NVSwitch, 125 GB/s ports
    assert p.rate_GBps == pytest.approx(16 * 125.0 / 30, rel=REL)
    two = packing_lp(from_spec("ndv2x2"))  # one 9.43 GB/s NIC shared by 8 GPUs per node is the cut
    assert two.rate_GBps == pytest.approx(1000.0 / 106.0, rel=REL)
    assert any(key[0].startswith("nic") for key in two.binding)
    assert packing_lp(from_spec("ndv2x2"), mode="allgather").rate_GBps == pytest.approx(1000.0 / 106.0 / 8, rel=REL)


@pytest.mark.parametrize("spec", ["ring:6", "fully-connected:5", "torus:3x3", "ndv2"])
def test_lemma21_chain_on_plain_graphs(spec):
    """eq. 3 in rate form: min_e bw_e <= R(T_MWST) <= R(G) <= sum_e bw_e / (n - 1)."""
    topo = from_spec(spec)
    p = packing_lp(topo)
    lemma = p.lemma
    assert lemma.exact
    assert lemma.rate_upper_GBps == pytest.approx(lemma21_paper_bound(topo), rel=1e-12)
    assert lemma.min_edge_GBps <= lemma.mwst_rate_GBps * (1 + REL)
    assert lemma.mwst_rate_GBps <= p.rate_GBps * (1 + REL)
    assert p.rate_GBps <= lemma.rate_upper_GBps * (1 + REL)


def test_disconnected_ranks_have_no_tree():
    with pytest.raises(InfeasibleError):
        packing_lp(from_spec("ndv2"), ranks=[0, 5])  # no NVLink between GPUs 0 and 5


# ---------------------------------------------------------------------------------------------------------
# Column generation against brute force, and its certificate


CHORDED_5_CYCLE = {(0, 1): 10.0, (1, 2): 20.0, (2, 3): 15.0, (3, 4): 25.0, (0, 4): 5.0, (1, 3): 30.0}
K4_MIXED = {(0, 1): 10.0, (0, 2): 20.0, (0, 3): 30.0, (1, 2): 5.0, (1, 3): 25.0, (2, 3): 12.0}


@pytest.mark.parametrize("n,edges", [(4, K4_MIXED), (5, CHORDED_5_CYCLE), (4, {e: 1.0 for e in K4_MIXED})])
def test_column_generation_matches_brute_force(n, edges):
    topo = graph(n, edges)
    pairs = sorted(edges)
    columns = [{pairs[i]: 1 for i in tree} for tree in spanning_trees(n, pairs)]
    best = brute_force_rate(columns, dict(edges))
    p = packing_lp(topo)
    assert p.status is Status.OPTIMAL
    assert p.rate_GBps == pytest.approx(best, rel=REL)
    assert p.upper_bound_GBps == pytest.approx(best, rel=REL)
    assert p.min_reduced_cost >= -1e-6  # certificate: no tree has negative reduced cost
    load = {e: 0.0 for e in edges}  # the returned trees are spanning trees and respect capacities
    for t in p.trees:
        assert is_spanning_tree(n, t.edges)
        for e in t.edges:
            load[e] += t.weight_GBps
    assert all(load[e] <= edges[e] * (1 + REL) for e in edges)
    assert sum(t.weight_GBps for t in p.trees) == pytest.approx(p.rate_GBps, rel=REL)


def test_arborescence_modes_match_brute_force():
    """reduce into rank 0 and allgather from every rank on K4_MIXED, against all (in/out-)arborescences."""
    n, topo = 4, graph(4, K4_MIXED)
    cap = {}
    for (a, b), bw in K4_MIXED.items():
        cap[(a, b)] = cap[(b, a)] = bw
    # in-arborescences into 0 are out-arborescences of the reversed (here: the same) arcs
    reduce_cols = [{(v, p): 1 for v, p in par.items()} for par in arborescences(n, cap, 0)]  # child -> parent
    p = packing_lp(topo, mode="reduce", root=0)
    assert p.rate_GBps == pytest.approx(brute_force_rate(reduce_cols, cap), rel=REL)
    cols, groups = [], []
    for r in range(n):
        for par in arborescences(n, cap, r):
            cols.append({(p_, v): 1 for v, p_ in par.items()})  # parent -> child arcs
            groups.append(r)
    p = packing_lp(topo, mode="allgather")
    assert p.rate_GBps == pytest.approx(brute_force_rate(cols, cap, groups), rel=REL)
    assert {t.root for t in p.trees} == set(range(n))


def _reaches(par: dict, v: int, root: int) -> bool:
    seen = set()
    while v != root:
        if v in seen:
            return False
        seen.add(v)
        v = par[v]
    return True


def test_stopping_early_is_reported_with_a_gap():
    p = packing_lp(from_spec("torus:4x4"), max_iterations=1)
    assert p.status is Status.FEASIBLE
    assert p.gap > 1e-3 and p.min_reduced_cost < -1e-3
    assert p.upper_bound_GBps >= packing_lp(from_spec("torus:4x4")).rate_GBps * (1 - REL)


def test_edmonds_matches_brute_force():
    rng = random.Random(7)
    for _ in range(80):
        n = rng.randint(2, 5)
        arcs = [(u, v) for u in range(n) for v in range(n) if u != v and rng.random() < 0.6]
        weights = np.array([rng.choice([0.0, 1.0, 2.0, rng.random()]) for _ in arcs])
        weight = dict(zip(arcs, weights))
        root = rng.randrange(n)
        got = minimum_arborescence(range(n), arcs, weights, root)
        costs = [sum(weight[(p, v)] for v, p in par.items()) for par in arborescences(n, weight, root)]
        if not costs:
            assert got is None
            continue
        assert got is not None and len(got) == n - 1
        par = {arcs[i][1]: arcs[i][0] for i in got}
        assert root not in par and all(_reaches(par, v, root) for v in range(n))
        assert weights[got].sum() == pytest.approx(min(costs))


# ---------------------------------------------------------------------------------------------------------
# Realised collectives


def test_largest_remainder():
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]
    assert largest_remainder([0.5, 0.3, 0.2], 7) == [4, 2, 1]
    assert sum(largest_remainder([3.3, 1.1, 0.05], 13)) == 13


KINDS = {
    "allreduce": (tree_allreduce, "allreduce"),
    "reduce": (tree_reduce, "reduce"),
    "broadcast": (tree_broadcast, "broadcast"),
    "allgather": (tree_allgather, "allgather"),
    "reducescatter": (tree_reducescatter, "reducescatter"),
}


@pytest.mark.parametrize("spec", ["ring:5", "ndv2", "switch:4", "ndv2x2"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_tree_collectives_are_correct_and_above_lemma21(spec, kind):
    topo = from_spec(spec)
    realise, mode = KINDS[kind]
    root = 1
    packing = packing_lp(topo, mode=mode, root=root if kind in ("reduce", "broadcast") else None)
    k = choose_chunks_per_rank(topo, packing)
    alg = realise(topo, CollectiveSpec(kind, topo.num_ranks, k, root), packing, 8e6)
    assert check_algorithm(alg) == []
    links = topo.link_map()
    assert all((t.src, t.dst) in links for t in alg.transfers)
    assert all(t.start_us is not None for t in alg.transfers)
    est = estimate_time(alg, topo, 8e6)
    lemma = packing.lemma21_time_us(8e6)
    fluid = packing.time_us(8e6)
    assert lemma <= fluid * (1 + REL)
    assert fluid <= est.bandwidth_us * (1 + REL)  # no realisation beats the LP
    assert est.bandwidth_us <= est.predicted_us and lemma <= est.schedule_us
    # the chunk split keeps the LP's rate within choose_chunks_per_rank's tolerance when it can
    if rounded_rate_GBps(topo, packing, k) >= 0.98 * packing.rate_GBps:
        assert est.bandwidth_us <= fluid / 0.98 * (1 + REL)


@pytest.mark.parametrize("kind", ["reduce", "broadcast", "allgather", "reducescatter"])
def test_one_way_collectives_from_allreduce_trees(kind):
    topo = from_spec("ndv2")
    packing = packing_lp(topo)
    alg = KINDS[kind][0](topo, CollectiveSpec(kind, 8, 4, root=3), packing)
    assert check_algorithm(alg) == []


def test_allreduce_splits_chunks_by_weight_and_pipelines_steps():
    topo = from_spec("ndv2")
    packing = packing_lp(topo)
    k = choose_chunks_per_rank(topo, packing)
    alg = tree_allreduce(topo, CollectiveSpec("allreduce", 8, k), packing)
    # every chunk uses one tree: 7 reduce + 7 broadcast transfers
    per_chunk = {}
    for t in alg.transfers:
        per_chunk.setdefault(t.chunk, []).append(t)
    assert len(per_chunk) == 8 * k and all(len(ts) == 14 for ts in per_chunk.values())
    assert all(sum(t.reduce for t in ts) == 7 for ts in per_chunk.values())
    # reduce transfers precede every broadcast transfer of their chunk
    for ts in per_chunk.values():
        assert max(t.step for t in ts if t.reduce) < min(t.step for t in ts if not t.reduce)
    counts = largest_remainder([t.weight_GBps for t in packing.trees], 8 * k)
    used = sorted(c for c in counts if c)
    trees_seen = {}
    for ts in per_chunk.values():
        trees_seen.setdefault(frozenset(frozenset((t.src, t.dst)) for t in ts), []).append(1)
    assert sorted(len(v) for v in trees_seen.values()) == used


def test_pipeline_estimate_and_schedule():
    topo = from_spec("ring:4")
    packing = packing_lp(topo)
    one = tree_allreduce(topo, CollectiveSpec("allreduce", 4, 1), packing)
    many = tree_allreduce(topo, CollectiveSpec("allreduce", 4, 16), packing)
    big = 64e6
    e1, e16 = estimate_time(one, topo, big), estimate_time(many, topo, big)
    assert e16.predicted_us < e1.predicted_us  # more chunks: shorter fill and drain
    assert e16.bandwidth_us == pytest.approx(e1.bandwidth_us) == pytest.approx(packing.time_us(big), rel=REL)
    assert choose_chunks_per_rank(topo, packing, buffer_bytes=big) > choose_chunks_per_rank(topo, packing)
    # the list schedule respects data dependencies and uses each link for one message at a time
    alg, makespan = list_schedule(many, topo, big)
    chunk_us = {(t.src, t.dst): topo.link_map()[(t.src, t.dst)].time_us(big / alg.num_chunks) for t in alg.transfers}
    arrive = {}
    for t in sorted(alg.transfers, key=lambda t: t.step):
        assert t.start_us >= arrive.get((t.chunk, t.src), 0.0) - 1e-9
        end = t.start_us + chunk_us[(t.src, t.dst)]
        arrive[(t.chunk, t.dst)] = max(arrive.get((t.chunk, t.dst), 0.0), end)
    by_link = {}
    for t in alg.transfers:
        by_link.setdefault((t.src, t.dst), []).append((t.start_us, t.start_us + chunk_us[(t.src, t.dst)]))
    for spans in by_link.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))
    assert makespan == pytest.approx(max(arrive.values()))
    assert not math.isnan(e16.schedule_us)


def test_rooted_packing_must_match_the_spec_root():
    topo = from_spec("ring:5")
    packing = packing_lp(topo, mode="reduce", root=2)
    with pytest.raises(ValueError):
        tree_reduce(topo, CollectiveSpec("reduce", 5, 2, root=0), packing)


# ---------------------------------------------------------------------------------------------------------
# One network model: the trees planner's resources and times are the simulator's


@pytest.mark.parametrize("spec", ["ndv2x2", "switch:4", "dgx2"])
def test_lp_resources_are_the_simulators(spec):
    topo = from_spec(spec)
    lp = resource_model(topo)
    sim = NetworkModel(topo, local_GBps=None)
    for (a, b), used in lp.arcs.items():
        route = sim.route(a, b)
        assert [lp.keys[r] for r in used] == [sim.resources.hop(route.link)[i].key for i in range(len(used))]
        assert [float(lp.capacity_GBps[r]) * 1e3 for r in used] == pytest.approx(
            [sim.capacities[r] for r in route.account], rel=1e-15)


@pytest.mark.parametrize("spec,kind,size", [("ring:4", "allreduce", 64e6), ("ndv2x2", "allgather", 2**20),
                                            ("fully-connected:4", "broadcast", 2**20)])
def test_trees_plan_time_is_what_mlopt_simulate_gives(spec, kind, size, tmp_path):
    topo = from_spec(spec)
    copts = CollectiveOptions(kind, int(size), algorithm="trees", root=1 if kind == "broadcast" else 0)
    cand = [c for c in candidates(topo, copts, PlannerOptions(), []) if c.family == "trees"][0]
    outcome = evaluate(cand, topo, copts)
    assert outcome.ok, outcome.reason
    alg = outcome.algorithm
    # the planner's own prediction for its chosen plan (what choose_chunks_per_rank compared) ...
    predicted = estimate_time(alg, topo, size).simulated_us
    # ... is what `mlopt simulate` prints for the plan's program: same engine, same resources
    xml = tmp_path / "trees.xml"
    xml.write_text(write_program(outcome.program))
    [row] = simulation_rows([str(xml)], topo, [int(size)])
    assert predicted == pytest.approx(row["time_us"], rel=1e-12)
    assert outcome.time_us == pytest.approx(row["time_us"], rel=1e-12)
    # and the chosen chunk count is no worse, simulated, than the smallest one the rounding allows
    packing = packing_lp(topo, mode="allreduce" if kind == "allreduce" else kind, root=copts.root if kind == "broadcast" else None)
    k0 = choose_chunks_per_rank(topo, packing, kind=kind, root=copts.root, max_chunks_per_rank=8)
    first = KINDS[kind][0](topo, CollectiveSpec(kind, topo.num_ranks, k0, copts.root), packing, size)
    assert predicted <= simulated_time_us(first, topo, size) * (1 + REL)

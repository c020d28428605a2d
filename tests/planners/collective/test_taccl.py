"""TACCL synthesizer (mlopt.planners.collective.taccl): hand-checkable optima, brute force, reference sketches,
combining collectives, bad sketches, fallbacks and determinism."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from mlopt.errors import InfeasibleError, InputError
from mlopt.formats.importers.taccl import import_taccl_sketch
from mlopt.formats.io import read_document
from mlopt.formats.topology import Link, Node, Topology, from_spec
from mlopt.planners.collective.algorithm import check_algorithm
from mlopt.planners.collective.lowering import lower
from mlopt.planners.collective.taccl import SynthesisOptions, synthesize
from mlopt.planners.collective.taccl import synthesizer as synth_module
from mlopt.planners.collective.taccl.synthesizer import chunk_count
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.network import simulate_program
from mlopt.solvers import SolveResult, Status, get_solver

from tests.conftest import reference

MB = 1e6
# Generated fabrics (ring:N, switch:N, fully-connected:N) use one V100 NVLink lane per link:
# alpha = 0.7 us, beta = 46 us/MB, so a 1 MB chunk takes lat = 0.7 + 46 * 1 = 46.7 us on a link.
LAT_1MB = 0.7 + 46.0 * 1.0
FAST = SynthesisOptions(time_limit_s=30)


def run(topology, kind, k=1, chunk=MB, sketch=None, options=FAST, source="<sketch>"):
    spec = CollectiveSpec(kind, topology.num_ranks, k)
    return synthesize(topology, sketch, spec, chunk * chunk_count(spec), options, sketch_source=source)


def sketch_of(doc: dict, source: str = "test-sketch.json"):
    return import_taccl_sketch(doc, source)


def assert_causal(alg):
    """Every transfer's step exceeds the steps of the transfers of its chunk that arrive at its source earlier
    in the same phase (copies: the one delivery; reductions: every child's partial sum)."""
    for t in alg.transfers:
        into = [u for u in alg.transfers if u.chunk == t.chunk and u.dst == t.src and u.reduce == t.reduce
                and u.step < t.step]
        later = [u for u in alg.transfers if u.chunk == t.chunk and u.dst == t.src and u.reduce == t.reduce
                 and u.step >= t.step and u.reduce]
        assert not later, f"{t} is sent before its source has reduced {later[0]}"
        if not t.reduce and alg.spec.kind == "allgather":
            assert t.src == t.chunk // alg.spec.chunks_per_rank or into, f"{t} sends a chunk its source lacks"


# ---------------------------------------------------------------------------------------------------------
# Tiny instances with hand-checkable optima


def test_ring4_allgather_is_proven_optimal():
    # Bidirectional ring 0-1-2-3-0, one 1 MB chunk per rank. A rank needs 3 chunks over its 2 in-links, so
    # some link carries 2 chunks: time >= 2 lat. The chunk of the opposite rank is 2 hops away: >= 2 lat.
    # 2 lat is reached: step 1 everyone sends its chunk both ways, step 2 forwards one of them clockwise.
    # 2 * (0.7 + 46 * 1) = 93.4 us.
    r = run(from_spec("ring:4"), "allgather")
    assert check_algorithm(r.algorithm) == []
    assert r.predicted_time_us == pytest.approx(2 * LAT_1MB)
    assert r.best_bound_us == pytest.approx(2 * LAT_1MB)
    assert r.status == "optimal" and r.gap == pytest.approx(0.0, abs=1e-9)
    assert {s.stage: s.status for s in r.stages} == {"routing": "optimal", "ordering": "heuristic",
                                                      "scheduling": "optimal"}
    assert len(r.algorithm.transfers) == 12  # 4 chunks x 3 destinations, each received once
    assert max(t.step for t in r.algorithm.transfers) == 2
    assert_causal(r.algorithm)


@pytest.mark.parametrize("strategy, links_used", [("uc-max", 12), ("uc-min", 4)])
def test_switch4_hyperedge_strategies(strategy, links_used):
    # 4 GPUs on one switch, one 1 MB chunk each. Every rank receives 3 chunks through its one switch port:
    # time >= 3 lat = 140.1 us, whatever the routing. Direct all-pairs (12 links) and a ring (4 links, 3 hops
    # for the farthest chunk, 3 chunks per link) both reach it; uc-max must pick all 12 links (Fig. 5.4),
    # uc-min the 4 links of a directed ring (Fig. 5.5).
    sk = sketch_of({"nnodes": 1, "intranode_sketch": {"strategy": "switch", "switches": [[0, 1, 2, 3]],
                                                       "switch_hyperedge_strategy": [strategy]},
                    "symmetry_offsets": [], "hyperparameters": {"input_chunkup": 1}})
    r = run(from_spec("switch:4"), "allgather", sketch=sk)
    assert check_algorithm(r.algorithm) == []
    links = {(t.src, t.dst) for t in r.algorithm.transfers}
    assert len(links) == links_used
    if strategy == "uc-min":
        nxt = dict(links)
        assert len(nxt) == 4 and sorted(nxt.values()) == [0, 1, 2, 3]  # a Hamiltonian cycle
    assert r.predicted_time_us == pytest.approx(3 * LAT_1MB)
    assert r.best_bound_us == pytest.approx(3 * LAT_1MB)  # the time-only re-solve removes the gamma term
    assert r.status == "optimal"
    # transfers through the switch never overlap at a port
    for port in ("src", "dst"):
        by_rank = {}
        for t in r.algorithm.transfers:
            by_rank.setdefault(getattr(t, port), []).append(t.start_us)
        for starts in by_rank.values():
            starts.sort()
            assert all(b - a >= LAT_1MB - 1e-6 for a, b in zip(starts, starts[1:]))


@pytest.mark.parametrize("slack", [0, 1])
def test_alltoall_fully_connected4_direct(slack):
    # Every (source, destination) pair has its own link and one chunk: time = lat = 46.7 us, direct sends.
    r = run(from_spec("fully-connected:4"), "alltoall", options=replace(FAST, hop_slack=slack))
    assert check_algorithm(r.algorithm) == []
    assert r.status == "optimal"
    assert r.predicted_time_us == pytest.approx(LAT_1MB)
    assert len(r.algorithm.transfers) == 12
    n, k = 4, 1
    for t in r.algorithm.transfers:
        s, d = divmod(t.chunk // k, n)
        assert (t.src, t.dst) == (s, d)


# ---------------------------------------------------------------------------------------------------------
# Brute force over routes on 3 ranks

TRI_BETAS = {(0, 1): 10.0, (1, 0): 20.0, (1, 2): 10.0, (2, 1): 30.0, (0, 2): 25.0, (2, 0): 15.0}


def triangle() -> Topology:
    links = tuple(Link(a, b, 0.7, beta, "nvlink") for (a, b), beta in sorted(TRI_BETAS.items()))
    return Topology("tri", (Node("node0", (0, 1, 2)),), links)


def trees(src: int):
    a, b = [r for r in range(3) if r != src]
    return [((src, a), (src, b)), ((src, a), (a, b)), ((src, b), (b, a))]


def relaxed_time(routes, lat) -> float:
    """Stage 1's objective for fixed routes: max(longest path, most loaded link)."""
    load, worst = {}, 0.0
    for tree in routes:
        arrive = {tree[0][0]: 0.0}
        for (u, v) in tree:
            arrive[v] = arrive[u] + lat[(u, v)]
            load[(u, v)] = load.get((u, v), 0.0) + lat[(u, v)]
        worst = max(worst, max(arrive.values()))
    return max(worst, max(load.values()))


def exact_time(routes, lat) -> float:
    """Best makespan of these routes over every order of the transfers on each link (one at a time)."""
    transfers = [(c, u, v) for c, tree in enumerate(routes) for (u, v) in tree]
    pred = {}
    for c, tree in enumerate(routes):
        for (u, v) in tree:
            pred[(c, u, v)] = [(c, w, x) for (w, x) in tree if x == u]
    by_link = {}
    for t in transfers:
        by_link.setdefault(t[1:], []).append(t)
    best = math.inf
    for orders in itertools.product(*(itertools.permutations(ts) for ts in by_link.values())):
        after = {t: list(pred[t]) for t in transfers}
        for seq in orders:
            for a, b in zip(seq, seq[1:]):
                after[b].append(a)
        finish, ok = {}, True
        for _ in transfers:  # longest path by relaxation; a cyclic order never settles
            for t in transfers:
                if all(p in finish for p in after[t]):
                    finish[t] = max((finish[p] for p in after[t]), default=0.0) + lat[t[1:]]
        ok = len(finish) == len(transfers)
        if ok:
            best = min(best, max(finish.values()))
    return best


def test_three_ranks_against_brute_force():
    topo = triangle()
    lat = {key: 0.7 + beta for key, beta in TRI_BETAS.items()}  # 1 MB chunks
    r = run(topo, "allgather")
    all_routes = list(itertools.product(*(trees(s) for s in range(3))))
    best_relaxed = min(relaxed_time(routes, lat) for routes in all_routes)
    best_exact = min(exact_time(routes, lat) for routes in all_routes)
    routing = next(s for s in r.stages if s.stage == "routing")
    assert routing.status == "optimal"
    assert routing.objective_us == pytest.approx(best_relaxed)  # stage 1 = brute force over routes
    assert r.best_bound_us <= best_exact + 1e-6  # the bound is valid for every algorithm of the family
    assert r.predicted_time_us >= best_exact - 1e-6  # and nothing beats the exact optimum
    if r.status == "optimal":
        assert r.predicted_time_us == pytest.approx(best_exact)
    assert check_algorithm(r.algorithm) == []


def test_three_ranks_two_chunks_relaxed_brute_force():
    topo = triangle()
    lat = {key: 0.7 + beta for key, beta in TRI_BETAS.items()}
    r = run(topo, "allgather", k=2)
    per_chunk = [trees(c // 2) for c in range(6)]
    best_relaxed = min(relaxed_time(routes, lat) for routes in itertools.product(*per_chunk))
    routing = next(s for s in r.stages if s.stage == "routing")
    assert routing.objective_us == pytest.approx(best_relaxed)
    assert check_algorithm(r.algorithm) == []
    assert r.predicted_time_us >= r.best_bound_us - 1e-6


# ---------------------------------------------------------------------------------------------------------
# Reference sketches on two NDv2 / DGX-2 nodes


def rotation(n, offset, group):
    return [(r % group + offset) % group + (r // group) * group for r in range(n)]


def assert_symmetric(alg, offsets):
    """The sends of rank r + offset are those of rank r, rotated (links within a symmetry group)."""
    k = alg.spec.chunks_per_rank
    sends = {(t.chunk, t.src, t.dst) for t in alg.transfers}
    for offset, group in offsets:
        sig = rotation(alg.spec.num_ranks, offset, group)
        for (c, u, v) in sends:
            if u // group != v // group:
                continue
            image = (sig[c // k] * k + c % k, sig[u], sig[v])
            assert image in sends, f"send {(c, u, v)} has no rotated twin {image} for offset {offset}"


@pytest.fixture(scope="module")
def ndv2_sk2():
    path = reference("taccl", "taccl_sketch_sk2-ndv2-n2.json")
    sketch = import_taccl_sketch(read_document(path), str(path))
    return sketch, run(from_spec("ndv2x2"), "allgather", k=sketch.input_chunkup, sketch=sketch, source=str(path))


@pytest.fixture(scope="module")
def dgx2_sk1():
    path = reference("taccl", "taccl_sketch_sk1-dgx2-n2.json")
    sketch = import_taccl_sketch(read_document(path), str(path))
    return sketch, run(from_spec("dgx2x2"), "allgather", k=sketch.input_chunkup, sketch=sketch, source=str(path))


def test_ndv2_sketch2_allgather(ndv2_sk2):
    sketch, r = ndv2_sk2
    alg = r.algorithm
    assert alg.spec.num_ranks == 16 and check_algorithm(alg) == []
    assert all((t.src, t.dst) in r.logical.links for t in alg.transfers)
    node = lambda x: x // 8  # noqa: E731
    for t in alg.transfers:  # relay: a chunk crosses nodes once, out of its own node
        if node(t.src) != node(t.dst):
            assert node(t.src) == node(t.chunk)
    # fully-connected IB: 64 logical links share each node's one NIC, so each gets beta * 64
    ib = r.logical.links[(0, 8)]
    assert ib.beta_split == 64 and ib.beta_us_per_MB == pytest.approx(106 * 64)
    assert_symmetric(alg, sketch.symmetry_offsets)
    assert_causal(alg)
    assert r.best_bound_us is not None and r.predicted_time_us >= r.best_bound_us - 1e-6
    assert r.status in ("optimal", "feasible")


def test_dgx2_sketch1_allgather(dgx2_sk1):
    sketch, r = dgx2_sk1
    alg = r.algorithm
    assert alg.spec.num_ranks == 32 and alg.spec.chunks_per_rank == 2 and check_algorithm(alg) == []
    assert all((t.src, t.dst) in r.logical.links for t in alg.transfers)
    k = 2
    for t in alg.transfers:
        if t.src // 16 == t.dst // 16:
            continue
        local_src, local_dst = t.src % 16, t.dst % 16
        assert local_src % 2 == 1 and local_dst == local_src - 1  # internode_conn {"2i+1": [2i]}
        owner = (t.chunk // k) % 16
        assert owner in sketch.gpus_to_sender_rev_map[local_src]  # only the owner's sender relays it
        assert (t.chunk // k) // 16 == t.src // 16
    assert_symmetric(alg, sketch.symmetry_offsets)
    assert_causal(alg)
    # enforce_ordering: a sender sends its own chunks over IB before the chunks it relays
    for sender in range(1, 32, 2):
        ib = sorted((t for t in alg.transfers if t.src == sender and t.src // 16 != t.dst // 16),
                    key=lambda t: t.start_us)
        own = [t.chunk // k == sender for t in ib]
        assert own == sorted(own, reverse=True)
    assert r.predicted_time_us >= r.best_bound_us - 1e-6


def test_dgx2_sketch1_program_runs_as_scheduled(dgx2_sk1):
    # The lowered program, timed by the network simulator, takes the stage-3 schedule's time. It needs two
    # channels (a threadblock has at most 64 steps); they run one after the other, so a link still carries one
    # message at a time in the schedule's order (interleaved channels took 1.8x the schedule), receives sit
    # where their data arrives, and no forward holds up another send of the same chunk.
    _, r = dgx2_sk1
    program = lower(r.algorithm)
    assert program.nchannels == 2
    sim = simulate_program(program, from_spec("dgx2x2"), MB * chunk_count(r.algorithm.spec))
    assert sim.time_us == pytest.approx(r.predicted_time_us, rel=0.01)


def test_dgx2_sketch1_allreduce_reduces_as_fast_as_it_gathers():
    # The reducescatter half of the allreduce is listed in the order of the allgather's schedule run backwards
    # (the "mirror" ordering): links, ports and dependencies mirror, so it is about as fast as the allgather
    # (the forward heuristics alone took 17 % longer at 1 GiB). The program runs as predicted.
    path = reference("taccl", "taccl_sketch_sk1-dgx2-n2.json")
    sketch = import_taccl_sketch(read_document(path), str(path))
    topology = from_spec("dgx2x2")
    chunk = 2**30 / 64  # a 1 GiB buffer
    r = run(topology, "allreduce", k=sketch.input_chunkup, chunk=chunk, sketch=sketch, source=str(path))
    stages = {s.stage: s for s in r.stages}
    gather, reduce = stages["scheduling"].objective_us, stages["scheduling:reducescatter"].objective_us
    assert reduce <= 1.02 * gather
    assert stages["ordering:reducescatter"].message == "heuristic mirror"
    assert_causal(r.algorithm)
    sim = simulate_program(lower(r.algorithm), topology, chunk * chunk_count(r.algorithm.spec))
    assert sim.time_us == pytest.approx(r.predicted_time_us, rel=0.02)


# ---------------------------------------------------------------------------------------------------------
# Combining collectives


@pytest.mark.parametrize("kind", ["reducescatter", "allreduce"])
def test_combining_on_ndv2(kind):
    r = run(from_spec("ndv2"), kind, k=1)
    alg = r.algorithm
    assert check_algorithm(alg) == []
    assert r.status == "feasible" and r.best_bound_us is None
    stages = [s.stage for s in r.stages]
    assert "ordering:reducescatter" in stages and "scheduling:reducescatter" in stages
    reducing = [t for t in alg.transfers if t.reduce]
    assert len(reducing) == 8 * 7  # the inverted allgather: 7 receives per chunk
    assert_causal(alg)
    if kind == "allreduce":
        copies = [t for t in alg.transfers if not t.reduce]
        assert len(copies) == 8 * 7
        assert min(t.step for t in copies) > max(t.step for t in reducing)
        assert min(t.start_us for t in copies) >= max(t.start_us for t in reducing) - 1e-6
    # one chunk's receives at a rank are reduced one at a time
    for t in reducing:
        for u in reducing:
            if u is not t and u.chunk == t.chunk and u.dst == t.dst:
                lat_t = r.logical.links[(t.dst, t.src)].lat_us  # transposed link cost
                assert u.start_us >= t.start_us + lat_t - 1e-6 or t.start_us >= u.start_us + lat_t - 1e-6


def test_reducescatter_on_two_nodes_uses_reversed_links():
    # NDv2 sketch with one IB pair per direction (GPU 0 of a node sends to GPU 1 of the other): the
    # reducescatter inverts it, so partial sums cross from GPU 1 of a node to GPU 0 of the other.
    r = run(from_spec("ndv2x2"), "reducescatter", sketch=sketch_of(NDV2_SK))
    assert check_algorithm(r.algorithm) == []
    cross = {(t.src % 8, t.dst % 8) for t in r.algorithm.transfers if t.src // 8 != t.dst // 8}
    assert cross == {(1, 0)}
    assert_causal(r.algorithm)


# ---------------------------------------------------------------------------------------------------------
# Bad sketches name the field


NDV2_SK = {"nnodes": 2, "intranode_sketch": {"strategy": "none"},
           "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [1]}},
           "symmetry_offsets": [[8, 16]], "hyperparameters": {"input_chunkup": 1}}


def with_(doc, **changes):
    out = dict(doc)
    for key, value in changes.items():
        out[key] = value
    return out


@pytest.mark.parametrize("doc, field, words", [
    (with_(NDV2_SK, internode_sketch={"strategy": "relay", "internode_conn": {"0": [9]}}),
     "$.internode_sketch.internode_conn.0[0]", "does not exist"),
    (with_(NDV2_SK, internode_sketch={"strategy": "relay", "internode_conn": {"12": [1]}}),
     "$.internode_sketch.internode_conn.12", "does not exist"),
    (with_(NDV2_SK, internode_sketch={"strategy": "relay", "internode_conn": {"0": [1]},
                                      "gpus_to_sender_rev_map": {"0": [0, 1, 2, 3, 4, 5, 6, 70]}}),
     "$.internode_sketch.gpus_to_sender_rev_map.0[7]", "does not exist"),
    (with_(NDV2_SK, symmetry_offsets=[[3, 16]]), "$.symmetry_offsets[0]", "does not divide"),
    (with_(NDV2_SK, symmetry_offsets=[[8, 12]]), "$.symmetry_offsets[0]", "does not divide"),
    (with_(NDV2_SK, symmetry_offsets=[[1, 8]]), "$.symmetry_offsets[0]", "maps link"),
    (with_(NDV2_SK, internode_sketch={"strategy": "relay", "internode_conn": {}}),
     "$.internode_sketch.internode_conn", "disconnected"),
    (with_(NDV2_SK, internode_sketch={"strategy": "relay", "internode_conn": {"0": [1]},
                                      "gpus_to_sender_rev_map": {"0": [0]}}, symmetry_offsets=[]),
     "$.internode_sketch.gpus_to_sender_rev_map", "disconnected"),
    (with_(NDV2_SK, nnodes=3), "$.nnodes", "3 node"),
    (with_(NDV2_SK, hyperparameters={"input_chunkup": 2}), "$.hyperparameters.input_chunkup", "chunk"),
])
def test_bad_sketch_names_field(doc, field, words):
    sk = sketch_of(doc, "bad.json")
    with pytest.raises(InputError) as err:
        run(from_spec("ndv2x2"), "allgather", sketch=sk, source="bad.json")
    assert err.value.file == "bad.json"
    assert err.value.field == field
    assert words in err.value.message


def test_bad_switch_gpu_on_dgx2():
    sk = sketch_of({"nnodes": 1, "intranode_sketch": {"strategy": "switch", "switches": [list(range(17))],
                                                       "switch_hyperedge_strategy": ["uc-max"]},
                    "symmetry_offsets": [], "hyperparameters": {"input_chunkup": 1}}, "bad.json")
    with pytest.raises(InputError) as err:
        run(from_spec("dgx2"), "allgather", sketch=sk, source="bad.json")
    assert err.value.field == "$.intranode_sketch.switches[0][16]"


def test_buffer_not_divisible():
    spec = CollectiveSpec("allgather", 4, 1)
    with pytest.raises(InputError) as err:
        synthesize(from_spec("ring:4"), None, spec, 1_000_002, FAST)
    assert err.value.field == "buffer_bytes"


# ---------------------------------------------------------------------------------------------------------
# Failure paths, determinism


class _FailingOn:
    """HiGHS, except that models named `name` come back with no solution."""

    name = "highs"

    def __init__(self, model_name):
        self.inner = get_solver("highs")
        self.model_name = model_name

    def solve(self, model, options=None, start=None):
        form = model.to_arrays() if hasattr(model, "to_arrays") else model
        if form.name == self.model_name:
            return SolveResult(Status.TIME_LIMIT_NO_SOLUTION, None, None, None, 0.0, None, "highs", "", "stub")
        return self.inner.solve(form, options, start)


def test_no_routing_raises_infeasible(monkeypatch):
    monkeypatch.setattr(synth_module, "resolve_solver", lambda name: (_FailingOn("taccl_routing"), "stub"))
    with pytest.raises(InfeasibleError) as err:
        run(from_spec("ring:4"), "allgather")
    assert err.value.exit_code == 3
    assert "stage 1" in str(err.value) and "time limit" in str(err.value)


def test_stage3_failure_falls_back_to_list_schedule(monkeypatch):
    monkeypatch.setattr(synth_module, "resolve_solver", lambda name: (_FailingOn("taccl_schedule"), "stub"))
    r = run(from_spec("ring:4"), "allgather")
    assert check_algorithm(r.algorithm) == []
    assert any("list schedule" in n for n in r.notes)
    assert next(s for s in r.stages if s.stage == "scheduling").status == "fallback"
    assert r.status == "feasible"


def test_contiguity_merges_small_inter_node_chunks():
    sk = sketch_of(NDV2_SK)
    r = run(from_spec("ndv2x2"), "allgather", chunk=1e3, sketch=sk)
    assert check_algorithm(r.algorithm) == []
    groups = {}
    for t in r.algorithm.transfers:
        if t.group is not None:
            groups.setdefault((t.src, t.dst, t.group), []).append(t)
    assert groups, "at 1 KB the IB alpha dominates: stage 3 should merge chunks"
    for (u, v, _), members in groups.items():
        assert u // 8 != v // 8 and 2 <= len(members) <= FAST.max_group
        assert len({t.step for t in members}) == 1 and len({t.start_us for t in members}) == 1


def test_deterministic():
    a = run(from_spec("ndv2"), "allgather", k=2)
    b = run(from_spec("ndv2"), "allgather", k=2)
    assert a.algorithm.transfers == b.algorithm.transfers
    assert a.predicted_time_us == b.predicted_time_us

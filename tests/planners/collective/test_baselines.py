"""Baseline algorithms (mlopt.planners.collective.baselines): ring, double binary tree, direct, hierarchical.

Every applicable (topology, baseline, collective) must give an algorithm that check_algorithm accepts, uses
only links of the topology, and lowers to a program check_program proves correct, deadlock free (also with
the executor's bounded FIFOs), within the executor's limits, and whose XML round-trips.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import lru_cache

import pytest

from mlopt.formats.msccl_xml import check_limits, parse_program, write_program
from mlopt.formats.topology import Link, Node, Topology, from_spec
from mlopt.planners.collective.algorithm import Algorithm, check_algorithm
from mlopt.planners.collective.baseline_graph import find_rings
from mlopt.planners.collective.baselines import (
    BaselineError,
    direct,
    double_binary_tree,
    hierarchical,
    ring,
)
from mlopt.planners.collective.lowering import lower
from mlopt.sim import collective_shapes as shapes
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.symbolic import check_program

TOPOLOGIES = ["ring:4", "switch:8", "ndv2", "ndv2x2", "dgx2x2"]
KINDS = ["allgather", "reducescatter", "allreduce", "alltoall"]
BASELINES = {"ring": ring, "double-binary-tree": double_binary_tree, "direct": direct, "hierarchical": hierarchical}

# Which baselines apply where (everything else must raise BaselineError).
APPLIES = {
    "ring": {t: set(KINDS) for t in TOPOLOGIES},
    "double-binary-tree": {t: {"allreduce"} for t in ["switch:8", "ndv2", "ndv2x2", "dgx2x2"]},
    "direct": {t: set(KINDS) for t in ["switch:8", "dgx2x2"]},
    "hierarchical": {t: {"allgather", "reducescatter", "allreduce"} for t in TOPOLOGIES},
}


@lru_cache(maxsize=None)
def topo(name: str) -> Topology:
    return from_spec(name)


def build(baseline: str, topology: str, kind: str, k: int = 1) -> Algorithm:
    t = topo(topology)
    return BASELINES[baseline](t, CollectiveSpec(kind, t.num_ranks, k))


CASES = [(b, t, kind) for b in BASELINES for t in TOPOLOGIES for kind in KINDS]


@pytest.mark.parametrize("baseline,topology,kind", CASES)
def test_baseline(baseline, topology, kind):
    if kind not in APPLIES[baseline].get(topology, set()):
        with pytest.raises(BaselineError):
            build(baseline, topology, kind)
        return
    alg = build(baseline, topology, kind)
    t = topo(topology)
    assert alg.name == baseline
    assert alg.spec.kind == kind and alg.spec.num_ranks == t.num_ranks
    assert check_algorithm(alg) == []
    links = set(t.link_map())
    assert all((tr.src, tr.dst) in links for tr in alg.transfers)
    if (baseline, topology, kind) == ("ring", "dgx2x2", "alltoall"):
        return  # 31744 transfers: correct by check_algorithm; lowering it takes seconds (covered on ndv2x2)
    program = lower(alg)
    report = check_program(program, spec=alg.spec)
    assert report.ok, report.summary()
    assert not report.deadlock and not report.bounded_fifo
    assert check_limits(program) == []
    for gpu in program.gpus:
        for tb in gpu.tbs:
            if tb.send >= 0:
                assert (gpu.id, tb.send) in links
            if tb.recv >= 0:
                assert (tb.recv, gpu.id) in links
    assert parse_program(write_program(program), "<test>") == program


@pytest.mark.parametrize("baseline,topology,kind", [
    ("ring", "ndv2", "allreduce"), ("double-binary-tree", "switch:8", "allreduce"),
    ("direct", "switch:8", "alltoall"), ("hierarchical", "ndv2x2", "allreduce"), ("ring", "ring:4", "alltoall"),
])  # fmt: skip
def test_baseline_with_more_chunks_instances_and_in_place(baseline, topology, kind):
    alg = build(baseline, topology, kind, k=3)
    assert check_algorithm(alg) == []
    for options in ({"instances": 2}, {"inplace": True}):
        program = lower(alg, **options)
        k = alg.spec.chunks_per_rank * options.get("instances", 1)
        report = check_program(program, spec=CollectiveSpec(kind, alg.spec.num_ranks, k))
        assert report.ok and not report.bounded_fifo, report.summary()


# --------------------------------------------------------------------------------------------------------------
# Ring


def ring_links(r: list[int]) -> list[tuple[int, int]]:
    return list(zip(r, r[1:] + r[:1]))


def test_ndv2_rings_are_the_double_nvlink_cycle_both_ways():
    t = topo("ndv2")
    lanes = {(l.src, l.dst): l.lanes for l in t.links}
    first, second = find_rings(t, 2)
    assert sorted(first) == list(range(8))
    assert all(lanes[e] == 2 for e in ring_links(first) + ring_links(second))
    assert set(ring_links(second)) == {(b, a) for a, b in ring_links(first)}


def test_rings_use_distinct_links_when_they_can():
    t = topo("switch:8")
    rings = find_rings(t, 4)
    used = Counter(e for r in rings for e in ring_links(r))
    assert len(rings) == 4 and max(used.values()) == 1


def test_multi_node_rings_cross_each_node_boundary_once():
    for name in ("ndv2x2", "dgx2x2"):
        t = topo(name)
        node = t.node_of()
        rings = find_rings(t, 2)
        for r in rings:
            assert sorted(r) == list(range(t.num_ranks))
            crossings = [e for e in ring_links(r) if node[e[0]] != node[e[1]]]
            assert len(crossings) == t.num_nodes
        # the two rings leave the nodes through different GPUs
        exits = [{e[0] for e in ring_links(r) if node[e[0]] != node[e[1]]} for r in rings]
        assert exits[0] != exits[1]


def test_ring_allreduce_is_nccls_ring_and_chunks_round_up_to_the_rings():
    t = topo("ring:4")
    alg = ring(t, CollectiveSpec("allreduce", 4, 1), channels=1)
    assert alg.spec.chunks_per_rank == 1 and max(tr.step for tr in alg.transfers) == 5
    program = lower(alg)
    for gpu in program.gpus:
        assert [[st.type for st in tb.steps] for tb in gpu.tbs] == [["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]]
    two = ring(t, CollectiveSpec("allreduce", 4, 1))  # default: 2 rings, so 2 chunks per rank
    assert two.spec.chunks_per_rank == 2
    assert ring(t, CollectiveSpec("allgather", 4, 3), channels=2).spec.chunks_per_rank == 4
    # one chunk per link and step: the two rings run side by side, in opposite directions
    assert Counter((tr.src, tr.dst, tr.step) for tr in two.transfers).most_common(1)[0][1] == 1
    assert max(tr.step for tr in two.transfers) == 5


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_ring_broadcast_and_reduce(kind):
    alg = ring(topo("ndv2"), CollectiveSpec(kind, 8, 4, root=5))
    assert check_algorithm(alg) == []
    report = check_program(lower(alg), spec=alg.spec)
    assert report.ok and not report.bounded_fifo, report.summary()


def test_ring_alltoall_is_a_wave():
    t = topo("switch:8")
    alg = ring(t, CollectiveSpec("alltoall", 8, 1), channels=1)
    assert max(tr.step for tr in alg.transfers) + 1 == 8 * 7 // 2  # every link busy every step
    program = lower(alg)
    types = Counter(st.type for g in program.gpus for tb in g.tbs for st in tb.steps)
    assert types["rcs"] > types["s"]  # chunks ride through relays without stopping


def path_topology(n: int) -> Topology:
    links = [Link(a, b, 0.7, 46.0, "nvlink") for i in range(n - 1) for a, b in ((i, i + 1), (i + 1, i))]
    return Topology(f"path:{n}", (Node("node0", tuple(range(n))),), tuple(links))


def test_ring_fails_clearly_without_a_hamiltonian_cycle():
    with pytest.raises(BaselineError, match="no ring.*tree"):
        ring(path_topology(4), CollectiveSpec("allgather", 4, 1))
    disconnected = Topology("two-pairs", (Node("node0", (0, 1, 2, 3)),),
                            tuple(Link(a, b, 0.7, 46.0, "nvlink") for a, b in ((0, 1), (1, 0), (2, 3), (3, 2))))
    with pytest.raises(BaselineError, match="no ring.*do not connect"):
        ring(disconnected, CollectiveSpec("allreduce", 4, 1))
    with pytest.raises(BaselineError, match="ranks"):
        ring(topo("ring:4"), CollectiveSpec("allgather", 8, 1))


# --------------------------------------------------------------------------------------------------------------
# The contract refuses broken algorithms (CollectiveSpec judges every rank's output buffer)


def test_ring_allgather_missing_one_chunk_is_refused():
    alg = ring(topo("ring:4"), CollectiveSpec("allgather", 4, 1), channels=1)
    last = max((t for t in alg.transfers if t.chunk == 0), key=lambda t: t.step)  # chunk 0's last hop
    broken = dataclasses.replace(alg, transfers=tuple(t for t in alg.transfers if t != last))
    assert check_algorithm(broken) == [f"chunk 0 at rank {last.dst}: holds nothing, needs {{r0[0]}}"]
    # the same flaw in the MSCCL-EF program: its last receive at that rank lands at o[1], not o[0]; the symbolic
    # executor judges the program by the same spec and finds the same hole
    program = lower(alg)
    gpu = program.gpus[last.dst]
    tb = next(tb for tb in gpu.tbs if tb.steps[-1].type == "r" and tb.steps[-1].dstoff == 0)
    steps = tb.steps[:-1] + (dataclasses.replace(tb.steps[-1], dstoff=1),)
    gpus = list(program.gpus)
    gpus[last.dst] = dataclasses.replace(gpu, tbs=tuple(dataclasses.replace(t, steps=steps) if t is tb else t
                                                        for t in gpu.tbs))
    report = check_program(dataclasses.replace(program, gpus=tuple(gpus)), spec=alg.spec)
    assert not report.ok and f"gpu {last.dst} o[0]: holds nothing, needs {{r0[0]}}" in report.problems


def test_reduction_counted_twice_is_refused():
    alg = direct(topo("switch:4"), CollectiveSpec("reducescatter", 4, 1))
    into_owner = next(t for t in alg.transfers if t.chunk == 2)
    broken = dataclasses.replace(alg, transfers=alg.transfers + (into_owner,))
    (problem,) = check_algorithm(broken)
    assert problem.startswith("chunk 2 at rank 2: holds {") and f"r{into_owner.src}[2]x2" in problem


def test_chunk_left_at_the_wrong_rank_is_refused():
    # a reduce whose sum ends at rank 1: the spec wants it at the root only, so only the root is reported
    alg = ring(topo("ring:4"), CollectiveSpec("reduce", 4, 1, root=1), channels=1)
    spec0 = dataclasses.replace(alg, spec=CollectiveSpec("reduce", 4, 1, root=0))
    (problem,) = check_algorithm(spec0)
    assert problem.startswith("chunk 0 at rank 0: holds {") and problem.endswith("needs {r0[0], r1[0], r2[0], r3[0]}")
    assert check_algorithm(alg) == []


# --------------------------------------------------------------------------------------------------------------
# Double binary tree


def interior(tree: dict[int, int]) -> set[int]:
    return set(tree.values())


def planned_trees(n: int) -> list[dict[int, int]]:
    """The two trees the double-binary-tree baseline runs on switch:n (ranks placed in rank order), read
    back from its transfers as {child: parent}: the reduce hops of the first chunk and of the last."""
    alg = double_binary_tree(topo(f"switch:{n}"), CollectiveSpec("allreduce", n, 1))
    last = n - 1  # chunks [0, ceil(n / 2)) ride the first tree, the rest the second
    return [{tr.src: tr.dst for tr in alg.transfers if tr.chunk == c and tr.reduce} for c in (0, last)]


@pytest.mark.parametrize("n", range(2, 17))
def test_double_binary_tree_is_nccls_and_the_simulators(n):
    # One shape: the planner's trees are ncclGetDtree's (collective_shapes), which the simulator times too
    first, second = planned_trees(n)
    assert [first, second] == [shapes.as_parent_map(t) for t in shapes.double_binary_tree(n)]
    assert first == shapes.as_parent_map(shapes.binary_tree(n))
    mate = shapes.shifted_tree if n % 2 else shapes.mirrored_tree  # NCCL: shift for odd n, mirror for even
    assert second == shapes.as_parent_map(mate(shapes.binary_tree(n)))
    for tree in (first, second):
        assert len(tree) == n - 1 and all(count <= 2 for count in Counter(tree.values()).values())
    # Complementary: each rank is interior in at most one tree, so no rank sends to (or receives from) more
    # than two children in all; for odd n, rank 0 has one child in each (the first root and the second's
    # stand-in for position n - 1).
    both = interior(first) & interior(second)
    assert both == (set() if n % 2 == 0 else {0})
    children = Counter(first.values()) + Counter(second.values())
    assert all(count <= 2 for count in children.values())


def test_nccl_double_binary_tree_on_8_ranks():
    first, second = planned_trees(8)
    assert first == {4: 0, 2: 4, 6: 4, 1: 2, 3: 2, 5: 6, 7: 6}  # NCCL's btree: root 0 with one child, 4
    assert second == {3: 7, 1: 3, 5: 3, 0: 1, 2: 1, 4: 5, 6: 5}  # mirrored (n even): root 7 with one child, 3
    three = planned_trees(3)
    assert three == [{2: 0, 1: 2}, {0: 1, 2: 0}]  # shifted (n odd): 0-2-1 becomes 1-0-2


def test_double_binary_tree_on_ndv2_uses_only_nvlinks_and_fails_on_a_ring():
    t = topo("ndv2")
    alg = double_binary_tree(t, CollectiveSpec("allreduce", 8, 2))
    links = set(t.link_map())
    assert all((tr.src, tr.dst) in links for tr in alg.transfers)
    edges = {(tr.src, tr.dst) for tr in alg.transfers}
    assert len({frozenset(e) for e in edges}) == 12  # the two trees' 14 edges share 2
    with pytest.raises(BaselineError, match="placement"):
        double_binary_tree(topo("ring:4"), CollectiveSpec("allreduce", 4, 1))
    with pytest.raises(BaselineError, match="allreduce"):
        double_binary_tree(t, CollectiveSpec("allgather", 8, 1))


def test_double_binary_tree_splits_the_chunks_between_the_trees():
    alg = double_binary_tree(topo("switch:8"), CollectiveSpec("allreduce", 8, 1))
    roots = {}
    for c in range(8):
        reduces = [tr for tr in alg.transfers if tr.chunk == c and tr.reduce]
        (root,) = {tr.dst for tr in reduces} - {tr.src for tr in reduces}
        roots[c] = root
    assert [roots[c] for c in range(8)] == [0] * 4 + [7] * 4  # ncclGetDtreeRoots: 0, and n - 1 for even n


# --------------------------------------------------------------------------------------------------------------
# Direct and hierarchical


def test_direct_needs_all_pairs_and_sends_everything_at_once():
    t = topo("switch:8")
    alg = direct(t, CollectiveSpec("alltoall", 8, 2))
    assert {tr.step for tr in alg.transfers} == {0} and len(alg.transfers) == 8 * 7 * 2
    program = lower(alg)
    assert {st.cnt for g in program.gpus for tb in g.tbs for st in tb.steps if st.type == "s"} == {2}
    assert {tr.step for tr in direct(t, CollectiveSpec("allreduce", 8, 1)).transfers} == {0, 1}
    with pytest.raises(BaselineError, match="every pair"):
        direct(topo("ndv2"), CollectiveSpec("alltoall", 8, 1))


def test_hierarchical_crosses_nodes_only_between_same_local_index():
    t = topo("ndv2x2")
    node = t.node_of()
    local = {r: i for n in t.nodes for i, r in enumerate(n.ranks)}
    for kind, crossings_per_chunk in (("allreduce", 2), ("allgather", 1), ("reducescatter", 1)):
        alg = hierarchical(t, CollectiveSpec(kind, 16, 1))
        cross = [tr for tr in alg.transfers if node[tr.src] != node[tr.dst]]
        assert all(local[tr.src] == local[tr.dst] for tr in cross)
        assert len(cross) == 16 * crossings_per_chunk
    uneven = Topology("uneven", (Node("a", (0, 1)), Node("b", (2,))),
                      tuple(Link(a, b, 1.0, 1.0, "x") for a in range(3) for b in range(3) if a != b))
    with pytest.raises(BaselineError, match="equal size"):
        hierarchical(uneven, CollectiveSpec("allreduce", 3, 1))
    with pytest.raises(BaselineError, match="alltoall"):
        hierarchical(t, CollectiveSpec("alltoall", 16, 1))

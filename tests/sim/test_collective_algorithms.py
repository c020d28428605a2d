"""System layer: collective algorithms as message schedules (mlopt.sim.collective_algorithms).

Costs: generated topologies (ring:N, fully-connected:N, switch:N, torus:...) use alpha 0.7 us and beta 46 us/MB
per link (B = 1000 / 46 = 21.7 GB/s); `torus:AxB@X,Y` puts X GB/s on dim-0 links and Y on dim-1 links.
Tolerances: unaware mode against the closed forms is exact up to rounding (rel 1e-9, measured 4e-16); aware
mode equals unaware (rel 1e-9) wherever no two messages share a resource at the same time.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from mlopt.errors import InputError
from mlopt.formats.msccl_xml import load_program
from mlopt.formats.topology import GENERATOR_ALPHA_US, GENERATOR_BETA_US_PER_MB, from_spec
from mlopt.sim import collective_algorithms as ca
from mlopt.sim import collective_shapes as shapes
from mlopt.sim.collective_algorithms import (
    ALGORITHMS,
    MODES,
    SUPPORTED,
    CollectiveTiming,
    cached_collective_time,
    closed_form_us,
    collective_messages,
    collective_time,
    lone_costs,
    program_time,
    transfer_time,
    verify_schedule,
)
from mlopt.sim.network import Message, NetworkModel, simulate_program, simulate_transfers
from tests.sim.test_network import program, tb

MiB = 2**20
A = GENERATOR_ALPHA_US
B = 1e3 / GENERATOR_BETA_US_PER_MB  # GB/s of one generated link
EXACT = 1e-9
XML = str(Path(__file__).resolve().parents[1] / "data" / "msccl" / "ring_allgather_4.xml")

HIER_DIMS = {2: [(2,), (1, 2)], 3: [(3,)], 4: [(2, 2), (4,)], 8: [(2, 2, 2), (2, 4), (4, 2)], 16: [(2, 4, 2)]}


def cases(ps=(2, 3, 4, 8)):
    """(algorithm, collective, p, dims) for every defined combination on groups of p ranks."""
    for alg in ALGORITHMS:
        for coll in SUPPORTED[alg]:
            for p in ps:
                if alg == "halving-doubling" and p & (p - 1):
                    continue
                for dims in HIER_DIMS.get(p, []) if alg in ca.HIERARCHICAL else [None]:
                    yield alg, coll, p, dims


def two_rings(collective: str, order: list[int], nbytes: float) -> list[Message]:
    """A bidirectional ring built by hand: two counter-rotating rings, half the data each, sharing the network
    (a cross-check of the "bidirectional-ring" algorithm, and the only bidirectional alltoall here)."""
    fwd = collective_messages(collective, "ring", order, nbytes / 2)
    back = collective_messages(collective, "ring", order[::-1], nbytes / 2)
    n = len(fwd)
    return fwd + [dataclasses.replace(m, deps=tuple(d + n for d in m.deps)) for m in back]


# ---------------------------------------------------------------------------------------------------------
# Semantics: every schedule implements its collective (symbolic run + ordering of conflicting accesses)


@pytest.mark.parametrize("alg, coll, p, dims", list(cases()))
def test_schedule_meets_postcondition(alg, coll, p, dims):
    assert verify_schedule(coll, alg, p, dims=dims) == []
    assert verify_schedule(coll, alg, p, dims=dims, splits=2) == []


@pytest.mark.parametrize("alg, coll", [("ring", "allreduce"), ("bidirectional-ring", "allreduce"),
                                       ("direct", "alltoall"), ("halving-doubling", "allreduce"),
                                       ("double-binary-tree", "allreduce"), ("hierarchical", "allreduce"),
                                       ("hierarchical-bidirectional", "allreduce")])
def test_larger_groups_meet_postcondition(alg, coll):
    assert verify_schedule(coll, alg, 16, dims=(2, 4, 2) if alg in ca.HIERARCHICAL else None, splits=3) == []
    if alg in ca.HIERARCHICAL:
        assert verify_schedule(coll, alg, 36, dims=(3, 4, 3)) == []


def _mutate(s, step: int, **changes):
    steps = list(s.steps)
    steps[step] = dataclasses.replace(steps[step], **changes)
    return dataclasses.replace(s, steps=tuple(steps))


def test_checker_catches_broken_schedules():
    s = ca._schedule("allreduce", "ring", 4, None, 1)
    assert ca._verify(s) == []
    # the last all-gather step without dependencies: it races with the step that feeds it
    last = len(s.steps) - 1
    broken = _mutate(s, last, deps=np.full((4, 1), -1))
    assert any("unordered" in p for p in ca._verify(broken))
    # a step that sends the wrong block: the postcondition fails
    wrong = _mutate(s, 1, pieces=lambda: np.zeros((4, 1), dtype=np.int64))
    assert any(", needs {" in p or "does not hold" in p for p in ca._verify(wrong))
    # reducing where a copy belongs counts a contribution twice
    double = _mutate(s, last, op="reduce")
    assert ca._verify(double)
    # a missing step: ranks miss data
    short = dataclasses.replace(s, steps=s.steps[:-1], offsets=s.offsets[:-1])
    # without the all-gather's last step rank 0 keeps its reduce-scatter partial of block 1, which lacks r1's part
    assert "rank 0 piece 1 (output 1): holds {r0[1], r2[1], r3[1]}, needs {r0[1], r1[1], r2[1], r3[1]}" \
        in ca._verify(short)
    # bidirectional ring: if the reverse ring carried the forward ring's halves, the two would race
    bi = ca._schedule("allreduce", "bidirectional-ring", 4, None, 1)
    assert ca._verify(bi) == []
    first = bi.steps[0].pieces()
    same_halves = _mutate(bi, 0, pieces=lambda: first - first % 2)
    assert any("unordered" in p for p in ca._verify(same_halves))



def _drop_messages_into(s, rank: int):
    """The schedule without the messages of its first step that deliver to `rank` (a step of no dependencies)."""
    st = s.steps[0]
    keep = np.asarray(st.dst) != rank
    rows = st.pieces()[keep]
    step = dataclasses.replace(st, src=st.src[keep], dst=st.dst[keep], deps=st.deps[keep], pieces=lambda: rows)
    sizes = [int(keep.sum())] + [len(x.src) for x in s.steps[1:]]
    return dataclasses.replace(s, steps=(step,) + s.steps[1:], offsets=np.concatenate([[0], np.cumsum(sizes)]))


@pytest.mark.parametrize("coll, missing", [("allgather", "{r0[0]}"), ("alltoall", "{r0[2]}")])
def test_checker_refuses_a_schedule_that_never_delivers_to_one_rank(coll, missing):
    s = ca._schedule(coll, "direct", 4, None, 1)
    assert ca._verify(s) == []
    problems = ca._verify(_drop_messages_into(s, 2))
    # judged by CollectiveSpec: rank 2's output from every other rank is missing, and only that
    assert len(problems) == 3 and all(p.startswith("rank 2 piece ") and "holds nothing" in p for p in problems)
    assert f"(output 0): holds nothing, needs {missing}" in problems[0]


def test_checker_maps_split_pieces_to_the_collective_buffers():
    # reducescatter in 2 splits on 4 ranks: rank r's output j (k = 2) is piece split j * space + r
    s = ca._schedule("reducescatter", "ring", 4, None, 2)
    assert ca._verify(s) == []
    last = len(s.steps) - 1  # chunk 1's last step: each rank's own block of split 1 misses one contribution
    problems = ca._verify(_mutate(s, last, op="copy"))
    assert problems and all("(output 1)" in p for p in problems)
    assert any(p.startswith("rank 0 piece 4 (output 1): holds {") for p in problems)

def test_messages_carry_the_schedule():
    msgs = collective_messages("allreduce", "ring", [5, 6, 7, 4], 4 * MiB)
    assert len(msgs) == 2 * 3 * 4
    assert {(m.src, m.dst) for m in msgs} == {(5, 6), (6, 7), (7, 4), (4, 5)}  # topology ranks from `ranks`
    assert all(m.nbytes == MiB for m in msgs)
    assert all(d < k for k, m in enumerate(msgs) for d in m.deps)
    # joins are local and empty, and counted out of CollectiveTiming.messages
    direct = collective_messages("allreduce", "direct", range(4), 4 * MiB)
    joins = [m for m in direct if m.src == m.dst]
    assert len(joins) == 4 and all(m.nbytes == 0 for m in joins)
    t = collective_time("allreduce", "direct", range(4), 4 * MiB, from_spec("fully-connected:4"))
    assert t.messages == 24 and t.bytes_sent == pytest.approx(24 * MiB)
    # splits: equal chunks; chunk k+1's copy of a message waits for chunk k's
    split = collective_messages("allgather", "ring", range(4), 4 * MiB, splits=2)
    assert len(split) == 24 and all(m.nbytes == MiB / 2 for m in split)
    # bidirectional ring: both directions, half a block each, twice the ring's messages
    bi = collective_messages("allreduce", "bidirectional-ring", [5, 6, 7, 4], 8 * MiB)
    assert len(bi) == 2 * 2 * 3 * 4 and all(m.nbytes == MiB for m in bi)
    assert {(m.src, m.dst) for m in bi} == {(5, 6), (6, 7), (7, 4), (4, 5), (6, 5), (7, 6), (4, 7), (5, 4)}
    assert sum(m.nbytes for m in bi) == sum(m.nbytes for m in collective_messages("allreduce", "ring", range(4),
                                                                                  8 * MiB))


# ---------------------------------------------------------------------------------------------------------
# Unaware mode against the closed forms; aware against unaware


def _topologies(alg: str, p: int) -> list[str]:
    out = [f"fully-connected:{p}"]
    if alg == "ring":
        out.append(f"ring:{p}")
    if alg == "bidirectional-ring":
        out += [f"ring:{p}", f"torus:{p}"]
    if alg == "direct":
        out.append(f"switch:{p}")  # alone, a message gets the port's rate = the link's
    return out


@pytest.mark.parametrize("alg", [a for a in ALGORITHMS if a not in ca.HIERARCHICAL])
def test_unaware_equals_closed_form(alg):
    for which, coll, p, _ in cases((2, 3, 4, 8, 16)):
        if which != alg:
            continue
        for S in (MiB, 64 * MiB):
            want = closed_form_us(coll, alg, p, S, A, B)
            for spec in _topologies(alg, p):
                got = collective_time(coll, alg, range(p), S, from_spec(spec))
                assert got.time_us == pytest.approx(want, rel=EXACT), (coll, p, S, spec)


def test_ring_allreduce_closed_form_values():
    # 2(p-1)(alpha + S/(pB)): p = 8, S = 64 MiB: 14 * (0.7 + 8 MiB * 46 us/MB) = 14 * 386.5913...
    t = collective_time("allreduce", "ring", range(8), 64 * MiB, from_spec("ring:8"))
    assert t.time_us == pytest.approx(14 * (0.7 + 8 * MiB * 46e-6), rel=EXACT)
    assert t == CollectiveTiming(t.time_us, "ring", 112, 112 * 8 * MiB)
    assert closed_form_us("allreduce", "halving-doubling", 8, 64 * MiB, 0.7, B) == \
        pytest.approx(2 * 3 * 0.7 + 2 * 7 / 8 * 64 * MiB * 46e-6)
    # NCCL's trees are ceil(log2 p) tall
    for p in range(2, 40):
        t0, t1 = shapes.double_binary_tree(p)
        assert max(shapes.tree_height(t0), shapes.tree_height(t1)) == (p - 1).bit_length()
        assert sorted(t0).count(-1) == 1 and sorted(t1).count(-1) == 1


def test_shapes_trees_are_nccls():
    # ncclGetBtree on 8: root 0 with one child 4; ncclGetDtree mirrors it for even p, shifts it for odd p
    assert shapes.binary_tree(8) == [-1, 2, 4, 2, 0, 6, 4, 6]
    assert shapes.nccl_btree(8, 4) == (0, 2, 6) and shapes.nccl_btree(8, 0) == (-1, -1, 4)
    assert shapes.double_binary_tree(8)[1] == shapes.mirrored_tree(shapes.binary_tree(8)) == [1, 3, 1, 7, 5, 3, 5, -1]
    assert shapes.double_binary_tree(7)[1] == shapes.shifted_tree(shapes.binary_tree(7))
    for p in range(2, 20):
        t0, t1 = shapes.double_binary_tree(p)
        interior = [{u for u in t if u >= 0} for t in (t0, t1)]
        assert not (interior[0] & interior[1]) - {0, p - 1}  # complementary: interior in one tree, leaf in the other
        assert shapes.tree_depths(shapes.as_parent_map(t0))[0] == 0


def test_shapes_groups_and_exchanges():
    # torus dims (2, 3): dim 0 groups are consecutive ranks, dim 1 groups stride 2
    grid = np.arange(6).reshape(3, 2)
    assert shapes.grid_groups(grid, 0).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert shapes.grid_groups(grid, 1).tolist() == [[0, 2, 4], [1, 3, 5]]
    assert shapes.ring_hops([3, 1, 2], 1, 2) == [(1, 2), (2, 3)]
    src, dst = shapes.direct_pairs(3)
    assert list(zip(src.tolist(), dst.tolist())) == [(0, 1), (0, 2), (1, 2), (1, 0), (2, 0), (2, 1)]
    halving = [(d, start.tolist()) for d, start in shapes.recursive_halving(4)]
    assert halving == [(2, [2, 2, 0, 0]), (1, [1, 0, 3, 2])]  # rank i ends with block i
    doubling = [(d, start.tolist()) for d, start in shapes.recursive_doubling(4)]
    assert doubling == [(1, [0, 1, 2, 3]), (2, [0, 0, 2, 2])]


@pytest.mark.parametrize("spec, dims, bws", [
    ("torus:4x4@400,50", (4, 4), (400, 50)),
    ("torus:2x4x4@400,50,25", (2, 4, 4), (400, 50, 25)),
    ("torus:8", (8,), (B,)),
    ("torus:2x2x2", (2, 2, 2), (B, B, B)),
])
def test_hierarchical_equals_closed_form_and_aware(spec, dims, bws):
    topo = from_spec(spec)
    for coll in SUPPORTED["hierarchical"]:
        for S in (MiB, 256 * MiB):
            want = closed_form_us(coll, "hierarchical", topo.num_ranks, S, A, bws, dims=dims)
            un = collective_time(coll, "hierarchical", range(topo.num_ranks), S, topo)  # dims from the torus
            aw = collective_time(coll, "hierarchical", range(topo.num_ranks), S, topo, mode="aware")
            assert un.algorithm == f"hierarchical({'x'.join(map(str, dims))})"
            assert un.time_us == pytest.approx(want, rel=EXACT)
            assert aw.time_us == pytest.approx(un.time_us, rel=EXACT)  # each dim's rings use their own links
            assert (aw.messages, aw.bytes_sent) == (un.messages, pytest.approx(un.bytes_sent))


@pytest.mark.parametrize("spec, dims, bws", [
    ("torus:4x4@400,50", (4, 4), (400, 50)),
    ("torus:3x4x5@400,50,25", (3, 4, 5), (400, 50, 25)),
    ("torus:8", (8,), (B,)),
    ("torus:3x3x3", (3, 3, 3), (B, B, B)),
])
def test_hierarchical_bidirectional_equals_closed_form_and_aware(spec, dims, bws):
    # every dim at least 3: the two directions of each per-dim ring use distinct links
    topo = from_spec(spec)
    n = topo.num_ranks
    for coll in SUPPORTED["hierarchical-bidirectional"]:
        for S in (MiB, 256 * MiB):
            want = closed_form_us(coll, "hierarchical-bidirectional", n, S, A, bws, dims=dims)
            un = collective_time(coll, "hierarchical-bidirectional", range(n), S, topo)
            aw = collective_time(coll, "hierarchical-bidirectional", range(n), S, topo, mode="aware")
            one_way = collective_time(coll, "hierarchical", range(n), S, topo, mode="aware")
            assert un.algorithm == f"hierarchical-bidirectional({'x'.join(map(str, dims))})"
            assert un.time_us == pytest.approx(want, rel=EXACT)
            assert aw.time_us == pytest.approx(un.time_us, rel=EXACT)
            assert (aw.messages, aw.bytes_sent) == (2 * one_way.messages, pytest.approx(one_way.bytes_sent))
            assert aw.time_us < one_way.time_us
    # the closed form: hierarchical's with T_k(n) = a + S/(2 n B_k)
    if dims == (4, 4):
        S = 256 * MiB
        want = 2 * 3 * (A + S / (2 * 4 * 400e3)) + 2 * 3 * (A + S / (2 * 16 * 50e3))
        assert closed_form_us("allreduce", "hierarchical-bidirectional", 16, S, A, bws, dims=dims) == \
            pytest.approx(want, rel=EXACT)


def test_bidirectional_rings_of_two_share_their_links():
    # a dim of 2: both directions cross the one link each way, so "aware" gives the one-way time while
    # "unaware" (every message alone) still reaches the closed form
    topo = from_spec("torus:2x2x2")
    for coll in SUPPORTED["hierarchical-bidirectional"]:
        un = collective_time(coll, "hierarchical-bidirectional", range(8), 64 * MiB, topo)
        aw = collective_time(coll, "hierarchical-bidirectional", range(8), 64 * MiB, topo, mode="aware")
        one_way = collective_time(coll, "hierarchical", range(8), 64 * MiB, topo, mode="aware")
        assert un.time_us == pytest.approx(closed_form_us(coll, "hierarchical-bidirectional", 8, 64 * MiB, A, B,
                                                          dims=(2, 2, 2)), rel=EXACT)
        assert aw.time_us == pytest.approx(one_way.time_us, rel=EXACT)


@pytest.mark.parametrize("alg, coll, p, dims", list(cases((2, 3, 4, 8))))
def test_aware_is_never_faster_and_matches_the_engine_without_sharing(alg, coll, p, dims):
    spec = f"torus:{'x'.join(map(str, dims))}" if alg in ca.HIERARCHICAL else \
        ("switch:%d" if alg == "direct" else "fully-connected:%d") % p
    topo = from_spec(spec)
    un = collective_time(coll, alg, range(p), 3 * MiB, topo, dims=dims, splits=2)
    aw = collective_time(coll, alg, range(p), 3 * MiB, topo, mode="aware", dims=dims, splits=2)
    assert aw.time_us >= un.time_us * (1 - EXACT)
    assert (aw.messages, aw.bytes_sent) == (un.messages, pytest.approx(un.bytes_sent))
    # the vectorised longest path = the engine with sharing turned off = the generic message-list evaluator
    msgs = collective_messages(coll, alg, range(p), 3 * MiB, dims=dims, splits=2)
    engine = simulate_transfers(msgs, topo, congestion_aware=False).time_us
    assert un.time_us == pytest.approx(engine, rel=EXACT)
    assert transfer_time(msgs, topo) == pytest.approx(engine, rel=EXACT)
    assert transfer_time(msgs, topo, "aware") == pytest.approx(aw.time_us, rel=EXACT)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_ring_on_a_ring_is_the_same_in_both_modes(p):
    topo = from_spec(f"ring:{p}")
    for coll in SUPPORTED["ring"]:
        un = collective_time(coll, "ring", range(p), 16 * MiB, topo)
        aw = collective_time(coll, "ring", range(p), 16 * MiB, topo, mode="aware")
        assert aw.time_us == pytest.approx(un.time_us, rel=EXACT), coll


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 16])
def test_bidirectional_ring_on_a_ring_or_torus(p):
    # unaware = 2(p-1)(alpha + S/(2pB)) for allreduce, (p-1)(alpha + S/(2pB)) for RS/AG; on ring:p and
    # torus:p (the same links) the two directions use distinct links from p = 3 on, so aware = unaware, and
    # it is = two independent counter-rotating one-way rings of half the data each
    for spec in (f"ring:{p}", f"torus:{p}", f"torus:{p}@{3 * B!r}"):
        topo = from_spec(spec)
        bw = 3 * B if "@" in spec else B
        for coll in SUPPORTED["bidirectional-ring"]:
            for S in (MiB, 48 * MiB):
                want = closed_form_us(coll, "bidirectional-ring", p, S, A, bw)
                un = collective_time(coll, "bidirectional-ring", range(p), S, topo)
                aw = collective_time(coll, "bidirectional-ring", range(p), S, topo, mode="aware")
                assert un.time_us == pytest.approx(want, rel=EXACT), (spec, coll, S)
                assert (un.algorithm, un.messages) == ("bidirectional-ring", (2 if coll == "allreduce" else 1) *
                                                       2 * p * (p - 1))
                assert (aw.messages, aw.bytes_sent) == (un.messages, pytest.approx(un.bytes_sent))
                one_way = collective_time(coll, "ring", range(p), S, topo, mode="aware")
                if p == 2:  # ring:2 has one link each way: both halves share it, as fast as the one-way ring
                    assert aw.time_us == pytest.approx(one_way.time_us, rel=EXACT)
                    continue
                assert aw.time_us == pytest.approx(un.time_us, rel=EXACT), (spec, coll, S)
                assert transfer_time(two_rings(coll, list(range(p)), S), topo, "aware") == \
                    pytest.approx(aw.time_us, rel=EXACT)
                assert aw.time_us < one_way.time_us
    if p == 8:  # 2(p-1)(alpha + S/(2pB)) spelled out: S = 64 MiB, S/(2p) = 4 MiB
        t = collective_time("allreduce", "bidirectional-ring", range(8), 64 * MiB, from_spec("ring:8"), mode="aware")
        assert t.time_us == pytest.approx(14 * (0.7 + 4 * MiB * 46e-6), rel=EXACT)


def test_sharing_slows_aware_mode_down():
    # direct all-to-all through switch:8: every port carries 7 flows at once, each at 1/7 of the port
    topo = from_spec("switch:8")
    un = collective_time("alltoall", "direct", range(8), 8 * MiB, topo)
    aw = collective_time("alltoall", "direct", range(8), 8 * MiB, topo, mode="aware")
    assert un.time_us == pytest.approx(A + MiB * 46e-6)
    assert aw.time_us == pytest.approx(A + 7 * MiB * 46e-6)
    # chunks share links in aware mode only
    t = from_spec("torus:4x4@400,50")
    un4 = collective_time("allreduce", "hierarchical", range(16), 64 * MiB, t, splits=4)
    aw4 = collective_time("allreduce", "hierarchical", range(16), 64 * MiB, t, splits=4, mode="aware")
    aw1 = collective_time("allreduce", "hierarchical", range(16), 64 * MiB, t, mode="aware")
    assert un4.time_us < aw4.time_us < aw1.time_us  # pipelining chunks through the phases still helps


def test_splits_pipeline_a_chain():
    # ring broadcast over 8 ranks in k chunks: (p - 1 + k - 1) hops of alpha + S/(kB), in both modes
    topo = from_spec("ring:8")
    for k in (1, 4):
        want = (7 + k - 1) * (A + 32 * MiB / k * 46e-6)
        for mode in MODES:
            assert collective_time("broadcast", "ring", range(8), 32 * MiB, topo, mode=mode, splits=k).time_us == \
                pytest.approx(want, rel=EXACT)


def test_lone_costs_match_the_network_model():
    for spec in ("ndv2x2", "dgx2x2", "dgx-a100x2", "switch:5", "torus:2x3@100,7"):
        topo = from_spec(spec)
        model = NetworkModel(topo)
        pairs = [(l.src, l.dst) for l in topo.links]
        alpha, rate, missing = lone_costs(topo, np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
        assert missing == -1
        for (a, b), al, r in zip(pairs, alpha, rate):
            route = model.route(a, b)
            assert al == route.alpha_us and r == min(model.capacities[x] for x in route.resources)
            assert transfer_time([Message(a, b, 3e6)], topo) == \
                pytest.approx(simulate_transfers([Message(a, b, 3e6)], topo).time_us, rel=EXACT)
    assert lone_costs(from_spec("ring:4"), np.array([0, 0]), np.array([1, 2]))[2] == 1


# ---------------------------------------------------------------------------------------------------------
# Qualitative results of the ASTRA-sim slides


def test_all_to_all_topology_wins_all_to_all():
    # Fair setup: the same injection bandwidth per rank. fully-connected:16 has 15 links of B; the 1D torus
    # torus:16 gets two links of 15B/2. Direct all-to-all takes one step of S/16 per link; on the torus the
    # data must be forwarded around the ring (p-1 store-and-forward steps), one way or both ways.
    fc = from_spec("fully-connected:16")
    torus = from_spec(f"torus:16@{15 * B / 2!r}")
    for S in (MiB, 64 * MiB):
        for mode in MODES:
            direct = collective_time("alltoall", "direct", range(16), S, fc, mode=mode).time_us
            ring = collective_time("alltoall", "ring", range(16), S, torus, mode=mode).time_us
            both_ways = transfer_time(two_rings("alltoall", list(range(16)), S), torus, mode)
            assert direct < both_ways < ring
            assert direct * 5 < both_ways


def test_torus_wins_large_allreduce_with_more_links():
    # The slides' setup: 1x8x1 torus vs 1x8 all-to-all, every link the same speed, and a torus node with
    # 8 links' worth of bandwidth against the all-to-all node's 7 (modelled as torus:8 with 4B per
    # direction and neighbour, fully-connected:8 with B per peer). The torus runs the bidirectional ring
    # all-reduce, 14 (alpha + S/(64B)), the all-to-all fabric direct all-reduce, 2 (alpha + S/(8B)); nothing
    # shares a link in either, so both modes agree. Large: bandwidth wins (torus faster, 7/8 of the time as
    # S grows: measured 0.878 at 256 MiB); small: the torus's 14 steps of latency lose to direct's 2
    # (measured 4.9x at 64 KiB). They cross where 12 alpha = S/(32B), S* = 384 alpha B (5.6 MiB).
    fc = from_spec("fully-connected:8")
    torus = from_spec(f"torus:8@{4 * B!r}")
    same = from_spec(f"torus:8@{3.5 * B!r}")  # the same injection bandwidth as fully-connected:8
    cross = 384 * A * B * 1e3
    for mode in MODES:
        def direct(S):
            return collective_time("allreduce", "direct", range(8), S, fc, mode=mode).time_us

        def bidir(S, topo=torus):
            return collective_time("allreduce", "bidirectional-ring", range(8), S, topo, mode=mode).time_us

        big_fc, big_torus = direct(256 * MiB), bidir(256 * MiB)
        assert big_fc == pytest.approx(closed_form_us("allreduce", "direct", 8, 256 * MiB, A, B), rel=EXACT)
        assert big_torus == pytest.approx(closed_form_us("allreduce", "bidirectional-ring", 8, 256 * MiB, A, 4 * B),
                                          rel=EXACT)
        assert big_torus < 0.9 * big_fc
        # = two counter-rotating one-way rings of half the data; a one-way ring alone loses
        assert transfer_time(two_rings("allreduce", list(range(8)), 256 * MiB), torus, mode) == \
            pytest.approx(big_torus, rel=EXACT)
        assert collective_time("allreduce", "ring", range(8), 256 * MiB, torus, mode=mode).time_us > big_fc
        # with equal injection bandwidth the bandwidth terms are equal: only latency differs (< 1 %)
        assert big_fc < bidir(256 * MiB, same) < 1.01 * big_fc
        small_fc, small_torus = direct(64 * 1024), bidir(64 * 1024)
        assert small_fc * 3 < small_torus
        assert direct(cross / 2) < bidir(cross / 2) and bidir(2 * cross) < direct(2 * cross)


def test_faster_intra_package_links_help_hierarchical():
    fast = from_spec("torus:4x4@400,50")
    slow = from_spec("torus:4x4@50,50")
    snake = [r * 4 + (c if r % 2 == 0 else 3 - c) for r in range(4) for c in range(4)]  # a Hamiltonian cycle
    for S in (MiB, 256 * MiB):
        for mode in MODES:
            h_fast = collective_time("allreduce", "hierarchical", range(16), S, fast, mode=mode).time_us
            h_slow = collective_time("allreduce", "hierarchical", range(16), S, slow, mode=mode).time_us
            flat = collective_time("allreduce", "ring", snake, S, fast, mode=mode).time_us
            assert h_fast < 0.5 * h_slow
            assert h_fast < 0.5 * flat  # the algorithm that uses the asymmetry beats a flat ring on it


# ---------------------------------------------------------------------------------------------------------
# Errors, MSCCL-EF programs, caching, speed


def test_errors():
    with pytest.raises(ValueError, match="halving-doubling.*power-of-two"):
        collective_messages("allreduce", "halving-doubling", range(6), MiB)
    with pytest.raises(ValueError, match="double-binary-tree.*alltoall"):
        collective_messages("alltoall", "double-binary-tree", range(4), MiB)
    with pytest.raises(ValueError, match="hierarchical.*dims"):
        collective_time("allreduce", "hierarchical", range(8), MiB, from_spec("switch:8"))
    with pytest.raises(ValueError, match="multiply"):
        collective_messages("allreduce", "hierarchical", range(8), MiB, dims=(2, 2))
    for coll in ("alltoall", "broadcast", "reduce"):
        with pytest.raises(ValueError, match=f"bidirectional-ring.*{coll}"):
            collective_messages(coll, "bidirectional-ring", range(4), MiB)
        with pytest.raises(ValueError, match=f"hierarchical-bidirectional.*{coll}"):
            collective_messages(coll, "hierarchical-bidirectional", range(4), MiB, dims=(2, 2))
    with pytest.raises(ValueError, match="hierarchical-bidirectional.*dims"):
        collective_time("allreduce", "hierarchical-bidirectional", range(8), MiB, from_spec("switch:8"))
    with pytest.raises(ValueError, match="hierarchical-bidirectional.*multiply"):
        collective_messages("allreduce", "hierarchical-bidirectional", range(8), MiB, dims=(2, 2))
    with pytest.raises(ValueError, match="unknown collective"):
        collective_messages("gather", "ring", range(4), MiB)
    with pytest.raises(ValueError, match="unknown mode"):
        collective_time("allreduce", "ring", range(4), MiB, from_spec("ring:4"), mode="fast")
    with pytest.raises(ValueError, match="distinct"):
        collective_messages("allreduce", "ring", [0, 1, 1], MiB)
    for mode in MODES:  # direct needs links the ring lacks: the same InputError as simulate_transfers
        with pytest.raises(InputError, match="no link 0->2"):
            collective_time("allgather", "direct", range(4), MiB, from_spec("ring:4"), mode=mode)
        with pytest.raises(InputError):
            collective_time("allgather", "ring", [0, 1, 8], MiB, from_spec("ring:4"), mode=mode)
    assert collective_time("allreduce", "ring", [3], MiB, from_spec("ring:4")).time_us == 0.0


def test_xml_programs():
    ring4 = from_spec("ring:4")
    prog = load_program(XML)
    aware = collective_time("allgather", f"xml:{XML}", range(4), 4 * MiB, ring4, mode="aware")
    assert aware.time_us == pytest.approx(simulate_program(prog, ring4, 4 * MiB).time_us)
    assert aware.algorithm == f"xml:{XML}" and aware.messages == 12
    un = collective_time("allgather", f"xml:{XML}", range(4), 4 * MiB, ring4)
    assert un.time_us == pytest.approx(aware.time_us, rel=EXACT)  # nothing shares a link
    # on a shifted rank map the program runs over topology ranks 1, 2, 3, 0
    shifted = program_time(prog, ring4, 4 * MiB, "aware", ranks=[1, 2, 3, 0])
    assert shifted.time_us == pytest.approx(aware.time_us)
    # = the ring schedule plus the program's first step, a local copy of 1 MiB at the engine's 1000 GB/s
    ring = collective_time("allgather", "ring", range(4), 4 * MiB, ring4).time_us
    assert un.time_us == pytest.approx(ring + MiB / 1e6, rel=EXACT)
    with pytest.raises(ValueError, match="allgather"):
        collective_time("allreduce", f"xml:{XML}", range(4), MiB, ring4)


def test_program_sharing_only_in_aware_mode():
    # two flows into one port of switch:4: the program's sends share it in aware mode only
    prog = program("alltoall", 3, {0: [tb(0, 2, -1, [("s", 1)])], 1: [tb(0, 2, -1, [("s", 1)])],
                                   2: [tb(0, -1, 0, [("r", 1)]), tb(1, -1, 1, [("r", 1)])]}, 3, 3)
    sw = from_spec("switch:4")
    assert program_time(prog, sw, 3 * MiB, "unaware").time_us == pytest.approx(A + MiB * 46e-6)
    assert program_time(prog, sw, 3 * MiB, "aware").time_us == pytest.approx(A + 2 * MiB * 46e-6)


def test_cached_wrapper_and_purity():
    topo = from_spec("ring:8")
    a = cached_collective_time("allreduce", "ring", range(8), MiB, topo)
    b = cached_collective_time("allreduce", "ring", list(range(8)), float(MiB), from_spec("ring:8"))
    assert a is b
    assert a == collective_time("allreduce", "ring", range(8), MiB, topo)
    # the internal caches key on the topology object, so an equally named, different topology is exact
    other = dataclasses.replace(from_spec("torus:8@50"), name="ring:8")
    assert collective_time("allreduce", "ring", range(8), MiB, other).time_us < a.time_us


def test_torus_spec_bandwidths():
    t = from_spec("torus:4x8@400,50")
    assert t.name == "torus:4x8@400,50" and t.num_ranks == 32
    links = t.link_map()
    assert links[(0, 1)].bandwidth_GBps == pytest.approx(400) and links[(0, 4)].bandwidth_GBps == pytest.approx(50)
    assert links[(0, 3)].bandwidth_GBps == pytest.approx(400) and links[(0, 28)].bandwidth_GBps == pytest.approx(50)
    assert from_spec("torus:4x8").links == dataclasses.replace(t, links=tuple(
        dataclasses.replace(l, beta_us_per_MB=GENERATOR_BETA_US_PER_MB) for l in t.links)).links
    assert ca.torus_dims(t) == (4, 8) and ca.torus_dims(from_spec("ring:4")) is None
    one = from_spec("torus:8")
    assert {(l.src, l.dst) for l in one.links} == {(l.src, l.dst) for l in from_spec("ring:8").links}
    for bad, fragment in (("torus:4x8@400", "takes 2 link bandwidths"), ("torus:4@0", "positive number"),
                          ("torus:4@x", "positive number"), ("torus:2x2@1,2,3", "takes 2")):
        with pytest.raises(InputError, match=fragment) as info:
            from_spec(bad)
        assert info.value.file == bad


@pytest.mark.parametrize("alg", ["ring", "bidirectional-ring"])
def test_1024_rank_ring_allreduce_is_fast(alg):
    # generous sanity limit; measured about 0.25 s (ring) and 0.4 s (bidirectional-ring: twice the messages)
    # to generate and evaluate, on 2 cores
    topo = from_spec("ring:1024")
    ca._schedule.cache_clear()
    t0 = time.perf_counter()
    t = collective_time("allreduce", alg, range(1024), 4 * MiB, topo)
    elapsed = time.perf_counter() - t0
    assert elapsed < 20
    assert t.time_us == pytest.approx(closed_form_us("allreduce", alg, 1024, 4 * MiB, A, B), rel=EXACT)
    assert t.messages == (2 if alg == "ring" else 4) * 1023 * 1024

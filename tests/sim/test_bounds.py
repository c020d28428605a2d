"""Collective lower bounds: hand-computed values, and simulated algorithms never beating them.

Notation: c = 1/46 MB/us (one NVLink lane, a ring:N link, a switch:N port), NVSwitch port 1/8 MB/us, IB
1/106 MB/us (links, IB ports and NICs alike). B is the buffer (nccl-tests convention), n the ranks, a
share is B/n. Every term adds the smallest alpha of the links it crosses (0.7 NVLink, 1.7 IB).
"""

from __future__ import annotations

import pytest

from mlopt.errors import InputError
from mlopt.formats.topology import Link, Node, Topology, from_spec
from mlopt.sim.bounds import BoundModel, cut_requirements, lower_bound
from mlopt.sim.network import simulate_program
from tests.sim.test_network import MB, direct_alltoall, ring_program


def approx_terms(bound, **expected):
    for key, value in expected.items():
        assert bound.terms[key] == pytest.approx(value, rel=1e-9), key


# ---------------------------------------------------------------------------------------------------------
# ring:4, B = 4 MB (share 1 MB); every rank has 2 incoming and 2 outgoing links: 2c = 2/46 MB/us.
# All 8 links together: 8c. Diameter 2 hops: latency 2 * 0.7 = 1.4.


def test_ring4_allgather():
    b = lower_bound("allgather", from_spec("ring:4"), 4 * MB)
    # ingress: 3 shares = 3 MB at 2c: 3 * 23 = 69 (+0.7); egress: its own share 1 MB: 23 (+0.7)
    # aggregate: (n-1) B = 12 MB over 8c: 12 * 46 / 8 = 69 (+0.7)
    approx_terms(b, ingress=69.7, egress=23.7, aggregate=69.7, latency=1.4)
    assert b.time_us == pytest.approx(69.7) and b.which == "ingress"  # ties go to the earlier term
    assert "cut" not in b.terms  # one node
    assert b.algbw_GBps == pytest.approx(4e6 / 69.7 / 1e3)


def test_ring4_other_collectives():
    ring4 = from_spec("ring:4")
    # alltoall: ingress 3 MB -> 69.7; aggregate counts hops: per source 1 + 1 + 2 = 4 share-hops,
    # 16 MB in all over 8c: 16 * 46 / 8 = 92 (+0.7) = 92.7
    b = lower_bound("alltoall", ring4, 4 * MB)
    approx_terms(b, ingress=69.7, egress=69.7, aggregate=92.7)
    assert b.which == "aggregate" and b.time_us == pytest.approx(92.7)
    # allreduce: each rank needs B in and out: 4 * 23 = 92 (+0.7); aggregate 2 (n-1) B = 24 MB:
    # 24 * 46 / 8 = 138 (+0.7) = 138.7, the classic 2(n-1)/n B per rank over a rank's 2 links
    b = lower_bound("allreduce", ring4, 4 * MB)
    approx_terms(b, ingress=92.7, egress=92.7, aggregate=138.7)
    assert b.which == "aggregate"
    # reducescatter (B = input): in B/n = 1 MB -> 23.7, out (n-1)/n B = 3 MB -> 69.7, aggregate 12 MB -> 69.7
    b = lower_bound("reducescatter", ring4, 4 * MB)
    approx_terms(b, ingress=23.7, egress=69.7, aggregate=69.7)
    assert b.which == "egress" and b.time_us == pytest.approx(69.7)
    # broadcast from 0: non-roots need B = 4 MB at 2c -> 92.7; root sends B -> 92.7; latency root->2: 1.4
    b = lower_bound("broadcast", ring4, 4 * MB)
    approx_terms(b, ingress=92.7, egress=92.7, aggregate=69.7, latency=1.4)
    assert b.detail["ingress"] == "rank 1" and b.detail["egress"] == "rank 0"
    b = lower_bound("reduce", ring4, 4 * MB, root=2)
    approx_terms(b, ingress=92.7, egress=92.7)
    assert b.detail["ingress"] == "rank 2" and b.detail["latency"] == "0->2"


def test_switch8():
    sw8 = from_spec("switch:8")
    # B = 8 MB, share 1 MB. A rank's 7 incoming links (c each) share its rx port (c): ingress c.
    # allgather: 7 MB * 46 = 322 (+0.7); aggregate: 7B = 56 MB over 8 ports: 56 * 46 / 8 = 322 (+0.7)
    b = lower_bound("allgather", sw8, 8 * MB)
    approx_terms(b, ingress=322.7, egress=46.7, aggregate=322.7, latency=0.7)
    # allreduce: aggregate 2 * 7 * 8 MB = 112 MB over 8c: 644 (+0.7); ingress B: 8 * 46 = 368 (+0.7)
    b = lower_bound("allreduce", sw8, 8 * MB)
    approx_terms(b, ingress=368.7, aggregate=644.7)
    assert b.time_us == pytest.approx(644.7)
    # alltoall: in = out = 7 MB -> 322.7; all pairs one hop: aggregate 56 MB -> 322.7
    approx_terms(lower_bound("alltoall", sw8, 8 * MB), ingress=322.7, egress=322.7, aggregate=322.7)


def test_ndv2x2():
    ndv2x2 = from_spec("ndv2x2")
    # n = 16, B = 16 MB, share 1 MB. Rank 0's NVLinks in: from 1 and 4 (double, 2c each) and 2, 3 (c each)
    # = 6/46 MB/us; its IB links (from 8..15) all cross its IB port and node0's NIC rx: 1/106 more.
    nv_ib = 6 / 46 + 1 / 106
    b = lower_bound("allgather", ndv2x2, 16 * MB)
    # ingress: 15 MB / (6/46 + 1/106) (+0.7) = 107.94; egress 1 MB at the same rate (+0.7)
    # cut: node1 needs node0's 8 shares = 8 MB through its one NIC: 8 * 106 = 848 (+1.7) = 849.7
    # aggregate: 15 * 16 = 240 MB over all links: NVLink 2 nodes * 8 GPUs * 6 lanes / 46 + 2 NICs / 106
    approx_terms(b, ingress=0.7 + 15 / nv_ib, egress=0.7 + 1 / nv_ib, cut=849.7,
                 aggregate=0.7 + 240 / (96 / 46 + 2 / 106), latency=1.7)
    assert b.which == "cut" and b.time_us == pytest.approx(849.7) and b.detail["cut"] == "node0"
    # alltoall: 8 * 8 shares cross each way: 64 MB * 106 = 6784 (+1.7)
    assert lower_bound("alltoall", ndv2x2, 16 * MB).terms["cut"] == pytest.approx(6785.7)
    # allreduce, broadcast, reduce: the whole buffer crosses: 16 * 106 = 1696 (+1.7)
    for coll in ("allreduce", "broadcast", "reduce"):
        b = lower_bound(coll, ndv2x2, 16 * MB)
        assert b.terms["cut"] == pytest.approx(1697.7) and b.which == "cut", coll


def test_dgx2x2():
    dgx2x2 = from_spec("dgx2x2")
    # n = 32, B = 32 MB, share 1 MB. A rank's ingress: NVSwitch rx port 1/8 + IB (port and shared NIC)
    # 1/106. The 8 NICs of a node (one per GPU pair) give a node 8/106 MB/us each way.
    b = lower_bound("allgather", dgx2x2, 32 * MB)
    # ingress: 31 MB / (1/8 + 1/106) (+0.7) = 231.30
    # cut: 16 MB into a node through 8 NICs: 16 * 106 / 8 = 212 (+1.7) = 213.7
    # aggregate: 31 * 32 = 992 MB over all links: 32 NVSwitch ports of 1/8 + 16 NICs of 1/106 (a pair's
    # two GPUs share one NIC, so the IB ports cannot add up): 992 / (4 + 16/106) (+0.7) = 239.68
    approx_terms(b, ingress=0.7 + 31 / (1 / 8 + 1 / 106), cut=213.7, aggregate=0.7 + 992 / (4 + 16 / 106))
    assert b.which == "aggregate" and b.time_us == pytest.approx(239.6818, abs=1e-4)
    # alltoall: 16 * 16 shares cross: 256 MB * 106 / 8 = 3392 (+1.7)
    b = lower_bound("alltoall", dgx2x2, 32 * MB)
    assert b.terms["cut"] == pytest.approx(3393.7) and b.which == "cut"
    # allreduce: the buffer crosses each way: 32 * 106 / 8 = 424 (+1.7); aggregate 2 * 31 * 32 MB = 1984 MB
    b = lower_bound("allreduce", dgx2x2, 32 * MB)
    approx_terms(b, cut=425.7, aggregate=0.7 + 1984 / (4 + 16 / 106))


def test_cut_requirements_formulas():
    P = list(range(8))
    # allgather, S = {0, 1, 2}: 5 outside shares enter, 3 inside shares leave
    assert cut_requirements("allgather", P, {0, 1, 2}, 8 * MB) == (5 * MB, 3 * MB)
    assert cut_requirements("alltoall", P, {0, 1, 2}, 8 * MB) == (15 * MB, 15 * MB)
    assert cut_requirements("reducescatter", P, {0, 1, 2}, 8 * MB) == (3 * MB, 5 * MB)
    assert cut_requirements("allreduce", P, {0, 1, 2}, 8 * MB) == (8 * MB, 8 * MB)
    assert cut_requirements("broadcast", P, {0, 1, 2}, 8 * MB, root=5) == (8 * MB, 0.0)
    assert cut_requirements("reduce", P, {0, 1, 2}, 8 * MB, root=5) == (0.0, 8 * MB)
    assert cut_requirements("allgather", P, set(P), 8 * MB) == (0.0, 0.0)


def test_subset_of_ranks_and_zero_size():
    # allgather among ranks 0 and 1 of ring:4: each needs the other's share (B/2 = 2 MB) over 2 links
    # into it (2c): 2 * 23 = 46 (+0.7); aggregate (n-1) B = 4 MB over 8c: 23 (+0.7)
    b = lower_bound("allgather", from_spec("ring:4"), 4 * MB, ranks=[0, 1])
    approx_terms(b, ingress=46.7, aggregate=23.7, latency=0.7)
    # no bytes: only latency, the farthest pair of switch:8 is one hop
    z = lower_bound("allreduce", from_spec("switch:8"), 0)
    assert z.terms == {"latency": pytest.approx(0.7)} and z.which == "latency"


def test_unreachable_rank_and_bad_arguments():
    links = (Link(0, 1, 0.7, 46.0, "nvlink"), Link(1, 0, 0.7, 46.0, "nvlink"))
    topo = Topology("island", (Node("node0", (0, 1, 2)),), links)
    with pytest.raises(InputError, match="no path from rank 0 to rank 2"):
        lower_bound("allgather", topo, MB)
    with pytest.raises(ValueError):
        lower_bound("gather", from_spec("ring:4"), MB)
    with pytest.raises(ValueError):
        lower_bound("broadcast", from_spec("ring:4"), MB, root=4)


# ---------------------------------------------------------------------------------------------------------
# Simulated algorithms never beat the bound


SIZES = [1e3, 64e3, 1 * MB, 16 * MB, 256 * MB]
CASES = [
    ("ring:4", lambda: ring_program("allgather", [0, 1, 2, 3])),
    ("ring:4", lambda: ring_program("allgather", [0, 1, 2, 3], channels=2, bidirectional=True)),
    ("ring:4", lambda: ring_program("allreduce", [0, 1, 2, 3], channels=2, bidirectional=True)),
    ("ring:4", lambda: ring_program("reducescatter", [0, 1, 2, 3], channels=4, bidirectional=True)),
    ("switch:8", lambda: ring_program("allgather", list(range(8)), channels=3)),
    ("switch:8", lambda: ring_program("allreduce", list(range(8)))),
    ("switch:8", lambda: direct_alltoall(8, chunks=2)),
    # ndv2 ring through the hybrid cube mesh: 0-1-2-3-7-6-5-4, then over IB into node1 and back
    ("ndv2x2", lambda: ring_program("allgather", [0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11, 15, 14, 13, 12],
                                    channels=2, bidirectional=True)),
    ("ndv2x2", lambda: ring_program("allreduce", [0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11, 15, 14, 13, 12])),
    ("dgx2x2", lambda: ring_program("allgather", list(range(32)), channels=4, bidirectional=True)),
    ("dgx2x2", lambda: direct_alltoall(32)),
]


@pytest.mark.parametrize("spec, build", CASES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(CASES)])
def test_simulation_never_below_bound(spec, build):
    topo = from_spec(spec)
    prog = build()
    model = BoundModel(prog.coll, topo)  # the size-independent part, evaluated per size
    assert model.at(SIZES[0]) == lower_bound(prog.coll, topo, SIZES[0])
    for size in SIZES:
        sim = simulate_program(prog, topo, size)
        bound = model.at(size)
        assert sim.time_us >= bound.time_us * (1 - 1e-9), (size, sim.time_us, bound)


def test_bound_is_tight_where_the_algorithm_is_optimal():
    # direct alltoall on switch:8 saturates every port: simulation = bound = 0.7 + 7 * 46 = 322.7
    topo = from_spec("switch:8")
    sim = simulate_program(direct_alltoall(8), topo, 8 * MB)
    assert sim.time_us == pytest.approx(lower_bound("alltoall", topo, 8 * MB).time_us)
    # bidirectional ring allgather on ring:4: 3 hops of 0.7 + 23 = 71.1 vs bound 69.7 (only 2 alphas more)
    sim = simulate_program(ring_program("allgather", [0, 1, 2, 3], channels=2, bidirectional=True),
                           from_spec("ring:4"), 4 * MB)
    assert sim.time_us - lower_bound("allgather", from_spec("ring:4"), 4 * MB).time_us == pytest.approx(1.4)


@pytest.mark.parametrize("spec", ["ring:4", "switch:8", "ndv2x2", "dgx2x2", "dgx-a100x2", "torus:2x2x2"])
def test_laminar_shortcut_matches_the_lp(spec):
    from mlopt.sim.bounds import _Capacities

    topo = from_spec(spec)
    fast, lp = _Capacities(topo), _Capacities(topo, laminar=False)
    sets = [{r} for r in range(topo.num_ranks)] + [set(n.ranks) for n in topo.nodes if topo.num_nodes > 1]
    for inside in sets:
        assert fast.into(inside) == pytest.approx(lp.into(inside), rel=1e-9)
        assert fast.out_of(inside) == pytest.approx(lp.out_of(inside), rel=1e-9)

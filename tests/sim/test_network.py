"""Alpha-beta network simulator: hand-built MSCCL-EF programs and messages against closed-form times.

Costs used below (TACCL's Table 5.1, mlopt's presets and generators):
  ring:N / switch:N links and switch ports: alpha 0.7 us, beta 46 us/MB (one NVLink lane)
  ndv2 NVLink: alpha 0.7, 46 us/MB per lane (23 for a double link); IB: alpha 1.7, 106 us/MB, one NIC per node
  dgx2 NVSwitch ports: alpha 0.7, 8 us/MB; IB NICs shared by GPU pairs: alpha 1.7, 106 us/MB
MB = 1e6 bytes. A message of s MB alone on a link takes alpha + beta * s; flows sharing a resource split
its bandwidth max-min fairly.
"""

from __future__ import annotations

import time

import pytest

from mlopt.errors import InputError
from mlopt.formats.msccl import Gpu, Program, Step, Threadblock
from mlopt.formats.topology import from_spec
from mlopt.sim.network import (
    Message,
    NetworkModel,
    ProgramOptions,
    Task,
    run_tasks,
    simulate_program,
    simulate_transfers,
)
from mlopt.sim.resources import TopologyResources, never_binds

MB = 1_000_000


# ---------------------------------------------------------------------------------------------------------
# Program builders (shared with test_bounds.py)


def st(s: int, type: str, cnt: int = 1, srcbuf: str = "i", srcoff: int = 0, dstbuf: str = "o", dstoff: int = 0,
       depid: int = -1, deps: int = -1) -> Step:
    return Step(s, type, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, False)


def tb(id: int, send: int, recv: int, steps: list[tuple], chan: int = 0) -> Threadblock:
    """steps: (type, cnt) or (type, cnt, depid, deps) tuples, numbered in order."""
    out = []
    for k, spec in enumerate(steps):
        kind, cnt, *dep = spec
        out.append(st(k, kind, cnt, depid=dep[0] if dep else -1, deps=dep[1] if dep else -1))
    return Threadblock(id, send, recv, chan, tuple(out))


def program(coll: str, ngpus: int, tbs: dict[int, list[Threadblock]], i_chunks: int, o_chunks: int,
            name: str = "test") -> Program:
    gpus = tuple(Gpu(g, i_chunks, o_chunks, 0, tuple(tbs.get(g, ()))) for g in range(ngpus))
    nch = 1 + max((t.chan for ts in tbs.values() for t in ts), default=0)
    return Program(name, "Simple", nch, max(i_chunks, o_chunks), ngpus, coll, True, False, 0, 2**40, gpus)


def ring_program(coll: str, order: list[int], channels: int = 1, bidirectional: bool = False) -> Program:
    """Ring allgather / reducescatter / allreduce over `order` (program rank = topology rank).

    k = channels chunks per rank; channel ch is its own ring (reversed on odd channels when
    bidirectional) and carries chunk ch of every rank's share.
    allgather: s, (n-2) x rcs, r.  reducescatter: s, (n-2) x rrs, rrc.
    allreduce: s, (n-2) x rrs, rrcs, (n-2) x rcs, r.
    """
    n, k = len(order), channels
    tbs: dict[int, list[Threadblock]] = {}
    for ch in range(channels):
        d = -1 if bidirectional and ch % 2 else 1
        for p, rank in enumerate(order):
            nxt, prv = order[(p + d) % n], order[(p - d) % n]
            if coll == "allgather":
                steps = [("s", 1)] + [("rcs", 1)] * (n - 2) + [("r", 1)]
            elif coll == "reducescatter":
                steps = [("s", 1)] + [("rrs", 1)] * (n - 2) + [("rrc", 1)]
            elif coll == "allreduce":
                steps = [("s", 1)] + [("rrs", 1)] * (n - 2) + [("rrcs", 1)] + [("rcs", 1)] * (n - 2) + [("r", 1)]
            else:
                raise ValueError(coll)
            tbs.setdefault(rank, []).append(tb(ch, nxt, prv, steps, chan=ch))
    i_chunks = {"allgather": k, "reducescatter": n * k, "allreduce": n * k}[coll]
    o_chunks = {"allgather": n * k, "reducescatter": k, "allreduce": n * k}[coll]
    return program(coll, max(order) + 1, tbs, i_chunks, o_chunks, name=f"ring-{coll}")


def direct_alltoall(n: int, chunks: int = 1, rotate: bool = True) -> Program:
    """Every rank sends its block for peer P straight to P (one threadblock per peer, `chunks` messages
    of one chunk each), plus a local copy of its own block. k = chunks chunks per rank pair."""
    tbs: dict[int, list[Threadblock]] = {}
    for r in range(n):
        peers = [(r + j) % n for j in range(1, n)] if rotate else [p for p in range(n) if p != r]
        ts = [tb(j, p, p, [("s", 1)] * chunks + [("r", 1)] * chunks) for j, p in enumerate(peers)]
        ts.append(tb(len(peers), -1, -1, [("cpy", chunks)]))
        tbs[r] = ts
    return program("alltoall", n, tbs, n * chunks, n * chunks, name="direct-alltoall")


def one_send(src: int = 0, dst: int = 1, ngpus: int = 2, cnt: int = 1) -> Program:
    """Rank src sends cnt chunks to dst (a broadcast-shaped program: buffer = the chunks)."""
    return program("broadcast", ngpus, {src: [tb(0, dst, -1, [("s", cnt)])], dst: [tb(0, -1, src, [("r", cnt)])]},
                   cnt, cnt)


# ---------------------------------------------------------------------------------------------------------
# Single messages and rings


def test_single_send_is_alpha_plus_beta():
    # 1 MB over one ring:2 link: 0.7 + 46 * 1 = 46.7 us
    res = simulate_program(one_send(), from_spec("ring:2"), 1 * MB)
    assert res.time_us == pytest.approx(46.7)
    assert res.num_messages == 1 and res.bytes_sent == pytest.approx(MB)
    assert res.algbw_GBps == pytest.approx(1e6 / 46.7 / 1e3)  # bytes / us / 1e3 = GB/s: 21.41
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps)  # broadcast: factor 1
    link = res.resources["link 0->1"]
    assert link.busy_us == pytest.approx(46.0)  # byte phase only; alpha uses no bandwidth
    assert link.utilization == pytest.approx(46.0 / 46.7)
    assert res.link_bytes == {(0, 1): pytest.approx(MB)}


def test_a_call_overhead_is_paid_once_per_program_run_and_bounds_it_too():
    from dataclasses import replace

    from mlopt.sim.bounds import lower_bound
    from mlopt.sim.collective_algorithms import collective_time

    plain, paid = from_spec("ring:4"), replace(from_spec("ring:4"), call_overhead_us=30.0)
    program = ring_program("allgather", [0, 1, 2, 3])
    assert simulate_program(program, paid, MB).time_us == pytest.approx(simulate_program(program, plain, MB).time_us
                                                                         + 30.0)
    assert lower_bound("allgather", paid, MB).time_us == pytest.approx(lower_bound("allgather", plain, MB).time_us
                                                                       + 30.0)
    reducing = ring_program("allreduce", [0, 1, 2, 3])  # a profiled reduction rate slows reducing steps down
    free = simulate_program(reducing, plain, MB).time_us
    assert simulate_program(reducing, replace(plain, reduce_GBps=5.0), MB).time_us > free
    assert simulate_program(reducing, replace(plain, reduce_GBps=5.0), MB, reduce_GBps=1e9).time_us == \
        pytest.approx(free, rel=1e-3)  # the caller's rate wins
    for mode in ("unaware", "aware"):  # mlopt's own algorithms pay it as the programs do
        alone = collective_time("allgather", "ring", range(4), MB, plain, mode=mode).time_us
        assert collective_time("allgather", "ring", range(4), MB, paid, mode=mode).time_us == pytest.approx(alone + 30)


def test_double_nvlink_has_half_the_beta():
    # ndv2 0->1 is a double NVLink: 23 us/MB for the whole link. 2 MB: 0.7 + 46 = 46.7; 0->2 single: 0.7 + 92
    ndv2 = from_spec("ndv2")
    assert simulate_program(one_send(0, 1, 8, cnt=2), ndv2, 2 * MB).time_us == pytest.approx(46.7)
    assert simulate_program(one_send(0, 2, 8, cnt=2), ndv2, 2 * MB).time_us == pytest.approx(92.7)


def test_ring_allgather_on_ring4():
    # 4 MB output per rank, 4 chunks of 1 MB; one-way ring: 3 dependent hops of 0.7 + 46 = 3 * 46.7 = 140.1 us
    res = simulate_program(ring_program("allgather", [0, 1, 2, 3]), from_spec("ring:4"), 4 * MB, timeline=True)
    assert res.time_us == pytest.approx(140.1)
    assert res.num_messages == 12 and res.bytes_sent == pytest.approx(12 * MB)
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * 3 / 4)
    assert sorted(res.link_bytes) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    # the timeline holds every message: starts at 0, 46.7, 93.4 on each link
    starts = sorted({round(e.start_us, 6) for e in res.timeline})
    assert starts == [0.0, 46.7, 93.4]
    assert all(e.end_us - e.start_us == pytest.approx(46.7) for e in res.timeline)


def test_bidirectional_ring_allgather_halves_the_bytes_per_hop():
    # 2 channels in opposite directions, 8 chunks of 0.5 MB: 3 hops of 0.7 + 23 = 71.1 us
    res = simulate_program(ring_program("allgather", [0, 1, 2, 3], channels=2, bidirectional=True),
                           from_spec("ring:4"), 4 * MB)
    assert res.time_us == pytest.approx(3 * 23.7)


def test_two_channels_on_one_link_share_it():
    # 2 channels both one-way: each link carries two 0.5 MB flows at once, 23 us/MB... each flow gets half
    # of 46 us/MB: 0.5 MB * 92 us/MB = 46 per hop, 3 hops: 3 * (0.7 + 46) = 140.1 (same as one channel)
    res = simulate_program(ring_program("allgather", [0, 1, 2, 3], channels=2), from_spec("ring:4"), 4 * MB)
    assert res.time_us == pytest.approx(140.1)
    assert res.resources["link 0->1"].bytes == pytest.approx(3 * MB)


def test_ring_allreduce_and_reducescatter():
    ring4 = from_spec("ring:4")
    # allreduce, 4 MB buffer, 4 chunks of 1 MB: 2(n-1) = 6 dependent hops of 46.7 = 280.2 us
    ar = simulate_program(ring_program("allreduce", [0, 1, 2, 3]), ring4, 4 * MB)
    assert ar.time_us == pytest.approx(6 * 46.7)
    assert ar.busbw_GBps == pytest.approx(ar.algbw_GBps * 2 * 3 / 4)
    # reducescatter, 4 MB input per rank: 3 hops of 46.7 = 140.1; a reduction cost of 1 MB / 100 GB/s =
    # 10 us on each of the 2 rrs and the rrc: 140.1 + 3 * 10 = 170.1
    rs = simulate_program(ring_program("reducescatter", [0, 1, 2, 3]), ring4, 4 * MB)
    assert rs.time_us == pytest.approx(140.1)
    slow = simulate_program(ring_program("reducescatter", [0, 1, 2, 3]), ring4, 4 * MB, reduce_GBps=100)
    assert slow.time_us == pytest.approx(170.1)


# ---------------------------------------------------------------------------------------------------------
# Shared NICs and switch ports


def test_two_flows_share_one_nic_on_ndv2x2():
    # ranks 0 and 1 (node0, one NIC) send 1 MB to 8 and 9 (node1, one NIC); the 106 us/MB NIC is shared:
    # both get 1/212 MB/us and finish at 1.7 + 212 = 213.7 us. Program ranks 0..3 -> topology 0, 1, 8, 9.
    prog = program("alltoall", 4, {0: [tb(0, 2, -1, [("s", 1)])], 1: [tb(0, 3, -1, [("s", 1)])],
                                   2: [tb(0, -1, 0, [("r", 1)])], 3: [tb(0, -1, 1, [("r", 1)])]}, 4, 4)
    res = simulate_program(prog, from_spec("ndv2x2"), 4 * MB, rank_map=[0, 1, 8, 9], timeline=True)
    assert res.time_us == pytest.approx(213.7)
    assert [e.end_us for e in res.timeline] == [pytest.approx(213.7)] * 2
    nic = res.resources["nic node0/nic0 tx"]
    assert nic.bytes == pytest.approx(2 * MB) and nic.busy_us == pytest.approx(212.0)
    assert res.resources["nic node1/nic0 rx"].utilization == pytest.approx(212 / 213.7)
    # alone, one flow: 1.7 + 106 = 107.7
    alone = simulate_transfers([Message(0, 8, MB)], from_spec("ndv2x2"))
    assert alone.time_us == pytest.approx(107.7)


def test_a_kept_network_model_times_like_a_fresh_one():
    # The schedule planner times hundreds of all-to-all motifs on one topology with one NetworkModel: every
    # time must equal a fresh model's, whatever was timed on it before (its routes and resources accumulate).
    topo = from_spec("dgx-a100x2")
    kept = NetworkModel(topo)
    patterns = [[(a, b) for a in range(16) for b in range(16) if a != b],
                [(a, b) for a in range(8) for b in range(8, 16)],
                [(0, 9), (1, 8), (2, 2)],
                [(a, (a + 1) % 16) for a in range(16)]]
    for nbytes in (1e3, 7.5e6):
        for pairs in patterns:
            messages = [Message(a, b, nbytes) for a, b in pairs]
            fresh = simulate_transfers(messages, topo)
            again = simulate_transfers(messages, topo, model=kept, stats=False)
            assert again.time_us == fresh.time_us and again.end_us == fresh.end_us
            assert again.resources == {} and fresh.resources
    with pytest.raises(ValueError, match="another topology"):
        simulate_transfers([Message(0, 1, 1.0)], from_spec("dgx-a100"), model=kept)


def test_flow_rates_change_when_a_flow_joins():
    # A: 0->8 1 MB at t=0 (bytes from 1.7); B: 1->9 1 MB released at 50 (bytes from 51.7).
    # A alone 1.7..51.7: 50/106 MB; then both at 1/212 MB/us: A's remaining 56/106 MB takes 112 us -> 163.7.
    # B has moved 112/212 = 56/106 MB by then, the remaining 50/106 MB alone takes 50 us -> 213.7.
    res = simulate_transfers([Message(0, 8, MB), Message(1, 9, MB, release_us=50.0)], from_spec("ndv2x2"))
    assert res.end_us == [pytest.approx(163.7), pytest.approx(213.7)]
    assert res.start_us == [pytest.approx(0.0), pytest.approx(50.0)]
    assert res.resources["nic node0/nic0 tx"].busy_us == pytest.approx(212.0)  # work-conserving


def test_switch_port_shared_by_incoming_flows():
    sw4 = from_spec("switch:4")
    # 1, 2, 3 send 1 MB to 0 at once: 0's rx port (46 us/MB) split three ways: 0.7 + 3 * 46 = 138.7
    res = simulate_transfers([Message(1, 0, MB), Message(2, 0, MB), Message(3, 0, MB)], sw4)
    assert res.end_us == [pytest.approx(138.7)] * 3
    # disjoint ports: 0->1 and 2->3 do not interact: 46.7 each
    res = simulate_transfers([Message(0, 1, MB), Message(2, 3, MB)], sw4)
    assert res.end_us == [pytest.approx(46.7)] * 2


def test_max_min_fairness_on_a_switch():
    # Flows 1->0, 2->0, 3->0, 1->2, 1 MB each; port capacity c = 1/46 MB/us.
    # Progressive filling: 0's rx port binds first at c/3 for the three flows into 0; 1's tx port then has
    # c - c/3 = 2c/3 left for 1->2 (2's rx port has c): 1->2 runs at 2c/3 = 1 MB per 69 us -> 0.7 + 69 = 69.7.
    # The flows into 0 stay at c/3 (0's rx port still binds) -> 0.7 + 138 = 138.7.
    msgs = [Message(1, 0, MB), Message(2, 0, MB), Message(3, 0, MB), Message(1, 2, MB)]
    res = simulate_transfers(msgs, from_spec("switch:4"))
    assert res.end_us == [pytest.approx(138.7)] * 3 + [pytest.approx(69.7)]


def test_switch_program_through_one_tx_port():
    # rank 0 of switch:4 sends 1 MB to each of 1, 2, 3 from three threadblocks: its tx port is shared,
    # 0.7 + 3 * 46 = 138.7 us
    tbs = {0: [tb(j, p, -1, [("s", 1)]) for j, p in enumerate((1, 2, 3))]}
    for p in (1, 2, 3):
        tbs[p] = [tb(0, -1, 0, [("r", 1)])]
    res = simulate_program(program("broadcast", 4, tbs, 1, 1), from_spec("switch:4"), MB)
    assert res.time_us == pytest.approx(138.7)
    assert res.resources["switch switch port 0 tx"].busy_us == pytest.approx(138.0)


def test_never_binds_keeps_resources_that_can_be_a_bottleneck():
    link, port = frozenset({(0, 1)}), frozenset({(0, 1), (0, 2)})
    # a link inside a port at least as slow: only the port can bind
    assert never_binds(0, [link, port], [10.0, 10.0]) and not never_binds(1, [link, port], [10.0, 10.0])
    # a faster port: the link binds alone, the port when several links load it
    assert not never_binds(0, [link, port], [10.0, 20.0]) and not never_binds(1, [link, port], [10.0, 20.0])
    # identical resources (same links, same capacity): the first is kept
    assert not never_binds(0, [link, link], [5.0, 5.0]) and never_binds(1, [link, link], [5.0, 5.0])


def test_hop_resources_in_both_units():
    # ndv2x2's IB hop 0->8: link, the IB switch's ports, both NICs; the units agree bit for bit
    topo = from_spec("ndv2x2")
    table = TopologyResources(topo)
    hop = table.hop(topo.link_map()[(0, 8)])
    assert [r.kind for r in hop] == ["link", "switch_tx", "switch_rx", "nic_tx", "nic_rx"]
    assert all(r.capacity_bytes_per_us == 1e6 / r.beta_us_per_MB and r.capacity_GBps == 1000 / r.beta_us_per_MB
               for r in hop)
    assert table.members(hop[3].key) >= {(0, 8)} and (0, 1) not in table.members(hop[3].key)
    model = NetworkModel(topo)
    assert [model.names[r] for r in model.route(0, 8).account] == [r.name for r in hop]


def test_program_options_object_and_keywords_agree():
    prog, topo = direct_alltoall(4), from_spec("switch:4")
    by_keywords = simulate_program(prog, topo, 4 * MB, sharing="fifo", loop_chunk_bytes=0.5 * MB)
    opts = ProgramOptions(sharing="fifo", loop_chunk_bytes=0.5 * MB)
    assert simulate_program(prog, topo, 4 * MB, opts).time_us == by_keywords.time_us
    assert simulate_program(prog, topo, 4 * MB, opts, sharing="fair").time_us == \
        simulate_program(prog, topo, 4 * MB, loop_chunk_bytes=0.5 * MB).time_us
    with pytest.raises(TypeError):
        simulate_program(prog, topo, 4 * MB, no_such_option=1)


def test_direct_alltoall_on_switch8_matches_the_port_bound():
    # 8 MB buffer, 1 MB per peer; each rank's tx and rx ports carry 7 MB at 46 us/MB: 0.7 + 322 = 322.7
    res = simulate_program(direct_alltoall(8), from_spec("switch:8"), 8 * MB)
    assert res.time_us == pytest.approx(322.7)
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * 7 / 8)


# ---------------------------------------------------------------------------------------------------------
# Dependencies, loops, local steps


def test_cross_threadblock_dependency():
    # ring:3: 1 sends 1 MB to 0 (tb 0 of rank 0 receives); rank 0's tb 1 sends to 2 only after tb 0's
    # step 0 (depid/deps): two dependent messages, 2 * 46.7 = 93.4 us. Without the dependency: 46.7.
    def prog(dep: bool) -> Program:
        send = ("s", 1, 0, 0) if dep else ("s", 1)
        return program("broadcast", 3, {
            1: [tb(0, 0, -1, [("s", 1)])],
            0: [tb(0, -1, 1, [("r", 1)]), tb(1, 2, -1, [send])],
            2: [tb(0, -1, 0, [("r", 1)])],
        }, 1, 1)

    ring3 = from_spec("ring:3")
    assert simulate_program(prog(True), ring3, MB).time_us == pytest.approx(93.4)
    assert simulate_program(prog(False), ring3, MB).time_us == pytest.approx(46.7)


def test_loop_iterations_split_chunks_into_tiles():
    # one 1 MB chunk in 0.25 MB tiles: 4 iterations of the s/r pair, each 0.7 + 46 * 0.25 = 12.2 -> 48.8 us
    res = simulate_program(one_send(), from_spec("ring:2"), MB, loop_chunk_bytes=0.25 * MB)
    assert res.loop_iterations == 4 and res.num_messages == 4
    assert res.time_us == pytest.approx(48.8)
    # tiles of 0.3 MB: 0.3, 0.3, 0.3, 0.1 -> 3 * (0.7 + 13.8) + (0.7 + 4.6) = 48.8 as well
    res = simulate_program(one_send(), from_spec("ring:2"), MB, loop_chunk_bytes=0.3 * MB)
    assert res.loop_iterations == 4 and res.time_us == pytest.approx(48.8)


def test_local_copy_costs_memory_time():
    # cpy of 2 chunks of 1 MB at 100 GB/s: 2e6 B / 1e5 B/us = 20 us; two concurrent copies on the same rank
    # share its memory: 40 us; with local_GBps=None copies are free
    prog = program("allreduce", 2, {0: [tb(0, -1, -1, [("cpy", 2)])]}, 2, 2)
    assert simulate_program(prog, from_spec("ring:2"), 2 * MB, local_GBps=100).time_us == pytest.approx(20.0)
    two = program("allreduce", 2, {0: [tb(0, -1, -1, [("cpy", 2)]), tb(1, -1, -1, [("re", 2)])]}, 2, 2)
    assert simulate_program(two, from_spec("ring:2"), 2 * MB, local_GBps=100).time_us == pytest.approx(40.0)
    assert simulate_program(prog, from_spec("ring:2"), 2 * MB, local_GBps=None).time_us == 0.0


def test_chunk_size_conventions():
    # allgather: buffer = output (o_chunks); reducescatter: buffer = input (i_chunks)
    ag = simulate_program(ring_program("allgather", [0, 1, 2, 3]), from_spec("ring:4"), 8 * MB)
    assert ag.chunk_bytes == pytest.approx(2 * MB)
    rs = simulate_program(ring_program("reducescatter", [0, 1, 2, 3]), from_spec("ring:4"), 8 * MB)
    assert rs.chunk_bytes == pytest.approx(2 * MB)
    # explicit chunk size overrides the derived one; algbw still counts buffer_bytes
    ex = simulate_program(one_send(), from_spec("ring:2"), 10 * MB, chunk_bytes=MB)
    assert ex.time_us == pytest.approx(46.7) and ex.algbw_GBps == pytest.approx(10e6 / 46.7 / 1e3)


def test_transfers_with_dependencies_and_local_tasks():
    # 0->1 (46.7), then a 10 us local task on 1, then 1->0 (46.7): 103.4 us
    msgs = [Message(0, 1, MB), Message(1, 1, 0, deps=(0,), delay_us=10.0), Message(1, 0, MB, deps=(1,))]
    res = simulate_transfers(msgs, from_spec("ring:2"), timeline=True)
    assert res.end_us == [pytest.approx(46.7), pytest.approx(56.7), pytest.approx(103.4)]
    assert res.num_messages == 2 and len(res.timeline) == 2


def test_engine_tasks_without_topology():
    # two 100-byte flows on one 10 B/us resource after delays 1 and 3:
    # first alone 1..3 (20 B), both at 5 B/us: first's 80 B by 19, second then alone: 100 - 80 = 20 B at 10 -> 21
    tasks = [Task(1.0, 100, (0,)), Task(3.0, 100, (0,))]
    res = run_tasks(tasks, [10.0])
    assert res.finish_us == [pytest.approx(19.0), pytest.approx(21.0)]
    assert res.busy_us == [pytest.approx(20.0)] and res.bytes == [200.0]


def test_network_model_drops_resources_that_cannot_bind():
    # dgx2x2 IB link 0->16: link, ib ports and NICs all 106 us/MB; the link is inside the port, the ports
    # inside the NICs (each NIC serves two GPUs), so only the two NIC directions constrain the rate
    model = NetworkModel(from_spec("dgx2x2"))
    route = model.route(0, 16)
    assert route.alpha_us == pytest.approx(1.7)
    assert sorted(model.names[r] for r in route.resources) == ["nic node0/nic0 tx", "nic node1/nic0 rx"]
    assert len(route.account) == 5
    nv = model.route(0, 1)  # NVSwitch: the link is as fast as the ports
    assert sorted(model.names[r] for r in nv.resources) == ["switch node0/nvswitch port 0 tx",
                                                            "switch node0/nvswitch port 1 rx"]
    assert model.route(0, 0) is None


# ---------------------------------------------------------------------------------------------------------
# Errors


def test_missing_link_is_an_input_error():
    # ring:4 has no 0->2 link
    with pytest.raises(InputError, match="no link 0->2"):
        simulate_program(one_send(0, 2, 4), from_spec("ring:4"), MB)
    with pytest.raises(InputError, match="no link 0->2"):
        simulate_transfers([Message(0, 2, MB)], from_spec("ring:4"))
    # through a rank map: program rank 1 is topology rank 2
    with pytest.raises(InputError, match="no link 0->2"):
        simulate_program(one_send(0, 1, 2), from_spec("ring:4"), MB, rank_map=[0, 2])


def test_program_larger_than_topology_and_bad_rank_map():
    with pytest.raises(InputError, match="topology 'ring:2' has 2"):
        simulate_program(ring_program("allgather", [0, 1, 2, 3]), from_spec("ring:2"), MB)
    with pytest.raises(InputError, match="same topology rank"):
        simulate_program(one_send(), from_spec("ring:4"), MB, rank_map=[1, 1])


def test_unmatched_and_deadlocked_programs():
    unmatched = program("broadcast", 2, {0: [tb(0, 1, -1, [("s", 1)])], 1: [tb(0, -1, 0, [("r", 1), ("r", 1)])]},
                        1, 1)
    with pytest.raises(InputError, match="rank 0 sends 1 messages to rank 1 on channel 0, rank 1 receives 2"):
        simulate_program(unmatched, from_spec("ring:2"), MB)
    # both ranks receive before they send
    dead = program("allgather", 2, {r: [tb(0, 1 - r, 1 - r, [("r", 1), ("s", 1)])] for r in (0, 1)}, 1, 2)
    with pytest.raises(InputError, match="deadlock"):
        simulate_program(dead, from_spec("ring:2"), MB)
    mismatch = program("broadcast", 2, {0: [tb(0, 1, -1, [("s", 2)])], 1: [tb(0, -1, 0, [("r", 1)])]}, 2, 2)
    with pytest.raises(InputError, match="receives 1 chunks"):
        simulate_program(mismatch, from_spec("ring:2"), MB)
    with pytest.raises(ValueError):
        simulate_program(one_send(), from_spec("ring:2"), 0)


# ---------------------------------------------------------------------------------------------------------
# Determinism and speed


def test_deterministic():
    topo = from_spec("dgx2x2")
    a = simulate_program(direct_alltoall(32, rotate=False), topo, 32 * MB, timeline=True)
    b = simulate_program(direct_alltoall(32, rotate=False), topo, 32 * MB, timeline=True)
    assert a.time_us == b.time_us and a.timeline == b.timeline and a.resources == b.resources


def test_32_ranks_10k_steps_under_a_second():
    # dgx2x2 (32 ranks): ring allgather on 10 channels (320 steps per rank, 10240 in all) and a direct
    # alltoall with 5 messages per peer (32 * 31 * 10 + 32 steps = 9952)
    topo = from_spec("dgx2x2")
    order = list(range(32))
    for prog in (ring_program("allgather", order, channels=10), direct_alltoall(32, chunks=5, rotate=False)):
        nsteps = sum(len(t.steps) for g in prog.gpus for t in g.tbs)
        assert nsteps > 9900
        t0 = time.perf_counter()
        res = simulate_program(prog, topo, 64 * MB)
        assert time.perf_counter() - t0 < 1.0, prog.name
        assert res.time_us > 0


# ---------------------------------------------------------------------------------------------------------
# The engine against a naive reference: per-flow progressive filling recomputed at every event


def naive_engine(tasks: list[Task], caps: list[float]) -> list[float]:
    n = len(tasks)
    finish: list[float | None] = [None] * n
    enter: list[float | None] = [None] * n
    rem = [float(t.nbytes) for t in tasks]
    now = 0.0
    while any(f is None for f in finish):
        changed = True
        while changed:  # entry times of ready tasks; byte-less tasks finish when they enter
            changed = False
            for i, t in enumerate(tasks):
                if enter[i] is None and all(finish[d] is not None for d in t.deps):
                    enter[i] = max([t.release_us] + [finish[d] for d in t.deps]) + t.delay_us
                    changed = True
                if finish[i] is None and enter[i] is not None and enter[i] <= now + 1e-9 and \
                        (t.nbytes == 0 or not t.resources):
                    finish[i] = enter[i]
                    changed = True
        active = [i for i in range(n) if finish[i] is None and enter[i] is not None and enter[i] <= now + 1e-9]
        rate: dict[int, float] = {}
        residual = list(caps)
        while len(rate) < len(active):
            live = [i for i in active if i not in rate]
            users = {r: [i for i in live if r in tasks[i].resources] for r in range(len(caps))}
            share = min(residual[r] / len(u) for r, u in users.items() if u)
            bottlenecks = [r for r, u in users.items() if u and residual[r] / len(u) <= share * (1 + 1e-12)]
            for r in bottlenecks:
                for i in users[r]:
                    if i not in rate:
                        rate[i] = share
                        for r2 in tasks[i].resources:
                            residual[r2] -= share
        times = [enter[i] for i in range(n) if finish[i] is None and enter[i] is not None and enter[i] > now + 1e-9]
        times += [now + rem[i] / rate[i] for i in active]
        if not times:
            break
        nxt = min(times)
        for i in active:
            rem[i] -= rate[i] * (nxt - now)
            if rem[i] <= 1e-9 * tasks[i].nbytes:
                finish[i] = nxt
        now = nxt
    return finish


@pytest.mark.parametrize("seed", range(40))
def test_engine_matches_naive_reference(seed):
    import random

    rng = random.Random(seed)
    caps = [rng.choice([5.0, 10.0, 20.0]) for _ in range(4)]
    tasks = []
    for i in range(14):
        res = tuple(sorted(rng.sample(range(4), rng.randint(0, 3))))
        deps = tuple(sorted(rng.sample(range(i), min(i, rng.randint(0, 2)))))
        tasks.append(Task(delay_us=rng.choice([0.0, 0.5, 2.0]), nbytes=rng.choice([0.0, 10.0, 35.0, 100.0]),
                          resources=res, deps=deps, release_us=rng.choice([0.0, 0.0, 3.0, 7.5])))
    want = naive_engine(tasks, caps)
    got = run_tasks(tasks, caps)
    assert got.finish_us == pytest.approx(want, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------------
# Plots


def test_plots_are_written_and_deterministic(tmp_path):
    from mlopt.sim.bounds import BoundModel
    from mlopt.sim.plots import plot_size_sweep, plot_timeline

    topo = from_spec("ring:4")
    model = BoundModel("allgather", topo)
    rows = []
    for name, prog in (("ring", ring_program("allgather", [0, 1, 2, 3])),
                       ("bidir ring", ring_program("allgather", [0, 1, 2, 3], channels=2, bidirectional=True))):
        for size in (1e3, 1e5, 1e7):
            res = simulate_program(prog, topo, size)
            rows.append({"algorithm": name, "buffer_bytes": size, "time_us": res.time_us,
                         "bound_us": model.at(size).time_us})
    a = plot_size_sweep(rows, tmp_path / "a.svg")
    b = plot_size_sweep(rows, tmp_path / "b.svg")
    assert a.read_bytes() == b.read_bytes() and b"lower bound" in a.read_bytes()
    assert plot_size_sweep(rows, tmp_path / "bw.png", metric="algbw").read_bytes()[:4] == b"\x89PNG"
    sim = simulate_program(ring_program("allgather", [0, 1, 2, 3]), topo, 4 * MB, timeline=True)
    t1 = plot_timeline(sim, tmp_path / "t1.png")
    t2 = plot_timeline(sim, tmp_path / "t2.png")
    assert t1.read_bytes() == t2.read_bytes()
    with pytest.raises(ValueError, match="timeline"):
        plot_timeline(simulate_program(one_send(), from_spec("ring:2"), MB), tmp_path / "x.png")


# ------------------------------------------------------------------------------------------------ FIFO engine


def test_fifo_engine_serves_one_task_at_a_time_in_request_order():
    from mlopt.sim.network import run_tasks_fifo

    # Two 10-byte tasks on one 1 byte/us resource: fair sharing ends both at 20, FIFO ends one at 10.
    tasks = [Task(0, 10, (0,)), Task(0, 10, (0,))]
    assert run_tasks(tasks, [1.0]).finish_us == [20.0, 20.0]
    assert run_tasks_fifo(tasks, [1.0]).finish_us == [10.0, 20.0]
    # Delays, dependencies, release times, and a route over two resources at the slower one's rate:
    # task 0 holds r0 for [1, 11]; task 2 (released at 3) holds r1 for [3, 13]; task 1 asks at 11 + 2 = 13 and
    # gets both at 13, moving 5 bytes at 0.5 byte/us.
    tasks = [Task(1, 10, (0,)), Task(2, 5, (0, 1), deps=(0,)), Task(0, 5, (1,), release_us=3)]
    result = run_tasks_fifo(tasks, [1.0, 0.5])
    assert result.finish_us == [11.0, 23.0, 13.0]
    assert result.busy_us == [20.0, 20.0] and result.bytes == [15.0, 10.0]
    assert run_tasks_fifo([Task(0, 1, (0,), deps=(1,)), Task(0, 1, (0,), deps=(0,))], [1.0]).unfinished == [0, 1]


def test_fifo_mode_is_never_faster_than_unaware_and_equal_without_sharing():
    from mlopt.formats.topology import from_spec
    from mlopt.sim.collective_algorithms import collective_time

    group = tuple(range(8))
    ring = [collective_time("allreduce", "ring", group, 8 << 20, from_spec("ring:8"), mode=m).time_us
            for m in ("unaware", "aware", "fifo")]
    assert ring[0] == pytest.approx(ring[1], rel=1e-9) and ring[0] == pytest.approx(ring[2], rel=1e-9)
    switch = from_spec("switch:8")
    unaware, fair, fifo = (collective_time("alltoall", "direct", group, 8 << 20, switch, mode=m).time_us
                           for m in ("unaware", "aware", "fifo"))
    assert unaware < fair <= fifo  # ports shared: fair sharing is work-conserving, FIFO circuits block

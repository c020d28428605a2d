"""Lowering chunk-level algorithms to MSCCL-EF programs (mlopt.planners.collective.lowering).

Programs are verified with the symbolic executor (mlopt.sim.symbolic.check_program): correct postcondition,
no deadlock, no unmatched send, no race, dependencies only on hasdep steps, executor limits.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from mlopt.formats.msccl import MAX_STEPS_PER_THREADBLOCK, SENDING_STEPS
from mlopt.formats.msccl_xml import check_limits, parse_program, write_program
from mlopt.formats.topology import Link, Node, Topology, from_spec
from mlopt.planners.collective.algorithm import Algorithm, Transfer, check_algorithm
from mlopt.planners.collective.lowering import LoweringError, lower, lowered_spec
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.network import simulate_program
from mlopt.sim.symbolic import check_program


def verified(alg: Algorithm, **options):
    """Lower, and prove the program correct (and safe with the executor's bounded FIFOs unless told)."""
    bounded = options.pop("bounded", True)
    program = lower(alg, **options)
    report = check_program(program, spec=lowered_spec(alg.spec, options.get("instances", 1)))
    assert report.ok, report.summary()
    assert not report.deadlock
    if bounded:
        assert not report.bounded_fifo, report.summary()
    assert check_limits(program) == []
    assert parse_program(write_program(program), "<test>") == program
    return program


def steps_of(program, rank):
    return [[st.type for st in tb.steps] for tb in program.gpus[rank].tbs]


def all_steps(program):
    return [st for g in program.gpus for tb in g.tbs for st in tb.steps]


def ring_allreduce(n: int) -> Algorithm:
    ts = []
    for c in range(n):
        for s in range(n - 1):
            ts.append(Transfer(c, (c + 1 + s) % n, (c + 2 + s) % n, s, reduce=True))
        for s in range(n - 1):
            ts.append(Transfer(c, (c + s) % n, (c + s + 1) % n, n - 1 + s))
    return Algorithm("ring-allreduce", CollectiveSpec("allreduce", n, 1), tuple(ts))


def ring_allgather(n: int, k: int = 1, group: int | None = None) -> Algorithm:
    ts = []
    for c in range(n * k):
        o = c // k
        for s in range(n - 1):
            ts.append(Transfer(c, (o + s) % n, (o + s + 1) % n, s, group=group))
    return Algorithm("ring-allgather", CollectiveSpec("allgather", n, k), tuple(ts))


# --------------------------------------------------------------------------------------------------------------
# Fusion and buffers


def test_ring_allreduce_lowers_to_nccls_fused_ring():
    p = verified(ring_allreduce(4))
    for r in range(4):
        assert steps_of(p, r) == [["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]]
        tb = p.gpus[r].tbs[0]
        assert (tb.recv, tb.send) == ((r - 1) % 4, (r + 1) % 4)
        assert p.gpus[r].s_chunks == 0  # forwarded partial sums are never stored
    # the user's input is only read: every write goes to the output
    for st in all_steps(p):
        if st.type in ("r", "rcs", "rrc", "rrcs"):
            assert st.dstbuf == "o"


def test_rcs_for_a_relay_and_scratch_for_a_chunk_the_relay_does_not_need():
    spec = CollectiveSpec("reduce", 3, 1, root=2)  # 0 -> 1 -> 2, partial sums
    p = verified(Algorithm("chain", spec, (Transfer(0, 0, 1, 0, reduce=True), Transfer(0, 1, 2, 1, reduce=True))))
    assert steps_of(p, 0) == [["s"]]
    assert steps_of(p, 1) == [["rrs"]]  # receive, add own input, forward: nothing stored
    assert steps_of(p, 2) == [["rrc"]]
    rrc = p.gpus[2].tbs[0].steps[0]
    assert (rrc.srcbuf, rrc.dstbuf) == ("i", "o")  # input untouched, sum in the output
    assert p.gpus[1].s_chunks == 0

    spec = CollectiveSpec("broadcast", 3, 1, root=0)
    p = verified(Algorithm("chain", spec, (Transfer(0, 0, 1, 0), Transfer(0, 1, 2, 1))))
    assert steps_of(p, 1) == [["rcs"]]
    assert [st.type for st in p.gpus[0].tbs[0].steps] == ["cpy"]  # the root's own output
    alltoall = CollectiveSpec("alltoall", 3, 1)  # chunk 0 -> 2 relayed by rank 1, which does not need it
    ts = [Transfer((s * 3 + d), s, d, 0) for s in range(3) for d in range(3) if s != d and (s, d) != (0, 2)]
    ts += [Transfer(2, 0, 1, 0), Transfer(2, 1, 2, 1)]
    p = verified(Algorithm("relay", alltoall, tuple(ts)))
    relay = [st for tb in p.gpus[1].tbs for st in tb.steps if st.type == "rcs"]
    assert len(relay) == 1 and relay[0].dstbuf == "s" and p.gpus[1].s_chunks == 1


def test_rrcs_when_the_sum_is_also_needed_locally():
    # allreduce on 3 ranks: reduce 0 -> 1 -> 2, then 2 -> 0 -> 1 passes the sum on
    spec = CollectiveSpec("allreduce", 3, 1)
    ts = []
    for c in range(3):
        ts += [Transfer(c, 0, 1, 0, reduce=True), Transfer(c, 1, 2, 1, reduce=True)]
        ts += [Transfer(c, 2, 0, 2), Transfer(c, 0, 1, 3)]
    p = verified(Algorithm("chain", spec, tuple(ts)))
    assert steps_of(p, 0) == [["s", "s", "s", "rcs", "rcs", "rcs"]]
    assert steps_of(p, 1) == [["rrs", "rrs", "rrs", "r", "r", "r"]]  # partial sums: forwarded, not kept
    assert steps_of(p, 2) == [["rrcs", "rrcs", "rrcs"]]  # the full sum: kept in o and forwarded


def test_fusion_only_when_the_forward_keeps_fifo_order():
    # rank 1 forwards chunks 0 and 1 of rank 0 to rank 2, and sends its own chunks 2 and 3 to rank 2 at steps
    # 2 and 3. Chunk 1 arrives at 3 and leaves at 4: receive-copy-send. Chunk 0 arrives at 0 and leaves at 5:
    # fusing would send it before chunks 2 and 3, out of the FIFO order rank 2 expects, so it is r ... s.
    spec = CollectiveSpec("allgather", 3, 2)
    ts = [
        Transfer(0, 0, 1, 0), Transfer(0, 1, 2, 5), Transfer(1, 0, 1, 3), Transfer(1, 1, 2, 4),
        Transfer(2, 1, 2, 2), Transfer(3, 1, 2, 3), Transfer(2, 1, 0, 0), Transfer(3, 1, 0, 0),
        Transfer(4, 2, 0, 0), Transfer(5, 2, 0, 0), Transfer(4, 2, 1, 0), Transfer(5, 2, 1, 0),
    ]  # fmt: skip
    alg = Algorithm("x", spec, tuple(ts))
    assert check_algorithm(alg) == []
    p = verified(alg)
    tb = next(tb for tb in p.gpus[1].tbs if tb.send == 2)
    assert tb.recv == 0
    assert [st.type for st in tb.steps] == ["r", "s", "s", "rcs", "s"]


def test_a_forward_does_not_hold_up_another_send_of_the_same_data():
    # rank 1 receives chunk 0 and passes it to ranks 2 and 3 at once. Fused into the receive, one forward would
    # make the other wait for it (a dependency waits for the whole rcs step, its send included): r, then both
    # sends in parallel.
    spec = CollectiveSpec("allgather", 4, 1)
    ts = [Transfer(0, 0, 1, 0), Transfer(0, 1, 2, 1), Transfer(0, 1, 3, 1)]
    ts += [Transfer(c, c, d, 0) for c in (1, 2, 3) for d in range(4) if d != c]
    alg = Algorithm("fan-out", spec, tuple(ts))
    p = verified(alg)
    assert not any(st.type == "rcs" for tb in p.gpus[1].tbs for st in tb.steps)
    sim = simulate_program(p, from_spec("fully-connected:4"), 4 * 2**20)
    assert sim.time_us == pytest.approx(2 * (0.7 + 46 * 2**20 / 1e6))


def three_ranks_with_a_slow_link() -> Topology:
    fast, slow = 46.0, 460.0  # us/MB
    links = [Link(a, b, 0.7, slow if (a, b) == (0, 1) else fast, "nvlink") for a in range(3) for b in range(3)
             if a != b]
    return Topology("slow-0-1", (Node("node0", (0, 1, 2)),), tuple(links))


def test_a_send_is_not_held_behind_a_receive_that_arrives_later():
    # Rank 1 relays chunk 0 from rank 0 (slow link) to rank 2, and sends its own chunk 1 to rank 2 meanwhile.
    # Steps put the receive of chunk 0 (step 0) before the send of chunk 1 (step 1), but the schedule starts
    # that send at 0, long before chunk 0 arrives: the threadblock follows the schedule (send, then the
    # receive-copy-send when chunk 0 is there) and the program takes the schedule's time.
    mb = 2**20
    fast, slow = 0.7 + 46 * mb / 1e6, 0.7 + 460 * mb / 1e6
    spec = CollectiveSpec("allgather", 3, 1)
    ts = [Transfer(0, 0, 1, 0, start_us=0.0), Transfer(0, 1, 2, 2, start_us=slow),
          Transfer(1, 1, 2, 1, start_us=0.0), Transfer(1, 1, 0, 1, start_us=0.0),
          Transfer(2, 2, 0, 0, start_us=0.0), Transfer(2, 2, 1, 0, start_us=0.0), Transfer(0, 0, 2, 0, start_us=0.0)]
    ts[-1] = Transfer(0, 0, 2, 3, start_us=slow + fast)  # a redundant copy keeps the 0 -> 2 link busy late
    alg = Algorithm("relay", spec, tuple(ts))
    assert check_algorithm(alg) == []
    topo = three_ranks_with_a_slow_link()
    timed = verified(alg)
    tb = next(tb for tb in timed.gpus[1].tbs if tb.send == 2)
    assert [st.type for st in tb.steps] == ["s", "rcs"]
    makespan = slow + fast
    assert simulate_program(timed, topo, 3 * mb).time_us == pytest.approx(makespan)
    untimed = verified(Algorithm("relay", spec, tuple(replace(t, start_us=None) for t in ts)))
    assert simulate_program(untimed, topo, 3 * mb).time_us > makespan + fast / 2  # step order: head-of-line


# --------------------------------------------------------------------------------------------------------------
# Dependencies


def test_a_step_needing_two_threadblocks_gets_a_nop():
    # rank 2 receives chunks 0 and 1 from ranks 0 and 1 (two threadblocks) and forwards both in one step
    spec = CollectiveSpec("allgather", 4, 1)
    ts = [Transfer(0, 0, 2, 0), Transfer(1, 1, 2, 0), Transfer(0, 2, 3, 1, group=0), Transfer(1, 2, 3, 1, group=0)]
    ts += [Transfer(2, 2, d, 2) for d in (0, 1, 3)] + [Transfer(3, 3, d, 2) for d in (0, 1, 2)]
    ts += [Transfer(0, 0, 1, 2), Transfer(1, 1, 0, 2)]
    alg = Algorithm("fan-in", spec, tuple(ts))
    assert check_algorithm(alg) == []
    p = verified(alg)
    tb = next(tb for tb in p.gpus[2].tbs if tb.send == 3)
    assert [st.type for st in tb.steps][:2] == ["nop", "s"]
    nop, send = tb.steps[0], tb.steps[1]
    assert send.cnt == 2 and send.depid >= 0 and nop.depid >= 0 and nop.depid != send.depid
    assert not nop.hasdep
    gpu = p.gpus[2]
    for st in (nop, send):
        producer = gpu.tbs[st.depid].steps[st.deps]
        assert producer.hasdep and producer.type == "r"


def test_implied_dependencies_are_dropped():
    # rank 1 receives chunks 0 and 1 from rank 0 one after the other and forwards both in one step: waiting for
    # the second receive implies the first, so one dependency and no nop
    spec = CollectiveSpec("allgather", 3, 2)
    ts = [Transfer(0, 0, 1, 0), Transfer(1, 0, 1, 1), Transfer(0, 1, 2, 2, group=0), Transfer(1, 1, 2, 2, group=0)]
    ts += [Transfer(c, 1, d, 0) for c in (2, 3) for d in (0, 2)]
    ts += [Transfer(c, 2, d, 0) for c in (4, 5) for d in (0, 1)]
    p = verified(Algorithm("x", spec, tuple(ts)))
    recv = next(tb for tb in p.gpus[1].tbs if tb.recv == 0)
    fwd = next(tb for tb in p.gpus[1].tbs if tb.send == 2)
    assert [st.type for st in recv.steps] == ["r", "r"] and recv.send == -1
    assert [(st.type, st.cnt) for st in fwd.steps] == [("s", 1), ("s", 1), ("s", 2)]
    assert [(st.depid, st.deps) for st in fwd.steps] == [(-1, -1), (-1, -1), (recv.id, 1)]
    assert [st.hasdep for st in recv.steps] == [False, True]


def test_dependencies_only_on_hasdep_steps_and_nops_only_before_a_dependent_step():
    spec = CollectiveSpec("reducescatter", 5, 2)
    ts = [Transfer(c, s, c // 2, 0, reduce=True, group=0) for c in range(10) for s in range(5) if s != c // 2]
    p = verified(Algorithm("direct-rs", spec, tuple(ts)))
    deps = 0
    for gpu in p.gpus:
        for tb in gpu.tbs:
            for i, st in enumerate(tb.steps):
                if st.depid >= 0:
                    deps += 1
                    assert gpu.tbs[st.depid].steps[st.deps].hasdep
                    assert st.depid != tb.id
                if st.type == "nop":
                    assert not st.hasdep and st.depid >= 0 and tb.steps[i + 1].depid >= 0
    assert deps > 0  # the owner's reductions from different peers are chained through dependencies


# --------------------------------------------------------------------------------------------------------------
# Contiguity, instances, channels


def test_grouped_adjacent_transfers_become_one_step():
    spec = CollectiveSpec("allgather", 2, 4)
    grouped = [Transfer(c, c // 4, 1 - c // 4, 0, group=7) for c in range(8)]
    p = verified(Algorithm("g", spec, tuple(grouped)))
    sends = [st for st in all_steps(p) if st.type == "s"]
    assert len(sends) == 2 and all(st.cnt == 4 for st in sends)
    receives = [st for st in all_steps(p) if st.type == "r"]
    assert sorted((st.dstoff, st.cnt) for st in receives) == [(0, 4), (4, 4)]
    loose = [Transfer(c, c // 4, 1 - c // 4, 0) for c in range(8)]  # no group: one step per chunk
    p = verified(Algorithm("g", spec, tuple(loose)))
    assert Counter(st.cnt for st in all_steps(p) if st.type == "s") == {1: 8}
    # different groups, steps or a gap in the buffer break the message
    mixed = [Transfer(c, c // 4, 1 - c // 4, 0, group=c % 2) for c in range(8)]
    p = verified(Algorithm("g", spec, tuple(mixed)))
    assert max(st.cnt for st in all_steps(p) if st.type == "s") == 1


def test_messages_stay_below_72_chunks():
    spec = CollectiveSpec("allgather", 2, 100)
    ts = [Transfer(c, c // 100, 1 - c // 100, 0, group=0) for c in range(200)]
    p = verified(Algorithm("big", spec, tuple(ts)))
    assert sorted(st.cnt for st in all_steps(p) if st.type == "s") == [29, 29, 71, 71]


def test_instances_double_chunks_channels_and_threadblocks():
    alg = ring_allgather(4)
    one = verified(alg)
    two = verified(alg, instances=2)
    assert two.nchunksperloop == 2 * one.nchunksperloop
    assert two.nchannels == 2 * one.nchannels
    for g1, g2 in zip(one.gpus, two.gpus):
        assert len(g2.tbs) == 2 * len(g1.tbs)
        assert (g2.i_chunks, g2.o_chunks) == (2 * g1.i_chunks, 2 * g1.o_chunks)
    chans = Counter(tb.chan for tb in two.gpus[0].tbs)
    assert set(chans) == {0, 1} and chans[0] == chans[1]
    three = verified(ring_allreduce(4), instances=3)
    assert three.nchannels == 3 and three.nchunksperloop == 12


def test_a_threadblock_over_64_steps_is_split_over_channels():
    spec = CollectiveSpec("allgather", 2, 70)
    alg = Algorithm("many", spec, tuple(Transfer(c, c // 70, 1 - c // 70, 0) for c in range(140)))
    p = verified(alg)
    assert p.nchannels == 2
    for gpu in p.gpus:
        assert max(len(tb.steps) for tb in gpu.tbs) <= MAX_STEPS_PER_THREADBLOCK
        assert len({tb.chan for tb in gpu.tbs if tb.send >= 0}) == 2
    with pytest.raises(LoweringError, match="64"):
        lower(alg, channels=1)
    p4 = verified(alg, channels=4)
    assert p4.nchannels == 4


def test_channels_are_consecutive_phases_of_the_algorithm():
    # ring allgather on 3 ranks, 24 chunks per rank: a rank's (recv prev, send next) threadblock needs 96 steps,
    # so two channels. Channel 0 runs step 0, channel 1 step 1, and channel 1 starts where channel 0 ends: a
    # link's messages stay in the algorithm's order instead of two threadblocks sharing the link at once.
    alg = ring_allgather(3, 24)
    p = verified(alg, bounded=False)
    assert p.nchannels == 2
    for gpu in p.gpus:
        by_chan = {tb.chan: tb for tb in gpu.tbs if tb.send >= 0}
        assert set(by_chan) == {0, 1}
        first, second = by_chan[0], by_chan[1]
        assert (first.send, first.recv) == (second.send, second.recv)
        assert (second.steps[0].depid, second.steps[0].deps) == (first.id, len(first.steps) - 1)
        assert first.steps[-1].hasdep
    sim = simulate_program(p, from_spec("fully-connected:3"), 3 * 24 * 2**20, timeline=True)
    per_link: dict = {}
    for e in sim.timeline:
        per_link.setdefault((e.src, e.dst), []).append((e.start_us, e.end_us))
    for spans in per_link.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:]))  # one message at a time per link
    lat = 0.7 + 46 * 2**20 / 1e6
    assert sim.time_us == pytest.approx(2 * 24 * lat)


def test_channel_and_option_limits():
    alg = ring_allgather(4)
    with pytest.raises(LoweringError, match="32"):
        lower(alg, instances=8, channels=5)
    with pytest.raises(LoweringError, match="protocol"):
        lower(alg, proto="Fast")
    with pytest.raises(LoweringError, match="instances"):
        lower(alg, instances=0)
    huge = Algorithm("huge", CollectiveSpec("allgather", 2, 3000),
                     tuple(Transfer(c, c // 3000, 1 - c // 3000, 0) for c in range(6000)))
    with pytest.raises(LoweringError, match="3000 steps, more than 64 on each of 32 channels"):
        lower(huge)
    p = verified(alg, proto="LL128", name="mine", min_bytes=1024, max_bytes=1 << 20)
    assert (p.proto, p.name, p.min_bytes, p.max_bytes) == ("LL128", "mine", 1024, 1 << 20)


# --------------------------------------------------------------------------------------------------------------
# In place


def test_in_place_allgather_needs_no_copy():
    out = verified(ring_allgather(4))
    assert Counter(st.type for st in all_steps(out))["cpy"] == 4  # own chunk i -> o
    inp = verified(ring_allgather(4), inplace=True)
    assert inp.inplace and not inp.outofplace
    assert "cpy" not in {st.type for st in all_steps(inp)} and "i" not in {st.srcbuf for st in all_steps(inp)}


def test_in_place_alltoall_saves_what_the_peers_overwrite():
    spec = CollectiveSpec("alltoall", 3, 2)
    pairs = [(s, d) for s in range(3) for d in range(3) if s != d]
    ts = [Transfer((s * 3 + d) * 2 + j, s, d, 0, group=0) for s, d in pairs for j in range(2)]
    alg = Algorithm("direct", spec, tuple(ts))
    p = verified(alg, inplace=True)
    for gpu in p.gpus:
        copies = [st for tb in gpu.tbs for st in tb.steps if st.type == "cpy"]
        assert sum(st.cnt for st in copies) == 4 and all(st.dstbuf == "s" for st in copies)


def test_in_place_reducescatter():
    spec = CollectiveSpec("reducescatter", 4, 1)
    ts = [Transfer(c, (c + 1 + s) % 4, (c + 2 + s) % 4, s, reduce=True) for c in range(4) for s in range(3)]
    verified(Algorithm("ring-rs", spec, tuple(ts)), inplace=True)


# --------------------------------------------------------------------------------------------------------------
# Invalid input


def test_an_invalid_algorithm_raises():
    alg = ring_allgather(4)
    missing = Algorithm("x", alg.spec, alg.transfers[:2] + alg.transfers[3:])  # chunk 0 never reaches rank 3
    with pytest.raises(LoweringError, match="does not implement"):
        lower(missing)
    with pytest.raises(LoweringError, match="never reaches"):
        lower(missing, check=False)
    early = Algorithm("x", alg.spec, alg.transfers + (Transfer(0, 2, 3, 0),))
    with pytest.raises(LoweringError, match="before holding"):
        lower(early, check=False)
    spec = CollectiveSpec("allreduce", 2, 1)
    twice = Algorithm("x", spec, (Transfer(0, 0, 1, 0, reduce=True), Transfer(0, 0, 1, 1, reduce=True),
                                  Transfer(0, 1, 0, 2), Transfer(1, 1, 0, 0, reduce=True), Transfer(1, 0, 1, 1)))
    with pytest.raises(LoweringError, match="needs"):
        lower(twice)
    report = check_program(lower(twice, check=False))  # lowered faithfully: the checker sees the double count
    assert not report.ok and any("r0[0]x2" in line for line in report.problems)


def test_lowering_is_deterministic():
    alg = ring_allreduce(5)
    shuffled = Algorithm(alg.name, alg.spec, tuple(reversed(alg.transfers)))
    assert lower(alg) == lower(alg)
    assert write_program(lower(shuffled)) == write_program(lower(shuffled))


# --------------------------------------------------------------------------------------------------------------
# Every algorithm check_algorithm accepts lowers to a correct, deadlock-free program


def random_algorithm(rng: random.Random) -> Algorithm:
    """A random algorithm that implements its collective: random trees (reductions: random reduction trees,
    allreduce then a random broadcast tree), random steps with ties and gaps, random groups, redundant
    copies."""
    kind = rng.choice(["allgather", "alltoall", "broadcast", "reducescatter", "allreduce", "reduce"])
    n, k = rng.randint(2, 6), rng.randint(1, 4)
    spec = CollectiveSpec(kind, n, k, root=rng.randrange(n))
    shape = Algorithm("x", spec, ())
    groups = rng.choice([0, 1, 2])
    ts: list[Transfer] = []

    def group():
        return rng.randrange(groups) if groups and rng.random() < 0.8 else None

    for c in range(shape.num_chunks):
        dests = shape.destinations(c)
        if spec.reducing:
            root = rng.randrange(n) if kind == "allreduce" else next(iter(dests))
            order = [r for r in range(n) if r != root]
            rng.shuffle(order)
            placed, parent = [root], {}
            for r in order:
                parent[r] = rng.choice(placed)
                placed.append(r)
            step: dict[int, int] = {}

            def send_step(x: int) -> int:
                if x not in step:
                    below = [send_step(y) for y, p in parent.items() if p == x]
                    step[x] = max(below, default=-1) + 1 + rng.randint(0, 1)
                return step[x]

            for x, p in parent.items():
                ts.append(Transfer(c, x, p, send_step(x), reduce=True, group=group()))
            if kind == "allreduce":
                held = {root: max(step.values(), default=0) + 1}
                for r in rng.sample(order, len(order)):
                    h = rng.choice(sorted(held))
                    s = held[h] + rng.randint(0, 1)
                    ts.append(Transfer(c, h, r, s, group=group()))
                    held[r] = s + 1
        else:
            held = {r: 0 for r in shape.sources(c)}
            targets = [r for r in sorted(dests) if r not in held]
            rng.shuffle(targets)
            for r in targets + rng.sample(range(n), rng.randint(0, 2)):
                h = rng.choice(sorted(held))
                if h != r:
                    s = held[h] + rng.randint(0, 2)
                    ts.append(Transfer(c, h, r, s, group=group()))
                    held[r] = max(held.get(r, 0), s + 1)
    rng.shuffle(ts)
    return Algorithm(f"random-{kind}", spec, tuple(ts))


@pytest.mark.parametrize("seed", range(24))
def test_random_algorithms_lower_to_correct_programs(seed):
    rng = random.Random(seed)
    options = [{}, {"instances": 2}, {"inplace": True}, {"channels": 2}, {"inplace": True, "instances": 3}]
    for i in range(8):
        alg = random_algorithm(rng)
        assert check_algorithm(alg) == [], alg
        opts = options[(seed + i) % len(options)]
        program = verified(alg, bounded=False, **opts)
        sent = sum(st.cnt for st in all_steps(program) if st.type in SENDING_STEPS)
        assert sent >= len(alg.transfers) // max(1, 71)
        # with start times (a schedule that follows the steps, or arbitrary ones): timed order, still correct
        for timing in ("schedule", "arbitrary"):
            ts = [replace(t, start_us=(10.0 * t.step + rng.random() * (5 if timing == "schedule" else 1000)))
                  for t in alg.transfers]
            verified(Algorithm(alg.name, alg.spec, tuple(ts)), bounded=False, **opts)

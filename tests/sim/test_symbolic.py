"""Symbolic checker: MSCCL-EF programs proven (or refuted) against their collective's postcondition."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from mlopt.formats.msccl import Gpu, Program, Step, Threadblock
from mlopt.formats.msccl_xml import load_program, parse_program, write_program
from mlopt.sim.collectives import CollectiveSpec, postcondition_problems, symbol
from mlopt.sim.symbolic import NCCL_STEPS, check_program, derive_spec, fifo_capacity, to_symbol

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "msccl-xml"
DATA = Path(__file__).resolve().parents[1] / "data" / "msccl"


def reference(name: str) -> Path:
    path = REFERENCE / name
    if not path.exists():
        pytest.skip(f"reference artefact not available: {path}")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Building programs in code


def S(type, src=("i", 0), dst=("o", 0), cnt=1, dep=(-1, -1), hasdep=False) -> dict:
    return dict(
        type=type, srcbuf=src[0], srcoff=src[1], dstbuf=dst[0], dstoff=dst[1], cnt=cnt,
        depid=dep[0], deps=dep[1], hasdep=hasdep,
    )  # fmt: skip


def TB(send, recv, steps, chan=0):
    return (send, recv, chan, steps)


def make(coll, ngpus, nchunks, i, o, gpus, s=0, proto="Simple", inplace=False, outofplace=True) -> Program:
    out = []
    for r in range(ngpus):
        tbs = []
        for tid, (send, recv, chan, steps) in enumerate(gpus(r)):
            tbs.append(Threadblock(tid, send, recv, chan, tuple(Step(s=k, **st) for k, st in enumerate(steps))))
        out.append(Gpu(r, i, o, s, tuple(tbs)))
    nchannels = 1 + max((tb.chan for g in out for tb in g.tbs), default=0)
    return Program("test", proto, nchannels, nchunks, ngpus, coll, inplace, outofplace, 0, 1 << 20, tuple(out))


def edit_step(program: Program, gpu: int, tb: int, step: int, **changes) -> Program:
    g = program.gpus[gpu]
    t = g.tbs[tb]
    steps = list(t.steps)
    steps[step] = replace(steps[step], **changes)
    tbs = list(g.tbs)
    tbs[tb] = replace(t, steps=tuple(steps))
    gpus = list(program.gpus)
    gpus[gpu] = replace(g, tbs=tuple(tbs))
    return replace(program, gpus=tuple(gpus))


def append_step(program: Program, gpu: int, tb: int, step: dict) -> Program:
    g = program.gpus[gpu]
    t = g.tbs[tb]
    tbs = list(g.tbs)
    tbs[tb] = replace(t, steps=t.steps + (Step(s=len(t.steps), **step),))
    gpus = list(program.gpus)
    gpus[gpu] = replace(g, tbs=tuple(tbs))
    return replace(program, gpus=tuple(gpus))


def ring_allgather(n: int = 4) -> Program:
    """One ring, one chunk per rank: copy own chunk, send it, then forward n-2 chunks and keep the last."""

    def gpu(r):
        steps = [S("cpy", ("i", 0), ("o", r)), S("s", ("o", r), ("o", r))]
        for j in range(1, n - 1):
            steps.append(S("rcs", ("o", (r - j) % n), ("o", (r - j) % n)))
        steps.append(S("r", ("o", (r + 1) % n), ("o", (r + 1) % n)))
        return [TB((r + 1) % n, (r - 1) % n, steps)]

    return make("allgather", n, n, 1, n, gpu)


def ring_allreduce(n: int = 4, inplace: bool = False, outofplace: bool = True) -> Program:
    """Reduce-scatter with s/rrs/rrcs, then allgather with rcs/r, on the output buffer."""

    def gpu(r):
        o = lambda c: ("o", c % n)  # noqa: E731
        steps = [S("cpy", ("i", 0), ("o", 0), cnt=n), S("s", o(r), o(r))]
        steps += [S("rrs", o(r - j), o(r - j)) for j in range(1, n - 1)]
        steps.append(S("rrcs", o(r + 1), o(r + 1)))
        steps += [S("rcs", o(r - j), o(r - j)) for j in range(n - 2)]
        steps.append(S("r", o(r + 2), o(r + 2)))
        return [TB((r + 1) % n, (r - 1) % n, steps)]

    return make("allreduce", n, n, n, n, gpu, inplace=inplace, outofplace=outofplace)


def ring_reducescatter(n: int = 4, inplace: bool = False, outofplace: bool = True) -> Program:
    """Partial sums travel the ring; rrc stores the complete one."""

    def gpu(r):
        i = lambda c: ("i", c % n)  # noqa: E731
        steps = [S("s", i(r - 1), i(r - 1))]
        steps += [S("rrs", i(r - j), i(r - j)) for j in range(2, n)]
        steps.append(S("rrc", i(r), ("o", 0)))
        return [TB((r + 1) % n, (r - 1) % n, steps)]

    return make("reducescatter", n, n, n, 1, gpu, inplace=inplace, outofplace=outofplace)


def alltoall(n: int = 4) -> Program:
    """A local copy plus, per peer, one threadblock that sends to and receives from it."""

    def gpu(r):
        tbs = [TB(-1, -1, [S("cpy", ("i", r), ("o", r))])]
        tbs += [TB(p, p, [S("s", ("i", p)), S("r", dst=("o", p))]) for p in range(n) if p != r]
        return tbs

    return make("alltoall", n, n, n, n, gpu)


def pair_allgather(steps_of, proto="Simple") -> Program:
    """2-rank allgather with a given per-rank step list (one threadblock talking to the other rank)."""
    return make("allgather", 2, 2, 1, 2, lambda r: [TB(1 - r, 1 - r, steps_of(r))], proto=proto)


# ---------------------------------------------------------------------------------------------------------------
# Reference algorithms are proven


def test_reference_allgather_proven():
    p = load_program(reference("msccl-scheduler_ncv4_ag_hier_4_LL.xml"))
    report = check_program(p)
    assert report.ok and report.executor_safe, report.summary()
    assert (report.problems, report.deadlock, report.bounded_fifo, report.notes) == ([], [], [], [])
    assert report.spec == CollectiveSpec("allgather", 4, 4)
    assert report.variants == ("out-of-place",)
    assert report.steps_executed == report.steps_total == 96
    final = report.final_buffers["out-of-place"]
    for r in range(4):
        assert [to_symbol(v) for v in final[r]["o"]] == [symbol([(j // 4, j % 4)]) for j in range(16)]
    assert check_program(p, inplace=True).ok  # its copies become no-ops in place


def test_reference_alltoall_proven():
    p = load_program(reference("rccl_alltoall-8n-0-9kb.xml"))
    report = check_program(p)
    assert report.ok and report.executor_safe, report.summary()
    assert report.spec == CollectiveSpec("alltoall", 8, 1)
    assert report.steps_executed == report.steps_total == 120
    assert to_symbol(report.final_buffers["out-of-place"][3]["o"][5]) == symbol([(5, 3)])
    # it declares inplace="0" for a reason: in place, receives overwrite chunks not yet sent
    in_place = check_program(p, inplace=True)
    assert not in_place.ok
    assert any(line.startswith("race on gpu 1 o[0]: gpu 1 tb 1 step 0 (r) writes it") for line in in_place.problems)
    assert "gpu 0 o[1]: holds {r0[1]}, needs {r1[0]}" in in_place.problems


def test_reference_round_trip_still_proven():
    p = load_program(reference("msccl-scheduler_ncv4_ag_hier_4_LL.xml"))
    assert check_program(parse_program(write_program(p, "legacy"), "x")).ok


# ---------------------------------------------------------------------------------------------------------------
# Correct hand-made algorithms


@pytest.mark.parametrize(
    "build, spec, steps",
    [
        (ring_allgather, CollectiveSpec("allgather", 4, 1), 20),
        (ring_allreduce, CollectiveSpec("allreduce", 4, 1), 32),
        (ring_reducescatter, CollectiveSpec("reducescatter", 4, 1), 16),
        (alltoall, CollectiveSpec("alltoall", 4, 1), 28),
    ],
)
def test_correct_algorithms(build, spec, steps):
    p = build()
    report = check_program(p)
    assert report.ok and report.executor_safe, report.summary()
    assert report.spec == spec and report.steps_executed == report.steps_total == steps
    assert check_program(p, spec).ok
    assert check_program(parse_program(write_program(p), "x")).ok


def test_fixtures_are_proven():
    assert check_program(load_program(DATA / "ring_allgather_4.xml")).ok
    legacy = check_program(load_program(DATA / "legacy_ring_reducescatter_4.xml"))
    assert legacy.ok and legacy.spec == CollectiveSpec("reducescatter", 4, 1)


def test_both_declared_variants_are_checked():
    report = check_program(ring_allreduce(inplace=True, outofplace=True))
    assert report.ok and report.variants == ("out-of-place", "in-place")
    rs = check_program(ring_reducescatter(inplace=True, outofplace=True))
    assert rs.ok and rs.variants == ("out-of-place", "in-place")
    # in place the reduce-scatter's output is input chunk r: rank 2's o[0] is its i[2]
    assert rs.final_buffers["in-place"][2]["o"] == [rs.final_buffers["in-place"][2]["i"][2]]
    # the allgather ring copies i[0] into o[r]; in place the input IS o[r] (window), so that copy is a no-op
    ag = check_program(ring_allgather(), inplace=True)
    assert ag.ok and ag.variants == ("in-place",)


def test_in_place_failure_is_tagged_with_its_variant():
    # one threadblock per peer that sends i[p] and then receives into o[p]: also right in place (a swap)
    assert check_program(replace(alltoall(), inplace=True)).ok
    # separate sending and receiving threadblocks: in place a receive may overwrite a chunk not yet sent
    def gpu(r):
        tbs = [TB(-1, -1, [S("cpy", ("i", r), ("o", r))])]
        tbs += [TB(p, -1, [S("s", ("i", p))]) for p in range(4) if p != r]
        tbs += [TB(-1, p, [S("r", dst=("o", p))]) for p in range(4) if p != r]
        return tbs

    split = make("alltoall", 4, 4, 4, 4, gpu, inplace=True, outofplace=True)
    report = check_program(split)
    assert not report.ok and report.variants == ("out-of-place", "in-place")
    assert report.problems and all(line.startswith("in-place: ") for line in report.problems)
    assert report.problems[0].startswith("in-place: race on gpu 1 o[0]: gpu 1 tb 1 step 0 (s) reads it and gpu 1 tb 4")


def test_multiple_dependencies_through_nops():
    """gpu r: tb 0 and tb 1 each copy one half; tb 2 waits for both (a nop carries the first dependency)."""

    def gpu(r):
        return [
            TB(-1, -1, [S("cpy", ("i", 0), ("o", 2 * r), hasdep=True)]),
            TB(-1, -1, [S("cpy", ("i", 1), ("o", 2 * r + 1), hasdep=True)]),
            TB(1 - r, 1 - r, [
                S("nop", ("i", -1), ("o", -1), cnt=0, dep=(0, 0)),
                S("s", ("o", 2 * r), cnt=2, dep=(1, 0)),
                S("r", dst=("o", 2 * (1 - r)), cnt=2),
            ]),  # fmt: skip
        ]

    p = make("allgather", 2, 4, 2, 4, gpu)
    report = check_program(p)
    assert report.ok and report.notes == [], report.summary()
    # without the nop, tb 2 may send o[2r] before tb 0 wrote it
    racy = edit_step(edit_step(p, 0, 2, 0, depid=-1, deps=-1), 1, 2, 0, depid=-1, deps=-1)
    report = check_program(racy)
    assert "race on gpu 0 o[0]: gpu 0 tb 0 step 0 (cpy) writes it and gpu 0 tb 2 step 1 (s) reads it, with no dependency ordering them" in report.problems
    assert any("hasdep=1 but no step depends on it" in line for line in report.notes)


# ---------------------------------------------------------------------------------------------------------------
# Broken algorithms are caught, each with its own message


def test_postcondition_problems_is_the_contract_every_checker_uses():
    spec = CollectiveSpec("allgather", 3, 1)
    assert postcondition_problems(spec, spec.expected) == []
    held = lambda r, j: None if (r, j) == (2, 1) else spec.expected(r, j)  # noqa: E731
    assert postcondition_problems(spec, held) == ["rank 2 output 1: holds nothing, needs {r1[0]}"]
    # reduce: only the root's output is constrained; `where` names the place, `limit` caps the lines
    reduce = CollectiveSpec("reduce", 3, 2, root=1)
    assert postcondition_problems(reduce, lambda r, j: symbol([(1, j)]), where=lambda r, j: f"at {r}/{j}") == [
        "at 1/0: holds {r1[0]}, needs {r0[0], r1[0], r2[0]}", "at 1/1: holds {r1[1]}, needs {r0[1], r1[1], r2[1]}"]
    assert len(postcondition_problems(reduce, lambda r, j: None, limit=1)) == 1
    # an allreduce checked with a buffer of 3 chunks on 2 ranks (as check_program does for such programs)
    allreduce = CollectiveSpec("allreduce", 2, 1)
    assert postcondition_problems(allreduce, lambda r, j: symbol([(0, j), (1, j)]), output_chunks=3) == []
    assert postcondition_problems(allreduce, lambda r, j: symbol([(0, j), (1, j)]) if j < 2 else (),
                                  output_chunks=3) == [f"rank {r} output 2: holds {{}}, needs {{r0[2], r1[2]}}"
                                                       for r in (0, 1)]

def test_wrong_destination_offset():
    p = edit_step(ring_allgather(), 1, 0, 4, dstoff=3)  # rank 1 stores its last chunk (rank 2's) at o[3]
    report = check_program(p)
    assert not report.ok and report.deadlock == []
    assert report.problems == ["gpu 1 o[2]: holds nothing, needs {r2[0]}", "gpu 1 o[3]: holds {r2[0]}, needs {r3[0]}"]


def test_double_counted_reduction():
    p = append_step(ring_reducescatter(), 2, 0, S("re", ("i", 2), ("o", 0)))  # adds its own part again
    report = check_program(p)
    assert report.problems == ["gpu 2 o[0]: holds {r0[2], r1[2], r2[2]x2, r3[2]}, needs {r0[2], r1[2], r2[2], r3[2]}"]


def test_double_count_in_allreduce_ring():
    p = edit_step(ring_allreduce(), 3, 0, 7, type="rrc")  # reduces the finished sum into its own part again
    report = check_program(p)
    assert report.problems == ["gpu 3 o[1]: holds {r0[1], r1[1], r2[1], r3[1]x2}, needs {r0[1], r1[1], r2[1], r3[1]}"]


def test_deadlock_both_receive_first():
    p = pair_allgather(lambda r: [S("cpy", ("i", 0), ("o", r)), S("r", dst=("o", 1 - r)), S("s", ("o", r))])
    report = check_program(p)
    assert not report.ok and report.steps_executed == 2 and report.steps_total == 6
    assert report.deadlock == [
        "gpu 0 tb 0 step 1 (r): waits for a message from gpu 1 on channel 0 (FIFO empty); gpu 1 tb 0 step 1 (r) is blocked too",
        "gpu 1 tb 0 step 1 (r): waits for a message from gpu 0 on channel 0 (FIFO empty); gpu 0 tb 0 step 1 (r) is blocked too",
    ]
    assert report.bounded_fifo == []


def test_unmatched_send():
    p = pair_allgather(lambda r: [S("cpy", ("i", 0), ("o", r)), S("s", ("o", r)), S("r", dst=("o", 1 - r))])
    assert check_program(p).ok
    report = check_program(append_step(p, 0, 0, S("s", ("o", 0))))
    assert report.problems == ["unmatched send: gpu 0 tb 0 step 3 (s) sends to gpu 1 on channel 0; nothing receives it"]
    assert report.deadlock == []


def test_unmatched_receive():
    p = pair_allgather(lambda r: [S("cpy", ("i", 0), ("o", r)), S("s", ("o", r)), S("r", dst=("o", 1 - r))])
    report = check_program(append_step(p, 1, 0, S("r", dst=("o", 0))))
    assert "unmatched receive: gpu 1 tb 0 step 3 (r) expects a message from gpu 0 on channel 0 that is never sent" in report.problems
    assert report.deadlock == [
        "gpu 1 tb 0 step 3 (r): waits for a message from gpu 0 on channel 0 (FIFO empty); gpu 0 tb 0 has finished"
    ]


def test_out_of_range_offset():
    p = edit_step(ring_allgather(), 3, 0, 2, dstoff=4, srcoff=4)  # o has 4 chunks
    report = check_program(p)
    assert report.problems[0] == "gpu 3 tb 0 step 2 (rcs): dstoff=4 cnt=1 is out of range for buffer o (4 chunks)"
    assert "gpu 3 o[2]: holds nothing, needs {r2[0]}" in report.problems
    big = edit_step(ring_allgather(), 0, 0, 0, cnt=2)  # cpy i[0..2) but i has 1 chunk
    assert "gpu 0 tb 0 step 0 (cpy): srcoff=0 cnt=2 is out of range for buffer i (1 chunks)" in check_program(big).problems
    # in place rank 1's input is o[1]; i[-1] must not read o[0]
    before = edit_step(ring_allgather(), 1, 0, 1, srcbuf="i", srcoff=-1)
    report = check_program(before, inplace=True)
    assert report.problems[0] == "gpu 1 tb 0 step 1 (s): srcoff=-1 cnt=1 is out of range for buffer i (1 chunks)"
    assert "gpu 2 o[1]: holds {uninit}, needs {r1[0]}" in report.problems


def test_dependency_on_step_without_hasdep():
    def gpu(r, hasdep):
        return [
            TB(-1, -1, [S("cpy", ("i", 0), ("o", r), hasdep=hasdep)]),
            TB(1 - r, 1 - r, [S("s", ("o", r), dep=(0, 0)), S("r", dst=("o", 1 - r))]),
        ]

    assert check_program(make("allgather", 2, 2, 1, 2, lambda r: gpu(r, True))).ok
    report = check_program(make("allgather", 2, 2, 1, 2, lambda r: gpu(r, False)))
    assert report.problems[0] == (
        "gpu 0 tb 1 step 0 (s): depends on gpu 0 tb 0 step 0 (cpy), which is not marked hasdep=1 "
        "(the executor only signals hasdep steps)"
    )
    assert report.deadlock[0] == (
        "gpu 0 tb 1 step 0 (s): waits for gpu 0 tb 0 to signal step 0 (hasdep); gpu 0 tb 0 has finished without signalling it"
    )


def test_bad_dependency_targets():
    p = ring_allgather()
    missing_tb = check_program(edit_step(p, 0, 0, 2, depid=5, deps=0))
    assert "gpu 0 tb 0 step 2 (rcs): depends on tb 5, which does not exist on gpu 0" in missing_tb.problems
    missing_step = check_program(edit_step(p, 0, 0, 2, depid=0, deps=9))
    assert "gpu 0 tb 0 step 2 (rcs): depends on step 9 of tb 0, which has 5 steps" in missing_step.problems
    later = check_program(edit_step(p, 0, 0, 2, depid=0, deps=3))
    assert (
        "gpu 0 tb 0 step 2 (rcs): depends on step 3 of its own threadblock, which runs later (never completes)"
        in later.problems
    )
    assert later.deadlock == []  # ignored while simulating, so the rest is still checked
    earlier = check_program(edit_step(edit_step(p, 0, 0, 1, hasdep=True), 0, 0, 2, depid=0, deps=1))
    assert earlier.ok and earlier.notes == [
        "gpu 0 tb 0 step 2 (rcs): depends on its own earlier step 1 (program order already ensures it)"
    ]


def test_dependency_on_a_nop():
    p = make("allgather", 2, 2, 1, 2, lambda r: [
        TB(-1, -1, [S("cpy", ("i", 0), ("o", r)), S("nop", ("i", -1), ("o", -1), cnt=0, hasdep=True)]),
        TB(1 - r, 1 - r, [S("s", ("o", r), dep=(0, 1)), S("r", dst=("o", 1 - r))]),
    ])  # fmt: skip
    report = check_program(p)
    assert "gpu 0 tb 1 step 0 (s): depends on gpu 0 tb 0 step 1, a nop, which never signals" in report.problems
    assert "gpu 0 tb 0 step 1 (nop): nop with hasdep=1; the executor does not store nops, so it never signals" in report.problems
    assert report.deadlock[0].startswith("gpu 0 tb 1 step 0 (s): waits for gpu 0 tb 0 to signal step 1")


def test_hasdep_nobody_waits_for_is_a_note():
    report = check_program(edit_step(ring_allgather(), 2, 0, 1, hasdep=True))
    assert report.ok
    assert report.notes == ["gpu 2 tb 0 step 1 (s): hasdep=1 but no step depends on it"]


def test_cnt_mismatch_between_sender_and_receiver():
    p = pair_allgather(lambda r: [S("cpy", ("i", 0), ("o", r)), S("s", ("o", r)), S("r", dst=("o", 1 - r))])
    report = check_program(edit_step(p, 0, 0, 1, cnt=2))  # sends o[0..2)
    assert "gpu 1 tb 0 step 2 (r) receives cnt=1 but the matching send gpu 0 tb 0 step 1 (s) has cnt=2" in report.problems
    assert not report.ok


def test_wrong_s_numbering_and_limits_are_problems():
    report = check_program(edit_step(ring_allgather(), 1, 0, 3, s=7))
    assert "gpu 1 tb 0 step 3 (rcs): s=7, steps must be numbered by position" in report.problems
    long = ring_allgather()
    for _ in range(61):
        long = append_step(long, 0, 0, S("nop", ("i", -1), ("o", -1), cnt=0, dep=(0, 0)))
    assert "gpu 0 tb 0: 66 steps, the executor allows at most 64 per threadblock" in check_program(long).problems


def test_uninitialised_data_taints_the_result():
    p = edit_step(ring_allgather(), 0, 0, 1, srcbuf="o", srcoff=2)  # rank 0 sends o[2] before receiving it
    report = check_program(p)
    assert "gpu 0 tb 0 step 1 (s): reads uninitialised o[2]" in report.notes
    assert "gpu 1 o[0]: holds {uninit}, needs {r0[0]}" in report.problems


def test_spec_mismatches():
    p = ring_allgather()
    assert check_program(p, CollectiveSpec("allgather", 8, 1)).problems == [
        "the collective has 8 ranks, the program ngpus=4 and 4 gpus"
    ]
    report = check_program(p, CollectiveSpec("allgather", 4, 2))
    assert "nchunksperloop=4 but a allgather of 4 ranks x 2 chunk(s) moves 8 chunks per loop" in report.problems
    assert "gpu 0: i_chunks=1 o_chunks=4, the allgather needs 2 and 8" in report.problems
    assert check_program(p, CollectiveSpec("broadcast", 4, 4)).problems[0] == "the program is a allgather, checked as a broadcast"


# ---------------------------------------------------------------------------------------------------------------
# Bounded FIFOs


def burst(sends: int, proto: str, cnt: int = 1) -> Program:
    """2-rank alltoall: each rank sends `sends` messages before receiving any."""
    k = sends * cnt

    def gpu(r):
        out = [S("s", ("i", k * (1 - r) + j * cnt), cnt=cnt) for j in range(sends)]
        inn = [S("r", dst=("o", k * (1 - r) + j * cnt), cnt=cnt) for j in range(sends)]
        return [TB(-1, -1, [S("cpy", ("i", k * r), ("o", k * r), cnt=k)]), TB(1 - r, 1 - r, out + inn)]

    return make("alltoall", 2, 2 * k, 2 * k, 2 * k, gpu, proto=proto)


def test_fifo_capacity():
    assert NCCL_STEPS == 8
    assert (fifo_capacity("LL"), fifo_capacity("LL128"), fifo_capacity("Simple")) == (8, 8, 2)


@pytest.mark.parametrize("proto, fits", [("LL", 8), ("LL128", 8), ("Simple", 2)])
def test_bounded_fifo_deadlock(proto, fits):
    assert check_program(burst(fits, proto)).executor_safe
    report = check_program(burst(fits + 1, proto))
    assert report.ok and not report.executor_safe  # correct with unbounded FIFOs, stuck on the executor
    assert report.bounded_fifo == [
        f"gpu {r} tb 1 step {fits} (s): cannot send to gpu {1 - r} on channel 0: FIFO full ({fits} chunks in flight "
        f"with {proto}, 8 slots per connection)"
        for r in (0, 1)
    ]


def test_bounded_fifo_streams_within_a_step():
    report = check_program(burst(1, "LL", cnt=9))  # one 9-chunk message each way
    assert report.ok
    assert report.bounded_fifo[0].startswith("gpu 0 tb 1 step 0 (s) (after 8 of 9 chunks): cannot send to gpu 1")
    assert check_program(burst(1, "LL", cnt=8)).executor_safe


# ---------------------------------------------------------------------------------------------------------------
# Spec derivation, determinism, speed


def test_derive_spec():
    assert derive_spec(ring_allgather()) == CollectiveSpec("allgather", 4, 1)
    assert derive_spec(ring_reducescatter()) == CollectiveSpec("reducescatter", 4, 1)
    assert derive_spec(replace(ring_allreduce(), nchunksperloop=8)) == CollectiveSpec("allreduce", 4, 2)
    assert derive_spec(alltoall()) == CollectiveSpec("alltoall", 4, 1)
    bcast = make("broadcast", 3, 2, 2, 2, lambda r: [TB(-1, -1, [])])
    assert derive_spec(bcast) == CollectiveSpec("broadcast", 3, 2, 0)
    with pytest.raises(ValueError, match="not a multiple"):
        derive_spec(replace(ring_allgather(), nchunksperloop=6))


def test_broadcast_root_is_inferred():
    def gpu(r):  # root 2 sends its 2 chunks down a chain 2 -> 0 -> 1
        if r == 2:
            return [TB(0, -1, [S("cpy", ("i", 0), ("o", 0), cnt=2), S("s", ("i", 0), cnt=2)])]
        if r == 0:
            return [TB(1, 2, [S("rcs", dst=("o", 0), cnt=2)])]
        return [TB(-1, 0, [S("r", dst=("o", 0), cnt=2)])]

    report = check_program(make("broadcast", 3, 2, 2, 2, gpu))
    assert report.ok and report.spec == CollectiveSpec("broadcast", 3, 2, 2), report.summary()


def test_allreduce_with_odd_chunk_count():
    def gpu(r):  # 3 chunks on 2 ranks: exchange everything and reduce
        return [TB(1 - r, 1 - r, [S("cpy", ("i", 0), ("o", 0), cnt=3), S("s", ("i", 0), cnt=3), S("rrc", ("o", 0), ("o", 0), cnt=3)])]

    report = check_program(make("allreduce", 2, 3, 3, 3, gpu))
    assert report.ok, report.summary()
    assert report.notes == ["allreduce with nchunksperloop=3 not a multiple of ngpus=2: checked with 3 chunks per buffer"]


def test_reports_are_deterministic():
    p = edit_step(edit_step(alltoall(6), 2, 3, 1, dstoff=0), 4, 1, 0, hasdep=True)
    first, second = check_program(p), check_program(p)
    assert first.problems == second.problems and first.notes == second.notes and first.problems


def test_many_mismatches_are_capped():
    p = edit_step(ring_allreduce(8), 0, 0, 0, cnt=0)  # rank 0 never copies its input: every sum misses it
    report = check_program(p)
    wrong = [line for line in report.problems if " o[" in line]
    assert len(wrong) == 10
    assert report.problems[-1] == "... and 54 more wrong output chunks (64 in all)"


def test_large_program_is_fast():
    n, k = 32, 64  # 32 ranks x 63 threadblocks x up to 64 steps: 127 008 steps

    def gpu(r):
        tbs = [TB(-1, -1, [S("cpy", ("i", r * k), ("o", r * k), cnt=k)])]
        for p in range(n):
            if p != r:
                tbs.append(TB(p, -1, [S("s", ("i", p * k + j)) for j in range(k)]))
                tbs.append(TB(-1, p, [S("r", dst=("o", p * k + j)) for j in range(k)]))
        return tbs

    p = make("alltoall", n, n * k, n * k, n * k, gpu, proto="LL")
    start = time.perf_counter()
    report = check_program(p)
    elapsed = time.perf_counter() - start
    assert report.ok and report.steps_executed == 127_008
    assert elapsed < 4.0, f"{elapsed:.2f} s"  # about 0.4 s on an idle machine

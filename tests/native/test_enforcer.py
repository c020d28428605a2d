"""The enforcer (Syndicate's Pseudocode 2) through the binding, mlopt.native.enforcer, end to end.

Schedule-plan payloads are made by hand here from real decompositions (mlopt.planners.schedule.motifs:
segmentation, ring and tree all-reduce, splined all-to-all, ...), turned into motif tables, and run on 4 and
8 in-process ranks by the multi-rank harness, every rank's output checked against numpy after every
iteration. Also: ranks submitting in different orders (enforced: one issue order, right data; not enforced:
the watchdog's deadlock, no hang), wait time and replanning, and the FIFO/planned comparison of the harness.

Skipped as a whole when the library is not built (`pip install -e .` builds it; see docs/runtime.md).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from mlopt.native import binding as native

try:
    native.library()
except native.RuntimeLibraryNotFound as _missing:
    pytest.skip(f"mlopt runtime library unavailable: {_missing}", allow_module_level=True)

from mlopt.planners.schedule import motifs as M  # noqa: E402
from mlopt.native.enforcer import (  # noqa: E402
    Enforcer,
    Item,
    MotifTable,
    ProgramCache,
    expected_output,
    input_values,
    payload_row,
    run_iteration_harness,
    stage,
)

NBYTES = 4 * 8 * 4 * 16  # float32, divisible into 8 blocks of 4 segments of 16 elements
CHANNELS = ["c0", "c1"]


def row(op: M.CommOp, motifs: list[M.Motif], name: str, channels=None, seqs=None) -> dict:
    """A payload row: motif i on channel i % 2 (or as given), seq = its stage (motifs of a stage together)."""
    seqs = [m.stage for m in motifs] if seqs is None else seqs
    channels = [[CHANNELS[i % 2]] for i in range(len(motifs))] if channels is None else channels
    return payload_row(op, motifs, seqs, channels, name=name)


def offset_seqs(r: dict, by: int) -> dict:
    for m in r["motifs"]:
        m["seq"] += by
    return r


def payload(*rows: dict) -> dict:
    return {"channels": list(CHANNELS), "comm_ops": list(rows)}


def comm_items(table: MotifTable) -> list[Item]:
    return [Item("comm", op=op.index) for op in table.ops]


DECOMPOSITIONS = {
    "allreduce-seg2": ("allreduce", lambda op: M.segment(op, 2)),
    "allreduce-seg4": ("allreduce", lambda op: M.segment(op, 4)),
    "allreduce-ring": ("allreduce", M.ring_allreduce),
    "allreduce-tree": ("allreduce", lambda op: M.tree_allreduce(op, 2)),
    "allreduce-seg2-spline2": ("allreduce", lambda op: M.segment_then_spline(op, 2, 2)),
    "allreduce-hierarchical2": ("allreduce", lambda op: M.hierarchical_allreduce(op, 2)),
    "alltoall-spline2": ("alltoall", lambda op: M.spline(op, 2)),
    "alltoall-group-spline2": ("alltoall", lambda op: M.group_spline_alltoall(op, 2)),
    "alltoall-spline1": ("alltoall", lambda op: M.spline(op, 1)),
    "alltoall-seg2": ("alltoall", lambda op: M.segment(op, 2)),
    "allgather-spline2": ("allgather", lambda op: M.spline(op, 2)),
    "reducescatter-spline2": ("reducescatter", lambda op: M.spline(op, 2)),
    "broadcast-spline2": ("broadcast", lambda op: M.spline(op, 2)),
    "reduce-spline2": ("reduce", lambda op: M.spline(op, 2)),
}


@pytest.mark.parametrize("nranks", [4, 8])
@pytest.mark.parametrize("case", sorted(DECOMPOSITIONS))
def test_decompositions_compute_their_collective(case, nranks):
    collective, decompose = DECOMPOSITIONS[case]
    root = 1 if collective in M.ROOTED else None
    op = M.CommOp(collective, NBYTES, tuple(range(nranks)), root)
    motifs = decompose(op)
    assert not M.implements(op, motifs), "the decomposition itself is right"
    table = MotifTable.from_plan(payload(row(op, motifs, case)))
    assert [m.seq for m in table.ops[0].motifs] == [m.stage for m in motifs]
    result = run_iteration_harness(table, comm_items(table), iterations=2, watchdog_ms=20000)
    assert not result.mismatches, result.mismatches[:3]
    for r in range(nranks):
        assert result.stats[r].iterations == 2
        mine = sum(r in m.ranks for m in motifs)
        assert result.stats[r].motifs_issued == result.stats[r].motifs_completed == 2 * mine


def test_permuted_ranks_and_a_subset_of_them():
    """An op over ranks (5, 2, 7, 0) of 8: positions, blocks and the root follow the op's rank order."""
    ranks = (5, 2, 7, 0)
    rows = [row(M.CommOp("alltoall", NBYTES, ranks), M.spline(M.CommOp("alltoall", NBYTES, ranks), 2), "a2a"),
            row(M.CommOp("allgather", NBYTES, ranks), M.spline(M.CommOp("allgather", NBYTES, ranks), 2), "ag"),
            row(M.CommOp("broadcast", NBYTES, ranks, 7), M.spline(M.CommOp("broadcast", NBYTES, ranks, 7), 2), "bc")]
    for k, r in enumerate(rows):
        offset_seqs(r, 10 * k)
    table = MotifTable.from_plan(payload(*rows), nranks=8)
    result = run_iteration_harness(table, comm_items(table), iterations=2)
    assert not result.mismatches, result.mismatches[:3]
    assert result.stats[1].motifs_issued == 0  # rank 1 takes part in nothing


def test_the_check_catches_a_missing_motif():
    op = M.CommOp("allreduce", NBYTES, tuple(range(4)))
    r = row(op, M.segment(op, 2), "ar")
    r["motifs"].pop()  # segment 1 never reduced
    result = run_iteration_harness(MotifTable.from_plan(payload(r)), [Item("comm", op=0)], iterations=1)
    assert result.mismatches and "element 256 is" in result.mismatches[0]


def test_from_plan_takes_one_iteration_and_renumbers_seqs():
    op = M.CommOp("allreduce", NBYTES, tuple(range(4)))
    first = row(op, M.segment(op, 2), "grad0", seqs=[3, 3])
    second = row(op, M.ring_allreduce(op), "grad1", seqs=[7, 12])
    early = payload_row(op, M.segment(op, 1), [1], [["c0"]], name="old", iteration=0)
    table = MotifTable.from_plan({"channels": CHANNELS, "comm_ops": [early, first, second]})
    assert [o.name for o in table.ops] == ["grad0", "grad1"]
    assert [[m.seq for m in o.motifs] for o in table.ops] == [[0, 0], [1, 2]]
    assert [m.channel_mask for m in table.ops[0].motifs] == [1, 2]
    assert table.ops[1].motifs[1].motif.deps == (0,)
    assert [o.name for o in MotifTable.from_plan({"channels": CHANNELS, "comm_ops": [early, first]},
                                                 iteration=0).ops] == ["old"]
    fifo = MotifTable.fifo({"channels": CHANNELS, "comm_ops": [early, first, second]})
    assert [(len(o.motifs), o.motifs[0].seq, o.motifs[0].channel_mask) for o in fifo.ops] == [(1, 0, 3), (1, 1, 3)]
    with pytest.raises(ValueError, match="no comm-ops in iteration 5"):
        MotifTable.from_plan({"channels": CHANNELS, "comm_ops": [first]}, iteration=5)
    bad = row(op, M.segment(op, 2), "x", channels=[["c0"], ["nvlink"]])
    with pytest.raises(ValueError, match="channel 'nvlink' is not one of"):
        MotifTable.from_plan(payload(bad))
    bare = dict(first, motifs=[{"name": "m", "channels": ["c0"], "seq": 0}])
    with pytest.raises(ValueError, match="lacks collective, ranks, regions"):
        MotifTable.from_plan(payload(bare))


# ------------------------------------------------------------------------------------------------ ordering


def crossed_payload(channels) -> dict:
    """Ops A then B (all-reduces in two segments); A's motifs have seq 0, B's seq 1."""
    a = M.CommOp("allreduce", NBYTES, tuple(range(4)))
    return payload(row(a, M.segment(a, 2), "A", channels=channels, seqs=[0, 0]),
                   row(a, M.segment(a, 2), "B", channels=channels, seqs=[1, 1]))


def crossed_items() -> dict[int, list[Item]]:
    """Even ranks submit A then B, odd ranks B then A; then compute on both."""
    items = {}
    for r in range(4):
        order = [0, 1] if r % 2 == 0 else [1, 0]
        items[r] = [Item("comm", op=o) for o in order] + [Item("compute", duration_us=100, waits=(0, 1))]
    return items


@pytest.mark.parametrize("channels", [[["c0"], ["c1"]], [["c0"], ["c0"]]], ids=["two-channels", "one-channel"])
def test_different_submission_orders_enforced(channels):
    table = MotifTable.from_plan(crossed_payload(channels))
    result = run_iteration_harness(table, crossed_items(), iterations=3)
    assert not result.mismatches
    first = [(e.op, e.index, e.iteration) for e in result.logs[0]]
    assert first == [(o, i, it) for it in range(3) for o in (0, 1) for i in (0, 1)]
    assert all([(e.op, e.index, e.iteration) for e in log] == first for log in result.logs)


def test_different_submission_orders_deadlock_without_enforcement():
    table = MotifTable.from_plan(crossed_payload([["c0"], ["c0"]]))
    started = time.perf_counter()
    with pytest.raises(native.RuntimeLibraryError) as caught:
        run_iteration_harness(table, crossed_items(), iterations=1, enforce_order=False, watchdog_ms=300)
    assert caught.value.status_name == "MLOPT_ERR_DEADLOCK"
    assert "deadlock" in caught.value.message and "behind op" in caught.value.message
    assert time.perf_counter() - started < 10  # reported, and the enforcer freed, without hanging


def test_late_submission_is_wait_time_and_suggests_replanning():
    """Rank 3 submits B (seq 1), computes 150 ms, then submits A (seq 0): its progress thread waits."""
    table = MotifTable.from_plan(crossed_payload([["c0"], ["c1"]]))
    items = {r: [Item("comm", op=0), Item("comm", op=1)] for r in range(3)}
    items[3] = [Item("comm", op=1), Item("compute", duration_us=150_000), Item("comm", op=0)]
    result = run_iteration_harness(table, items, iterations=1)
    assert not result.mismatches
    late, early = result.stats[3], result.stats[0]
    assert late.last_wait_us > 100_000 and late.replan_suggested
    assert late.last_wall_us >= late.last_wait_us
    assert early.wait_us == 0 and not early.replan_suggested


def test_harness_fifo_against_planned_on_a_small_dag():
    """Forward compute, two gradient all-reduces issued during the backward pass and an all-to-all consumed
    next: wall-clock ratio FIFO / planned (reported, never asserted: two shared cores)."""
    ar = M.CommOp("allreduce", NBYTES, tuple(range(4)))
    a2a = M.CommOp("alltoall", NBYTES, tuple(range(4)))
    plan = payload(row(ar, M.segment(ar, 2), "grad1", seqs=[0, 0]),
                   row(ar, M.segment(ar, 2), "grad0", seqs=[1, 1]),
                   row(a2a, M.spline(a2a, 2), "a2a", seqs=[1, 1], channels=[["c1"], ["c1"]]))
    items = [Item("compute", "fwd", 2000), Item("compute", "bwd1", 1000), Item("comm", op=0),
             Item("compute", "bwd0", 1000), Item("comm", op=1), Item("comm", op=2),
             Item("compute", "emb", 500, waits=(2,)), Item("compute", "opt", 500, waits=(0, 1))]
    planned = run_iteration_harness(MotifTable.from_plan(plan), items, iterations=3)
    fifo = run_iteration_harness(MotifTable.fifo(plan), items, iterations=3)
    assert not planned.mismatches and not fifo.mismatches
    assert planned.mean_iteration_us > 0 and fifo.mean_iteration_us > 0
    print(f"FIFO / planned wall clock: {fifo.mean_iteration_us / planned.mean_iteration_us:.3f} "
          f"({fifo.mean_iteration_us:.0f} us / {planned.mean_iteration_us:.0f} us)")


# ------------------------------------------------------------------------------------------------ binding


def test_binding_directly():
    """add_motif/start/submit/wait/stats/issue_log by hand: one 4-rank all-reduce in two segments."""
    op = M.CommOp("allreduce", NBYTES, tuple(range(4)))
    programs = ProgramCache()
    with Enforcer(4, watchdog_ms=5000) as enforcer:
        for i, m in enumerate(M.segment(op, 2)):
            s = stage(m, programs)
            enforcer.add_motif(op=0, index=i, seq=0, program=s.program, ranks=m.ranks, count=s.count,
                               op_bytes=NBYTES, gather=s.gather, scatter=s.scatter, channel_mask=1 << i)
        programs.close()  # the library copied them
        enforcer.start()
        inputs = [input_values(r, 0, 0, NBYTES // 4) for r in range(4)]
        for r in range(4):
            enforcer.submit(r, 0, inputs[r])  # in place
        for r in range(4):
            enforcer.wait(r, 0)
        table_op = MotifTable.from_plan(payload(row(op, M.segment(op, 2), "x"))).ops[0]
        for r in range(4):
            want, _ = expected_output(table_op, r, 0)
            assert np.array_equal(inputs[r], want)
        assert enforcer.stats(2).iterations == 1
        assert [(e.op, e.index, e.iteration) for e in enforcer.issue_log(1)] == [(0, 0, 0), (0, 1, 0)]
        with pytest.raises(native.RuntimeLibraryError, match="rank=4 is not in 0..3") as caught:
            enforcer.submit(4, 0, inputs[0])
        assert caught.value.exit_code == 2
        with pytest.raises(ValueError, match="the op needs 2048"):
            enforcer.submit(0, 0, inputs[0][:8])


def test_bad_motif_is_refused_with_its_field_named():
    op = M.CommOp("allreduce", NBYTES, tuple(range(4)))
    programs = ProgramCache()
    m = M.segment(op, 1)[0]
    s = stage(m, programs)
    with Enforcer(4) as enforcer:
        with pytest.raises(native.RuntimeLibraryError, match=r"motif \(op 0, index 0, 'x'\): ranks\[3\]=9") as caught:
            enforcer.add_motif(op=0, index=0, seq=0, program=s.program, ranks=(0, 1, 2, 9), count=s.count,
                               op_bytes=NBYTES, gather=s.gather, scatter=s.scatter, name="x")
        assert caught.value.status_name == "MLOPT_ERR_INVALID_ARGUMENT"
        with pytest.raises(native.RuntimeLibraryError, match="past op_bytes=1024"):
            enforcer.add_motif(op=0, index=0, seq=0, program=s.program, ranks=m.ranks, count=s.count,
                               op_bytes=NBYTES // 2, gather=s.gather, scatter=s.scatter)
        with pytest.raises(native.RuntimeLibraryError, match="no motifs were added"):
            enforcer.start()
    programs.close()


def test_reducing_ranges_must_be_whole_elements():
    op = M.CommOp("allreduce", 4 * 10 + 2, tuple(range(4)))
    with pytest.raises(ValueError, match="not a multiple of the 4-byte elements"):
        stage(M.segment(op, 2)[0], ProgramCache(), where="op 0 motif 0")


def test_a_real_schedule_plan_runs(run_cli, ddp_example_trace, tmp_path):
    """`mlopt plan schedule` on the DDP example (2 ranks: two broadcasts, two gradient all-reduces per
    iteration): its steady-state iteration, planned and FIFO, gives every rank the right data."""
    import json

    out = tmp_path / "schedule.plan.json"
    result = run_cli("plan", "schedule", "--model", ddp_example_trace, "--topology", "fully-connected:2",
                     "--max-steps", "20", "-o", out)
    assert result.code == 0, result.err
    plan = json.loads(out.read_text())["payload"]
    for table in (MotifTable.from_plan(plan), MotifTable.fifo(plan)):
        assert table.nranks == 2 and [op.collective for op in table.ops].count("allreduce") == 2
        harness = run_iteration_harness(table, comm_items(table), iterations=2)
        assert not harness.mismatches, harness.mismatches[:3]
        assert all(s.iterations == 2 for s in harness.stats)

"""Collective-permute ("permute") in the enforcer binding, mlopt.native.enforcer.

A permute motif runs the pattern all-to-all program of its (source, destination) pairs: the source's input
region is gathered into the staging block of its destination, the destination scatters the staging block of
its source into the same region of its output (SOURCE_INPUT; ranks that are no destination keep their output).
The staging layout and the plan rows are checked in pure Python; the multi-rank harness runs (which need the
C++ runtime: the `runtime_library` fixture skips them when it is not built) check every rank's output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlopt.planners.schedule import motifs as M
from mlopt.native.enforcer import (
    SOURCE_INPUT,
    Item,
    MotifTable,
    expected_output,
    input_values,
    motif_program_xml,
    payload_row,
    run_iteration_harness,
    stage,
)

NBYTES = 4 * 4 * 16  # float32: 64 elements, cut into 2 segments of 32
CHANNELS = ["c0", "c1"]
CYCLE = ((0, 1), (1, 2), (2, 3), (3, 0))
PARTIAL = ((0, 2), (1, 3))  # ranks 0 and 1 receive nothing, 2 and 3 send nothing


def row(op: M.CommOp, motifs: list[M.Motif], name: str, channels=None, seqs=None) -> dict:
    """A payload row: motif i on channel i % 2 (or as given), seq = its stage (parallel motifs together)."""
    seqs = [m.stage for m in motifs] if seqs is None else seqs
    channels = [[CHANNELS[i % 2]] for i in range(len(motifs))] if channels is None else channels
    return payload_row(op, motifs, seqs, channels, name=name)


def payload(*rows: dict) -> dict:
    return {"channels": list(CHANNELS), "comm_ops": list(rows)}


def comm_items(table: MotifTable) -> list[Item]:
    return [Item("comm", op=op.index) for op in table.ops]


class FakePrograms:
    """A ProgramCache stand-in (no runtime): records what was asked and reports the pattern all-to-all
    program's chunk counts (n input and n output chunks per position)."""

    def __init__(self):
        self.asked = []

    def get(self, collective, n, root=0, pattern=None):
        self.asked.append((collective, n, root, pattern))
        return None, {"i_chunks": n, "o_chunks": n, "root": 0}


# ------------------------------------------------------------------------------------------------ staging


def test_staging_layout_of_a_permute_motif():
    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=CYCLE)
    programs = FakePrograms()
    s = stage(M.as_motif(op), programs)
    assert programs.asked == [("permute", 4, 0, frozenset(CYCLE))]  # positions = ranks here
    assert s.source == SOURCE_INPUT
    block = NBYTES  # bytes per staging block: the whole region
    assert s.count == 4 * (NBYTES // 4)
    # source p (pair (p, q)) gathers its whole input into block q; destination q scatters block p
    assert s.gather == tuple(((0, ((p + 1) % 4) * block, NBYTES),) for p in range(4))
    assert s.scatter == tuple(((0, ((q - 1) % 4) * block, NBYTES),) for q in range(4))


def test_staging_layout_of_a_segment_over_permuted_ranks_with_idle_positions():
    """Ranks (5, 2, 7, 0): positions follow the motif's rank order; the second of 2 segments covers bytes
    [128, 256); position 3 (rank 0) is in no pair and moves nothing."""
    ranks, pairs = (5, 2, 7, 0), ((5, 7), (7, 2))
    op = M.CommOp("permute", NBYTES, ranks, pairs=pairs)
    m = M.segment(op, 2)[1]
    assert m.regions == (((128, 128),),)
    programs = FakePrograms()
    s = stage(m, programs)
    assert programs.asked == [("permute", 4, 0, frozenset({(0, 2), (2, 1)}))]
    assert s.source == SOURCE_INPUT and s.count == 4 * 32
    block = 128
    assert s.gather == (((128, 2 * block, 128),), (), ((128, 1 * block, 128),), ())
    assert s.scatter == ((), ((128, 2 * block, 128),), ((128, 0, 128),), ())


def test_a_permute_runs_the_pattern_alltoall_program_of_its_pairs():
    pattern = frozenset({(0, 1), (1, 2), (2, 3), (3, 0)})
    assert motif_program_xml("permute", 4, pattern=pattern) == motif_program_xml("alltoall", 4, pattern=pattern)
    with pytest.raises(ValueError, match="needs its"):
        motif_program_xml("permute", 4)
    bare = M.Motif("permute", (0, 1, 2, 3), (((0, NBYTES),),))  # no pattern: not stageable
    with pytest.raises(ValueError, match="op 0 motif 0: a permute motif needs its pairs"):
        stage(bare, FakePrograms(), where="op 0 motif 0")


# ------------------------------------------------------------------------------------------------ plan rows


def test_plan_row_round_trip_keeps_pairs():
    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=CYCLE)
    r = json.loads(json.dumps(row(op, M.spline(op, 2), "halo")))
    assert r["pairs"] == [list(p) for p in CYCLE]
    assert [m["pattern"] for m in r["motifs"]] == [[[0, 1], [2, 3]], [[1, 2], [3, 0]]]
    for table in (MotifTable.from_plan(payload(r)), MotifTable.fifo(payload(r))):
        (top,) = table.ops
        assert (top.collective, top.nbytes, top.ranks, top.root, top.pairs) == ("permute", NBYTES, (0, 1, 2, 3),
                                                                               None, CYCLE)
    fifo = MotifTable.fifo(payload(r)).ops[0].motifs
    assert len(fifo) == 1 and fifo[0].motif == M.as_motif(op) and fifo[0].channel_mask == 3
    other = M.CommOp("allreduce", NBYTES, (0, 1, 2, 3))
    plain = row(other, M.segment(other, 2), "grad")
    assert "pairs" not in plain and MotifTable.from_plan(payload(plain)).ops[0].pairs == ()
    del r["pairs"]
    with pytest.raises(ValueError, match="comm-op halo: the permute row lacks pairs"):
        MotifTable.from_plan(payload(r))


def test_expected_output_of_a_permute():
    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=PARTIAL)
    top = MotifTable.from_plan(payload(row(op, [M.as_motif(op)], "p"))).ops[0]
    for rank in (0, 1):
        _, defined = expected_output(top, rank, 3)
        assert not defined.any()
    for source, rank in PARTIAL:
        values, defined = expected_output(top, rank, 3)
        assert defined.all() and np.array_equal(values, input_values(source, 0, 3, NBYTES // 4))


# ------------------------------------------------------------------------------------------------ harness

DECOMPOSITIONS = {
    "one-motif": lambda op: [M.as_motif(op)],
    "seg2": lambda op: M.segment(op, 2),
    "spline2": lambda op: M.spline(op, 2),
    "seg2-spline2": lambda op: M.segment_then_spline(op, 2, 2),
}


@pytest.mark.parametrize("pairs", [CYCLE, PARTIAL, ((0, 1),)], ids=["cycle", "partial", "one-pair"])
@pytest.mark.parametrize("case", sorted(DECOMPOSITIONS))
def test_permute_decompositions_run_on_four_ranks(runtime_library, case, pairs):
    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=pairs)
    motifs = DECOMPOSITIONS[case](op)
    assert not M.implements(op, motifs), "the decomposition itself is right"
    table = MotifTable.from_plan(payload(row(op, motifs, case)))
    result = run_iteration_harness(table, comm_items(table), iterations=2, watchdog_ms=20000)
    assert not result.mismatches, result.mismatches[:3]
    first = [(e.op, e.index, e.iteration) for e in result.logs[0]]
    assert len(first) == 2 * len(motifs)
    assert all([(e.op, e.index, e.iteration) for e in log] == first for log in result.logs)
    assert all(s.iterations == 2 and s.motifs_completed == 2 * len(motifs) for s in result.stats)


def test_permute_fifo_table_runs(runtime_library):
    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=CYCLE)
    table = MotifTable.fifo(payload(row(op, M.spline(op, 2), "p")))
    result = run_iteration_harness(table, comm_items(table), iterations=2)
    assert not result.mismatches, result.mismatches[:3]


def test_permute_over_permuted_ranks_of_eight(runtime_library):
    ranks = (5, 2, 7, 0)
    op = M.CommOp("permute", NBYTES, ranks, pairs=((5, 2), (2, 7), (0, 5)))
    table = MotifTable.from_plan(payload(row(op, M.spline(op, 2), "p")), nranks=8)
    result = run_iteration_harness(table, comm_items(table), iterations=2)
    assert not result.mismatches, result.mismatches[:3]
    assert result.stats[1].motifs_issued == 0  # rank 1 takes part in nothing


def test_the_check_catches_a_missing_permute_motif(runtime_library):
    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=CYCLE)
    r = row(op, M.spline(op, 2), "p")
    r["motifs"].pop()  # pairs (1, 2) and (3, 0) never moved
    result = run_iteration_harness(MotifTable.from_plan(payload(r)), [Item("comm", op=0)], iterations=1)
    assert sorted(m.split(" op ")[0] for m in result.mismatches) == ["iteration 0 rank 0", "iteration 0 rank 2"]


def test_non_destinations_keep_their_output(runtime_library):
    """mlopt leaves the output of a rank that is no destination as it was (the harness fills it with -1e9)."""
    from mlopt.native.enforcer import Enforcer

    op = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=PARTIAL)
    table = MotifTable.from_plan(payload(row(op, M.segment(op, 2), "p")))
    inputs = [input_values(r, 0, 0, NBYTES // 4) for r in range(4)]
    outputs = [np.full(NBYTES // 4, -7.0, np.float32) for _ in range(4)]
    with Enforcer(4, watchdog_ms=5000) as enforcer:
        enforcer.load(table)
        enforcer.start()
        for r in range(4):
            enforcer.submit(r, 0, inputs[r], outputs[r])
        for r in range(4):
            enforcer.wait(r, 0)
    assert np.array_equal(outputs[2], inputs[0]) and np.array_equal(outputs[3], inputs[1])
    assert (outputs[0] == -7.0).all() and (outputs[1] == -7.0).all()


def test_permute_and_allreduce_submitted_in_different_orders(runtime_library):
    """Even ranks submit the permute then the all-reduce, odd ranks the reverse: enforced, every rank issues
    the motifs in the table's one order and gets the right data."""
    halo = M.CommOp("permute", NBYTES, (0, 1, 2, 3), pairs=CYCLE)
    grad = M.CommOp("allreduce", NBYTES, (0, 1, 2, 3))
    table = MotifTable.from_plan(payload(row(halo, M.spline(halo, 2), "halo", seqs=[0, 0]),
                                         row(grad, M.segment(grad, 2), "grad", seqs=[1, 1])))
    items = {r: [Item("comm", op=o) for o in ([0, 1] if r % 2 == 0 else [1, 0])]
             + [Item("compute", duration_us=100, waits=(0, 1))] for r in range(4)}
    result = run_iteration_harness(table, items, iterations=2)
    assert not result.mismatches, result.mismatches[:3]
    first = [(e.op, e.index, e.iteration) for e in result.logs[0]]
    assert first == [(o, i, it) for it in range(2) for o in (0, 1) for i in (0, 1)]
    assert all([(e.op, e.index, e.iteration) for e in log] == first for log in result.logs)

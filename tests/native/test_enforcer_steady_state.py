"""A schedule plan's steady state in the enforcer: `MotifTable.steady_state` (the period with the next
iteration's prefetched comm-ops, and the prologue) and the multi-rank harness running prologue + periods.

The payloads are made by hand like the DLRM-like plan `mlopt plan schedule` writes (two unrolled iterations,
seqs numbering the whole plan, the next batch's data-prep all-to-all issued during the current iteration);
the table construction is pure Python, the harness runs need the C++ runtime (the `runtime_library` fixture
skips them when it is not built). One test plans the scaled DLRM-like example for real and runs its period.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mlopt.planners.schedule import motifs as M
from mlopt.native.enforcer import (
    Item,
    MotifTable,
    expected_output,
    payload_row,
    period_items,
    run_iteration_harness,
)

REPO = Path(__file__).resolve().parents[2]
RANKS = tuple(range(4))
NBYTES = 4 * 4 * 16  # float32: 4 blocks of 16 elements, 2 segments of 32
CHANNELS = ["c0", "c1"]
# name, collective, decomposition, plan seqs per iteration (as the DLRM-like plan: iteration 1's data-prep,
# seq 2, is issued right after iteration 0's embedding all-to-all)
OPS = [
    ("a2a-data-prep", "alltoall", lambda op: [M.as_motif(op)], ([0], [2])),
    ("a2a-emb-fwd", "alltoall", lambda op: M.segment(op, 2), ([1, 1], [9, 9])),
    ("ar-top", "allreduce", lambda op: M.segment(op, 2), ([3, 4], [10, 11])),
    ("a2a-emb-bwd", "alltoall", lambda op: [M.as_motif(op)], ([5], [12])),
    ("ar-bottom", "allreduce", lambda op: M.segment(op, 2), ([6, 8], [13, 14])),
]


def make_row(position: int, iteration: int, seqs=None) -> dict:
    name, collective, decompose, plan_seqs = OPS[position]
    op = M.CommOp(collective, NBYTES, RANKS)
    motifs = decompose(op)
    seqs = plan_seqs[iteration] if seqs is None else seqs
    return payload_row(op, motifs, seqs, [[CHANNELS[i % 2]] for i in range(len(motifs))], name=name,
                       iteration=iteration, op_id=10 * iteration + position)


def dlrm_payload() -> dict:
    return {"channels": CHANNELS, "comm_ops": [make_row(p, it) for it in (0, 1) for p in range(len(OPS))]}


def no_prefetch_payload() -> dict:
    """Iteration 1 strictly after iteration 0 (its data-prep at seq 9, with its embedding all-to-all at 10)."""
    rows = [make_row(p, 0) for p in range(len(OPS))]
    rows += [make_row(p, 1, [s + 1 if p else 9 for s in OPS[p][3][1]]) for p in range(len(OPS))]
    return {"channels": CHANNELS, "comm_ops": rows}


def program() -> list[Item]:
    """One iteration of the DLRM-like application, comm-ops by position: data-prep, lookup (needs it),
    embedding all-to-all, forward (needs it), top backward + all-reduce, interaction backward + embedding
    all-to-all, bottom backward + all-reduce, optimizer (needs both all-reduces and the embedding gradient)."""
    return [Item("comm", "a2a-data-prep", op=0), Item("compute", "lookup", 300, waits=(0,)),
            Item("comm", "a2a-emb-fwd", op=1), Item("compute", "forward", 300, waits=(1,)),
            Item("compute", "top-bwd", 200), Item("comm", "ar-top", op=2),
            Item("compute", "interaction-bwd", 200), Item("comm", "a2a-emb-bwd", op=3),
            Item("compute", "bottom-bwd", 300), Item("comm", "ar-bottom", op=4),
            Item("compute", "optimizer", 200, waits=(2, 3, 4))]


def shape(table: MotifTable) -> list[tuple[str, int, int, list[int]]]:
    return [(op.name, op.offset, op.position, [m.seq for m in op.motifs]) for op in table.ops]


# ------------------------------------------------------------------------------------------------ tables


def test_the_next_data_prep_is_prefetched_into_the_period():
    period, prologue = MotifTable.steady_state(dlrm_payload())
    assert shape(period) == [("a2a-emb-fwd", 0, 1, [0, 0]), ("a2a-data-prep", 1, 0, [1]), ("ar-top", 0, 2, [2, 3]),
                             ("a2a-emb-bwd", 0, 3, [4]), ("ar-bottom", 0, 4, [5, 6])]
    assert [op.index for op in period.ops] == list(range(5))
    assert all(m.op == op.index for op in period.ops for m in op.motifs)
    assert shape(prologue) == [("a2a-data-prep", 0, 0, [0])]
    assert period.nranks == prologue.nranks == 4 and period.channels == tuple(CHANNELS)
    # the prefetched op is iteration 1's row, the others iteration 0's: their motifs as planned there
    assert [m.channel_mask for m in period.ops[0].motifs] == [1, 2]
    assert [op.data_key for op in period.ops] == [1, 0, 2, 3, 4]


def test_ties_with_the_last_motif_count_as_issued_during_the_iteration():
    payload = dlrm_payload()
    payload["comm_ops"][len(OPS)]["motifs"][0]["seq"] = 8  # iteration 1's data-prep with iteration 0's last
    period, prologue = MotifTable.steady_state(payload)
    assert [(op.name, op.offset) for op in period.ops][-1] == ("a2a-data-prep", 1)
    assert period.ops[-1].motifs[0].seq == period.ops[-2].motifs[-1].seq  # issued together, as planned
    assert prologue is not None


def test_an_op_issued_after_the_iteration_end_is_not_prefetched():
    payload = dlrm_payload()
    payload["comm_ops"][len(OPS)]["motifs"][0]["seq"] = 9  # after iteration 0's last motif (8)
    period, prologue = MotifTable.steady_state(payload)
    assert prologue is None and not any(op.offset for op in period.ops)


def test_an_op_straddling_the_iteration_end_is_not_prefetched():
    payload = dlrm_payload()
    payload["comm_ops"][len(OPS) + 1] = make_row(1, 1, [7, 9])  # iteration 1's emb-fwd: one motif before 8
    period, prologue = MotifTable.steady_state(payload)
    assert [op.name for op in period.ops if op.offset] == ["a2a-data-prep"]
    assert [op.name for op in prologue.ops] == ["a2a-data-prep"]


def test_without_prefetch_the_period_is_the_first_iteration():
    payload = no_prefetch_payload()
    period, prologue = MotifTable.steady_state(payload)
    assert prologue is None
    first = MotifTable.from_plan(payload, iteration=0)
    assert shape(period) == shape(first)
    assert [[m.motif for m in op.motifs] for op in period.ops] == [[m.motif for m in op.motifs] for op in first.ops]
    # and iterations 1 and 2 of a longer plan give the same, from `iteration`
    later = {"channels": CHANNELS, "comm_ops": [dict(r, iteration=r["iteration"] + 1) for r in payload["comm_ops"]]}
    assert shape(MotifTable.steady_state(later, iteration=1).period) == shape(first)


def test_mismatched_iterations_are_refused():
    payload = dlrm_payload()
    swapped = dict(payload, comm_ops=payload["comm_ops"][:len(OPS)] + [payload["comm_ops"][len(OPS) + 1],
                                                                       payload["comm_ops"][len(OPS)],
                                                                       *payload["comm_ops"][len(OPS) + 2:]])
    with pytest.raises(ValueError, match="comm-op 0 differs between iterations 0 and 1"):
        MotifTable.steady_state(swapped)
    with pytest.raises(ValueError, match="iterations 0 and 1 have 5 and 4 comm-ops"):
        MotifTable.steady_state(dict(payload, comm_ops=payload["comm_ops"][:-1]))
    with pytest.raises(ValueError, match="no comm-ops in iteration 1"):
        MotifTable.steady_state(dict(payload, comm_ops=payload["comm_ops"][:len(OPS)]))
    numbered_apart = [make_row(p, it, OPS[p][3][0]) for it in (0, 1) for p in range(len(OPS))]
    with pytest.raises(ValueError, match="do not number the plan across iterations"):
        MotifTable.steady_state({"channels": CHANNELS, "comm_ops": numbered_apart})


def test_period_items_submit_the_prefetch_first():
    period, _ = MotifTable.steady_state(dlrm_payload())
    items = period_items(period, program())
    assert [(i.name, i.op) for i in items if i.kind == "comm"] == [
        ("a2a-data-prep", 1), ("a2a-emb-fwd", 0), ("ar-top", 2), ("a2a-emb-bwd", 3), ("ar-bottom", 4)]
    assert items[0].name == "a2a-data-prep"
    assert [i.name for i in items[1:]] == [i.name for i in program() if i.name != "a2a-data-prep"]
    assert next(i for i in items if i.name == "lookup").waits == (1,)  # the data-prep, mapped
    with pytest.raises(ValueError, match="position 7 is not in the period"):
        period_items(period, [Item("comm", "x", op=7)])


# ------------------------------------------------------------------------------------------------ harness


def issue_order(table: MotifTable, log) -> list[tuple[int, int]]:
    """(iteration, seq) of a rank's issued motifs, in issue order (motifs of one seq go in any order)."""
    return [(e.iteration, table.ops[e.op].motifs[e.index].seq) for e in log]


def test_prologue_and_three_periods_give_every_rank_the_right_data(runtime_library):
    period, prologue = MotifTable.steady_state(dlrm_payload())
    items = period_items(period, program())
    result = run_iteration_harness(period, items, iterations=3, prologue=prologue, watchdog_ms=20000)
    assert not result.mismatches, result.mismatches[:3]
    assert len(result.iteration_us) == 3 and result.prologue_us > 0
    per_period = sum(len(op.motifs) for op in period.ops)
    for r in range(4):
        assert result.stats[r].iterations == 3
        assert result.stats[r].motifs_issued == result.stats[r].motifs_completed == 3 * per_period
        order = issue_order(period, result.logs[r])
        assert order == sorted(order) and len(order) == 3 * per_period
        assert [(e.op, e.index, e.iteration) for e in result.prologue_logs[r]] == [(0, 0, 0)]


def test_data_follows_the_position_not_the_table_index():
    """The prologue's data-prep (index 0) and the period's (index 1) stand for the same op: same inputs and
    expected outputs for one iteration, different ones across iterations (an output of the wrong batch
    cannot pass the check)."""
    period, prologue = MotifTable.steady_state(dlrm_payload())
    early, ahead = prologue.ops[0], period.ops[1]
    assert (early.index, ahead.index, early.data_key, ahead.data_key) == (0, 1, 0, 0)
    for rank in RANKS:
        assert (expected_output(early, rank, 1)[0] == expected_output(ahead, rank, 1)[0]).all()
        assert (expected_output(ahead, rank, 1)[0] != expected_output(ahead, rank, 2)[0]).all()


# ------------------------------------------------------------------------------------------------ end to end


def load(name: str, path: Path, monkeypatch):
    """A script as a module, registered while the test runs (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_a_planned_dlrm_like_steady_state_runs(runtime_library, run_cli, tmp_path, monkeypatch):
    """The DLRM-like example at the smallest sizes (16 ranks), planned by `mlopt plan schedule` (20 search
    steps), run as the bench runs it (bench/enforcer.py `setups`): prologue + 2 periods, no compute time."""
    from mlopt.formats.io import write_json

    models = load("schedule_models_steady", REPO / "examples" / "schedule" / "models.py", monkeypatch)
    bench = load("bench_enforcer_steady", REPO / "bench" / "enforcer.py", monkeypatch)
    trace = tmp_path / "dlrm.trace.json"
    write_json(trace, models.dlrm_like(1 / 65536).to_dict())
    out = tmp_path / "dlrm.plan.json"
    result = run_cli("plan", "schedule", "--model", trace, "--topology", "dgx-a100x2", "--max-steps", "20", "-o", out)
    assert result.code == 0, result.err
    payload = json.loads(out.read_text())["payload"]
    setup = bench.setups(payload, bench.harness_items(trace, payload, 0.0))[bench.STEADY]
    assert [op.name for op in setup.table.ops if op.offset] == ["a2a-data-prep"]
    assert [op.name for op in setup.prologue.ops] == ["a2a-data-prep"]
    assert setup.items[0].kind == "comm" and setup.table.ops[setup.items[0].op].name == "a2a-data-prep"
    harness = bench.measure(setup, 2)
    assert not harness.mismatches, harness.mismatches[:3]
    assert all(s.iterations == 2 for s in harness.stats)
    assert all(bench.common(setup.table, harness.logs, 0, r) == bench.common(setup.table, harness.logs, r, 0)
               for r in range(1, setup.table.nranks))

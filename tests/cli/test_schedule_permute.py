"""Collective-permute end to end: a trace with permute comm-ops -> `mlopt plan schedule` -> `mlopt validate`
-> `mlopt simulate` -> the enforcer's motif table, run on 16 CPU ranks with every output checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.synthetic_trace import TraceBuilder

WORLD = 16  # dgx-a100x2: two nodes of 8, nvswitch inside, ib between
TOPOLOGY = "dgx-a100x2"


def _pipeline_trace(path: Path) -> Path:
    """A ring of pipeline-like stages: each rank computes, sends its activations to the next rank (permute),
    computes on what it received, and the gradients go back to the previous rank (the inverse permute)."""
    forward = [(i, (i + 1) % WORLD) for i in range(WORLD)]
    backward = [(d, s) for s, d in forward]
    b = TraceBuilder()
    w, x = b.tensor(1 << 20, "parameter"), b.tensor(1 << 18, "input")
    a, recv = b.tensor(1 << 18), b.tensor(1 << 18)
    b.op("stage fwd", "forward", 400.0, [x, w], [a])
    b.op("send activations", "comm", 5.0, [a], [recv],
         {"collective": "permute", "bytes": 1 << 18, "group": "world", "pairs": [list(p) for p in forward]})
    y, g, g_back = b.tensor(1 << 18), b.tensor(1 << 18, "gradient"), b.tensor(1 << 18, "gradient")
    b.op("next stage fwd", "forward", 400.0, [recv, w], [y])
    b.op("stage bwd", "backward", 800.0, [y, w], [g])
    b.op("send gradients", "comm", 5.0, [g], [g_back],
         {"collective": "permute", "bytes": 1 << 18, "group": "world", "pairs": [list(p) for p in backward]})
    wg = b.tensor(1 << 20, "gradient")
    b.op("weight grad", "backward", 600.0, [g_back, x], [wg])
    b.op("allreduce grads", "comm", 5.0, [wg], [wg], {"collective": "allreduce", "bytes": 1 << 20, "group": "world"})
    b.op("sgd", "optimizer", 50.0, [wg, w], [w])
    return b.write(path, "ring-pipeline", WORLD, group="world", schema_version="1.1")


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    from mlopt.cli import main

    folder = tmp_path_factory.mktemp("permute")
    trace = _pipeline_trace(folder / "trace.json")
    plan = folder / "s.json"
    code = main(["-q", "plan", "schedule", "--model", str(trace), "--topology", TOPOLOGY, "--max-steps", "60",
                 "-o", str(plan)])
    assert code == 0
    return trace, plan


def test_plan_lists_the_permutes_with_their_pairs_and_validates(run_cli, planned):
    trace, plan = planned
    payload = json.loads(plan.read_text())["payload"]
    permutes = [row for row in payload["comm_ops"] if row["collective"] == "permute"]
    assert len(permutes) == 4  # two per iteration, two iterations unrolled
    assert {tuple(map(tuple, row["pairs"])) for row in permutes} == {
        tuple((i, (i + 1) % WORLD) for i in range(WORLD)), tuple(((i + 1) % WORLD, i) for i in range(WORLD))}
    assert all(m["collective"] == "permute" and m["pattern"] for row in permutes for m in row["motifs"])
    assert all("pairs" not in row for row in payload["comm_ops"] if row["collective"] != "permute")
    assert payload["predicted"]["iteration_us"] <= payload["systems"]["fifo"] * (1 + 1e-9)
    checked = run_cli("validate", plan, "--model", trace, "--topology", TOPOLOGY)
    assert checked.code == 0, checked.err


def test_every_planned_permute_decomposition_is_proven(planned):
    from mlopt.planners.schedule.motifs import CommOp, Motif, implements

    _, plan = planned
    for row in json.loads(plan.read_text())["payload"]["comm_ops"]:
        if row["collective"] != "permute":
            continue
        op = CommOp("permute", row["nbytes"], tuple(row["ranks"]), pairs=tuple(map(tuple, row["pairs"])))
        # a permute's motifs (segments, splined parts) are independent: proven as one parallel set
        motifs = [Motif("permute", tuple(m["ranks"]), tuple(tuple(map(tuple, r)) for r in m["regions"]),
                        pattern=tuple(map(tuple, m["pattern"]))) for m in row["motifs"]]
        assert implements(op, motifs) == [], row["plan"]


def test_simulate_replays_the_plan(run_cli, planned):
    trace, plan = planned
    result = run_cli("simulate", plan, "--model", trace, "--topology", TOPOLOGY, "--iterations", "2", "--json")
    assert result.code == 0, result.err


def test_enforcer_runs_the_planned_iteration_on_every_rank(runtime_library, planned):
    from mlopt.native.enforcer import Item, MotifTable, run_iteration_harness

    _, plan = planned
    table = MotifTable.from_plan(json.loads(plan.read_text())["payload"], iteration=1)
    assert sum(op.collective == "permute" for op in table.ops) == 2
    result = run_iteration_harness(table, [Item("comm", op=op.index) for op in table.ops], iterations=2,
                                   watchdog_ms=20000)
    assert not result.mismatches, result.mismatches[:3]
    # every rank issues the motifs it takes part in, in the plan's sequence order, each iteration
    seq = {(op.index, m.index): m.seq for op in table.ops for m in op.motifs}
    for rank, log in enumerate(result.logs):
        mine = sorted((op.index, m.index) for op in table.ops for m in op.motifs if rank in m.motif.ranks)
        for iteration in (0, 1):
            issued = [(e.op, e.index) for e in log if e.iteration == iteration]
            assert sorted(issued) == mine
            assert [seq[k] for k in issued] == sorted(seq[k] for k in issued)

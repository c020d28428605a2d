"""Collective-permute end to end: a trace with permute comm-ops -> `mlopt plan schedule` -> `mlopt validate`
-> `mlopt simulate` -> the enforcer's motif table, run on 16 CPU ranks with every output checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORLD = 16  # dgx-a100x2: two nodes of 8, nvswitch inside, ib between
TOPOLOGY = "dgx-a100x2"


def _pipeline_trace(path: Path) -> Path:
    """A ring of pipeline-like stages: each rank computes, sends its activations to the next rank (permute),
    computes on what it received, and the gradients go back to the previous rank (the inverse permute)."""
    tensors, ops = [], []

    def tensor(nbytes: int, kind: str = "activation") -> int:
        tensors.append({"bytes": nbytes, "dtype": "float32", "id": len(tensors), "kind": kind, "shape": [nbytes // 4]})
        return len(tensors) - 1

    def op(name, role, us, inputs, outputs, comm=None) -> None:
        ops.append({"comm": comm, "deps": [], "forward_op": None, "id": len(ops), "name": name, "role": role,
                    "implementations": [{"compute_us": us, "name": "default", "workspace_bytes": 0}],
                    "inputs": inputs, "outputs": outputs})

    forward = [(i, (i + 1) % WORLD) for i in range(WORLD)]
    backward = [(d, s) for s, d in forward]
    w, x = tensor(1 << 20, "parameter"), tensor(1 << 18, "input")
    a, recv = tensor(1 << 18), tensor(1 << 18)
    op("stage fwd", "forward", 400.0, [x, w], [a])
    op("send activations", "comm", 5.0, [a], [recv],
       {"collective": "permute", "bytes": 1 << 18, "group": "world", "pairs": [list(p) for p in forward]})
    y, g, g_back = tensor(1 << 18), tensor(1 << 18, "gradient"), tensor(1 << 18, "gradient")
    op("next stage fwd", "forward", 400.0, [recv, w], [y])
    op("stage bwd", "backward", 800.0, [y, w], [g])
    op("send gradients", "comm", 5.0, [g], [g_back],
       {"collective": "permute", "bytes": 1 << 18, "group": "world", "pairs": [list(p) for p in backward]})
    wg = tensor(1 << 20, "gradient")
    op("weight grad", "backward", 600.0, [g_back, x], [wg])
    op("allreduce grads", "comm", 5.0, [wg], [wg], {"collective": "allreduce", "bytes": 1 << 20, "group": "world"})
    op("sgd", "optimizer", 50.0, [wg, w], [w])
    path.write_text(json.dumps({"format": "mlopt.trace", "name": "ring-pipeline", "rank": 0, "schema_version": "1.1",
                                "world_size": WORLD, "process_groups": [{"name": "world", "ranks": list(range(WORLD))}],
                                "ops": ops, "tensors": tensors, "source": {"importer": "synthetic"}}))
    return path


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
    from mlopt.runtime.enforcer import Item, MotifTable, run_iteration_harness

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

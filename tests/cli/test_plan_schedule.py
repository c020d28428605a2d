"""`mlopt plan schedule` (Syndicate, first version) on the DDP example: plan, validation with the optSched replay,
byte-identical plans for a seed, the iteration simulator issuing the plan's order, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def trace(ddp_example_trace) -> Path:
    return ddp_example_trace


def _plan(run_cli, trace, out, *extra) -> dict:
    result = run_cli("plan", "schedule", "--model", trace, "--topology", "fully-connected:2", "--max-steps", "100",
                     "-o", out, *extra)
    assert result.code == 0, result.err
    return json.loads(out.read_text())


def test_plan_lists_every_comm_op_of_two_iterations_and_validates(run_cli, trace, tmp_path):
    plan = _plan(run_cli, trace, tmp_path / "s.json")
    payload = plan["payload"]
    assert plan["kind"] == "schedule" and plan["provenance"]["status"] == "heuristic"
    assert len(payload["comm_ops"]) == 8  # DDP's 2 broadcasts and 2 buckets, two iterations unrolled
    assert payload["search"]["iterations"] == 100 and payload["search"]["stop_reason"] == "max_steps"
    assert set(payload["systems"]) == {"fifo", "bs+", "hand", "s-exec", "s-sched", "syndicate"}
    assert payload["predicted"]["iteration_us"] == pytest.approx(payload["systems"]["syndicate"])
    assert payload["predicted"]["iteration_us"] <= payload["systems"]["fifo"] * (1 + 1e-9)
    checked = run_cli("validate", tmp_path / "s.json", "--model", trace, "--topology", "fully-connected:2")
    assert checked.code == 0 and "replayed by optSched" in checked.out + checked.err


def test_same_seed_same_plan(run_cli, trace, tmp_path):
    a = _plan(run_cli, trace, tmp_path / "a" / "s.json")
    b = _plan(run_cli, trace, tmp_path / "b" / "s.json")
    assert a == b
    assert (tmp_path / "a" / "s.json").read_bytes() == (tmp_path / "b" / "s.json").read_bytes()


@pytest.mark.parametrize("algorithm", ["fifo", "lifo", "hand", "exec-only", "sched-only"])
def test_every_system_validates(run_cli, trace, tmp_path, algorithm):
    plan = _plan(run_cli, trace, tmp_path / "s.json", "--algorithm", algorithm)
    name = {"fifo": "fifo", "lifo": "bs+", "hand": "hand", "exec-only": "s-exec", "sched-only": "s-sched"}[algorithm]
    assert plan["payload"]["predicted"]["iteration_us"] == pytest.approx(plan["payload"]["systems"][name])
    assert run_cli("validate", tmp_path / "s.json", "--model", trace, "--topology", "fully-connected:2").code == 0


def test_tampered_sequence_numbers_are_caught(run_cli, trace, tmp_path):
    path = tmp_path / "s.json"
    doc = _plan(run_cli, trace, path)
    motifs = [m for op in doc["payload"]["comm_ops"] for m in op["motifs"]]
    first, last = min(motifs, key=lambda m: m["start_us"]), max(motifs, key=lambda m: m["start_us"])
    first["seq"], last["seq"] = last["seq"], first["seq"]
    path.write_text(json.dumps(doc))
    result = run_cli("validate", path)
    assert result.code == 2 and "sequence number" in result.err


def test_the_simulator_issues_the_plans_order(run_cli, trace, tmp_path):
    _plan(run_cli, trace, tmp_path / "s.json")
    report = run_cli("simulate", tmp_path / "s.json", "--model", trace, "--topology", "fully-connected:2",
                     "--iterations", "2", "--json")
    assert report.code == 0, report.err
    result = json.loads(report.out)
    assert result["policy"] == "explicit"
    # every comm-op is simulated as its motifs, issued in the plan's sequence order
    payload = json.loads((tmp_path / "s.json").read_text())["payload"]
    motifs = sorted((m["seq"], k, j) for k, op in enumerate(payload["comm_ops"]) for j, m in enumerate(op["motifs"]))
    names = [f"{payload['comm_ops'][k]['name']}/{payload['comm_ops'][k]['motifs'][j]['name']}" for _, k, j in motifs]
    simulated = sorted(result["collectives"], key=lambda c: c["start_us"])
    assert len(simulated) == len(names) and {c["name"] for c in simulated} == set(names)
    one = run_cli("simulate", tmp_path / "s.json", "--model", trace, "--topology", "fully-connected:2", "--json")
    assert one.code == 0 and json.loads(one.out)["policy"] == "explicit"  # the plan's first iteration
    wrong = run_cli("simulate", tmp_path / "s.json", "--model", trace, "--topology", "fully-connected:2",
                    "--iterations", "3")
    assert wrong.code == 2 and "--iterations 2 or fewer" in wrong.err


def test_a_trace_without_comm_ops_gets_the_trivial_plan(run_cli, trace, tmp_path):
    doc = json.loads(Path(trace).read_text())
    comm = {op["id"] for op in doc["ops"] if op["role"] == "comm"}
    doc["ops"] = [op for op in doc["ops"] if op["id"] not in comm]
    for op in doc["ops"]:
        op["deps"] = [d for d in op.get("deps", []) if d not in comm]
    no_comm = tmp_path / "no-comm.json"
    no_comm.write_text(json.dumps(doc))
    result = run_cli("plan", "schedule", "--model", no_comm, "--topology", "fully-connected:2", "-o",
                     tmp_path / "s.json")
    assert result.code == 0 and "no comm-ops" in result.err
    payload = json.loads((tmp_path / "s.json").read_text())["payload"]
    assert payload["comm_ops"] == [] and payload["predicted"]["compute_idle_pct"] == pytest.approx(0, abs=1e-9)


def test_a_cyclic_trace_exits_2(run_cli, trace, tmp_path):
    doc = json.loads(Path(trace).read_text())
    doc["ops"][0]["deps"] = [doc["ops"][-1]["id"]]
    cyclic = tmp_path / "cyclic.json"
    cyclic.write_text(json.dumps(doc))
    result = run_cli("plan", "schedule", "--model", cyclic, "--topology", "fully-connected:2", "-o", tmp_path / "x.json")
    assert result.code == 2 and "cycl" in result.err and not (tmp_path / "x.json").exists()


def test_validate_proves_every_decomposition_and_catches_a_broken_one(run_cli, trace, tmp_path):
    path = tmp_path / "s.json"
    doc = _plan(run_cli, trace, path)
    checked = run_cli("validate", path)
    assert checked.code == 0 and f"{len(doc['payload']['comm_ops'])} decompositions proven" in checked.out + checked.err
    row = next(i for i, op in enumerate(doc["payload"]["comm_ops"]) if op["collective"] == "allreduce")
    motif = doc["payload"]["comm_ops"][row]["motifs"][0]
    (offset, length), = motif["regions"][0]
    motif["regions"] = [[[offset, length // 2]]]  # the all-reduce no longer covers its upper half
    path.write_text(json.dumps(doc))
    result = run_cli("validate", path)
    assert result.code == 2 and f"comm_ops[{row}].motifs" in result.err and "do not implement" in result.err

"""`mlopt simulate` in its iteration mode: a trace or a synthetic workload on a topology, alone or under
collective and memory plans; the reports (table, --json, PNGs) and the bad-input exits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def ddp_trace(ddp_example_trace) -> Path:
    return ddp_example_trace


def _json(result) -> dict:
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_trace_on_a_topology_reports_time_overlap_and_collectives(run_cli, ddp_trace, tmp_path):
    gantt, exposed = tmp_path / "gantt.png", tmp_path / "exposed.png"
    report = _json(run_cli("simulate", "--model", ddp_trace, "--topology", "fully-connected:2", "--json",
                           "--gantt", gantt, "--exposed-plot", exposed))
    assert report["topology"] == "fully-connected:2" and report["world_size"] == 2
    assert report["iteration_time_us"] >= report["compute_us"] > 0
    assert report["overlapped_us"] + report["exposed_us"] == pytest.approx(report["comm_us"], abs=2e-3)  # times rounded to 1 ns
    rows = report["collectives"]  # DDP's two parameter broadcasts at start-up, then its two gradient buckets
    assert sorted((r["collective"], r["bytes"]) for r in rows) == [("allreduce", 1052672), ("allreduce", 4460800),
                                                                  ("broadcast", 8), ("broadcast", 28)]
    assert all(r["algorithm"].startswith("ring") for r in rows)
    assert gantt.stat().st_size > 1000 and exposed.stat().st_size > 1000
    table = run_cli("simulate", "--model", ddp_trace, "--topology", "fully-connected:2")
    assert table.code == 0 and "exposed" in table.out and "allreduce" in table.out


def test_same_inputs_same_json(run_cli, ddp_trace):
    first = run_cli("simulate", "--model", ddp_trace, "--topology", "fully-connected:2", "--json")
    second = run_cli("simulate", "--model", ddp_trace, "--topology", "fully-connected:2", "--json")
    assert first.code == 0 and first.out == second.out


def test_synthetic_data_parallel_closed_form(run_cli):
    """8 ranks on ring:8, one layer: the only collective is a ring allreduce, exposed after the backward pass."""
    spec = "dp:ranks=8,layers=1,fwd_us=100,bwd_us=200,bytes=8MiB"
    report = _json(run_cli("simulate", "--workload", spec, "--topology", "ring:8", "--json"))
    from mlopt.formats.topology import GENERATOR_ALPHA_US, GENERATOR_BETA_US_PER_MB

    p, size = 8, 8 << 20
    ring_us = 2 * (p - 1) * (GENERATOR_ALPHA_US + size / p * GENERATOR_BETA_US_PER_MB / 1e6)
    assert report["compute_us"] == pytest.approx(300)
    assert report["comm_us"] == pytest.approx(ring_us, rel=0.01)
    assert report["iteration_time_us"] == pytest.approx(300 + ring_us, rel=0.01)
    assert report["exposed_us"] == pytest.approx(ring_us, rel=0.01)


def test_more_iterations_overlap_communication_with_the_next_forward(run_cli):
    """FIFO issues layer 0's all-reduce last, and the next forward starts with layer 0: no gain. LIFO issues it
    first, so the rest of the all-reduces overlap the next iteration's forward pass."""
    spec = "dp:ranks=4,layers=8,fwd_us=50,bwd_us=100,bytes=4MiB"
    common = ("simulate", "--workload", spec, "--topology", "ring:4", "--json")
    one = _json(run_cli(*common))
    fifo = _json(run_cli(*common, "--iterations", "2"))
    lifo = _json(run_cli(*common, "--iterations", "2", "--policy", "lifo"))
    assert fifo["iteration_time_us"] == pytest.approx(2 * one["iteration_time_us"], abs=2e-3)
    assert lifo["iteration_time_us"] < fifo["iteration_time_us"]
    assert lifo["per_iteration_us"][1] < lifo["per_iteration_us"][0]


def test_algorithms_and_modes_change_the_result(run_cli):
    spec = "dp:ranks=16,layers=2,fwd_us=10,bwd_us=10,bytes=64MiB"
    ring = _json(run_cli("simulate", "--workload", spec, "--topology", "torus:4x4", "--json",
                         "--algorithm", "hierarchical"))
    assert ring["collectives"][0]["algorithm"].startswith("hierarchical")
    aware = _json(run_cli("simulate", "--workload", spec, "--topology", "torus:4x4", "--json",
                          "--algorithm", "hierarchical", "--mode", "aware"))
    assert aware["iteration_time_us"] >= ring["iteration_time_us"] * (1 - 1e-9)
    fifo = _json(run_cli("simulate", "--workload", spec, "--topology", "torus:4x4", "--json",
                         "--algorithm", "hierarchical", "--mode", "fifo"))
    assert fifo["options"]["mode"] == "fifo" and fifo["iteration_time_us"] >= ring["iteration_time_us"] * (1 - 1e-9)


def test_a_collective_plan_replaces_the_algorithm(run_cli, ddp_trace, tmp_path):
    xml = tmp_path / "ar.xml"
    planned = run_cli("plan", "collective", "--topology", "fully-connected:2", "--collective", "allreduce",
                      "--size", "4MiB", "--algorithm", "direct", "-o", xml)
    assert planned.code == 0, planned.err
    report = _json(run_cli("simulate", xml, "--model", ddp_trace, "--topology", "fully-connected:2", "--json"))
    algorithms = {r["collective"]: r["algorithm"] for r in report["collectives"]}
    assert algorithms["allreduce"] == f"xml:{xml}" and algorithms["broadcast"].startswith("ring")


def test_a_memory_plan_adds_its_recomputation(run_cli, tmp_path):
    """A deep MLP traced on the CPU; the sqrt-segments plan recomputes, and the simulated compute grows by
    exactly the recomputation the plan predicts (the DDP example cannot recompute anything)."""
    torch = pytest.importorskip("torch")
    from mlopt.formats.io import write_json
    from mlopt.pytorch.trace import trace_model

    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    trace = trace_model(torch.nn.Sequential(*layers), (64,), 8, optimizer="none", repeats=1, warmup=0)
    model = tmp_path / "mlp.json"
    write_json(model, trace.to_dict())
    plan = tmp_path / "mem.json"
    made = run_cli("plan", "memory", "--model", model, "--budget-ratio", "1.0", "--algorithm", "sqrt", "-o", plan)
    assert made.code == 0, made.err
    recompute_us = json.loads(plan.read_text())["payload"]["predicted"]["recompute_us"]
    assert recompute_us > 0
    base = _json(run_cli("simulate", "--model", model, "--topology", "fully-connected:2", "--json"))
    with_plan = _json(run_cli("simulate", plan, "--model", model, "--topology", "fully-connected:2", "--json"))
    assert with_plan["compute_us"] == pytest.approx(base["compute_us"] + recompute_us, rel=1e-6, abs=2e-3)
    assert any(item["phase"] == "recompute" for item in with_plan["items"])


def test_a_topology_with_too_few_ranks_exits_2_naming_the_rank(run_cli):
    result = run_cli("simulate", "--workload", "dp:ranks=8,layers=2,bytes=1MiB", "--topology", "ring:4")
    assert result.code == 2
    assert "rank 4" in result.err and "ring:4" in result.err
    assert "Traceback" not in result.err


def test_a_plan_for_a_collective_the_trace_lacks_exits_2(run_cli, ddp_trace, tmp_path):
    xml = tmp_path / "ag.xml"
    assert run_cli("plan", "collective", "--topology", "fully-connected:2", "--collective", "allgather",
                   "--size", "1MiB", "-o", xml).code == 0
    result = run_cli("simulate", xml, "--model", ddp_trace, "--topology", "fully-connected:2")
    assert result.code == 2
    assert "ag.xml" in result.err and "allgather over 2 ranks is not a collective of the workload" in result.err


def test_bad_workload_spec_and_missing_topology(run_cli):
    bad = run_cli("simulate", "--workload", "dp:ranks=zero", "--topology", "ring:4")
    assert bad.code == 2 and "--workload" in bad.err
    missing = run_cli("simulate", "--workload", "dp:ranks=4,layers=1,bytes=1MiB")
    assert missing.code == 2 and "--topology" in missing.err


def test_cli_algorithm_choices_are_the_system_layers():
    from mlopt.cli import ITERATION_ALGORITHMS
    from mlopt.sim.collective_algorithms import ALGORITHMS

    assert sorted(ITERATION_ALGORITHMS) == sorted(ALGORITHMS)


def test_the_plans_of_mlopt_plan_model_by_their_index(run_cli, ddp_trace, tmp_path):
    """README's main job: every plan `mlopt plan --model` wrote, through its index: the thread plan's fusion
    groups replace DDP's buckets, each collective runs the collective plan of its kind synthesised for the
    nearest size, the memory plan's recomputation (none here) is added."""
    out = tmp_path / "plans"
    planned = run_cli("plan", "--model", ddp_trace, "--topology", "fully-connected:2", "-o", out)
    assert planned.code == 0, planned.err
    result = run_cli("simulate", out / "index.json", "--model", ddp_trace, "--topology", "fully-connected:2", "--json")
    report = _json(result)
    groups = json.loads((out / "threads.plan.json").read_text())["payload"]["groups"]
    rows = report["collectives"]
    assert sorted(r["bytes"] for r in rows if r["collective"] == "allreduce") == sorted(g["bytes"] for g in groups
                                                                                       if g["bytes"])
    for row in rows:
        assert row["algorithm"].startswith("xml:") and row["algorithm"].endswith(".xml")
        if row["collective"] == "broadcast":  # planned for exactly this size
            sidecar = json.loads(Path(row["algorithm"][4:]).with_suffix(".json").read_text())
            assert sidecar["payload"]["size_bytes"] == row["bytes"]


def test_simulate_options_mirror_the_flags_one_to_one():
    """`mlopt simulate`'s parameters are SimulateOptions' fields, one flag (or FILES) each, same defaults."""
    from dataclasses import fields

    from mlopt.cli import SimulateOptions, cli

    params = {p.name: p for p in cli.commands["simulate"].params}
    assert set(params) == {f.name for f in fields(SimulateOptions)}
    for f in fields(SimulateOptions):
        if f.name == "files":  # the FILES argument
            continue
        assert params[f.name].default == f.default, f.name
        flag = "--json" if f.name == "as_json" else "--" + f.name.replace("_", "-")
        assert flag in params[f.name].opts, f.name

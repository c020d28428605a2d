"""`mlopt plan memory`, `mlopt validate --model` and `mlopt simulate` on memory plans, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("torch")

TINY = REPO / "tests" / "data" / "models" / "tiny_cnn.py"
ALGORITHMS = ("monet", "checkpoint-only", "sqrt", "greedy")


def _trace(tmp_path_factory, builder: str) -> Path:
    from mlopt.cli import main

    path = tmp_path_factory.mktemp("trace") / f"{builder}.trace.json"
    code = main(["-q", "trace", f"{TINY}:{builder}", "--batch", "4", "--input-shape", "3,16,16", "-o", str(path)])
    assert code == 0
    return path


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory) -> Path:
    return _trace(tmp_path_factory, "build")


def plan(run_cli, trace: Path, out: Path, *args: str):
    return run_cli("plan", "memory", "--model", trace, "-o", out, *args)


def test_store_all_at_full_budget_validates(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "store-all.plan.json"
    r = plan(run_cli, tiny_trace, out, "--algorithm", "store-all", "--budget-ratio", "1.0")
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    assert doc["kind"] == "memory" and doc["provenance"]["status"] == "heuristic"
    assert doc["payload"]["predicted"]["memory_ratio"] == 1.0
    assert doc["payload"]["predicted"]["compute_overhead"] == 0.0
    v = run_cli("validate", out, "--model", tiny_trace)
    assert v.code == 0, v.err
    assert "replayed" in v.err


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_plans_within_budget_and_validates(run_cli, tiny_trace, tmp_path, algorithm):
    out = tmp_path / f"{algorithm}.plan.json"
    r = plan(run_cli, tiny_trace, out, "--algorithm", algorithm, "--budget-ratio", "0.8", "--json")
    if r.code == 3:  # a baseline may not fit; it must then say what would
        assert algorithm in ("sqrt", "greedy") and "least feasible budget" in r.err
        return
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["peak_bytes"] <= summary["budget_bytes"]
    payload = json.loads(out.read_text())["payload"]
    assert payload["algorithm"] == algorithm and payload["predicted"]["memory_ratio"] <= 0.8 + 1e-9
    assert run_cli("validate", out, "--model", tiny_trace).code == 0


def test_joint_never_worse_than_checkpoint_only(run_cli, tiny_trace, tmp_path):
    objectives = {}
    for algorithm in ("monet", "checkpoint-only"):
        out = tmp_path / f"{algorithm}.plan.json"
        assert plan(run_cli, tiny_trace, out, "--algorithm", algorithm, "--budget-ratio", "0.8").code == 0
        doc = json.loads(out.read_text())
        objectives[algorithm] = doc["provenance"]["objective"]
        assert doc["provenance"]["status"] == "optimal"  # tiny: proven
        assert doc["provenance"]["gap"] is not None and doc["provenance"]["best_bound"] is not None
    assert objectives["monet"] <= objectives["checkpoint-only"] * (1 + 1e-9)
    # MONeT's first solve is that checkpoint-only plan; the joint ILP starts from it.
    first = json.loads((tmp_path / "monet.plan.json").read_text())["payload"]["ilp"]["checkpoint_only_plan"]
    assert first["objective"] == objectives["checkpoint-only"] and first["status"] == "optimal"


def test_same_inputs_give_byte_identical_plans(run_cli, tiny_trace, tmp_path):
    first, second = tmp_path / "a.plan.json", tmp_path / "b.plan.json"
    for out in (first, second):
        assert plan(run_cli, tiny_trace, out, "--budget-ratio", "0.8").code == 0
    assert first.read_bytes() == second.read_bytes()


def test_budget_below_least_feasible_exits_3_with_the_least_budget(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "never.plan.json"
    r = plan(run_cli, tiny_trace, out, "--budget", "1KiB")
    assert r.code == 3
    assert "least feasible budget found is" in r.err and len(r.err.strip().splitlines()) == 1
    assert not out.exists()


def test_budget_flags_are_exclusive(run_cli, tiny_trace, tmp_path):
    r = plan(run_cli, tiny_trace, tmp_path / "x.json", "--budget", "1MiB", "--budget-ratio", "0.5")
    assert r.code == 2


def test_validate_needs_the_model_and_catches_tampering(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "p.plan.json"
    assert plan(run_cli, tiny_trace, out, "--algorithm", "checkpoint-only", "--budget-ratio", "0.8").code == 0
    r = run_cli("validate", out)
    assert r.code == 2 and "--model" in r.err
    doc = json.loads(out.read_text())
    doc["payload"]["budget_bytes"] = doc["payload"]["predicted"]["peak_bytes"] - 1
    over = tmp_path / "over.plan.json"
    over.write_text(json.dumps(doc))
    r = run_cli("validate", over, "--model", tiny_trace)
    assert r.code == 2 and "exceeds the budget" in r.err
    doc = json.loads(out.read_text())
    doc["payload"]["schedule"]["forward"] = [dict(f, store=False) for f in doc["payload"]["schedule"]["forward"]]
    doc["payload"]["schedule"]["backward"] = [dict(b, recompute=[]) for b in doc["payload"]["schedule"]["backward"]]
    broken = tmp_path / "broken.plan.json"
    broken.write_text(json.dumps(doc))
    r = run_cli("validate", broken, "--model", tiny_trace)
    assert r.code == 2 and "$.payload.schedule" in r.err
    doc = json.loads(out.read_text())
    doc["payload"]["predicted"]["compute_overhead_vs_least"] -= 0.01
    flattering = tmp_path / "flattering.plan.json"
    flattering.write_text(json.dumps(doc))
    r = run_cli("validate", flattering, "--model", tiny_trace)
    assert r.code == 2 and "compute_overhead_vs_least" in r.err
    doc = json.loads(out.read_text())
    doc["payload"]["model"]["least_compute_us"] *= 1.5
    flattering.write_text(json.dumps(doc))
    r = run_cli("validate", flattering, "--model", tiny_trace)
    assert r.code == 2 and "least_compute_us" in r.err
    doc = json.loads(out.read_text())
    factors = doc["payload"]["model"]["catalog_factors"]
    assert set(factors) == {"relu_outofplace", "relu_inplace", "relu_mask", "relu_intermediate_activated",
                            "bn_rebuild", "bn_reuse_stats"}
    factors["relu_mask"]["value"] = 0.01
    flattering.write_text(json.dumps(doc))
    r = run_cli("validate", flattering, "--model", tiny_trace)
    assert r.code == 2 and "$.payload.model.catalog_factors" in r.err


@pytest.mark.parametrize("algorithm", ("monet", "store-all"))
def test_overhead_against_the_fastest_implementations(run_cli, tiny_trace, tmp_path, algorithm):
    """No schedule computes less than every operator once at its fastest implementation."""
    out = tmp_path / "p.plan.json"
    assert plan(run_cli, tiny_trace, out, "--algorithm", algorithm, "--budget-ratio", "1.0" if algorithm == "store-all"
                else "0.8").code == 0
    payload = json.loads(out.read_text())["payload"]
    least, predicted = payload["model"]["least_compute_us"], payload["predicted"]
    assert 0 < least <= payload["store_all"]["compute_us"]
    assert predicted["compute_overhead_vs_least"] == pytest.approx(predicted["compute_us"] / least - 1.0)
    assert predicted["compute_overhead_vs_least"] >= -1e-12
    assert predicted["compute_overhead_vs_least"] >= predicted["compute_overhead"] - 1e-12


def test_plan_for_another_trace_is_rejected(run_cli, tiny_trace, tmp_path, tmp_path_factory):
    out = tmp_path / "p.plan.json"
    assert plan(run_cli, tiny_trace, out, "--algorithm", "store-all", "--budget-ratio", "1").code == 0
    other = _trace(tmp_path_factory, "build_with_unknown_op")
    r = run_cli("validate", out, "--model", other)
    assert r.code == 2 and "op_id" in r.err or "another trace" in r.err


def test_unknown_op_types_are_warned_about(run_cli, tmp_path, tmp_path_factory):
    trace = _trace(tmp_path_factory, "build_with_unknown_op")
    r = plan(run_cli, trace, tmp_path / "p.plan.json", "--algorithm", "store-all", "--budget-ratio", "1")
    assert r.code == 0, r.err
    assert "warning" in r.err and "gelu" in r.err


def test_sweep_writes_plans_table_and_plot(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "sweep"
    r = plan(run_cli, tiny_trace, out, "--algorithm", "checkpoint-only", "--sweep", "0.6,0.8,...,1.0", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    assert [row["budget_ratio"] for row in rows] == [0.6, 0.8, 1.0]
    table = json.loads((out / "sweep.json").read_text())
    assert len(table["rows"]) == 3 and (out / "sweep.png").stat().st_size > 0
    for row in rows:
        if row["file"]:
            assert run_cli("validate", out / row["file"], "--model", tiny_trace).code == 0
    overheads = [row["compute_overhead"] for row in rows if row["file"]]
    assert overheads == sorted(overheads, reverse=True)  # more memory never costs more compute


def test_sweep_rejects_bad_progressions(run_cli, tiny_trace, tmp_path):
    r = plan(run_cli, tiny_trace, tmp_path / "s", "--sweep", "0.5,0.4,...,1.0")
    assert r.code == 2 and "--sweep" in r.err


def test_bad_ops_profile_names_the_field(run_cli, tiny_trace, tmp_path):
    profile = tmp_path / "ops.json"
    profile.write_text(json.dumps({"format": "mlopt-op-profile", "schema_version": "1.0",
                                   "ops": {"aten::convolution": {"forward": [{"name": "slow", "time_factor": -1}]}}}))
    r = plan(run_cli, tiny_trace, tmp_path / "p.json", "--ops", profile, "--budget-ratio", "0.8")
    assert r.code == 2 and "time_factor" in r.err and str(profile) in r.err


def test_simulate_draws_memory_over_the_schedule(run_cli, tiny_trace, tmp_path):
    plans = []
    for algorithm, ratio in (("store-all", "1"), ("checkpoint-only", "0.8")):
        out = tmp_path / f"{algorithm}.plan.json"
        assert plan(run_cli, tiny_trace, out, "--algorithm", algorithm, "--budget-ratio", ratio).code == 0
        plans.append(out)
    png = tmp_path / "memory.png"
    r = run_cli("simulate", *plans, "--model", tiny_trace, "--plot", png, "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    assert rows[1]["peak_bytes"] < rows[0]["peak_bytes"] and png.stat().st_size > 0


def test_umbrella_plan_writes_a_memory_plan(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "plans"
    r = run_cli("plan", "--model", tiny_trace, "-o", out, "--json")
    assert r.code == 0, r.err
    index = json.loads(r.out)
    assert [p["kind"] for p in index["plans"]] == ["memory"]
    assert run_cli("validate", out / "memory.plan.json", "--model", tiny_trace).code == 0


def test_trace_using_a_tensor_before_it_is_produced_exits_2_naming_the_op(run_cli, tmp_path):
    from tests.formats.test_formats import _read_late_tensor, _trace_dict

    bad = tmp_path / "bad.trace.json"
    bad.write_text(json.dumps(_trace_dict(_read_late_tensor)))
    out = tmp_path / "p.plan.json"
    r = plan(run_cli, bad, out, "--budget-ratio", "0.8")
    assert r.code == 2 and "$.ops[0].inputs[2]" in r.err and "op 0 (aten::linear) uses tensor 6" in r.err
    assert not out.exists()


def test_summary_names_the_overhead_over_the_fastest_implementations(run_cli, tiny_trace, tmp_path):
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps({"format": "mlopt-op-profile", "schema_version": "1.0",
                               "ops": {"aten::convolution": {"backward": [{"name": "fast", "time_factor": 0.5,
                                                                           "workspace_per_output_byte": 0.0}]}}}))
    out = tmp_path / "p.plan.json"
    r = plan(run_cli, tiny_trace, out, "--algorithm", "store-all", "--budget-ratio", "1", "--ops", ops)
    assert r.code == 0, r.err
    assert "compute +0.0%" in r.err and "over the fastest implementations" in r.err
    payload = json.loads(out.read_text())["payload"]
    assert payload["predicted"]["compute_overhead_vs_least"] > 0
    assert run_cli("validate", out, "--model", tiny_trace).code == 0
    plain = plan(run_cli, tiny_trace, tmp_path / "q.plan.json", "--algorithm", "store-all", "--budget-ratio", "1")
    assert "fastest" not in plain.err

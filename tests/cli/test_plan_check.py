"""`mlopt plan ... --check PLAN` (mlopt/formats/staleness.py, docs/plan-check.md): 0 current, 1 stale (naming the
input, option or JSON path), 2 bad input; never writes; and the CI job examples/ci/check_plans.sh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from mlopt.formats.io import write_json

# Each planner subcommand with small, fast, deterministic options ({trace} is the DDP example's trace).
COMMANDS = {
    "memory": ["plan", "memory", "--model", "{trace}", "--budget-ratio", "1.0"],
    "threads": ["plan", "threads", "--model", "{trace}", "--nodes", "2"],
    "schedule": ["plan", "schedule", "--model", "{trace}", "--topology", "fully-connected:2", "--iterations", "1",
                 "--max-steps", "20"],
    "collective": ["plan", "collective", "--topology", "ring:4", "--collective", "allgather", "--size", "1MiB",
                   "--algorithm", "ring"],
}
PLAN_NAMES = {"memory": "memory.plan.json", "threads": "threads.plan.json", "schedule": "schedule.plan.json",
              "collective": "ag.xml"}


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def made(ddp_example_trace, tmp_path_factory):
    """The DDP example's trace and one plan per planner subcommand, made once: {kind: (args, plan path)}."""
    from mlopt.cli import main

    folder = tmp_path_factory.mktemp("plan-check")
    trace = folder / "trace.json"
    shutil.copy(ddp_example_trace, trace)
    out = {}
    for kind, args in COMMANDS.items():
        args = [a.format(trace=trace) for a in args]
        target = folder / PLAN_NAMES[kind]
        assert main(["-q", *args, "-o", str(target)]) == 0
        out[kind] = (args, target if kind != "collective" else target.with_suffix(".json"))
    return folder, trace, out


def check(run_cli, args, plan, *extra):
    return run_cli("-q", *args, "--check", plan, *extra)


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_current_plan_exits_0_and_writes_nothing(run_cli, made, kind):
    folder, _, plans = made
    args, plan = plans[kind]
    before = snapshot(folder)
    result = run_cli(*args, "--check", plan)
    assert result.code == 0, result.err
    assert result.out.strip() == f"{plan}: current"
    summary = run_cli(*args, "--check", plan, "--json")
    assert summary.code == 0 and json.loads(summary.out)["status"] == "current"
    assert snapshot(folder) == before


@pytest.mark.parametrize("kind", ["memory", "collective"])
def test_resolve_of_a_current_plan_exits_0_and_writes_nothing(run_cli, made, kind):
    folder, _, plans = made
    args, plan = plans[kind]
    before = snapshot(folder)
    result = run_cli(*args, "--check", plan, "--resolve", "-o", folder / "ignored.json")
    assert result.code == 0, result.err
    assert "current (re-solved: same bytes)" in result.out
    assert snapshot(folder) == before  # not even the -o given


def test_a_changed_trace_is_stale_and_named(run_cli, made, tmp_path):
    _, trace, plans = made
    args, plan = plans["threads"]
    doc = json.loads(trace.read_text())
    doc["name"] = doc.get("name", "") + " (edited)"
    edited = tmp_path / "edited.trace.json"
    write_json(edited, doc)
    result = check(run_cli, [a if a != str(trace) else str(edited) for a in args], plan)
    assert result.code == 1
    assert f"{plan}: stale: input model ({edited}) changed (sha256 " in result.out
    assert result.err.strip() == f"mlopt: error: {plan} is stale (regenerate it without --check)"


@pytest.mark.parametrize("kind, option, value, name", [
    ("memory", "--budget-ratio", "0.95", "budget_ratio ($.payload.budget_ratio): recorded 1.0, now 0.95"),
    ("schedule", "--max-steps", "21", "max_steps ($.payload.options.max_steps): recorded 20, now 21"),
    ("threads", "--max-groups", "3", "max_groups ($.payload.options.max_groups): recorded 10, now 3"),
    ("collective", "--size", "2MiB", "size_bytes ($.provenance.options.size_bytes): recorded 1048576, now 2097152"),
])
def test_a_changed_option_is_stale_and_named(run_cli, made, kind, option, value, name):
    _, _, plans = made
    args, plan = plans[kind]
    result = check(run_cli, [*args, option, value], plan)
    assert result.code == 1
    assert f"{plan}: stale: options differ: {name}" in result.out.splitlines()


def test_a_shared_planner_option_is_compared_too(run_cli, made):
    _, _, plans = made
    args, plan = plans["memory"]
    result = check(run_cli, [*args, "--seed", "7"], plan)
    assert result.code == 1 and "options differ: seed ($.provenance.options.seed): recorded 0, now 7" in result.out


def test_a_topology_file_instead_of_its_preset_is_stale(run_cli, made, tmp_path):
    _, _, plans = made
    args, plan = plans["collective"]
    topo = tmp_path / "ring4.json"
    shown = run_cli("show", "ring:4", "--json")
    assert shown.code == 0
    topo.write_text(shown.out)
    result = check(run_cli, [a if a != "ring:4" else str(topo) for a in args], plan)
    assert result.code == 1 and f"input topology ({topo}) changed" in result.out


def test_inputs_added_or_dropped_are_stale():
    from mlopt.formats.staleness import compare_inputs

    lines = compare_inputs({"model": "a" * 64, "sketch0": "b" * 64}, {"model": "a" * 64, "cost_table": "c" * 64},
                           {"model": "t.json", "cost_table": "costs.csv"}, "p.json")
    assert lines == ["input cost_table (costs.csv) is given now but the plan records none",
                     f"input sketch0 is recorded (sha256 {'b' * 12}..) but not given now"]


def test_resolve_names_the_first_differing_json_path(run_cli, made, tmp_path):
    folder, _, plans = made
    args, plan = plans["memory"]
    edited = tmp_path / plan.name
    doc = json.loads(plan.read_text())
    doc["payload"]["predicted"]["peak_bytes"] += 1
    write_json(edited, doc)
    assert check(run_cli, args, edited).code == 0  # inputs and options still agree: only a re-plan sees it
    result = check(run_cli, args, edited, "--resolve")
    assert result.code == 1
    assert f"{edited}: stale: re-solved: $.payload.predicted.peak_bytes: committed " in result.out


def test_an_edited_collective_xml_is_stale_without_resolve(run_cli, made, tmp_path):
    _, _, plans = made
    args, sidecar = plans["collective"]
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(sidecar, copy / sidecar.name)
    xml = copy / "ag.xml"
    xml.write_text(sidecar.with_suffix(".xml").read_text().replace('proto="Simple"', 'proto="LL"'))
    result = check(run_cli, args, xml)  # PLAN may be the XML: its sidecar is read
    assert result.code == 1 and f"its XML {xml} changed after planning" in result.out


def test_another_mlopt_version_warns_unless_strict(run_cli, made, tmp_path):
    _, _, plans = made
    args, plan = plans["threads"]
    older = tmp_path / plan.name
    doc = json.loads(plan.read_text())
    doc["provenance"]["mlopt_version"] = "0.0.1"
    write_json(older, doc)
    shutil.copy(plan.with_name("threads.plan.nccl-tuner.csv"), tmp_path)
    lenient = check(run_cli, args, older)
    assert lenient.code == 0 and "made by mlopt 0.0.1" in lenient.err and "warning" in lenient.err
    assert check(run_cli, args, older, "--resolve").code == 0  # the version field alone is no drift
    strict = check(run_cli, args, older, "--strict-version")
    assert strict.code == 1 and "stale: made by mlopt 0.0.1" in strict.out


@pytest.mark.parametrize("case, field", [
    ("missing", "$"), ("trace", "$.format"), ("other kind", "$.kind"), ("malformed", "$"), ("wall time", None)])
def test_bad_plan_exits_2_with_one_line(run_cli, made, tmp_path, case, field):
    folder, trace, plans = made
    args, plan = plans["memory"]
    extra = []
    if case == "missing":
        bad = tmp_path / "nope.json"
    elif case == "trace":
        bad = trace
    elif case == "other kind":
        bad = plans["threads"][1]
    elif case == "malformed":
        bad = tmp_path / "bad.json"
        bad.write_text("{")
    else:
        bad = tmp_path / "timed.json"
        assert run_cli("-q", *args, "--record-wall-time", "-o", bad).code == 0
        field, extra = "$.provenance.wall_time_s", ["--resolve"]
    before = snapshot(folder)
    result = check(run_cli, args, bad, *extra)
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mlopt: error: {bad}: {field}: ")
    assert snapshot(folder) == before


def test_a_missing_input_is_bad_input(run_cli, made, tmp_path):
    _, trace, plans = made
    args, plan = plans["threads"]
    result = check(run_cli, [a if a != str(trace) else str(tmp_path / "gone.json") for a in args], plan)
    assert result.code == 2 and result.err.strip() == f"mlopt: error: {tmp_path / 'gone.json'}: $: no such file"


def test_output_is_still_required_without_check(run_cli, made):
    args, _ = made[2]["memory"]
    result = run_cli(*args)
    assert result.code == 2 and "Missing option '-o' / '--output'" in result.err


def test_check_refuses_a_sweep(run_cli, made):
    folder, trace, _ = made
    result = run_cli("plan", "memory", "--model", trace, "--sweep", "0.9,1.0", "--check", folder)
    assert result.code == 2 and "--sweep" in result.err


def test_umbrella_checks_every_plan_of_the_index(run_cli, ddp_example_trace, tmp_path):
    out = tmp_path / "plans"
    args = ["plan", "--model", ddp_example_trace, "--topology", "fully-connected:2"]
    assert run_cli("-q", *args, "-o", out).code == 0
    before = snapshot(out)
    index = json.loads((out / "index.json").read_text())
    for target in (out, out / "index.json"):
        result = run_cli(*args, "--check", target)
        assert result.code == 0, result.out + result.err
        assert len(result.out.splitlines()) == 1 + len(index["plans"]) and "stale" not in result.out
    (out / "threads.plan.json").unlink()
    result = run_cli(*args, "--check", out, "--time-limit", "5")
    assert result.code == 1
    assert f"{out / 'threads.plan.json'}: stale: listed in {out / 'index.json'} ($.plans[5]) but missing" in result.out
    assert (f"{out / 'memory.plan.json'}: stale: options differ: time_limit_s ($.provenance.options.time_limit_s): "
            f"recorded null, now 5.0") in result.out
    assert "of the 8 files checked are stale" in result.err
    assert snapshot(out) == {k: v for k, v in before.items() if k != "threads.plan.json"}
    bad = run_cli(*args, "--check", out / "memory.plan.json")
    assert bad.code == 2 and bad.err.startswith(f"mlopt: error: {out / 'memory.plan.json'}: $.format: ")


# ---------------------------------------------------------------------------------------------------------
# the CI job


def run_ci(examples: Path | None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLOPT": f"{sys.executable} -m mlopt.cli", "PYTHON": sys.executable}
    if examples is not None:
        env["EXAMPLES"] = str(examples)
    return subprocess.run(["bash", str(REPO / "examples/ci/check_plans.sh"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


def test_ci_job_passes_on_the_committed_plans():
    before = snapshot(REPO / "examples")
    done = run_ci(None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "examples/ci: every plan is current" in done.stdout
    assert done.stdout.count("current (re-solved: same bytes)") == 8 + 3
    assert snapshot(REPO / "examples") == before


def test_ci_job_fails_on_drift(tmp_path):
    examples = tmp_path / "examples"
    for name in ("ddp_mlp", "schedule", "ci"):
        shutil.copytree(REPO / "examples" / name, examples / name)
    models = examples / "schedule" / "models.py"
    text = models.read_text()
    assert 'b.compute("optimizer", "optimizer", 1500,' in text
    models.write_text(text.replace('b.compute("optimizer", "optimizer", 1500,', 'b.compute("optimizer", "optimizer", 1600,'))
    plan = examples / "ci" / "plans" / "ddp_mlp.memory.plan.json"
    doc = json.loads(plan.read_text())
    doc["payload"]["budget_ratio"] = 0.99
    write_json(plan, doc)
    done = run_ci(examples, "--fast")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{examples}/ci/plans/cnn.schedule.plan.json: stale: input model (" in done.stdout
    assert "cnn.trace.json) changed (sha256 " in done.stdout
    assert (f"{plan}: stale: options differ: budget_ratio ($.payload.budget_ratio): recorded 0.99, now 1.0"
            in done.stdout)
    assert f"{examples}/ci/plans/ddp_mlp/index.json: current" in done.stdout  # the others stay current
    assert "examples/ci: stale plans" in done.stderr
    assert run_ci(examples, "--bogus").returncode == 2

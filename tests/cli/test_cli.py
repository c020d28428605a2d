"""The command line: groups, show, validate, the umbrella plan command, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, reference
from mlopt.formats.io import write_json
from mlopt.formats.topology import from_spec
from tests.formats.test_formats import small_trace


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "trace.json"
    write_json(path, small_trace().to_dict())
    return path


def test_help_lists_the_groups(run_cli):
    result = run_cli("--help")
    assert result.code == 0
    for command in ("plan", "show", "validate", "trace", "solvers"):
        assert f"  {command} " in result.out


def test_version(run_cli):
    from mlopt import __version__

    result = run_cli("--version")
    assert result.code == 0 and __version__ in result.out


def test_console_script_runs_and_errors_are_one_line(tmp_path):
    """The installed entry point, as a user runs it: exit code and a single stderr line."""
    done = subprocess.run([sys.executable, "-m", "mlopt.cli", "show", str(tmp_path / "nope.json")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"mlopt: error: {tmp_path / 'nope.json'}: $: no such file"


def test_show_ndv2x2_prints_the_link_table(run_cli):
    result = run_cli("show", "ndv2x2")
    assert result.code == 0
    assert "topology ndv2x2" in result.out and "links" in result.out
    assert result.out.count("│ ib ") >= 128 and "43.5" in result.out and "node0/nic0>node1/nic0" in result.out


def test_show_large_topology_summarises_unless_all_links(run_cli):
    short = run_cli("show", "dgx2x2")
    assert short.code == 0 and "--all-links lists each" in short.out and "NICs" in short.out
    full = run_cli("show", "dgx2x2", "--all-links")
    assert full.out.count("│ nvswitch ") >= 480


def test_show_json_round_trips(run_cli):
    result = run_cli("show", "ring:4", "--json")
    assert result.code == 0
    assert json.loads(result.out) == json.loads(json.dumps(from_spec("ring:4").to_dict()))


def test_show_taccl_files(run_cli):
    topo = run_cli("show", reference("taccl", "taccl_topo-ndv2-1MB.json"), "--nodes", "2")
    assert topo.code == 0 and "NDv2_1MBx2" in topo.out and "105" in topo.out
    sketch = run_cli("show", reference("taccl", "taccl_sketch_sk1-dgx2-n2.json"))
    assert sketch.code == 0 and "uc-min" in sketch.out


def test_show_and_validate_trace(run_cli, trace_file):
    shown = run_cli("show", trace_file)
    assert shown.code == 0 and "ops by role" in shown.out and "allreduce" in shown.out
    checked = run_cli("validate", trace_file, "--json")
    assert checked.code == 0
    assert json.loads(checked.out) == [{"file": str(trace_file), "kind": "trace", "ok": True, "detail": "6 ops, 6 tensors"}]


def test_validate_topology_file(run_cli, tmp_path):
    path = tmp_path / "t.json"
    write_json(path, from_spec("dgx2x2").to_dict())
    result = run_cli("validate", path)
    assert result.code == 0 and "32 ranks in 2 node(s)" in result.err


def test_umbrella_plan_writes_index_and_reports_skips(run_cli, trace_file, tmp_path):
    out = tmp_path / "plans"
    result = run_cli("plan", "--model", trace_file, "--topology", "ndv2x2", "-o", out, "--json")
    assert result.code == 0
    index = json.loads(result.out)
    assert json.loads((out / "index.json").read_text()) == index
    assert index["format"] == "mlopt.plan-index" and set(index["inputs"]) == {"model", "topology"}
    # small_trace's backward pairs with its forward: memory plans; its 2-rank allreduce does not fit ndv2x2
    # small_trace has no measured backward times: no thread plan either
    assert [p["kind"] for p in index["plans"]] == ["memory"]
    assert [s["kind"] for s in index["skipped"]] == ["collective", "threads", "schedule"]
    again = run_cli("validate", out / "index.json")
    assert again.code == 0


def test_plan_without_model_is_a_usage_error(run_cli):
    result = run_cli("plan", "-o", "x")
    assert result.code == 2 and "--model" in result.err


# --- bad input: exit 2, one line naming the file and the field, no traceback, no output file --------------


def _write(path, text):
    path.write_text(text)
    return path


def _trace_with(tmp_path, mutate):
    d = small_trace().to_dict()
    mutate(d)
    path = tmp_path / "bad_trace.json"
    write_json(path, d)
    return path


BAD_TRACES = {
    "malformed JSON": (lambda p: _write(p / "m.json", '{"format": "mlopt.trace", '), "$", "malformed JSON"),
    "malformed YAML": (lambda p: _write(p / "m.yaml", "format: [mlopt.trace\n"), "$", "malformed YAML"),
    "missing field": (lambda p: _trace_with(p, lambda d: d["ops"][2].pop("role")), "$.ops[2].role", "missing required field"),
    "mistyped field": (lambda p: _trace_with(p, lambda d: d["tensors"][1].update(bytes="1KB")), "$.tensors[1].bytes",
                       "expected integer"),
    "negative size": (lambda p: _trace_with(p, lambda d: d["ops"][4]["comm"].update(bytes=-8)), "$.ops[4].comm.bytes",
                      "must be >= 0"),
    "cyclic trace": (lambda p: _trace_with(p, lambda d: d["ops"][0].update(inputs=[0, 1, 3])), "$.ops[0].inputs[2]",
                     "cyclic trace"),
    "unknown major version": (lambda p: _trace_with(p, lambda d: d.update(schema_version="2.0")), "$.schema_version",
                              "upgrade mlopt"),
    "not a trace": (lambda p: _write(p / "x.json", '{"format": "mlopt.topology", "schema_version": "1.0"}'),
                    "$.format", "expected 'mlopt.trace'"),
    "missing path": (lambda p: p / "missing.json", "$", "no such file"),
    "directory": (lambda p: p, "$", "is a directory"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_model_input_exits_2_with_one_line_and_no_output(run_cli, tmp_path, case):
    make, field, fragment = BAD_TRACES[case]
    bad = make(tmp_path)
    out = tmp_path / "out"
    result = run_cli("plan", "--model", bad, "-o", out)
    assert result.code == 2, result.err
    line = result.err.strip()
    assert "\n" not in line and "Traceback" not in result.err
    assert line.startswith(f"mlopt: error: {bad}: {field}: "), line
    assert fragment in line
    assert not out.exists(), "no output may be left behind"


@pytest.mark.parametrize(
    "spec, field, fragment",
    [("ndv9", "topology", "unknown topology preset"), ("torus:4xq", "topology", "positive integer")],
)
def test_unknown_preset_exits_2(run_cli, trace_file, tmp_path, spec, field, fragment):
    result = run_cli("plan", "--model", trace_file, "--topology", spec, "-o", tmp_path / "out")
    assert result.code == 2 and result.err.startswith(f"mlopt: error: {spec}: {field}: ") and fragment in result.err
    assert not (tmp_path / "out").exists()


def test_bad_topology_file_names_the_field(run_cli, tmp_path):
    d = from_spec("ring:3").to_dict()
    d["links"][2]["alpha_us"] = "fast"
    path = tmp_path / "topo.json"
    write_json(path, d)
    result = run_cli("show", path)
    assert result.code == 2
    assert result.err.strip() == f"mlopt: error: {path}: $.links[2].alpha_us: expected number, found str 'fast'"


def test_bad_taccl_profile_names_the_field(run_cli, tmp_path):
    path = _write(tmp_path / "topo-ndv2-1MB.json", json.dumps(
        {"name": "NDv2_1MB", "gpus_per_node": 8, "alpha": 0.3, "node_betas_list": [23, "x"],
         "remote_alpha": 2.6, "remote_beta": 105, "remote_invbw": 107}))
    result = run_cli("show", path)
    assert result.code == 2 and f"{path}: $.node_betas_list[1]: expected a positive number" in result.err


def test_unrecognised_document(run_cli, tmp_path):
    path = _write(tmp_path / "x.json", '{"hello": 1}')
    result = run_cli("validate", path)
    assert result.code == 2 and f"{path}: $.format: unrecognised file" in result.err


def test_plan_of_unknown_kind_fails_validation(run_cli, tmp_path):
    from dataclasses import replace

    from tests.formats.test_formats import sample_plan
    from mlopt.formats.plan import save_plan

    save_plan(replace(sample_plan(), kind="tuning"), tmp_path / "p.json")
    result = run_cli("validate", tmp_path / "p.json")
    assert result.code == 2 and "$.kind: no validator for plan kind 'tuning'" in result.err


def test_solvers_check_reports_the_embedded_default(run_cli):
    result = run_cli("solvers", "--check", "--json")
    assert result.code == 0
    rows = {r["name"]: r for r in json.loads(result.out)}
    assert set(rows) == {"highs", "cbc", "gurobi"}
    assert rows["highs"]["available"] and rows["highs"]["check"].startswith("ok: knapsack optimum 20")
    if not rows["gurobi"]["available"]:
        assert rows["gurobi"]["note"] and "check" not in rows["gurobi"]


def test_trace_imports_the_example_and_plan_uses_it(run_cli, tmp_path):
    et = "examples/ddp_mlp/rank0.et.json.gz"
    out = tmp_path / "trace.json"
    result = run_cli("trace", REPO / et, "--kineto", REPO / "examples/ddp_mlp/rank0.kineto.json.gz", "-o", out, "--json")
    assert result.code == 0
    summary = json.loads(result.out)
    assert summary["by_role"]["comm"] == 4 and summary["by_role"]["forward"] > 0
    plans = run_cli("plan", "--model", out, "--topology", "fully-connected:2", "-o", tmp_path / "plans", "--json")
    assert plans.code == 0
    index = json.loads(plans.out)
    # the memory plan, DDP's two gradient buckets and its two bucket-rebuild broadcasts as MSCCL-EF XML, and
    # the thread plan (fusion groups and communication threads) and the schedule plan (Syndicate)
    assert sorted(p["file"] for p in index["plans"]) == [
        "collective-allreduce-1028KiB.json", "collective-allreduce-4460800B.json",
        "collective-broadcast-28B.json", "collective-broadcast-8B.json", "memory.plan.json", "schedule.plan.json",
        "threads.plan.json"]
    checked = run_cli("validate", *sorted((tmp_path / "plans").glob("*.json")), "--model", out, "--json")
    assert checked.code == 0 and len(json.loads(checked.out)) == 8


def test_trace_rank_option_overrides(run_cli, tmp_path):
    one = reference("pytorch-trace", "ddp_gloo_mlp_host.1.et.json.gz")
    out = tmp_path / "t.json"
    assert run_cli("trace", one, "--rank", "1", "-o", out).code == 0
    assert json.loads(out.read_text())["rank"] == 1


@pytest.mark.parametrize(
    "content, field",
    [('{"schema": "1.0", "nodes": 5}', "$.nodes"), ('{"hello": 1}', "$.nodes")],
)
def test_trace_of_a_bad_et_exits_2_without_output(run_cli, tmp_path, content, field):
    bad = _write(tmp_path / "bad.et.json", content)
    out = tmp_path / "trace.json"
    result = run_cli("trace", bad, "-o", out)
    assert result.code == 2 and result.err.startswith(f"mlopt: error: {bad}: {field}: ")
    assert not out.exists()


def test_trace_channels_last_and_its_limits(run_cli, tmp_path):
    pytest.importorskip("torch")
    spec = f"{REPO / 'tests/data/models/tiny_models.py'}:build_cnn"
    out = tmp_path / "cl.json"
    result = run_cli("trace", spec, "--channels-last", "--batch", "2", "--input-shape", "3,8,8", "--repeats", "1",
                     "-o", out)
    assert result.code == 0 and json.loads(out.read_text())["source"]["memory_format"] == "channels-last"
    # an Execution Trace has its layout already
    et = REPO / "examples/ddp_mlp/rank0.et.json.gz"
    refused = run_cli("trace", et, "--channels-last", "-o", tmp_path / "et.json")
    assert refused.code == 2 and f"{et}: memory_format: --channels-last applies to model tracing" in refused.err
    assert not (tmp_path / "et.json").exists()
    # its ops would be re-measured on contiguous operands
    profiled = run_cli("profile", "operators", "--model", out, "--device", "cpu", "-o", tmp_path / "p.json")
    assert profiled.code == 2 and "$.source.memory_format: a channels-last trace cannot be profiled yet" in profiled.err
    assert not (tmp_path / "p.json").exists()


def test_trace_of_unknown_model_spec(run_cli, tmp_path):
    result = run_cli("trace", "nosuchpkg_xyz:build", "-o", tmp_path / "t.json")
    assert result.code == 2 and "nosuchpkg_xyz:build: model:" in result.err
    assert not (tmp_path / "t.json").exists()


def test_same_inputs_give_byte_identical_outputs(run_cli, tmp_path):
    et, kineto = REPO / "examples/ddp_mlp/rank0.et.json.gz", REPO / "examples/ddp_mlp/rank0.kineto.json.gz"
    for name in ("a", "b"):
        assert run_cli("trace", et, "--kineto", kineto, "-o", tmp_path / name / "trace.json").code == 0
        assert run_cli("plan", "--model", tmp_path / "a" / "trace.json", "--topology", "dgx2x2",
                       "-o", tmp_path / name / "plans").code == 0
    assert (tmp_path / "a/trace.json").read_bytes() == (tmp_path / "b/trace.json").read_bytes()
    assert (tmp_path / "a/plans/index.json").read_bytes() == (tmp_path / "b/plans/index.json").read_bytes()

"""The planner registry (mlopt/planners/registry.py, issue 25): every kind declared once and every command
going through it, checked on the committed example plans (examples/ci/plans)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mlopt.formats.io import write_json
from mlopt.formats.plan import load_plan
from mlopt.planners import registry
from mlopt.planners.collective.planner import CollectiveOptions
from mlopt.planners.memory.planner import MemoryOptions
from mlopt.planners.options import PlannerOptions
from mlopt.planners.protocol import PlannerKind, StalenessFacts, envelope_metrics, one_file, options_from_dict, \
    options_to_dict
from mlopt.planners.schedule.planner import ScheduleOptions
from mlopt.planners.threads.planner import ThreadsOptions
from mlopt.plan_check import check_plan
from mlopt.sweep.cells import Cell, complete_plan
from mlopt.validate import validate_file

PLANS = Path(__file__).resolve().parents[2] / "examples" / "ci" / "plans"
# kind -> committed plan envelopes of that kind (a collective plan: its sidecar)
COMMITTED = {
    "memory": [PLANS / "ddp_mlp.memory.plan.json", PLANS / "ddp_mlp" / "memory.plan.json"],
    "collective": [PLANS / "allgather-ndv2-1MiB.json", *sorted((PLANS / "ddp_mlp").glob("collective-*.json"))],
    "threads": [PLANS / "ddp_mlp" / "threads.plan.json"],
    "schedule": [PLANS / "cnn.schedule.plan.json", PLANS / "ddp_mlp" / "schedule.plan.json"],
}
# kind -> options unlike the defaults (a new kind adds one here, or test_every_kind_is_registered fails)
OPTIONS = {
    "memory": MemoryOptions("sqrt", budget_ratio=0.5, search_share=0.25),
    "collective": CollectiveOptions("allgather", 1 << 20, algorithm="ring", instances=2, root=1),
    "threads": ThreadsOptions(nodes=4, algorithm="ddp", thread_set=(64, 256), max_groups=3),
    "schedule": ScheduleOptions(algorithm="fifo", iterations=1, max_steps=60, cost_table="costs.csv"),
}


def test_every_kind_is_registered_in_the_umbrella_order():
    assert registry.kind_names() == ("memory", "collective", "threads", "schedule")
    assert set(COMMITTED) == set(OPTIONS) == set(registry.kind_names())
    for kind in registry.planner_kinds():
        assert registry.planner_kind(kind.name) is kind
        assert kind.files(f"g/x{kind.output_suffix}")[-1].endswith(".json")  # the envelope last


def test_an_unknown_kind_is_bad_input_naming_the_file():
    assert registry.find_kind("nope") is None
    with pytest.raises(Exception, match="no planner for plan kind 'nope'.*memory, collective"):
        registry.planner_kind("nope", "p.json")


def test_planner_options_round_trip():
    options = PlannerOptions(solver="cbc", time_limit_s=2.5, node_limit=7, mip_gap=0.01, threads=2, seed=3,
                             dump_model="m.mps", record_wall_time=True)
    data = json.loads(json.dumps(options.to_dict()))
    # the output-only knobs are not provenance: they come back as their defaults
    assert PlannerOptions.from_dict(data) == replace(options, dump_model=None, record_wall_time=False)
    assert PlannerOptions.from_dict(PlannerOptions().to_dict()) == PlannerOptions()
    with pytest.raises(ValueError, match="no option 'collective'"):
        PlannerOptions.from_dict({**data, "collective": "allgather"})


@pytest.mark.parametrize("name", list(OPTIONS))
def test_kind_options_round_trip(name):
    kind = registry.planner_kind(name)
    options = OPTIONS[name]
    assert isinstance(options, kind.options_type)
    data = json.loads(json.dumps(kind.options_to_dict(options)))  # as a spec or a plan holds it
    assert data == options_to_dict(options)
    assert kind.options_from_dict(data) == options
    with pytest.raises(TypeError, match=f"{name} options are"):
        kind.options_to_dict(PlannerOptions())
    with pytest.raises(ValueError, match="no option 'bogus'"):
        options_from_dict(kind.options_type, {**data, "bogus": 1})


def test_options_needing_a_value_say_so():
    with pytest.raises(ValueError, match="needs option 'nodes'"):
        options_from_dict(ThreadsOptions, {"algorithm": "ddp"})


@pytest.mark.parametrize("name", list(COMMITTED))
def test_validate_and_metrics_of_every_committed_plan(name, ddp_example_trace):
    kind = registry.planner_kind(name)
    for path in COMMITTED[name]:
        model = str(ddp_example_trace) if "ddp_mlp" in str(path) else None  # memory plans replay their trace
        result = validate_file(str(path), model_path=model)
        assert result.kind == f"{name} plan" and result.detail
        doc = json.loads(path.read_bytes())
        row = kind.metrics(doc)
        assert row == registry.plan_metrics(name, doc)
        assert row["status"] == doc["provenance"]["status"] and row["algorithm"] == doc["payload"]["algorithm"]


def test_the_plan_index_lists_only_registered_kinds():
    index = json.loads((PLANS / "ddp_mlp" / "index.json").read_bytes())
    listed = {entry["kind"] for entry in index["plans"]}
    assert listed == set(registry.kind_names())
    assert validate_file(str(PLANS / "ddp_mlp" / "index.json")).detail == f"{len(index['plans'])} plan(s)"


def test_files_keep_the_collective_and_threads_rules():
    assert registry.planner_kind("collective").files("g/ag.xml") == ["g/ag.xml", "g/ag.json"]
    assert registry.planner_kind("threads").files("g/t.plan.json") == ["g/t.plan.nccl-tuner.csv", "g/t.plan.json"]
    assert registry.planner_kind("memory").files("g/m.plan.json") == ["g/m.plan.json"]


def test_collective_staleness_facts_read_the_sidecar_and_its_xml(tmp_path):
    facts = registry.planner_kind("collective").staleness
    xml, sidecar = PLANS / "allgather-ndv2-1MiB.xml", PLANS / "allgather-ndv2-1MiB.json"
    assert facts.plan_file(xml) == sidecar
    plan = load_plan(sidecar)
    assert facts.file_checks(sidecar, plan) == [] and facts.rerun_name(sidecar, plan) == xml.name
    (tmp_path / sidecar.name).write_bytes(sidecar.read_bytes())
    (tmp_path / xml.name).write_bytes(xml.read_bytes().replace(b"</algo>", b"</algo>\n"))
    assert "changed after planning" in facts.file_checks(tmp_path / sidecar.name, plan)[0]


# ---------------------------------------------------------------------------------------------------------
# a fifth kind: registered here, handled by validate, the sweep and --check with no edit elsewhere


def _fake_validate(plan, source, model_path, topology_spec) -> str:
    return f"{len(plan.payload['items'])} items checked"


def _fake_metrics(doc):
    return {**envelope_metrics(doc), "algorithm": doc["payload"]["algorithm"], "items": len(doc["payload"]["items"])}


def _fake_recorded(payload):
    return {"algorithm": ("$.payload.algorithm", payload["algorithm"])}


FAKE = PlannerKind(name="fake", options_type=ScheduleOptions, why_not=lambda trace, topology: "never",
                   run=lambda *args: [], output_suffix=".fake.json", files=one_file, file_inputs=("model",),
                   named_inputs=(), validate=_fake_validate, metrics=_fake_metrics,
                   staleness=StalenessFacts(recorded_options=_fake_recorded))


@pytest.fixture
def fake_kind():
    registry.register(FAKE)
    yield FAKE
    registry.unregister("fake")


def _fake_plan(path: Path) -> Path:
    doc = json.loads((PLANS / "ddp_mlp" / "threads.plan.json").read_bytes())  # a real envelope, another kind
    doc["kind"] = "fake"
    doc["provenance"]["inputs"] = {}
    doc["payload"] = {"algorithm": "toy", "items": [1, 2, 3]}
    write_json(path, doc)
    return path


def test_a_fifth_kind_needs_no_edit_elsewhere(fake_kind, tmp_path):
    assert registry.kind_names()[-1] == "fake"
    with pytest.raises(ValueError, match="registered already"):
        registry.register(FAKE)
    plan_path = _fake_plan(tmp_path / "g" / "a.fake.json")
    assert validate_file(str(plan_path)).detail == "3 items checked"
    cell = Cell(0, "g", "fake", (), (), "g/a.fake.json")
    assert cell.files == ["g/a.fake.json"] and cell.stem == "a"
    doc = complete_plan(tmp_path, cell)
    assert registry.plan_metrics("fake", doc)["items"] == 3
    shared = json.loads(plan_path.read_bytes())["provenance"]["options"]
    assert check_plan(plan_path, "fake", {}, shared, {"algorithm": "toy"}).stale == []
    assert check_plan(plan_path, "fake", {}, shared, {"algorithm": "other"}).stale == [
        'options differ: algorithm ($.payload.algorithm): recorded "toy", now "other"']


def test_without_registering_the_fifth_kind_is_unknown(tmp_path):
    plan_path = _fake_plan(tmp_path / "a.fake.json")
    with pytest.raises(Exception, match="no validator for plan kind 'fake'"):
        validate_file(str(plan_path))


# ---------------------------------------------------------------------------------------------------------
# `mlopt plan KIND` without click: a sweep cell calls the kind's plan_files, never mlopt.cli

SWEEP_SPEC = """
grids:
  - planner: memory
    options: {{model: {trace}, algorithm: store-all}}
    grid: {{budget-ratio: [1]}}
  - planner: collective
    options: {{topology: "ring:4", algorithm: ring, size: 16KiB}}
    grid: {{collective: [allgather]}}
  - planner: threads
    options: {{model: {trace}, chunks: 40}}
    grid: {{nodes: [2]}}
  - planner: schedule
    options: {{model: {trace}, topology: "fully-connected:2", max-steps: 20}}
    grid: {{algorithm: [fifo]}}
"""
# every cell of the spec through mlopt.sweep.cells.run_cell, in a fresh interpreter that must not import mlopt.cli
RUN_CELLS = """
import sys
from pathlib import Path
from mlopt.sweep.cells import run_cell
from mlopt.sweep.spec import load_spec
spec, out = sys.argv[1], Path(sys.argv[2])
for cell in load_spec(spec).cells:
    result = run_cell(cell.task(out))
    assert result["code"] == 0, (cell.output, result["message"])
    for name, data in result["files"].items():
        (out / cell.grid).mkdir(parents=True, exist_ok=True)
        (out / cell.grid / name).write_bytes(data)
assert "mlopt.cli" not in sys.modules, "the sweep imported mlopt.cli"
assert "click" not in sys.modules, "the sweep imported click"
"""


def test_a_sweep_cell_equals_the_direct_command_without_the_command_line(ddp_example_trace, run_cli, tmp_path):
    import subprocess
    import sys

    from mlopt.sweep.spec import load_spec

    spec = tmp_path / "every-kind.yaml"
    spec.write_text(SWEEP_SPEC.format(trace=ddp_example_trace))
    cells = load_spec(spec).cells
    assert sorted(c.planner for c in cells) == sorted(registry.kind_names())
    swept = tmp_path / "swept"
    done = subprocess.run([sys.executable, "-c", RUN_CELLS, str(spec), str(swept)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for cell in cells:
        direct = run_cli("-q", *cell.argv(tmp_path / "direct"))
        assert direct.code == 0, direct.err
        for name in cell.files:
            assert (swept / name).read_bytes() == (tmp_path / "direct" / name).read_bytes(), name


def test_plan_files_takes_options_by_flag_name_with_the_cli_defaults(ddp_example_trace, run_cli, tmp_path):
    kind = registry.planner_kind("memory")
    written = kind.plan_files({"model": str(ddp_example_trace), "algorithm": "store-all", "budget-ratio": 1},
                              tmp_path / "a.plan.json")
    assert written.files == [tmp_path / "a.plan.json"] and written.plan.payload["budget_ratio"] == 1.0
    assert run_cli("-q", "plan", "memory", "--model", ddp_example_trace, "--algorithm", "store-all",
                   "--budget-ratio", "1", "-o", tmp_path / "b.plan.json").code == 0
    assert (tmp_path / "a.plan.json").read_bytes() == (tmp_path / "b.plan.json").read_bytes()


@pytest.mark.parametrize("args, field, message", [
    ({"model": "t.json", "budget-ratio": 0.5, "colour": "red"}, "--colour", "no such option"),
    ({"budget-ratio": 0.5}, "--model", "required"),
    ({"model": "t.json"}, "--budget", "exactly one of --budget and --budget-ratio"),
    ({"model": "t.json", "budget-ratio": 0}, "--budget-ratio", "not in the range"),
    ({"model": "t.json", "budget-ratio": "nan"}, "--budget-ratio", "not a finite number"),
    ({"model": "t.json", "budget-ratio": 0.5, "algorithm": "best"}, "--algorithm", "'best' is not one of"),
    ({"model": "t.json", "budget-ratio": 0.5, "threads": True}, "--threads", "expected an integer, found True"),
])
def test_plan_files_refuses_bad_options_as_input_errors(args, field, message, tmp_path):
    from mlopt.errors import InputError

    with pytest.raises(InputError) as refused:
        registry.planner_kind("memory").plan_files(args, tmp_path / "p.json")
    assert refused.value.field == field and message in refused.value.message
    assert not (tmp_path / "p.json").exists()

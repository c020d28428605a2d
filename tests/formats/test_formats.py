"""Reading, canonical writing, versions, traces and the plan envelope."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from mlopt.errors import InputError
from mlopt.formats import document
from mlopt.formats.io import atomic_write_text, canonical_json, read_document, sha256_file
from mlopt.formats.plan import Plan, PlanStatus, Provenance, input_hashes, load_plan, plan_from_dict, save_plan
from mlopt.formats.trace import CommSpec, Implementation, ModelTrace, Op, ProcessGroup, Tensor, load_trace, save_trace


def test_canonical_json_sorts_keys_rounds_floats_and_is_stable():
    a = canonical_json({"b": 0.1 + 0.2, "a": [1, -0.0, 2.5e-7], "c": {"z": 1, "y": True}})
    b = canonical_json({"c": {"y": True, "z": 1}, "a": [1, 0.0, 2.5e-7], "b": 0.3})
    assert a == b
    assert a.index('"a"') < a.index('"b"') < a.index('"c"')
    assert "0.30000000000000004" not in a
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_atomic_write_leaves_no_temp_files_and_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "plan.json"
    atomic_write_text(target, "old")

    class Boom(str):
        def encode(self, *args):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write_text(target, Boom("new"))
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_read_document_accepts_yaml_and_gzip(tmp_path):
    (tmp_path / "t.yaml").write_text("name: x\nvalues: [1, 2]\n")
    assert read_document(tmp_path / "t.yaml") == {"name": "x", "values": [1, 2]}
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(b'{"a": 1}'))
    assert read_document(tmp_path / "t.json.gz") == {"a": 1}


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("bad.json", b'{"a": 1,,}', "malformed JSON at line 1 column 9"),
        ("bad.yaml", b"a: [1, 2\nb: 3\n", "malformed YAML"),
        ("bad.json.gz", b"\x1f\x8b\x08\x00garbage", "corrupt gzip"),
        ("bad.json", b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_malformed_documents(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_document(path)
    assert fragment in info.value.message and info.value.file == str(path)


def test_unreadable_paths(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_document(tmp_path / "missing.json")
    with pytest.raises(InputError, match="is a directory"):
        read_document(tmp_path)


@pytest.mark.parametrize(
    "version, fragment",
    [("2.0", "major version 2 is not supported (this mlopt reads 1.x); upgrade mlopt"), ("1", "MAJOR.MINOR"),
     ("0.9", "regenerate")],
)
def test_unknown_schema_major_is_rejected(version, fragment):
    with pytest.raises(InputError) as info:
        document.check_header({"format": "mlopt.trace", "schema_version": version}, document.TRACE, "t.json")
    assert info.value.field == "$.schema_version" and fragment in info.value.message


def test_newer_minor_version_is_read():
    trace = small_trace().to_dict()
    trace["schema_version"] = "1.7"
    assert ModelTrace.from_dict(trace).name == "tiny"


def test_wrong_format_is_named():
    with pytest.raises(InputError, match="expected 'mlopt.trace', found format 'mlopt.plan'"):
        document.check_header({"format": "mlopt.plan", "schema_version": "1.0"}, document.TRACE, "t.json")


def test_schema_files_are_valid_json_schemas():
    import jsonschema

    for spec in document.ALL_FORMATS:
        jsonschema.Draft202012Validator.check_schema(document.load_schema(spec))


# --- traces -----------------------------------------------------------------------------------------------


def small_trace() -> ModelTrace:
    """x -> linear(w) -> y -> relu -> z; backward of both; SGD update of w; allreduce of dw."""
    tensors = (
        Tensor(0, 4096, "input", (32, 32), "float32"),
        Tensor(1, 1024, "parameter", (16, 16), "float32"),
        Tensor(2, 2048, "activation", (32, 16), "float32"),
        Tensor(3, 2048, "activation", (32, 16), "float32"),
        Tensor(4, 2048, "gradient", (32, 16), "float32"),
        Tensor(5, 1024, "gradient", (16, 16), "float32"),
    )
    ops = (
        Op(0, "aten::linear", "forward", (0, 1), (2,), (Implementation("default", 10.0),)),
        Op(1, "aten::relu", "forward", (2,), (3,), (Implementation("default", 1.0), Implementation("inplace", 1.0))),
        Op(2, "aten::threshold_backward", "backward", (3,), (4,), forward_op=1),
        Op(3, "aten::mm", "backward", (4, 0), (5,), (Implementation("default", 8.0, 512),), forward_op=0),
        Op(4, "c10d::allreduce_", "comm", (5,), (5,), comm=CommSpec("allreduce", 1024, "0")),
        Op(5, "aten::add_", "optimizer", (1, 5), (1,)),
    )
    return ModelTrace("tiny", ops, tensors, (ProcessGroup("0", (0, 1)),), rank=0, world_size=2)


def test_trace_round_trip(tmp_path):
    trace = small_trace()
    save_trace(trace, tmp_path / "t.json")
    again = load_trace(tmp_path / "t.json")
    assert again == trace
    assert again.ops[3].implementations[0].workspace_bytes == 512
    assert again.ops[2].forward_op == 1 and again.ops[4].comm.bytes == 1024


def _read_late_tensor(d):
    """op 0 reads tensor 6, which op 6 (depending on nothing op 0 makes) writes only at the end."""
    d["tensors"].append({"id": 6, "bytes": 8, "kind": "activation"})
    d["ops"].append({"id": 6, "name": "aten::ones", "role": "other", "inputs": [], "outputs": [6]})
    d["ops"][0]["inputs"] = [0, 1, 6]


def _trace_dict(mutate):
    d = small_trace().to_dict()
    mutate(d)
    return d


@pytest.mark.parametrize(
    "mutate, field, fragment",
    [
        (lambda d: d["tensors"][0].update(bytes=-4), "$.tensors[0].bytes", "must be >= 0"),
        (lambda d: d["ops"][0].update(role="sideways"), "$.ops[0].role", "is not one of"),
        (lambda d: d["ops"][0].pop("name"), "$.ops[0].name", "missing required field"),
        (lambda d: d["ops"][0].update(inputs=[0, 99]), "$.ops[0].inputs[1]", "unknown tensor 99"),
        (lambda d: d["ops"][1].update(id=0), "$.ops[1].id", "duplicate op id"),
        (lambda d: d["ops"][2].update(forward_op=42), "$.ops[2].forward_op", "unknown op 42"),
        (lambda d: d["ops"][4].update(comm=None), "$.ops[4].comm", "has no collective"),
        (lambda d: d["ops"][4]["comm"].update(group="7"), "$.ops[4].comm.group", "unknown process group"),
        (lambda d: d["ops"][0].update(inputs=[0, 1, 3]), "$.ops[0].inputs[2]", "cyclic trace: ops"),
        (_read_late_tensor, "$.ops[0].inputs[2]", "uses tensor 6 before it is produced (by op 6)"),
        (lambda d: d["ops"][0].update(compute="fast"), "$.ops[0]", "unknown field"),
        (lambda d: d.update(ops="none"), "$.ops", "expected array"),
    ],
)
def test_bad_traces_name_the_field(mutate, field, fragment):
    with pytest.raises(InputError) as info:
        ModelTrace.from_dict(_trace_dict(mutate), "t.json")
    assert info.value.field == field, info.value
    assert fragment in info.value.message


def test_explicit_dependency_cycle_is_found():
    def mutate(d):
        d["ops"][0]["deps"] = [1]

    with pytest.raises(InputError, match="cyclic trace: ops"):
        ModelTrace.from_dict(_trace_dict(mutate), "t.json")


# --- plans ------------------------------------------------------------------------------------------------


def sample_plan(wall_time_s: float = 1.25) -> Plan:
    prov = Provenance({"model": "ab" * 32}, "highs", "1.15.1", {"seed": 0, "mip_gap": 1e-4})
    payload = {"schedule": {"forward": [], "backward": []}, "budget_bytes": 100, "predicted": {}}  # its schema's minimum
    return Plan("memory", PlanStatus.FEASIBLE, 10.5, 10.0, 0.05 / 1.05, wall_time_s, payload, prov)


def test_plan_envelope_round_trip_and_determinism(tmp_path):
    save_plan(sample_plan(1.25), tmp_path / "a.json")
    save_plan(sample_plan(9.75), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes(), "wall time must not leak"
    plan = load_plan(tmp_path / "a.json")
    assert plan.kind == "memory" and plan.status is PlanStatus.FEASIBLE
    assert plan.provenance["solver"] == {"name": "highs", "version": "1.15.1"}
    assert plan.provenance["best_bound"] == 10.0 and "wall_time_s" not in plan.provenance
    save_plan(sample_plan(), tmp_path / "c.json", record_wall_time=True)
    assert load_plan(tmp_path / "c.json").provenance["wall_time_s"] == 1.25


def test_plan_envelope_errors():
    d = sample_plan().to_dict()
    d["provenance"]["status"] = "maybe"
    with pytest.raises(InputError) as info:
        plan_from_dict(d, "p.json")
    assert info.value.field == "$.provenance.status"
    d = sample_plan().to_dict()
    d["schema_version"] = "3.1"
    with pytest.raises(InputError, match="upgrade mlopt"):
        plan_from_dict(d, "p.json")


def test_input_hashes_hash_files_and_names(tmp_path):
    f = tmp_path / "trace.json"
    f.write_text("{}")
    hashes = input_hashes({"model": str(f), "topology": "ndv2x2", "sketch": None})
    assert hashes["model"] == sha256_file(f) and len(hashes["topology"]) == 64 and "sketch" not in hashes
    assert json.loads(canonical_json(hashes)) == hashes


def test_planner_options_map_to_solve_options():
    from mlopt.planners.options import PlannerOptions

    opts = PlannerOptions(time_limit_s=5.0, mip_gap=0.01, threads=2, seed=7, dump_model="m.mps")
    solve = opts.solve_options("-stage1")
    assert (solve.time_limit_s, solve.mip_gap, solve.threads, solve.seed) == (5.0, 0.01, 2, 7)
    assert solve.dump_model == "m-stage1.mps"
    assert "dump_model" not in opts.to_dict() and opts.to_dict()["seed"] == 7


def test_plan_from_solve_keeps_the_solver_verdict(tmp_path):
    from mlopt.planners.options import PlannerOptions
    from mlopt.planners.result import heuristic_plan, plan_from_solve
    from mlopt.solvers import Model, SolveOptions, get_solver

    model = Model()
    x = [model.add_binary(n) for n in "abc"]
    model.add_le(x, [4, 6, 3], 9)
    model.set_objective(x, [10, 13, 7], sense="max")
    result = get_solver("highs").solve(model, SolveOptions())
    plan = plan_from_solve("demo", result, {"x": list(result.x)}, {"model": "ndv2"}, PlannerOptions(), 0.5)
    assert plan.status is PlanStatus.OPTIMAL and plan.objective == pytest.approx(20) and plan.gap == 0
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json").provenance["solver"]["name"] == "highs"
    base = heuristic_plan("demo", 17.0, {}, {}, PlannerOptions(), 0.1)
    assert base.status is PlanStatus.HEURISTIC and base.best_bound is None and base.gap is None


@pytest.mark.parametrize("text, expected", [("1GiB", 2**30), ("64MiB", 64 * 2**20), ("32KB", 32000), ("4096", 4096),
                                            ("1.5KiB", 1536), ("1e6", 10**6), ("8M", 8 * 2**20)])
def test_parse_size(text, expected):
    from mlopt.formats.sizes import parse_size

    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1MB", "1XB", "0.5", "MB"])
def test_parse_size_rejects(text):
    from mlopt.formats.sizes import parse_size

    with pytest.raises(InputError, match="--size"):
        parse_size(text)


def test_parse_size_range():
    from mlopt.formats.sizes import format_size, parse_size_range

    assert parse_size_range("1KiB..64KiB") == [1024, 4096, 16384, 65536]
    assert parse_size_range("1KiB..8KiB") == [1024, 4096, 8192]
    assert parse_size_range("1KiB,1MiB") == [1024, 2**20]
    assert [format_size(s) for s in (2**30, 1536, 1000)] == ["1GiB", "1536B", "1000B"]


def test_atomic_write_gives_ordinary_permissions(tmp_path):
    target = tmp_path / "plan.json"
    atomic_write_text(target, "x")
    old = os.umask(0o022)
    os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o666 & ~old

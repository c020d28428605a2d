"""`mlopt profile operators`: per-op times and workspaces measured with torch, merged into a trace that the
memory planner plans; the op profile it writes; bad input. Never asserts how fast anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")

TINY = REPO / "tests" / "data" / "models" / "tiny_cnn.py"
# Op types of the tiny CNN the profiler rebuilds (forward and backward).
REBUILT = {"aten::convolution", "aten::native_batch_norm", "aten::relu_", "aten::max_pool2d_with_indices",
           "aten::addmm", "aten::convolution_backward", "aten::native_batch_norm_backward",
           "aten::threshold_backward", "aten::max_pool2d_with_indices_backward"}
CPU_CONV_ALTERNATIVES = {"no-mkldnn", "channels-last"}


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory) -> Path:
    from mlopt.cli import main

    path = tmp_path_factory.mktemp("trace") / "tiny.trace.json"
    code = main(["-q", "trace", f"{TINY}:build", "--batch", "4", "--input-shape", "3,16,16", "--repeats", "1",
                 "-o", str(path)])
    assert code == 0
    return path


@pytest.fixture(scope="module")
def profiled(tiny_trace, tmp_path_factory):
    """(profiled trace, ops profile, --json summary) of one `--quick` run on the CPU."""
    from mlopt.cli import main

    out = tmp_path_factory.mktemp("profiled")
    trace, ops = out / "tiny.profiled.trace.json", out / "ops.json"
    summary = out / "summary.json"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["profile", "operators", "--model", str(tiny_trace), "-o", str(trace), "--ops-out", str(ops),
                     "--quick", "--device", "cpu", "--json"])
    assert code == 0
    summary.write_text(buffer.getvalue())
    return trace, ops, json.loads(buffer.getvalue())


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_every_profiled_op_has_a_median_and_spread(profiled, tiny_trace):
    trace_path, _, summary = profiled
    doc, original = _load(trace_path), _load(tiny_trace)
    meta = doc["source"]["operator_profile"]
    assert meta["device"] == "cpu" and meta["repeats"] == 5 and meta["warmup"] == 1 and meta["quick"] is True
    measured = {op_id: m for m in meta["measurements"] for op_id in m["op_ids"]}
    ops = {op["id"]: op for op in doc["ops"]}
    for op in original["ops"]:  # every op of a rebuilt type was measured, none got lost or reordered
        assert ops[op["id"]]["name"] == op["name"]
        if op["role"] in ("forward", "backward") and op["name"] in REBUILT:
            assert op["id"] in measured, op
    for op_id, m in measured.items():
        default = m["variants"][0]
        assert default["role"] == "default" and default["runs"] == 5
        for v in m["variants"]:
            assert v["median_us"] > 0 and v["iqr_us"] >= 0 and v["q1_us"] <= v["median_us"] <= v["q3_us"]
            assert v["min_us"] <= v["median_us"] <= v["max_us"]
            assert v["workspace_bytes"] is not None and v["workspace_bytes"] >= 0
        impls = ops[op_id]["implementations"]
        assert impls[0]["name"] == "default" and impls[0]["compute_us"] == pytest.approx(default["median_us"])
        assert impls[0]["workspace_bytes"] == default["workspace_bytes"]
    # Convolutions carry the backend's alternatives as further implementations, forward and backward.
    for op in doc["ops"]:
        if op["name"] in ("aten::convolution", "aten::convolution_backward"):
            assert {i["name"] for i in op["implementations"][1:]} == CPU_CONV_ALTERNATIVES
            assert all(i["compute_us"] > 0 for i in op["implementations"])
        elif op["id"] in measured:
            assert len(op["implementations"]) == 1  # checks are recorded, never merged
    # The inferred convolution arguments are said.
    conv = next(m for m in meta["measurements"] if m["op"] == "aten::convolution")
    assert "stride [1, 1], padding [1, 1]" in conv["notes"][0] and "inferred" in conv["notes"][0]
    # Ops kept at their traced time are listed, with their reason.
    assert "aten::detach" in meta["kept_traced"]["op type not rebuilt by this profiler"]
    assert summary["profiled_ops"] == len(measured) and summary["device"] == "cpu"
    rows = {(r["op"], r["phase"]): r for r in summary["rows"]}
    assert rows[("aten::convolution", "forward")]["ops"] == 7
    assert set(rows[("aten::convolution_backward", "backward")]["alternatives"]) == CPU_CONV_ALTERNATIVES
    assert {"relu_mask_time_factor", "bn_rebuild_time_factor"} <= set(summary["catalog_checks"])


def test_catalog_checks_measure_bn_reuse_stats(profiled):
    """The batch-norm recompute from saved statistics is timed against the training forward, per op, and
    checked once per op against the training output."""
    from mlopt.planners.memory import catalog

    trace_path, _, summary = profiled
    check = summary["catalog_checks"]["bn_reuse_stats_time_factor"]
    assert check["measured"] > 0 and check["catalog"] == catalog.BN_REUSE_STATS_TIME_FACTOR
    assert check["matches_training_output"] is True and isinstance(check["bit_identical"], bool)
    assert set(check) >= {"measured", "catalog", "ops", "meaning"}
    meta = _load(trace_path)["source"]["operator_profile"]
    assert meta["catalog_checks"]["bn_reuse_stats_time_factor"] == check
    bn = [m for m in meta["measurements"] if m["op"] == "aten::native_batch_norm"]
    assert check["ops"] == sum(len(m["op_ids"]) for m in bn) > 0
    for m in bn:
        reuse = next(v for v in m["variants"] if v["name"] == catalog.BN_REUSE_STATS)
        assert reuse["role"] == "check" and reuse["median_us"] > 0 and reuse["runs"] == 5
        assert reuse["verified"]["matches_training_output"] is True


def test_profiled_trace_loads_and_memory_plan_validates(run_cli, profiled, tmp_path):
    from mlopt.formats.trace import load_trace

    trace_path, _, _ = profiled
    load_trace(trace_path)  # schema + semantic checks
    assert run_cli("validate", trace_path).code == 0
    plan = tmp_path / "mem.plan.json"
    r = run_cli("plan", "memory", "--model", trace_path, "--budget-ratio", "0.8", "-o", plan, "--json",
                "--time-limit", "5")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["peak_bytes"] <= summary["budget_bytes"]
    v = run_cli("validate", plan, "--model", trace_path)
    assert v.code == 0, v.err
    assert "replayed" in v.err
    # The planner is offered every measured convolution alternative (or drops it as dominated).
    from mlopt.planners.memory.build import build_problem

    problem = build_problem(load_trace(trace_path), None)
    offered = sum(1 for node in problem.nodes for impl in (*node.forward, *node.backward)
                  if impl.name in CPU_CONV_ALTERNATIVES)
    assert offered > 0
    assert offered + problem.metadata["dominated_dropped"] >= 7 * 2 * 2  # 7 convolutions, 2 alternatives, 2 phases


def test_ops_profile_parses_and_plans_the_unprofiled_trace(run_cli, profiled, tiny_trace, tmp_path):
    from mlopt.planners.memory import catalog

    _, ops_path, _ = profiled
    doc = _load(ops_path)
    parsed = catalog.parse_profile(doc, str(ops_path))
    conv = parsed["aten::convolution"]
    assert {p.name for p in conv.forward} == CPU_CONV_ALTERNATIVES == {p.name for p in conv.backward}
    assert all(p.time_factor > 0 and p.workspace_per_output_byte >= 0 for p in conv.forward + conv.backward)
    plan = tmp_path / "mem.plan.json"
    # The time limit keeps the test short whatever the measured factors make of the ILP (a plan with a gap).
    r = run_cli("plan", "memory", "--model", tiny_trace, "--ops", ops_path, "--budget-ratio", "0.9", "-o", plan,
                "--time-limit", "5")
    assert r.code == 0, r.err
    assert run_cli("validate", plan, "--model", tiny_trace).code == 0


def test_repeats_and_no_alternatives(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("-q", "profile", "operators", "--model", tiny_trace, "-o", out, "--repeats", "3", "--warmup", "1",
                "--no-alternatives", "--threads", "1", "--device", "cpu")
    assert r.code == 0, r.err
    doc = _load(out)
    meta = doc["source"]["operator_profile"]
    assert meta["repeats"] == 3 and meta["threads"] == 1 and meta["alternatives"] is False
    assert all(len(op["implementations"]) == 1 for op in doc["ops"])
    assert all(v["runs"] == 3 for m in meta["measurements"] for v in m["variants"])
    assert torch.get_num_threads() >= 1  # the caller's thread setting is put back


def test_human_output_has_a_table(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("profile", "operators", "--model", tiny_trace, "-o", out, "--repeats", "3", "--no-alternatives")
    assert r.code == 0, r.err
    assert "aten::convolution" in r.out and "IQR/median" in r.out
    assert f"wrote {out}" in r.err


def test_bad_trace_path_exits_2(run_cli, tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("profile", "operators", "--model", tmp_path / "missing.json", "-o", out)
    assert r.code == 2
    assert "missing.json" in r.err and "no such file" in r.err and len(r.err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("field", ["shape", "dtype"])
def test_trace_without_shapes_exits_2_naming_the_field(run_cli, tiny_trace, tmp_path, field):
    doc = _load(tiny_trace)
    for t in doc["tensors"]:
        t.pop(field)
    bad = tmp_path / f"no-{field}.trace.json"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "p.json"
    out.write_text("previous")
    r = run_cli("profile", "operators", "--model", bad, "-o", out, "--quick")
    assert r.code == 2
    line = r.err.strip()
    assert len(line.splitlines()) == 1 and str(bad) in line and f"$.tensors[0].{field}" in line
    assert out.read_text() == "previous"  # nothing written on failure


def test_trace_without_profilable_ops_exits_2(run_cli, tmp_path):
    from mlopt.formats.trace import Implementation, ModelTrace, Op, Tensor, save_trace

    trace = ModelTrace("views", ops=(Op(0, "aten::view", "forward", (0,), (), (Implementation("default", 1.0),)),),
                       tensors=(Tensor(0, 64, "input", (4, 4), "float32"),))
    path = tmp_path / "views.trace.json"
    save_trace(trace, path)
    r = run_cli("profile", "operators", "--model", path, "-o", tmp_path / "p.json")
    assert r.code == 2 and "$.ops" in r.err and "aten::view" in r.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is missing")
def test_cuda_requested_without_cuda_exits_2(run_cli, tiny_trace, tmp_path):
    r = run_cli("profile", "operators", "--model", tiny_trace, "-o", tmp_path / "p.json", "--device", "cuda")
    assert r.code == 2 and "--device" in r.err and "CUDA is not available" in r.err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profile(run_cli, tiny_trace, tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("-q", "profile", "operators", "--model", tiny_trace, "-o", out, "--quick", "--device", "cuda")
    assert r.code == 0, r.err
    doc = _load(out)
    meta = doc["source"]["operator_profile"]
    assert meta["device"] == "cuda" and "max_memory_allocated" in meta["workspace"]
    conv = next(op for op in doc["ops"] if op["name"] == "aten::convolution")
    names = {i["name"] for i in conv["implementations"][1:]}
    assert "channels-last" in names
    assert {"cudnn-benchmark", "no-cudnn"} <= names or not torch.backends.cudnn.is_available()
    assert all(v["median_us"] > 0 for m in meta["measurements"] for v in m["variants"])


# ----------------------------------------------------------------------------------------------------
# Argument inference (no measurement)


def test_convolution_stride_and_padding_from_shapes():
    from mlopt.profilers.op_kernels import infer_window

    assert infer_window(224, 112, 7)[0] == (2, 3)  # ResNet's stem
    assert infer_window(56, 28, 1)[0] == (2, 0)  # a 1x1 downsample
    assert infer_window(16, 16, 3)[0] == (1, 1)
    assert infer_window(16, 8, 3)[0] == (2, 1)
    assert infer_window(8, 20, 3) == []  # larger output: no convolution fits (transposed)


def test_rebuilt_ops_match_their_trace_shapes():
    from mlopt.formats.trace import Op, Tensor
    from mlopt.profilers import op_kernels

    x = Tensor(0, 4 * 8 * 16 * 16 * 4, "activation", (4, 8, 16, 16), "float32")
    w = Tensor(1, 16 * 4 * 3 * 3 * 4, "parameter", (16, 4, 3, 3), "float32")  # groups 2
    y = Tensor(2, 4 * 16 * 8 * 8 * 4, "activation", (4, 16, 8, 8), "float32")
    bench = op_kernels.build(op_kernels.OpTensors(Op(0, "aten::convolution", "forward", (0, 1), (2,)), (x, w), (y,)),
                             torch.device("cpu"))
    assert "groups=2" in bench.signature and "stride=[2, 2]" in bench.signature
    assert bench.variants[0].make()().shape == (4, 16, 8, 8)
    # addmm's input is a flattened view ([4, 8, 1, 1] storage) and its weight a transposed one.
    bias = Tensor(3, 16, "parameter", (4,), "float32")
    flat = Tensor(4, 128, "activation", (4, 8, 1, 1), "float32")
    weight = Tensor(5, 128, "parameter", (4, 8), "float32")
    out = Tensor(6, 64, "activation", (4, 4), "float32")
    addmm = Op(1, "aten::addmm", "forward", (3, 4, 5), (6,))
    bench = op_kernels.build(op_kernels.OpTensors(addmm, (bias, flat, weight), (out,)), torch.device("cpu"))
    assert bench.variants[0].make()().shape == (4, 4)
    with pytest.raises(op_kernels.NotRebuilt):
        op_kernels.build(op_kernels.OpTensors(Op(2, "aten::gelu", "forward", (0,), (2,)), (x,), (y,)),
                         torch.device("cpu"))


def test_measured_backward_transients_are_the_calibration_of_the_catalog(profiled):
    """The profiler records each backward kernel's transient bytes (its workspace: peak - retained while it
    runs). Batch norm's is the catalog's input-sized temporary to the byte; oneDNN convolution's is at least
    the catalog's operand copies (on these tiny shapes oneDNN adds scratch memory the constants, fitted on
    ResNet shapes, leave out: hence the profile wins). The problem of the profiled trace charges the measured
    figures."""
    from mlopt.formats.trace import load_trace
    from mlopt.planners.memory.build import build_problem
    from mlopt.planners.memory.catalog import backward_transient_bytes

    trace = load_trace(profiled[0])
    tensors = trace.tensor_map()
    measured: dict[int, int] = {}  # forward op id -> measured transient bytes of its backward
    for op in trace.ops:
        if op.name not in ("aten::native_batch_norm_backward", "aten::convolution_backward"):
            continue
        dy, x = tensors[op.inputs[0]], tensors[op.inputs[1]]
        computes = any(tensors[t].shape == x.shape for t in op.outputs)
        catalog_bytes = backward_transient_bytes(op.name, "cpu", grad_output_bytes=dy.bytes, input_bytes=x.bytes,
                                                 computes_grad_input=computes)
        workspace = op.implementations[0].workspace_bytes
        if op.name == "aten::native_batch_norm_backward":
            assert workspace == catalog_bytes == x.bytes
        else:
            assert workspace >= catalog_bytes > 0
        measured[op.forward_op] = workspace
    assert len(measured) >= 4
    problem = build_problem(trace)
    assert problem.metadata["backward_transients"]["measured_ops"] > 0
    charged = {node.op_id: node.backward[0].workspace_bytes for node in problem.nodes
               if node.op_id in measured and node.backward and node.intermediate_of is None}
    assert charged and all(charged[op_id] >= measured[op_id] for op_id in charged)

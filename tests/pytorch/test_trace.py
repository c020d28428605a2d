"""The PyTorch tracer (mlopt.pytorch.trace) and model spec resolution (mlopt.pytorch.models).

Tiny models live in tests/data/models/tiny_models.py, reached both as a file spec
(`<path>/tiny_models.py:build_mlp`) and, with that folder on sys.path, as a module spec
(`tiny_models:build_mlp`). Exact op counts are those of the pinned torch (pyproject: torch==2.13.0).
"""

from __future__ import annotations

import os
from pathlib import Path
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from mlopt.errors import InputError  # noqa: E402
from mlopt.formats.trace import ModelTrace, validate_trace  # noqa: E402
from mlopt.pytorch.models import resolve_model  # noqa: E402
from mlopt.pytorch.trace import _TensorTable, trace_model, trace_model_spec  # noqa: E402

MODELS_DIR = os.path.join(str(Path(__file__).resolve().parents[1]), "data", "models")
TINY_FILE = os.path.join(MODELS_DIR, "tiny_models.py")
MLP_SPEC = f"{TINY_FILE}:build_mlp"
BATCH = 4  # MLP: 8 -> 16 -> 4, float32


def counts(trace: ModelTrace, role: str) -> Counter:
    return Counter(op.name for op in trace.ops_by_role(role))


def structure(trace: ModelTrace) -> tuple:
    ops = tuple((o.id, o.name, o.role, o.inputs, o.outputs, o.forward_op) for o in trace.ops)
    return ops, trace.tensors


def writer_of(trace: ModelTrace) -> dict[int, int]:
    """First op writing each tensor."""
    writers: dict[int, int] = {}
    for op in trace.ops:
        for t in op.outputs:
            writers.setdefault(t, op.id)
    return writers


# ------------------------------------------------------------------------------------------- tiny MLP


@pytest.fixture(scope="module")
def mlp_trace() -> ModelTrace:
    return trace_model_spec(MLP_SPEC, batch=BATCH, input_shape=(8,), repeats=2)


def test_mlp_forward_ops(mlp_trace):
    # Linear = t (view of the weight) + addmm; cross entropy = _log_softmax + nll_loss_forward;
    # detach: autograd saving the outputs of relu and _log_softmax for backward.
    assert counts(mlp_trace, "forward") == Counter(
        {"aten::t": 2, "aten::addmm": 2, "aten::relu": 1, "aten::detach": 2,
         "aten::_log_softmax": 1, "aten::nll_loss_forward": 1}
    )


def test_mlp_backward_ops(mlp_trace):
    # Linear 2: mm for grad input and grad weight, sum+view for grad bias; linear 1 needs no grad input
    # (the batch does not require grad). detach: unpacking 2 saved outputs + 4 AccumulateGrad handoffs.
    assert counts(mlp_trace, "backward") == Counter(
        {"aten::ones_like": 1, "aten::nll_loss_backward": 1, "aten::_log_softmax_backward_data": 1,
         "aten::threshold_backward": 1, "aten::mm": 3, "aten::sum": 2, "aten::view": 2, "aten::t": 7,
         "aten::detach": 6}
    )


def test_mlp_optimizer_ops(mlp_trace):
    # SGD with momentum, per parameter: buf.mul_(momentum).add_(grad); param.add_(buf, alpha=-lr).
    assert counts(mlp_trace, "optimizer") == Counter({"aten::mul_": 4, "aten::add_": 8})


def test_mlp_tensor_bytes(mlp_trace):
    tensors = mlp_trace.tensors
    by_kind = lambda kind: sorted((t.shape, t.bytes) for t in tensors if t.kind == kind)  # noqa: E731
    assert by_kind("parameter") == [((4,), 16), ((4, 16), 256), ((16,), 64), ((16, 8), 512)]
    assert by_kind("input") == [((4,), 32), ((4, 8), 128)]  # int64 targets, float32 batch
    assert by_kind("optimizer_state") == by_kind("parameter")  # one momentum buffer each
    ops = {op.name: op for op in mlp_trace.ops_by_role("forward")}
    tmap = mlp_trace.tensor_map()
    first_addmm = next(op for op in mlp_trace.ops if op.name == "aten::addmm")
    assert [tmap[t].bytes for t in first_addmm.outputs] == [BATCH * 16 * 4]
    assert [tmap[t].bytes for t in ops["aten::relu"].outputs] == [BATCH * 16 * 4]  # not in place: new bytes
    assert [tmap[t].bytes for t in ops["aten::_log_softmax"].outputs] == [BATCH * 4 * 4]
    assert all(tmap[t].kind == "activation" for op in mlp_trace.ops_by_role("forward") for t in op.outputs)


def test_mlp_pairing(mlp_trace):
    forward = {op.id: op.name for op in mlp_trace.ops_by_role("forward")}
    backward = [op for op in mlp_trace.ops_by_role("backward") if op.forward_op is not None]
    pairs = Counter((op.name, forward[op.forward_op]) for op in backward)
    assert pairs[("aten::threshold_backward", "aten::relu")] == 1
    assert pairs[("aten::mm", "aten::addmm")] == 3
    assert pairs[("aten::_log_softmax_backward_data", "aten::_log_softmax")] == 1
    assert pairs[("aten::nll_loss_backward", "aten::nll_loss_forward")] == 1
    unpaired = Counter(op.name for op in mlp_trace.ops_by_role("backward") if op.forward_op is None)
    assert unpaired == Counter({"aten::ones_like": 1, "aten::detach": 4})  # loss seed, AccumulateGrad


def test_mlp_views_alias_and_writes(mlp_trace):
    for op in mlp_trace.ops:
        if op.name in ("aten::t", "aten::view", "aten::detach"):
            assert op.outputs == (), op  # a view is its base's tensor: no new bytes
    for op in mlp_trace.ops_by_role("optimizer"):
        if op.name == "aten::mul_":
            assert op.inputs == op.outputs  # in place: read and written
    parameters = {t.id for t in mlp_trace.tensors if t.kind == "parameter"}
    updated = {t for op in mlp_trace.ops_by_role("optimizer") for t in op.outputs}
    assert parameters <= updated, "the optimizer updates every parameter in place"
    assert not parameters & {t for op in mlp_trace.ops if op.role != "optimizer" for t in op.outputs}
    assert mlp_trace.source["external_writes_as_reads"] == 0


def test_mlp_trace_is_valid_and_round_trips(mlp_trace):
    validate_trace(mlp_trace)
    again = ModelTrace.from_dict(mlp_trace.to_dict())  # schema + semantic checks
    assert structure(again) == structure(mlp_trace)
    assert mlp_trace.source == {
        "importer": "torch-dispatch", "model": MLP_SPEC, "batch": BATCH, "input_shape": [8],
        "torch": torch.__version__, "optimizer": "sgd", "device": "cpu", "repeats": 2, "warmup": 1, "seed": 0,
        "external_writes_as_reads": 0,
    }
    assert mlp_trace.name == "build_mlp"
    assert [op.id for op in mlp_trace.ops] == list(range(len(mlp_trace.ops)))
    assert [t.id for t in mlp_trace.tensors] == list(range(len(mlp_trace.tensors)))
    assert all(op.compute_us is not None and op.compute_us > 0 for op in mlp_trace.ops)


def test_mlp_deterministic_through_module_spec(mlp_trace, monkeypatch):
    monkeypatch.syspath_prepend(MODELS_DIR)
    again = trace_model_spec("tiny_models:build_mlp", batch=BATCH, input_shape=(8,), repeats=2)
    assert structure(again) == structure(mlp_trace)


def test_adam_and_no_optimizer():
    adam = trace_model_spec(MLP_SPEC, batch=BATCH, input_shape=(8,), optimizer="adam", repeats=1)
    state = [t for t in adam.tensors if t.kind == "optimizer_state"]
    assert len(state) == 3 * 4  # step, exp_avg, exp_avg_sq per parameter
    assert counts(adam, "optimizer")["aten::addcdiv_"] == 4
    none = trace_model_spec(MLP_SPEC, batch=BATCH, input_shape=(8,), optimizer="none", repeats=1)
    assert not none.ops_by_role("optimizer")


def test_first_step_state_needs_warmup():
    # Without warmup the first traced step creates SGD's momentum buffers (clone): a different step.
    with pytest.raises(InputError, match="warmup >= 1") as error:
        trace_model_spec(MLP_SPEC, batch=BATCH, input_shape=(8,), warmup=0, repeats=2)
    assert error.value.field == "model"
    single = trace_model_spec(MLP_SPEC, batch=BATCH, input_shape=(8,), warmup=0, repeats=1)
    assert counts(single, "optimizer")["aten::clone"] == 4
    assert sum(t.kind == "optimizer_state" for t in single.tensors) == 4


def test_unrepeatable_step_is_an_input_error():
    with pytest.raises(InputError, match="traced steps differ") as error:
        trace_model_spec(f"{TINY_FILE}:build_alternating", batch=BATCH, input_shape=(8,), repeats=2)
    assert error.value.field == "model"


def test_trace_model_directly():
    model, _, _ = resolve_model(MLP_SPEC)
    trace = trace_model(model, (8,), 2, optimizer="none", repeats=1)
    assert trace.name == "Sequential"
    assert trace.source["model"] == "torch.nn.modules.container.Sequential"


def test_tensor_table_ids_by_storage():
    table = _TensorTable()
    base = torch.ones(4)
    first = table.id_of(base, "activation")
    assert table.id_of(base.view(2, 2), "activation") == first  # views share their base's id
    del base
    # The freed storage's address may be recycled; the weak reference makes it a new tensor anyway.
    other = torch.ones(4)
    assert table.id_of(other, "activation") != first
    assert [t.bytes for t in table.finish()] == [16, 16]


def test_channels_last_tracing_converts_the_model_and_records_it():
    model, _, _ = resolve_model(f"{TINY_FILE}:build_cnn")
    plain = trace_model_spec(f"{TINY_FILE}:build_cnn", batch=2, input_shape=(3, 8, 8), repeats=1)
    trace = trace_model(model, (3, 8, 8), 2, repeats=1, memory_format="channels-last")
    assert "memory_format" not in plain.source and trace.source["memory_format"] == "channels-last"
    weight = model[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    validate_trace(trace, "cnn")
    # the same compute ops (the layout adds views and restrides around them: flatten is as_strided_ there)
    compute = {"aten::convolution", "aten::native_batch_norm", "aten::relu_", "aten::convolution_backward",
               "aten::native_batch_norm_backward", "aten::threshold_backward"}
    assert [o.name for o in trace.ops if o.name in compute] == [o.name for o in plain.ops if o.name in compute]
    assert len([o for o in trace.ops if o.name in compute]) == 6


@pytest.mark.parametrize("kwargs, message", [({"input_shape": (8,), "memory_format": "channels-last"},
                                              r"channels-last needs \(C, H, W\) inputs"),
                                             ({"input_shape": (3, 8, 8), "memory_format": "nhwc"},
                                              "expected one of contiguous, channels-last")])
def test_bad_memory_formats(kwargs, message):
    spec = f"{TINY_FILE}:build_cnn" if len(kwargs["input_shape"]) == 3 else MLP_SPEC
    with pytest.raises(InputError, match=message) as error:
        trace_model_spec(spec, batch=2, **kwargs)
    assert error.value.field == "memory_format"


# ---------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_for_mlopt:build", "cannot import module 'no_such_module_for_mlopt'"),
        ("tiny_models:no_such_builder", "module 'tiny_models' has no callable 'no_such_builder'"),
        (f"{TINY_FILE}:not_a_module", "'not_a_module' returned a int, not a torch.nn.Module"),
        (f"{TINY_FILE}:broken_builder", "calling 'broken_builder' failed: ValueError"),
        (f"{TINY_FILE}:IN_FEATURES", "'IN_FEATURES' is a int, not a callable"),
        (os.path.join(MODELS_DIR, "missing.py") + ":build", "no such model file"),
        ("just_a_name", "expected 'module:callable'"),
    ],
)
def test_bad_specs(spec, message, monkeypatch):
    monkeypatch.syspath_prepend(MODELS_DIR)
    with pytest.raises(InputError) as error:
        resolve_model(spec)
    assert error.value.file == spec
    assert error.value.field == "model"
    assert message in error.value.message


def test_missing_input_shape():
    with pytest.raises(InputError) as error:
        trace_model_spec(MLP_SPEC, batch=2)
    assert (error.value.file, error.value.field) == (MLP_SPEC, "input_shape")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"optimizer": "lamb"}, "optimizer"), ({"batch": 0}, "batch"), ({"repeats": 0}, "repeats"),
     ({"input_shape": (8, -1)}, "input_shape")],
)
def test_bad_arguments(kwargs, field):
    arguments = {"batch": 2, "input_shape": (8,), **kwargs}
    with pytest.raises(InputError) as error:
        trace_model_spec(MLP_SPEC, **arguments)
    assert error.value.field == field


def test_wrong_input_shape_is_an_input_error():
    with pytest.raises(InputError, match="training step failed on input") as error:
        trace_model_spec(MLP_SPEC, batch=2, input_shape=(5,))
    assert error.value.field == "model"


# ---------------------------------------------------------------------------------------- torchvision


@pytest.fixture(scope="module")
def resnet18_trace(torchvision_module) -> ModelTrace:
    return trace_model_spec("torchvision:resnet18", batch=2, repeats=2)


def test_torchvision_specs(torchvision_module):
    model, shape, _ = resolve_model("torchvision.models:resnet18", num_classes=10)
    assert shape == (3, 224, 224)
    assert model.fc.out_features == 10
    with pytest.raises(InputError) as error:
        resolve_model("torchvision:resnet999")
    assert (error.value.file, error.value.field, error.value.message) == (
        "torchvision:resnet999", "model", "torchvision has no callable 'resnet999'"
    )


def test_resnet18_forward_ops(resnet18_trace):
    forward = counts(resnet18_trace, "forward")
    assert forward["aten::convolution"] == 20  # 17 on the main path + 3 downsample
    assert forward["aten::native_batch_norm"] == 20
    assert forward["aten::addmm"] == 1
    assert forward["aten::max_pool2d_with_indices"] == 1
    assert forward["aten::mean"] == 1  # adaptive_avg_pool2d to 1x1 is a mean over H, W
    assert forward["aten::relu_"] == 17


def test_resnet18_pairing(resnet18_trace):
    ops = {op.id: op for op in resnet18_trace.ops}
    backward_of: dict[int, set[str]] = {}
    for op in resnet18_trace.ops_by_role("backward"):
        if op.forward_op is not None:
            assert ops[op.forward_op].role == "forward" and op.forward_op < op.id
            backward_of.setdefault(op.forward_op, set()).add(op.name)
    expected = {
        "aten::convolution": "aten::convolution_backward",
        "aten::native_batch_norm": "aten::native_batch_norm_backward",
        "aten::relu_": "aten::threshold_backward",
        "aten::addmm": "aten::mm",
        "aten::max_pool2d_with_indices": "aten::max_pool2d_with_indices_backward",
        "aten::_log_softmax": "aten::_log_softmax_backward_data",
    }
    for op in resnet18_trace.ops_by_role("forward"):
        if op.name in expected:
            assert expected[op.name] in backward_of.get(op.id, set()), op
    assert counts(resnet18_trace, "backward")["aten::convolution_backward"] == 20


def test_resnet18_tensors(resnet18_trace):
    tensors = resnet18_trace.tensors
    assert sum(t.bytes for t in tensors if t.kind == "parameter") == 11_689_512 * 4
    inputs = sorted((t.dtype, t.bytes) for t in tensors if t.kind == "input")
    assert inputs == [("float32", 2 * 3 * 224 * 224 * 4), ("int64", 2 * 8)]
    assert sum(t.kind == "buffer" for t in tensors) == 20 * 3  # running mean, var, batches tracked
    # Forward activations and backward ops all present: whatever backward reads that forward made was
    # written by a forward op before it.
    validate_trace(resnet18_trace)
    writers = writer_of(resnet18_trace)
    kinds = resnet18_trace.tensor_map()
    for op in resnet18_trace.ops_by_role("backward"):
        for t in op.inputs:
            if kinds[t].kind == "activation":
                assert resnet18_trace.ops[writers[t]].role == "forward"


def test_resnet18_in_place_and_roles(resnet18_trace):
    for op in resnet18_trace.ops_by_role("forward"):
        if op.name == "aten::relu_":
            assert op.inputs == op.outputs and len(op.inputs) == 1
    roles = [op.role for op in resnet18_trace.ops]
    assert roles == sorted(roles, key=("forward", "backward", "optimizer").index)
    kinds = resnet18_trace.tensor_map()
    running_stats = {t for op in resnet18_trace.ops_by_role("forward") if op.name == "aten::native_batch_norm"
                     for t in op.outputs if kinds[t].kind == "buffer"}
    assert len(running_stats) == 40  # native_batch_norm updates them, though its schema does not say so


def test_resnet18_optimizer_and_times(resnet18_trace):
    parameters = {t.id for t in resnet18_trace.tensors if t.kind == "parameter"}
    updated = {t for op in resnet18_trace.ops_by_role("optimizer") for t in op.outputs}
    assert parameters <= updated, "SGD updates every parameter in place"
    working = ("aten::convolution", "aten::native_batch_norm", "aten::addmm", "aten::convolution_backward",
               "aten::native_batch_norm_backward", "aten::mm", "aten::add_")
    for op in resnet18_trace.ops:
        if op.name in working:
            assert op.compute_us is not None and op.compute_us > 0
            assert op.implementations[0].name == "default"

"""PyTorch Execution Trace + Kineto importer: real torch 2.15 traces (shared/reference), torch 2.13 DDP recordings
made with a profiler schedule (tests/data/pytorch-trace), and hand-made GPU and nested-backward ones."""

from __future__ import annotations

import copy
import gzip
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlopt.errors import InputError
from mlopt.formats.importers.kineto import read_kineto, read_kineto_durations
from mlopt.formats.importers.pytorch_et import PG_INIT, _trace_device, _TRef, import_pytorch_et
from mlopt.formats.importers.pytorch_et import PROCESS_NODE as PROCESS
from mlopt.formats.importers.pytorch_et import THREAD_NODE as THREAD
from mlopt.formats.io import sha256_file
from mlopt.formats.trace import ModelTrace, load_trace, save_trace

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "pytorch-trace"
DATA = Path(__file__).resolve().parents[2] / "data" / "pytorch-trace"
HANDMADE_ET = DATA / "handmade_gpu_nccl_et.json"
HANDMADE_KINETO = DATA / "handmade_gpu_nccl_kineto.json"


def shared(name: str) -> Path:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"reference trace not available (needs shared/ beside the checkout): {path}")
    return path


@pytest.fixture(scope="module")
def resnet():
    return import_pytorch_et(shared("resnet18_b2_cpu_et.json.gz"))


@pytest.fixture(scope="module")
def resnet_kineto():
    return import_pytorch_et(shared("resnet18_b2_et_with_profiler.json.gz"), shared("resnet18_b2_kineto.json.gz"))


@pytest.fixture(scope="module")
def ddp():
    return [
        import_pytorch_et(shared(f"ddp_gloo_mlp_host.{r}.et.json.gz"), shared(f"ddp_gloo_mlp_kineto.{r}.json.gz"))
        for r in (0, 1)
    ]


def by_id(trace: ModelTrace):
    return {op.id: op for op in trace.ops}


def writers_of(trace: ModelTrace):
    out: dict[int, list[int]] = {}
    for i, op in enumerate(trace.ops):
        for t in op.outputs:
            out.setdefault(t, []).append(i)
    return out


# --------------------------------------------------------------------------------------------------------
# resnet18, batch 2, one SGD step under `## train_step ##`


def test_resnet18_forward_ops(resnet):
    fwd = Counter(op.name for op in resnet.ops_by_role("forward"))
    assert fwd["aten::conv2d"] == 20  # 17 in the main path (stem + 16 in the blocks) + 3 downsample 1x1
    assert fwd["aten::batch_norm"] == 20
    assert fwd["aten::relu_"] == 17
    assert fwd["aten::add_"] == 28  # 20 num_batches_tracked += 1, 8 residual additions
    assert fwd["aten::linear"] == 1 and fwd["aten::cross_entropy_loss"] == 1
    assert sum(fwd.values()) == 90
    # the gradient seed between loss and backward is not forward work
    assert [op.name for op in resnet.ops_by_role("other")] == ["aten::ones_like"]
    assert resnet.source["step_scope"] == "## train_step ##"


def test_resnet18_execution_order_by_node_id(resnet):
    ids = [op.id for op in resnet.ops]
    assert ids == sorted(ids)
    roles = [op.role for op in resnet.ops]
    first_bwd, last_bwd = roles.index("backward"), len(roles) - 1 - roles[::-1].index("backward")
    assert "backward" not in roles[:first_bwd] and "forward" not in roles[first_bwd:]
    assert all(r == "optimizer" for r in roles[last_bwd + 1 :])
    assert resnet.ops[0].name == "aten::conv2d"


def test_resnet18_backward_pairs_with_forward(resnet):
    ops = by_id(resnet)
    bwd = resnet.ops_by_role("backward")
    assert len(bwd) == 134
    assert all(op.name.startswith("autograd::engine::evaluate_function: ") for op in bwd)
    conv_bwd = [op for op in bwd if op.name.endswith("ConvolutionBackward0")]
    assert len(conv_bwd) == 20
    paired = {op.forward_op for op in conv_bwd}
    assert {ops[f].name for f in paired} == {"aten::conv2d"}
    assert paired == {op.id for op in resnet.ops_by_role("forward") if op.name == "aten::conv2d"}
    bn_bwd = [op for op in bwd if op.name.endswith("NativeBatchNormBackward0")]
    # batch_norm shares its seq_id with the num_batches_tracked add_ before it: the pairing must pick batch_norm
    assert len(bn_bwd) == 20 and {ops[op.forward_op].name for op in bn_bwd} == {"aten::batch_norm"}
    # every backward op except the 62 AccumulateGrad (which have no forward node) is paired
    unpaired = Counter(op.name.split(": ")[-1] for op in bwd if op.forward_op is None)
    assert unpaired == {"torch::autograd::AccumulateGrad": 62}
    # the backward of a conv reads something its forward conv read (its input or its weight)
    for op in conv_bwd:
        assert set(op.inputs) & set(ops[op.forward_op].inputs)


def test_resnet18_tensors(resnet):
    tensors = resnet.tensor_map()
    conv1 = resnet.ops[0]
    x = tensors[conv1.inputs[0]]
    assert x.kind == "input" and x.bytes == 2 * 3 * 224 * 224 * 4 and x.shape == (2, 3, 224, 224)
    assert x.dtype == "float32"
    inputs = [t for t in resnet.tensors if t.kind == "input"]
    assert sorted(t.bytes for t in inputs) == [2 * 8, 2 * 3 * 224 * 224 * 4]  # labels (int64) and images
    params = [t for t in resnet.tensors if t.kind == "parameter"]
    # torchvision resnet18: 11,689,512 parameters in 62 tensors; the trace gives exactly that in float32
    assert len(params) == 62
    assert sum(t.bytes for t in params) == 11_689_512 * 4 == 46_758_048
    # BN buffers are not parameters: running_mean + running_var over 4,800 channels, 20 num_batches_tracked
    buffers = [t for t in resnet.tensors if t.kind == "buffer"]
    assert len(buffers) == 60
    assert sum(t.bytes for t in buffers) == 4800 * 2 * 4 + 20 * 8
    assert sum(1 for t in buffers if t.dtype == "int64") == 20
    # conv weights: the stem is 64x3x7x7
    assert tensors[conv1.inputs[1]].kind == "parameter" and tensors[conv1.inputs[1]].shape == (64, 3, 7, 7)


def test_resnet18_optimizer_updates_every_parameter_with_its_gradient(resnet):
    tensors = resnet.tensor_map()
    opt = resnet.ops_by_role("optimizer")
    assert Counter(op.name for op in opt) == {"aten::add_": 62, "Optimizer.zero_grad#SGD.zero_grad": 1}
    writers = writers_of(resnet)
    index = {op.id: i for i, op in enumerate(resnet.ops)}
    updated = set()
    for op in opt:
        if op.name != "aten::add_":
            continue
        param, grad = (tensors[t] for t in op.inputs)
        assert param.kind == "parameter" and grad.kind == "gradient" and param.bytes == grad.bytes
        assert op.outputs == (param.id,), "SGD's add_ updates the parameter in place"
        # the gradient comes from a backward op that ran before the update
        assert [resnet.ops[w].role for w in writers[grad.id]] and all(
            resnet.ops[w].role == "backward" and w < index[op.id] for w in writers[grad.id]
        )
        updated.add(param.id)
    assert updated == {t.id for t in resnet.tensors if t.kind == "parameter"}


def test_resnet18_activations_flow_from_forward_to_backward(resnet):
    tensors = resnet.tensor_map()
    writers = writers_of(resnet)
    saved = {t for op in resnet.ops_by_role("backward") for t in op.inputs if tensors[t].kind == "activation"}
    assert len(saved) > 40
    assert all(resnet.ops[writers[t][0]].role == "forward" for t in saved)


def test_resnet18_provenance_and_round_trip(resnet):
    path = shared("resnet18_b2_cpu_et.json.gz")
    assert resnet.source == {
        "importer": "pytorch-et",
        "schema": "1.1.1-chakra.0.0.4",
        "inputs": {path.name: sha256_file(path)},
        "step_scope": "## train_step ##",
        "device": "cpu",  # from the tensor values: the memory planner then charges the CPU catalog constants
    }
    assert resnet.name == "resnet18_b2_cpu_et"
    assert all(op.compute_us is None for op in resnet.ops)  # no Kineto: not measured
    assert (resnet.rank, resnet.world_size, resnet.process_groups) == (0, 1, ())
    again = ModelTrace.from_dict(json.loads(json.dumps(resnet.to_dict())), "round-trip")
    assert again == resnet


# --------------------------------------------------------------------------------------------------------
# resnet18 with Kineto (the ET has no step scope and no optimizer step)


def test_resnet18_kineto_fills_compute_times(resnet_kineto):
    trace = resnet_kineto
    assert trace.source["step_scope"] == "[pytorch|profiler|execution_trace|thread]"
    assert len(trace.ops) == 225
    assert all(op.compute_us is not None and op.compute_us > 0 for op in trace.ops)
    durations = read_kineto_durations(shared("resnet18_b2_kineto.json.gz"))
    assert trace.ops[0].name == "aten::conv2d" and trace.ops[0].compute_us == durations[1] == pytest.approx(6826.761)
    # the ops are disjoint parts of one profiled step: they fit in the profiler span (850 ms)
    assert sum(op.compute_us for op in trace.ops) < 850_001.47
    # without an optimizer step, parameters are still recognised (weight/bias arguments of forward ops)
    params = [t for t in trace.tensors if t.kind == "parameter"]
    assert len(params) == 62 and sum(t.bytes for t in params) == 46_758_048
    assert not trace.ops_by_role("optimizer")
    assert Counter(op.role for op in trace.ops) == {"forward": 90, "backward": 134, "other": 1}
    assert len(trace.source["inputs"]) == 2


def test_kineto_from_another_run_is_refused():
    with pytest.raises(InputError) as err:
        import_pytorch_et(shared("resnet18_b2_cpu_et.json.gz"), shared("resnet18_b2_kineto.json.gz"))
    assert err.value.file.endswith("resnet18_b2_kineto.json.gz")
    assert err.value.field == "$.traceEvents" and "does not match" in err.value.message


def test_read_kineto_durations():
    durations = read_kineto_durations(shared("resnet18_b2_kineto.json.gz"))
    assert len(durations) == 1216 and min(durations) == 1 and all(d > 0 for d in durations.values())
    info = read_kineto(shared("ddp_gloo_mlp_kineto.1.json.gz"))
    assert (info.rank, info.world_size) == (1, 2)


# --------------------------------------------------------------------------------------------------------
# 2-rank DDP (gloo, bucket_cap_mb=1) of a 3-layer MLP


def ddp_buckets(param_bytes_in_forward_order: list[int], cap_bytes: int) -> list[int]:
    """DDP's bucket assignment: parameters in reverse order, a bucket closes once it reaches the cap."""
    buckets, size = [], 0
    for nbytes in reversed(param_bytes_in_forward_order):
        size += nbytes
        if size >= cap_bytes:
            buckets.append(size)
            size = 0
    if size:
        buckets.append(size)
    return buckets


def test_ddp_allreduce_buckets(ddp):
    for rank, trace in enumerate(ddp):
        tensors = trace.tensor_map()
        params, seen = [], set()
        for op in trace.ops_by_role("forward"):
            for t in op.inputs:
                if tensors[t].kind == "parameter" and t not in seen:
                    seen.add(t)
                    params.append(tensors[t])
        assert [p.shape for p in params] == [(1024, 256), (1024,), (1024, 1024), (1024,), (64, 1024), (64,)]
        assert all(p.bytes == 4 * _prod(p.shape) for p in params)
        expected = ddp_buckets([p.bytes for p in params], cap_bytes=1 * 1024 * 1024)
        assert expected == [4_460_800, 1_052_672]
        allreduces = [op for op in trace.ops if op.comm and op.comm.collective == "allreduce"]
        assert [op.name for op in allreduces] == ["c10d::allreduce_", "c10d::allreduce_"]
        assert [op.comm.bytes for op in allreduces] == expected
        assert {op.comm.group for op in allreduces} == {"0"}
        assert all(op.role == "comm" for op in allreduces)
        # the rebuilt-bucket bookkeeping before forward: two small int broadcasts
        assert [(op.comm.collective, op.comm.bytes) for op in trace.ops_by_role("comm")][:2] == [
            ("broadcast", 28), ("broadcast", 8)
        ]
        assert (trace.rank, trace.world_size) == (rank, 2)


def test_ddp_allreduce_sits_between_gradients_and_their_use(ddp):
    trace = ddp[0]
    tensors = trace.tensor_map()
    writers = writers_of(trace)
    for i, op in enumerate(trace.ops):
        if not op.comm or op.comm.collective != "allreduce":
            continue
        (bucket,) = op.inputs
        assert op.outputs == (bucket,) and tensors[bucket].kind == "gradient"
        assert tensors[bucket].bytes == op.comm.bytes
        before = [trace.ops[w] for w in writers[bucket] if w < i]
        # DDP rebuilt its buckets in this (first) step: an aten::empty in forward makes the bucket, then the
        # AccumulateGrad hooks copy gradients into it
        assert (before[0].name, before[0].role) == ("aten::empty", "forward")
        assert {w.name for w in before[1:]} == {"autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"}
        after = [j for j, other in enumerate(trace.ops) if j > i and bucket in other.inputs]
        assert {trace.ops[j].name for j in after} >= {"torch.distributed.ddp.reducer::copy_bucket_to_grad"}


def test_ddp_backward_is_not_swallowed_by_misnested_nodes(ddp):
    # In the ET every evaluate_function after the first allreduce is a child of the AccumulateGrad that
    # launched it; they must still be separate backward ops, paired with their forward ops.
    trace = ddp[0]
    ops = by_id(trace)
    bwd = [op.name.split(": ")[-1] for op in trace.ops_by_role("backward") if op.name.startswith("autograd::")]
    assert Counter(bwd) == {
        "MseLossBackward0": 1, "AddmmBackward0": 3, "ReluBackward0": 2, "TBackward0": 3,
        "torch::autograd::AccumulateGrad": 6,
    }
    # ReluBackward0 reads relu's saved output: autograd unpacks it as a new TensorImpl on the same storage,
    # which must still be the tensor aten::relu wrote (not a second, external copy)
    for op in trace.ops:
        if op.name.endswith("ReluBackward0"):
            assert ops[op.forward_op].name == "aten::relu"
            assert set(ops[op.forward_op].outputs) <= set(op.inputs)
    assert not [t for t in trace.tensors if t.kind == "input" and t.bytes == 32 * 1024 * 4]
    addmm = [op for op in trace.ops if op.name.endswith("AddmmBackward0")]
    assert [ops[op.forward_op].name for op in addmm] == ["aten::linear"] * 3
    assert len({op.forward_op for op in addmm}) == 3
    # DDP's finalize (copy_bucket_to_grad) belongs to backward, the 6 SGD updates to the optimizer
    finalize = Counter(op.name for op in trace.ops_by_role("backward") if not op.name.startswith("autograd::"))
    assert finalize == {"torch.distributed.ddp.reducer::copy_bucket_to_grad": 6, "aten::as_strided": 6}
    assert sum(op.name == "aten::add_" for op in trace.ops_by_role("optimizer")) == 6
    # the AccumulateGrad that launched the first allreduce does not also count the allreduce's time
    launcher = next(op for op in trace.ops if op.id == 279)
    assert launcher.compute_us == pytest.approx(5448.75 - 4968.845)


def test_ddp_process_groups_and_ranks(ddp):
    rank0, rank1 = ddp
    for trace in ddp:
        assert [(g.name, g.ranks) for g in trace.process_groups] == [("0", (0, 1))]
        assert trace.source["step_scope"] == "ProfilerStep#1"
    assert (rank0.rank, rank1.rank) == (0, 1)
    assert [op.name for op in rank0.ops] == [op.name for op in rank1.ops]
    assert [op.comm for op in rank0.ops] == [op.comm for op in rank1.ops]
    assert [op.compute_us for op in rank0.ops] != [op.compute_us for op in rank1.ops]
    # the ET alone says nothing about the rank: 0 unless given
    alone = import_pytorch_et(shared("ddp_gloo_mlp_host.1.et.json.gz"))
    assert alone.rank == 0 and alone.world_size == 2
    assert import_pytorch_et(shared("ddp_gloo_mlp_host.1.et.json.gz"), rank=1).rank == 1


# --------------------------------------------------------------------------------------------------------
# Hand-made GPU/NCCL trace: record_param_comms, backward on the autograd thread, device kernel times


@pytest.fixture(scope="module")
def gpu():
    return import_pytorch_et(HANDMADE_ET, HANDMADE_KINETO)


def test_handmade_ops_roles_and_pairing(gpu):
    assert [(op.id, op.role) for op in gpu.ops] == [
        (5, "forward"), (7, "comm"), (10, "forward"), (11, "forward"), (12, "other"),
        (14, "backward"), (17, "backward"), (20, "backward"), (23, "backward"), (26, "comm"), (28, "optimizer"),
    ]
    # nodes 30 (main thread) and 31 (autograd thread) ran after the step scope: not part of the step
    assert {30, 31}.isdisjoint(op.id for op in gpu.ops)
    pairs = {op.id: op.forward_op for op in gpu.ops_by_role("backward")}
    assert pairs == {14: 11, 17: 10, 20: 5, 23: None}


def test_handmade_record_param_comms(gpu):
    ops = by_id(gpu)
    # c10d::allreduce_ wrapping record_param_comms: 2048 bf16 elements on the tensor-parallel group "1"
    assert ops[7].comm.collective == "allreduce" and ops[7].comm.bytes == 2048 * 2 and ops[7].comm.group == "1"
    # a bare record_param_comms on the autograd thread: the weight gradient on the default group
    assert ops[26].comm.collective == "allreduce" and ops[26].comm.bytes == 16384 * 2 and ops[26].comm.group == "0"
    # the update reads the gradient the allreduce wrote
    grad = ops[26].outputs[0]
    assert ops[26].inputs == (grad,) and grad in ops[28].inputs
    assert [(g.name, g.ranks) for g in gpu.process_groups] == [("0", (0, 1, 2, 3)), ("1", (0, 1))]
    assert (gpu.rank, gpu.world_size) == (1, 4)


def test_handmade_tensors(gpu):
    tensors = gpu.tensor_map()
    x, w = (tensors[t] for t in gpu.ops[0].inputs)
    assert (x.kind, x.bytes, x.shape, x.dtype) == ("input", 4096, (16, 128), "bfloat16")
    assert (w.kind, w.bytes, w.shape) == ("parameter", 32768, (128, 128))
    kinds = Counter(t.kind for t in gpu.tensors)
    assert kinds == {"input": 1, "parameter": 1, "activation": 3, "gradient": 2, "other": 1}
    # the `.grad` made by AccumulateGrad's detach is the same tensor as MmBackward's output (a view, no copy)
    ops = by_id(gpu)
    assert ops[20].outputs == ops[23].inputs == ops[26].inputs
    # the tensors' device names the trace's: the memory planner then counts the caching allocator's blocks
    assert gpu.source["device"] == "cuda:0"


def test_handmade_device_time_from_kernels(gpu):
    us = {op.id: op.compute_us for op in gpu.ops}
    # kernels (External id) win over host durations; ops without kernels fall back to the host op
    assert us == {5: 50.0, 7: 30.0, 10: 3.0, 11: 2.0, 12: 1.0, 14: 5.0 + 9, 17: 5.0, 20: 60.0, 23: 5.0 + 18,
                  26: 120.0, 28: 7.0}


def test_handmade_without_kineto_and_node_order_independence(tmp_path, gpu):
    doc = json.loads(HANDMADE_ET.read_text())
    doc["nodes"].reverse()  # parents first: the importer orders by node id, not by file position
    path = tmp_path / "reversed.et.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    trace = import_pytorch_et(path)
    assert [op.id for op in trace.ops] == [op.id for op in gpu.ops]
    assert [(op.inputs, op.outputs, op.forward_op, op.comm) for op in trace.ops] == [
        (op.inputs, op.outputs, op.forward_op, op.comm) for op in gpu.ops
    ]
    assert all(op.compute_us is None for op in trace.ops) and trace.rank == 0 and trace.world_size == 4
    assert trace.name == "reversed"


def test_step_scope_choice(gpu):
    assert import_pytorch_et(HANDMADE_ET, step_scope="train_step").ops == import_pytorch_et(HANDMADE_ET).ops
    with pytest.raises(InputError) as err:
        import_pytorch_et(HANDMADE_ET, step_scope="## eval_step ##")
    assert err.value.field == "$.nodes" and "train_step" in err.value.message


# --------------------------------------------------------------------------------------------------------
# Bad input: one InputError naming the file and the JSON path


def write_json(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_not_an_execution_trace(tmp_path):
    path = write_json(tmp_path / "kineto.json", {"traceEvents": []})
    with pytest.raises(InputError) as err:
        import_pytorch_et(path)
    assert err.value.file == str(path) and err.value.field == "$.nodes"


def test_malformed_tensor_values(tmp_path):
    doc = json.loads(HANDMADE_ET.read_text())
    index = next(i for i, n in enumerate(doc["nodes"]) if n["id"] == 5)  # aten::linear(x, w, None)
    bad = copy.deepcopy(doc)
    bad["nodes"][index]["inputs"]["values"][1] = [102, 103, 0]
    path = write_json(tmp_path / "bad.et.json", bad)
    with pytest.raises(InputError) as err:
        import_pytorch_et(path)
    assert (err.value.file, err.value.field) == (str(path), f"$.nodes[{index}].inputs.values[1]")
    assert "malformed tensor value" in err.value.message
    # inside a GenericList[Tensor]: the path goes down into the list
    index = next(i for i, n in enumerate(doc["nodes"]) if n["id"] == 7)  # c10d::allreduce_([y], ...)
    bad = copy.deepcopy(doc)
    bad["nodes"][index]["outputs"]["values"][0][0] = "oops"
    path = write_json(tmp_path / "bad2.et.json", bad)
    with pytest.raises(InputError) as err:
        import_pytorch_et(path)
    assert err.value.field == f"$.nodes[{index}].outputs.values[0][0]"


def test_node_without_name_or_id(tmp_path):
    doc = json.loads(HANDMADE_ET.read_text())
    del doc["nodes"][4]["name"]
    path = write_json(tmp_path / "noname.et.json", doc)
    with pytest.raises(InputError) as err:
        import_pytorch_et(path)
    assert (err.value.file, err.value.field) == (str(path), "$.nodes[4].name")
    doc = json.loads(HANDMADE_ET.read_text())
    doc["nodes"][2]["id"] = "7"
    with pytest.raises(InputError) as err:
        import_pytorch_et(write_json(tmp_path / "noid.et.json", doc))
    assert err.value.field == "$.nodes[2].id"


def test_truncated_gzip(tmp_path):
    data = gzip.compress(HANDMADE_ET.read_bytes())
    path = tmp_path / "cut.et.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as err:
        import_pytorch_et(path)
    assert (err.value.file, err.value.field) == (str(path), "$") and "gzip" in err.value.message


def test_bad_kineto_file(tmp_path):
    not_kineto = write_json(tmp_path / "k.json", {"nodes": []})
    with pytest.raises(InputError) as err:
        import_pytorch_et(HANDMADE_ET, not_kineto)
    assert (err.value.file, err.value.field) == (str(not_kineto), "$.traceEvents")
    doc = json.loads(HANDMADE_KINETO.read_text())
    doc["traceEvents"][3]["dur"] = "long"
    with pytest.raises(InputError) as err:
        import_pytorch_et(HANDMADE_ET, write_json(tmp_path / "k2.json", doc))
    assert err.value.field == "$.traceEvents[3]"


def test_bad_process_group_description(tmp_path):
    doc = json.loads(HANDMADE_ET.read_text())
    index = next(i for i, n in enumerate(doc["nodes"]) if n["name"] == "## process_group:init ##")
    doc["nodes"][index]["inputs"]["values"][0] = "[{not json"
    with pytest.raises(InputError) as err:
        import_pytorch_et(write_json(tmp_path / "pg.et.json", doc))
    assert err.value.field == f"$.nodes[{index}].inputs.values[0]"


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# --------------------------------------------------------------------------------------------------------
# Recordings made here (tests/data/pytorch-trace/record.py, torch 2.13, CPU): 2-rank gloo DDP, one step
# recorded with torch.profiler.schedule(wait=1, warmup=1, active=1). The buckets exist before the recorded
# step, and the gloo markers, later evaluate_functions and DDP's finalize nest inside whatever record the
# asynchronous allreduce left open.

RECORDED = ("mlp", "cnn")
BUCKET_FILL = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
COPY_BUCKET = "torch.distributed.ddp.reducer::copy_bucket_to_grad"


def recorded_job(model: str) -> dict:
    return json.loads((DATA / f"ddp_gloo_{model}.job.json").read_text())


@pytest.fixture(scope="module", params=RECORDED)
def recorded(request):
    model = request.param
    ranks = [
        import_pytorch_et(DATA / f"ddp_gloo_{model}.{r}.et.json.gz", DATA / f"ddp_gloo_{model}.{r}.kineto.json.gz")
        for r in (0, 1)
    ]
    return model, ranks


def test_recorded_fixtures_are_small():
    for model in RECORDED:
        for path in DATA.glob(f"ddp_gloo_{model}.*.json.gz"):
            assert path.stat().st_size < 300_000, path


def test_recorded_step_imports_and_is_valid(recorded, tmp_path):
    model, ranks = recorded
    for rank, trace in enumerate(ranks):
        assert (trace.rank, trace.world_size) == (rank, 2)
        assert trace.source["step_scope"] == "ProfilerStep#2"  # the schedule's one active step
        assert [(g.name, g.ranks) for g in trace.process_groups] == [("0", (0, 1))]
        assert all(op.compute_us is not None for op in trace.ops)
        roles = Counter(op.role for op in trace.ops)
        assert roles["forward"] and roles["backward"] and roles["optimizer"]
        path = tmp_path / f"{model}.{rank}.json"
        save_trace(trace, path)
        again = load_trace(path)  # validates again (the file rounds compute times)
        assert [(op.id, op.role, op.inputs, op.outputs, op.comm) for op in again.ops] == [
            (op.id, op.role, op.inputs, op.outputs, op.comm) for op in trace.ops
        ]


def test_recorded_allreduces_are_what_ddp_issued(recorded):
    model, ranks = recorded
    job = recorded_job(model)
    assert len(job["allreduce_bytes"]) >= 2  # several buckets: later ones launch from nested records
    assert sum(job["allreduce_bytes"]) == job["total_parameter_size_bytes"]
    for trace in ranks:
        comms = [op.comm for op in trace.ops_by_role("comm")]
        # the constructor's broadcast ran before the profiler started: only the step's allreduces
        assert not job["initial_broadcast_recorded"]
        assert [(c.collective, c.bytes, c.group) for c in comms] == [
            ("allreduce", b, "0") for b in job["allreduce_bytes"]
        ]
    rank0, rank1 = ranks
    assert [op.comm for op in rank0.ops_by_role("comm")] == [op.comm for op in rank1.ops_by_role("comm")]
    assert [(op.role, op.name) for op in rank0.ops] == [(op.role, op.name) for op in rank1.ops]


def test_recorded_allreduces_follow_backward(recorded):
    _, ranks = recorded
    for trace in ranks:
        tensors = trace.tensor_map()
        writers = writers_of(trace)
        allreduces = [i for i, op in enumerate(trace.ops) if op.role == "comm"]
        previous_fill = -1
        for i in allreduces:
            (bucket,) = trace.ops[i].inputs
            assert trace.ops[i].outputs == (bucket,) and tensors[bucket].kind == "gradient"
            fills = [w for w in writers[bucket] if w != i]
            # the AccumulateGrad hooks fill the bucket, all before its allreduce and after the previous one's
            assert fills and {trace.ops[w].name for w in fills} == {BUCKET_FILL}
            assert previous_fill < min(fills) and max(fills) < i
            previous_fill = max(fills)
            readers = [j for j, op in enumerate(trace.ops) if bucket in op.inputs and j != i]
            assert {trace.ops[j].name for j in readers if j > i} <= {COPY_BUCKET, "aten::as_strided"}
            assert any(trace.ops[j].name == COPY_BUCKET for j in readers)
            assert all(j > i for j in readers if trace.ops[j].name == COPY_BUCKET)
        # DDP's finalize is separate backward ops (not swallowed by the last allreduce or evaluate_function),
        # one per parameter, each before the SGD update of its parameter
        copies = [op for op in trace.ops if op.name == COPY_BUCKET]
        updates = [op for op in trace.ops_by_role("optimizer") if op.name == "aten::add_"]
        assert {op.role for op in copies} == {"backward"} and len(copies) == len(updates) > 0
        evaluate = [op for op in trace.ops if op.name.startswith("autograd::engine::evaluate_function:")]
        assert all(op.role == "backward" for op in evaluate)
        assert all(op.forward_op is not None for op in evaluate if "AccumulateGrad" not in op.name)


# --------------------------------------------------------------------------------------------------------
# Hand-made minimal nested case: the second AccumulateGrad (and its allreduce) inside the first, DDP's
# finalize inside the second allreduce after its gloo marker, buckets older than the step


def _tensor(tid: int, sid: int, numel: int) -> tuple[list, str]:
    return [tid, sid, 0, numel, 4, "cpu"], "Tensor(float)"


def _node(nid: int, name: str, parent: int, inputs=(), outputs=(), schema="", scope=0, seq=-1) -> dict:
    def section(values):
        return {"values": [v for v, _ in values], "types": [t for _, t in values], "shapes": [[] for _ in values]}

    attrs = {"rf_id": nid, "seq_id": seq, "scope": scope, "tid": 1, "op_schema": schema}
    return {
        "id": nid, "name": name, "ctrl_deps": parent, "inputs": section(inputs), "outputs": section(outputs),
        "attrs": [{"name": k, "type": "", "value": v} for k, v in attrs.items()],
    }


def nested_ddp_et() -> dict:
    x, w, b, y, z = _tensor(10, 10, 8), _tensor(11, 11, 8), _tensor(13, 13, 2), _tensor(12, 12, 2), _tensor(14, 14, 2)
    grad_w, grad_b, scale = _tensor(20, 20, 8), _tensor(24, 24, 2), _tensor(21, 21, 1)
    bucket1, bucket2 = _tensor(23, 30, 8), _tensor(26, 31, 2)  # storages 30, 31: allocated in an earlier step
    view1, view2 = _tensor(22, 30, 8), _tensor(25, 31, 2)
    w_grad, b_grad = _tensor(28, 28, 8), _tensor(29, 29, 2)  # the parameters' .grad

    def as_list(t):
        return [t[0]], f"GenericList[{t[1]}]"

    mul_out = "aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)"
    copy_ = "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)"
    add_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"
    add = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
    nodes = [
        _node(1, PROCESS, 1, scope=7), _node(2, THREAD, 1, scope=7), _node(3, "ProfilerStep#2", 2, scope=7),
        _node(4, "aten::mm", 3, [x, w], [y], "aten::mm(Tensor self, Tensor mat2) -> Tensor", seq=1),
        _node(5, "aten::add", 3, [y, b], [z], add, seq=2),
        _node(6, "autograd::engine::evaluate_function: AddBackward0", 3),
        _node(7, "AddBackward0", 6, [z], [grad_b], scope=1, seq=2),
        _node(8, "autograd::engine::evaluate_function: MmBackward0", 3),
        _node(9, "MmBackward0", 8, [grad_b, x], [grad_w], scope=1, seq=1),
        _node(15, BUCKET_FILL, 3),
        _node(16, "torch::autograd::AccumulateGrad", 15, [grad_w], scope=1),
        _node(17, "aten::mul", 15, [grad_w, scale, view1], [view1], mul_out),
        _node(18, "c10d::allreduce_", 15, [as_list(bucket1)], [as_list(bucket1)]),
        _node(19, "gloo:all_reduce", 18, [bucket1], scope=7),
        _node(20, BUCKET_FILL, 15),  # started after the launch: only looks nested
        _node(21, "torch::autograd::AccumulateGrad", 20, [grad_b], scope=1),
        _node(22, "aten::mul", 20, [grad_b, scale, view2], [view2], mul_out),
        _node(23, "c10d::allreduce_", 20, [as_list(bucket2)], [as_list(bucket2)]),
        _node(24, "gloo:all_reduce", 23, [bucket2], scope=7),
        _node(25, COPY_BUCKET, 23, [w_grad, view1]),  # DDP's finalize, after the marker: only looks nested
        _node(26, "aten::copy_", 25, [w_grad, view1], [w_grad], copy_),
        _node(27, COPY_BUCKET, 3, [b_grad, view2]),
        _node(28, "aten::copy_", 27, [b_grad, view2], [b_grad], copy_),
        _node(29, "Optimizer.step#SGD.step", 3, scope=7),
        _node(30, "aten::add_", 29, [w, w_grad], [w], add_),
        _node(31, "aten::add_", 29, [b, b_grad], [b], add_),
    ]
    pg = '[{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 2, "group_count": 1}]'
    nodes.append(_node(32, PG_INIT, 2, [(pg, "String")], scope=7))
    return {"schema": "1.1.1-chakra.0.0.4", "nodes": nodes}


# the order the observer writes nodes in: when each op ended (the gloo markers when the worker finished)
END_ORDER = [4, 5, 7, 6, 9, 8, 16, 17, 18, 15, 21, 22, 23, 20, 26, 25, 19, 24, 28, 27, 30, 31, 29, 3, 32, 2, 1]


@pytest.mark.parametrize("order", ["start", "end"])
def test_nested_evaluate_function_with_preexisting_buckets(tmp_path, order):
    # before the fix: "cyclic trace: ops 15 -> 18 -> 15" (the first AccumulateGrad's mul(out=bucket view)
    # read the bucket that the allreduce after it writes), and the finalize disappeared into the allreduce.
    # In end order the nesting is rebuilt from start and end; in start order the recorded one is repaired.
    doc = nested_ddp_et()
    if order == "end":
        position = {nid: k for k, nid in enumerate(END_ORDER)}
        doc["nodes"].sort(key=lambda n: position[n["id"]])
    trace = import_pytorch_et(write_json(tmp_path / "nested.et.json", doc))
    assert [(op.id, op.role) for op in trace.ops] == [
        (4, "forward"), (5, "forward"), (6, "backward"), (8, "backward"), (15, "backward"), (18, "comm"),
        (20, "backward"), (23, "comm"), (25, "backward"), (27, "backward"), (30, "optimizer"), (31, "optimizer"),
    ]
    ops, tensors = by_id(trace), trace.tensor_map()
    assert [(ops[i].comm.collective, ops[i].comm.bytes) for i in (18, 23)] == [("allreduce", 32), ("allreduce", 8)]
    bucket1, bucket2 = ops[18].inputs[0], ops[23].inputs[0]
    assert tensors[bucket1].kind == tensors[bucket2].kind == "gradient"
    # each bucket: filled by its AccumulateGrad (which no longer reads its stale contents), then reduced,
    # then copied to .grad
    assert bucket1 in ops[15].outputs and bucket1 not in ops[15].inputs
    assert bucket2 in ops[20].outputs and bucket2 not in ops[20].inputs
    assert bucket1 in ops[25].inputs and bucket2 in ops[27].inputs
    assert ops[6].forward_op == 5 and ops[8].forward_op == 4
    assert {tensors[t].kind for t in ops[30].outputs + ops[31].outputs} == {"parameter"}


def test_the_trace_device_is_the_accelerator_holding_the_most_bytes():
    def node(*refs):
        return SimpleNamespace(inputs=list(refs), outputs=[])

    def ref(device, numel):
        return _TRef(1, 1, 0, numel, 4, 0, (numel,), "float32", device)

    assert _trace_device([node(ref("cpu", 10))]) == "cpu"
    # A CUDA step keeps small tensors (targets, scalars) on the host: the accelerator still names it.
    assert _trace_device([node(ref("cpu", 10_000), ref("cuda:0", 100)), node(ref("cuda:1", 10))]) == "cuda:0"
    assert _trace_device([node(ref("", 10))]) == ""  # older schemas name no device: no constants implied

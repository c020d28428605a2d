"""Building the MONeT problem from traces (mlopt.planners.memory.build, .catalog): a traced
ResNet-like tiny model, the traced MLP, and hand-made traces for the corner cases."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from collections import Counter
from dataclasses import replace

import pytest

from mlopt.errors import InputError
from mlopt.formats.trace import Implementation, ModelTrace, Op, Tensor
from mlopt.planners.memory.build import build_problem
from mlopt.planners.memory.catalog import CPU_FACTORS

MODELS_DIR = os.path.join(str(Path(__file__).resolve().parents[2]), "data", "models")
MLP_SPEC = f"{os.path.join(MODELS_DIR, 'tiny_models.py')}:build_mlp"
PROFILE = {"format": "mlopt-op-profile", "schema_version": "1.0",
           "ops": {"aten::addmm": {"forward": [{"name": "slow", "time_factor": 2.0},
                                               {"name": "lean", "time_factor": 1.5, "workspace_per_output_byte": 0}],
                                   "backward": [{"name": "fast", "time_factor": 0.5,
                                                 "workspace_per_output_byte": 2.0}]}}}


@functools.lru_cache(maxsize=None)
def tiny_resnet_trace() -> ModelTrace:
    """Stem conv/BN/ReLU_/max-pool, two basic blocks (conv/BN/ReLU_/conv/BN, `out += x`, ReLU_), pool, linear."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from mlopt.pytorch.trace import trace_model

    class Block(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            out += x
            return self.relu(out)

    class TinyResNet(nn.Module):
        def __init__(self, c: int = 4, classes: int = 3):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(2))
            self.blocks = nn.Sequential(Block(c), Block(c))
            self.fc = nn.Linear(c, classes)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))

    torch.manual_seed(0)
    return trace_model(TinyResNet(), (3, 8, 8), 2, repeats=1)


@functools.lru_cache(maxsize=None)
def mlp_trace() -> ModelTrace:
    pytest.importorskip("torch")
    from mlopt.pytorch.trace import trace_model_spec

    return trace_model_spec(MLP_SPEC, batch=4, input_shape=(8,), repeats=1)


@pytest.fixture(scope="module")
def resnet():
    trace = tiny_resnet_trace()
    return trace, build_problem(trace, source="tiny")


def by_name(problem, name):
    return [n for n in problem.nodes if n.name == name]


# --------------------------------------------------------------------------------------- tiny ResNet


def test_nodes_and_intermediates(resnet):
    trace, problem = resnet
    counts = Counter(n.name for n in problem.nodes)
    assert counts["aten::convolution"] == 5 and counts["aten::native_batch_norm"] == 5
    assert counts["aten::relu_"] == 5 and counts["mlopt::relu_mask"] == 5
    assert counts["aten::add_"] == 2  # the residual adds; BN's num_batches_tracked add_ makes no node
    assert counts["aten::native_batch_norm.out1"] == counts["aten::native_batch_norm.out2"] == 5  # mean, invstd
    assert counts["aten::max_pool2d_with_indices.out1"] == 1  # the indices
    assert not {"aten::detach", "aten::empty", "aten::view", "aten::t"} & set(counts)
    for node in problem.nodes:
        assert all(j < node.index for j in node.inputs) and list(node.inputs) == sorted(set(node.inputs))
    meta = problem.metadata
    # side outputs: BN mean/invstd x 5, the pool's indices, nll_loss's total weight
    assert meta["nodes"] == problem.n and meta["relu_mask_nodes"] == 5 and meta["side_output_nodes"] == 12
    assert meta["intermediate_nodes"] == 17 and meta["unknown_ops"] == {} and not problem.warnings
    assert problem.final_outputs == (by_name(problem, "aten::nll_loss_forward")[0].index,)


def test_relu_masks_and_implementations(resnet):
    _, problem = resnet
    for relu in by_name(problem, "aten::relu_"):
        mask = problem.nodes[relu.index + 1]
        assert mask.name == "mlopt::relu_mask" and mask.intermediate_of == relu.index and mask.inputs == (relu.index,)
        assert mask.out_bytes == relu.out_bytes // 4  # float32 -> one bool per element
        # a CPU trace: the CPU constants (catalog.CPU_FACTORS), not the generic 0.1
        assert mask.forward[0].compute_us == pytest.approx(CPU_FACTORS.relu_mask * relu.forward[0].compute_us, rel=1e-3)
        assert not mask.backward
        assert [f.name for f in relu.forward] == ["inplace", "outofplace"] and relu.forward[0].inplace
        assert relu.inplace_input is not None and relu.inplace_input in relu.inputs
        out_act, inter = relu.backward
        assert (out_act.name, out_act.deps, out_act.kind) == ("output-activated", (relu.index,), "output-activated")
        assert (inter.name, inter.deps) == ("intermediate-activated", (mask.index,))
        assert inter.kind == "intermediate-activated"
        # threshold_backward casts the bool mask to the gradient's dtype first: a result-sized temporary
        assert inter.workspace_bytes == out_act.workspace_bytes + relu.out_bytes


def test_every_conv_backward_is_paired(resnet):
    trace, problem = resnet
    convs = by_name(problem, "aten::convolution")
    assert len(convs) == sum(op.name == "aten::convolution_backward" for op in trace.ops)
    for conv in convs:
        assert len(conv.backward) == 1 and conv.backward[0].name == "default"
        assert conv.backward[0].deps == conv.inputs  # reads its input (the batch is constant memory)
        assert conv.y_bytes > 0
    assert convs[0].inputs == ()  # the first conv reads only the input batch


def test_batch_norm_and_pool_dependencies(resnet):
    _, problem = resnet
    for bn in by_name(problem, "aten::native_batch_norm"):
        stats = (bn.index + 1, bn.index + 2)
        assert bn.backward[0].deps == tuple(sorted(bn.inputs + stats))  # input + saved mean/invstd
        assert bn.forward[0].workspace_bytes == sum(problem.nodes[s].out_bytes for s in stats)
    pool = by_name(problem, "aten::max_pool2d_with_indices")[0]
    assert pool.backward[0].deps == pool.inputs + (pool.index + 1,)  # input + indices


def test_versions_of_in_place_ops(resnet):
    _, problem = resnet
    for add in by_name(problem, "aten::add_"):
        bn = problem.nodes[add.inplace_input]
        assert bn.name == "aten::native_batch_norm" and bn.index in add.inputs and len(add.inputs) == 2
        relu = problem.nodes[add.index + 1]
        assert relu.name == "aten::relu_" and relu.inplace_input == add.index  # reads add_'s version
    for relu in by_name(problem, "aten::relu_"):
        assert problem.nodes[relu.inplace_input].name in ("aten::native_batch_norm", "aten::add_")


def test_times_and_constants_match_the_trace(resnet):
    trace, problem = resnet
    forward_us = sum(op.compute_us for op in trace.ops_by_role("forward"))
    backward_us = sum(op.compute_us for op in trace.ops_by_role("backward"))
    mains = [n for n in problem.nodes if n.intermediate_of is None]
    assert sum(n.forward[0].compute_us for n in mains) == pytest.approx(forward_us)
    assert sum(n.backward[0].compute_us for n in problem.nodes if n.backward) == pytest.approx(backward_us)
    constant = sum(t.bytes for t in trace.tensors if t.kind in ("input", "parameter", "buffer", "optimizer_state"))
    assert problem.constant_bytes == constant
    assert problem.cost_source == "trace+cpu catalog constants" and problem.metadata["source"] == "tiny"


def test_gradient_memory(resnet):
    trace, problem = resnet
    gradients = [t for t in trace.tensors if t.kind == "gradient"]
    # Each gradient created once; one freed before the next is made counts once (a stage's running peak).
    assert sum(n.y_bytes for n in problem.nodes) <= sum(t.bytes for t in gradients) + 4  # + the held loss
    parameter_grads = sum(t.bytes for t in trace.tensors if t.kind == "parameter")  # SGD: one grad each
    first = problem.nodes[0]
    assert first.grad_live_bytes + first.y_bytes >= parameter_grads  # all parameter grads by the end
    loss = problem.nodes[problem.final_outputs[0]]
    # Nothing is live entering the first stage; the loss (held by the training loop through backward) and
    # the seed gradient backward() keeps until it returns count from there on.
    assert loss.grad_live_bytes == 0 and loss.y_bytes >= 2 * loss.out_bytes
    assert problem.nodes[loss.index - 1].grad_live_bytes >= 2 * loss.out_bytes
    for node in problem.nodes:
        if not node.backward:
            assert node.y_bytes == 0


# --------------------------------------------------------------------------------------- MLP and profile


def test_mlp_out_of_place_relu_gets_legal_inplace():
    problem = build_problem(mlp_trace())
    relu = by_name(problem, "aten::relu")[0]
    assert [f.name for f in relu.forward] == ["outofplace", "inplace"]
    assert relu.inplace_input == relu.inputs[0] and problem.nodes[relu.inplace_input].name == "aten::addmm"


def test_profile_adds_scaled_implementations_and_drops_dominated():
    plain = build_problem(mlp_trace())
    problem = build_problem(mlp_trace(), PROFILE, profile_source="ops.json")
    for before, node in zip(plain.nodes, problem.nodes):
        if node.name != "aten::addmm":
            continue
        # "slow" and "lean" are slower with no less workspace than the default: dominated, dropped.
        assert [f.name for f in node.forward] == ["default"]
        assert [b.name for b in node.backward] == ["default", "fast"]
        fast = node.backward[1]
        assert fast.compute_us == pytest.approx(0.5 * before.backward[0].compute_us)
        assert fast.workspace_bytes == 2 * node.out_bytes and fast.deps == before.backward[0].deps
    assert problem.metadata["dominated_dropped"] == 4
    assert problem.cost_source == "trace+profile ops.json+cpu catalog constants"


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"forward": [{"name": "x", "time_factor": -1}]}, "$.ops['aten::convolution'].forward[0].time_factor",
         "must be a positive number"),
        ({"forward": [{"name": "x", "time_factor": True}]}, "$.ops['aten::convolution'].forward[0].time_factor",
         "must be a positive number"),
        ({"backward": [{"name": "x", "time_factor": 1, "workspace_per_output_byte": -2}]},
         "$.ops['aten::convolution'].backward[0].workspace_per_output_byte", "must be a non-negative number"),
        ({"forward": [{"time_factor": 1}]}, "$.ops['aten::convolution'].forward[0].name", "non-empty string"),
        ({"forward": [{"name": "default", "time_factor": 1}]}, "$.ops['aten::convolution'].forward[0].name",
         "already an implementation"),
        ({"forward": [{"name": "x", "time_factor": 1, "algo": 3}]}, "$.ops['aten::convolution'].forward[0]",
         "unknown field(s): algo"),
        ({"sideways": []}, "$.ops['aten::convolution']", "unknown field(s): sideways"),
    ],
)
def test_bad_profiles_name_the_field(change, field, message):
    profile = {"format": "mlopt-op-profile", "schema_version": "1.0", "ops": {"aten::convolution": change}}
    with pytest.raises(InputError) as error:
        build_problem(hand_trace(), profile, profile_source="ops.json")
    assert (error.value.file, error.value.field) == ("ops.json", field)
    assert message in error.value.message


@pytest.mark.parametrize(("doc", "field"), [({"format": "other"}, "$.format"),
                                             ({"format": "mlopt-op-profile", "schema_version": "2.0"},
                                              "$.schema_version"),
                                             ([], "$")])
def test_bad_profile_headers(doc, field):
    with pytest.raises(InputError) as error:
        build_problem(hand_trace(), doc, profile_source="ops.json")
    assert error.value.field == field


# --------------------------------------------------------------------------------------- hand-made traces


def hand_trace(measured: bool = True) -> ModelTrace:
    """x -> aten::foo (unknown) -> relu_ -> sum (loss); backward pairs sum, relu_ and foo; 1 KiB floats."""
    us = (lambda t: (Implementation("default", t),)) if measured else (lambda t: (Implementation("default", None),))
    tensors = (Tensor(0, 1024, "input", (256,), "float32"), Tensor(1, 64, "parameter", (16,), "float32"),
               Tensor(2, 1024, "activation", (256,), "float32"), Tensor(3, 4, "activation", (), "float32"),
               Tensor(4, 4, "gradient", (), "float32"), Tensor(5, 1024, "gradient", (256,), "float32"),
               Tensor(6, 1024, "gradient", (256,), "float32"), Tensor(7, 64, "gradient", (16,), "float32"))
    ops = (
        Op(0, "aten::foo", "forward", (0, 1), (2,), us(10.0)),
        Op(1, "aten::relu_", "forward", (2,), (2,), us(2.0)),
        Op(2, "aten::sum", "forward", (2,), (3,), us(1.0)),
        Op(3, "aten::ones_like", "backward", (3,), (4,), us(0.5)),
        Op(4, "aten::expand", "backward", (4,), (5,), us(1.0), forward_op=2),
        Op(5, "aten::threshold_backward", "backward", (5, 2), (6,), us(2.0), forward_op=1),
        Op(6, "aten::foo_backward", "backward", (6, 0), (7,), us(20.0), forward_op=0),
        Op(7, "aten::detach", "backward", (7,), (), us(0.1)),
    )
    return ModelTrace("hand", ops, tensors)


def test_hand_trace_problem():
    problem = build_problem(hand_trace())
    foo, relu, mask, loss = problem.nodes
    assert (foo.name, relu.name, mask.name, loss.name) == ("aten::foo", "aten::relu_", "mlopt::relu_mask", "aten::sum")
    assert foo.inputs == () and relu.inputs == (0,) and relu.inplace_input == 0 and loss.inputs == (1,)
    assert mask.out_bytes == 256
    assert problem.final_outputs == (3,)
    assert problem.constant_bytes == 1024 + 64
    assert foo.backward[0].deps == () and foo.backward[0].compute_us == pytest.approx(20.1)  # + trailing detach
    assert loss.backward[0].compute_us == pytest.approx(1.5)  # the loss seed joins the next paired stage
    assert loss.backward[0].deps == (3,)  # ones_like reads the loss
    # Stage order 3, (2), 1, 0: y = the seed and d(sum), d(relu), d(param). d(sum) dies after relu's
    # stage, d(relu) after foo's; the parameter gradient persists (only AccumulateGrad's detach reads it).
    # The loss (4 B, the caller's variable) and the seed (4 B, held by torch.autograd.backward) count from
    # the loss's stage to the end of the backward pass.
    assert [n.y_bytes for n in problem.nodes] == [64, 1024, 0, 4 + 4 + 1024]
    assert [n.grad_live_bytes for n in problem.nodes] == [1024 + 8, 1024 + 8, 1024 + 8, 0]
    assert "aten::foo (1)" in problem.warnings[0] and problem.metadata["unknown_ops"] == {"aten::foo": 1}


def test_a_stage_counts_its_gradients_running_peak_not_their_sum():
    """Ops without nodes of their own (views, clones) join a stage; each frees what it reads last."""
    f32 = lambda i, kind, numel: Tensor(i, 4 * numel, kind, (numel,), "float32")  # noqa: E731
    tensors = (f32(0, "input", 256), f32(1, "parameter", 16), f32(2, "activation", 256), f32(3, "activation", 1),
               *(f32(i, "gradient", 1 if i == 4 else 256) for i in (4, 5, 6, 8)), f32(7, "gradient", 16))
    us = (Implementation("default", 1.0),)
    ops = (Op(0, "aten::foo", "forward", (0, 1), (2,), us), Op(1, "aten::sum", "forward", (2,), (3,), us),
           Op(2, "aten::ones_like", "backward", (3,), (4,), us),
           Op(3, "aten::expand", "backward", (4,), (5,), us, forward_op=1),
           Op(4, "aten::clone", "backward", (5,), (6,), us, forward_op=1),
           Op(5, "aten::mul", "backward", (6,), (8,), us, forward_op=1),
           Op(6, "aten::foo_backward", "backward", (8, 0), (7,), us, forward_op=0),
           Op(7, "aten::detach", "backward", (7,), (), us))
    foo, loss = build_problem(ModelTrace("views", ops, tensors)).nodes
    # Loss stage: the loss and the seed (8 B, held), then 1 KiB each for expand, clone and mul, each freed by
    # the next op: at most two at once (2056 B), where their sum would be 3080 B.
    assert (loss.grad_live_bytes, loss.y_bytes) == (0, 8 + 2 * 1024)
    # foo's stage enters with the held 8 B and mul's 1 KiB, adds the 64 B parameter gradient.
    assert (foo.grad_live_bytes, foo.y_bytes) == (8 + 1024, 64)


def test_a_cuda_trace_counts_the_caching_allocators_512_byte_blocks():
    cpu = build_problem(replace(hand_trace(), source={"device": "cpu"}))
    cuda = build_problem(replace(hand_trace(), source={"device": "cuda:0"}))
    assert cpu.constant_bytes == 1024 + 64 and cuda.constant_bytes == 1024 + 512  # the 64-byte parameter
    assert [n.out_bytes for n in cpu.nodes] == [1024, 1024, 256, 4]
    assert [n.out_bytes for n in cuda.nodes] == [1024, 1024, 512, 512]  # the mask and the loss: one block
    assert cuda.nodes[3].y_bytes == 512 + 512 + 1024  # the loss's and the seed's blocks and d(sum)


def test_unmeasured_times_get_defaults_and_a_warning():
    problem = build_problem(hand_trace(measured=False))
    assert problem.cost_source == "defaults"
    assert any("no measured compute_us" in w for w in problem.warnings)
    foo = problem.nodes[0]
    assert foo.forward[0].compute_us == pytest.approx(1.0 + (1024 + 64 + 1024) / 10_000)


# --------------------------------------------------------------------------------------- measured factors


def _profiled(trace: ModelTrace, checks: dict) -> ModelTrace:
    from dataclasses import replace

    return replace(trace, source={**trace.source, "operator_profile": {"catalog_checks": checks}})


def _check(value) -> dict:
    return {"measured": value, "catalog": 1.0, "meaning": "test", "ops": 5}


def test_measured_catalog_factors_replace_the_constants(resnet):
    from mlopt.planners.memory import catalog

    trace, plain = resnet
    checks = {"relu_outofplace_time_factor": _check(5.0), "relu_mask_time_factor": _check(2.0),
              "relu_intermediate_activated_time_factor": _check(1.5), "bn_rebuild_time_factor": _check(3.0),
              "bn_reuse_stats_time_factor": _check(0.5)}
    problem = build_problem(_profiled(trace, checks), source="tiny")
    assert problem.cost_source == "trace+measured catalog factors"
    assert plain.cost_source == "trace+cpu catalog constants"
    assert problem.metadata["measured_catalog_factors"] == {
        "relu_outofplace": 5.0, "relu_mask": 2.0, "relu_intermediate_activated": 1.5, "bn_rebuild": 3.0,
        "bn_reuse_stats": 0.5}
    assert "measured_catalog_factors" not in plain.metadata
    assert plain.metadata["catalog_factors"]["bn_rebuild"] == {"value": catalog.CPU_FACTORS.bn_rebuild,
                                                               "source": "catalog-cpu"}
    for relu, old in zip(by_name(problem, "aten::relu_"), by_name(plain, "aten::relu_")):
        inplace, outofplace = relu.forward
        assert inplace.compute_us == old.forward[0].compute_us  # the traced variant keeps its time
        assert outofplace.compute_us == pytest.approx(5.0 * inplace.compute_us)
        assert old.forward[1].compute_us == pytest.approx(CPU_FACTORS.relu_outofplace * old.forward[0].compute_us)
        mask = problem.nodes[relu.index + 1]
        assert mask.forward[0].compute_us == pytest.approx(2.0 * inplace.compute_us)
        out_act, inter = relu.backward
        assert inter.compute_us == pytest.approx(1.5 * out_act.compute_us)
    for bn, old in zip(by_name(problem, "aten::native_batch_norm"), by_name(plain, "aten::native_batch_norm")):
        rebuilt = next(b for b in bn.backward if b.name == "output-activated")
        assert rebuilt.compute_us == pytest.approx(4.0 * bn.backward[0].compute_us)
        assert rebuilt.workspace_bytes == next(b for b in old.backward if b.name == "output-activated").workspace_bytes
        reuse = next(f for f in bn.forward if f.name == catalog.BN_REUSE_STATS)
        assert reuse.compute_us == pytest.approx(0.5 * bn.forward[0].compute_us)


@pytest.mark.parametrize("checks", [None, [], {"relu_mask_time_factor": "x"},
                                    {"relu_mask_time_factor": {"measured": -1.0}},
                                    {"relu_mask_time_factor": {"measured": float("nan")}},
                                    {"relu_mask_time_factor": {"catalog": 0.1}}])
def test_unusable_checks_keep_the_catalog_constants(checks):
    from mlopt.planners.memory import catalog

    assert catalog.CatalogFactors.from_checks(checks) == catalog.CatalogFactors()
    assert catalog.CatalogFactors().relu_mask == catalog.MASK_TIME_FACTOR


def test_a_plan_on_a_profiled_trace_names_the_measured_factors(resnet):
    from mlopt.planners.memory import catalog
    from mlopt.planners.memory.planner import MemoryOptions, plan_memory
    from mlopt.planners.options import PlannerOptions

    trace, _ = resnet
    problem = build_problem(_profiled(trace, {"relu_outofplace_time_factor": _check(3.0)}), source="tiny")
    result = plan_memory(problem, MemoryOptions(algorithm="store-all", budget_ratio=1.0), PlannerOptions(), {})
    model = result.plan.payload["model"]
    assert model["catalog_factors"]["relu_outofplace"] == {"value": 3.0, "source": "measured"}
    assert model["catalog_factors"]["relu_mask"] == {"value": catalog.CPU_FACTORS.relu_mask, "source": "catalog-cpu"}
    assert model["cost_source"].endswith("+measured catalog factors")


@pytest.mark.parametrize("device, constants", [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda"),
                                               ("mps", "generic"), (None, "generic"), (3, "generic")])
def test_unprofiled_traces_charge_their_devices_constants(device, constants):
    from mlopt.planners.memory import catalog

    factors = catalog.CatalogFactors.for_device(device)
    assert factors.constants == constants and not factors.measured
    expected = {"cpu": catalog.CPU_FACTORS, "cuda": catalog.CUDA_FACTORS, "generic": catalog.CatalogFactors()}
    assert factors == expected[constants]
    # a CPU's fresh buffers fault their pages in: every buffer-writing alternative costs more than the kernel
    assert catalog.CPU_FACTORS.relu_outofplace > 1 and catalog.CPU_FACTORS.relu_mask > 1
    assert catalog.CUDA_FACTORS.relu_outofplace < catalog.CPU_FACTORS.relu_outofplace


def test_the_trace_device_picks_the_constants_and_measured_factors_override_them(resnet):
    from dataclasses import replace

    trace, cpu = resnet
    generic = build_problem(replace(trace, source={k: v for k, v in trace.source.items() if k != "device"}))
    cuda = build_problem(replace(trace, source={**trace.source, "device": "cuda"}))
    assert generic.cost_source == "trace" and cuda.cost_source == "trace+cuda catalog constants"
    for node_g, node_c, node_cpu in zip(by_name(generic, "aten::relu_"), by_name(cuda, "aten::relu_"),
                                        by_name(cpu, "aten::relu_")):
        base = node_g.forward[0].compute_us
        assert [f.compute_us for f in node_g.forward] == pytest.approx([base, base])
        assert node_c.forward[1].compute_us == pytest.approx(1.06 * base)
        assert node_cpu.forward[1].compute_us == pytest.approx(6.5 * base)
    measured = build_problem(_profiled(trace, {"relu_mask_time_factor": _check(0.3)}))
    factors = measured.metadata["catalog_factors"]
    assert factors["relu_mask"] == {"value": 0.3, "source": "measured"}
    assert factors["relu_outofplace"] == {"value": 6.5, "source": "catalog-cpu"}


# --------------------------------------------------------------------------------------- backward transients


def _stage_workspace(node) -> int:
    return node.backward[0].workspace_bytes


def test_cpu_backward_kernels_temporaries_are_the_stages_workspace(resnet):
    """Batch norm backward's input-sized temporary and oneDNN convolution backward's operand copies are in
    c_hat of their stage on a CPU trace, so the replay's backward peak counts them."""
    from mlopt.planners.memory.baselines import store_all
    from mlopt.planners.memory.replay import replay

    trace, problem = resnet
    assert trace.source["device"] == "cpu"
    for bn in by_name(problem, "aten::native_batch_norm"):
        assert _stage_workspace(bn) == problem.nodes[bn.inputs[0]].out_bytes == bn.out_bytes
        rebuilt = [b for b in bn.backward if b.name == "output-activated"]
        assert all(b.workspace_bytes == 2 * bn.out_bytes for b in rebuilt)  # rebuilt input + the temporary
    first, *others = by_name(problem, "aten::convolution")
    assert _stage_workspace(first) == first.out_bytes  # no grad_input: a copy of grad_output
    for conv in others:
        x, dy = problem.nodes[conv.inputs[0]].out_bytes, conv.out_bytes
        assert _stage_workspace(conv) == x + max(x, dy)
    assert all(_stage_workspace(n) == 0 for n in problem.nodes if n.backward
               and n.name not in ("aten::native_batch_norm", "aten::convolution"))
    assert problem.metadata["backward_transients"]["catalog_ops"] == 10

    on_cuda = build_problem(replace(trace, source={**trace.source, "device": "cuda"}))
    assert all(_stage_workspace(n) == 0 for n in on_cuda.nodes if n.backward)  # no constants: profile it
    no_device = build_problem(replace(trace, source={k: v for k, v in trace.source.items() if k != "device"}))
    assert all(_stage_workspace(n) == 0 for n in no_device.nodes if n.backward)
    assert replay(problem, store_all(problem)).peak_bytes > replay(no_device, store_all(no_device)).peak_bytes


def test_profiled_backward_ops_keep_their_measured_workspace(resnet):
    """Where `mlopt profile operators` measured an op, its measured workspace is the calibration."""
    from dataclasses import replace

    trace, _ = resnet
    bn_backward = [op for op in trace.ops if op.name == "aten::native_batch_norm_backward"]
    measured = {op.id: 123 for op in bn_backward[:2]}
    ops = tuple(replace(op, implementations=(replace(op.implementations[0], workspace_bytes=measured[op.id]),))
                if op.id in measured else op for op in trace.ops)
    profiled = replace(trace, ops=ops, source={**trace.source, "operator_profile": {
        "measurements": [{"op": "aten::native_batch_norm_backward", "op_ids": sorted(measured)}]}})
    problem = build_problem(profiled)
    workspaces = [_stage_workspace(n) for n in by_name(problem, "aten::native_batch_norm")]
    assert sorted(workspaces).count(123) == 2 and len(workspaces) == 5
    assert problem.metadata["backward_transients"]["catalog_ops"] == 8  # 3 batch norms + 5 convolutions
    assert problem.metadata["backward_transients"]["measured_ops"] == 2

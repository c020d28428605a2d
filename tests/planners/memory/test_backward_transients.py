"""Backward kernels' temporaries (catalog.backward_transient_bytes, build._catalog_transient): the CPU rules
on synthetic operands and hand-made traces, and, where torch is importable, one real measurement per new rule
that the rule covers what the kernel allocates (the CPU allocator's profiler events, as the rules were
measured; catalog.py's module docstring, "Backward transients")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlopt.formats.trace import Implementation, ModelTrace, Op, Tensor
from mlopt.planners.memory.build import build_problem
from mlopt.planners.memory.catalog import (
    CONV_BACKWARD_OP,
    FLASH_ATTENTION_BACKWARD_OP,
    LAYER_NORM_BACKWARD_OP,
    NHWC_STRIDED_1X1_SLACK_BYTES,
    backward_transient_bytes,
)

FLOAT = 4


def _tensor(tensor_id: int, shape: tuple[int, ...], kind: str = "activation", dtype: str = "float32") -> Tensor:
    numel = 1
    for size in shape:
        numel *= size
    return Tensor(tensor_id, numel * (8 if dtype == "float64" else FLOAT), kind, shape, dtype)


def _rule(op_name: str, operands: tuple[Tensor, ...], *, device: str = "cpu", computes_grad_input: bool = True,
          memory_format: str | None = None, threads: int = 1) -> int:
    return backward_transient_bytes(op_name, device, grad_output_bytes=operands[0].bytes,
                                    input_bytes=operands[1].bytes, computes_grad_input=computes_grad_input,
                                    operands=operands, memory_format=memory_format, threads=threads)


# --------------------------------------------------------------------------------------- synthetic operands


def _conv_operands(batch: int, c_in: int, c_out: int, size: int, kernel: int, stride: int) -> tuple[Tensor, ...]:
    out = size // stride
    return (_tensor(0, (batch, c_out, out, out)), _tensor(1, (batch, c_in, size, size)),
            _tensor(2, (c_out, c_in, kernel, kernel), "parameter"))


@pytest.mark.parametrize("operands, expected", [
    (_conv_operands(16, 512, 512, 7, 3, 1), 2 * 512 * 512 * 9 * FLOAT),  # two weight-sized buffers
    (_conv_operands(16, 64, 3, 224, 7, 2), 2 * 3 * 64 * 49 * FLOAT),  # the same without grad_input
    (_conv_operands(4, 64, 256, 56, 1, 1), 0),  # 1x1 at stride 1: a plain matmul
    (_conv_operands(16, 64, 128, 56, 1, 2),  # strided 1x1: + one image of dy and one of x
     2 * 128 * 64 * FLOAT + (128 * 28 * 28 + 64 * 56 * 56) * FLOAT + NHWC_STRIDED_1X1_SLACK_BYTES),
])
def test_channels_last_convolution_backward_is_weight_sized(operands, expected):
    assert _rule(CONV_BACKWARD_OP, operands, memory_format="channels-last") == expected


def test_contiguous_convolution_backward_keeps_the_operand_copies():
    dy, x, w = _conv_operands(4, 8, 8, 16, 3, 1)
    assert _rule(CONV_BACKWARD_OP, (dy, x, w)) == x.bytes + max(x.bytes, dy.bytes)
    assert _rule(CONV_BACKWARD_OP, (dy, x, w), memory_format="contiguous") == x.bytes + max(x.bytes, dy.bytes)
    assert _rule(CONV_BACKWARD_OP, (dy, x, w), computes_grad_input=False) == dy.bytes
    assert _rule(CONV_BACKWARD_OP, (dy, x, w), device="cuda:0", memory_format="channels-last") == 0


def test_layer_norm_backward_allocates_one_row_statistics_buffer():
    operands = (_tensor(0, (4, 128, 256)), _tensor(1, (4, 128, 256)), _tensor(2, (4, 128, 1)),
                _tensor(3, (4, 128, 1)), _tensor(4, (256,), "parameter"), _tensor(5, (256,), "parameter"))
    assert _rule(LAYER_NORM_BACKWARD_OP, operands) == 4 * 128 * FLOAT
    assert _rule(LAYER_NORM_BACKWARD_OP, operands[:2]) == 0  # a trace without the statistics: nothing to size
    assert _rule(LAYER_NORM_BACKWARD_OP, operands, device="cuda") == 0


def _attention_operands(batch: int, heads: int, length: int, head_dim: int, dtype: str = "float32"):
    """As the trace records them: dy (a [B*L, E] base), q/k/v's shared base, out, logsumexp."""
    width = heads * head_dim
    return (_tensor(0, (batch * length, width), dtype=dtype), _tensor(1, (3, length, batch, width), dtype=dtype),
            _tensor(2, (batch, heads, length, head_dim), dtype=dtype), _tensor(3, (batch, heads, length)))


# (batch, heads, length, head_dim) -> the per-thread buffer measured (torch 2.13 CPU, one thread).
MEASURED_ATTENTION_BUFFERS = {(4, 4, 64, 64): 16512, (4, 4, 128, 64): 32896, (4, 8, 128, 32): 32896,
                              (3, 4, 200, 64): 102656, (4, 4, 256, 64): 131328, (2, 2, 512, 64): 262400}


@pytest.mark.parametrize("shape", sorted(MEASURED_ATTENTION_BUFFERS))
def test_flash_attention_backward_copies_dy_and_keeps_a_per_thread_block(shape):
    operands = _attention_operands(*shape)
    assert _rule(FLASH_ATTENTION_BACKWARD_OP, operands) == operands[0].bytes + MEASURED_ATTENTION_BUFFERS[shape]
    measured_two_threads = 2 * MEASURED_ATTENTION_BUFFERS[shape]  # 65664 measured at (4, 4, 128, 64)
    assert _rule(FLASH_ATTENTION_BACKWARD_OP, operands, threads=2) == operands[0].bytes + measured_two_threads


def test_flash_attention_split_sizes_follow_pytorchs_kernel():
    long = _attention_operands(1, 1, 1024, 64)
    assert _rule(FLASH_ATTENTION_BACKWARD_OP, long) == long[0].bytes + (2 * 256 * 512 + 256) * FLOAT
    double = _attention_operands(2, 2, 128, 64, "float64")
    assert _rule(FLASH_ATTENTION_BACKWARD_OP, double) == double[0].bytes + (2 * 32 * 128 + 32) * 8
    assert _rule(FLASH_ATTENTION_BACKWARD_OP, double[:2]) == double[0].bytes  # no logsumexp: dy's copy only


# --------------------------------------------------------------------------------------- hand traces


def _conv_trace(memory_format: str | None) -> ModelTrace:
    """x -> convolution (3x3, weight w) -> sum (loss); the backward computes grad_input and grad_weight."""
    us = (Implementation("default", 1.0),)
    x, w, y = _tensor(0, (2, 4, 8, 8), "input"), _tensor(1, (4, 4, 3, 3), "parameter"), _tensor(2, (2, 4, 8, 8))
    tensors = (x, w, y, Tensor(3, 4, "activation", (), "float32"), Tensor(4, 4, "gradient", (), "float32"),
               replace(y, id=5, kind="gradient"), replace(x, id=6, kind="gradient"), replace(w, id=7, kind="gradient"))
    ops = (Op(0, "aten::convolution", "forward", (0, 1), (2,), us),
           Op(1, "aten::sum", "forward", (2,), (3,), us),
           Op(2, "aten::ones_like", "backward", (3,), (4,), us),
           Op(3, "aten::expand", "backward", (4,), (5,), us, forward_op=1),
           Op(4, CONV_BACKWARD_OP, "backward", (5, 0, 1), (6, 7), us, forward_op=0))
    source = {"device": "cpu", **({"memory_format": memory_format} if memory_format else {})}
    return ModelTrace("conv", ops, tensors, source=source)


def test_the_traces_memory_format_picks_the_convolution_rule():
    contiguous = build_problem(_conv_trace(None)).nodes[0].backward[0].workspace_bytes
    nhwc = build_problem(_conv_trace("channels-last")).nodes[0].backward[0].workspace_bytes
    x_bytes = 2 * 4 * 8 * 8 * FLOAT
    assert contiguous == x_bytes + x_bytes  # |x| + max(|x|, |dy|)
    assert nhwc == 2 * 4 * 4 * 9 * FLOAT  # two weight-sized buffers


def test_an_attention_stage_counts_the_kernels_temporaries():
    """The flash-attention backward's dy copy and block buffer are its stage's workspace in the problem."""
    us = (Implementation("default", 1.0),)
    dy_base, qkv, out, lse = _attention_operands(2, 4, 128, 64)
    # ids: 0 q/k/v's base (an input), 1 out, 3 logsumexp, 4 the loss, 5 the seed, 6 dy, 7 d(q/k/v)
    tensors = (replace(qkv, id=0, kind="input"), replace(out, id=1), replace(lse, id=3),
               Tensor(4, 4, "activation", (), "float32"), Tensor(5, 4, "gradient", (), "float32"),
               replace(dy_base, id=6, kind="gradient"), replace(qkv, id=7, kind="gradient"))
    ops = (Op(0, "aten::_scaled_dot_product_flash_attention_for_cpu", "forward", (0,), (1, 3), us),
           Op(1, "aten::sum", "forward", (1,), (4,), us),
           Op(2, "aten::ones_like", "backward", (4,), (5,), us),
           Op(3, "aten::expand", "backward", (5,), (6,), us, forward_op=1),
           Op(4, FLASH_ATTENTION_BACKWARD_OP, "backward", (6, 0, 1, 3), (7,), us, forward_op=0))
    problem = build_problem(ModelTrace("attention", ops, tensors, source={"device": "cpu"}))
    assert problem.nodes[0].backward[0].workspace_bytes == dy_base.bytes + 32896


# --------------------------------------------------------------------------------------- real kernels


def _transient_of(fn) -> int:
    """Peak - retained of the CPU allocator's profiler events while fn runs (after one warm call)."""
    from torch.profiler import ProfilerActivity, profile, record_function  # lazy: torch is optional

    fn()  # warm: lazily made buffers (oneDNN's primitive cache) are not the kernel's temporaries
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("mlopt-transient-probe"):
            result = fn()
        del result
    events = list(prof.profiler.kineto_results.events())
    start, end = next((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
                      if e.name() == "mlopt-transient-probe")
    running = peak = 0
    for stamp, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        if start <= stamp <= end:
            running += nbytes
            peak = max(peak, running)
    return peak - running


@pytest.fixture
def one_thread():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the rules' measurements: per-thread buffers scale with the thread count
    yield torch
    torch.set_num_threads(before)


def test_real_kernels_allocate_what_the_rules_say(one_thread):
    torch = one_thread
    torch.manual_seed(0)
    batch, heads, length, head_dim = 2, 4, 128, 64
    q, k, v = (torch.randn(batch, heads, length, head_dim) for _ in range(3))
    out, logsumexp, *_ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    dy = torch.randn_like(out)
    attention = _transient_of(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dy, q, k, v, out, logsumexp, 0.0, False))
    assert attention == _rule(FLASH_ATTENTION_BACKWARD_OP, _attention_operands(batch, heads, length, head_dim))

    x, weight = torch.randn(batch, length, 128), torch.randn(128)
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [128], weight, None, 1e-5)
    dy = torch.randn_like(y)
    layer_norm = _transient_of(lambda: torch.ops.aten.native_layer_norm_backward(
        dy, x, [128], mean, rstd, weight, None, [True, True, False]))
    operands = (_tensor(0, tuple(y.shape)), _tensor(1, tuple(x.shape)), _tensor(2, tuple(mean.shape)))
    assert layer_norm == _rule(LAYER_NORM_BACKWARD_OP, operands)

    channels_last = torch.channels_last
    for c_in, c_out, size, kernel, stride in [(32, 32, 16, 3, 1), (16, 32, 16, 1, 1), (16, 32, 32, 1, 2),
                                              (8, 16, 32, 1, 2)]:
        image = torch.randn(2, c_in, size, size).contiguous(memory_format=channels_last)
        filters = torch.randn(c_out, c_in, kernel, kernel).contiguous(memory_format=channels_last)
        grad = torch.randn_like(torch.nn.functional.conv2d(image, filters, stride=stride, padding=kernel // 2))
        conv = _transient_of(lambda: torch.ops.aten.convolution_backward(
            grad, image, filters, None, [stride] * 2, [kernel // 2] * 2, [1, 1], False, [0, 0], 1,
            [True, True, False]))
        rule = _rule(CONV_BACKWARD_OP, _conv_operands(2, c_in, c_out, size, kernel, stride),
                     memory_format="channels-last")
        dy, x, _ = _conv_operands(2, c_in, c_out, size, kernel, stride)
        slack = 0 if kernel > 1 or stride == 1 else (dy.bytes + x.bytes) // 2 + NHWC_STRIDED_1X1_SLACK_BYTES
        assert conv <= rule <= conv + slack, (c_in, c_out, size, kernel, stride)  # exact but strided 1x1

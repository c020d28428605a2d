"""Rebuilding a traced op as a runnable torch call, from its tensors' shapes (`mlopt profile operators`).

A trace records, per op, its name, role and the tensors it reads and writes (shape, dtype, bytes), but not
its other arguments (stride, padding, kernel size, reduction dims, ...). Each builder here turns one
forward or backward op into a `Bench`: a signature (the op type with everything that determines its cost,
used to measure identical ops once), a default variant (what eager PyTorch runs by default on the device),
alternative variants that the memory planner may choose between (convolution: the algorithms the backend
exposes) and check variants (the catalog's modelled alternatives, e.g. an out-of-place ReLU, whose cost
the catalog derives from the default; measured to compare, never merged).

Arguments the trace lacks are inferred from the shapes when they are (convolution stride and padding from
the input, weight and output sizes; reduction dims; pooling windows) and assumed otherwise; every
inference or assumption is said in the Bench's notes. Shapes are a storage's (the tracer records one
tensor per storage, the shape it was first seen with), so operands that were views (a flattened input to
addmm, a transposed weight) are rebuilt from their element counts: the element count must fit.

Builders raise NotRebuilt (a reason; `tensor` when a tensor lacks a shape or dtype).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Sequence, TypeVar

import torch

from mlopt.formats.trace import Op, Tensor

ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
BN_EPS = 1e-5
BN_MOMENTUM = 0.1

# Variant roles.
DEFAULT = "default"
ALTERNATIVE = "alternative"  # merged into the trace as an implementation
CHECK = "check"  # measured and recorded only

_T = TypeVar("_T")


class NotRebuilt(Exception):
    """The op cannot be rebuilt from the trace: `reason` (short, groups ops in the summary)."""

    def __init__(self, reason: str, tensor: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.tensor = tensor  # id of the tensor lacking a shape or dtype, if that is the reason


@dataclass(frozen=True)
class Variant:
    name: str
    role: str  # DEFAULT, ALTERNATIVE or CHECK
    make: Callable[[], Callable[[], Any]]  # allocates the operands; returns the call to time
    context: Callable[[], ContextManager[Any]] = contextlib.nullcontext  # backend flags around make and runs
    # A one-off correctness check of the variant, run once after its warm-up: named booleans, recorded with
    # its measurement (e.g. the batch norm's reuse-stats recompute against the training output).
    verify: Callable[[], dict[str, bool]] | None = None


@dataclass(frozen=True)
class Bench:
    signature: str  # op type + all that sets its cost; equal signatures are measured once
    variants: tuple[Variant, ...]  # variants[0] is the default
    expected_numel: int | None = None  # elements of the call's first tensor result (sanity check)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpTensors:
    """One op with its tensors resolved."""

    op: Op
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


@dataclass
class _Ctx:
    device: torch.device
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


# ----------------------------------------------------------------------------------------------------
# Tensors


def has_shape(t: Tensor) -> bool:
    """Whether the trace gives this tensor a usable shape and dtype (0-d scalars have shape [])."""
    if t.dtype not in ITEMSIZE:
        return False
    if t.shape:
        return True
    return t.bytes <= ITEMSIZE[t.dtype]


def numel(t: Tensor) -> int:
    return math.prod(t.shape) if t.shape else (1 if t.bytes else 0)


def _require(tensors: Sequence[Tensor]) -> None:
    for t in tensors:
        if t.dtype not in ITEMSIZE:
            raise NotRebuilt("tensor without a known dtype", t.id)
        if not has_shape(t):
            raise NotRebuilt("tensor without a shape", t.id)


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def make_tensor(shape: Sequence[int], dtype: str, device: torch.device, *, low: float = 0.0,
                positive: bool = False, high: int = 2) -> torch.Tensor:
    """Random operand: normal floats (uniform in [0.5, 1.5) when `positive`), ints in [0, high), bools."""
    td = torch_dtype(dtype)
    shape = tuple(shape)
    if dtype in FLOAT_DTYPES:
        if positive:
            return torch.rand(shape, dtype=torch.float32, device=device).add_(0.5).to(td)
        return torch.randn(shape, dtype=torch.float32, device=device).to(td)
    if dtype == "bool":
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(int(low), max(int(low) + 1, high), shape, dtype=td, device=device)


def _seeded(make: Callable[[], _T], seed: int = 0) -> Callable[[], _T]:
    def wrapped() -> _T:
        torch.manual_seed(seed)
        return make()
    return wrapped


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


# ----------------------------------------------------------------------------------------------------
# Backend flags (the convolution algorithms a backend exposes)


@contextlib.contextmanager
def mkldnn_enabled(enabled: bool) -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TF32 acceleration on top of oneDNN ..." on CPU builds
        with torch.backends.mkldnn.flags(enabled=enabled):
            yield


@contextlib.contextmanager
def cudnn_mode(enabled: bool = True, benchmark: bool = False, deterministic: bool = False) -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # allow_tf32 deprecation notices of newer torch releases
        allow_tf32 = torch.backends.cudnn.allow_tf32
        with torch.backends.cudnn.flags(enabled=enabled, benchmark=benchmark, deterministic=deterministic,
                                        allow_tf32=allow_tf32):
            yield


def conv_alternatives(device: torch.device, spatial: int) -> list[tuple[str, Callable[[], ContextManager[Any]], bool]]:
    """(name, backend context, channels-last operands) of the convolution alternatives on `device`.

    CPU: oneDNN (mkldnn) off, i.e. PyTorch's native im2col + GEMM kernels; channels-last operands (oneDNN's
    NHWC kernels). CUDA: cuDNN autotuned (benchmark: the fastest algorithm found, whatever its workspace),
    cuDNN deterministic algorithms, cuDNN off (native kernels); channels-last operands."""
    channels_last = spatial in (2, 3)
    if device.type == "cuda":
        out: list[tuple[str, Callable[[], ContextManager[Any]], bool]] = []
        if torch.backends.cudnn.is_available():
            out += [("cudnn-benchmark", lambda: cudnn_mode(benchmark=True), False),
                    ("cudnn-deterministic", lambda: cudnn_mode(deterministic=True), False),
                    ("no-cudnn", lambda: cudnn_mode(enabled=False), False)]
        if channels_last:
            out.append(("channels-last", contextlib.nullcontext, True))
        return out
    out = []
    if torch.backends.mkldnn.is_available():
        out.append(("no-mkldnn", lambda: mkldnn_enabled(False), False))
        if channels_last:
            out.append(("channels-last", contextlib.nullcontext, True))
    return out


def _default_context(device: torch.device) -> Callable[[], ContextManager[Any]]:
    """What eager PyTorch runs by default: oneDNN on (CPU); cuDNN on, no autotuning (CUDA)."""
    if device.type == "cuda":
        return lambda: cudnn_mode()
    if torch.backends.mkldnn.is_available():
        return lambda: mkldnn_enabled(True)
    return contextlib.nullcontext


def _memory_format(spatial: int) -> torch.memory_format:
    return torch.channels_last if spatial == 2 else torch.channels_last_3d


# ----------------------------------------------------------------------------------------------------
# Inference of arguments the trace does not record


def infer_window(size_in: int, size_out: int, kernel: int, dilation: int = 1, *, max_padding: int | None = None,
                 ceil_mode: bool = False) -> list[tuple[int, int]]:
    """(stride, padding) pairs with out = floor((in + 2p - d(k-1) - 1) / s) + 1, smallest stride first,
    padding closest to "same" ((k-1)/2 * d) first."""
    max_padding = kernel - 1 if max_padding is None else max_padding
    prefer = (kernel - 1) * dilation // 2
    found = []
    for stride in range(1, max(size_in, 1) + 1):
        for pad in sorted(range(0, max_padding + 1), key=lambda p: (abs(p - prefer), p)):
            span = size_in + 2 * pad - dilation * (kernel - 1) - 1
            if span < 0:
                continue
            out = (-(-span // stride) if ceil_mode else span // stride) + 1
            if out == size_out:
                found.append((stride, pad))
    return found


def _conv_geometry(x: Tensor, w: Tensor, out_shape: Sequence[int], ctx: _Ctx) -> tuple[int, list[int], list[int], int]:
    """(spatial dims, stride, padding, groups) of a (non-transposed, dilation 1) convolution."""
    spatial = len(w.shape) - 2
    if spatial < 1 or len(x.shape) != spatial + 2 or len(out_shape) != spatial + 2:
        raise NotRebuilt("convolution operands are not [N, C, spatial...] (a view or an unbatched input)")
    if w.shape[1] <= 0 or x.shape[1] % w.shape[1]:
        raise NotRebuilt("convolution channels do not match the weight (transposed convolution?)")
    groups = x.shape[1] // w.shape[1]
    if out_shape[1] != w.shape[0] or w.shape[0] % groups or out_shape[0] != x.shape[0]:
        raise NotRebuilt("convolution output channels do not match the weight (transposed convolution?)")
    stride, padding = [], []
    ambiguous = False
    for d in range(spatial):
        fits = infer_window(x.shape[2 + d], out_shape[2 + d], w.shape[2 + d])
        if not fits:
            raise NotRebuilt("no stride/padding reproduces the convolution's output size (dilated or transposed?)")
        ambiguous |= len({s for s, _ in fits}) > 1
        stride.append(fits[0][0])
        padding.append(fits[0][1])
    ctx.note(f"stride {stride}, padding {padding}, dilation 1, groups {groups}: inferred from the shapes "
             f"(the trace does not record them){'; other strides also fit' if ambiguous else ''}")
    return spatial, stride, padding, groups


def _pool_window(x: Tensor, out: Tensor, ctx: _Ctx, what: str) -> tuple[list[int], list[int], list[int], bool]:
    """(kernel, stride, padding, ceil_mode) of a 2-d pooling, from its input and output sizes.

    Candidates in order: non-overlapping windows (kernel = stride, no padding), then kernel 2s-1 with
    padding s-1 (ResNet's 3/2/1), then any kernel up to 8; the first that fits is taken and the note says
    when others fit too (the trace does not record the window)."""
    if len(x.shape) != 4 or len(out.shape) != 4 or tuple(x.shape[:2]) != tuple(out.shape[:2]):
        raise NotRebuilt(f"{what} operands are not [N, C, H, W]")
    kernel, stride, padding = [], [], []
    ceil_mode = False
    ambiguous = False
    for d in (2, 3):
        size_in, size_out = x.shape[d], out.shape[d]
        candidates = [(s, s, 0) for s in range(1, 9)] + [(2 * s - 1, s, s - 1) for s in range(2, 5)]
        candidates += [(k, s, p) for s in range(1, 9) for k in range(1, 9) for p in range(0, k // 2 + 1)]
        fits = []
        for ceil in (False, True):
            for k, s, p in candidates:
                span = size_in + 2 * p - (k - 1) - 1
                if span < 0 or p > k // 2:
                    continue
                o = (-(-span // s) if ceil else span // s) + 1
                if o == size_out and (k, s, p, ceil) not in fits:
                    fits.append((k, s, p, ceil))
            if fits:
                break
        if not fits:
            raise NotRebuilt(f"no window reproduces the {what} output size")
        ambiguous |= len(fits) > 1
        k, s, p, ceil = fits[0]
        kernel.append(k)
        stride.append(s)
        padding.append(p)
        ceil_mode |= ceil
    ctx.note(f"kernel {kernel}, stride {stride}, padding {padding}{', ceil_mode' if ceil_mode else ''}: assumed "
             f"(the trace does not record the window{'; other windows fit the shapes too' if ambiguous else ''})")
    return kernel, stride, padding, ceil_mode


def _reduction_dims(shape_in: Sequence[int], shape_out: Sequence[int]) -> tuple[list[int] | None, bool]:
    """(dims, keepdim) of a sum/mean reducing shape_in to shape_out; dims None = all."""
    if not shape_out:
        return None, False
    if len(shape_out) == len(shape_in):
        dims = [d for d, (a, b) in enumerate(zip(shape_in, shape_out)) if a != b]
        if any(shape_out[d] != 1 for d in dims) or not dims:
            raise NotRebuilt("cannot tell which dims the reduction reduces")
        return dims, True
    dims, j = [], 0
    for d, size in enumerate(shape_in):
        if j < len(shape_out) and size == shape_out[j]:
            j += 1
        else:
            dims.append(d)
    if j != len(shape_out) or not dims:
        raise NotRebuilt("cannot tell which dims the reduction reduces")
    return dims, False


def _as_shape(value: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A storage-shaped operand as the shape the op needs: reshaped if the element counts agree, else
    broadcast (aligned left, as an expanded view of a reduced gradient is)."""
    shape = tuple(shape)
    if value.numel() == math.prod(shape):
        return value.reshape(shape)
    try:
        torch.broadcast_shapes(tuple(value.shape), shape)
        return value
    except RuntimeError:
        pass
    padded = value.reshape(tuple(value.shape) + (1,) * (len(shape) - value.dim()))
    torch.broadcast_shapes(tuple(padded.shape), shape)  # RuntimeError when it does not fit either
    return padded.expand(shape)


def _operand_2d(t: Tensor, rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """A [rows, cols] matrix operand; a transposed view when the trace's storage shape is [cols, rows]."""
    if numel(t) != rows * cols:
        raise NotRebuilt("matrix operand's element count does not fit the product's shape")
    if tuple(t.shape) == (cols, rows) and rows != cols:
        return make_tensor((cols, rows), t.dtype, device).t()
    return make_tensor((rows, cols), t.dtype, device)


# ----------------------------------------------------------------------------------------------------
# Builders


def _single(make: Callable[[], Callable[[], Any]], ctx: _Ctx) -> tuple[Variant, ...]:
    return (Variant(DEFAULT, DEFAULT, _seeded(make), _default_context(ctx.device)),)


def _convolution(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if len(ot.inputs) < 2 or not ot.outputs:
        raise NotRebuilt("convolution without input, weight and output tensors")
    x, w = ot.inputs[0], ot.inputs[1]
    bias = ot.inputs[2] if len(ot.inputs) > 2 else None
    out = ot.outputs[0]
    _require([x, w, out] + ([bias] if bias else []))
    spatial, stride, padding, groups = _conv_geometry(x, w, out.shape, ctx)
    device = ctx.device

    def variant(name: str, role: str, context: Callable[[], ContextManager[Any]], channels_last: bool) -> Variant:
        def make() -> Callable[[], Any]:
            xt, wt = make_tensor(x.shape, x.dtype, device), make_tensor(w.shape, w.dtype, device)
            if channels_last:
                xt, wt = (t.contiguous(memory_format=_memory_format(spatial)) for t in (xt, wt))
            bt = make_tensor(bias.shape, bias.dtype, device) if bias is not None else None
            return lambda: torch.ops.aten.convolution(xt, wt, bt, stride, padding, [1] * spatial, False,
                                                      [0] * spatial, groups)
        return Variant(name, role, _seeded(make), context)

    variants = [variant(DEFAULT, DEFAULT, _default_context(device), False)]
    if alternatives:
        variants += [variant(name, ALTERNATIVE, context, cl)
                     for name, context, cl in conv_alternatives(device, spatial)]
    signature = (f"aten::convolution x={_shape_text(x.shape)} w={_shape_text(w.shape)} bias={bias is not None} "
                 f"stride={stride} padding={padding} groups={groups} {x.dtype}")
    return Bench(signature, tuple(variants), numel(out), tuple(ctx.notes))


def _convolution_backward(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if len(ot.inputs) < 3:
        raise NotRebuilt("convolution_backward without grad_output, input and weight tensors")
    grad, x, w = ot.inputs[:3]
    _require([grad, x, w, *ot.outputs])
    spatial, stride, padding, groups = _conv_geometry(x, w, grad.shape, ctx)
    remaining = list(ot.outputs)
    mask = []
    for shape in (tuple(x.shape), tuple(w.shape), (w.shape[0],)):
        hit = next((t for t in remaining if tuple(t.shape) == shape), None)
        mask.append(hit is not None)
        if hit is not None:
            remaining.remove(hit)
    if not any(mask):
        raise NotRebuilt("convolution_backward outputs match neither input, weight nor bias")
    device = ctx.device
    bias_sizes = [w.shape[0]] if mask[2] else None

    def variant(name: str, role: str, context: Callable[[], ContextManager[Any]], channels_last: bool) -> Variant:
        def make() -> Callable[[], Any]:
            gt, xt, wt = (make_tensor(t.shape, t.dtype, device) for t in (grad, x, w))
            if channels_last:
                gt, xt, wt = (t.contiguous(memory_format=_memory_format(spatial)) for t in (gt, xt, wt))
            return lambda: torch.ops.aten.convolution_backward(gt, xt, wt, bias_sizes, stride, padding, [1] * spatial,
                                                               False, [0] * spatial, groups, mask)
        return Variant(name, role, _seeded(make), context)

    variants = [variant(DEFAULT, DEFAULT, _default_context(device), False)]
    if alternatives:
        variants += [variant(name, ALTERNATIVE, context, cl)
                     for name, context, cl in conv_alternatives(device, spatial)]
    first = next(i for i, m in enumerate(mask) if m)
    expected = numel([x, w][first]) if first < 2 else w.shape[0]
    signature = (f"aten::convolution_backward x={_shape_text(x.shape)} w={_shape_text(w.shape)} mask={mask} "
                 f"stride={stride} padding={padding} groups={groups} {x.dtype}")
    return Bench(signature, tuple(variants), expected, tuple(ctx.notes))


def _bn_operands(ot: OpTensors, channels: int) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """(weight, bias, running_mean, running_var) among a batch norm's [C] inputs, by kind."""
    params = [t for t in ot.inputs[1:] if t.kind == "parameter" and numel(t) == channels]
    buffers = [t for t in ot.inputs[1:] if t.kind == "buffer" and numel(t) == channels]
    weight = params[0] if params else None
    bias = params[1] if len(params) > 1 else None
    running_mean = buffers[0] if buffers else None
    running_var = buffers[1] if len(buffers) > 1 else None
    return weight, bias, running_mean, running_var


def _native_batch_norm(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if not ot.inputs or not ot.outputs:
        raise NotRebuilt("batch norm without input and output tensors")
    x = ot.inputs[0]
    _require(list(ot.inputs) + list(ot.outputs))
    if len(x.shape) < 2:
        raise NotRebuilt("batch norm input is not [N, C, ...]")
    channels = x.shape[1]
    weight, bias, rm, rv = _bn_operands(ot, channels)
    stats = [t for t in ot.outputs if t.kind == "activation" and numel(t) == channels]
    training = len(stats) >= 2 or rm is None
    device = ctx.device
    ctx.note(f"training={training}, momentum {BN_MOMENTUM}, eps {BN_EPS} (assumed; they do not change the cost)")

    shape_c = [1, -1] + [1] * (len(x.shape) - 2)

    def operands() -> tuple[torch.Tensor, ...]:
        xt = make_tensor(x.shape, x.dtype, device)
        wt = make_tensor((channels,), weight.dtype, device, positive=True) if weight is not None else None
        bt = make_tensor((channels,), bias.dtype, device) if bias is not None else None
        mt = make_tensor((channels,), rm.dtype, device) if rm is not None else None
        vt = make_tensor((channels,), rv.dtype, device, positive=True) if rv is not None else None
        return xt, wt, bt, mt, vt

    def forward(o: tuple[torch.Tensor, ...]) -> Any:
        return torch.ops.aten.native_batch_norm(*o, training, BN_MOMENTUM, BN_EPS)

    def make() -> Callable[[], Any]:
        o = operands()
        return lambda: forward(o)

    def reuse_stats_setup() -> tuple[torch.Tensor, Callable[[], torch.Tensor], torch.Tensor]:
        # The catalog's "reuse-stats" recompute (MONeT 4.4): the output from the saved mean/invstd of a
        # training forward, y = x * scale + shift with scale = invstd * gamma, shift = beta - mean * scale.
        o = operands()
        xt, wt, bt = o[:3]
        y, mean, invstd = forward(o)[:3]

        def run() -> torch.Tensor:
            scale = invstd if wt is None else invstd * wt
            shift = -mean * scale if bt is None else torch.addcmul(bt, mean, scale, value=-1)  # as the runtime
            return torch.addcmul(shift.view(shape_c).to(xt.dtype), xt, scale.view(shape_c).to(xt.dtype))
        return xt, run, y

    def make_reuse_stats() -> Callable[[], Any]:
        return reuse_stats_setup()[1]

    def verify_reuse_stats() -> dict[str, bool]:
        xt, run, y = reuse_stats_setup()
        recomputed = run()
        tolerance = 1e-5 if xt.dtype in (torch.float32, torch.float64) else 1e-2
        return {"matches_training_output": bool(torch.allclose(recomputed, y, rtol=tolerance, atol=tolerance)),
                "bit_identical": bool(torch.equal(recomputed, y))}

    variants = _single(make, ctx)
    if training:
        variants += (Variant("reuse-stats", CHECK, _seeded(make_reuse_stats), _default_context(device),
                             _seeded(verify_reuse_stats)),)
    signature = (f"aten::native_batch_norm x={_shape_text(x.shape)} affine={weight is not None} "
                 f"running_stats={rm is not None} training={training} {x.dtype}")
    return Bench(signature, variants, numel(x), tuple(ctx.notes))


def _native_batch_norm_backward(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if len(ot.inputs) < 2 or not ot.outputs:
        raise NotRebuilt("batch norm backward without grad_output, input and output tensors")
    grad, x = ot.inputs[0], ot.inputs[1]
    _require(list(ot.inputs) + list(ot.outputs))
    if len(x.shape) < 2:
        raise NotRebuilt("batch norm input is not [N, C, ...]")
    channels = x.shape[1]
    weight, _, rm, rv = _bn_operands(OpTensors(ot.op, ot.inputs[1:], ()), channels)
    saved = [t for t in ot.inputs[2:] if t.kind == "activation" and numel(t) == channels]
    train = len(saved) >= 2
    grads_c = [t for t in ot.outputs if numel(t) == channels and tuple(t.shape) != tuple(x.shape)]
    mask = [any(tuple(t.shape) == tuple(x.shape) for t in ot.outputs), len(grads_c) >= 1, len(grads_c) >= 2]
    device = ctx.device
    shape_c = [1, -1] + [1] * (len(x.shape) - 2)

    def operands() -> dict[str, Any]:
        return {
            "g": make_tensor(grad.shape, grad.dtype, device), "x": make_tensor(x.shape, x.dtype, device),
            "w": make_tensor((channels,), weight.dtype, device, positive=True) if weight is not None else None,
            "rm": make_tensor((channels,), rm.dtype, device) if rm is not None else None,
            "rv": make_tensor((channels,), rv.dtype, device, positive=True) if rv is not None else None,
            "mean": make_tensor((channels,), saved[0].dtype, device) if train else None,
            "invstd": make_tensor((channels,), saved[1].dtype, device, positive=True) if train else None,
        }

    def backward(o: dict[str, Any], xt: torch.Tensor) -> Any:
        return torch.ops.aten.native_batch_norm_backward(o["g"], xt, o["w"], o["rm"], o["rv"], o["mean"], o["invstd"],
                                                         train, BN_EPS, mask)

    def make() -> Callable[[], Any]:
        o = operands()
        return lambda: backward(o, o["x"])

    def make_output_activated() -> Callable[[], Any]:
        # What mlopt.pytorch.memory does for an output-activated batch-norm backward: rebuild the input from
        # the output, x = mean + (y - beta) / (gamma * invstd), then run the same backward on it.
        o = operands()
        y = make_tensor(x.shape, x.dtype, device)
        beta = make_tensor((channels,), x.dtype, device)

        def run() -> Any:
            scale = o["invstd"] if o["w"] is None else o["w"] * o["invstd"]
            if bool((scale == 0).any()):
                raise RuntimeError("gamma * invstd is 0")
            shift = o["mean"] - beta / scale
            rebuilt = torch.addcmul(shift.view(shape_c).to(y.dtype), y, (1.0 / scale).view(shape_c).to(y.dtype))
            return backward(o, rebuilt)
        return run

    variants = [Variant(DEFAULT, DEFAULT, _seeded(make), _default_context(device))]
    if train:
        variants.append(Variant("output-activated", CHECK, _seeded(make_output_activated), _default_context(device)))
    signature = (f"aten::native_batch_norm_backward x={_shape_text(x.shape)} affine={weight is not None} "
                 f"train={train} mask={mask} {x.dtype}")
    expected = numel(x) if mask[0] else channels
    return Bench(signature, tuple(variants), expected, tuple(ctx.notes))


def _relu(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if not ot.inputs:
        raise NotRebuilt("relu without an input tensor")
    x = ot.inputs[0]
    _require([x])
    inplace = ot.op.name.endswith("_")
    device = ctx.device

    def make_relu(in_place: bool) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            xt = make_tensor(x.shape, x.dtype, device)
            return (lambda: torch.relu_(xt)) if in_place else (lambda: torch.relu(xt))
        return make

    def make_mask() -> Callable[[], Any]:
        # The "mlopt::relu_mask" node: the sign of the relu's result as a bool tensor (the runtime's `result > 0`).
        yt = make_tensor(x.shape, x.dtype, device)
        return lambda: yt > 0

    context = _default_context(device)
    variants = (Variant(DEFAULT, DEFAULT, _seeded(make_relu(inplace)), context),
                Variant("inplace" if not inplace else "outofplace", CHECK, _seeded(make_relu(not inplace)), context),
                Variant("sign-mask", CHECK, _seeded(make_mask), context))
    signature = f"{ot.op.name} x={_shape_text(x.shape)} {x.dtype}"
    return Bench(signature, variants, numel(x), tuple(ctx.notes))


def _threshold_backward(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if len(ot.inputs) < 2:
        raise NotRebuilt("threshold_backward without grad_output and input tensors")
    grad, y = ot.inputs[:2]
    _require([grad, y])
    device = ctx.device
    ctx.note("threshold 0 (assumed: the ReLU's)")

    def make_with(mask: bool) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            gt = make_tensor(grad.shape, grad.dtype, device)
            yt = make_tensor(y.shape, y.dtype, device)
            if mask:  # the intermediate-activated backward reads the bool sign mask instead of the result
                yt = yt > 0
            return lambda: torch.ops.aten.threshold_backward(gt, yt, 0)
        return make

    context = _default_context(device)
    variants = (Variant(DEFAULT, DEFAULT, _seeded(make_with(False)), context),
                Variant("intermediate-activated", CHECK, _seeded(make_with(True)), context))
    signature = f"aten::threshold_backward x={_shape_text(grad.shape)} {grad.dtype}"
    return Bench(signature, variants, numel(grad), tuple(ctx.notes))


def _max_pool(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if not ot.inputs or not ot.outputs:
        raise NotRebuilt("max pool without input and output tensors")
    x, out = ot.inputs[0], ot.outputs[0]
    _require([x, out])
    kernel, stride, padding, ceil = _pool_window(x, out, ctx, "max pool")
    device = ctx.device

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        return lambda: torch.ops.aten.max_pool2d_with_indices(xt, kernel, stride, padding, [1, 1], ceil)

    signature = (f"aten::max_pool2d_with_indices x={_shape_text(x.shape)} kernel={kernel} stride={stride} "
                 f"padding={padding} ceil={ceil} {x.dtype}")
    return Bench(signature, _single(make, ctx), numel(out), tuple(ctx.notes))


def _max_pool_backward(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if len(ot.inputs) < 2:
        raise NotRebuilt("max pool backward without grad_output and input tensors")
    grad, x = ot.inputs[:2]
    _require([grad, x])
    kernel, stride, padding, ceil = _pool_window(x, grad, ctx, "max pool")
    device = ctx.device

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        gt = make_tensor(grad.shape, grad.dtype, device)
        _, indices = torch.ops.aten.max_pool2d_with_indices(xt, kernel, stride, padding, [1, 1], ceil)
        return lambda: torch.ops.aten.max_pool2d_with_indices_backward(gt, xt, kernel, stride, padding, [1, 1], ceil,
                                                                        indices)

    signature = (f"aten::max_pool2d_with_indices_backward x={_shape_text(x.shape)} kernel={kernel} stride={stride} "
                 f"padding={padding} ceil={ceil} {x.dtype}")
    return Bench(signature, _single(make, ctx), numel(x), tuple(ctx.notes))


def _avg_pool(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    backward = ot.op.name.endswith("_backward")
    if len(ot.inputs) < (2 if backward else 1) or (not backward and not ot.outputs):
        raise NotRebuilt("average pool without its tensors")
    grad, x = (ot.inputs[0], ot.inputs[1]) if backward else (None, ot.inputs[0])
    out = grad if backward else ot.outputs[0]
    _require([x, out])
    kernel, stride, padding, ceil = _pool_window(x, out, ctx, "average pool")
    device = ctx.device

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        if backward:
            gt = make_tensor(out.shape, out.dtype, device)
            return lambda: torch.ops.aten.avg_pool2d_backward(gt, xt, kernel, stride, padding, ceil, True, None)
        return lambda: torch.ops.aten.avg_pool2d(xt, kernel, stride, padding, ceil, True, None)

    signature = (f"{ot.op.name} x={_shape_text(x.shape)} kernel={kernel} stride={stride} padding={padding} "
                 f"ceil={ceil} {x.dtype}")
    return Bench(signature, _single(make, ctx), numel(x) if backward else numel(out), tuple(ctx.notes))


def _adaptive_avg_pool(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    backward = ot.op.name.endswith("_backward")
    if backward:
        if len(ot.inputs) < 2:
            raise NotRebuilt("adaptive average pool backward without grad_output and input")
        grad, x = ot.inputs[:2]
        _require([grad, x])
        out_shape = grad.shape
    else:
        if not ot.inputs or not ot.outputs:
            raise NotRebuilt("adaptive average pool without input and output")
        x, grad = ot.inputs[0], None
        _require([x, ot.outputs[0]])
        out_shape = ot.outputs[0].shape
    if len(x.shape) != 4 or len(out_shape) != 4:
        raise NotRebuilt("adaptive average pool operands are not [N, C, H, W]")
    size = list(out_shape[2:])
    device = ctx.device

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        if backward:
            gt = make_tensor(out_shape, grad.dtype, device)
            return lambda: torch.ops.aten._adaptive_avg_pool2d_backward(gt, xt)
        return lambda: torch.ops.aten._adaptive_avg_pool2d(xt, size)

    signature = f"{ot.op.name} x={_shape_text(x.shape)} out={size} {x.dtype}"
    return Bench(signature, _single(make, ctx), numel(x) if backward else math.prod(out_shape),
                 tuple(ctx.notes))


def _reduction(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if not ot.inputs or not ot.outputs:
        raise NotRebuilt("reduction without input and output tensors")
    x, out = ot.inputs[0], ot.outputs[0]
    _require([x, out])
    dims, keepdim = _reduction_dims(x.shape, out.shape)
    device = ctx.device
    func = torch.ops.aten.mean if ot.op.name == "aten::mean" else torch.ops.aten.sum
    ctx.note(f"reduced dims {dims if dims is not None else 'all'}{' (keepdim)' if keepdim else ''}: inferred from "
             "the shapes")

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        if dims is None:
            return lambda: func(xt)
        return lambda: func(xt, dims, keepdim)

    signature = f"{ot.op.name} x={_shape_text(x.shape)} dims={dims} keepdim={keepdim} {x.dtype}"
    return Bench(signature, _single(make, ctx), numel(out), tuple(ctx.notes))


def _matmul(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    name = ot.op.name
    if not ot.outputs:
        raise NotRebuilt("matrix product without an output tensor")
    out = ot.outputs[0]
    _require(list(ot.inputs) + [out])
    device = ctx.device
    operands = list(ot.inputs)
    if name == "aten::addmm":
        if len(operands) < 2 or len(out.shape) != 2:
            raise NotRebuilt("addmm operands do not fit [M, N] = bias + [M, K] @ [K, N]")
        bias, mats = operands[0], operands[1:]
        if len(mats) == 1:
            mats = mats * 2
        rows, cols = out.shape
        inner = numel(mats[0]) // rows if rows else 0
        if rows * inner != numel(mats[0]) or inner * cols != numel(mats[1]):
            raise NotRebuilt("addmm operands' element counts do not fit the output")

        def make() -> Callable[[], Any]:
            bt = make_tensor(bias.shape if numel(bias) == cols or numel(bias) == rows * cols else (cols,), bias.dtype,
                             device)
            bt = bt.reshape((cols,)) if bt.numel() == cols else bt.reshape((rows, cols))
            a = _operand_2d(mats[0], rows, inner, device)
            b = _operand_2d(mats[1], inner, cols, device)
            return lambda: torch.ops.aten.addmm(bt, a, b)
        shapes = f"[{rows},{inner}]@[{inner},{cols}]"
    elif name in ("aten::mm", "aten::matmul") and len(out.shape) == 2:
        mats = operands if len(operands) >= 2 else operands * 2
        if len(mats) != 2:
            raise NotRebuilt("mm needs two operands")
        rows, cols = out.shape
        inner = numel(mats[0]) // rows if rows else 0
        if rows * inner != numel(mats[0]) or inner * cols != numel(mats[1]):
            raise NotRebuilt("mm operands' element counts do not fit the output")

        def make() -> Callable[[], Any]:
            a = _operand_2d(mats[0], rows, inner, device)
            b = _operand_2d(mats[1], inner, cols, device)
            return lambda: torch.ops.aten.mm(a, b)
        shapes = f"[{rows},{inner}]@[{inner},{cols}]"
    elif name in ("aten::bmm", "aten::matmul") and len(out.shape) == 3:
        mats = operands if len(operands) >= 2 else operands * 2
        if len(mats) != 2:
            raise NotRebuilt("bmm needs two operands")
        batch, rows, cols = out.shape
        inner = numel(mats[0]) // (batch * rows) if batch * rows else 0
        if batch * rows * inner != numel(mats[0]) or batch * inner * cols != numel(mats[1]):
            raise NotRebuilt("bmm operands' element counts do not fit the output")

        def make() -> Callable[[], Any]:
            a = make_tensor((batch, rows, inner), mats[0].dtype, device)
            b = make_tensor((batch, inner, cols), mats[1].dtype, device)
            return lambda: torch.ops.aten.bmm(a, b)
        shapes = f"[{batch},{rows},{inner}]@[{batch},{inner},{cols}]"
    elif name == "aten::linear":
        if len(operands) < 2:
            raise NotRebuilt("linear without input and weight")
        x, w = operands[0], operands[1]
        bias = operands[2] if len(operands) > 2 else None
        if len(w.shape) != 2 or not out.shape or out.shape[-1] != w.shape[0]:
            raise NotRebuilt("linear weight does not fit the output")
        lead = tuple(out.shape[:-1])
        if numel(x) != math.prod(lead) * w.shape[1]:
            raise NotRebuilt("linear input's element count does not fit the output")

        def make() -> Callable[[], Any]:
            xt = make_tensor(lead + (w.shape[1],), x.dtype, device)
            wt = make_tensor(w.shape, w.dtype, device)
            bt = make_tensor((w.shape[0],), bias.dtype, device) if bias is not None else None
            return lambda: torch.ops.aten.linear(xt, wt, bt)
        shapes = f"{_shape_text(lead + (w.shape[1],))}@{_shape_text(w.shape)}^T bias={bias is not None}"
    else:
        raise NotRebuilt(f"{name} with a {len(out.shape)}-d output is not rebuilt")
    signature = f"{name} {shapes} {out.dtype}"
    return Bench(signature, _single(make, ctx), numel(out), tuple(ctx.notes))


def _elementwise(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    name = ot.op.name
    if not ot.inputs or not ot.outputs:
        raise NotRebuilt("elementwise op without input and output tensors")
    operands = list(ot.inputs[:2])
    out = ot.outputs[0]
    _require(operands + [out])
    inplace = name.endswith("_")
    if inplace and (numel(operands[0]) != numel(out)):
        raise NotRebuilt("in-place op whose output is not its first operand")
    func = getattr(torch.ops.aten, name.split("::", 1)[1])
    device = ctx.device
    out_shape = tuple(out.shape) if out.shape else ()
    if len(operands) == 1:
        ctx.note("second operand is a Python scalar (1; the trace does not record it)")

    def make() -> Callable[[], Any]:
        tensors = [_as_shape(make_tensor(t.shape, t.dtype, device, high=3), out_shape) for t in operands]
        if inplace:
            tensors[0] = tensors[0].clone()  # a whole tensor to write into, not an expanded view
        if len(tensors) == 1:
            a = tensors[0]
            return lambda: func(a, 1)
        a, b = tensors
        return lambda: func(a, b)

    shapes = " ".join(f"{_shape_text(t.shape)}:{t.dtype}" for t in operands)
    signature = f"{name} {shapes} -> {_shape_text(out_shape)}"
    return Bench(signature, _single(make, ctx), numel(out), tuple(ctx.notes))


def _softmax(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    name = ot.op.name
    backward = name.endswith("_backward_data")
    if len(ot.inputs) < (2 if backward else 1) or not ot.outputs:
        raise NotRebuilt("softmax without its tensors")
    x = ot.inputs[0]
    _require(list(ot.inputs[:2]) + [ot.outputs[0]])
    device = ctx.device
    ctx.note("dim -1 (assumed: the trace does not record it)")
    log = "log_softmax" in name

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        if backward:
            yt = make_tensor(ot.inputs[1].shape, ot.inputs[1].dtype, device)
            func = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
            return lambda: func(xt, yt, -1, xt.dtype)
        func = torch.ops.aten._log_softmax if log else torch.ops.aten._softmax
        return lambda: func(xt, -1, False)

    signature = f"{name} x={_shape_text(x.shape)} dim=-1 {x.dtype}"
    return Bench(signature, _single(make, ctx), numel(ot.outputs[0]), tuple(ctx.notes))


def _nll_loss(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    name = ot.op.name
    backward = name.endswith("_backward")
    tensors = list(ot.inputs)
    _require(tensors + list(ot.outputs[:1]))
    floats = [t for t in tensors if t.dtype in FLOAT_DTYPES and len(t.shape) == 2]
    targets = [t for t in tensors if t.dtype in ("int64", "int32", "uint8") and len(t.shape) == 1]
    if not floats or not targets:
        raise NotRebuilt("nll_loss without [N, C] log-probabilities and [N] targets")
    x, target = floats[0], targets[0]
    classes = x.shape[1]
    device = ctx.device
    ctx.note("reduction mean, no class weights, ignore_index -100 (assumed)")

    def make() -> Callable[[], Any]:
        xt = make_tensor(x.shape, x.dtype, device)
        tt = make_tensor(target.shape, "int64", device, high=classes)
        if backward:
            gt = make_tensor((), x.dtype, device)
            total = torch.tensor(float(x.shape[0]), dtype=xt.dtype, device=device)
            return lambda: torch.ops.aten.nll_loss_backward(gt, xt, tt, None, 1, -100, total)
        return lambda: torch.ops.aten.nll_loss_forward(xt, tt, None, 1, -100)

    signature = f"{name} x={_shape_text(x.shape)} {x.dtype}"
    return Bench(signature, _single(make, ctx), numel(x) if backward else 1, tuple(ctx.notes))


def _cat(ot: OpTensors, ctx: _Ctx, alternatives: bool) -> Bench:
    if not ot.inputs or not ot.outputs:
        raise NotRebuilt("cat without inputs and output")
    out = ot.outputs[0]
    _require(list(ot.inputs) + [out])
    parts = list(ot.inputs)
    if any(len(t.shape) != len(out.shape) for t in parts):
        raise NotRebuilt("cat operands' ranks differ from the output's")
    dims = [d for d in range(len(out.shape)) if any(t.shape[d] != out.shape[d] for t in parts)]
    dim = dims[0] if len(dims) == 1 else 0
    if len(dims) > 1 or sum(t.shape[dim] for t in parts) != out.shape[dim]:
        raise NotRebuilt("cannot tell the dim cat joins along (repeated operands are listed once)")
    device = ctx.device

    def make() -> Callable[[], Any]:
        tensors = [make_tensor(t.shape, t.dtype, device) for t in parts]
        return lambda: torch.ops.aten.cat(tensors, dim)

    signature = f"aten::cat {' '.join(_shape_text(t.shape) for t in parts)} dim={dim} {out.dtype}"
    return Bench(signature, _single(make, ctx), numel(out), tuple(ctx.notes))


Builder = Callable[[OpTensors, _Ctx, bool], Bench]
BUILDERS: dict[str, Builder] = {
    "aten::convolution": _convolution,
    "aten::convolution_backward": _convolution_backward,
    "aten::native_batch_norm": _native_batch_norm,
    "aten::native_batch_norm_backward": _native_batch_norm_backward,
    "aten::relu": _relu,
    "aten::relu_": _relu,
    "aten::threshold_backward": _threshold_backward,
    "aten::max_pool2d_with_indices": _max_pool,
    "aten::max_pool2d_with_indices_backward": _max_pool_backward,
    "aten::avg_pool2d": _avg_pool,
    "aten::avg_pool2d_backward": _avg_pool,
    "aten::_adaptive_avg_pool2d": _adaptive_avg_pool,
    "aten::_adaptive_avg_pool2d_backward": _adaptive_avg_pool,
    "aten::mean": _reduction,
    "aten::sum": _reduction,
    "aten::addmm": _matmul,
    "aten::mm": _matmul,
    "aten::bmm": _matmul,
    "aten::matmul": _matmul,
    "aten::linear": _matmul,
    "aten::_log_softmax": _softmax,
    "aten::_softmax": _softmax,
    "aten::_log_softmax_backward_data": _softmax,
    "aten::_softmax_backward_data": _softmax,
    "aten::nll_loss_forward": _nll_loss,
    "aten::nll_loss_backward": _nll_loss,
    "aten::cat": _cat,
    **{f"aten::{n}": _elementwise for n in ("add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_")},
}


def supported(op_name: str) -> bool:
    return op_name in BUILDERS


def build(ot: OpTensors, device: torch.device, *, alternatives: bool = True) -> Bench:
    """The Bench of one op; NotRebuilt when its type or its tensors do not allow it."""
    builder = BUILDERS.get(ot.op.name)
    if builder is None:
        raise NotRebuilt("op type not rebuilt by this profiler")
    return builder(ot, _Ctx(device), alternatives)


def itemsize(dtype: str) -> int:
    return ITEMSIZE.get(dtype, 4)


__all__ = ["ALTERNATIVE", "BUILDERS", "Bench", "CHECK", "DEFAULT", "NotRebuilt", "OpTensors", "Variant", "build",
           "conv_alternatives", "has_shape", "infer_window", "itemsize", "make_tensor", "numel", "supported"]

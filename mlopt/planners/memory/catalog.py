"""Operator implementations per aten op type: what PyTorch on CPU actually offers, as MONeT choices.

The trace measures one implementation of every op, the one eager PyTorch ran; that is always
implementation [0] (the default) with its measured time and workspace. The catalog adds only
alternatives PyTorch on CPU really has, with the measured time as their estimate:

* aten::relu_, aten::relu. Forward: "inplace" and "outofplace", the traced variant first; an
  in-place variant of a traced out-of-place relu only when its input has no later forward reader
  (otherwise it is illegal and left out). Backward: "output-activated" (threshold_backward on the
  result, PyTorch's default, D = {the relu}) and "intermediate-activated", which reads a sign mask:
  an extra node "mlopt::relu_mask" right after the relu (1 byte per element, a bool tensor, what our
  runtime stores; computed from the relu's result for CatalogFactors.relu_mask x the relu's time; no
  backward).
* aten::threshold, aten::threshold_. Forward "inplace" / "outofplace" as for relu; backward as traced
  (it reads the input, so there is no output-activated variant).
* aten::native_batch_norm. Forward as traced. Backward: "default" (input-activated: PyTorch saves the
  input + the saved mean/invstd) and "output-activated" (MONeT section 4.4, In-Place ABN): the input
  is rebuilt from the output, x = mean + (y - beta) / (gamma * invstd), one elementwise pass into a
  buffer of |x| bytes (the workspace), then the same backward runs. D = {the output, mean, invstd}.
  Its time is the traced backward's x (1 + CatalogFactors.bn_rebuild). Our runtime serves autograd the
  rebuilt input (mlopt.pytorch.memory_engine); gamma = 0 channels cannot be rebuilt, which
  the runtime detects and reports.
  Recomputation also has "reuse-stats" (MONeT 4.4: "we also reuse BatchNorm statistics in case of their
  recomputation"): y = x * (gamma * invstd) + (beta - mean * gamma * invstd) from the saved mean/invstd,
  one elementwise pass instead of the statistics' reductions, equal to the training output up to float
  rounding (identical on ResNet-50's shapes on this CPU). It reads the kept mean/invstd nodes and does not produce them, and the forward pass cannot use it.
  Charged at CatalogFactors.bn_reuse_stats x the traced forward.
* aten::convolution, aten::max_pool2d_with_indices (input + indices) and the other TRACED_ONLY_OPS:
  as traced. CPU PyTorch has one kernel for each and fixed saved tensors.
* anything else (unknown): as traced (the conservative default), and the problem warns, naming it.

CPU PyTorch has no algorithm choice for convolution (no cuDNN-style algorithms, no workspace query),
so convolution alternatives come only from an `--ops` profile (format below), which scales the
measured default of every op of a type: time_us = default time x time_factor and workspace_bytes =
workspace_per_output_byte x |x_i| (the forward node's output bytes, also for backward entries). A
backward profile entry keeps the default's dependencies.

    {"format": "mlopt-op-profile", "schema_version": "1.0",
     "ops": {"aten::convolution": {"forward": [{"name": "im2col", "time_factor": 1.4,
                                                "workspace_per_output_byte": 9.0}],
                                   "backward": [...]}}}

The factors of the alternatives the catalog models (the other ReLU variant, the sign mask, the mask-reading
ReLU backward, the batch-norm rebuild and reuse-stats) are CatalogFactors: on a trace that `mlopt profile
operators` profiled, the values it measured on the trace's own ops; otherwise the constants of the trace's
device (CPU_FACTORS, CUDA_FACTORS, measured on ResNet-50; on a CPU an out-of-place ReLU costs 6.5x the
in-place one, since it writes a fresh buffer), or the generic constants below for a trace naming no device.

Dominated implementations (same dependencies and in-place flag, no faster and no leaner than another)
are dropped, never the default.

Backward transients. Some backward kernels allocate temporaries inside the one aten op a trace records,
so the trace sees neither their bytes nor their lifetime; they are live while the op runs, on top of the
gradients it returns. They are the op's workspace c_hat (its stage's peak counts them; build.py takes the
stage's largest), from the operator profile where `mlopt profile operators` measured the op (its
"workspace": the allocator's peak during the call minus what the call returns), else from the constants
of the trace's device, `backward_transient_bytes`. CPU (torch 2.13 CPU build, one intra-op thread; each
kernel measured alone with the CPU allocator's profiler events, peak minus what it returns, and checked op
by op in a real profiled step of the model named):
* aten::native_batch_norm_backward: one input-sized temporary, |x|, besides grad_input (ResNet shapes, batch
  4-16, contiguous and channels-last alike: exact on all 20 of resnet18's at batch 4 and 16).
* aten::convolution_backward, contiguous (oneDNN): without grad_input (the first layer) a copy of
  grad_output, |dy|; with it, |x| + max(|x|, |dy|) (copies of the operands in the kernel's layout; exact for
  stride 1, an upper bound within 2% for stride 2). On tiny shapes oneDNN adds scratch memory these leave
  out (31 KB measured against 16 KB at 4x8x8x8): a few KB, which `mlopt profile operators` measures.
* aten::convolution_backward on a channels-last trace (`source.memory_format` "channels-last", oneDNN's
  NHWC kernels): the operands need no copy, but the weight and its gradient go through oneDNN's blocked
  layout: 2 |w|, whatever the batch (exact on every 3x3 and 7x7 convolution of resnet18 at batch 4 and 16,
  e.g. 18,874,368 B for 512x512x3x3, and on 3 more shapes). A 1x1 kernel at stride 1 runs as a matmul: 0
  (measured at 2 shapes). A strided 1x1 kernel adds scratch that varies with the channel counts (12 KB to
  0.4 MB over 12 shapes, the same at batch 2, 8 and 16): charged one image of x plus one of dy plus a 4 KB
  page, an upper bound on all of them (resnet18's three downsamples: 0.43, 0.26 and 1.05 MB measured,
  0.47, 0.47 and 1.15 MB charged).
* aten::native_layer_norm_backward: one row-statistics-sized buffer, |mean| (its third input): 2048 B at
  4x128x256 and 2x256x256, bert_small's 8 layer norms.
* aten::_scaled_dot_product_flash_attention_for_cpu_backward: a copy of grad_output, |dy|, plus a
  per-thread block buffer of (2 qSplit x kvSplit + qSplit) accumulator elements (float32; float64 for
  float64 inputs), PyTorch's split sizes for query length Lq (the logsumexp's last dimension): qSplit = 256
  from Lq 768, 64 from 192, else 32; kvSplit = min(Lkv, 512), Lkv taken = Lq (self-attention; the trace
  records q, k and v by their shared base). Exact at 9 shapes (B, H, L, D from 1x12x128x64 to
  2x2x512x64: e.g. 557,184 B at 4x4x128x64) and in bert_small's real step (batch x length 4x128 and
  2x256); with T threads the buffer is T times (65,664 B measured at 2 threads; `threads`, 1 here, as the
  bench runs). The copy of dy is skipped when dy is already (B, L, H, D)-contiguous (the rule is then an
  upper bound); MultiheadAttention's dy is not.
* threshold_backward reading a bool sign mask (the intermediate-activated ReLU backward, whose temporary
  is that implementation's workspace in `backward_impls`, on every device): it first casts the mask to the
  gradient's dtype, |result| (2 MiB at 4x128x1024 float, as large as what it returns).
Every other backward op measured allocates only what it returns: threshold_backward on the result,
max_pool2d_with_indices_backward, mm and addmm's (both weight and input gradients), sum, select_backward,
clone, nll_loss and log_softmax backward (all of bert_small's step), _softmax_backward_data and
gelu_backward (both approximations; 4x128x256 and 2x256x1024). Forward kernels are not covered here: a
channels-last convolution's forward reorders its weight too (|w| + 8 KB, e.g. 9.4 MB for 512x512x3x3) and
the flash-attention forward keeps a 25-82 KB block buffer; the trace's forward workspace (0 unless profiled)
does not count them. A CUDA trace has no constants (the caching allocator's workspace depends on
cuDNN's algorithm): profile it.

Allocator rounding (`allocated_bytes`). On a CUDA trace every tensor counts as the caching allocator's
block, its bytes rounded up to a multiple of 512 (what `torch.cuda.memory_allocated` and the budget see).
PyTorch's CPU allocator reports the bytes asked for (its 64-byte aligned blocks stay below 0.01% on
activation-sized tensors), so CPU tensors count as traced; the page rounding of glibc's mmap shows only
in the process's RSS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import check_finite
from mlopt.formats.trace import Tensor
from mlopt.planners.memory.problem import BackwardImpl, ForwardImpl

PROFILE_FORMAT = "mlopt-op-profile"
PROFILE_MAJOR = 1

RELU_OPS = frozenset({"aten::relu", "aten::relu_"})
THRESHOLD_OPS = frozenset({"aten::threshold", "aten::threshold_"})
MASK_NODE_NAME = "mlopt::relu_mask"
# The sign mask is computed from the relu's result (x > 0): a cheap elementwise pass.
MASK_TIME_FACTOR = 0.1
BATCH_NORM_OPS = frozenset({"aten::native_batch_norm"})
# Rebuilding a batch norm's input from its output (one addcmul over |x|) costs 0.3-1.0 x the traced
# batch-norm backward on this 2-core CPU (ResNet-50 shapes, batch 32): the upper end is charged.
BN_REBUILD_TIME_FACTOR = 1.0
# Recomputing a batch norm from its saved statistics (scale/shift from mean, invstd, gamma, beta, then one
# addcmul over |x|) measured 0.22-0.68 x the training forward on this 2-core CPU over ResNet-50's 53 batch
# norms at batch 32 (0.49 time-weighted; large memory-bound tensors at the top): the upper end is charged.
BN_REUSE_STATS_TIME_FACTOR = 0.7
BN_REUSE_STATS = "reuse-stats"
# Ops whose traced behaviour is all CPU PyTorch offers (one kernel, fixed saved tensors).
TRACED_ONLY_OPS = frozenset({
    "aten::convolution", "aten::max_pool2d_with_indices",
    "aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul",
    "aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::sub", "aten::div",
    "aten::mean", "aten::sum", "aten::_log_softmax", "aten::_softmax", "aten::nll_loss_forward",
    "aten::avg_pool2d", "aten::_adaptive_avg_pool2d", "aten::adaptive_avg_pool2d", "aten::cat",
})
KNOWN_OPS = RELU_OPS | THRESHOLD_OPS | BATCH_NORM_OPS | TRACED_ONLY_OPS

_PROFILE_IMPL_FIELDS = {"name", "time_factor", "workspace_per_output_byte"}


@dataclass(frozen=True)
class CatalogFactors:
    """The time factors the catalog charges for the alternatives it models from a default's measured time.

    Without a profile they are constants: the ones of the trace's device (`for_device`: CPU_FACTORS,
    CUDA_FACTORS), else the generic constants above. A trace profiled by `mlopt profile operators` carries
    measured values of the same factors (`source.operator_profile.catalog_checks`, time-weighted over the
    trace's own ops): `with_checks` takes those instead, since they are measurements of this model on this
    machine.
    """

    relu_outofplace: float = 1.0  # out-of-place ReLU / traced in-place ReLU
    relu_inplace: float = 1.0  # in-place ReLU / traced out-of-place ReLU
    relu_mask: float = MASK_TIME_FACTOR  # sign mask (result > 0) / ReLU
    relu_intermediate_activated: float = 1.0  # threshold_backward on the mask / on the result
    bn_rebuild: float = BN_REBUILD_TIME_FACTOR  # extra time of the output-activated batch-norm backward
    bn_reuse_stats: float = BN_REUSE_STATS_TIME_FACTOR  # reuse-stats recomputation / training forward
    constants: str = "generic"  # which constants the unmeasured factors are: generic | cpu | cuda
    measured: frozenset[str] = frozenset()  # the factors taken from a profile's catalog checks

    @staticmethod
    def for_device(device: Any) -> "CatalogFactors":
        """The constants of a trace's device (`source.device`: "cpu", "cuda", "cuda:1"); generic otherwise."""
        kind = device_kind(device)
        return {"cpu": CPU_FACTORS, "cuda": CUDA_FACTORS}.get(kind, CatalogFactors())

    @staticmethod
    def from_checks(checks: Any) -> "CatalogFactors":
        """The generic constants with every measured `catalog_checks` entry in their place."""
        return CatalogFactors().with_checks(checks)

    def with_checks(self, checks: Any) -> "CatalogFactors":
        """These factors with every measured `catalog_checks` entry (a positive, finite `measured`) in place
        of the constant; anything else keeps the constant."""
        if not isinstance(checks, dict):
            return self
        taken = {}
        for field_name, check in _CHECK_OF_FACTOR.items():
            entry = checks.get(check)
            value = entry.get("measured") if isinstance(entry, dict) else None
            if _is_number(value) and math.isfinite(value) and value > 0:
                taken[field_name] = float(value)
        return replace(self, **taken, measured=self.measured | frozenset(taken)) if taken else self

    def described(self) -> dict[str, dict[str, float | str]]:
        """Each factor with where it came from: "measured", or the constants' name ("catalog" for the
        generic ones, "catalog-cpu", "catalog-cuda")."""
        constant = "catalog" if self.constants == "generic" else f"catalog-{self.constants}"
        return {name: {"value": getattr(self, name), "source": "measured" if name in self.measured else constant}
                for name in _CHECK_OF_FACTOR}


# Constants per device: what `mlopt profile operators` measured, time-weighted over ResNet-50's ops (batch
# 32, the bench trace), where the generic constants were far off: bench/results/memory-profiled.json rounded up
# (the rebuild at the upper end of two profiles, 2.3-2.6).
# CPU (2 cores, torch 2.13 CPU build, docs/memory.md): a fresh activation-sized buffer costs page faults
# (glibc serves such sizes with mmap), so every alternative that writes one (out-of-place ReLU, the bool
# sign mask, the rebuilt batch-norm input) costs several times the in-place kernel.
CPU_FACTORS = CatalogFactors(relu_outofplace=6.5, relu_mask=2.74, relu_intermediate_activated=2.18,
                             bn_rebuild=2.6, bn_reuse_stats=0.55, constants="cpu")
# CUDA (one H100, torch 2.11 + cuDNN 9.19, docs/profile-operators.md): the caching allocator reuses
# buffers, so every memory-bound alternative costs about one pass, like the kernel it replaces.
CUDA_FACTORS = CatalogFactors(relu_outofplace=1.06, relu_mask=1.01, relu_intermediate_activated=1.07,
                              bn_rebuild=0.95, bn_reuse_stats=0.82, constants="cuda")


# The `mlopt profile operators` catalog check that measures each factor (profilers/operators.py).
_CHECK_OF_FACTOR = {
    "relu_outofplace": "relu_outofplace_time_factor",
    "relu_inplace": "relu_inplace_time_factor",
    "relu_mask": "relu_mask_time_factor",
    "relu_intermediate_activated": "relu_intermediate_activated_time_factor",
    "bn_rebuild": "bn_rebuild_time_factor",
    "bn_reuse_stats": "bn_reuse_stats_time_factor",
}


BN_BACKWARD_OP = "aten::native_batch_norm_backward"
CONV_BACKWARD_OP = "aten::convolution_backward"
LAYER_NORM_BACKWARD_OP = "aten::native_layer_norm_backward"
FLASH_ATTENTION_BACKWARD_OP = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
CHANNELS_LAST = "channels-last"  # a trace's `source.memory_format` when `mlopt trace --channels-last` made it
# oneDNN's scratch for a strided 1x1 convolution on NHWC operands (12 KB-0.4 MB measured over 15 shapes, the
# same at batch 2 and 16): at most one image of x plus one of grad_output plus this page.
NHWC_STRIDED_1X1_SLACK_BYTES = 4096


def device_kind(device: Any) -> str | None:
    """"cuda" for a trace's `source.device` "cuda:1", "cpu" for "cpu"; None when the trace names no device."""
    return device.split(":", 1)[0] if isinstance(device, str) else None


def backward_transient_bytes(op_name: str, device: Any, *, grad_output_bytes: int, input_bytes: int,
                             computes_grad_input: bool, operands: Sequence[Tensor] = (),
                             memory_format: str | None = None, threads: int = 1) -> int:
    """Bytes a backward kernel allocates while it runs beyond what it returns (module docstring, "Backward
    transients"), from the constants of the trace's device (`source.device`); 0 for ops and devices without
    constants. `grad_output_bytes` = |dy| (the op's first input), `input_bytes` = |x| (the forward input it
    reads), `operands` = all the op's input tensors in the trace's order (the rules that need more than dy
    and x read them), `memory_format` = the trace's `source.memory_format`, `threads` = intra-op threads (the
    kernels with per-thread buffers scale with it)."""
    kind = device_kind(device)
    if kind != "cpu":
        return 0
    if op_name == BN_BACKWARD_OP:
        return input_bytes
    if op_name == CONV_BACKWARD_OP:
        if memory_format == CHANNELS_LAST:
            return _conv_backward_nhwc_bytes(operands)
        return input_bytes + max(input_bytes, grad_output_bytes) if computes_grad_input else grad_output_bytes
    if op_name == LAYER_NORM_BACKWARD_OP:
        return operands[2].bytes if len(operands) > 2 else 0  # a row-statistics-sized buffer: |mean|
    if op_name == FLASH_ATTENTION_BACKWARD_OP:
        return grad_output_bytes + threads * _flash_attention_backward_buffer_bytes(operands)
    return 0


def _conv_backward_nhwc_bytes(operands: Sequence[Tensor]) -> int:
    """oneDNN's NHWC convolution backward (operands dy, x, w): two weight-sized buffers (the weight and its
    gradient in oneDNN's blocked layout); a 1x1 kernel at stride 1 runs as a plain matmul and allocates
    nothing; a strided 1x1 kernel adds scratch of at most one image of x and one of dy."""
    if len(operands) < 3 or len(operands[2].shape) < 3:
        return 0
    grad_output, forward_input, weight = operands[:3]
    one_by_one = all(size == 1 for size in weight.shape[2:])
    same_spatial = tuple(forward_input.shape[2:]) == tuple(grad_output.shape[2:])
    if one_by_one and same_spatial:
        return 0
    scratch = 0
    if one_by_one and grad_output.shape and forward_input.shape:
        one_image = (grad_output.bytes // max(1, grad_output.shape[0])
                     + forward_input.bytes // max(1, forward_input.shape[0]))
        scratch = one_image + NHWC_STRIDED_1X1_SLACK_BYTES
    return 2 * weight.bytes + scratch


def _flash_attention_backward_buffer_bytes(operands: Sequence[Tensor]) -> int:
    """The per-thread buffer of PyTorch's CPU flash-attention backward: (2 qSplit x kvSplit + qSplit)
    accumulator elements (the attention block and its gradient, one row sum), with PyTorch's split sizes
    for the query length Lq (the logsumexp's last dimension; self-attention, so kv length = Lq)."""
    logsumexp = next((t for t in reversed(operands) if len(t.shape) == 3), None)
    if logsumexp is None:
        return 0
    q_len = kv_len = logsumexp.shape[-1]
    q_split = 256 if q_len >= 768 else (64 if q_len >= 192 else 32)
    kv_split = min(kv_len, 512)
    accumulate_itemsize = 8 if operands[0].dtype == "float64" else 4
    return (2 * q_split * kv_split + q_split) * accumulate_itemsize


def is_known(op_name: str) -> bool:
    return op_name in KNOWN_OPS


def makes_mask(op_name: str) -> bool:
    """Whether the op gets an intermediate "mlopt::relu_mask" node right after it."""
    return op_name in RELU_OPS


def mask_bytes(numel: int) -> int:
    """A bool sign mask: what our runtime stores (1 byte per element)."""
    return max(1, numel)


# --------------------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class ProfileImpl:
    name: str
    time_factor: float
    workspace_per_output_byte: float = 0.0


@dataclass(frozen=True)
class OpProfile:
    forward: tuple[ProfileImpl, ...] = ()
    backward: tuple[ProfileImpl, ...] = ()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_impl(entry: Any, where: str, source: str) -> ProfileImpl:
    if not isinstance(entry, dict):
        raise InputError(source, where, f"expected an object, found {type(entry).__name__}")
    unknown = sorted(set(entry) - _PROFILE_IMPL_FIELDS)
    if unknown:
        raise InputError(source, where, f"unknown field(s): {', '.join(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(source, f"{where}.name", "must be a non-empty string")
    factor = entry.get("time_factor")
    if not _is_number(factor) or factor <= 0:
        raise InputError(source, f"{where}.time_factor", "must be a positive number")
    per_byte = entry.get("workspace_per_output_byte", 0.0)
    if not _is_number(per_byte) or per_byte < 0:
        raise InputError(source, f"{where}.workspace_per_output_byte", "must be a non-negative number")
    return ProfileImpl(name, float(factor), float(per_byte))


def parse_profile(doc: Any, source: str = "<ops profile>") -> dict[str, OpProfile]:
    """Check an `--ops` document; InputError(source, JSON path, why) on the first bad field."""
    check_finite(doc, source)  # a NaN factor would pass `factor <= 0` and reach the ILP's coefficients
    if not isinstance(doc, dict):
        raise InputError(source, "$", f"expected a JSON object ({PROFILE_FORMAT}), found {type(doc).__name__}")
    if doc.get("format") != PROFILE_FORMAT:
        raise InputError(source, "$.format", f"expected {PROFILE_FORMAT!r}, found {doc.get('format')!r}")
    version = doc.get("schema_version")
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise InputError(source, "$.schema_version", "missing or not of the form MAJOR.MINOR, e.g. \"1.0\"")
    if int(parts[0]) != PROFILE_MAJOR:
        raise InputError(source, "$.schema_version", f"major version {parts[0]} is not supported "
                                                     f"(this mlopt reads {PROFILE_MAJOR}.x)")
    unknown = sorted(set(doc) - {"format", "schema_version", "ops"})
    if unknown:
        raise InputError(source, "$", f"unknown field(s): {', '.join(unknown)}")
    ops = doc.get("ops", {})
    if not isinstance(ops, dict):
        raise InputError(source, "$.ops", f"expected an object of op types, found {type(ops).__name__}")
    parsed: dict[str, OpProfile] = {}
    for op_name, spec in ops.items():
        where = f"$.ops[{op_name!r}]"
        if not isinstance(spec, dict):
            raise InputError(source, where, f"expected an object, found {type(spec).__name__}")
        bad = sorted(set(spec) - {"forward", "backward"})
        if bad:
            raise InputError(source, where, f"unknown field(s): {', '.join(bad)}")
        lists: dict[str, tuple[ProfileImpl, ...]] = {}
        for phase in ("forward", "backward"):
            entries = spec.get(phase, [])
            if not isinstance(entries, list):
                raise InputError(source, f"{where}.{phase}", "must be a list of implementations")
            impls = tuple(_parse_impl(e, f"{where}.{phase}[{n}]", source) for n, e in enumerate(entries))
            names = [p.name for p in impls]
            for n, name in enumerate(names):
                if name in names[:n] or name in _reserved_names(op_name, phase):
                    raise InputError(source, f"{where}.{phase}[{n}].name",
                                     f"{name!r} is already an implementation of {op_name} {phase}")
            lists[phase] = impls
        parsed[op_name] = OpProfile(lists["forward"], lists["backward"])
    return parsed


def _reserved_names(op_name: str, phase: str) -> set[str]:
    """Names the catalog itself gives this op type's implementations."""
    if phase == "forward":
        if op_name in RELU_OPS | THRESHOLD_OPS:
            return {"default", "inplace", "outofplace"}
        return {"default", BN_REUSE_STATS} if op_name in BATCH_NORM_OPS else {"default"}
    if op_name in RELU_OPS:
        return {"default", "output-activated", "intermediate-activated"}
    return {"default", "output-activated"} if op_name in BATCH_NORM_OPS else {"default"}


# --------------------------------------------------------------------------------------- implementations


def forward_impls(op_name: str, traced: tuple[ForwardImpl, ...], *, inplace_legal: bool, out_bytes: int,
                  profile: OpProfile | None = None, has_intermediates: bool = False,
                  factors: CatalogFactors = CatalogFactors()) -> tuple[ForwardImpl, ...]:
    """J_i for one forward op: `traced` are its trace implementations ([0] measured, with the traced
    in-place flag); `inplace_legal` says whether an in-place variant of an out-of-place op may be added;
    `has_intermediates` whether the node has intermediate nodes (batch norm's saved mean/invstd)."""
    default = traced[0]
    impls = list(traced)
    if op_name in RELU_OPS | THRESHOLD_OPS:
        # Same kernel either way: the other variant costs the measured time x its factor (1 unless profiled).
        inplace_us = default.compute_us * (1.0 if default.inplace else factors.relu_inplace)
        outofplace_us = default.compute_us * (factors.relu_outofplace if default.inplace else 1.0)
        inplace = ForwardImpl("inplace", inplace_us, default.workspace_bytes, True)
        outofplace = ForwardImpl("outofplace", outofplace_us, default.workspace_bytes, False)
        if default.inplace:
            impls = [inplace, outofplace] + impls[1:]
        else:
            impls = [outofplace] + ([inplace] if inplace_legal else []) + impls[1:]
    for p in (profile.forward if profile else ()):
        impls.append(ForwardImpl(p.name, default.compute_us * p.time_factor,
                                 int(round(p.workspace_per_output_byte * out_bytes)), default.inplace))
    if op_name in BATCH_NORM_OPS and has_intermediates and not default.inplace:
        impls.append(ForwardImpl(BN_REUSE_STATS, default.compute_us * factors.bn_reuse_stats, 0, False,
                                 reuses_intermediates=True))
    return tuple(impls)


def backward_impls(op_name: str, traced: tuple[BackwardImpl, ...], *, node: int, mask: int | None,
                   out_bytes: int, profile: OpProfile | None = None,
                   input_node: int | None = None,
                   factors: CatalogFactors = CatalogFactors()) -> tuple[BackwardImpl, ...]:
    """J_hat_k for the stage of forward node `node`; `mask` is its relu mask node, if any;
    `input_node` the node whose output it normalises (batch norm)."""
    if not traced:
        return ()
    default = traced[0]
    impls = list(traced)
    if op_name in RELU_OPS and mask is not None:
        output = BackwardImpl("output-activated", default.compute_us, default.workspace_bytes, default.deps,
                              "output-activated")
        # threshold_backward on a bool mask does the same elementwise work as on the result (x its factor),
        # but first casts the mask to the gradient's dtype: a temporary as large as the result (CPU, torch
        # 2.13: 4x128x1024 float, 2 MiB besides the 2 MiB it returns). Charged on every device (unmeasured
        # elsewhere), so a mask never lets a stage exceed its budget.
        masked_deps = tuple(sorted((set(default.deps) - {node}) | {mask}))
        intermediate = BackwardImpl("intermediate-activated", default.compute_us * factors.relu_intermediate_activated,
                                    default.workspace_bytes + out_bytes, masked_deps, "intermediate-activated")
        impls = [output] + impls[1:] + [intermediate]
    if op_name in BATCH_NORM_OPS and input_node is not None and input_node in default.deps:
        rebuilt_deps = tuple(sorted((set(default.deps) - {input_node}) | {node}))
        impls.append(BackwardImpl("output-activated", default.compute_us * (1.0 + factors.bn_rebuild),
                                  default.workspace_bytes + out_bytes, rebuilt_deps, "output-activated"))
    for p in (profile.backward if profile else ()):
        impls.append(BackwardImpl(p.name, default.compute_us * p.time_factor,
                                  int(round(p.workspace_per_output_byte * out_bytes)), default.deps, default.kind))
    return tuple(impls)


def mask_impl(relu_us: float, factors: CatalogFactors = CatalogFactors()) -> ForwardImpl:
    return ForwardImpl("sign-mask", relu_us * factors.relu_mask, 0, False)


def _dominated(a: tuple[float, int], b: tuple[float, int], b_first: bool) -> bool:
    """a is dominated by b: b no slower and no leaner-less, strictly better somewhere or listed first."""
    no_worse = b[0] <= a[0] and b[1] <= a[1]
    return no_worse and (b[0] < a[0] or b[1] < a[1] or b_first)


def drop_dominated_forward(impls: tuple[ForwardImpl, ...]) -> tuple[tuple[ForwardImpl, ...], int]:
    kept = [impls[0]] + [
        a for n, a in enumerate(impls) if n and not any(
            m != n and (b.inplace, b.reuses_intermediates) == (a.inplace, a.reuses_intermediates) and _dominated((a.compute_us, a.workspace_bytes),
                                                             (b.compute_us, b.workspace_bytes), m < n)
            for m, b in enumerate(impls))
    ]
    return tuple(kept), len(impls) - len(kept)


def drop_dominated_backward(impls: tuple[BackwardImpl, ...]) -> tuple[tuple[BackwardImpl, ...], int]:
    if not impls:
        return impls, 0
    kept = [impls[0]] + [
        a for n, a in enumerate(impls) if n and not any(
            m != n and set(b.deps) == set(a.deps) and _dominated((a.compute_us, a.workspace_bytes),
                                                                 (b.compute_us, b.workspace_bytes), m < n)
            for m, b in enumerate(impls))
    ]
    return tuple(kept), len(impls) - len(kept)


# --------------------------------------------------------------------------------------- allocator rounding

# The CUDA caching allocator hands out blocks in multiples of 512 bytes (c10/cuda/CUDACachingAllocator.cpp:
# kMinBlockSize, round_size), and what it reports (memory_allocated, the profiler's memory events) counts the
# whole block. The CPU allocator reports the bytes asked for (module docstring).
ALLOCATION_GRANULARITY_BYTES = {"cuda": 512}


def allocated_bytes(nbytes: int, device: Any) -> int:
    """What the trace's device's allocator counts for a tensor of `nbytes`: rounded up to its block size."""
    kind = device_kind(device)
    granularity = ALLOCATION_GRANULARITY_BYTES.get(kind, 1)
    return -(-nbytes // granularity) * granularity

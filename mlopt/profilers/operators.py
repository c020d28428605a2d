"""`mlopt profile operators`: per-op, per-implementation compute time and workspace, merged into a trace.

MONeT (chapter 4) profiles every operator of the network for each implementation it may run: its compute
time tau^l and its workspace memory c^l (convolution algorithms trade one for the other). This profiler
does that for a recorded trace, on the device torch has here:

1. Every forward and backward op whose type op_kernels.py rebuilds is rebuilt from its tensors' shapes
   (arguments the trace lacks are inferred or assumed; the notes say which). Ops with equal signatures
   (same type, shapes, dtypes, inferred arguments) are measured once.
2. Each variant of a signature (the default; alternatives the backend exposes: oneDNN off and
   channels-last on CPU, cuDNN autotuned / deterministic / off and channels-last on CUDA; the catalog's
   modelled alternatives as checks) runs `warmup` times, then `repeats` timed runs, taken in turns (one
   run of each variant at a time, so drift on a shared machine falls on all alike): the median is the
   time, the IQR (q3 - q1) the spread.
3. Workspace, once per variant after the timed runs: the memory the call allocates beyond what it
   returns, peak - retained. CPU: the allocations and frees PyTorch's CPU allocator reports to the torch
   profiler (profile_memory=True) while the call runs; CUDA: torch.cuda.max_memory_allocated() against
   memory_allocated() after the call, from a reset peak.
4. The trace gets, per profiled op, its signature's default median as compute_us (and workspace), plus the
   alternatives as further implementations, which the memory planner offers as choices (forward: one
   implementation each; backward: one stage alternative per extra implementation). Medians, spreads,
   notes, the ops kept at their traced times and the catalog checks go to source["operator_profile"].
5. Optionally an mlopt-op-profile document (catalog.py) with per-op-type time_factor and
   workspace_per_output_byte of each alternative, for `mlopt plan memory --ops` on traces that were not
   profiled (e.g. another batch size).

Catalog checks: the catalog models some alternatives from the default's measured time (an out-of-place
ReLU as fast as the in-place one; the sign mask at MASK_TIME_FACTOR of the ReLU; the intermediate-activated
ReLU backward as fast as the default; the batch-norm input rebuild at BN_REBUILD_TIME_FACTOR of the
backward and |x| bytes of workspace; the batch-norm recompute from saved statistics, "reuse-stats", at
BN_REUSE_STATS_TIME_FACTOR of the training forward, also checked once per op against the training output).
Those names are the catalog's, so they cannot come from the trace or a profile; they are measured here and
reported next to the catalog's constants.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from mlopt.errors import InputError
from mlopt.formats.trace import Implementation, ModelTrace, Op, validate_trace
from mlopt.planners.memory import catalog

PROFILER_NAME = "mlopt profile operators"
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 2
QUICK_REPEATS = 5
QUICK_WARMUP = 1
MIN_REPEATS = 3  # an IQR needs a few samples
PROFILE_FORMAT = "mlopt-op-profile"
PROFILE_VERSION = "1.0"

Progress = Callable[[int, int, str], None]  # (done, total, what is being measured)


@dataclass(frozen=True)
class ProfileOptions:
    device: str = "auto"  # auto | cpu | cuda
    repeats: int | None = None  # None: DEFAULT_REPEATS (QUICK_REPEATS with quick)
    warmup: int | None = None
    quick: bool = False
    alternatives: bool = True  # measure and merge the backend's alternative implementations
    seed: int = 0
    threads: int | None = None  # torch CPU threads while measuring; None: torch's current setting

    @property
    def timed_runs(self) -> int:
        return self.repeats if self.repeats is not None else (QUICK_REPEATS if self.quick else DEFAULT_REPEATS)

    @property
    def warmup_runs(self) -> int:
        return self.warmup if self.warmup is not None else (QUICK_WARMUP if self.quick else DEFAULT_WARMUP)


@dataclass(frozen=True)
class Stats:
    """Timed runs of one variant, in microseconds."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3

    @property
    def iqr(self) -> float:
        q1, q3 = self.quartiles
        return q3 - q1

    def to_dict(self) -> dict[str, Any]:
        q1, q3 = self.quartiles
        return {"median_us": round(self.median, 3), "q1_us": round(q1, 3), "q3_us": round(q3, 3),
                "iqr_us": round(q3 - q1, 3), "min_us": round(min(self.samples), 3),
                "max_us": round(max(self.samples), 3), "runs": len(self.samples)}


@dataclass(frozen=True)
class VariantResult:
    name: str
    role: str  # default | alternative | check
    stats: Stats
    workspace_bytes: int | None  # None: not measured
    verified: dict[str, bool] | None = None  # the variant's one-off correctness check (Variant.verify), if any

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "role": self.role, **self.stats.to_dict(), "workspace_bytes": self.workspace_bytes}
        if self.verified is not None:
            out["verified"] = self.verified
        return out


@dataclass
class SignatureResult:
    signature: str
    op_name: str
    phase: str  # forward | backward
    op_ids: list[int]
    notes: tuple[str, ...]
    variants: list[VariantResult] = field(default_factory=list)
    traced_us: list[float] = field(default_factory=list)  # the ops' compute_us in the input trace
    dropped: list[str] = field(default_factory=list)  # variants that failed to run

    @property
    def default(self) -> VariantResult:
        return self.variants[0]

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        traced = [t for t in self.traced_us if t is not None]
        return {
            "signature": self.signature, "op": self.op_name, "phase": self.phase, "op_ids": self.op_ids,
            "notes": list(self.notes), "variants": [v.to_dict() for v in self.variants],
            "traced_median_us": round(statistics.median(traced), 3) if traced else None,
            "dropped_variants": self.dropped,
        }


@dataclass
class OperatorProfile:
    trace: ModelTrace  # the input trace with the measurements merged
    results: list[SignatureResult]
    kept: dict[str, dict[str, int]]  # reason -> op name -> ops left at their traced time
    device: str
    device_name: str
    repeats: int
    warmup: int
    ops_profile: dict[str, Any]  # mlopt-op-profile document
    catalog_checks: dict[str, Any]
    wall_s: float

    def rows(self) -> list[dict[str, Any]]:
        """One row per (op type, phase): ops, signatures, summed medians, relative spread, alternatives."""
        groups: dict[tuple[str, str], list[SignatureResult]] = defaultdict(list)
        for r in self.results:
            groups[(r.op_name, r.phase)].append(r)
        rows = []
        for (name, phase), results in sorted(groups.items(), key=lambda kv: (kv[0][1] != "forward", kv[0][0])):
            ops = sum(len(r.op_ids) for r in results)
            total = sum(r.default.stats.median * len(r.op_ids) for r in results)
            traced = sum(t for r in results for t in r.traced_us if t is not None)
            spreads = [r.default.stats.iqr / r.default.stats.median for r in results if r.default.stats.median > 0]
            workspace = max((r.default.workspace_bytes or 0 for r in results), default=0)
            alternatives: dict[str, float] = {}
            for alt in sorted({v.name for r in results for v in r.variants if v.role == "alternative"}):
                pairs = [(r.default.stats.median, r.variant(alt).stats.median, len(r.op_ids))
                         for r in results if r.variant(alt) is not None]
                base = sum(d * n for d, _, n in pairs)
                if base > 0:
                    alternatives[alt] = round(sum(a * n for _, a, n in pairs) / base, 3)
            rows.append({
                "op": name, "phase": phase, "ops": ops, "signatures": len(results),
                "median_us": round(statistics.median(r.default.stats.median for r in results), 3),
                "total_us": round(total, 3), "traced_total_us": round(traced, 3),
                "spread": round(statistics.median(spreads), 4) if spreads else 0.0,
                "max_workspace_bytes": workspace, "alternatives": alternatives,
            })
        return rows

    def summary(self) -> dict[str, Any]:
        return {
            "device": self.device, "device_name": self.device_name, "repeats": self.repeats, "warmup": self.warmup,
            "profiled_ops": sum(len(r.op_ids) for r in self.results), "signatures": len(self.results),
            "kept_traced": {reason: dict(sorted(names.items())) for reason, names in sorted(self.kept.items())},
            "rows": self.rows(), "catalog_checks": self.catalog_checks, "wall_s": round(self.wall_s, 3),
        }


# ----------------------------------------------------------------------------------------------------
# Device and measurement


def _torch() -> Any:
    try:
        import torch  # lazy: torch is an optional dependency (the torch extra)
    except ImportError as exc:
        raise InputError("--device", "torch",
                         f"profiling operators needs PyTorch: pip install 'mlopt[torch]' ({exc})") from None
    return torch


def resolve_device(name: str) -> Any:
    torch = _torch()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        build = ", a CPU build" if torch.version.cuda is None else ""
        raise InputError("--device", "cuda", f"CUDA is not available here (torch {torch.__version__}{build}); "
                                             "use --device cpu")
    if name not in ("cpu", "cuda"):
        raise InputError("--device", name, "expected auto, cpu or cuda")
    return torch.device(name)


def device_description(device: Any, threads: int) -> str:
    torch = _torch()
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU, {threads} torch thread{'s' if threads != 1 else ''} (torch {torch.__version__})"


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (kineto prints 'profiler_start/stop' lines from C++ on every session)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _sync(device: Any) -> None:
    if device.type == "cuda":
        _torch().cuda.synchronize(device)


def _timed_run(fn: Callable[[], Any], device: Any) -> float:
    """Microseconds of one call (CUDA: synchronised before and after)."""
    _sync(device)
    start = time.perf_counter_ns()
    result = fn()
    _sync(device)
    elapsed = (time.perf_counter_ns() - start) / 1000.0
    del result
    return elapsed


def _workspace_cpu(calls: list[tuple[Any, Callable[[], Any]]]) -> list[int | None]:
    """Per call: peak - retained of the CPU allocator's reports while it runs (one profiler session)."""
    # lazy: torch is an optional dependency (the torch extra)
    from torch.profiler import ProfilerActivity, profile, record_function

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    try:
        with _quiet_stderr():
            prof.__enter__()
    except RuntimeError:  # another profiler session is active in this process: no workspace measurement
        return [None] * len(calls)
    try:
        for n, (variant, fn) in enumerate(calls):
            with variant.context():
                with record_function(f"mlopt-probe-{n}"):
                    result = fn()
                del result
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    try:
        events = list(prof.profiler.kineto_results.events())
        ranges = {e.name(): (e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
                  if e.name().startswith("mlopt-probe-")}
        memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except AttributeError:  # a torch whose profiler results do not expose memory events this way
        return [None] * len(calls)
    out: list[int | None] = []
    for n in range(len(calls)):
        window = ranges.get(f"mlopt-probe-{n}")
        if window is None:
            out.append(None)
            continue
        running = peak = 0
        for stamp, nbytes in memory:
            if window[0] <= stamp <= window[1]:
                running += nbytes
                peak = max(peak, running)
        out.append(max(0, peak - running))
    return out


def _workspace_cuda(calls: list[tuple[Any, Callable[[], Any]]], device: Any) -> list[int | None]:
    torch = _torch()
    out: list[int | None] = []
    for variant, fn in calls:
        with variant.context():
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            result = fn()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            retained = torch.cuda.memory_allocated(device)
            del result
        out.append(max(0, peak - retained))
    return out


def _other_runnable() -> int | None:
    """Processes runnable besides this one, now (median of a few reads of /proc/loadavg; None elsewhere)."""
    counts = []
    for _ in range(5):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)  # the reader itself is running
        except (OSError, ValueError, IndexError):
            return None
        time.sleep(0.01)
    return max(0, int(statistics.median(counts)))


def _busy_machine_warning(device: Any, threads: int) -> int | None:
    """A warning when other processes already run on the cores torch's threads need (every parallel kernel
    then waits for a descheduled thread and CPU times inflate many-fold); returns their count."""
    others = _other_runnable()
    cores = os.cpu_count() or 1
    if others is not None and device.type == "cpu" and threads > 1 and others > cores - threads:
        warnings.warn(f"{others} other process{'es' if others != 1 else ''} running on {cores} cores while torch "
                      f"runs {threads} threads: CPU times will be inflated and noisy (see the IQR); --threads 1 is "
                      "steadier", stacklevel=3)
    return others


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160] if text else ''}"


def measure(bench: Any, device: Any, warmup: int, repeats: int) -> tuple[list[VariantResult], list[str]]:
    """Time every variant of a bench, then probe its workspace. NotRebuilt when the default does not run
    or returns the wrong size; a failing alternative or check is dropped and named.

    Each variant is set up and warmed up first (the first run also checks the result's size); the timed
    runs then go round the variants, one run of each at a time, so that drift on a shared machine (other
    processes, frequency changes) falls on all of them alike rather than on whichever ran last."""
    from mlopt.profilers import op_kernels  # lazy: op_kernels imports torch, an optional dependency (the torch extra)

    torch = _torch()
    ready: list[tuple[Any, Callable[[], Any]]] = []
    verified: list[dict[str, bool] | None] = []
    dropped: list[str] = []
    for n, variant in enumerate(bench.variants):
        try:
            with torch.no_grad(), variant.context():
                fn = variant.make()
                first = fn()
                if n == 0 and bench.expected_numel is not None:
                    leaves = [t for t in (first if isinstance(first, (tuple, list)) else (first,))
                              if isinstance(t, torch.Tensor)]
                    if not leaves or leaves[0].numel() != bench.expected_numel:
                        got = leaves[0].numel() if leaves else 0
                        raise op_kernels.NotRebuilt(f"rebuilt call returns {got} elements, the trace "
                                                    f"{bench.expected_numel}")
                del first
                for _ in range(warmup - 1):
                    fn()
                checked = variant.verify() if variant.verify is not None else None
                _sync(device)
        except op_kernels.NotRebuilt:
            raise
        except Exception as error:  # noqa: BLE001 - a rebuilt call the backend refuses
            if n == 0:
                raise op_kernels.NotRebuilt(f"rebuilt call failed ({_first_line(error)})") from error
            dropped.append(f"{variant.name}: {_first_line(error)}")
            continue
        ready.append((variant, fn))
        verified.append(checked)
    samples: list[list[float]] = [[] for _ in ready]
    for _ in range(repeats):
        for k, (variant, fn) in enumerate(ready):
            with torch.no_grad(), variant.context():
                samples[k].append(_timed_run(fn, device))
    with torch.no_grad():
        workspaces = _workspace_cuda(ready, device) if device.type == "cuda" else _workspace_cpu(ready)
    results = [VariantResult(variant.name, variant.role, Stats(tuple(times)), ws, checked)
               for (variant, _), times, ws, checked in zip(ready, samples, workspaces, verified)]
    return results, dropped


# ----------------------------------------------------------------------------------------------------
# The trace


def _op_tensors(trace: ModelTrace) -> dict[int, Any]:
    # lazy: op_kernels imports torch, an optional dependency (the torch extra)
    from mlopt.profilers.op_kernels import OpTensors

    tensors = trace.tensor_map()
    by_id: dict[int, Any] = {}
    for op in trace.ops:
        by_id[op.id] = OpTensors(op, tuple(tensors[t] for t in op.inputs), tuple(tensors[t] for t in op.outputs))
    return by_id


def _plan(trace: ModelTrace, source: str, device: Any, alternatives: bool):
    """Benches by signature (ops in trace order), ops kept at their traced time by reason."""
    from mlopt.profilers import op_kernels  # lazy: op_kernels imports torch, an optional dependency (the torch extra)

    tensors = trace.tensor_map()
    tensor_index = {t.id: i for i, t in enumerate(trace.tensors)}
    op_tensors = _op_tensors(trace)
    if not any(t.shape for t in trace.tensors):  # a trace without shapes (scalars alone would still "fit")
        for op in trace.ops:
            if op.role in ("forward", "backward") and op_kernels.supported(op.name):
                for t in (*op.inputs, *op.outputs):
                    if tensors[t].bytes > op_kernels.itemsize(tensors[t].dtype):
                        raise InputError(source, f"$.tensors[{tensor_index[t]}].shape",
                                         f"tensor {t} (of op {op.id}, {op.name}) has no shape, nor has any tensor of "
                                         "the trace; profiling rebuilds each op from its tensors' shapes (trace the "
                                         "model with `mlopt trace MODULE:CALLABLE`, or import an ET that records them)")
    benches: dict[str, Any] = {}
    members: dict[str, list[Op]] = defaultdict(list)
    kept: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    missing_shape: tuple[int, Op] | None = None
    for op in trace.ops:
        if op.role not in ("forward", "backward"):
            continue
        if not op_kernels.supported(op.name):
            kept["op type not rebuilt by this profiler"][op.name] += 1
            continue
        try:
            bench = op_kernels.build(op_tensors[op.id], device, alternatives=alternatives)
        except op_kernels.NotRebuilt as why:
            kept[why.reason][op.name] += 1
            if why.tensor is not None and missing_shape is None:
                missing_shape = (why.tensor, op)
            continue
        key = f"{op.role}: {bench.signature}"  # a kernel run in forward and in backward is two entries
        benches.setdefault(key, bench)
        members[key].append(op)
    if not benches:
        if missing_shape is not None:
            tensor_id, op = missing_shape
            t = tensors[tensor_id]
            field_name = "dtype" if t.dtype not in op_kernels.ITEMSIZE else "shape"
            raise InputError(source, f"$.tensors[{tensor_index[tensor_id]}].{field_name}",
                             f"tensor {tensor_id} (read or written by op {op.id}, {op.name}) has no {field_name}; "
                             "profiling rebuilds each op from its tensors' shapes and dtypes (trace the model with "
                             "`mlopt trace MODULE:CALLABLE`, or import an ET that records them)")
        seen = sorted({op.name for op in trace.ops if op.role in ("forward", "backward")})
        raise InputError(source, "$.ops", "no forward or backward op this profiler can rebuild (op types: "
                                          f"{', '.join(seen[:12]) or 'none'}{', ...' if len(seen) > 12 else ''})")
    return benches, members, kept


def merge(trace: ModelTrace, results: list[SignatureResult], metadata: dict[str, Any]) -> ModelTrace:
    """The trace with each profiled op's implementations replaced: its default's measured median and
    workspace under the default's name, then the alternatives; metadata into source["operator_profile"]."""
    by_op: dict[int, SignatureResult] = {op_id: r for r in results for op_id in r.op_ids}
    ops = []
    for op in trace.ops:
        r = by_op.get(op.id)
        if r is None:
            ops.append(op)
            continue
        default_name = op.implementations[0].name
        impls = [Implementation(default_name, round(r.default.stats.median, 3), r.default.workspace_bytes or 0)]
        impls += [Implementation(v.name, round(v.stats.median, 3), v.workspace_bytes or 0)
                  for v in r.variants if v.role == "alternative" and v.name != default_name]
        ops.append(replace(op, implementations=tuple(impls)))
    merged = replace(trace, ops=tuple(ops), source={**trace.source, "operator_profile": metadata})
    validate_trace(merged, "<profiled trace>")
    return merged


# ----------------------------------------------------------------------------------------------------
# Derived documents


def _primary_output_bytes(trace: ModelTrace) -> dict[int, int]:
    """Bytes of each forward op's node value (its first activation output, or the tensor it overwrites)."""
    tensors = trace.tensor_map()
    out: dict[int, int] = {}
    for op in trace.ops:
        if op.role != "forward":
            continue
        acts = [t for t in op.outputs if tensors[t].kind == "activation" and tensors[t].bytes > 0]
        overwritten = [t for t in acts if t in op.inputs]
        if acts:
            out[op.id] = tensors[(overwritten or acts)[0]].bytes
    return out


def ops_profile_document(trace: ModelTrace, results: list[SignatureResult]) -> dict[str, Any]:
    """Per op type and phase, each alternative as the catalog's profile entry:

    time_factor = summed (over the type's ops) time with the alternative / summed default time, where a
    backward op's time is its stage's (the backward ops paired with the same forward op, as the memory
    planner groups them), so the factor scales what the planner scales; workspace_per_output_byte = the
    largest alternative workspace / the forward op's output bytes (conservative: no op is under-charged)."""
    out_bytes = _primary_output_bytes(trace)
    by_op = {op.id: op for op in trace.ops}
    stage_us: dict[int, float] = defaultdict(float)
    for op in trace.ops:
        if op.role == "backward" and op.forward_op is not None and op.implementations[0].compute_us is not None:
            stage_us[op.forward_op] += op.implementations[0].compute_us
    entries: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        for v in r.variants:
            if v.role != "alternative":
                continue
            acc = entries[r.op_name if r.phase == "forward" else _forward_name(r, by_op)][r.phase].setdefault(
                v.name, [0.0, 0.0, 0.0])
            for op_id in r.op_ids:
                op = by_op[op_id]
                anchor = op.id if r.phase == "forward" else op.forward_op
                if anchor is None:
                    continue
                base = r.default.stats.median if r.phase == "forward" else stage_us.get(anchor, 0.0)
                if base <= 0:
                    continue
                acc[0] += base
                acc[1] += base - r.default.stats.median + v.stats.median
                size = out_bytes.get(anchor, 0)
                if size and v.workspace_bytes:
                    acc[2] = max(acc[2], v.workspace_bytes / size)
    ops: dict[str, Any] = {}
    for op_name, phases in sorted(entries.items()):
        spec = {}
        for phase, impls in phases.items():
            listed = [{"name": name, "time_factor": round(after / before, 4),
                       "workspace_per_output_byte": round(per_byte, 4)}
                      for name, (before, after, per_byte) in sorted(impls.items()) if before > 0 and after > 0]
            if listed:
                spec[phase] = listed
        if spec:
            ops[op_name] = spec
    return {"format": PROFILE_FORMAT, "schema_version": PROFILE_VERSION, "ops": ops}


def _forward_name(r: SignatureResult, by_op: dict[int, Op]) -> str:
    """The op type a backward result belongs to in the catalog: its forward op's name."""
    for op_id in r.op_ids:
        forward = by_op[op_id].forward_op
        if forward is not None and forward in by_op:
            return by_op[forward].name
    return r.op_name


def catalog_checks(results: list[SignatureResult]) -> dict[str, Any]:
    """Measured counterparts of the catalog's modelled costs (time-weighted over the ops)."""
    def ratio(op_names: set[str], variant: str, minus_one: bool = False) -> tuple[float | None, int]:
        num = den = 0.0
        count = 0
        for r in results:
            v = r.variant(variant)
            if r.op_name in op_names and v is not None and r.default.stats.median > 0:
                n = len(r.op_ids)
                num += v.stats.median * n
                den += r.default.stats.median * n
                count += n
        if not den:
            return None, 0
        value = num / den - (1.0 if minus_one else 0.0)
        return round(value, 4), count

    def all_verified(op_name: str, variant: str, key: str) -> bool:
        found = [r.variant(variant).verified for r in results if r.op_name == op_name and r.variant(variant)]
        return bool(found) and all(v is not None and v.get(key, False) for v in found)

    def extra_workspace(op_name: str, variant: str) -> int:
        return max(((r.variant(variant).workspace_bytes or 0) - (r.default.workspace_bytes or 0)
                    for r in results if r.op_name == op_name and r.variant(variant) is not None), default=0)

    checks: dict[str, Any] = {}
    value, n = ratio({"aten::relu_"}, "outofplace")
    if n:
        checks["relu_outofplace_time_factor"] = {"measured": value, "catalog": 1.0, "ops": n,
                                                 "meaning": "out-of-place / in-place ReLU time"}
    value, n = ratio({"aten::relu"}, "inplace")
    if n:
        checks["relu_inplace_time_factor"] = {"measured": value, "catalog": 1.0, "ops": n,
                                              "meaning": "in-place / out-of-place ReLU time"}
    value, n = ratio({"aten::relu", "aten::relu_"}, "sign-mask")
    if n:
        checks["relu_mask_time_factor"] = {"measured": value, "catalog": catalog.MASK_TIME_FACTOR, "ops": n,
                                           "meaning": "sign mask (result > 0) / ReLU time"}
    value, n = ratio({"aten::threshold_backward"}, "intermediate-activated")
    if n:
        checks["relu_intermediate_activated_time_factor"] = {
            "measured": value, "catalog": 1.0, "ops": n,
            "meaning": "threshold_backward on the bool mask / on the result",
            "extra_workspace_bytes_max": extra_workspace("aten::threshold_backward", "intermediate-activated")}
    value, n = ratio({"aten::native_batch_norm_backward"}, "output-activated", minus_one=True)
    if n:
        checks["bn_rebuild_time_factor"] = {
            "measured": value, "catalog": catalog.BN_REBUILD_TIME_FACTOR, "ops": n,
            "meaning": "(rebuild + backward) / backward - 1, the extra time of the output-activated batch-norm "
                       "backward (the catalog charges |x| bytes more workspace)",
            "extra_workspace_bytes_max": extra_workspace("aten::native_batch_norm_backward", "output-activated")}
    value, n = ratio({"aten::native_batch_norm"}, catalog.BN_REUSE_STATS)
    if n:
        checks["bn_reuse_stats_time_factor"] = {
            "measured": value, "catalog": catalog.BN_REUSE_STATS_TIME_FACTOR, "ops": n,
            "meaning": "recompute from the saved mean/invstd (scale = invstd * gamma, shift = beta - mean * scale, "
                       "one addcmul over |x|) / training batch-norm forward",
            "matches_training_output": all_verified("aten::native_batch_norm", catalog.BN_REUSE_STATS,
                                                    "matches_training_output"),
            "bit_identical": all_verified("aten::native_batch_norm", catalog.BN_REUSE_STATS, "bit_identical")}
    return checks


# ----------------------------------------------------------------------------------------------------
# Entry point


def _measure_all(benches: dict[str, Any], members: dict[str, list[Op]], kept: dict[str, dict[str, int]],
                 device: Any, options: ProfileOptions, progress: Progress | None) -> list[SignatureResult]:
    from mlopt.profilers import op_kernels  # lazy: op_kernels imports torch, an optional dependency (the torch extra)

    torch = _torch()
    report = progress or (lambda done, total, what: None)
    results: list[SignatureResult] = []
    total = len(benches)
    for done, (key, bench) in enumerate(benches.items()):
        ops = members[key]
        report(done, total, f"{ops[0].name} ({ops[0].role})")
        torch.manual_seed(options.seed)
        try:
            variants, dropped = measure(bench, device, options.warmup_runs, options.timed_runs)
        except op_kernels.NotRebuilt as why:
            for op in ops:
                kept[why.reason][op.name] += 1
            continue
        results.append(SignatureResult(bench.signature, ops[0].name, ops[0].role, [op.id for op in ops], bench.notes,
                                       variants, [op.implementations[0].compute_us for op in ops], dropped))
    report(total, total, "done")
    return results


def profile_operators(trace: ModelTrace, options: ProfileOptions = ProfileOptions(), *, source: str = "<trace>",
                      progress: Progress | None = None) -> OperatorProfile:
    """Measure the trace's ops on options.device and merge the results (see the module docstring)."""
    torch = _torch()
    layout = trace.source.get("memory_format") if isinstance(trace.source, dict) else None
    if layout not in (None, "contiguous"):
        raise InputError(source, "$.source.memory_format",
                         f"a {layout} trace cannot be profiled yet: its ops would be re-measured on contiguous "
                         "operands; plan on its traced times")
    device = resolve_device(options.device)
    repeats, warmup = options.timed_runs, options.warmup_runs
    if repeats < MIN_REPEATS:
        raise InputError("--repeats", str(repeats), f"at least {MIN_REPEATS} timed runs are needed for a spread")
    started = time.perf_counter()
    benches, members, kept = _plan(trace, source, device, options.alternatives)
    previous_threads = torch.get_num_threads()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    others = _busy_machine_warning(device, torch.get_num_threads())
    try:
        results = _measure_all(benches, members, kept, device, options, progress)
    finally:
        threads = torch.get_num_threads()
        torch.set_num_threads(previous_threads)
    if not results:
        raise InputError(source, "$.ops", "no op could be rebuilt and run: "
                                          + "; ".join(sorted(kept))[:300])
    checks = catalog_checks(results)
    device_name = device_description(device, threads)
    metadata = {
        "profiler": PROFILER_NAME, "device": device.type, "device_name": device_name, "torch": torch.__version__,
        "threads": threads, "other_runnable_processes": others, "repeats": repeats, "warmup": warmup,
        "quick": options.quick,
        "alternatives": options.alternatives, "seed": options.seed,
        "time": "median of the timed runs (us); spread: iqr_us = q3 - q1",
        "workspace": ("torch.cuda max_memory_allocated - memory_allocated after the call" if device.type == "cuda"
                      else "torch.profiler CPU allocator events during the call: peak - retained"),
        "measurements": [r.to_dict() for r in results],
        "kept_traced": {reason: dict(sorted(names.items())) for reason, names in sorted(kept.items())},
        "catalog_checks": checks,
    }
    merged = merge(trace, results, metadata)
    document = ops_profile_document(merged, results)
    return OperatorProfile(merged, results, {k: dict(v) for k, v in kept.items()}, device.type, device_name, repeats,
                           warmup, document, checks, time.perf_counter() - started)

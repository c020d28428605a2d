"""`mlopt profile contention`: overlapped and non-overlapped samples for LIBRA's contention model (eq. 5-6).

LIBRA (paper 004) fits g(b, r) = b / (alpha1 - alpha2 r) to computation that runs beside an all-reduce given
r communication threads, p(c, r) to all-reduces that run beside computation and q(c, r) to all-reduces that
run alone (mlopt/planners/threads/contention.py). This module measures those three kinds of samples on this
machine, fits them with `contention.fit`, and writes an `mlopt.contention-samples` document that
`mlopt plan threads --contention` reads (it refits the same samples).

Experiment, for every thread count r, all-reduce size c and repeat (rounds interleaved: repeat outermost,
then size, then r, so slow drift of the machine spreads over every r instead of biasing one):

1. compute alone                                     -> b (us)
2. compute while all-reduces run back to back        -> a `compute` sample (r, b, measured)
3. `comm_runs` all-reduces while compute runs        -> `overlapped_comm` (r, c_hat, measured)
4. `comm_runs` all-reduces alone                     -> `exposed_comm` (r, c_hat, measured)
5. `comm_runs` tiny all-reduces alone                -> the startup a at r (`startup_us`: the fastest)

c_hat = 2(N-1)/N c (ring all-reduce, eq. 4). A sample is the median over its repeats (compute: the median
of b and of the measured time over the rounds; communication: the median of every timed all-reduce);
`meta.measurements[i]` gives sample i's spread (n, min, quartiles, max, relative IQR), so the document
stays loadable by `contention.load_samples`, which accepts no extra sample fields.

Devices (`measure_cpu`, `measure_cuda`; both return `Point`s, assembled and fitted by the shared code):

* cpu: ranks are threads of this process running the ring all-reduce XML (the collective baselines'
  `ring` on a fully connected topology, lowered to MSCCL-EF) on the runtime's CPU interpreter; r is the
  interpreter's worker threads (`LocalComm.run(..., threads=r)`), the analogue of NCCL_NTHREADS: the
  threads that move and reduce the data. The computation is a float32 numpy matmul loop of a fixed amount
  of work on `compute_workers` processes of one BLAS thread each (default: one per core this process may
  use), so it occupies every core as a GPU kernel occupies every SM, and each worker thread given to the
  all-reduce competes with it for the cores, caches and memory bandwidth. Processes, not threads: see
  `_COMPUTE_WORKER`.
* cuda: torch.distributed NCCL all-reduce, one process per GPU, fresh processes per r (NCCL reads
  NCCL_NTHREADS when a communicator is created): r = NCCL_NTHREADS x channels (NCCL_MIN/MAX_NCHANNELS,
  NCCL_MIN/MAX_CTAS), Simple protocol, ring algorithm; the computation is a float16 matmul loop on a
  stream of its own; times from CUDA events. Needs two GPUs or more: NCCL refuses two ranks of one
  communicator on the same GPU ("Duplicate GPU detected").
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

from mlopt.errors import InputError, MloptError
from mlopt.formats.io import write_json
from mlopt.formats.msccl_xml import write_program
from mlopt.formats.sizes import format_size, parse_size_range
from mlopt.formats.topology import fully_connected
from mlopt.native import binding as native
from mlopt.planners.collective.baselines import ring
from mlopt.planners.collective.lowering import LoweringError, lower
from mlopt.planners.threads import contention
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.plots import _save

MIB = 1 << 20
DEVICES = ("cpu", "cuda")
ELEMENT_BYTES = 4  # float32 all-reduce buffers
NCCL_NTHREADS_CHOICES = (512, 256, 128, 64)  # largest first
NCCL_MAX_CHANNELS = 32
MIN_POINTS = max(len(v) for v in contention.FITTED.values()) + 1  # samples a communication fit needs
MIN_THREAD_COUNTS = max(contention.MIN_DISTINCT_THREADS.values())

Progress = Callable[[str], None]


class ProfileError(MloptError):
    """The measurement itself failed (a wrong all-reduce result, a worker that died): exit code 1."""

    exit_code = 1


# ------------------------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class ProfileConfig:
    device: str = "cpu"
    ranks: int = 4
    threads: tuple[int, ...] = (1, 2, 4, 8)  # r: CPU interpreter workers, or NCCL threads on CUDA
    sizes: tuple[int, ...] = (1 * MIB, 8 * MIB)  # all-reduce bytes per rank (c)
    repeats: int = 5  # rounds per (r, size)
    comm_runs: int = 5  # timed all-reduces per phase and round
    compute_ms: float = 100.0  # the computation's length alone (calibrated to whole matmuls)
    compute_workers: int = 0  # CPU: matmul processes, one BLAS thread each (0: one per usable core)
    matrix: int = 256  # matmul side (CPU float32; CUDA float16)
    quick: bool = False


DEFAULTS = {
    ("cpu", False): ProfileConfig(),
    ("cpu", True): ProfileConfig(threads=(1, 2, 4), sizes=(1 * MIB, 4 * MIB), repeats=3, comm_runs=5,
                                 compute_ms=30.0, quick=True),
    ("cuda", False): ProfileConfig(device="cuda", ranks=0, threads=(128, 256, 512, 1024, 2048, 4096),
                                   sizes=(8 * MIB, 64 * MIB), repeats=5, comm_runs=10, compute_ms=20.0,
                                   matrix=4096),
    ("cuda", True): ProfileConfig(device="cuda", ranks=0, threads=(128, 512, 2048), sizes=(8 * MIB, 32 * MIB),
                                  repeats=3, comm_runs=5, compute_ms=10.0, matrix=4096, quick=True),
}


def parse_threads(text: str, source: str = "--threads") -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): positive integers, sorted, without duplicates."""
    try:
        values = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise InputError(source, "$", f"{text!r} is not a list of thread counts like 1,2,4,8") from None
    if not values:
        raise InputError(source, "$", "the thread set is empty")
    if values[0] < 1:
        raise InputError(source, "$", f"thread counts must be >= 1, found {values[0]}")
    return tuple(values)


def parse_sizes(text: str, source: str = "--sizes") -> tuple[int, ...]:
    """'1MiB,8MiB' or '1MiB..64MiB' (x4 steps) -> bytes, sorted, without duplicates."""
    sizes = tuple(sorted(set(parse_size_range(str(text), source))))
    if not sizes:
        raise InputError(source, "$", "no sizes given")
    return sizes


def nccl_threads(threads: int) -> tuple[int, int]:
    """r -> (NCCL_NTHREADS, channels) with NCCL_NTHREADS x channels = r: the largest NCCL_NTHREADS (512, 256,
    128, 64) dividing r with at most 32 channels; ValueError when none does."""
    for n in NCCL_NTHREADS_CHOICES:
        if threads % n == 0 and 1 <= threads // n <= NCCL_MAX_CHANNELS:
            return n, threads // n
    raise ValueError(f"{threads} is not NCCL_NTHREADS (64, 128, 256, 512) x channels (1..{NCCL_MAX_CHANNELS})")


def nccl_env(threads: int) -> dict[str, str]:
    """The environment of one CUDA run: r threads as NCCL_NTHREADS x channels, Simple protocol, ring."""
    n, channels = nccl_threads(threads)
    return {"NCCL_NTHREADS": str(n), "NCCL_MIN_NCHANNELS": str(channels), "NCCL_MAX_NCHANNELS": str(channels),
            "NCCL_MIN_CTAS": str(channels), "NCCL_MAX_CTAS": str(channels), "NCCL_PROTO": "Simple",
            "NCCL_ALGO": "Ring"}


def make_config(device: str = "cpu", quick: bool = False, **given: Any) -> ProfileConfig:
    """The defaults of (device, quick) with the given options (None: default), checked; InputError naming the
    option (--threads, --sizes, ...) otherwise."""
    if device not in DEVICES:
        raise InputError("--device", "$", f"{device!r} is not one of {', '.join(DEVICES)}")
    base = DEFAULTS[(device, bool(quick))]
    known = {f for f in ProfileConfig.__dataclass_fields__ if f not in ("device", "quick")}
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(unknown)}")
    config = replace(base, **{k: v for k, v in given.items() if v is not None})
    config = replace(config, threads=tuple(sorted(set(int(r) for r in config.threads))),
                     sizes=tuple(sorted(set(int(s) for s in config.sizes))))
    if not config.threads or config.threads[0] < 1:
        raise InputError("--threads", "$", "thread counts must be positive integers")
    if len(config.threads) < MIN_THREAD_COUNTS:
        raise InputError("--threads", "$", f"needs at least {MIN_THREAD_COUNTS} distinct thread counts (the "
                         f"communication fits have 3 parameters), found {len(config.threads)}")
    if not config.sizes or config.sizes[0] < 1:
        raise InputError("--sizes", "$", "sizes must be positive")
    points = len(config.threads) * len(config.sizes)
    if points < MIN_POINTS:
        raise InputError("--sizes", "$", f"the fits need at least {MIN_POINTS} (thread count, size) points, "
                         f"found {points}: add a size or a thread count")
    if config.repeats < 1:
        raise InputError("--repeats", "$", f"must be >= 1, found {config.repeats}")
    if config.comm_runs < 1:
        raise InputError("--comm-runs", "$", f"must be >= 1, found {config.comm_runs}")
    if not (math.isfinite(config.compute_ms) and config.compute_ms > 0):
        raise InputError("--compute-ms", "$", f"must be > 0, found {config.compute_ms}")
    if config.compute_workers < 0:
        raise InputError("--compute-workers", "$", f"must be >= 0, found {config.compute_workers}")
    if config.matrix < 8:
        raise InputError("--matrix", "$", f"must be >= 8, found {config.matrix}")
    if device == "cpu":
        if config.ranks < 2:
            raise InputError("--ranks", "$", f"an all-reduce needs at least 2 ranks, found {config.ranks}")
    else:
        if config.ranks != 0 and config.ranks < 2:
            raise InputError("--ranks", "$", f"an all-reduce needs at least 2 ranks (GPUs), found {config.ranks}")
        for r in config.threads:
            try:
                nccl_threads(r)
            except ValueError as exc:
                raise InputError("--threads", "$", str(exc)) from None
    return config


def c_hat_bytes(size_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce of size_bytes (eq. 4): 2(N-1)/N c."""
    return 2.0 * (ranks - 1) / ranks * float(size_bytes)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------------------------------------ measurements


@dataclass
class Point:
    """The raw measurements at one (threads, size), every list one value per timed run (us)."""

    threads: int
    size_bytes: int  # all-reduce bytes per rank as run (c)
    b_us: list[float] = field(default_factory=list)  # compute alone, one per round
    compute_us: list[float] = field(default_factory=list)  # compute beside back-to-back all-reduces
    overlapped_us: list[float] = field(default_factory=list)  # all-reduces beside compute
    exposed_us: list[float] = field(default_factory=list)  # all-reduces alone
    startup_us: list[float] = field(default_factory=list)  # tiny all-reduces alone

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Point":
        return Point(int(d["threads"]), int(d["size_bytes"]),
                     *[[float(x) for x in d.get(name, [])] for name in
                       ("b_us", "compute_us", "overlapped_us", "exposed_us", "startup_us")])


def spread(values: Sequence[float]) -> dict[str, Any]:
    """n, median, min, quartiles, max (us) and the relative inter-quartile range of repeated measurements."""
    v = np.asarray(values, dtype=float)
    q1, med, q3 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    return {"n": int(v.size), "median_us": med, "min_us": float(v.min()), "max_us": float(v.max()),
            "q1_us": q1, "q3_us": q3, "rel_iqr": (q3 - q1) / med if med > 0 else None}


def assemble(points: Sequence[Point], ranks: int) -> tuple[list[contention.Sample], list[dict[str, Any]]]:
    """Samples (medians) from raw measurements, and one row per sample with its spread (meta.measurements).

    Order: every compute sample, then overlapped, then exposed, each by (size, threads). The startup of a
    communication sample is the fastest tiny all-reduce at its r (pooled over sizes: a fixed cost, which
    scheduling delays only lengthen; a median would move the noise of a few-microsecond run into the
    startup and blow up the rates derived from t - a); it is dropped (0, with a note in the row) where it
    is not below the sample's median."""
    points = sorted(points, key=lambda p: (p.size_bytes, p.threads))
    for p in points:
        for name in ("b_us", "compute_us", "overlapped_us", "exposed_us"):
            values = getattr(p, name)
            if not values:
                raise ProfileError(f"no {name} measurement at {p.threads} threads, {p.size_bytes} bytes")
            if not all(math.isfinite(x) and x > 0 for x in values):
                raise ProfileError(f"non-positive {name} measurement at {p.threads} threads, {p.size_bytes} bytes")
    startups: dict[int, list[float]] = {}
    for p in points:
        startups.setdefault(p.threads, []).extend(x for x in p.startup_us if math.isfinite(x) and x >= 0)
    startup = {r: float(min(v)) if v else 0.0 for r, v in startups.items()}
    samples: list[contention.Sample] = []
    rows: list[dict[str, Any]] = []
    for p in points:
        b = spread(p.b_us)
        g = spread(p.compute_us)
        samples.append(contention.Sample("compute", p.threads, b["median_us"], g["median_us"]))
        rows.append({"kind": "compute", "threads": p.threads, "size_bytes": p.size_bytes, **g,
                     "b": b, "slowdown": g["median_us"] / b["median_us"]})
    for kind, name in (("overlapped_comm", "overlapped_us"), ("exposed_comm", "exposed_us")):
        for p in points:
            s = spread(getattr(p, name))
            a = startup.get(p.threads, 0.0)
            row = {"kind": kind, "threads": p.threads, "size_bytes": p.size_bytes, **s, "startup_us": a}
            if a >= s["median_us"]:
                row["note"] = f"startup {a:.1f} us is not below the median {s['median_us']:.1f} us: not subtracted"
                a = 0.0
            c_hat = c_hat_bytes(p.size_bytes, ranks)
            samples.append(contention.Sample(kind, p.threads, c_hat, s["median_us"], a))
            rows.append({**row, "c_hat_bytes": c_hat, "rate_MBps": c_hat / (s["median_us"] - a)})
    for index, row in enumerate(rows):
        row["sample"] = index
    return samples, rows


def synthetic_points(params: Mapping[str, float], threads: Sequence[int], sizes: Sequence[int], ranks: int,
                     repeats: int = 3, comm_runs: int = 3, b_us: float = 50_000.0, startup_us: float = 0.0,
                     noise: float = 0.0, seed: int = 0) -> list[Point]:
    """Raw measurements generated from the model (tests, and a check of the pipeline): every value is the
    model's time (plus `startup_us` for communication) times 1 + noise * N(0, 1), clipped to >= 0.5."""
    rng = np.random.default_rng(seed)

    def jitter(x: float) -> float:
        return x * max(0.5, 1.0 + noise * rng.standard_normal()) if noise else x

    points = []
    for size in sizes:
        c = c_hat_bytes(size, ranks)
        for r in threads:
            p = Point(int(r), int(size))
            for _ in range(repeats):
                p.b_us.append(jitter(b_us))
                p.compute_us.append(jitter(float(contention.predict_us(params, "compute", b_us, r))))
                for _ in range(comm_runs):
                    p.overlapped_us.append(jitter(startup_us + float(contention.predict_us(params, "overlapped_comm", c, r))))
                    p.exposed_us.append(jitter(startup_us + float(contention.predict_us(params, "exposed_comm", c, r))))
                    p.startup_us.append(jitter(startup_us))
            points.append(p)
    return points


# ------------------------------------------------------------------------------------------------ fit and report


def _r2(y: np.ndarray, model: np.ndarray) -> float | None:
    total = float(np.sum((y - y.mean()) ** 2))
    if total <= 0:
        return None
    return 1.0 - float(np.sum((y - model) ** 2)) / total


def quality(params: Mapping[str, float], samples: Sequence[contention.Sample]) -> dict[str, Any]:
    """R^2 per kind of what r changes: the compute slowdown measured / b against 1 / (alpha1 - alpha2 r), and
    the transmission rate c_hat / (measured - startup) (bytes/us = MB/s) against the fitted denominator. It
    is 1 - residual / variance around the mean, so it is low or negative where r changes little (flat data)."""
    out: dict[str, Any] = {}
    for kind in contention.KINDS:
        group = [s for s in samples if s.kind == kind]
        if not group:
            continue
        r = np.array([s.threads for s in group], dtype=float)
        denominator = np.asarray(contention.denominator(params, kind, r), dtype=float)
        if kind == "compute":
            y = np.array([s.measured_us / s.base for s in group])
            model = 1.0 / denominator
        else:
            y = np.array([s.base / s.model_us for s in group])
            model = denominator
        out[kind] = _r2(y, model)
    return out


@dataclass
class ProfileResult:
    config: ProfileConfig
    samples: list[contention.Sample]
    rows: list[dict[str, Any]]
    machine: dict[str, Any]
    wall_s: float
    fit: contention.FitResult | None = None
    fit_error: str | None = None
    r2: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def fit_meta(self) -> dict[str, Any]:
        if self.fit is None:
            return {"error": self.fit_error}
        return {**self.fit.to_dict(), "r2": dict(self.r2), "problems": list(self.problems),
                "thread_range": [min(self.config.threads), max(self.config.threads)]}

    def document(self) -> dict[str, Any]:
        """The mlopt.contention-samples document: samples plus meta (config, machine, fit, spreads)."""
        config = asdict(self.config)
        meta = {
            "profiler": "mlopt profile contention",
            "device": self.config.device,
            "config": config,
            "machine": self.machine,
            "wall_s": self.wall_s,
            "fit": self.fit_meta(),
            "measurements": self.rows,
            "startup_us": self.startup_by_threads(),
            "units": {"threads": "CPU interpreter worker threads" if self.config.device == "cpu"
                      else "NCCL_NTHREADS x channels", "time": "us", "rate_MBps": "bytes/us"},
        }
        return contention.samples_document(self.samples, meta)

    def startup_by_threads(self) -> dict[str, float]:
        return {str(row["threads"]): row["startup_us"] for row in self.rows if row["kind"] == "exposed_comm"}

    def summary(self) -> dict[str, Any]:
        return {"device": self.config.device, "ranks": self.config.ranks, "threads": list(self.config.threads),
                "sizes": list(self.config.sizes), "repeats": self.config.repeats, "samples": len(self.samples),
                "wall_s": self.wall_s, "fit": self.fit_meta(), "startup_us": self.startup_by_threads(),
                "medians": table(self.rows)}


def table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (threads, size): compute slowdown, overlapped and exposed rate (MB/s) with their relative IQRs."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        entry = out.setdefault((row["threads"], row["size_bytes"]),
                               {"threads": row["threads"], "size_bytes": row["size_bytes"]})
        if row["kind"] == "compute":
            entry.update(b_us=row["b"]["median_us"], compute_us=row["median_us"], slowdown=row["slowdown"],
                         compute_rel_iqr=row["rel_iqr"])
        else:
            short = "overlapped" if row["kind"] == "overlapped_comm" else "exposed"
            entry.update({f"{short}_us": row["median_us"], f"{short}_MBps": row["rate_MBps"],
                          f"{short}_rel_iqr": row["rel_iqr"]})
    return [out[k] for k in sorted(out)]


def fit_result(result: ProfileResult, source: str) -> ProfileResult:
    """Fits the samples into `result` (fit, R^2, problems over the measured thread range), or records why the
    fit failed in fit_error."""
    try:
        fitted = contention.fit(result.samples, source)
    except InputError as exc:
        result.fit_error = exc.message
        return result
    except (ArithmeticError, ValueError) as exc:  # e.g. OverflowError from exp(gamma3 r^gamma4) in a wild fit
        result.fit_error = f"$.samples: the fit failed: {type(exc).__name__}: {exc}"
        return result
    result.fit = fitted
    result.r2 = quality(fitted.parameters, result.samples)
    result.problems = contention.check_parameters(fitted.parameters, max_threads=max(result.config.threads),
                                                  min_threads=min(result.config.threads))
    return result


def summary_lines(result: ProfileResult) -> list[str]:
    """What the CLI prints: the medians per (r, size), the parameters, the fit quality per kind."""
    c = result.config
    unit = "workers" if c.device == "cpu" else "threads"
    lines = [f"{c.device}: {c.ranks} ranks, r = {','.join(map(str, c.threads))} {unit}, sizes "
             f"{','.join(format_size(s) for s in c.sizes)}, {c.repeats} repeats, {result.wall_s:.1f} s",
             f"{'r':>5} {'size':>7} {'b ms':>8} {'g/b':>6} {'±iqr':>5} {'p MB/s':>9} {'±iqr':>5} {'q MB/s':>9} "
             f"{'±iqr':>5}"]

    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    for e in table(result.rows):
        lines.append(f"{e['threads']:>5} {format_size(e['size_bytes']):>7} {e['b_us'] / 1e3:>8.2f} "
                     f"{e['slowdown']:>6.3f} {pct(e['compute_rel_iqr']):>5} {e['overlapped_MBps']:>9.0f} "
                     f"{pct(e['overlapped_rel_iqr']):>5} {e['exposed_MBps']:>9.0f} {pct(e['exposed_rel_iqr']):>5}")
    startup = ", ".join(f"r={r}: {v:.0f}" for r, v in result.startup_by_threads().items())
    lines.append(f"startup a (fastest tiny all-reduce, us): {startup}")
    if result.fit is None:
        lines.append(f"fit failed: {result.fit_error}")
        return lines
    p = result.fit.parameters
    lines.append(f"fit: alpha1={p['alpha1']:.6g} alpha2={p['alpha2']:.6g} | gamma1={p['gamma1']:.6g} "
                 f"gamma2={p['gamma2']:.6g} gamma3={p['gamma3']:.6g} | q_gamma1={p['q_gamma1']:.6g} "
                 f"q_gamma2={p['q_gamma2']:.6g} q_gamma3={p['q_gamma3']:.6g} (gamma4 = {p['gamma4']:g})")
    for kind in contention.KINDS:
        r2 = result.r2.get(kind)
        lines.append(f"  {kind:<16} {result.fit.counts[kind]:>3} samples  rms {100 * result.fit.rms_rel_error[kind]:5.1f}%"
                     f"  max {100 * result.fit.max_rel_error[kind]:5.1f}%  R^2 {'-' if r2 is None else f'{r2:.3f}'}")
    for problem in result.problems:
        lines.append(f"  note: {problem} (over r = {min(c.threads)}..{max(c.threads)})")
    return lines


# ------------------------------------------------------------------------------------------------ plot


def plot(result: ProfileResult, path: str | os.PathLike) -> Path:
    """Measured vs model per r: the compute slowdown g/b (left) and the transmission rates c_hat/(t - a) of
    overlapped and exposed all-reduces (right), one marker per size (side by side), whiskers over the
    inter-quartile range of the repeats."""
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it

    fig = Figure(figsize=(11, 4.2), dpi=100)
    left, right = fig.subplots(1, 2)
    threads = sorted(set(result.config.threads))
    grid = np.geomspace(threads[0], threads[-1], 100) if threads[-1] > threads[0] else np.array(threads, float)
    sizes = sorted({row["size_bytes"] for row in result.rows})
    markers = ("o", "s", "^", "D", "v", "P")
    params = result.fit.parameters if result.fit is not None else None
    for i, size in enumerate(sizes):
        shift = 2 ** (0.08 * (i - (len(sizes) - 1) / 2))  # sizes side by side at each r (log axis)
        rows = [row for row in result.rows if row["size_bytes"] == size]
        comp = sorted((row for row in rows if row["kind"] == "compute"), key=lambda row: row["threads"])
        x = [row["threads"] * shift for row in comp]
        b = [row["b"]["median_us"] for row in comp]
        y = [row["median_us"] / bb for row, bb in zip(comp, b)]
        low = [max(0.0, yy - row["q1_us"] / bb) for yy, row, bb in zip(y, comp, b)]
        high = [max(0.0, row["q3_us"] / bb - yy) for yy, row, bb in zip(y, comp, b)]
        left.errorbar(x, y, yerr=[low, high], fmt=markers[i % len(markers)], color="C0", capsize=3,
                      label=f"measured, {format_size(size)}")
        for kind, color, fill in (("overlapped_comm", "C1", True), ("exposed_comm", "C2", False)):
            comm = sorted((row for row in rows if row["kind"] == kind), key=lambda row: row["threads"])
            x = [row["threads"] * shift for row in comm]
            a = [row["startup_us"] if "note" not in row else 0.0 for row in comm]
            rate = [row["c_hat_bytes"] / (row["median_us"] - aa) for row, aa in zip(comm, a)]
            hi = [row["c_hat_bytes"] / max(row["q1_us"] - aa, 1e-9) - v for row, aa, v in zip(comm, a, rate)]
            lo = [v - row["c_hat_bytes"] / max(row["q3_us"] - aa, 1e-9) for row, aa, v in zip(comm, a, rate)]
            right.errorbar(x, rate, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], fmt=markers[i % len(markers)],
                           color=color, mfc=color if fill else "none", capsize=3,
                           label=f"{'overlapped' if fill else 'exposed'}, {format_size(size)}")
    if params is not None:
        left.plot(grid, 1.0 / contention.denominator(params, "compute", grid), color="C0", lw=1.2,
                  label="model 1/(alpha1 - alpha2 r)")
        right.plot(grid, contention.denominator(params, "overlapped_comm", grid), color="C1", lw=1.2,
                   label="model p: gamma1 - gamma2 exp(-gamma3 r^0.6)")
        right.plot(grid, contention.denominator(params, "exposed_comm", grid), color="C2", lw=1.2, ls="--",
                   label="model q")
    unit = "CPU interpreter worker threads" if result.config.device == "cpu" else "NCCL threads"
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads)
        ax.set_xticklabels([str(r) for r in threads])
        ax.set_xlabel(f"r ({unit})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    left.set_ylabel("compute time / time alone (g/b)")
    left.set_title("computation beside an all-reduce")
    right.set_ylabel("transmission rate c_hat / (t - a)  [MB/s]")
    right.set_title(f"all-reduce, {result.config.ranks} ranks")
    fig.suptitle(f"mlopt profile contention ({result.config.device})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


# ------------------------------------------------------------------------------------------------ progress


@contextlib.contextmanager
def progress_bar(enabled: bool, title: str) -> Iterator[tuple[Progress, Callable[[int], None]]]:
    """(advance(message), set_total(n)): a rich progress bar on stderr, or no-ops when not enabled."""
    if not enabled:
        yield (lambda message: None), (lambda n: None)
        return

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with RichProgress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(title, total=None)

        def advance(message: str) -> None:
            bar.update(task, description=f"{title}: {message}", advance=1)

        def set_total(n: int) -> None:
            bar.update(task, total=n, completed=0)

        yield advance, set_total


# ------------------------------------------------------------------------------------------------ CPU


def ring_allreduce_xml(ranks: int, instances: int = 1) -> str:
    """The ring all-reduce of the collective baselines (2 rings, NCCL's default) on a fully connected topology
    (ranks on one machine reach each other directly), lowered to MSCCL-EF XML as bench/runtime.py's ring
    variant is; `instances` copies of it run on sub-chunks with channels of their own (more threadblocks)."""
    alg = ring(fully_connected(ranks), CollectiveSpec("allreduce", ranks, 1))
    return write_program(lower(alg, instances=instances, name=f"contention_ring_allreduce{ranks}"))


class _AllReduce:
    """A ring all-reduce XML loaded into the runtime with an in-process communicator of `ranks` ranks."""

    def __init__(self, ranks: int, max_threads: int):
        self.native = native
        self.instances = 1
        self._load(ranks)
        if self.threadblocks < max_threads:  # the interpreter runs at most one worker per threadblock
            self.plan.close()
            self.instances = -(-max_threads // self.threadblocks)
            try:
                self._load(ranks)
            except LoweringError as exc:
                raise InputError("--threads", "$", f"{max_threads} worker threads need {self.instances} copies of "
                                 f"the ring all-reduce on {ranks} ranks, which cannot be lowered: {exc}") from None
        self.ranks = ranks
        self.comm = native.LocalComm(ranks)

    def _load(self, ranks: int) -> None:
        self.xml = ring_allreduce_xml(ranks, self.instances)
        self.plan = self.native.Plan.from_bytes(self.xml, f"ring_allreduce{ranks}.xml")
        info = self.plan.program_info
        self.threadblocks = int(info["threadblocks"])
        self.step_elements = int(max(info["i_chunks"], info["o_chunks"]))

    def buffers(self, size_bytes: int) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
        """(bytes run, inputs, outputs) for an all-reduce of about size_bytes per rank (whole chunks)."""
        count = max(self.step_elements, -(-size_bytes // ELEMENT_BYTES // self.step_elements) * self.step_elements)
        inputs = [np.full(count, 1.0, np.float32) for _ in range(self.ranks)]
        outputs = [np.zeros(self.plan.output_count(count), np.float32) for _ in range(self.ranks)]
        return count * ELEMENT_BYTES, inputs, outputs

    def run(self, buffers, threads: int) -> float:
        """One all-reduce with `threads` interpreter workers; the library's wall time (us)."""
        _, inputs, outputs = buffers
        _, stats = self.comm.run(self.plan, inputs, outputs, threads=threads, watchdog_ms=120_000)
        return float(stats.wall_us)

    def check(self, buffers) -> None:
        _, _, outputs = buffers
        for rank, out in enumerate(outputs):
            if not np.all(out == float(self.ranks)):
                raise ProfileError(f"the ring all-reduce gave a wrong result on rank {rank}")

    def close(self) -> None:
        self.comm.close()
        self.plan.close()


# One compute worker: a process of its own running numpy matmuls on one BLAS thread, driven over its pipes.
# `run N AT`: N matmuls from CLOCK_MONOTONIC time AT on, replies "START END"; `loop`: matmuls until a line
# arrives on stdin (replies "looping" first, then the count); `quit`. Processes, not threads of this process:
# a compute thread would need the GIL between matmuls, which the thread calling the runtime holds between
# all-reduces, and that coupling, which a GPU does not have, slowed the computation by 1.4-2.3x beside a
# loop of tiny all-reduces (10x beside a pure-Python loop) on the 2-core machine this was written on.
_COMPUTE_WORKER = r"""
import select, sys, time
import numpy as np
m, seed = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(seed)
a, b = (rng.standard_normal((m, m)).astype(np.float32) for _ in range(2))
out = np.empty((m, m), np.float32)
np.matmul(a, b, out=out)
clock = time.monotonic
def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
say("ready")
while True:
    cmd = sys.stdin.readline().split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] == "run":
        n, at = int(cmd[1]), float(cmd[2])
        if at - clock() > 0.002:
            time.sleep(at - clock() - 0.001)
        while clock() < at:
            pass
        start = clock()
        for _ in range(n):
            np.matmul(a, b, out=out)
        say(f"{start!r} {clock()!r}")
    elif cmd[0] == "loop":
        say("looping")
        count = 0
        while not select.select([sys.stdin], [], [], 0)[0]:
            np.matmul(a, b, out=out)
            count += 1
        sys.stdin.readline()
        say(str(count))
"""


class _CpuCompute:
    """A fixed amount of float32 matmul work on `workers` processes (numpy, one BLAS thread each): the
    computation fills `workers` cores as a GPU kernel fills the SMs, and shares no lock with the all-reduce."""

    def __init__(self, workers: int, matrix: int):
        self.workers = workers
        self.matrix = matrix
        self._looping = False
        self.backend = (f"numpy {np.__version__}, float32 {matrix}x{matrix} matmul, {workers} processes of one "
                        f"BLAS thread each")
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "VECLIB_MAXIMUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}
        self._procs = []
        try:
            for w in range(workers):
                self._procs.append(subprocess.Popen([sys.executable, "-c", _COMPUTE_WORKER, str(matrix), str(w)],
                                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                                    env=env, bufsize=1))
            self._expect("ready")
        except BaseException:
            self.close()
            raise

    def _send(self, line: str) -> None:
        for proc in self._procs:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()

    def _replies(self) -> list[str]:
        out = []
        for proc in self._procs:
            line = proc.stdout.readline()
            if not line:
                raise ProfileError(f"a compute worker process exited (code {proc.poll()})")
            out.append(line.strip())
        return out

    def _expect(self, word: str) -> None:
        replies = self._replies()
        if any(r != word for r in replies):
            raise ProfileError(f"compute workers answered {replies!r}, expected {word!r}")

    def __enter__(self) -> "_CpuCompute":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def run(self, iterations: int) -> float:
        """Every worker does `iterations` matmuls from a common start; first start to last end (us)."""
        self._send(f"run {int(iterations)} {time.monotonic() + 0.002!r}")
        spans = [tuple(float(x) for x in reply.split()) for reply in self._replies()]
        return (max(end for _, end in spans) - min(start for start, _ in spans)) * 1e6

    def start_background(self) -> None:
        """Matmuls on every worker until stop_background(); returns once all of them loop."""
        self._send("loop")
        self._looping = True
        self._expect("looping")

    def stop_background(self) -> None:
        if self._looping:
            self._looping = False
            self._send("stop")
            self._replies()

    def close(self) -> None:
        for proc in self._procs:
            try:
                if proc.poll() is None:
                    proc.stdin.write("stop\nquit\n" if self._looping else "quit\n")
                    proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - a worker that does not quit is killed
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except (BrokenPipeError, OSError):
                    pass
        self._procs = []


class _CommLoop:
    """All-reduces back to back on a thread of their own until stopped."""

    def __init__(self, allreduce: _AllReduce, buffers, threads: int):
        self._allreduce, self._buffers, self._threads = allreduce, buffers, threads
        self._stop = threading.Event()
        self._started = threading.Event()
        self.runs = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            while True:
                self._started.set()
                self._allreduce.run(self._buffers, self._threads)
                self.runs += 1
                if self._stop.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
            self._started.set()

    def __enter__(self) -> "_CommLoop":
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None and exc_info[0] is None:
            raise ProfileError(f"the all-reduce failed while overlapped: {self.error}")


def measure_cpu(config: ProfileConfig, advance: Progress = lambda m: None,
                set_total: Callable[[int], None] = lambda n: None) -> tuple[list[Point], dict[str, Any]]:
    """The experiment on this CPU (module docstring); (points, machine facts for meta)."""
    allreduce = _AllReduce(config.ranks, max(config.threads))
    if max(config.threads) > allreduce.threadblocks:
        allreduce.close()
        raise InputError("--threads", "$", f"{max(config.threads)} worker threads, but the ring all-reduce on "
                         f"{config.ranks} ranks has {allreduce.threadblocks} threadblocks (the interpreter runs "
                         f"at most one worker per threadblock): use more --ranks or fewer threads")
    workers = config.compute_workers or usable_cores()
    set_total(1 + config.repeats * len(config.sizes) * len(config.threads))
    try:
        with _CpuCompute(workers, config.matrix) as compute:
            advance("calibrating")
            buffers = {size: allreduce.buffers(size) for size in config.sizes}
            tiny = allreduce.buffers(1)
            for size, buf in buffers.items():  # warm-up (page faults, payload pools) and a correctness check
                for r in config.threads:
                    allreduce.run(buf, r)
                allreduce.check(buf)
            compute.run(5)
            iterations = 10
            for _ in range(2):  # a probe, then one run of the estimated length refines it
                per_iteration = compute.run(iterations) / iterations
                iterations = max(3, round(config.compute_ms * 1e3 / per_iteration))
            points = {(r, size): Point(r, buffers[size][0]) for size in config.sizes for r in config.threads}
            for repeat in range(config.repeats):
                for size in config.sizes:
                    buf = buffers[size]
                    for r in config.threads:
                        advance(f"repeat {repeat + 1}/{config.repeats}, {format_size(size)}, r={r}")
                        p = points[(r, size)]
                        p.b_us.append(compute.run(iterations))
                        with _CommLoop(allreduce, buf, r):
                            p.compute_us.append(compute.run(iterations))
                        compute.start_background()
                        try:
                            p.overlapped_us.extend(allreduce.run(buf, r) for _ in range(config.comm_runs))
                        finally:
                            compute.stop_background()
                        p.exposed_us.extend(allreduce.run(buf, r) for _ in range(config.comm_runs))
                        p.startup_us.extend(allreduce.run(tiny, r) for _ in range(config.comm_runs))
            for buf in buffers.values():
                allreduce.check(buf)
            machine = {
                "compute": compute.backend, "compute_workers": workers, "compute_iterations": iterations,
                "matmul_us": per_iteration, "allreduce": "ring (2 rings) lowered to MSCCL-EF, mlopt runtime CPU "
                f"interpreter "
                f"{'.'.join(map(str, allreduce.native.version()))}", "allreduce_instances": allreduce.instances,
                "allreduce_threadblocks": allreduce.threadblocks, "tiny_allreduce_bytes": tiny[0],
                "sizes_run": {format_size(s): buffers[s][0] for s in config.sizes},
            }
    finally:
        allreduce.close()
    return list(points.values()), machine


# ------------------------------------------------------------------------------------------------ CUDA


def cuda_problem(ranks: int = 0) -> str | None:
    """Why the CUDA experiment cannot run here (None when it can)."""
    try:
        import torch  # lazy: torch is an optional dependency (the torch extra)
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda reports no CUDA device"
    if not dist.is_available() or not dist.is_nccl_available():
        return "this torch has no NCCL backend (torch.distributed.is_nccl_available() is False)"
    count = torch.cuda.device_count()
    if count < 2:
        return (f"{count} GPU: NCCL needs one GPU per rank (two ranks of one communicator on the same GPU are "
                f"refused with 'Duplicate GPU detected')")
    if ranks > count:
        return f"--ranks {ranks} but {count} GPUs (one rank per GPU)"
    return None


def _cuda_worker(rank: int, world: int, spec: dict[str, Any]) -> None:
    """One rank of the CUDA experiment at one r (a fresh process: NCCL reads its environment at init)."""
    os.environ.update(spec["env"])
    import torch  # lazy: torch is an optional dependency (the torch extra)
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{spec['init_file']}", rank=rank, world_size=world)
    device = torch.device("cuda", rank)
    try:
        m = spec["matrix"]
        a, b = (torch.randn(m, m, device=device, dtype=torch.float16) for _ in range(2))
        out = torch.empty(m, m, device=device, dtype=torch.float16)
        compute_stream = torch.cuda.Stream(device)
        comm_stream = torch.cuda.current_stream(device)

        def timed_compute(iterations: int) -> tuple[Any, Any]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(compute_stream):
                start.record()
                for _ in range(iterations):
                    torch.mm(a, b, out=out)
                end.record()
            return start, end

        def timed_allreduce(x, runs: int) -> list[tuple[Any, Any]]:
            events = []
            for _ in range(runs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(comm_stream)
                dist.all_reduce(x)
                end.record(comm_stream)
                events.append((start, end))
            return events

        def us(pair) -> float:
            return float(pair[0].elapsed_time(pair[1])) * 1e3

        def sync() -> None:
            torch.cuda.synchronize(device)
            dist.barrier(device_ids=[rank])
            torch.cuda.synchronize(device)

        tiny = torch.zeros(world * 64, device=device, dtype=torch.float32)
        for _ in range(3):
            timed_compute(3)
            dist.all_reduce(tiny)
        sync()
        probe = timed_compute(10)
        sync()
        per_iteration = us(probe) / 10
        iterations = max(3, round(spec["compute_ms"] * 1e3 / per_iteration))
        runs = spec["comm_runs"]
        results = []
        for size in spec["sizes"]:
            x = torch.zeros(max(world, size // ELEMENT_BYTES // world * world), device=device, dtype=torch.float32)
            for _ in range(2):
                dist.all_reduce(x)
            sync()
            point = {"threads": spec["threads"], "size_bytes": x.numel() * ELEMENT_BYTES, "b_us": [],
                     "compute_us": [], "overlapped_us": [], "exposed_us": [], "startup_us": []}
            for _ in range(spec["repeats"]):
                alone = timed_compute(iterations)  # 1. compute alone
                sync()
                point["b_us"].append(us(alone))
                exposed = timed_allreduce(x, runs)  # 4. all-reduce alone
                sync()
                point["exposed_us"].extend(us(e) for e in exposed)
                q = max(statistics.median(point["exposed_us"]), 1.0)
                # 2. compute beside all-reduces: enough all-reduces queued to outlast the (slowed) compute
                covering = timed_allreduce(x, max(2, math.ceil(3 * point["b_us"][-1] / q) + 1))
                beside = timed_compute(iterations)
                sync()
                point["compute_us"].append(us(beside))
                del covering
                # 3. all-reduces beside compute: compute queued to outlast them (slowed 4x)
                timed_compute(max(iterations, math.ceil(4 * runs * q / per_iteration)))
                overlapped = timed_allreduce(x, runs)
                sync()
                point["overlapped_us"].extend(us(e) for e in overlapped)
                startup = timed_allreduce(tiny, runs)  # 5. the startup a
                sync()
                point["startup_us"].extend(us(e) for e in startup)
            results.append(point)
        if rank == 0:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            Path(spec["result"]).write_text(json.dumps({"points": results, "matmul_us": per_iteration,
                                                        "iterations": iterations, "nccl": nccl,
                                                        "gpu": torch.cuda.get_device_name(device)}))
    finally:
        dist.destroy_process_group()


def measure_cuda(config: ProfileConfig, advance: Progress = lambda m: None,
                 set_total: Callable[[int], None] = lambda n: None,
                 timeout_s: float = 900.0) -> tuple[list[Point], dict[str, Any]]:
    """The experiment with torch.distributed NCCL on this machine's GPUs, one fresh group of processes per r."""
    problem = cuda_problem(config.ranks)
    if problem:
        raise InputError("--device", "$", f"cuda: {problem}")
    import torch  # lazy: torch is an optional dependency (the torch extra)

    world = config.ranks or torch.cuda.device_count()
    set_total(len(config.threads))
    context = multiprocessing.get_context("spawn")
    points: list[Point] = []
    facts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mlopt-contention-") as folder:
        for r in config.threads:
            advance(f"r={r} ({nccl_env(r)['NCCL_NTHREADS']} threads x {nccl_env(r)['NCCL_MAX_NCHANNELS']} channels)")
            result = Path(folder) / f"r{r}.json"
            spec = {"env": nccl_env(r), "init_file": str(Path(folder) / f"init-{r}"), "result": str(result),
                    "threads": r, "sizes": list(config.sizes), "repeats": config.repeats,
                    "comm_runs": config.comm_runs, "compute_ms": config.compute_ms, "matrix": config.matrix}
            procs = [context.Process(target=_cuda_worker, args=(rank, world, spec), daemon=True)
                     for rank in range(world)]
            for proc in procs:
                proc.start()
            deadline = time.monotonic() + timeout_s
            for proc in procs:
                proc.join(max(0.0, deadline - time.monotonic()))
            if any(proc.is_alive() for proc in procs):
                for proc in procs:
                    if proc.is_alive():
                        proc.kill()
                raise ProfileError(f"cuda: the NCCL processes at r={r} did not finish in {timeout_s:.0f} s")
            failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
            if failed or not result.exists():
                raise ProfileError(f"cuda: a NCCL process at r={r} failed (exit codes {failed or 'none'}); its "
                                   f"error is above")
            data = json.loads(result.read_text())
            points.extend(Point.from_dict(p) for p in data["points"])
            facts = {k: data[k] for k in ("matmul_us", "iterations", "nccl", "gpu")}
    machine = {**facts, "compute": f"torch {torch.__version__}, float16 {config.matrix}x{config.matrix} matmul "
               "on a stream of its own", "allreduce": "torch.distributed NCCL all-reduce (Simple, Ring)",
               "gpus": world}
    return points, machine


# ------------------------------------------------------------------------------------------------ driver


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                             "cores": usable_cores()}
    try:
        facts["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    return facts


def profile(config: ProfileConfig, source: str, advance: Progress = lambda m: None,
            set_total: Callable[[int], None] = lambda n: None) -> ProfileResult:
    """Measure (config.device), assemble the samples and fit them; `source` names the output in fit errors."""
    started = time.perf_counter()
    machine = machine_facts()
    if config.device == "cpu":
        points, facts = measure_cpu(config, advance, set_total)
    else:
        points, facts = measure_cuda(config, advance, set_total)
        if config.ranks == 0:
            config = replace(config, ranks=int(facts["gpus"]))
    machine.update(facts)
    try:
        machine["loadavg_end"] = list(os.getloadavg())
    except OSError:
        pass
    samples, rows = assemble(points, config.ranks)
    result = ProfileResult(config, samples, rows, machine, time.perf_counter() - started)
    return fit_result(result, source)


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike | None) -> None:
    """Refuse a plot path matplotlib would not write (before minutes of measuring, not after)."""
    if path is not None and Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise InputError("--plot", "$", f"{str(path)!r}: expected a file ending in {', '.join(PLOT_SUFFIXES)}")


def write(result: ProfileResult, output: str | os.PathLike, plot_path: str | os.PathLike | None = None) -> None:
    """The samples document (atomically) and, when asked, the plot."""
    write_json(output, result.document())
    if plot_path is not None:
        plot(result, plot_path)


if __name__ == "__main__":  # pragma: no cover - `mlopt profile contention` is the entry point
    sys.exit("use `mlopt profile contention`")

"""Alpha-beta link fits from TACCL's profiling experiments, link classes, and fit quality.

TACCL's link profiler (TACCL section 5.3) sends n chunks of s bytes over a link one after another and,
separately, one chunk of n*s bytes, and attributes

    T_seq(n, s) = n * (alpha + beta * s)        T_one(n, s) = alpha + beta * n * s

Every measurement is a row `messages * alpha + bytes * beta` with messages = n (seq) or 1 (one) and
bytes = n * s; alpha (us) and beta (us per MB, MB = 10^6 bytes, the topology's unit) come from least
squares over all (n, s) rows of a link. Where one run of the measuring harness has a fixed cost that is not
per message (the CPU runtime wakes its rank threads once per run), `overhead=True` adds a constant term
`c0`: T = c0 + messages * alpha + bytes * beta. c0 is reported but is not part of the link.

The least squares are weighted by 1/T (relative errors: timing noise grows with the time, and the small
transfers that determine alpha must not drown in a large transfer's noise). Non-physical fits are never
returned silently: the fit is non-negative least squares (every subset of alpha and the overhead clamped at 0
is tried and the best feasible one kept, with a warning when a clamp was needed); data whose unconstrained
beta is negative (times that do not grow with the bytes) is flagged `ok=False`, and where no positive beta
fits at all beta falls back to the largest transfer's time per byte, flagged as well. Non-finite or
non-positive times are left out with a warning.

Fit quality: R^2 of the fitted times against the measured medians, per-sample residuals (us and relative to
the measurement), their RMS and the largest relative residual.

Classes: links are grouped by beta, then by alpha (`group_links`): sorted by beta, a link whose beta is within
`beta_tol` (relative, default 25%) of the previous link's stays in its group (single linkage); each group is
split the same way by alpha with tolerance max(`alpha_tol` relative, `alpha_abs_us`). Each class is then fitted
from the pooled samples of its links. Classes are named from hints (the nvidia-smi layout: "nvlink", "pcie",
...) when every link of the class has the same hint, else "class0", "class1", ... in order of beta (fastest
first); a name used by several classes gets "-2", "-3", ... in that order.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

MB = 1e6  # bytes per MB in beta_us_per_MB

DEFAULT_BETA_TOL = 0.25
DEFAULT_ALPHA_TOL = 0.5
DEFAULT_ALPHA_ABS_US = 1.0


@dataclass(frozen=True)
class Sample:
    """One measured experiment on a link: `messages` sends moving `nbytes` in all, its repeated times."""

    kind: str  # "seq" (n chunks one after another) or "one" (one chunk of n*s)
    chunks: int  # n
    chunk_bytes: int  # s
    times_us: tuple[float, ...]  # every repeat

    @property
    def messages(self) -> int:
        return self.chunks if self.kind == "seq" else 1

    @property
    def nbytes(self) -> int:
        return self.chunks * self.chunk_bytes

    @property
    def median_us(self) -> float:
        return _quantile(self.times_us, 0.5)

    def spread(self) -> dict[str, float]:
        """Median, interquartile range and extremes of the repeats."""
        q1, q3 = _quantile(self.times_us, 0.25), _quantile(self.times_us, 0.75)
        return {"median_us": self.median_us, "q1_us": q1, "q3_us": q3, "iqr_us": q3 - q1,
                "min_us": min(self.times_us), "max_us": max(self.times_us), "repeats": len(self.times_us)}


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def experiments(chunks: Iterable[int], sizes: Iterable[int]) -> list[tuple[str, int, int]]:
    """TACCL's experiments: (kind, n, s) for every n and s; n = 1 is one experiment (seq and one coincide)."""
    out = []
    for s in sizes:
        for n in chunks:
            out.append(("one", n, s))
            if n > 1:
                out.append(("seq", n, s))
    return out


def predict(alpha_us: float, beta_us_per_MB: float, messages: int, nbytes: float, overhead_us: float = 0.0) -> float:
    return overhead_us + messages * alpha_us + beta_us_per_MB * nbytes / MB


@dataclass
class Fit:
    """alpha/beta of one link or class and how well they explain the measurements."""

    alpha_us: float
    beta_us_per_MB: float
    overhead_us: float = 0.0  # per-run constant of the harness (overhead=True), not part of the link
    alpha_se_us: float = math.nan  # standard error of alpha (weighted least squares), for grouping
    r2: float = math.nan
    rms_residual_us: float = math.nan
    max_rel_residual: float = math.nan
    residuals_us: tuple[float, ...] = ()
    samples: tuple[Sample, ...] = ()
    ok: bool = True
    warnings: tuple[str, ...] = ()
    model: str = "taccl"  # "taccl": T = m alpha + b beta; "taccl+overhead": + c0

    @property
    def bandwidth_GBps(self) -> float:
        return 1000.0 / self.beta_us_per_MB if self.beta_us_per_MB > 0 else math.nan

    def fitted_us(self, sample: Sample) -> float:
        return predict(self.alpha_us, self.beta_us_per_MB, sample.messages, sample.nbytes, self.overhead_us)

    def to_dict(self, with_samples: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "alpha_us": self.alpha_us, "alpha_se_us": _finite_or_none(self.alpha_se_us),
            "beta_us_per_MB": self.beta_us_per_MB, "bandwidth_GBps": _finite_or_none(self.bandwidth_GBps),
            "overhead_us": self.overhead_us,
            "r2": _finite_or_none(self.r2), "rms_residual_us": _finite_or_none(self.rms_residual_us),
            "max_rel_residual": _finite_or_none(self.max_rel_residual), "ok": self.ok,
            "warnings": list(self.warnings), "model": self.model, "samples_fitted": len(self.samples),
        }
        if with_samples:
            d["samples"] = [
                {"kind": s.kind, "chunks": s.chunks, "chunk_bytes": s.chunk_bytes, **s.spread(),
                 "fitted_us": self.fitted_us(s), "residual_us": r}
                for s, r in zip(self.samples, self.residuals_us)
            ]
        return d


def _finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _lstsq(rows: list[list[float]], ys: list[float], active: Sequence[int]) -> list[float] | None:
    """Least squares over the `active` columns (the others fixed at 0); None when singular. Rows come
    weighted already (see `_weighted`)."""
    if not active:
        return [0.0] * len(rows[0])
    a = np.array([[r[j] for j in active] for r in rows], dtype=float)
    y = np.array(ys, dtype=float)
    # Scale columns so that bytes (1e6) and message counts (1) are comparable.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    sol, _, rank, _ = np.linalg.lstsq(a / scale, y, rcond=None)
    if rank < len(active):
        return None
    out = [0.0] * len(rows[0])
    for j, v in zip(active, sol / scale):
        out[j] = float(v)
    return out


def _nnls(rows: list[list[float]], ys: list[float], required: Sequence[int] = ()) -> list[float] | None:
    """Non-negative least squares by trying every support (at most 3 parameters here) that keeps the
    `required` columns free; None when no such support gives a non-negative solution."""
    ncol = len(rows[0])
    best, best_sse = None, math.inf
    for k in range(ncol, -1, -1):
        for active in itertools.combinations(range(ncol), k):
            if any(j not in active for j in required):
                continue
            sol = _lstsq(rows, ys, active)
            if sol is None or any(v < 0 for v in sol) or any(sol[j] <= 0 for j in required):
                continue
            sse = sum((y - sum(c * v for c, v in zip(r, sol))) ** 2 for r, y in zip(rows, ys))
            if sse < best_sse * (1 - 1e-12):
                best, best_sse = sol, sse
    return best


def _weighted(rows: list[list[float]], ys: list[float]) -> tuple[list[list[float]], list[float]]:
    """Rows and targets divided by the measured time: least squares on relative errors, so that a 16 MiB
    transfer's noise does not drown the small transfers that determine alpha (timing noise is roughly
    proportional to the time)."""
    ws = [1.0 / y if y > 0 else 1.0 for y in ys]
    return [[c * w for c in r] for r, w in zip(rows, ws)], [y * w for y, w in zip(ys, ws)]


def fit_alpha_beta(samples: Sequence[Sample], overhead: bool = False) -> Fit:
    """Least-squares alpha and beta over TACCL's (n, s) experiments of one link (or a class's pooled links).

    Each sample contributes its median time. Needs measurements at two or more sizes or message counts;
    with fewer, or when the data admits no positive beta, the fit is flagged (`ok=False`) with a reason.
    """
    warnings: list[str] = []
    model = "taccl+overhead" if overhead else "taccl"
    clean, dropped = [], 0
    for s in samples:
        finite = tuple(float(t) for t in s.times_us if math.isfinite(t) and t > 0)
        dropped += len(s.times_us) - len(finite)
        if finite:
            clean.append(s if len(finite) == len(s.times_us) else Sample(s.kind, s.chunks, s.chunk_bytes, finite))
    if dropped:
        warnings.append(f"{dropped} times were not finite and positive and were left out")
    samples = tuple(clean)
    if not samples:
        return Fit(0.0, math.nan, ok=False, warnings=(*warnings, "no measurements"), model=model)
    rows, ys = [], []
    for s in samples:
        row = [float(s.messages), s.nbytes / MB]
        if overhead:
            row.append(1.0)
        rows.append(row)
        ys.append(s.median_us)
    wrows, wys = _weighted(rows, ys)
    ok = True
    free = _lstsq(wrows, wys, list(range(len(rows[0]))))
    tiny = 1e-9 * max(abs(y) for y in ys)  # rounding noise of an exact fit is not a clamp
    if free is not None and free[1] < -tiny:
        ok = False
        warnings.append(f"the times do not grow with the bytes moved (unconstrained beta {free[1]:g} us/MB): "
                        f"not an alpha-beta link; beta below is a fallback")
    elif free is not None:
        names = ["alpha", "beta", "overhead"]
        clamped = [names[j] for j, v in enumerate(free) if v < -tiny and math.isfinite(v)]
        if clamped:
            warnings.append(f"unconstrained least squares gave negative {', '.join(clamped)}; "
                            f"refitted with {'it' if len(clamped) == 1 else 'them'} at 0")
    sol = _nnls(wrows, wys, required=(1,))  # beta is never clamped: a link without bandwidth cost is no fit
    if sol is None:
        sol = _nnls(wrows, wys) or [0.0] * len(rows[0])
    alpha, beta = sol[0], sol[1]
    c0 = sol[2] if overhead else 0.0
    if not (beta > 0 and math.isfinite(beta)):
        ok = False
        largest = max(samples, key=lambda s: (s.nbytes, s.kind == "one"))
        fallback = (largest.median_us - alpha - c0) / (largest.nbytes / MB) if largest.nbytes else math.nan
        if not (fallback > 0 and math.isfinite(fallback)):
            fallback = (largest.median_us / (largest.nbytes / MB) if largest.nbytes and largest.median_us > 0
                        else math.nan)
        warnings.append(f"no positive beta fits the data (beta={beta:g}); beta taken from the largest transfer "
                        f"({largest.nbytes} bytes): {fallback:g} us/MB")
        beta = fallback
    fit = Fit(alpha, beta, c0, samples=samples, ok=ok, warnings=tuple(warnings), model=model)
    fit.alpha_se_us = _alpha_se(wrows, wys, sol)
    _quality(fit)
    return fit


def _alpha_se(rows: list[list[float]], ys: list[float], sol: list[float]) -> float:
    """Standard error of alpha from the (weighted) design, with alpha and the other free parameters."""
    active = [j for j, v in enumerate(sol) if v > 0 or j == 0]
    m = len(rows)
    if m <= len(active):
        return math.nan
    a = np.array([[r[j] for j in active] for r in rows], dtype=float)
    res = np.array(ys) - np.array(rows) @ np.array(sol)
    sigma2 = float(res @ res) / (m - len(active))
    try:
        cov = sigma2 * np.linalg.inv(a.T @ a)
    except np.linalg.LinAlgError:
        return math.nan
    return float(math.sqrt(max(cov[0, 0], 0.0)))


def _quality(fit: Fit) -> None:
    ys = [s.median_us for s in fit.samples]
    preds = [fit.fitted_us(s) for s in fit.samples]
    res = [y - p for y, p in zip(ys, preds)]
    fit.residuals_us = tuple(res)
    if not ys:
        return
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum(r * r for r in res)
    fit.r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else math.nan)
    fit.rms_residual_us = math.sqrt(ss_res / len(ys))
    rel = [abs(r) / y for r, y in zip(res, ys) if y > 0]
    fit.max_rel_residual = max(rel) if rel else math.nan


# ---------------------------------------------------------------------------------------------------------
# classes


@dataclass
class LinkClass:
    name: str
    links: tuple[tuple[int, int], ...]
    fit: Fit
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hint": self.hint, "links": [f"{a}->{b}" for a, b in self.links],
                **self.fit.to_dict(with_samples=False)}


def _split(items: list, key, rel_tol: float, abs_tol: float = 0.0) -> list[list]:
    """Single-linkage groups of `items` sorted by key: a gap above max(rel_tol * previous, abs_tol) splits."""
    items = sorted(items, key=key)
    groups: list[list] = []
    for it in items:
        if groups:
            prev = key(groups[-1][-1])
            if abs(key(it) - prev) <= max(rel_tol * abs(prev), abs_tol):
                groups[-1].append(it)
                continue
        groups.append([it])
    return groups


def _split_alpha(items: list, fits: Mapping, rel_tol: float, abs_tol: float) -> list[list]:
    """Like _split on alpha, but two alphas closer than 3 standard errors (of either fit) stay together: a
    high-beta link measured with large transfers determines alpha poorly, and noise must not split it."""
    items = sorted(items, key=lambda p: fits[p].alpha_us)
    groups: list[list] = []
    for it in items:
        if groups:
            prev = groups[-1][-1]
            a, b = fits[prev], fits[it]
            se = max((x for x in (a.alpha_se_us, b.alpha_se_us) if math.isfinite(x)), default=0.0)
            if abs(b.alpha_us - a.alpha_us) <= max(rel_tol * abs(a.alpha_us), abs_tol, 3.0 * se):
                groups[-1].append(it)
                continue
        groups.append([it])
    return groups


def group_links(fits: Mapping[tuple[int, int], Fit], hints: Mapping[tuple[int, int], str] | None = None,
                beta_tol: float = DEFAULT_BETA_TOL, alpha_tol: float = DEFAULT_ALPHA_TOL,
                alpha_abs_us: float = DEFAULT_ALPHA_ABS_US, overhead: bool = False,
                split_by_hint: bool = True) -> list[LinkClass]:
    """Links with similar beta (then alpha) form a class, fitted again from their pooled samples.

    `split_by_hint`: links with different hints never share a class (an NV2 and a PCIe link of equal measured
    bandwidth stay apart). Classes come back fastest (lowest beta) first.
    """
    hints = dict(hints or {})
    pairs = [p for p in fits if math.isfinite(fits[p].beta_us_per_MB)]
    buckets: dict[str | None, list] = {}
    for p in pairs:
        buckets.setdefault(hints.get(p) if split_by_hint else None, []).append(p)
    groups: list[list[tuple[int, int]]] = []
    for members in buckets.values():
        for by_beta in _split(members, lambda p: fits[p].beta_us_per_MB, beta_tol):
            groups.extend(_split_alpha(by_beta, fits, alpha_tol, alpha_abs_us))
    classes = []
    for g in groups:
        pooled = [s for p in g for s in fits[p].samples]
        fit = fit_alpha_beta(pooled, overhead=overhead)
        member_hints = {hints.get(p) for p in g}
        hint = member_hints.pop() if len(member_hints) == 1 else None
        classes.append(LinkClass("", tuple(sorted(g)), fit, hint))
    classes.sort(key=lambda c: (c.fit.beta_us_per_MB, c.fit.alpha_us, c.links))
    _name_classes(classes)
    return classes


def _name_classes(classes: list[LinkClass]) -> None:
    used: dict[str, int] = {}
    unnamed = 0
    for c in classes:
        if c.hint:
            base = c.hint
        else:
            base = f"class{unnamed}"
            unnamed += 1
        used[base] = used.get(base, 0) + 1
        c.name = base if used[base] == 1 else f"{base}-{used[base]}"


def class_of(classes: Sequence[LinkClass]) -> dict[tuple[int, int], LinkClass]:
    return {p: c for c in classes for p in c.links}


def summary_rows(classes: Sequence[LinkClass]) -> list[dict[str, Any]]:
    """One row per class: what the CLI prints (alpha, beta as GB/s, R^2)."""
    return [{"class": c.name, "links": len(c.links), "alpha_us": c.fit.alpha_us,
             "beta_us_per_MB": c.fit.beta_us_per_MB, "bandwidth_GBps": _finite_or_none(c.fit.bandwidth_GBps),
             "r2": _finite_or_none(c.fit.r2), "max_rel_residual": _finite_or_none(c.fit.max_rel_residual),
             "ok": c.fit.ok} for c in classes]


@dataclass
class Measurements:
    """Samples per directed link (src, dst), in measurement order."""

    samples: dict[tuple[int, int], list[Sample]] = field(default_factory=dict)
    # The reduce probe (runtime transports): times of one transfer received plainly and received with a
    # reduction, and the reduction rate they give (hardware.measure_cpu); None when not measured.
    reduce_probe: dict[str, Any] | None = None

    def add(self, pair: tuple[int, int], sample: Sample) -> None:
        self.samples.setdefault(pair, []).append(sample)

    def fits(self, overhead: bool = False) -> dict[tuple[int, int], Fit]:
        return {p: fit_alpha_beta(s, overhead=overhead) for p, s in sorted(self.samples.items())}

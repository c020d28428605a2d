"""LIBRA's contention model (eq. 5-6): samples, a least-squares fit, and a default parameter set.

With r GPU threads given to the all-reduce kernel running beside the backward computation:

    g(b, r) = b / (alpha1 - alpha2 * r)                                  computation time, us (eq. 5)
    p(c, r) = c_hat / (gamma1 - gamma2 * exp(-gamma3 * r**gamma4))       overlapped transmission, us (eq. 6)
    q(c, r) = c_hat / (q_gamma1 - q_gamma2 * exp(-q_gamma3 * r**q_gamma4))  exposed transmission, us

b is the computation's time without overlap (us); c_hat the bytes each rank sends (2(N-1)/N * c for a ring
all-reduce of c bytes, eq. 4), so the gamma denominators are transmission rates in bytes/us (1 byte/us =
1 MB/s) and gamma1 is the rate with unlimited threads. gamma4 is not fitted: the paper fixes it at 0.6.
The all-reduce startup `a` (eq. 3) is not part of p and q: a communication sample's `startup_us` (default 0)
is subtracted from its measurement before fitting.

Parameters travel as a flat dict of floats (`PARAMETER_NAMES`); the planner converts it to its own type.

Sample document (`mlopt profile contention` writes it; validated here, no JSON Schema file):

    {"format": "mlopt.contention-samples", "schema_version": "1.0",
     "meta": {...free-form...},                      # optional
     "samples": [
       {"kind": "compute", "threads": 1024, "b_us": 25700.0, "measured_us": 29100.0},
       {"kind": "overlapped_comm", "threads": 1024, "c_hat_bytes": 197225000, "measured_us": 21400.0},
       {"kind": "exposed_comm", "threads": 512, "c_hat_bytes": 197225000, "measured_us": 20100.0,
        "startup_us": 60.0}]}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from mlopt.errors import InputError
from mlopt.formats.document import FormatSpec, check_header, header
from mlopt.formats.io import check_finite, read_document

GAMMA4 = 0.6  # the paper's empirical exponent (Sec. III-A, Observation 2)
KINDS = ("compute", "overlapped_comm", "exposed_comm")
COMM_KINDS = ("overlapped_comm", "exposed_comm")
BASE_FIELD = {"compute": "b_us", "overlapped_comm": "c_hat_bytes", "exposed_comm": "c_hat_bytes"}
PARAMETER_NAMES = (
    "alpha1", "alpha2",
    "gamma1", "gamma2", "gamma3", "gamma4",
    "q_gamma1", "q_gamma2", "q_gamma3", "q_gamma4",
)
# parameters fitted per kind (gamma4 / q_gamma4 are fixed); a fit needs at least len + 1 samples of a kind
FITTED = {
    "compute": ("alpha1", "alpha2"),
    "overlapped_comm": ("gamma1", "gamma2", "gamma3"),
    "exposed_comm": ("q_gamma1", "q_gamma2", "q_gamma3"),
}
MIN_DISTINCT_THREADS = {"compute": 2, "overlapped_comm": 3, "exposed_comm": 3}

# The document type. There is no schema file: `parse_samples` checks the fields itself.
CONTENTION_SAMPLES = FormatSpec("mlopt.contention-samples", "1.0", "")

# ---------------------------------------------------------------------------------------------------------
# Defaults.
#
# LIBRA publishes no fitted parameter values; its only numbers are Fig. 1(a) (BERT-Base, 8 x V100, 50 Gb
# RDMA: 112.7 MB of gradients, 25.7 ms of computation, and "from 0 to 2048 communication threads ... 38%
# increase in computation time") and the thread set R = {128, ..., 4096}. Taken literally for a linear
# eq. 5, 38% at 2048 gives alpha2 = (1 - 1/1.38)/2048 = 1.345e-4 per thread, whose denominator reaches 0 at
# r = 7437: that V100 point is kept as `PAPER_V100_BERT_PARAMETERS` (valid for the paper's r <= 4096) but
# is not the default. The default is a stated assumption for a current GPU and a ~100 Gb/s-class network:
#
# * compute: alpha1 = 1 (so g(b, 0) = b, b being the time without overlap) and compute 15% slower with 4096
#   communication threads: alpha2 = (1 - 1/1.15)/4096 = 3.1844e-5 (3.4% slower at 1024, 7% at 2048). The
#   denominator stays > 0.73 up to r = 8192 (35% slower there) and reaches 0 only at r = 31403.
# * exposed communication q: a ring all-reduce reaching gamma1 = 1e4 bytes/us (10 GB/s bus bandwidth) with
#   unlimited threads; gamma2 = 0.95 * gamma1 (5% of it with almost no threads); gamma3 = 0.09 so it is at
#   82% of the asymptote at 128 threads, 92% at 256, 98% at 512 and 99.7% at 1024 (one NCCL channel of 512
#   threads nearly saturates a NIC when nothing competes for the SMs).
# * overlapped communication p: contention costs 10% of the asymptotic rate (gamma1 = 9e3 bytes/us, the
#   memory bandwidth shared with the computation) and saturation takes more threads (gamma3 = 0.06: 69% of
#   its asymptote at 128 threads, 82% at 256, 92% at 512, 98% at 1024). For every r, p >= q (overlap never
#   speeds communication up).
#
# All three are monotone as the model intends: more threads, slower computation, faster (saturating)
# communication. `check_parameters` verifies this for any set.
DEFAULT_PARAMETERS: Mapping[str, float] = MappingProxyType({  # read-only: copy with dict(...) to change
    "alpha1": 1.0,
    "alpha2": (1.0 - 1.0 / 1.15) / 4096.0,
    "gamma1": 9.0e3,
    "gamma2": 0.95 * 9.0e3,
    "gamma3": 0.06,
    "gamma4": GAMMA4,
    "q_gamma1": 1.0e4,
    "q_gamma2": 0.95 * 1.0e4,
    "q_gamma3": 0.09,
    "q_gamma4": GAMMA4,
})

# The paper's one compute measurement (38% slower at 2048 threads, V100, BERT-Base) with the default
# communication parameters; the compute denominator is positive only for r < 7437.
PAPER_V100_BERT_PARAMETERS: Mapping[str, float] = MappingProxyType({
    **DEFAULT_PARAMETERS,
    "alpha2": (1.0 - 1.0 / 1.38) / 2048.0,
})


@dataclass(frozen=True)
class Sample:
    """One measurement: `base` is b_us for compute and c_hat_bytes for communication."""

    kind: str
    threads: int
    base: float
    measured_us: float
    startup_us: float = 0.0  # communication only: subtracted before fitting

    @property
    def model_us(self) -> float:
        """The part of the measurement the model predicts (transmission time for communication)."""
        return self.measured_us - self.startup_us


@dataclass(frozen=True)
class FitResult:
    parameters: dict[str, float]  # all of PARAMETER_NAMES
    rms_rel_error: dict[str, float]  # per kind: sqrt(mean(((model - measured) / measured)^2))
    max_rel_error: dict[str, float]  # per kind: max |model - measured| / measured
    counts: dict[str, int]  # samples per kind
    nfev: dict[str, int] = field(default_factory=dict)  # function evaluations of each least-squares fit

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": dict(self.parameters),
            "rms_rel_error": dict(self.rms_rel_error),
            "max_rel_error": dict(self.max_rel_error),
            "counts": dict(self.counts),
        }


# --- the model ---------------------------------------------------------------------------------------------


def _prefix(kind: str) -> str:
    return "q_" if kind == "exposed_comm" else ""


def denominator(params: Mapping[str, float], kind: str, threads: Any) -> Any:
    """alpha1 - alpha2 r for compute; the transmission rate (bytes/us) for communication. Vectorised."""
    r = np.asarray(threads, dtype=float)
    if kind == "compute":
        return params["alpha1"] - params["alpha2"] * r
    k = _prefix(kind)
    return params[k + "gamma1"] - params[k + "gamma2"] * np.exp(-params[k + "gamma3"] * r ** params[k + "gamma4"])


def predict_us(params: Mapping[str, float], kind: str, base: Any, threads: Any) -> Any:
    """g(b, r), p(c, r) or q(c, r) in us (vectorised over base and threads)."""
    return np.asarray(base, dtype=float) / denominator(params, kind, threads)


def compute_us(params: Mapping[str, float], b_us: float, threads: int) -> float:
    return float(predict_us(params, "compute", b_us, threads))


def comm_us(params: Mapping[str, float], c_hat_bytes: float, threads: int, overlapped: bool = True) -> float:
    return float(predict_us(params, "overlapped_comm" if overlapped else "exposed_comm", c_hat_bytes, threads))


def check_parameters(params: Mapping[str, float], max_threads: int = 8192, min_threads: int = 1) -> list[str]:
    """Problems with a parameter set over r in [min_threads, max_threads] (empty when fine): missing or
    non-finite values, a denominator <= 0, computation getting faster or communication slower with more
    threads."""
    missing = [n for n in PARAMETER_NAMES if n not in params]
    if missing:
        return [f"missing parameter(s): {', '.join(missing)}"]
    bad = [n for n in PARAMETER_NAMES if not math.isfinite(float(params[n]))]
    if bad:
        return [f"non-finite parameter(s): {', '.join(bad)}"]
    problems = []
    r = np.unique(np.concatenate([np.geomspace(max(min_threads, 1), max_threads, 200), [min_threads, max_threads]]))
    for kind in KINDS:
        d = denominator(params, kind, r)
        if np.any(d <= 0):
            first = int(r[np.argmax(d <= 0)])
            problems.append(f"{kind}: denominator <= 0 at r = {first}")
            continue
        steps = np.diff(d)
        if kind == "compute" and np.any(steps > 0):
            problems.append("compute: gets faster with more communication threads (alpha2 < 0)")
        if kind != "compute" and np.any(steps < 0):
            problems.append(f"{kind}: gets slower with more threads (gamma2 < 0 or gamma3 < 0)")
    return problems


# --- the sample document -----------------------------------------------------------------------------------


def _number(value: Any, source: str, where: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(source, where, f"expected a finite number, found {value!r:.60}")
    if positive and not value > 0:
        raise InputError(source, where, f"must be > 0, found {value!r}")
    if not positive and value < 0:
        raise InputError(source, where, f"must be >= 0, found {value!r}")
    return float(value)


def _sample(item: Any, source: str, where: str) -> Sample:
    if not isinstance(item, dict):
        raise InputError(source, where, f"expected an object, found {type(item).__name__}")
    kind = item.get("kind")
    if kind not in KINDS:
        raise InputError(source, f"{where}.kind", f"{kind!r} is not one of: {', '.join(KINDS)}")
    base_field = BASE_FIELD[kind]
    allowed = {"kind", "threads", base_field, "measured_us"} | ({"startup_us"} if kind in COMM_KINDS else set())
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise InputError(source, where, f"unknown field(s) for kind {kind!r}: {', '.join(unknown)}")
    for name in ("threads", base_field, "measured_us"):
        if name not in item:
            raise InputError(source, f"{where}.{name}", "missing required field")
    threads = item["threads"]
    least = 1 if kind in COMM_KINDS else 0
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < least:
        raise InputError(source, f"{where}.threads", f"expected an integer >= {least}, found {threads!r:.60}")
    base = _number(item[base_field], source, f"{where}.{base_field}")
    measured = _number(item["measured_us"], source, f"{where}.measured_us")
    startup = _number(item.get("startup_us", 0.0), source, f"{where}.startup_us", positive=False)
    if startup >= measured:
        raise InputError(source, f"{where}.startup_us", f"{startup} is not below measured_us {measured}")
    return Sample(kind, threads, base, measured, startup)


def parse_samples(doc: Any, source: str) -> list[Sample]:
    """Samples from a parsed mlopt.contention-samples document; InputError naming the field otherwise."""
    check_header(doc, CONTENTION_SAMPLES, source)
    check_finite(doc, source)
    unknown = sorted(set(doc) - {"format", "schema_version", "meta", "samples"})
    if unknown:
        raise InputError(source, "$", f"unknown field(s): {', '.join(unknown)}")
    items = doc.get("samples")
    if not isinstance(items, list):
        raise InputError(source, "$.samples", "missing or not a list of samples")
    return [_sample(item, source, f"$.samples[{i}]") for i, item in enumerate(items)]


def load_samples(path: str) -> list[Sample]:
    return parse_samples(read_document(path), str(path))


def samples_document(samples: Iterable[Sample], meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document for samples (write it with mlopt.formats.io.write_json)."""
    rows = []
    for s in samples:
        row: dict[str, Any] = {"kind": s.kind, "threads": int(s.threads), BASE_FIELD[s.kind]: s.base,
                               "measured_us": s.measured_us}
        if s.kind in COMM_KINDS and s.startup_us:
            row["startup_us"] = s.startup_us
        rows.append(row)
    doc: dict[str, Any] = {**header(CONTENTION_SAMPLES), "samples": rows}
    if meta:
        doc["meta"] = dict(meta)
    return doc


# --- synthetic samples -------------------------------------------------------------------------------------

SYNTHETIC_B_US = (2_000.0, 25_700.0)  # a small layer group and Fig. 1(a)'s 25.7 ms
SYNTHETIC_C_HAT_BYTES = (4 << 20, int(112.7e6 * 2 * 7 / 8))  # 4 MiB and Fig. 1(a)'s 112.7 MB ring on 8 nodes


def synthetic_samples(
    params: Mapping[str, float],
    threads: Sequence[int],
    seed: int = 0,
    noise: float = 0.0,
    b_us: Sequence[float] = SYNTHETIC_B_US,
    c_hat_bytes: Sequence[float] = SYNTHETIC_C_HAT_BYTES,
) -> list[Sample]:
    """Samples of every kind at every thread count and size, from the model with multiplicative Gaussian
    noise of relative standard deviation `noise` (factors clipped to >= 0.5). Deterministic for a seed."""
    if noise < 0:
        raise ValueError("noise must be >= 0")
    rng = np.random.default_rng(seed)
    out = []
    for kind in KINDS:
        bases = b_us if kind == "compute" else c_hat_bytes
        for r in threads:
            for base in bases:
                exact = float(predict_us(params, kind, base, r))
                if not (math.isfinite(exact) and exact > 0):
                    raise ValueError(f"{kind}: the parameters give no positive time at r = {r}")
                factor = max(0.5, 1.0 + noise * rng.standard_normal()) if noise else 1.0
                out.append(Sample(kind, int(r), float(base), exact * factor))
    return out


# --- the fit -----------------------------------------------------------------------------------------------


def _arrays(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.array([s.threads for s in samples], dtype=float)
    base = np.array([s.base for s in samples], dtype=float)
    y = np.array([s.model_us for s in samples], dtype=float)
    return r, base, y


def _solve(residuals, x0, lower, upper, kind: str, source: str):
    try:
        sol = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac",
                            xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
    except (ValueError, FloatingPointError) as exc:
        raise InputError(source, "$.samples", f"{kind}: the fit failed: {exc}") from None
    # status 0 (the evaluation cap) keeps the best point found: its quality shows in the residuals reported;
    # negative statuses are failures
    if sol.status < 0 or not np.all(np.isfinite(sol.x)) or not math.isfinite(sol.cost):
        raise InputError(source, "$.samples", f"{kind}: the fit did not converge: {sol.message}")
    return sol


def _fit_compute(samples: Sequence[Sample], source: str) -> tuple[dict[str, float], int]:
    """alpha1, alpha2 parametrised by the denominators u = d(r_min), v = d(r_max), both bounded > 0, so
    the fitted denominator is positive over the whole sampled range (it is linear in r)."""
    r, b, y = _arrays(samples)
    lo, hi = float(r.min()), float(r.max())
    a2_0, a1_0 = np.polyfit(r, b / y, 1) * np.array([-1.0, 1.0])  # linear in the reciprocal: b/y = a1 - a2 r
    floor = 1e-9 * max(float(np.max(b / y)), 1e-300)
    u0 = max(a1_0 - a2_0 * lo, 2 * floor)
    v0 = max(a1_0 - a2_0 * hi, 2 * floor)

    def unpack(x):
        u, v = x
        a2 = (u - v) / (hi - lo)
        return u + a2 * lo, a2

    def residuals(x):
        a1, a2 = unpack(x)
        return (b / (a1 - a2 * r)) / y - 1.0

    sol = _solve(residuals, [u0, v0], [floor, floor], [np.inf, np.inf], "compute", source)
    a1, a2 = unpack(sol.x)
    return {"alpha1": float(a1), "alpha2": float(a2)}, int(sol.nfev)


def _fit_comm(samples: Sequence[Sample], kind: str, gamma4: float, source: str) -> tuple[dict[str, float], int]:
    """gamma1..3 with gamma4 fixed, parametrised as rate(s) = g1 (1 - k exp(-g3 (s - s_min))), s = r^gamma4,
    with g1 > 0, k < 1, g3 >= 0 (box bounds): the rate is then positive for every r >= r_min (k < 1 is exactly
    positivity at r_min; for g3 >= 0 the rate is monotone in s). Starting point: for each g3 on a grid the
    rate is linear in (g1, g1 k), solved by least squares on the reciprocal; the best g3 seeds the fit."""
    r, c, y = _arrays(samples)
    s = r ** gamma4
    s_min = float(s.min())
    rate = c / y
    best = None
    scale_s = max(float(s.max() - s_min), 1e-12)
    for g3 in np.concatenate([[0.0], np.geomspace(1e-4, 1e2, 121) / scale_s]):
        e = np.exp(-g3 * (s - s_min))
        design = np.column_stack([np.ones_like(e), -e])
        coef, *_ = np.linalg.lstsq(design / rate[:, None], np.ones_like(rate), rcond=None)
        g1, g2m = coef
        if not g1 > 0:
            continue
        k = min(g2m / g1, 1.0 - 1e-6)
        pred = g1 * (1.0 - k * e)
        if np.any(pred <= 0):
            continue
        err = float(np.sum((rate / pred - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, g1, k, g3)
    if best is None:
        g1_0, k_0, g3_0 = float(np.max(rate)), 0.0, 1.0 / scale_s
    else:
        _, g1_0, k_0, g3_0 = best

    def residuals(x):
        g1, k, g3 = x
        pred_rate = g1 * (1.0 - k * np.exp(-g3 * (s - s_min)))
        return rate / pred_rate - 1.0  # = model_time / measured - 1

    # g3 at most the starting grid's largest value: beyond it the rate is a step between the two smallest r
    # (noise, not a trend), and exp(g3 s_min) below would overflow
    g3_max = 1e2 / scale_s
    sol = _solve(residuals, [g1_0, k_0, min(g3_0, g3_max)], [1e-300, -np.inf, 0.0], [np.inf, 1.0 - 1e-9, g3_max],
                 kind, source)
    g1, k, g3 = (float(v) for v in sol.x)
    try:
        g2 = k * g1 * math.exp(g3 * s_min)
    except OverflowError:
        g2 = math.inf
    p = _prefix(kind)
    if not math.isfinite(g2):
        raise InputError(source, "$.samples", f"{kind}: the fit did not converge: gamma2 overflows (gamma3 = {g3:g})")
    return {p + "gamma1": g1, p + "gamma2": g2, p + "gamma3": g3, p + "gamma4": gamma4}, int(sol.nfev)


def _check_counts(by_kind: Mapping[str, list[Sample]], source: str) -> None:
    for kind in KINDS:
        group = by_kind[kind]
        need = len(FITTED[kind]) + 1
        if len(group) < need:
            raise InputError(
                source, "$.samples",
                f"too few {kind!r} samples: {len(group)}, fitting its {len(FITTED[kind])} parameters "
                f"({', '.join(FITTED[kind])}) needs at least {need}",
            )
        distinct = len({s.threads for s in group})
        if distinct < MIN_DISTINCT_THREADS[kind]:
            raise InputError(
                source, "$.samples",
                f"too few distinct thread counts for {kind!r}: {distinct}, the fit needs at least "
                f"{MIN_DISTINCT_THREADS[kind]}",
            )


def _errors(params: Mapping[str, float], samples: Sequence[Sample], kind: str) -> tuple[float, float]:
    r, base, y = _arrays(samples)
    rel = predict_us(params, kind, base, r) / y - 1.0
    return float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel)))


def fit(samples: Sequence[Sample], source: str, gamma4: float = GAMMA4) -> FitResult:
    """Fit alpha1, alpha2 (compute samples), gamma1..3 (overlapped_comm) and q_gamma1..3 (exposed_comm), gamma4
    fixed, minimising relative time errors. InputError (naming `source`) when a kind has fewer samples than
    its parameters + 1 or too few distinct thread counts, or when a fit does not converge."""
    by_kind: dict[str, list[Sample]] = {kind: [] for kind in KINDS}
    for s in samples:
        if s.kind not in by_kind:
            raise InputError(source, "$.samples", f"unknown sample kind {s.kind!r}")
        by_kind[s.kind].append(s)
    _check_counts(by_kind, source)
    params: dict[str, float] = {}
    nfev: dict[str, int] = {}
    fitted, nfev["compute"] = _fit_compute(by_kind["compute"], source)
    params.update(fitted)
    for kind in COMM_KINDS:
        fitted, nfev[kind] = _fit_comm(by_kind[kind], kind, gamma4, source)
        params.update(fitted)
    rms, worst = {}, {}
    for kind in KINDS:
        rms[kind], worst[kind] = _errors(params, by_kind[kind], kind)
    return FitResult(
        parameters={name: params[name] for name in PARAMETER_NAMES},
        rms_rel_error=rms,
        max_rel_error=worst,
        counts={kind: len(by_kind[kind]) for kind in KINDS},
        nfev=nfev,
    )

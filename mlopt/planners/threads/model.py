"""LIBRA's problem and cost model (Liu et al., eq. 3-15): the ground truth every plan is measured against.

Units: compute in microseconds (us) as measured without overlap, gradients in bytes, threads r as the
number of GPU threads given to one all-reduce kernel.

All-reduce (3-4). A group of gradients of c bytes costs a + c_hat / x: a startup a and c_hat bytes sent
at a rate x that depends on r. The algorithm table ALLREDUCE_COSTS maps a name to (nodes, alpha_us) ->
AllReduceCost(startup_us=a, bytes_factor=c_hat / c); a ThreadsProblem may also carry such a function
itself instead of a name (pluggable). N = 1 costs nothing.

  ring              a = 2 (N-1) alpha            c_hat = 2 (N-1) / N c        (4)
  tree              a = 2 ceil(log2 N) alpha     c_hat = 2 c                  (pipelined reduce + broadcast)
  halving_doubling  a = 2 ceil(log2 N) alpha     c_hat = 2 (N-1) / N c        (Rabenseifner)

Contention (5-6), ContentionParams:
  g(b, r) = b / (alpha1 - alpha2 r)                                 compute b under an overlapping comm
  p(c, r) = c_hat / (gamma1 - gamma2 exp(-gamma3 r^gamma4))           overlapped transmission
  q(c, r) = c_hat / (delta1 - delta2 exp(-delta3 r^delta4))           exposed (non-overlapped) transmission
  (delta4 = gamma4 = 0.6 unless given)
A group's overlapped comm lasts D = p + a, its exposed comm E = q + a; a group with no gradient bytes
launches no all-reduce (D = E = 0, the paper's "c = 0" case of eq. 8 and 10).

Stages (7-15), `evaluate`. Groups 1..K in backward order; group i has compute b_i and bytes c_i. Stage 0
is the compute of group 1 alone; stage i >= 1 starts when the all-reduce of group i starts, which is as
soon as its gradients exist and the previous all-reduce has ended (communications are sequential,
compute is work-conserving). With s = s_b^i the compute (uncontended us) left when stage i starts:
  (8)  t_o = f_o = min(D, g(s, r))                      0 when D = 0 or s = 0
  (9)  delta_b = 1 - f_o / g(s, r)   (10) delta_c = 1 - f_o / D
  (11) f_b = s delta_b (compute left when the comm ends), t_c = f_c = E delta_c (the comm's exposed tail)
  (13) t_b = max(0, f_b - sum_{j >= i+2} b_j): compute alone until group i+1's gradients are ready
  (15) s_b^{i+1} = f_b - t_b
and the backward time (7) is b_1 + sum_i (t_o + t_b + t_c). Only one of t_b, t_c is nonzero.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union

import numpy as np


# ------------------------------------------------------------------------------------- contention


def _check_positive(what: str, value: np.ndarray, threads: np.ndarray) -> None:
    bad = ~(value > 0)
    if np.any(bad):
        r = int(np.asarray(threads).reshape(-1)[np.argmax(bad.reshape(-1))]) if np.ndim(threads) else int(threads)
        v = float(np.asarray(value).reshape(-1)[np.argmax(bad.reshape(-1))])
        raise ValueError(f"contention model: {what} = {v:.6g} <= 0 at r={r} threads; "
                         f"the fitted parameters do not cover this thread count")


@dataclass(frozen=True, kw_only=True)
class ContentionParams:
    """Fitted contention model, eq. (5) and (6). Keyword-only, so no field can be swapped silently.

    alpha1, alpha2: compute under contention, g(b, r) = b / (alpha1 - alpha2 r) [dimensionless, 1/thread].
    gamma1..gamma3: overlapped all-reduce rate gamma1 - gamma2 exp(-gamma3 r^gamma4) [bytes/us].
    delta1..delta3: exposed (non-overlapped) all-reduce rate, same form [bytes/us].
    gamma4: the paper's empirical exponent, 0.6; delta4: q's exponent, gamma4 unless given (the paper
    shares it; a fit that fixes its own keeps it here).
    """

    alpha1: float
    alpha2: float
    gamma1: float
    gamma2: float
    gamma3: float
    delta1: float
    delta2: float
    delta3: float
    gamma4: float = 0.6
    delta4: float | None = None

    def __post_init__(self) -> None:
        if self.delta4 is None:
            object.__setattr__(self, "delta4", self.gamma4)
        for name in ("alpha1", "alpha2", "gamma1", "gamma2", "gamma3", "delta1", "delta2", "delta3", "gamma4",
                     "delta4"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"contention model: {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))  # numpy scalars from a fit become plain floats

    # rates: the denominators of (5) and (6); every one must be > 0 for the model to make sense
    def compute_rate(self, r):
        """alpha1 - alpha2 r: the share of the GPU left to compute while r comm threads run (5)."""
        rate = self.alpha1 - self.alpha2 * np.asarray(r, dtype=float)
        _check_positive("alpha1 - alpha2*r", rate, r)
        return _plain(rate)

    def overlapped_rate(self, r):
        """gamma1 - gamma2 exp(-gamma3 r^gamma4) [bytes/us], transmission overlapped with compute (6)."""
        rate = self.gamma1 - self.gamma2 * np.exp(-self.gamma3 * np.asarray(r, dtype=float) ** self.gamma4)
        _check_positive("gamma1 - gamma2*exp(-gamma3*r^gamma4)", rate, r)
        return _plain(rate)

    def exposed_rate(self, r):
        """delta1 - delta2 exp(-delta3 r^delta4) [bytes/us], transmission with no compute beside it (q)."""
        rate = self.delta1 - self.delta2 * np.exp(-self.delta3 * np.asarray(r, dtype=float) ** self.delta4)
        _check_positive("delta1 - delta2*exp(-delta3*r^delta4)", rate, r)
        return _plain(rate)

    def compute_us(self, b_us, r):
        """g(b, r) (5): time of compute b (us without contention) beside a comm with r threads."""
        return _plain(np.asarray(b_us, dtype=float) / self.compute_rate(r))

    def overlapped_comm_us(self, c_hat_bytes, r):
        """p(c, r) (6): transmission time of c_hat bytes overlapped with compute (startup a excluded)."""
        return _plain(np.asarray(c_hat_bytes, dtype=float) / self.overlapped_rate(r))

    def exposed_comm_us(self, c_hat_bytes, r):
        """q(c, r): transmission time of c_hat bytes with no compute beside it (startup a excluded)."""
        return _plain(np.asarray(c_hat_bytes, dtype=float) / self.exposed_rate(r))


def _plain(x):
    """A float for a scalar result, the array otherwise."""
    return float(x) if np.ndim(x) == 0 else x


# ------------------------------------------------------------------------------------- all-reduce


@dataclass(frozen=True)
class AllReduceCost:
    """a and c_hat / c of eq. (3): startup time and bytes sent per gradient byte."""

    startup_us: float
    bytes_factor: float


def _ring(nodes: int, alpha_us: float) -> AllReduceCost:
    return AllReduceCost(2 * (nodes - 1) * alpha_us, 2 * (nodes - 1) / nodes)  # (4)


def _tree(nodes: int, alpha_us: float) -> AllReduceCost:
    if nodes == 1:
        return AllReduceCost(0.0, 0.0)
    return AllReduceCost(2 * math.ceil(math.log2(nodes)) * alpha_us, 2.0)


def _halving_doubling(nodes: int, alpha_us: float) -> AllReduceCost:
    return AllReduceCost(2 * math.ceil(math.log2(nodes)) * alpha_us, 2 * (nodes - 1) / nodes)


AllReduceCostFn = Callable[[int, float], AllReduceCost]
ALLREDUCE_COSTS: MappingProxyType[str, AllReduceCostFn] = MappingProxyType(
    {"ring": _ring, "tree": _tree, "halving_doubling": _halving_doubling})


# ---------------------------------------------------------------------------------------- problem


@dataclass(frozen=True)
class Layer:
    """One layer, in BACKWARD order: its backward compute (us, no contention) and its gradient bytes."""

    name: str
    compute_us: float
    grad_bytes: int


@dataclass(frozen=True)
class ThreadsProblem:
    """Layers in backward order (first = the model's last layer, whose gradient is ready first)."""

    layers: tuple[Layer, ...]
    nodes: int
    alpha_us: float
    thread_set: tuple[int, ...]
    params: ContentionParams
    algorithm: Union[str, AllReduceCostFn] = "ring"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "thread_set", tuple(self.thread_set))
        _validate_layers(self.layers)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be an integer >= 1, got {self.nodes!r}")
        if not math.isfinite(self.alpha_us) or self.alpha_us < 0:
            raise ValueError(f"alpha_us must be finite and >= 0, got {self.alpha_us!r}")
        _validate_threads(self.thread_set)
        if not isinstance(self.params, ContentionParams):
            raise ValueError("params must be a ContentionParams")
        for r in self.thread_set:  # every denominator of (5)-(6) positive on R; raises naming r
            self.params.compute_rate(r)
            self.params.overlapped_rate(r)
            self.params.exposed_rate(r)
        cost = allreduce_cost(self)
        if not (math.isfinite(cost.startup_us) and cost.startup_us >= 0 and math.isfinite(cost.bytes_factor)
                and cost.bytes_factor >= 0):
            raise ValueError(f"all-reduce cost model {self.algorithm!r} gave {cost}; need finite values >= 0")


def _validate_layers(layers: tuple[Layer, ...]) -> None:
    if not layers:
        raise ValueError("no layers: the problem needs at least one layer")
    for k, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise ValueError(f"layers[{k}] is not a Layer")
        if not math.isfinite(layer.compute_us) or layer.compute_us < 0:
            raise ValueError(f"layer {k} ({layer.name}): compute_us must be finite and >= 0, got {layer.compute_us}")
        if isinstance(layer.grad_bytes, bool) or not isinstance(layer.grad_bytes, (int, np.integer)) \
                or layer.grad_bytes < 0:
            raise ValueError(f"layer {k} ({layer.name}): grad_bytes must be an integer >= 0, got {layer.grad_bytes!r}")
    if all(layer.grad_bytes == 0 for layer in layers):
        raise ValueError("every layer has zero gradient bytes: there is nothing to all-reduce")


def _validate_threads(threads: tuple[int, ...]) -> None:
    if not threads:
        raise ValueError("empty thread set R: give at least one thread count")
    for r in threads:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r <= 0:
            raise ValueError(f"thread counts must be positive integers, got {r!r}")
    if len(set(threads)) != len(threads):
        raise ValueError(f"thread set has duplicates: {threads}")


def assumption_violations(problem: ThreadsProblem) -> tuple[str, ...]:
    """Where the fitted model breaks what Theorem 1's proof needs, per r in R (empty: the bound holds).

    * kappa_r = alpha1 - alpha2 r <= 1: contention never speeds compute up, so T* >= sum b (end of proof).
    * overlapped rate <= exposed rate (p >= q, Assumption 2): more compute left never shortens the rest
      of the backward pass (Lemma 3), so waiting for a chunk edge costs at most w.
    * exposed rate (1 - kappa_r) <= overlapped rate (Assumption 3 for every group size: overlapping never
      takes longer than running the two one after the other, p - q <= kappa (p + a)): starting a comm
      as early as possible never hurts (Lemma 4), so the plan's time is at most the DP's value.
    """
    found = []
    for r in problem.thread_set:
        kappa = problem.params.compute_rate(r)
        overlapped, exposed = problem.params.overlapped_rate(r), problem.params.exposed_rate(r)
        if kappa > 1:
            found.append(f"r={r}: alpha1 - alpha2*r = {kappa:.6g} > 1 (contention speeds compute up)")
        if overlapped > exposed:
            found.append(f"r={r}: overlapped rate {overlapped:.6g} > exposed rate {exposed:.6g} B/us "
                         f"(overlap speeds communication up; Assumption 2, Lemma 3)")
        if exposed * (1 - kappa) > overlapped:
            found.append(f"r={r}: exposed rate x (1 - kappa) = {exposed * (1 - kappa):.6g} > overlapped rate "
                         f"{overlapped:.6g} B/us (overlap can take longer than serial; Assumption 3, Lemma 4)")
    return tuple(found)


def allreduce_cost(problem: ThreadsProblem) -> AllReduceCost:
    """a and c_hat / c (3)-(4) for the problem's algorithm and node count."""
    algorithm = problem.algorithm
    if callable(algorithm):
        return algorithm(problem.nodes, problem.alpha_us)
    if algorithm not in ALLREDUCE_COSTS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; known: {', '.join(ALLREDUCE_COSTS)}")
    return ALLREDUCE_COSTS[algorithm](problem.nodes, problem.alpha_us)


def comm_durations(problem: ThreadsProblem, grad_bytes, threads):
    """(D, E) = (p + a, q + a): overlapped and exposed all-reduce time of a group; 0 when it has no bytes.

    Broadcasts over numpy arrays of bytes and threads.
    """
    cost = allreduce_cost(problem)
    c = np.asarray(grad_bytes, dtype=float)
    c_hat = cost.bytes_factor * c  # (4)
    overlapped = c_hat / problem.params.overlapped_rate(threads) + cost.startup_us  # (3) with p (6)
    exposed = c_hat / problem.params.exposed_rate(threads) + cost.startup_us  # (3) with q
    launched = c > 0
    return np.where(launched, overlapped, 0.0), np.where(launched, exposed, 0.0)


def stage_parts(compute_us, rate, overlapped_us, exposed_us):
    """(f_o, f_b, f_c) of eq. (8)-(11) for a comm (durations D, E) beside compute b at compute rate kappa.

    compute_us = b (us without contention); rate = alpha1 - alpha2 r; overlapped_us = D = p + a;
    exposed_us = E = q + a. Vectorised (numpy broadcasting); returns arrays of the broadcast shape.
    """
    b = np.asarray(compute_us, dtype=float)
    g = b / rate  # (5) g(b, r)
    d = np.asarray(overlapped_us, dtype=float)
    f_o = np.where((d > 0) & (b > 0), np.minimum(d, g), 0.0)  # (8)
    with np.errstate(divide="ignore", invalid="ignore"):
        delta_b = np.where(b > 0, 1.0 - f_o / g, 0.0)  # (9)
        delta_c = np.where(d > 0, 1.0 - f_o / d, 0.0)  # (10)
    return f_o, b * delta_b, np.asarray(exposed_us, dtype=float) * delta_c  # (11)


# ------------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Group:
    """Layers [first, last] (backward-order indices, inclusive) fused into one all-reduce with `threads`."""

    first: int
    last: int
    threads: int


@dataclass(frozen=True)
class Evaluation:
    """Backward time (7) and, per group, its stage (keys documented in `evaluate`)."""

    backward_us: float
    stages: tuple[dict[str, Any], ...]


def check_groups(problem: ThreadsProblem, groups: Sequence[Group]) -> None:
    """Groups must cover layers 0..L-1 contiguously in order, with positive thread counts."""
    if not groups:
        raise ValueError("no groups: a plan needs at least one group")
    expected = 0
    for n, group in enumerate(groups):
        if group.first != expected or group.last < group.first:
            raise ValueError(f"group {n} is [{group.first}, {group.last}]; groups must cover the layers "
                             f"contiguously in backward order, so it must start at layer {expected}")
        if isinstance(group.threads, bool) or not isinstance(group.threads, (int, np.integer)) or group.threads <= 0:
            raise ValueError(f"group {n}: threads must be a positive integer, got {group.threads!r}")
        expected = group.last + 1
    if expected != len(problem.layers):
        raise ValueError(f"groups end at layer {expected - 1}, but the problem has {len(problem.layers)} layers")


def _rates(params: ContentionParams, r: int) -> tuple[float, float, float]:
    """(alpha1 - alpha2 r, overlapped rate, exposed rate) in plain floats; raises naming r when one is <= 0."""
    kappa = params.alpha1 - params.alpha2 * r
    overlapped = params.gamma1 - params.gamma2 * math.exp(-params.gamma3 * r ** params.gamma4)
    exposed = params.delta1 - params.delta2 * math.exp(-params.delta3 * r ** params.delta4)
    if not (kappa > 0 and overlapped > 0 and exposed > 0):
        params.compute_rate(r), params.overlapped_rate(r), params.exposed_rate(r)  # raise the message
    return kappa, overlapped, exposed


def _stage_parts_scalar(b: float, rate: float, d: float, e: float) -> tuple[float, float, float]:
    """`stage_parts` for plain floats (the same operations, so the same results)."""
    g = b / rate  # (5)
    f_o = min(d, g) if d > 0 and b > 0 else 0.0  # (8)
    f_b = b * (1.0 - f_o / g) if b > 0 else 0.0  # (9), (11)
    f_c = e * (1.0 - f_o / d) if d > 0 else 0.0  # (10), (11)
    return f_o, f_b, f_c


def evaluate(problem: ThreadsProblem, groups: Sequence[Group]) -> Evaluation:
    """The stage model (7)-(15) for a fusion + thread plan, communications starting as early as possible.

    Stage keys (times in us from the start of the backward pass): group (1-based), first, last, threads,
    grad_bytes, c_hat_bytes, compute_us (b_i), overlapped_comm_us (D = p + a), exposed_comm_us (E = q + a),
    comm_start_us, remaining_compute_us (s_b^i), overlap_us (t_o), residual_compute_us (t_b),
    residual_comm_us (t_c), comm_end_us, stage_us (t_o + t_b + t_c), stage_end_us.
    """
    check_groups(problem, groups)
    cost = allreduce_cost(problem)
    b = [math.fsum(layer.compute_us for layer in problem.layers[g.first:g.last + 1]) for g in groups]
    c = [sum(int(layer.grad_bytes) for layer in problem.layers[g.first:g.last + 1]) for g in groups]
    after = [math.fsum(b[i:]) for i in range(len(b))] + [0.0, 0.0]  # after[i] = sum_{j >= i} b_j
    time = b[0]  # stage 0: compute of group 1 alone
    remaining = after[1]  # s_b^1
    stages = []
    for i, group in enumerate(groups):
        rate, overlapped_rate, exposed_rate = _rates(problem.params, group.threads)
        c_hat = cost.bytes_factor * c[i]  # (4)
        d = c_hat / overlapped_rate + cost.startup_us if c[i] > 0 else 0.0  # (3) with p (6)
        e = c_hat / exposed_rate + cost.startup_us if c[i] > 0 else 0.0  # (3) with q
        t_o, f_b, t_c = _stage_parts_scalar(remaining, rate, d, e)  # (12)
        t_b = max(0.0, f_b - after[i + 2])  # (13), with f_b = s_hat_b^i (14)
        stage_us = t_o + t_b + t_c
        stages.append({
            "group": i + 1, "first": group.first, "last": group.last, "threads": int(group.threads),
            "grad_bytes": c[i], "c_hat_bytes": c_hat, "compute_us": b[i],
            "overlapped_comm_us": d, "exposed_comm_us": e, "comm_start_us": time,
            "remaining_compute_us": remaining, "overlap_us": t_o, "residual_compute_us": t_b,
            "residual_comm_us": t_c, "comm_end_us": time + t_o + t_c, "stage_us": stage_us,
            "stage_end_us": time + stage_us})
        time += stage_us
        remaining = f_b - t_b  # (15)
    return Evaluation(backward_us=time, stages=tuple(stages))

"""LIBRA's dynamic programs: threads for a fixed fusion (eq. 16-19) and co-optimised fusion (21-23, Alg. 1).

Discretisation (Fig. 4). The total backward compute is cut into Z chunks of w = sum_l b_l / Z; in the DP
every all-reduce starts at a chunk edge. T(i, l, z) is the earliest end of stage i when the first l
layers (backward order) form i groups and z chunks of compute are done; T(0, 0, z) = z w. A group
l'+1..l may start at chunk z' only once its gradients exist, z' w >= n(l) (GetMinChunkID), and its
stage lasts, with the compute window W = (z - z') w,

  h = f_o(c, W, r) + f_b(c, W, r) + f_c(c, W, r)           (18)-(19), eq. (8)-(11) with b = W
  h = inf when z < Z and f_c > 0: the comm must end before the compute window does, unless z = Z.

Speed. For z < Z a finite h is always W + D (1 - kappa_r) (D = p + a, kappa_r = alpha1 - alpha2 r), and
it is finite iff z - z' >= dmin(c, r), the fewest chunks that outlast the comm. So (23) becomes

  T(i, l, z) - z w = min over l', r of  D (1 - kappa_r) + min_{zlo(l) <= z' <= z - dmin} (T(i-1, l', z') - z' w)

a prefix minimum over z' gathered at z - dmin: O(K L^2 Z J) with no inner loop over z', vectorised over
i, l', r and z (numpy); only the column z = Z (compute finished inside the stage, any f_c allowed) is
searched over every z'. Exact: the same optimum as a plain loop over (l', z', r), just faster.

The DP's value T(K, Z) (`grid_us`) is the time of its plan with every start on a chunk edge. The plan it
returns is run as the paper does, communications starting as early as possible (`evaluate`), which
gives `backward_us` <= grid_us when the model obeys the paper's assumptions (Lemma 4); Theorem 1 then
bounds it by (1 + (K-1)/Z) times the optimum over plans with at most K groups and threads in R.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mlopt.planners.threads.model import Group, ThreadsProblem, check_groups, comm_durations, evaluate, stage_parts

# Brute force refuses more plans than this (it is a test oracle for small L).
BRUTE_FORCE_MAX_PLANS = 2_000_000


@dataclass(frozen=True)
class DPResult:
    """A plan, its backward time as `evaluate` measures it, and the guarantee that applies to it.

    backward_us: evaluate(problem, groups).backward_us (comms start as early as possible).
    bound_factor: backward_us <= bound_factor x the optimum (Theorem 1: 1 + (K-1)/Z; 1 for brute force).
    grid_us: the DP's own value T(K, Z) (17)/(23), every comm starting at a chunk edge; NaN for brute force.
    """

    groups: tuple[Group, ...]
    backward_us: float
    bound_factor: float
    grid_us: float = math.nan


@dataclass(frozen=True)
class _Grid:
    """The discretised problem: chunk size, earliest start chunk per layer boundary, per-layer data."""

    Z: int
    w: float  # chunk size (us of uncontended compute)
    zlo: np.ndarray  # (L+1,) zlo[l] = min z with z w >= n(l), GetMinChunkID
    cum_bytes: np.ndarray  # (L+1,) bytes of layers 0..l-1
    threads: np.ndarray  # (J,) R
    rate: np.ndarray  # (J,) kappa_r = alpha1 - alpha2 r


def _grid(problem: ThreadsProblem, Z: int) -> _Grid:
    if isinstance(Z, bool) or not isinstance(Z, (int, np.integer)) or Z < 1:
        raise ValueError(f"Z (number of compute chunks) must be an integer >= 1, got {Z!r}")
    compute = np.array([layer.compute_us for layer in problem.layers], dtype=float)
    n = np.concatenate([[0.0], np.cumsum(compute)])
    w = n[-1] / Z
    if w > 0:  # (17) n(l) <= z' w; the tolerance keeps float noise from pushing a start past its edge
        zlo = np.clip(np.ceil(n / w - 1e-9), 0, Z).astype(np.int64)
    else:
        zlo = np.zeros(len(n), dtype=np.int64)
    zlo[-1] = Z  # the last group's gradients exist only when all compute is done
    cum_bytes = np.concatenate([[0], np.cumsum([int(layer.grad_bytes) for layer in problem.layers])])
    threads = np.array(problem.thread_set, dtype=np.int64)
    return _Grid(int(Z), float(w), zlo, cum_bytes, threads, np.asarray(problem.params.compute_rate(threads)))


def _dmin(d: np.ndarray, rate: np.ndarray, grid: _Grid) -> np.ndarray:
    """Fewest chunks n with g(n w, r) >= D: the comm ends inside the window, f_c = 0 (19). Z+1: never."""
    Z, w = grid.Z, grid.w
    if w == 0:
        return np.where(d > 0, Z + 1, 0)
    n = np.clip(np.ceil(d * rate / w), 0, Z + 1)

    def fits(m):  # the comparison stage_parts makes: f_o = D (not g) iff g(m w) >= D
        return (m * w) / rate >= d

    n = np.where((n > 0) & fits(n - 1), n - 1, n)
    n = np.where((n <= Z) & ~fits(n), n + 1, n)
    return np.where(d > 0, n, 0).astype(np.int64)


def _relax(prev: np.ndarray, zlo: int, d: np.ndarray, e: np.ndarray, grid: _Grid):
    """(17)/(23) for the states ending a group at one layer boundary l, from M candidate previous boundaries.

    prev: (B, M, Z+1) T(i-1, l'_m, z') for a batch of B group counts; d, e: (M, J) comm durations D, E of
    the group l'_m+1..l with each thread count. Returns T (B, Z+1), argm and argj (B, Z+1) (the chosen
    predecessor and thread index) and argz (B,) (z' of the z = Z column; interior z' are recovered by
    `_interior_start`).
    """
    B, M, width = prev.shape
    Z, w, J = grid.Z, grid.w, grid.rate.size
    zs = np.arange(width)
    # z < Z: h = (z - z') w + D (1 - kappa) iff z - z' >= dmin  (18), (19)
    shifted = prev - zs * w
    shifted[..., :zlo] = np.inf  # (17) the group's gradients must exist when its comm starts
    prefix = np.minimum.accumulate(shifted, axis=-1)
    dmin = _dmin(d, grid.rate[None, :], grid)  # (M, J)
    cost = d * (1.0 - grid.rate[None, :])  # (M, J)
    start = zs[None, None, :Z] - dmin[:, :, None]  # (M, J, Z) latest allowed z'
    flat = np.where(start >= 0, np.arange(M)[:, None, None] * width + start, M * width)  # sentinel: inf
    table = np.concatenate([prefix.reshape(B, M * width), np.full((B, 1), np.inf)], axis=1)
    cand = (table[:, flat] + cost[None, :, :, None]).reshape(B, M * J, Z)
    best = np.argmin(cand, axis=1)  # (B, Z)
    value = np.empty((B, width))
    value[:, :Z] = np.take_along_axis(cand, best[:, None, :], axis=1)[:, 0, :] + zs[:Z] * w
    argm = np.empty((B, width), dtype=np.int64)
    argj = np.empty((B, width), dtype=np.int64)
    argm[:, :Z], argj[:, :Z] = np.divmod(best, J)
    # z = Z: any z' >= zlo, the comm may outlast the compute (f_c > 0)
    window = (Z - zs) * w
    f_o, f_b, f_c = stage_parts(window[None, :, None], grid.rate[None, None, :], d[:, None, :], e[:, None, :])
    h = f_o + f_b + f_c  # (M, Z+1, J)
    hj = np.argmin(h, axis=2)
    hmin = np.take_along_axis(h, hj[:, :, None], axis=2)[:, :, 0]
    hmin[:, :zlo] = np.inf
    last = (prev + hmin[None]).reshape(B, M * width)
    pick = np.argmin(last, axis=1)
    value[:, Z] = last[np.arange(B), pick]
    argm[:, Z], argz = np.divmod(pick, width)
    argj[:, Z] = hj[argm[:, Z], argz]
    return value, argm, argj, argz


def _interior_start(prev_row: np.ndarray, zlo: int, z: int, dmin: int, w: float) -> int:
    """z' of an interior state (z < Z): the argmin of T(i-1, l', z') - z' w over zlo <= z' <= z - dmin."""
    zs = np.arange(zlo, z - dmin + 1)
    return int(zlo + np.argmin(prev_row[zlo:z - dmin + 1] - zs * w))


def _group_durations(problem: ThreadsProblem, grid: _Grid, bytes_: np.ndarray):
    d, e = comm_durations(problem, bytes_[:, None], grid.threads[None, :])
    return np.asarray(d, dtype=float), np.asarray(e, dtype=float)


def _finish(problem: ThreadsProblem, groups: list[Group], factor: float, grid_us: float) -> DPResult:
    return DPResult(tuple(groups), evaluate(problem, groups).backward_us, factor, float(grid_us))


# ---------------------------------------------------------------------------------------- polish

# Local search stops after this many improving moves per start (each is strict, so it stops anyway;
# L = 160, K = 10 takes up to ~170).
POLISH_MAX_MOVES = 1_000


def _neighbours(problem: ThreadsProblem, groups: list[Group], K: int, fusion_fixed: bool):
    """Plans one move away: another thread count for a group; unless the fusion is fixed, also a merge
    of two neighbouring groups, a boundary moved by one layer, or a group split in two (<= K groups)."""
    for n, g in enumerate(groups):
        for r in problem.thread_set:
            if r != g.threads:
                yield groups[:n] + [Group(g.first, g.last, r)] + groups[n + 1:]
    if fusion_fixed:
        return
    for n in range(len(groups) - 1):
        a, b = groups[n], groups[n + 1]
        for r in dict.fromkeys((a.threads, b.threads)):
            yield groups[:n] + [Group(a.first, b.last, r)] + groups[n + 2:]
        if a.last > a.first:
            moved = [Group(a.first, a.last - 1, a.threads), Group(a.last, b.last, b.threads)]
            yield groups[:n] + moved + groups[n + 2:]
        if b.last > b.first:
            moved = [Group(a.first, a.last + 1, a.threads), Group(b.first + 1, b.last, b.threads)]
            yield groups[:n] + moved + groups[n + 2:]
    if len(groups) < K:
        for n, g in enumerate(groups):
            for cut in range(g.first, g.last):
                yield groups[:n] + [Group(g.first, cut, g.threads), Group(cut + 1, g.last, g.threads)] + groups[n + 1:]


def _polish(problem: ThreadsProblem, groups: list[Group], K: int, fusion_fixed: bool) -> list[Group]:
    """First-improvement local search on `evaluate`'s time from the DP's plan (not in the paper: it only
    removes part of the discretisation loss; the result is never slower than the DP's plan)."""
    best = evaluate(problem, groups).backward_us
    for _ in range(POLISH_MAX_MOVES):
        for candidate in _neighbours(problem, groups, K, fusion_fixed):
            us = evaluate(problem, candidate).backward_us
            if us < best * (1 - 1e-12):
                groups, best = candidate, us
                break
        else:
            break
    return groups


# ------------------------------------------------------------------------------- fixed fusion


def _check_fusion(problem: ThreadsProblem, fusion: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    fusion = [(int(first), int(last)) for first, last in fusion]
    check_groups(problem, [Group(first, last, 1) for first, last in fusion])
    return fusion


def threads_for_fusion(problem: ThreadsProblem, fusion: Sequence[tuple[int, int]], Z: int,
                       polish: bool = False) -> DPResult:
    """Threads per group for a given fusion (layer ranges in backward order), eq. (16)-(19).

    With polish (off by default: the paper's DP alone, as LIBRA-M uses it; each move of the local search
    costs O(groups^2 |R|)), the DP's threads are then improved one group at a time.
    """
    fusion = _check_fusion(problem, fusion)
    grid = _grid(problem, Z)
    k, width = len(fusion), grid.Z + 1
    table = np.full((k + 1, width), np.inf)
    table[0] = np.arange(width) * grid.w  # stage 0: compute only
    args = []
    for g, (first, last) in enumerate(fusion, start=1):  # (17)
        bytes_ = np.array([grid.cum_bytes[last + 1] - grid.cum_bytes[first]])
        d, e = _group_durations(problem, grid, bytes_)
        value, argm, argj, argz = _relax(table[g - 1][None, None, :], int(grid.zlo[last + 1]), d, e, grid)
        table[g] = value[0]
        args.append((argj[0], argz[0], d[0]))
    z, groups = grid.Z, []
    for g in range(k, 0, -1):  # GatherResults
        first, last = fusion[g - 1]
        argj, argz, d = args[g - 1]
        j = int(argj[z])
        zlo = int(grid.zlo[last + 1])
        if z == grid.Z:
            zp = int(argz)
        else:
            zp = _interior_start(table[g - 1], zlo, z, int(_dmin(d[j:j + 1], grid.rate[j:j + 1], grid)[0]), grid.w)
        groups.append(Group(first, last, int(grid.threads[j])))
        z = zp
    groups.reverse()
    if polish:
        groups = _polish(problem, groups, k, fusion_fixed=True)
    return _finish(problem, groups, 1.0 + (k - 1) / grid.Z, table[k, grid.Z])


# ---------------------------------------------------------------------------------- co-optimise


def _check_k(K: int) -> int:
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K (maximum number of groups) must be an integer >= 1, got {K!r}")
    return int(K)


def _backtrack(problem, grid, table, argm, argj, argz, i: int) -> list[Group]:
    """GatherResults (Algorithm 1): the groups of the state (i, L, Z)."""
    l, z, groups = len(problem.layers), grid.Z, []
    while i > 0:
        lp, j = int(argm[i, l, z]), int(argj[i, l, z])
        if z == grid.Z:
            zp = int(argz[i, l])
        else:
            d, _ = _group_durations(problem, grid, np.array([grid.cum_bytes[l] - grid.cum_bytes[lp]]))
            dmin = int(_dmin(d[:, j], grid.rate[j:j + 1], grid)[0])
            zp = _interior_start(table[i - 1, lp], int(grid.zlo[l]), z, dmin, grid.w)
        groups.append(Group(lp, l - 1, int(grid.threads[j])))
        i, l, z = i - 1, lp, zp
    if l != 0:
        raise AssertionError("backtracking did not reach the first layer")
    return groups[::-1]


def _co_tables(problem: ThreadsProblem, K: int, grid: _Grid):
    """T(i, l, z) of (23) for i <= K (Algorithm 1, lines 1-15) and the choices that reach each state."""
    L, width = len(problem.layers), grid.Z + 1
    table = np.full((K + 1, L + 1, width), np.inf)
    table[0, 0] = np.arange(width) * grid.w  # Algorithm 1, line 5
    argm = np.zeros((K + 1, L + 1, width), dtype=np.int64)
    argj = np.zeros((K + 1, L + 1, width), dtype=np.int64)
    argz = np.zeros((K + 1, L + 1), dtype=np.int64)
    for l in range(1, L + 1):  # (23), every predecessor boundary l' < l and group count i at once
        batch = min(K, l)
        d, e = _group_durations(problem, grid, grid.cum_bytes[l] - grid.cum_bytes[:l])
        value, am, aj, az = _relax(table[:batch, :l], int(grid.zlo[l]), d, e, grid)
        table[1:batch + 1, l], argm[1:batch + 1, l], argj[1:batch + 1, l], argz[1:batch + 1, l] = value, am, aj, az
    return table, argm, argj, argz


def co_optimise(problem: ThreadsProblem, K: int, Z: int, polish: bool = True) -> DPResult:
    """Fusion into at most K contiguous groups co-optimised with their threads, eq. (21)-(23), Algorithm 1.

    T(i, l, z) for i <= K groups; the paper's answer is the least T(i, L, Z) over i <= K (at most K
    groups; the paper reaches the same with empty groups). Here every state (i, L, Z) is backtracked to
    its plan, polished (with polish: a local search on `evaluate`, see `_polish`) and evaluated; the
    fastest is returned. That is never slower than the paper's pick, so Theorem 1 still bounds it.
    grid_us is T(i, L, Z) of the plan it started from: backward_us <= grid_us whenever Lemma 4 holds.
    """
    K = min(_check_k(K), len(problem.layers))
    grid = _grid(problem, Z)
    L = len(problem.layers)
    table, argm, argj, argz = _co_tables(problem, K, grid)
    best = None
    for i in range(1, K + 1):
        if not math.isfinite(table[i, L, grid.Z]):
            continue
        groups = _backtrack(problem, grid, table, argm, argj, argz, i)
        if polish:
            groups = _polish(problem, groups, K, fusion_fixed=False)
        result = _finish(problem, groups, 1.0 + (K - 1) / grid.Z, table[i, L, grid.Z])
        if best is None or result.backward_us < best.backward_us:
            best = result
    return best


# ---------------------------------------------------------------------------------- brute force


def _compositions(L: int, K: int):
    for k in range(1, min(K, L) + 1):
        for cuts in itertools.combinations(range(1, L), k - 1):
            bounds = (0, *cuts, L)
            yield [(bounds[n], bounds[n + 1] - 1) for n in range(k)]


def brute_force(problem: ThreadsProblem, K: int) -> DPResult:
    """The optimum over every fusion into <= K contiguous groups and every thread choice from R, by `evaluate`."""
    K = _check_k(K)
    L, J = len(problem.layers), len(problem.thread_set)
    plans = sum(math.comb(L - 1, k - 1) * J ** k for k in range(1, min(K, L) + 1))
    if plans > BRUTE_FORCE_MAX_PLANS:
        raise ValueError(f"brute force would evaluate {plans} plans (limit {BRUTE_FORCE_MAX_PLANS}); use small L")
    best_groups, best_us = None, math.inf
    for fusion in _compositions(L, K):
        for threads in itertools.product(problem.thread_set, repeat=len(fusion)):
            groups = [Group(first, last, r) for (first, last), r in zip(fusion, threads)]
            us = evaluate(problem, groups).backward_us
            if us < best_us:
                best_groups, best_us = groups, us
    return DPResult(tuple(best_groups), best_us, 1.0)

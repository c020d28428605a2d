"""Large-neighbourhood search on the memory ILP: improve the incumbent where branch and bound stalls.

Branch and bound on MONeT's ResNet-50 model (12 k columns, 22 k rows) barely moves from its warm start
within minutes: the LP bound is weak and the search tree wide. Schedules improve locally, though: what a
band of neighbouring nodes stores, recomputes and which implementations they run can be re-optimised
with everything else held. Each round fixes every binary that concerns no node of a band (a node range,
chosen at random) to the incumbent's value and solves the rest exactly; the sub-MILPs have a tenth of
the binaries and solve in about a second. A round that finds a cheaper feasible vector replaces the
incumbent. After BAND_PATIENCE rounds without a gain the band grows by BAND_GROWTH, so moves that trade
memory between distant nodes become reachable; the search ends when the band spans the model and
still finds nothing, or when its time is up.

Every incumbent is a vector of the same ILP, checked against all its rows, so the branch-and-bound
bound of that ILP bounds it too: the plan's bound and gap keep their meaning.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from mlopt.solvers import MatrixForm, is_feasible
from mlopt.solvers.base import SolveOptions

# First band: this many consecutive nodes (about a ResNet bottleneck stage's worth of operators).
BAND_NODES = 40
# After this many rounds in a row without a cheaper schedule, the band grows ...
BAND_PATIENCE = 12
# ... by this factor.
BAND_GROWTH = 1.5
# A round's sub-MILP stops after this many seconds (it keeps its best vector).
ROUND_LIMIT_S = 20.0
# A round counts as a gain only when it saves more than this fraction of the objective (solver noise).
MIN_GAIN = 1e-9


@dataclass(frozen=True)
class SearchOutcome:
    x: np.ndarray  # the best vector found (the start when nothing better was)
    stats: dict[str, Any]  # rounds, improvements, start and end objectives, last band


def column_nodes(meaning: tuple) -> tuple[int, ...] | None:
    """The nodes a column's decision concerns (see ilp.py's variables), None for continuous auxiliaries."""
    kind = meaning[0]
    if kind in ("sN", "d", "dh"):  # s_j^N, delta_{i,l}, delta_hat_{k,l}
        return (meaning[1],)
    if kind in ("r", "dk", "K"):  # r_i^k, delta^k_{i,l}, s_j^{k-1}: stage k and the node it acts on
        return (meaning[1], meaning[2])
    return None


def band_bounds(form: MatrixForm, nodes: list[tuple[int, ...] | None], x: np.ndarray,
                lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Column bounds with every binary outside nodes [lo, hi) fixed to x; also the number left free."""
    col_lb, col_ub = form.col_lb.copy(), form.col_ub.copy()
    free = 0
    for c, where in enumerate(nodes):
        if where is None or not form.integrality[c]:
            continue
        if any(lo <= v < hi for v in where):
            free += 1
        else:
            col_lb[c] = col_ub[c] = x[c]
    return col_lb, col_ub, free


def search(form: MatrixForm, meanings: list[tuple], num_nodes: int, x0: np.ndarray, solver: Any,
           options: SolveOptions, seconds: float, fill_aux: Callable[[np.ndarray], None],
           first_band: int = BAND_NODES) -> SearchOutcome:
    """Improve the feasible vector x0 by band re-optimisation for at most `seconds` (see the module doc).

    `fill_aux` sets the continuous auxiliaries of a rounded vector to their least values (ilp.py). Once
    the band spans all nodes a round solves the whole ILP, so a search that ends by itself (rather than
    by its time) ends at an optimum within options.mip_gap."""
    deadline = time.perf_counter() + max(0.0, seconds)
    rng = random.Random(options.seed)
    nodes = [column_nodes(m) for m in meanings]
    cost = lambda v: float(form.c @ v + form.constant)  # noqa: E731
    best_x, best = x0, cost(x0)
    start = best
    band = max(1, min(first_band, num_nodes))
    rounds = gains = misses = 0
    while time.perf_counter() < deadline - 1e-3:
        if misses >= BAND_PATIENCE:
            if band >= num_nodes:
                break
            band, misses = min(num_nodes, int(math.ceil(band * BAND_GROWTH))), 0
        lo = rng.randrange(0, num_nodes - band + 1)
        col_lb, col_ub, _ = band_bounds(form, nodes, best_x, lo, lo + band)
        limit = min(ROUND_LIMIT_S, deadline - time.perf_counter())
        if limit <= 1e-3:
            break
        result = solver.solve(replace(form, col_lb=col_lb, col_ub=col_ub),
                              replace(options, time_limit_s=limit, dump_model=None), start=best_x)
        rounds += 1
        x = rounded(form, result.x, fill_aux) if result.status.has_solution and result.x is not None else None
        if x is not None and cost(x) < best - MIN_GAIN * abs(best) and is_feasible(form, x):
            best_x, best = x, cost(x)
            gains, misses = gains + 1, 0
        else:
            misses += 1
    stats = {"rounds": rounds, "improvements": gains, "start_objective": start, "objective": best,
             "last_band_nodes": band, "ended": "converged" if misses >= BAND_PATIENCE else "time"}
    return SearchOutcome(best_x, stats)


def rounded(form: MatrixForm, x: np.ndarray, fill_aux: Callable[[np.ndarray], None]) -> np.ndarray:
    """A copy of the solver's vector x with binaries rounded and auxiliaries at their least values."""
    out = np.array(x, dtype=np.float64)
    out[form.integrality] = np.round(out[form.integrality])
    fill_aux(out)
    return out

"""Solver-independent result types and the adapter base class.

Every backend adapter subclasses `Solver` and implements `_solve`, which turns a `MatrixForm` into an
`Outcome`. The base class does everything that must be identical across backends: input checks, the
optional MPS dump, timing, the gap definition and turning unexpected backend exceptions into
`Status.ERROR` results (solver failures are returned as values, never raised).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from mlopt.errors import MloptError
from mlopt.solvers.model import MatrixForm, Model
from mlopt.solvers.mps import write_mps

# Warm start as given by callers: {column index: value} (partial allowed) or a dense vector, NaN = unset.
Start = Mapping[int, float] | np.ndarray | None
# A normalised warm start as adapters receive it: (column indices, values).
StartArrays = tuple[np.ndarray, np.ndarray] | None


class Status(str, enum.Enum):
    """Outcome of a solve. Closed set: planners switch on it exhaustively."""

    OPTIMAL = "optimal"  # proven optimal within the requested mip_gap
    FEASIBLE = "feasible"  # has an incumbent, optimality not proven (stopped at a limit)
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    TIME_LIMIT_NO_SOLUTION = "time-limit-no-solution"
    ERROR = "error"  # solver crashed, could not run, or stopped for a reason we cannot classify

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE)


class SolverUnavailable(MloptError):
    """An explicitly requested solver cannot be used here (not installed, no licence). Exit code 2."""

    exit_code = 2

    def __init__(self, solver: str, reason: str):
        self.solver = solver
        self.reason = reason
        super().__init__(f"solver '{solver}' is unavailable: {reason}")


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str  # why not (or a short description of what was found when ok)


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float | None = None  # wall-clock limit; None = no limit
    node_limit: int | None = None  # branch-and-bound nodes; unlike a time limit, gives the same result every run
    mip_gap: float = 1e-4  # relative gap at which a MIP counts as optimal
    threads: int = 1  # solver threads; 1 keeps runs reproducible and cheap on shared machines
    seed: int = 0  # random seed for the solver's heuristics (0 = the solver's fixed default)
    verbose: bool = False  # stream the solver's log to stdout
    dump_model: str | None = None  # write the model as free MPS here before solving (offline re-solves)

    def __post_init__(self) -> None:
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0 or None, got {self.time_limit_s}")
        if self.node_limit is not None and self.node_limit < 1:
            raise ValueError(f"node_limit must be >= 1 or None, got {self.node_limit}")
        if not 0 <= self.mip_gap < 1:
            raise ValueError(f"mip_gap must be in [0, 1), got {self.mip_gap}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class SolveResult:
    """What a solve produced.

    objective: objective value of `x` in the model's own sense (incl. constant); None without a solution.
    best_bound: the solver's proven bound on the optimum (a lower bound when minimising, upper when
        maximising); None when unknown. For LPs solved to optimality it equals `objective`.
    gap: 0.0 when OPTIMAL (proved within mip_gap; best_bound keeps the solver's actual bound), otherwise
        |objective - best_bound| / max(|objective|, 1e-9), inf when the bound is infinite, None when there
        is no solution or no bound.
    """

    status: Status
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    x: np.ndarray | None
    solver: str
    solver_version: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """What an adapter's `_solve` reports; the base class turns it into a `SolveResult`."""

    status: Status
    x: np.ndarray | None = None
    objective: float | None = None  # None: computed from x
    best_bound: float | None = None
    message: str = ""


GAP_DENOMINATOR_FLOOR = 1e-9  # keeps the relative gap finite when the objective is 0


def relative_gap(status: Status, objective: float | None, bound: float | None) -> float | None:
    """The gap as documented on `SolveResult`."""
    if objective is None or not status.has_solution:
        return None
    if status is Status.OPTIMAL:
        return 0.0
    if bound is None:
        return None
    if math.isinf(bound):
        return math.inf
    return abs(objective - bound) / max(abs(objective), GAP_DENOMINATOR_FLOOR)


def normalize_start(start: Start, num_vars: int) -> StartArrays:
    """Warm start as (indices, values) arrays, or None. Raises ValueError on a malformed start."""
    if start is None:
        return None
    if isinstance(start, Mapping):
        idx = np.fromiter((int(i) for i in start.keys()), dtype=np.int64, count=len(start))
        val = np.fromiter((float(v) for v in start.values()), dtype=np.float64, count=len(start))
    else:
        dense = np.asarray(start, dtype=np.float64)
        if dense.shape != (num_vars,):
            raise ValueError(f"start vector has shape {dense.shape}, expected ({num_vars},)")
        idx = np.flatnonzero(~np.isnan(dense))
        val = dense[idx]
    if idx.size and (idx.min() < 0 or idx.max() >= num_vars):
        raise ValueError(f"start refers to a variable index outside [0, {num_vars})")
    if not np.all(np.isfinite(val)):
        raise ValueError("start values must be finite")
    return idx, val


def crossed_bounds_outcome(form: MatrixForm) -> Outcome | None:
    """INFEASIBLE when some bounds admit no value (e.g. an integer column in [0.2, 0.8]); backends disagree
    on such input (CBC rejects the model), so it never reaches them."""
    crossed = np.flatnonzero(form.col_lb > form.col_ub)
    if crossed.size:
        name = form.col_names[crossed[0]]
        return Outcome(Status.INFEASIBLE, message=f"variable {name} has no (integer) value within its bounds")
    crossed = np.flatnonzero(form.row_lb > form.row_ub)
    if crossed.size:
        return Outcome(Status.INFEASIBLE, message=f"constraint {form.row_names[crossed[0]]} has lb > ub")
    return None


def empty_model_outcome(form: MatrixForm) -> Outcome:
    """Solve a model without variables directly: backends disagree on (or reject) empty models."""
    rows_hold = bool(np.all(form.row_lb <= 0.0) and np.all(form.row_ub >= 0.0))
    if not rows_hold:
        return Outcome(Status.INFEASIBLE, message="model has no variables and a row excluding 0")
    return Outcome(Status.OPTIMAL, x=np.zeros(0), objective=form.constant, best_bound=form.constant)


def _violations(form: MatrixForm, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bound and row violations >= 0, the bound each is measured against, integrality violations)."""
    activity = form.A @ x
    col = np.maximum(np.maximum(form.col_lb - x, x - form.col_ub), 0.0)
    row = np.maximum(np.maximum(form.row_lb - activity, activity - form.row_ub), 0.0)
    col_ref = np.where(x < form.col_lb, form.col_lb, np.where(x > form.col_ub, form.col_ub, 0.0))
    row_ref = np.where(activity < form.row_lb, form.row_lb, np.where(activity > form.row_ub, form.row_ub, 0.0))
    return np.r_[col, row], np.abs(np.r_[col_ref, row_ref]), np.abs(x - np.round(x))[form.integrality]


def max_violation(form: MatrixForm, x: np.ndarray) -> float:
    """Largest absolute violation of bounds, rows and integrality by `x` (0.0 when feasible)."""
    linear, _, integrality = _violations(form, x)
    return float(max(np.max(linear, initial=0.0), np.max(integrality, initial=0.0)))


def is_feasible(form: MatrixForm, x: np.ndarray, tol: float = 1e-6, integrality_tol: float = 1e-5) -> bool:
    """Whether `x` satisfies `form`: bound/row violations within tol * (1 + |violated bound|), integrality
    within integrality_tol (solvers' own tolerances are of this order, so their solutions pass)."""
    linear, reference, integrality = _violations(form, x)
    return bool(np.all(linear <= tol * (1.0 + reference)) and np.all(integrality <= integrality_tol))


def classify_unbounded_or_infeasible(solver: Solver, form: MatrixForm, options: SolveOptions) -> Outcome:
    """Decide a solver's "infeasible or unbounded" (or a MIP whose relaxation is unbounded) by solving the
    feasibility problem (zero objective): feasible means unbounded, infeasible means infeasible."""
    feasibility = solver._solve(replace(form, c=np.zeros(form.num_vars), constant=0.0), options, None)
    if feasibility.status.has_solution:
        return Outcome(Status.UNBOUNDED, message="unbounded (feasible, objective unbounded)")
    if feasibility.status is Status.INFEASIBLE:
        return Outcome(Status.INFEASIBLE, message="infeasible")
    if feasibility.status is Status.TIME_LIMIT_NO_SOLUTION:
        return Outcome(Status.TIME_LIMIT_NO_SOLUTION, message="time limit while deciding infeasible vs unbounded")
    return Outcome(Status.ERROR, message=f"infeasible or unbounded, undecided: {feasibility.message}")


class Solver:
    """Base class for backend adapters. Subclasses set `name` and implement the three hooks."""

    name: str = ""

    def available(self) -> Availability:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def _solve(self, form: MatrixForm, options: SolveOptions, start: StartArrays) -> Outcome:
        raise NotImplementedError

    def solve(self, model: Model | MatrixForm, options: SolveOptions | None = None, start: Start = None) -> SolveResult:
        """Solve `model`. Malformed input (bad start) raises ValueError; solver failures return Status.ERROR."""
        options = options or SolveOptions()
        form = model.to_arrays() if isinstance(model, Model) else model
        start_arrays = normalize_start(start, form.num_vars)
        t0 = time.perf_counter()
        outcome = self._run_guarded(form, options, start_arrays)
        return self._finish(form, outcome, time.perf_counter() - t0)

    def _run_guarded(self, form: MatrixForm, options: SolveOptions, start: StartArrays) -> Outcome:
        if options.dump_model:
            try:
                write_mps(form, options.dump_model)
            except (OSError, ValueError) as exc:
                return Outcome(Status.ERROR, message=f"could not write dump_model {options.dump_model}: {exc}")
        availability = self.available()
        if not availability.ok:
            return Outcome(Status.ERROR, message=f"{self.name} unavailable: {availability.reason}")
        crossed = crossed_bounds_outcome(form)
        if crossed is not None:
            return crossed
        if form.num_vars == 0:
            return empty_model_outcome(form)
        try:
            return self._solve(form, options, start)
        except Exception as exc:  # noqa: BLE001 - the contract is: solver failures are values, not raises
            return Outcome(Status.ERROR, message=f"{self.name} failed: {type(exc).__name__}: {exc}")

    def _finish(self, form: MatrixForm, outcome: Outcome, wall_time_s: float) -> SolveResult:
        if outcome.status.has_solution and outcome.x is None:
            outcome = Outcome(Status.ERROR, message=f"{self.name} reported {outcome.status.value} but returned no x")
        x = outcome.x if outcome.status.has_solution else None
        objective = None
        if x is not None:
            objective = float(form.c @ x + form.constant) if outcome.objective is None else outcome.objective
        try:
            version = self.version()
        except Exception:  # noqa: BLE001 - a version lookup must not turn a result into a raise
            version = "unknown"
        return SolveResult(
            status=outcome.status,
            objective=objective,
            best_bound=outcome.best_bound,
            gap=relative_gap(outcome.status, objective, outcome.best_bound),
            wall_time_s=wall_time_s,
            x=x,
            solver=self.name,
            solver_version=version,
            message=outcome.message,
        )

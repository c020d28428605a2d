"""Solver-independent MILP layer: build a `Model`, pick a backend, get a `SolveResult`.

    model = Model(); x = model.add_binary("x", obj=-1); model.add_le([x], [1], 1)
    solver, note = resolve_solver("auto")
    result = solver.solve(model, SolveOptions(time_limit_s=60))
    if result.status.has_solution: ...

Solver failures come back as `Status` values, never as exceptions.
"""

from mlopt.solvers.base import (
    Availability,
    Solver,
    SolveOptions,
    SolveResult,
    SolverUnavailable,
    Status,
    is_feasible,
    max_violation,
)
from mlopt.solvers.model import MatrixForm, Model
from mlopt.solvers.mps import write_mps
from mlopt.solvers.registry import get_solver, list_solvers, resolve_solver

__all__ = [
    "Availability",
    "MatrixForm",
    "Model",
    "SolveOptions",
    "SolveResult",
    "Solver",
    "SolverUnavailable",
    "Status",
    "get_solver",
    "is_feasible",
    "list_solvers",
    "max_violation",
    "resolve_solver",
    "write_mps",
]

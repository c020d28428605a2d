"""`mlopt solvers`: which backends work on this machine, checked on a known-optimum MILP."""

from __future__ import annotations

from typing import Any

from mlopt.solvers.base import SolveOptions, Solver, Status
from mlopt.solvers.model import Model
from mlopt.solvers.registry import get_solver, list_solvers

# max 10a + 13b + 7c  s.t.  4a + 6b + 3c <= 9, binary: b + c (weight 9) is best, value 20.
KNAPSACK_OPTIMUM = 20.0


def knapsack_check_model() -> Model:
    model = Model("knapsack_check")
    x = [model.add_binary(name) for name in ("a", "b", "c")]
    model.add_le(x, [4, 6, 3], 9)
    model.set_objective(x, [10, 13, 7], sense="max")
    return model


def check_solver(solver: Solver) -> str:
    result = solver.solve(knapsack_check_model(), SolveOptions(time_limit_s=30))
    if result.status is Status.OPTIMAL and abs(result.objective - KNAPSACK_OPTIMUM) < 1e-6:
        return f"ok: knapsack optimum {result.objective:g} proved in {result.wall_time_s:.3f} s"
    return f"FAILED: {result.status.value}, objective {result.objective}, expected {KNAPSACK_OPTIMUM:g} ({result.message})"


def solver_report(check: bool) -> list[dict[str, Any]]:
    rows = []
    for name in list_solvers():
        solver = get_solver(name)
        availability = solver.available()
        row = {"name": name, "available": availability.ok,
               "version": solver.version() if availability.ok else "-", "note": availability.reason}
        if check and availability.ok:
            row["check"] = check_solver(solver)
        rows.append(row)
    return rows

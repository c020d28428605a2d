"""Turning a solver result into the Plan every planner returns (status, objective, bound, gap, time)."""

from __future__ import annotations

from typing import Any

from mlopt.formats.plan import Plan, PlanStatus, Provenance, input_hashes
from mlopt.planners.options import PlannerOptions
from mlopt.solvers import SolveResult, Status

STATUS_TO_PLAN = {
    Status.OPTIMAL: PlanStatus.OPTIMAL,
    Status.FEASIBLE: PlanStatus.FEASIBLE,
    Status.INFEASIBLE: PlanStatus.INFEASIBLE,
    Status.UNBOUNDED: PlanStatus.ERROR,  # a planner's model is never meant to be unbounded
    Status.TIME_LIMIT_NO_SOLUTION: PlanStatus.TIME_LIMIT_NO_SOLUTION,
    Status.ERROR: PlanStatus.ERROR,
}


def plan_from_solve(kind: str, result: SolveResult, payload: dict[str, Any], inputs: dict[str, Any],
                    options: PlannerOptions, wall_time_s: float, notes: tuple[str, ...] = ()) -> Plan:
    """A Plan whose status, objective, bound and gap are exactly what the solver reported."""
    provenance = Provenance(input_hashes(inputs), result.solver, result.solver_version, options.to_dict())
    return Plan(kind, STATUS_TO_PLAN[result.status], result.objective, result.best_bound, result.gap,
                wall_time_s, payload, provenance, notes)


def heuristic_plan(kind: str, objective: float | None, payload: dict[str, Any], inputs: dict[str, Any],
                   options: PlannerOptions, wall_time_s: float, notes: tuple[str, ...] = (),
                   best_bound: float | None = None) -> Plan:
    """A Plan made without a solver (baselines, searches): never "optimal"; no gap unless the planner has a
    valid lower bound of its own (`best_bound`, minimisation), then gap = (objective - bound) / objective."""
    provenance = Provenance(input_hashes(inputs), "none", "", options.to_dict())
    gap = None
    if best_bound is not None and objective is not None and objective > 0:
        gap = max(0.0, (objective - best_bound) / objective)
    return Plan(kind, PlanStatus.HEURISTIC, objective, best_bound, gap, wall_time_s, payload, provenance, notes)

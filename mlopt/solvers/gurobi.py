"""Gurobi adapter (gurobipy), usable only with a full licence.

The pip wheel of gurobipy ships a size-limited licence (2000 variables / 2000 constraints) that fails on
planner-sized models, so `available()` probes it: it optimises an empty-constraint model with one
variable more than that limit and reports the size-limit error (code 10010) as "unavailable". A licence
is never required: without gurobipy or without a licence the adapter just reports unavailable.

Warm start: MVar.Start (partial: unset entries are GRB.UNDEFINED). Bound: Model.ObjBound for MIPs.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mlopt.solvers.base import (
    Availability,
    Outcome,
    SolveOptions,
    Solver,
    StartArrays,
    Status,
    classify_unbounded_or_infeasible,
)
from mlopt.solvers.model import MatrixForm

SIZE_LIMITED_MAX_VARS = 2000  # limit of the licence bundled with the pip wheel
SIZE_LIMIT_ERRNO = 10010  # GRB_ERROR_SIZE_LIMIT_EXCEEDED

# Gurobi status codes (gurobipy.GRB.Status), spelled out so this module reads without gurobipy.
_OPTIMAL, _INFEASIBLE, _INF_OR_UNBD, _UNBOUNDED, _TIME_LIMIT = 2, 3, 4, 5, 9
_LIMITS = {7: "iteration limit", 8: "node limit", 10: "solution limit", 11: "interrupted", 13: "suboptimal",
           15: "objective limit", 16: "work limit", 17: "memory limit"}


def _import_gurobipy():
    import gurobipy  # lazy: optional dependency; ImportError is reported as "unavailable"

    return gurobipy


def _first_clause(exc: Exception) -> str:
    # Gurobi messages append "; visit https://..." - keep the one-line cause.
    return str(getattr(exc, "message", None) or exc).split(";")[0].strip()


def _quiet_env(gp, verbose: bool = False):
    env = gp.Env(empty=True)
    env.setParam("OutputFlag", int(verbose))
    env.start()
    return env


def probe_licence(gp) -> Availability:
    """Whether gurobipy module `gp` has a licence that solves models beyond the size-limited pip licence."""
    try:
        env = _quiet_env(gp)
    except gp.GurobiError as exc:
        return Availability(False, f"no usable Gurobi licence ({_first_clause(exc)})")
    model = None
    try:
        model = gp.Model(env=env)
        model.addVars(SIZE_LIMITED_MAX_VARS + 1)
        model.optimize()
    except gp.GurobiError as exc:
        if getattr(exc, "errno", None) == SIZE_LIMIT_ERRNO or "size-limited" in str(exc):
            return Availability(False, f"size-limited pip licence detected ({_first_clause(exc)})")
        return Availability(False, f"Gurobi licence check failed ({_first_clause(exc)})")
    finally:
        if model is not None:
            model.dispose()
        env.dispose()
    return Availability(True, "full Gurobi licence")


def _add_rows(gp, model, x, form: MatrixForm) -> None:
    A = sp.csr_matrix(form.A)
    lb, ub = form.row_lb, form.row_ub
    equal = lb == ub
    for rows, sense, rhs in (
        (np.flatnonzero(equal), "=", lb),
        (np.flatnonzero(~equal & np.isfinite(ub)), "<", ub),  # ranged rows get both a "<" and a ">" row
        (np.flatnonzero(~equal & np.isfinite(lb)), ">", lb),
    ):
        if rows.size:
            model.addMConstr(A[rows], x, sense, rhs[rows])


def _build(gp, env, form: MatrixForm, options: SolveOptions, start: StartArrays):
    GRB = gp.GRB
    model = gp.Model(form.name, env=env)
    vtype = np.where(form.integrality, GRB.INTEGER, GRB.CONTINUOUS)
    x = model.addMVar(form.num_vars, lb=form.col_lb, ub=form.col_ub, obj=form.c, vtype=vtype)
    model.ModelSense = GRB.MAXIMIZE if form.sense == "max" else GRB.MINIMIZE
    model.ObjCon = form.constant
    _add_rows(gp, model, x, form)
    if options.time_limit_s is not None:
        model.Params.TimeLimit = options.time_limit_s
    if options.node_limit is not None:
        model.Params.NodeLimit = options.node_limit
    model.Params.MIPGap = options.mip_gap
    model.Params.Threads = options.threads
    model.Params.Seed = options.seed
    if start is not None:
        values = np.full(form.num_vars, GRB.UNDEFINED)
        values[start[0]] = start[1]
        x.Start = values
    return model, x


class GurobiSolver(Solver):
    name = "gurobi"

    def __init__(self) -> None:
        self._availability: Availability | None = None  # the licence probe is slow-ish: once per instance

    def available(self) -> Availability:
        if self._availability is None:
            try:
                gp = _import_gurobipy()
            except Exception as exc:  # noqa: BLE001 - ImportError or a broken install: not usable
                self._availability = Availability(False, f"gurobipy not installed ({exc})")
            else:
                self._availability = probe_licence(gp)
        return self._availability

    def version(self) -> str:
        return ".".join(str(v) for v in _import_gurobipy().gurobi.version())

    def _solve(self, form: MatrixForm, options: SolveOptions, start: StartArrays) -> Outcome:
        gp = _import_gurobipy()
        env = _quiet_env(gp, options.verbose)
        model = None
        try:
            model, x = _build(gp, env, form, options, start)
            model.optimize()
            return self._outcome(model, x, form, options)
        finally:
            if model is not None:
                model.dispose()
            env.dispose()

    def _outcome(self, model, x, form: MatrixForm, options: SolveOptions) -> Outcome:
        status, has_incumbent = model.Status, model.SolCount > 0
        if status == _OPTIMAL:
            objective = float(model.ObjVal)
            bound = float(model.ObjBound) if form.is_mip else objective
            return Outcome(Status.OPTIMAL, x=np.array(x.X), objective=objective, best_bound=bound)
        if status == _INFEASIBLE:
            return Outcome(Status.INFEASIBLE, message="infeasible")
        if status == _UNBOUNDED:
            return Outcome(Status.UNBOUNDED, message="unbounded")
        if status == _INF_OR_UNBD:
            return classify_unbounded_or_infeasible(self, form, options)
        reason = "time limit" if status == _TIME_LIMIT else _LIMITS.get(status)
        if reason is None:
            return Outcome(Status.ERROR, message=f"gurobi: status code {status}")
        if not has_incumbent:
            no_solution = Status.TIME_LIMIT_NO_SOLUTION if status == _TIME_LIMIT else Status.ERROR
            return Outcome(no_solution, message=f"gurobi stopped ({reason}) without a feasible solution")
        bound = float(model.ObjBound) if form.is_mip else None
        return Outcome(Status.FEASIBLE, x=np.array(x.X), objective=float(model.ObjVal), best_bound=bound,
                       message=f"gurobi stopped ({reason}) with a feasible solution")

"""HiGHS adapter (embedded through highspy; the default backend).

The model is passed in one `passModel` call with CSC arrays, so building a 100k-variable model costs no
per-variable Python calls.

Threads: HiGHS runs every solve in a process on one global task scheduler, created on the first run with
the `threads` option of that run; a later run asking for another thread count fails with "global
scheduler has already been initialized". Since there is no API to ask the scheduler its size, the adapter
calls `Highs.resetGlobalScheduler(blocking=True)` before every run (cheap: it only tears down idle
worker threads). Consequence: do not run two HiGHS solves concurrently in one process.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

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


def _import_highspy():
    # lazy: a broken highspy install must read as unavailable in `mlopt solvers`, not fail importing mlopt.solvers
    import highspy

    return highspy


def _pass_model(h, highspy, form: MatrixForm) -> None:
    A = form.A
    sense = highspy.ObjSense.kMaximize if form.sense == "max" else highspy.ObjSense.kMinimize
    status = h.passModel(
        form.num_vars,
        form.num_constraints,
        int(A.nnz),
        int(highspy.MatrixFormat.kColwise),
        int(sense),
        float(form.constant),
        np.ascontiguousarray(form.c, dtype=np.float64),
        np.ascontiguousarray(form.col_lb, dtype=np.float64),
        np.ascontiguousarray(form.col_ub, dtype=np.float64),
        np.ascontiguousarray(form.row_lb, dtype=np.float64),
        np.ascontiguousarray(form.row_ub, dtype=np.float64),
        np.ascontiguousarray(A.indptr, dtype=np.int32),
        np.ascontiguousarray(A.indices, dtype=np.int32),
        np.ascontiguousarray(A.data, dtype=np.float64),
        form.integrality.astype(np.int32),  # HighsVarType: 0 continuous, 1 integer
    )
    if status == highspy.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the model (passModel returned kError)")


def _set_options(h, options: SolveOptions) -> None:
    h.setOptionValue("output_flag", bool(options.verbose))
    h.setOptionValue("mip_rel_gap", float(options.mip_gap))
    h.setOptionValue("threads", int(options.threads))
    h.setOptionValue("random_seed", int(options.seed))
    if options.time_limit_s is not None:
        h.setOptionValue("time_limit", float(options.time_limit_s))
    if options.node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(options.node_limit))


def _solution_x(h, highspy) -> np.ndarray | None:
    if h.getInfo().primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return None
    return np.array(h.getSolution().col_value, dtype=np.float64)


def _limit_outcome(h, highspy, form: MatrixForm, why: str) -> Outcome:
    x = _solution_x(h, highspy)
    if x is None:
        status = Status.TIME_LIMIT_NO_SOLUTION if why == "time limit" else Status.ERROR
        return Outcome(status, message=f"HiGHS stopped ({why}) without a feasible solution")
    info = h.getInfo()
    bound = float(info.mip_dual_bound) if form.is_mip else None
    return Outcome(Status.FEASIBLE, x=x, objective=float(info.objective_function_value), best_bound=bound,
                   message=f"HiGHS stopped ({why}) with a feasible solution")


class HighsSolver(Solver):
    name = "highs"

    def available(self) -> Availability:
        try:
            highspy = _import_highspy()
            highspy.Highs()
        except Exception as exc:  # noqa: BLE001 - any import/ABI failure means "not usable here"
            return Availability(False, f"highspy cannot be used: {type(exc).__name__}: {exc}")
        return Availability(True, f"highspy {self.version()}")

    def version(self) -> str:
        highspy = _import_highspy()
        return f"{highspy.HIGHS_VERSION_MAJOR}.{highspy.HIGHS_VERSION_MINOR}.{highspy.HIGHS_VERSION_PATCH}"

    def _solve(self, form: MatrixForm, options: SolveOptions, start: StartArrays) -> Outcome:
        highspy = _import_highspy()
        h = highspy.Highs()
        _set_options(h, options)
        _pass_model(h, highspy, form)
        notes = []
        if start is not None:
            idx, val = start
            if h.setSolution(int(idx.size), idx.astype(np.int32), val.astype(np.float64)) == highspy.HighsStatus.kError:
                notes.append("warm start rejected by HiGHS")
        highspy.Highs.resetGlobalScheduler(True)  # see module docstring: lets `threads` differ between runs
        run_status = h.run()
        outcome = self._outcome(h, highspy, form, options, run_status)
        if notes:
            outcome = replace(outcome, message="; ".join(filter(None, [outcome.message, *notes])))
        return outcome

    def _outcome(self, h, highspy, form: MatrixForm, options: SolveOptions, run_status) -> Outcome:
        ms = highspy.HighsModelStatus
        model_status = h.getModelStatus()
        if model_status == ms.kOptimal:
            info = h.getInfo()
            objective = float(info.objective_function_value)
            bound = float(info.mip_dual_bound) if form.is_mip else objective
            return Outcome(Status.OPTIMAL, x=_solution_x(h, highspy), objective=objective, best_bound=bound)
        if model_status == ms.kInfeasible:
            return Outcome(Status.INFEASIBLE, message="infeasible")
        if model_status == ms.kUnbounded:
            return Outcome(Status.UNBOUNDED, message="unbounded")
        if model_status == ms.kUnboundedOrInfeasible:
            return classify_unbounded_or_infeasible(self, form, options)
        if model_status == ms.kTimeLimit:
            return _limit_outcome(h, highspy, form, "time limit")
        limits = {ms.kIterationLimit: "iteration limit", ms.kSolutionLimit: "solution limit",
                  ms.kInterrupt: "interrupted", ms.kObjectiveBound: "objective bound",
                  ms.kObjectiveTarget: "objective target", ms.kMemoryLimit: "memory limit"}
        if model_status in limits:
            return _limit_outcome(h, highspy, form, limits[model_status])
        described = h.modelStatusToString(model_status)
        return Outcome(Status.ERROR, message=f"HiGHS: {described} (run status {run_status.name})")

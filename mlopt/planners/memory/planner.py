"""`mlopt plan memory`: pick a schedule under a memory budget and wrap it in a Plan.

Every algorithm's schedule goes through the same replay (`replay.py`) before it is written, so the
plan's predicted peak and compute are the replay's figures, not the solver's: the solver's objective
must agree with them (a mismatch is a bug and raises).

Budgets: `budget_bytes`, or `budget_ratio` times the store-all (PyTorch default) replayed peak. A
budget that no algorithm fits raises InfeasibleError (exit 3) naming the least feasible budget found:
the smallest replayed peak among the leanest baseline and the schedules tried.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from mlopt.errors import InfeasibleError
from mlopt.formats.plan import Plan, PlanStatus, Provenance, input_hashes
from mlopt.formats.sizes import format_size
from mlopt.planners.memory import baselines
from mlopt.planners.memory.baselines import least_memory
from mlopt.planners.memory.ilp import solve_memory_ilp
from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.memory.replay import ScheduleError, replay
from mlopt.planners.memory.schedule import Schedule
from mlopt.planners.options import PlannerOptions
from mlopt.planners.result import heuristic_plan, plan_from_solve

ALGORITHMS = ("monet", "checkpoint-only", "sqrt", "store-all", "greedy")
# `mlopt plan --model` has no budget flag: it plans for half the store-all peak (MONeT's mid range).
DEFAULT_BUDGET_RATIO = 0.5
# When no --time-limit is given the ILPs still stop: MONeT-sized models otherwise run for hours.
DEFAULT_ILP_TIME_LIMIT_S = 300.0
# What the ILP's bound and gap refer to: the reduced model, not every schedule of the full MONeT problem.
BOUND_SCOPE = ("bound and gap of the reduced ILP (recomputation window, merged stages); schedules outside it, "
               "e.g. a baseline's, may be cheaper")
# Relative tolerance when checking the solver's objective against the replayed compute time.
OBJECTIVE_RTOL = 1e-6
# MONeT first solves the checkpoint-only ILP (with the same --time-limit, which is per solve) and starts
# the joint ILP from that plan, at the window it reached: the joint model contains every checkpoint-only
# schedule, so the joint plan is never worse than the checkpoint-only plan of the same budget and limit.
CHECKPOINT_ONLY_START = "checkpoint-only ILP"
# An ILP solve with a time limit gives branch and bound (1 - this share) of it; when that does not prove
# optimality, large-neighbourhood search (neighbourhood.py) improves its incumbent for the rest: on
# ResNet-50 the search improves a schedule far faster than branch and bound does.
DEFAULT_SEARCH_SHARE = 0.5


@dataclass(frozen=True)
class MemoryOptions:
    algorithm: str = "monet"  # --algorithm: monet | checkpoint-only | sqrt | store-all | greedy
    budget_bytes: int | None = None  # --budget: absolute memory budget (tensors + workspace)
    budget_ratio: float | None = None  # --budget-ratio: budget as a fraction of the store-all peak
    ops_profile: dict[str, Any] | None = None  # --ops: operator implementations profile (parsed document)
    search_share: float = DEFAULT_SEARCH_SHARE  # --search-share: share of each ILP's time limit kept for neighbourhood search

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "budget_bytes": self.budget_bytes, "budget_ratio": self.budget_ratio,
                "search_share": self.search_share}


@dataclass(frozen=True)
class MemoryResult:
    plan: Plan
    schedule: Schedule
    replay: Any  # ReplayResult of the schedule
    checkpoint_only: "MemoryResult | None" = None  # monet: the checkpoint-only plan it started from


def resolve_budget(problem_peak_store_all: int, options: MemoryOptions) -> int:
    if options.budget_bytes is not None:
        return int(options.budget_bytes)
    ratio = DEFAULT_BUDGET_RATIO if options.budget_ratio is None else options.budget_ratio
    return int(math.floor(ratio * problem_peak_store_all))


def _ilp_options(options: PlannerOptions) -> PlannerOptions:
    if options.time_limit_s is not None:
        return options
    return PlannerOptions(**{**options.__dict__, "time_limit_s": DEFAULT_ILP_TIME_LIMIT_S})


def _ratio(value: float, reference: float) -> float:
    """value / reference; 1.0 when both are zero (a trace whose ops all take 0 us: no overhead, not a crash)."""
    return value / reference if reference > 0 else (1.0 if value == 0 else math.inf)


def _figures(replayed: Any, reference: Any, least_us: float) -> dict[str, Any]:
    return {
        "peak_bytes": replayed.peak_bytes,
        "compute_us": replayed.compute_us,
        "recompute_us": replayed.recompute_us,
        "forward_end_bytes": replayed.forward_end_bytes,
        "memory_ratio": _ratio(replayed.peak_bytes, reference.peak_bytes),
        "compute_overhead": _ratio(replayed.compute_us, reference.compute_us) - 1.0,
        "compute_overhead_vs_least": replayed.compute_us / least_us - 1.0 if least_us > 0 else None,
    }


def _payload(problem: MemoryProblem, schedule: Schedule, replayed: Any, reference: Any, budget: int,
             options: MemoryOptions, extra: dict[str, Any]) -> dict[str, Any]:
    least_us = problem.least_compute_us()
    return {
        "algorithm": options.algorithm,
        "budget_bytes": budget,
        "budget_ratio": options.budget_ratio,
        "search_share": options.search_share,
        "model": {"name": problem.name, "nodes": problem.n, "constant_bytes": problem.constant_bytes,
                  "cost_source": problem.cost_source, "least_compute_us": least_us,
                  **({"catalog_factors": problem.metadata["catalog_factors"]}
                     if "catalog_factors" in problem.metadata else {})},
        "ops_profile": options.ops_profile,
        "store_all": {"peak_bytes": reference.peak_bytes, "compute_us": reference.compute_us},
        "predicted": _figures(replayed, reference, least_us),
        "schedule": schedule.to_dict(problem),
        **extra,
    }


def _fits(replayed: Any, budget: int) -> bool:
    return replayed is not None and replayed.peak_bytes <= budget


def _infeasible(budget: int, least: int, algorithm: str, why: str = "") -> InfeasibleError:
    if least <= budget:  # another algorithm's schedule fits: say which budget this one would need instead
        return InfeasibleError(
            f"{algorithm} found no schedule within {format_size(budget)} ({budget} bytes){why}; a schedule of "
            f"{format_size(least)} ({least} bytes) exists: try --algorithm monet or a larger --time-limit")
    return InfeasibleError(
        f"memory budget {format_size(budget)} ({budget} bytes) is infeasible for {algorithm}{why}; "
        f"the least feasible budget found is {format_size(least)} ({least} bytes)")


def _baseline(problem: MemoryProblem, algorithm: str, budget: int) -> Schedule | None:
    if algorithm == "store-all":
        return baselines.store_all(problem)
    if algorithm == "sqrt":
        return baselines.sqrt_segments(problem)
    return baselines.greedy(problem, budget)


def least_feasible_bytes(problem: MemoryProblem, *replays: Any) -> int:
    """Smallest replayed peak among the leanest baseline and any schedules already evaluated."""
    peaks = [replay(problem, least_memory(problem)).peak_bytes]
    peaks += [r.peak_bytes for r in replays if r is not None]
    return min(peaks)


def best_warm_start(problem: MemoryProblem, budget: int, joint: bool,
                    extra: tuple[tuple[str, Schedule], ...] = ()) -> tuple[Schedule | None, str]:
    """The cheapest schedule that fits the budget (default implementations only unless joint) among the
    baselines and `extra` (e.g. the plan of a smaller budget in a sweep, which fits any larger one). For the
    joint ILP each candidate's recomputations first reuse intermediates where they can (never worse)."""
    candidates = [("store-all", baselines.store_all(problem)), ("sqrt", baselines.sqrt_segments(problem)),
                  ("greedy", baselines.greedy(problem, budget)), ("least-memory", baselines.least_memory(problem)),
                  *extra]
    best: tuple[float, str, Schedule] | None = None
    for name, schedule in candidates:
        if schedule is None or (not joint and not uses_default_impls(problem, schedule)):
            continue
        if joint:
            schedule = baselines.reuse_intermediates(problem, schedule)
        try:
            replayed = replay(problem, schedule)
        except ScheduleError:
            continue
        if replayed.peak_bytes <= budget and (best is None or replayed.compute_us < best[0]):
            best = (replayed.compute_us, name, schedule)
    return (best[2], best[1]) if best else (None, "")


def uses_default_impls(problem: MemoryProblem, schedule: Schedule) -> bool:
    nodes = problem.nodes
    forward_ok = all(f.impl == nodes[f.node].forward[0].name for f in schedule.forward)
    recompute_ok = all(l == nodes[i].forward[0].name for b in schedule.backward for i, l in b.recompute)
    backward_ok = all(not nodes[b.node].backward or b.impl == nodes[b.node].backward[0].name
                      for b in schedule.backward)
    return forward_ok and recompute_ok and backward_ok


def plan_memory(problem: MemoryProblem, options: MemoryOptions, planner_options: PlannerOptions,
                inputs: dict[str, Any], progress: Callable[[str], None] = lambda message: None,
                warm_candidates: tuple[tuple[str, Schedule], ...] = ()) -> MemoryResult:
    """Plan for one budget; raises InfeasibleError (exit 3) when the algorithm cannot fit it.

    `warm_candidates`: more (name, schedule) MIP starts for the ILPs, beside the baselines."""
    if options.algorithm not in ALGORITHMS:
        raise ValueError(f"unknown memory algorithm {options.algorithm!r}")
    started = time.perf_counter()
    reference = replay(problem, baselines.store_all(problem))
    budget = resolve_budget(reference.peak_bytes, options)
    notes = tuple(problem.warnings)
    if options.algorithm in ("store-all", "sqrt", "greedy"):
        progress(f"{options.algorithm} schedule")
        schedule = _baseline(problem, options.algorithm, budget)
        replayed = replay(problem, schedule) if schedule is not None else None
        if not _fits(replayed, budget):
            why = f" (its schedule peaks at {format_size(replayed.peak_bytes)})" if replayed else ""
            raise _infeasible(budget, least_feasible_bytes(problem, replayed), options.algorithm, why)
        payload = _payload(problem, schedule, replayed, reference, budget, options, {})
        plan = heuristic_plan("memory", replayed.compute_us, payload, inputs, planner_options,
                              time.perf_counter() - started, notes)
        return MemoryResult(plan, schedule, replayed)
    return _plan_ilp(problem, options, planner_options, inputs, reference, budget, notes, started, progress,
                     warm_candidates)


def _plan_ilp(problem: MemoryProblem, options: MemoryOptions, planner_options: PlannerOptions,
              inputs: dict[str, Any], reference: Any, budget: int, notes: tuple[str, ...], started: float,
              progress: Callable[[str], None], warm_candidates: tuple[tuple[str, Schedule], ...]) -> MemoryResult:
    joint = options.algorithm == "monet"
    first = None
    if joint:
        first = _checkpoint_only_first(problem, options, planner_options, inputs, reference, budget, notes,
                                       progress, warm_candidates)
        if first is not None:
            warm_candidates = (*warm_candidates, (CHECKPOINT_ONLY_START, first.schedule))
    warm, warm_name = best_warm_start(problem, budget, joint, warm_candidates)
    start_window = first.plan.payload["ilp"].get("window") if first and warm_name == CHECKPOINT_ONLY_START else None
    progress(f"{options.algorithm} ILP" + (f", warm start from {warm_name}" if warm else ""))
    outcome = solve_memory_ilp(problem, budget, _ilp_options(planner_options), joint=joint, warm_start=warm,
                               start_window=start_window, search_share=options.search_share)
    if first is not None:
        outcome.stats["checkpoint_only_plan"] = {"status": first.plan.status.value, "objective": first.plan.objective,
                                                 "window": first.plan.payload["ilp"].get("window")}
    result = _joint_or_single(problem, options, planner_options, inputs, reference, budget, notes, started, outcome,
                              warm, warm_name)
    return replace(result, checkpoint_only=first)


def _joint_or_single(problem: MemoryProblem, options: MemoryOptions, planner_options: PlannerOptions,
                     inputs: dict[str, Any], reference: Any, budget: int, notes: tuple[str, ...], started: float,
                     outcome: Any, warm: Schedule | None, warm_name: str) -> MemoryResult:
    """The plan of one ILP outcome: its schedule, or its warm start when that is cheaper."""
    solved = replay(problem, outcome.schedule) if outcome.schedule is not None else None
    started_from = replay(problem, warm) if warm is not None else None
    if started_from is not None and (solved is None or started_from.compute_us < solved.compute_us * (1 - 1e-9)):
        # The reduced ILP (window, merged stages) could not represent or improve its start: the start wins.
        return _warm_start_plan(problem, options, planner_options, inputs, reference, budget, notes, started,
                                outcome, warm, warm_name, started_from)
    if solved is None:
        least = least_feasible_bytes(problem)
        why = (" (the reduced ILP is proven infeasible)" if outcome.result.status.name == "INFEASIBLE" else
               f" (solver: {outcome.result.status.value}, no schedule found in the time limit)")
        raise _infeasible(budget, least, options.algorithm, why)
    _check_objective(outcome.result.objective, solved.compute_us)
    extra = {"ilp": deterministic_stats(outcome.stats), "warm_start": warm_name or None,
             "bound_scope": BOUND_SCOPE, "bound_gap": bound_gap(outcome.result)}
    payload = _payload(problem, outcome.schedule, solved, reference, budget, options, extra)
    plan = plan_from_solve("memory", outcome.result, payload, inputs, planner_options,
                           time.perf_counter() - started, notes)
    if plan.status not in (PlanStatus.OPTIMAL, PlanStatus.FEASIBLE):
        raise AssertionError(f"solver returned a schedule with status {plan.status.value}")
    return MemoryResult(plan, outcome.schedule, solved)


def _checkpoint_only_first(problem: MemoryProblem, options: MemoryOptions, planner_options: PlannerOptions,
                           inputs: dict[str, Any], reference: Any, budget: int, notes: tuple[str, ...],
                           progress: Callable[[str], None],
                           warm_candidates: tuple[tuple[str, Schedule], ...]) -> MemoryResult | None:
    """The checkpoint-only plan of this budget (what --algorithm checkpoint-only writes), or None if it
    finds none: MONeT's first solve."""
    progress("checkpoint-only ILP (the joint ILP starts from its plan)")
    try:
        return _plan_ilp(problem, replace(options, algorithm="checkpoint-only"), planner_options, inputs, reference,
                         budget, notes, time.perf_counter(), progress, warm_candidates)
    except InfeasibleError:
        return None


def _warm_start_plan(problem, options, planner_options, inputs, reference, budget, notes, started, outcome,
                     warm, warm_name, replayed) -> MemoryResult:
    """The warm start returned as the plan: heuristic (the ILP's bound is its reduced model's, not this plan's)."""
    result = outcome.result
    solved = {"status": result.status.value, "objective": result.objective, "best_bound": result.best_bound,
              "gap": result.gap}
    extra = {"ilp": deterministic_stats(outcome.stats), "ilp_result": solved, "warm_start": warm_name,
             "bound_scope": BOUND_SCOPE}
    payload = _payload(problem, warm, replayed, reference, budget, options, extra)
    note = (f"the {options.algorithm} ILP ({result.status.value}) did not improve on its warm start "
            f"{warm_name}; the plan is that schedule")
    provenance = Provenance(input_hashes(inputs), result.solver, result.solver_version, planner_options.to_dict())
    # The reduced ILP's bound still bounds what that model could find (bound_scope); its gap to this plan:
    bound = result.best_bound if result.best_bound is not None and math.isfinite(result.best_bound) else None
    gap = None if bound is None else max(0.0, replayed.compute_us - bound) / max(replayed.compute_us, 1e-9)
    plan = Plan("memory", PlanStatus.HEURISTIC, replayed.compute_us, bound, gap, time.perf_counter() - started,
                payload, provenance, (*notes, note))
    return MemoryResult(plan, warm, replayed)


def bound_gap(result: Any) -> float | None:
    """(objective - best bound) / objective: the plan's `gap` is 0 for any solve within --mip-gap, this is not."""
    if result.objective is None or result.best_bound is None or not math.isfinite(result.best_bound):
        return None
    return max(0.0, result.objective - result.best_bound) / max(abs(result.objective), 1e-9)


def deterministic_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """Solver statistics that do not depend on the clock (plans must be byte-identical)."""
    return {k: v for k, v in sorted(stats.items()) if not k.endswith("_s")}


def _check_objective(objective: float | None, compute_us: float) -> None:
    if objective is None or abs(objective - compute_us) > OBJECTIVE_RTOL * max(1.0, abs(compute_us)):
        raise AssertionError(f"ILP objective {objective} disagrees with the replayed compute {compute_us} us")

"""`mlopt plan schedule`: Syndicate's joint scheduling and execution planning (first version).

The workload (a trace, unrolled over two iterations so that cross-iteration moves are possible) becomes a
`ScheduleProblem` (problem.py: comm-ops with execution options made of motifs, each timed on the topology's
channels); the chosen system searches it (search.py) and optSched (optsched.py) gives the schedule. The plan
holds, per comm-op, its execution plan (motifs: name, channels, duration, start, end, sequence number; equal
numbers for motifs issued together; `program`, the id of its MSCCL-EF program), every distinct motif program
the enforcer will run (`programs`: made and proven by programs.py when planning, checked again by `mlopt
validate`), the predicted iteration time and compute idle %, and every compared system's iteration time. Plans are "heuristic" (MCMC proves nothing) but carry a valid lower bound and its
gap: the better of the contention-free relaxation and the channel windows (optsched.lower_bound_us).

Reproducibility: the search stops after `max_steps` proposals (deterministic for a seed) unless the wall-clock
`budget_s` runs out first; the plan records which (`payload.search.stop_reason`). Only a "max_steps" stop gives
byte-identical plans across machines.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from mlopt.formats.plan import Plan
from mlopt.planners.options import PlannerOptions
from mlopt.planners.result import heuristic_plan
from mlopt.planners.schedule import search
from mlopt.planners.schedule.optsched import ScheduleProblem, contention_free_bound, framework_issue, lower_bound_us
from mlopt.planners.schedule.programs import carried_programs

ALGORITHMS = ("syndicate", "fifo", "lifo", "hand", "exec-only", "sched-only")
SYSTEM_NAMES = {"syndicate": "syndicate", "fifo": "fifo", "lifo": "bs+", "hand": "hand", "exec-only": "s-exec",
                "sched-only": "s-sched"}


@dataclass(frozen=True)
class ScheduleOptions:
    """One field per option of `mlopt plan schedule`, same names (declared in mlopt/planners/schedule/kind.py
    COMMAND_OPTIONS, from which the CLI builds its flags)."""

    algorithm: str = "syndicate"  # --algorithm: syndicate | fifo | lifo (LIFO + segment oracle) | hand | exec-only | sched-only
    budget_s: float = 60.0  # --budget-s: wall-clock cap of each search
    max_steps: int = 2000  # --max-steps: proposals per search (deterministic stop)
    mode: str = "unaware"  # --mode: network mode the motifs are timed in (unaware | aware | fifo)
    iterations: int = 2  # --iterations: training iterations unrolled (2: cross-iteration moves)
    cost_table: str | None = None  # --cost-table: measured collective times (CSV, costs.py) over alpha-beta


# How each system's comm-ops are issued: "framework" (no enforcer: a comm-op waits for the compute issued before
# it, optsched.framework_issue) or "enforcer" (Syndicate's enforcer: the plan's order, data dependencies only).
SYSTEM_ISSUE = {"fifo": "framework", "bs+": "framework", "hand": "enforcer", "s-exec": "framework",
                "s-sched": "enforcer", "syndicate": "enforcer"}


def issued(problem: ScheduleProblem, issue: str) -> ScheduleProblem:
    """The problem a system with this issue model schedules."""
    return framework_issue(problem) if issue == "framework" else problem


def run_systems(problem: ScheduleProblem, options: ScheduleOptions, seed: int) -> dict[str, search.SearchResult]:
    """Every compared system on the problem (searches stop at max_steps or budget_s)."""
    kwargs = {"max_steps": options.max_steps, "stop_on_stagnation": False}
    framework = issued(problem, "framework")
    return {
        "fifo": search.fifo_default(framework),
        "bs+": search.lifo_oracle(framework),
        "hand": search.hand_priority(problem),
        "s-exec": search.s_exec(framework, options.budget_s, seed, **kwargs),
        "s-sched": search.s_sched(problem),
        "syndicate": search.syndicate(problem, options.budget_s, seed, **kwargs),
    }


SYSTEM_ORDERS = {"fifo": "fifo", "bs+": "lifo", "hand": "needed", "s-exec": "fifo", "s-sched": "critical",
                 "syndicate": "critical"}


def _motif_details(motif) -> dict[str, Any]:
    """What a motif does (motifs.Motif): its collective over its ranks on byte ranges of the op's buffer."""
    return {"collective": motif.collective, "ranks": list(motif.ranks),
            "regions": [[list(r) for r in region] for region in motif.regions], "root": motif.root,
            "deps": list(motif.deps), "pattern": None if motif.pattern is None else [list(p) for p in motif.pattern]}


def comm_op_rows(problem: ScheduleProblem, result: search.SearchResult) -> list[dict[str, Any]]:
    """Per comm-op, in issue order: the collective, the chosen execution plan and its motifs as scheduled."""
    slots: dict[int, list] = {}
    for slot in result.schedule.motifs:
        slots.setdefault(slot.task_id, []).append(slot)
    rows = []
    for task in problem.tasks:
        if task.kind != "comm":
            continue
        option = result.plan.get(task.id, 0)
        plan = problem.options[task.id][option]
        parts = problem.decompositions[task.id][option] if task.id in problem.decompositions else None
        motifs = []
        for slot in sorted(slots.get(task.id, []), key=lambda s: s.motif_index):
            run = plan.motifs[slot.motif_index]
            timing = {"channels": sorted(run.channels), "duration_us": run.duration_us, "start_us": slot.start_us,
                      "end_us": slot.end_us, "seq": slot.seq}
            if parts is None:
                motifs.append({"name": run.name, **timing})
                continue
            for k, motif in enumerate(parts[slot.motif_index]):
                name = run.name if len(parts[slot.motif_index]) == 1 else f"{run.name}#{k}"
                motifs.append({"name": name, "run": slot.motif_index, **_motif_details(motif), **timing})
        op = problem.ops.get(task.id)
        collective = {} if op is None else {"collective": op.collective, "nbytes": op.nbytes,
                                            "ranks": list(op.ranks), "root": op.root}
        if op is not None and op.pairs is not None:
            collective["pairs"] = [list(p) for p in op.pairs]
        rows.append({"id": task.id, "name": task.name, "iteration": task.iteration, **collective,
                     "option": option, "plan": plan.label, "motifs": motifs})
    return rows


def last_iteration_us(problem: ScheduleProblem, schedule, iterations: int) -> float:
    """Steady-state estimate: from the end of the second-to-last iteration's compute to the end of the
    schedule (the first iteration carries warm-up, e.g. a data-prep nothing can prefetch); the makespan when
    only one iteration is unrolled."""
    ends = [schedule.task_times[t.id][1] for t in problem.tasks
            if t.kind == "compute" and t.iteration == iterations - 2]
    return schedule.makespan_us - max(ends, default=0.0)


def system_rows(problem: ScheduleProblem, results: dict[str, search.SearchResult],
                iterations: int) -> dict[str, dict[str, Any]]:
    """Per compared system: its issue order, execution option per comm-op (issue order) and times."""
    comm = [t.id for t in problem.tasks if t.kind == "comm"]
    return {name: {"order": SYSTEM_ORDERS[name], "issue": SYSTEM_ISSUE[name], "options": [r.plan.get(i, 0) for i in comm],
                   "makespan_us": r.schedule.makespan_us, "iteration_us": r.schedule.makespan_us / iterations,
                   "last_iteration_us": last_iteration_us(problem, r.schedule, iterations),
                   "compute_idle_pct": r.schedule.compute_idle_pct}
            for name, r in results.items()}


def plan_schedule(problem: ScheduleProblem, options: ScheduleOptions, planner_options: PlannerOptions,
                  inputs: dict[str, Any], channels: list[str]) -> Plan:
    started = time.perf_counter()
    results = run_systems(problem, options, planner_options.seed)
    chosen = results[SYSTEM_NAMES[options.algorithm]]
    schedule = chosen.schedule
    iterations = max(1, options.iterations)
    relaxed = contention_free_bound(problem)
    bound_makespan_us = lower_bound_us(problem)
    rows = comm_op_rows(problem, chosen)
    programs = carried_programs(rows)  # proven; names each motif's program in `rows`
    payload = {
        "algorithm": options.algorithm,
        "options": asdict(options),
        "channels": channels,
        "comm_ops": rows,
        "programs": programs,
        "predicted": {"makespan_us": schedule.makespan_us, "iterations": iterations,
                      "iteration_us": schedule.makespan_us / iterations,
                      "last_iteration_us": last_iteration_us(problem, schedule, iterations),
                      "compute_idle_pct": schedule.compute_idle_pct, "tasks": len(problem.tasks),
                      # no plan, order or issue model can beat these (optsched.lower_bound_us: the
                      # contention-free relaxation or the channel windows; the last iteration: the relaxation's)
                      "bound_makespan_us": bound_makespan_us, "bound_iteration_us": bound_makespan_us / iterations,
                      "bound_last_iteration_us": last_iteration_us(problem, relaxed, iterations)},
        "systems": {name: r.schedule.makespan_us / iterations for name, r in results.items()},
        "system_plans": system_rows(problem, results, iterations),
        "search": {"iterations": chosen.iterations, "stop_reason": chosen.stop_reason,
                   "polish_evaluations": chosen.polish_evaluations},
    }
    return heuristic_plan("schedule", schedule.makespan_us, payload, inputs, planner_options,
                          time.perf_counter() - started, best_bound=bound_makespan_us)

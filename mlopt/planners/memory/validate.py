"""`mlopt validate memory.plan.json --model trace.json`: replay the schedule against its trace, no solver.

The trace is rebuilt into the same problem (with the operator profile the plan recorded), the schedule
is replayed (forward, every backward stage and its recomputations, greedy freeing), and the plan fails
if any op runs without its inputs, if the replayed peak exceeds the budget, or if the plan's predicted
figures are not what the replay computes.
"""

from __future__ import annotations

from typing import Any

from mlopt.errors import InputError
from mlopt.formats.loaders import load_trace_any
from mlopt.formats.plan import PlanFile
from mlopt.formats.sizes import format_size
from mlopt.planners.memory.build import build_problem
from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.memory.replay import ScheduleError, replay
from mlopt.planners.memory.schedule import Schedule

COMPUTE_RTOL = 1e-6


def problem_for_plan(plan: PlanFile, source: str, model_path: str) -> MemoryProblem:
    return build_problem(load_trace_any(model_path), plan.payload.get("ops_profile"), source=model_path)


def schedule_of(payload: dict[str, Any], source: str) -> Schedule:
    try:
        return Schedule.from_dict(payload["schedule"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(source, "$.payload.schedule", f"malformed schedule ({type(exc).__name__}: {exc})") from None


def check_matches_trace(problem: MemoryProblem, payload: dict[str, Any], source: str) -> None:
    """The plan's nodes are the trace's: same count, same op ids in the same order."""
    forward = payload["schedule"]["forward"]
    if len(forward) != problem.n:
        raise InputError(source, "$.payload.schedule.forward",
                         f"plan has {len(forward)} forward nodes, the trace gives {problem.n}: made for another trace?")
    for position, (step, node) in enumerate(zip(forward, problem.nodes)):
        if step.get("node") != position:
            raise InputError(source, f"$.payload.schedule.forward[{position}].node",
                             f"is {step.get('node')}, expected {position} (forward steps run in node order)")
        if step.get("op_id") != node.op_id:
            raise InputError(source, f"$.payload.schedule.forward[{position}].op_id",
                             f"is {step.get('op_id')}, the trace's node {position} is op {node.op_id} ({node.name})")
    check_backward_matches_trace(problem, payload["schedule"]["backward"], source)


def check_backward_matches_trace(problem: MemoryProblem, backward: list[dict[str, Any]], source: str) -> None:
    """Each backward stage names a node of the trace once, with that node's op id; what it recomputes and
    keeps are nodes of the trace (the payload schema has checked the types)."""
    first_stage: dict[int, int] = {}
    span = f"the trace has {problem.n} nodes (0..{problem.n - 1})"
    for position, stage in enumerate(backward):
        where = f"$.payload.schedule.backward[{position}]"
        node = stage["node"]
        if node >= problem.n:
            raise InputError(source, f"{where}.node", f"is {node}; {span}")
        if node in first_stage:
            raise InputError(source, f"{where}.node", f"node {node} has a second stage (its first is "
                                                      f"$.payload.schedule.backward[{first_stage[node]}])")
        first_stage[node] = position
        if stage["op_id"] != problem.nodes[node].op_id:
            raise InputError(source, f"{where}.op_id", f"is {stage['op_id']}, the trace's node {node} is op "
                                                       f"{problem.nodes[node].op_id} ({problem.nodes[node].name})")
        for j, item in enumerate(stage["recompute"]):
            if item["node"] >= problem.n:
                raise InputError(source, f"{where}.recompute[{j}].node", f"is {item['node']}; {span}")
        for j, kept in enumerate(stage["keep"]):
            if kept >= problem.n:
                raise InputError(source, f"{where}.keep[{j}]", f"is {kept}; {span}")


def replay_plan(plan: PlanFile, source: str, model_path: str) -> tuple[MemoryProblem, Schedule, Any]:
    """Problem, schedule and replay of a memory plan; InputError (exit 2) on any mismatch or violation."""
    payload = plan.payload
    for key in ("schedule", "budget_bytes", "predicted"):
        if key not in payload:
            raise InputError(source, f"$.payload.{key}", "missing required field")
    problem = problem_for_plan(plan, source, model_path)
    check_matches_trace(problem, payload, source)
    schedule = schedule_of(payload, source)
    try:
        replayed = replay(problem, schedule)
    except ScheduleError as exc:
        raise InputError(source, "$.payload.schedule", str(exc)) from None
    return problem, schedule, replayed


def validate_memory_plan(plan: PlanFile, source: str, model_path: str | None, topology_spec: str | None) -> str:
    if model_path is None:
        raise InputError(source, "$.payload", "memory plans are replayed against their trace: pass --model TRACE")
    problem, schedule, replayed = replay_plan(plan, source, model_path)
    payload = plan.payload
    budget = payload["budget_bytes"]
    if replayed.peak_bytes > budget:
        raise InputError(source, "$.payload.budget_bytes",
                         f"replayed peak {replayed.peak_bytes} bytes ({format_size(replayed.peak_bytes)}) exceeds "
                         f"the budget {budget} bytes, at {replayed.peak_event.phase} of node {replayed.peak_event.node}")
    predicted = payload["predicted"]
    if predicted.get("peak_bytes") != replayed.peak_bytes:
        raise InputError(source, "$.payload.predicted.peak_bytes",
                         f"says {predicted.get('peak_bytes')}, the replay gives {replayed.peak_bytes}")
    claimed = predicted.get("compute_us")
    if not isinstance(claimed, (int, float)) or abs(claimed - replayed.compute_us) > COMPUTE_RTOL * max(1.0, replayed.compute_us):
        raise InputError(source, "$.payload.predicted.compute_us",
                         f"says {claimed}, the replay gives {replayed.compute_us}")
    vs_least = predicted.get("compute_overhead_vs_least")
    least = problem.least_compute_us()
    claimed_least = payload.get("model", {}).get("least_compute_us")
    if claimed_least is not None and (not isinstance(claimed_least, (int, float))
                                      or abs(claimed_least - least) > COMPUTE_RTOL * max(1.0, least)):
        raise InputError(source, "$.payload.model.least_compute_us",
                         f"says {claimed_least}, the trace's fastest implementations give {least}")
    if vs_least is not None:  # older plans lack it
        actual = replayed.compute_us / least - 1.0 if least > 0 else None
        if actual is None or not isinstance(vs_least, (int, float)) or abs(vs_least - actual) > COMPUTE_RTOL * 10:
            raise InputError(source, "$.payload.predicted.compute_overhead_vs_least",
                             f"says {vs_least}, the replay against the fastest implementations gives {actual}")
    claimed_factors = payload.get("model", {}).get("catalog_factors")
    factors = problem.metadata.get("catalog_factors")
    if claimed_factors is not None and claimed_factors != factors:  # older plans lack it
        raise InputError(source, "$.payload.model.catalog_factors",
                         f"says {claimed_factors}, the trace gives {factors}")
    recomputed = sum(len(b.recompute) for b in schedule.backward)
    ratio = predicted.get("memory_ratio")
    overhead = predicted.get("compute_overhead")
    extra = f" ({ratio:.2f}x store-all, compute {overhead * 100:+.1f}%)" if ratio is not None and overhead is not None else ""
    return (f"replayed {problem.n} nodes: peak {format_size(replayed.peak_bytes)} <= budget {format_size(budget)}"
            f"{extra}, {recomputed} recomputations")

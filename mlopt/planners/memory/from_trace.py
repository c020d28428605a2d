"""The memory planner inside `mlopt plan --model`: MONeT at half the store-all peak (no budget flag there)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from mlopt.errors import InfeasibleError
from mlopt.formats.io import write_json
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.memory.build import build_problem
from mlopt.planners.memory.planner import DEFAULT_BUDGET_RATIO, MemoryOptions, least_feasible_bytes, plan_memory
from mlopt.planners.options import PlannerOptions
from mlopt.planners.protocol import WrittenPlan

PLAN_FILE = "memory.plan.json"


def why_not(trace: ModelTrace, topology: Topology | None) -> str | None:
    paired = [op for op in trace.ops if op.role == "backward" and op.forward_op is not None]
    if not trace.ops_by_role("forward") or not paired:
        return "the trace has no forward ops with paired backward ops to plan memory for"
    return None


def run(trace: ModelTrace, topology: Topology | None, options: PlannerOptions, out_dir: Path,
        inputs: dict[str, Any]) -> list[WrittenPlan]:
    """Plan at DEFAULT_BUDGET_RATIO; when that is infeasible, at the least feasible budget found."""
    problem = build_problem(trace, None, source=str(inputs.get("model") or "<trace>"))
    memory_options = MemoryOptions("monet", budget_ratio=DEFAULT_BUDGET_RATIO)
    try:
        result = plan_memory(problem, memory_options, options, inputs)
    except InfeasibleError:
        least = least_feasible_bytes(problem)
        result = plan_memory(problem, replace(memory_options, budget_ratio=None, budget_bytes=least), options, inputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / PLAN_FILE, result.plan.to_dict(options.record_wall_time))
    return [WrittenPlan(PLAN_FILE, result.plan)]

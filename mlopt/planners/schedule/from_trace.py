"""The schedule planner from a trace: `mlopt plan schedule` and its entry in `mlopt plan --model`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.formats.io import write_json
from mlopt.formats.plan import Plan
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.protocol import WrittenPlan
from mlopt.planners.options import PlannerOptions
from mlopt.planners.schedule.costs import CostTable, load_cost_table
from mlopt.planners.schedule.planner import ScheduleOptions, plan_schedule
from mlopt.planners.schedule.problem import channels_of, schedule_problem
from mlopt.sim import workload as wl
from mlopt.sim.evaluate import check_fits

PLAN_FILE = "schedule.plan.json"


def plan_to_file(trace: ModelTrace, source: str, topology: Topology, options: ScheduleOptions,
                 planner_options: PlannerOptions, output: str | Path, inputs: dict[str, Any]) -> Plan:
    """Plan the trace's comm-ops on the topology (unrolled over options.iterations) and write the plan
    atomically; InputError (exit 2) when the trace's process groups do not fit the topology."""
    workload = wl.chain(wl.from_trace(trace, source=source), options.iterations)
    check_fits(workload.world_size, topology, source)
    problem = schedule_problem(workload, topology, mode=options.mode, source=source,
                               costs=cost_table_for(options.cost_table, topology))
    if options.cost_table is not None:
        inputs = {**inputs, "cost_table": options.cost_table}
    plan = plan_schedule(problem, options, planner_options, inputs, sorted(channels_of(topology)))
    write_json(output, plan.to_dict(planner_options.record_wall_time))
    return plan


def cost_table_for(path: str | None, topology: Topology) -> CostTable | None:
    """The measured cost table at `path` (checked against the topology's channels), or None."""
    return None if path is None else load_cost_table(path, tuple(sorted(channels_of(topology))))


def why_not(trace: ModelTrace, topology: Topology | None) -> str | None:
    if topology is None:
        return "needs --topology (its link classes are the channels)"
    if not any(op.role == "comm" or op.comm is not None for op in trace.ops):
        return "the trace has no comm-ops"
    if trace.world_size > topology.num_ranks:
        return f"the trace has {trace.world_size} ranks, topology {topology.name!r} {topology.num_ranks}"
    if any(op.compute_us is None for op in trace.ops if op.role != "comm" and op.comm is None):
        return "the trace's compute ops have no measured compute times (import Kineto or profile operators)"
    return None


def run(trace: ModelTrace, topology: Topology | None, options: PlannerOptions, out_dir: Path,
        inputs: dict[str, Any]) -> list[WrittenPlan]:
    assert topology is not None  # why_not() said it applies
    plan = plan_to_file(trace, inputs.get("model") or "trace", topology, ScheduleOptions(), options,
                        out_dir / PLAN_FILE, inputs)
    return [WrittenPlan(PLAN_FILE, plan)]

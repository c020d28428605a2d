"""The threads planner from a trace: `mlopt plan threads` and its entry in `mlopt plan --model`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import canonical_json, write_files
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.options import PlannerOptions
from mlopt.planners.protocol import WrittenPlan
from mlopt.planners.threads import contention
from mlopt.planners.threads.build import layers_from_trace
from mlopt.planners.threads.planner import ThreadsOptions, make_problem, plan_threads

PLAN_FILE = "threads.plan.json"


def contention_from(path: str | None) -> tuple[dict[str, float], dict[str, Any]]:
    """(parameters, provenance of the contention model): fitted from `mlopt profile contention` samples, or
    the documented defaults."""
    if path is None:
        params = dict(contention.DEFAULT_PARAMETERS)
        return params, {"source": "default", "parameters": params, "fit": None}
    result = contention.fit(contention.load_samples(path), path)
    params = dict(result.parameters)
    return params, {"source": path, "parameters": params, "fit": result.to_dict()}


def tuner_file_for(plan_path: str | Path) -> Path:
    """`threads.plan.json` -> `threads.plan.nccl-tuner.csv` beside it."""
    path = Path(plan_path)
    stem = path.name[:-5] if path.name.endswith(".json") else path.name
    return path.with_name(f"{stem}.nccl-tuner.csv")


def plan_to_files(trace: ModelTrace, source: str, options: ThreadsOptions, planner_options: PlannerOptions,
                  output: str | Path, inputs: dict[str, Any], contention_path: str | None = None,
                  communicators: list[tuple[int, int]] | None = None):
    """Plan and write the plan and its tuner CSV (both or neither); returns the Plan. The plan's env names the
    CSV by its file name, relative to the plan (committed plans stay machine-independent; a job makes it
    absolute with artifacts.job_env). `communicators`: the tuner lines' (nNodes, nRanks), default from the
    options."""
    params, contention = contention_from(contention_path)
    try:
        problem = make_problem(layers_from_trace(trace, source), options, params)
    except ValueError as exc:
        raise InputError(contention_path or source, "threads", str(exc)) from None
    csv_path = tuner_file_for(output)
    plan, csv = plan_threads(problem, options, planner_options, inputs, contention, csv_path.name,
                              communicators)
    # both files or neither: a tuner CSV without its plan (or the reverse) would be applied half
    write_files({output: canonical_json(plan.to_dict(planner_options.record_wall_time)), csv_path: csv})
    return plan


def why_not(trace: ModelTrace, topology: Topology | None) -> str | None:
    backward = [op for op in trace.ops if op.role == "backward"]
    if not backward:
        return "the trace has no backward pass"
    if any(op.compute_us is None for op in backward):
        return "the trace's backward ops have no measured compute times (import Kineto or profile operators)"
    if max(trace.world_size, topology.num_ranks if topology else 1) < 2:
        return "needs more than one data-parallel rank (a multi-rank trace or --topology)"
    return None


def communicators_of(trace: ModelTrace, topology: Topology | None) -> list[tuple[int, int]]:
    """The data-parallel communicator (nNodes, nRanks) of `mlopt plan --model`: the topology's nodes and ranks,
    else the trace's world size on an unknown number of nodes (-1)."""
    if topology is not None:
        return [(topology.num_nodes, topology.num_ranks)]
    return [(-1, trace.world_size)]


def run(trace: ModelTrace, topology: Topology | None, options: PlannerOptions, out_dir: Path,
        inputs: dict[str, Any]) -> list[WrittenPlan]:
    # LIBRA's N is the all-reduce's workers: here every rank (the registry has always planned so)
    nodes = topology.num_ranks if topology is not None else trace.world_size
    plan = plan_to_files(trace, inputs.get("model") or "trace", ThreadsOptions(nodes=nodes), options,
                         out_dir / PLAN_FILE, inputs, communicators=communicators_of(trace, topology))
    return [WrittenPlan(PLAN_FILE, plan)]

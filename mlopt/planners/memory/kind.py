"""The memory planner's entry in the registry (mlopt.planners.registry): MONeT checkpointing plans."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import read_document, write_json
from mlopt.formats.loaders import load_trace_any
from mlopt.formats.sizes import format_size, parse_size
from mlopt.planners.memory import from_trace
from mlopt.planners.memory.build import build_problem
from mlopt.planners.memory.planner import DEFAULT_SEARCH_SHARE, MemoryOptions, plan_memory
from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.memory.validate import validate_memory_plan
from mlopt.planners.options import PLANNER_COMMAND_OPTIONS, CommandOption, PlannerOptions, \
    planner_options_from_args
from mlopt.planners.protocol import PlannedFiles, PlannerKind, PlanRequest, SimulationFacts, StalenessFacts, \
    envelope_metrics, one_file
from mlopt.planners.workload_plans import apply_memory_plan


def metrics(doc: dict[str, Any]) -> dict[str, Any]:
    payload = doc.get("payload", {})
    predicted = payload.get("predicted") or {}
    return {**envelope_metrics(doc), "algorithm": payload.get("algorithm"), "budget_bytes": payload.get("budget_bytes"),
            "peak_bytes": predicted.get("peak_bytes"), "memory_ratio": predicted.get("memory_ratio"),
            "compute_overhead": predicted.get("compute_overhead")}


def recorded_options(payload: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The algorithm and budget at the payload's top; a plan made for a ratio derived its budget in bytes, which
    is then no option."""
    names = ("algorithm", "budget_ratio") if payload.get("budget_ratio") is not None else (
        "algorithm", "budget_bytes", "budget_ratio")
    out = {name: (f"$.payload.{name}", payload.get(name)) for name in names}
    if "search_share" in payload:  # plans made before the search existed record none (they are stale)
        out["search_share"] = ("$.payload.search_share", payload["search_share"])
    return out


def expected_options(specific: dict[str, Any]) -> dict[str, Any]:
    """A plan made for a budget ratio records the budget in bytes it derived: an option only with --budget."""
    specific = dict(specific)
    if specific.get("budget_bytes") is None:
        specific.pop("budget_bytes", None)
    return specific


# `mlopt plan memory`'s own options (MemoryOptions' fields and the trace); its --sweep (a folder of plans, a
# table and a PNG) is the command line's own (mlopt.cli), built on `memory_setup` and `load_problem`
COMMAND_OPTIONS = (
    CommandOption("model", "text", "Trace to plan for (mlopt trace or PyTorch ET).", required=True),
    CommandOption("budget", "text", "Memory budget, e.g. 6GiB (tensors + workspace)."),
    CommandOption("budget-ratio", "float", "Budget as a fraction of the store-all (PyTorch default) peak, e.g. 0.4.",
                  min=0, min_open=True),
    CommandOption("ops", "text", "Operator implementations profile (mlopt-op-profile JSON)."),
    CommandOption("algorithm", "choice", "monet: joint checkpointing + implementations ILP; checkpoint-only: the "
                                         "same ILP without implementation choice (Checkmate-style); sqrt, store-all, "
                                         "greedy: baselines.",
                  default="monet", choices=("monet", "checkpoint-only", "sqrt", "store-all", "greedy"),
                  show_default=True),
    CommandOption("search-share", "float", "Share of each ILP's --time-limit kept for large-neighbourhood search "
                                           "when branch and bound has not proved its plan optimal by then (0: off).",
                  default=DEFAULT_SEARCH_SHARE, min=0, max=1, show_default=True),
)


@dataclass(frozen=True)
class MemorySetup:
    """`mlopt plan memory`'s options built, its op profile read; the trace is read when planning."""

    model_path: str  # --model
    ops_path: str | None  # --ops
    memory_options: MemoryOptions  # with the parsed op profile
    planner_options: PlannerOptions
    inputs: dict[str, Any]  # provenance names -> input files


def memory_setup(args: dict[str, Any]) -> MemorySetup:
    """The options (args by flag name) built: --budget parsed, --ops read; no budget check (--sweep has none)."""
    ops_path = args["ops"]
    profile = read_document(ops_path) if ops_path else None
    budget = parse_size(args["budget"], "--budget") if args["budget"] else None
    planner_options = planner_options_from_args(args)
    memory_options = MemoryOptions(args["algorithm"], budget, args["budget-ratio"], profile, args["search-share"])
    return MemorySetup(args["model"], ops_path, memory_options, planner_options,
                       {"model": args["model"], "ops": ops_path})


def load_problem(setup: MemorySetup) -> MemoryProblem:
    """The trace's memory problem; what the builder noticed (ops without a profile entry) becomes warnings."""
    problem = build_problem(load_trace_any(setup.model_path), setup.memory_options.ops_profile,
                            source=setup.ops_path or setup.model_path)
    for warning in problem.warnings:
        warnings.warn(warning)
    return problem


def prepare_plan(args: dict[str, Any]) -> PlanRequest:
    """`mlopt plan memory` for one budget (exactly one of --budget and --budget-ratio)."""
    if (args["budget"] is None) == (args["budget-ratio"] is None):
        raise InputError("mlopt plan memory", "--budget", "give exactly one of --budget and --budget-ratio")
    setup = memory_setup(args)

    def write(output: Path, progress) -> PlannedFiles:
        result = plan_memory(load_problem(setup), setup.memory_options, setup.planner_options, setup.inputs,
                             progress)
        write_json(str(output), result.plan.to_dict(setup.planner_options.record_wall_time))
        return PlannedFiles([output], result.plan)

    return PlanRequest(setup.inputs, setup.planner_options, setup.memory_options.to_dict(),
                       f"planning memory for {setup.model_path}", write)


def summary(planned: PlannedFiles, output: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`mlopt plan memory`'s --json summary and its one line about what was written."""
    plan_obj, payload = planned.plan, planned.plan.payload
    predicted = payload["predicted"]
    summary = {**plan_obj.summary(), "file": output, "budget_bytes": payload["budget_bytes"], **predicted}
    gap = f", gap {plan_obj.gap * 100:.2f}%" if plan_obj.gap is not None else ""
    vs_least = predicted.get("compute_overhead_vs_least")
    least = (f", {vs_least * 100:+.1f}% over the fastest implementations"
             if vs_least is not None and abs(vs_least - predicted["compute_overhead"]) >= 5e-4 else "")
    return summary, (
        f"{args['algorithm']}: peak {format_size(predicted['peak_bytes'])} <= budget "
        f"{format_size(payload['budget_bytes'])} ({predicted['memory_ratio']:.2f}x store-all "
        f"{format_size(payload['store_all']['peak_bytes'])}), compute {predicted['compute_overhead'] * 100:+.1f}%"
        f"{least} ({plan_obj.status.value}{gap}); wrote {output}")


KIND = PlannerKind(
    name="memory",
    options_type=MemoryOptions,
    why_not=from_trace.why_not,
    run=from_trace.run,
    output_suffix=".plan.json",
    files=one_file,
    file_inputs=("model", "ops"),
    named_inputs=(),
    validate=validate_memory_plan,
    metrics=metrics,
    staleness=StalenessFacts(recorded_options=recorded_options, expected_options=expected_options),
    simulation=SimulationFacts(apply=apply_memory_plan, stage=1, needs_trace=True),
    command_options=COMMAND_OPTIONS,
    shared_options=PLANNER_COMMAND_OPTIONS,
    prepare_plan=prepare_plan,
    command_help='Checkpointing and operator implementations under a memory budget (MONeT); -o memory.plan.json.',
    summary=summary,
)

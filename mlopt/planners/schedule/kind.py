"""The schedule planner's entry in the registry (mlopt.planners.registry): Syndicate's motifs and their order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.formats.loaders import load_trace_any, resolve_topology
from mlopt.planners.options import SOLVERLESS_COMMAND_OPTIONS, TOPOLOGY_COMMAND_OPTIONS, CommandOption, \
    planner_options_from_args, topology_options_from_args
from mlopt.planners.protocol import PlannedFiles, PlannerKind, PlanRequest, SimulationFacts, StalenessFacts, \
    envelope_metrics, options_in_payload, one_file
from mlopt.planners.schedule import from_trace
from mlopt.planners.schedule.planner import ScheduleOptions
from mlopt.planners.schedule.validate import validate_schedule_plan
from mlopt.planners.workload_plans import apply_schedule_plan


def metrics(doc: dict[str, Any]) -> dict[str, Any]:
    payload = doc.get("payload", {})
    predicted = payload.get("predicted") or {}
    return {**envelope_metrics(doc), "algorithm": payload.get("algorithm"), "iteration_us": predicted.get("iteration_us")}


# `mlopt plan schedule`'s own options (ScheduleOptions' fields, the trace and the topology)
COMMAND_OPTIONS = (
    CommandOption("model", "text", "Trace to plan for (mlopt trace or PyTorch ET).", required=True),
    CommandOption("topology", "text", "Topology preset or file (its link classes are the channels).", required=True),
    *TOPOLOGY_COMMAND_OPTIONS,
    CommandOption("algorithm", "choice", "syndicate: MCMC over execution plans costed by optSched; fifo: PyTorch's "
                                         "default; lifo: LIFO with the segment oracle (ByteScheduler+); hand: the "
                                         "comm-op needed soonest first; exec-only, sched-only: one half of Syndicate.",
                  default="syndicate", choices=("syndicate", "fifo", "lifo", "hand", "exec-only", "sched-only"),
                  show_default=True),
    CommandOption("budget-s", "float", "Wall-clock cap of each search.", default=60.0, min=0, min_open=True,
                  show_default=True),
    CommandOption("max-steps", "int", "Proposals per search (a deterministic stop; the plan says which stop ended "
                                      "it).", default=2000, min=1, show_default=True),
    CommandOption("mode", "choice", "Network mode the motifs are timed in.", default="unaware",
                  choices=("unaware", "aware", "fifo"), show_default=True),
    CommandOption("iterations", "int", "Training iterations unrolled (2 allows cross-iteration moves such as "
                                       "prefetching).", default=2, min=1, show_default=True),
    CommandOption("cost-table", "text", "Measured collective times (CSV: collective,ranks,bytes,channel,time_us; "
                                        "PARAM's role) used instead of alpha-beta where they cover a motif."),
)


def prepare_plan(args: dict[str, Any]) -> PlanRequest:
    """`mlopt plan schedule`: the topology and the trace read, the options built (args by flag name)."""
    model_path, topology_spec = args["model"], args["topology"]
    topology = resolve_topology(topology_spec, topology_options_from_args(args))
    trace = load_trace_any(model_path)
    options = ScheduleOptions(args["algorithm"], args["budget-s"], args["max-steps"], args["mode"],
                              args["iterations"], args["cost-table"])
    notices = () if any(op.role == "comm" or op.comm is not None for op in trace.ops) else (
        f"{model_path}: the trace has no comm-ops: the plan is the trivial one (compute in issue order)",)
    planner_options = planner_options_from_args(args)

    def write(output: Path, progress) -> PlannedFiles:
        plan = from_trace.plan_to_file(trace, model_path, topology, options, planner_options, str(output),
                                       {"model": model_path, "topology": topology_spec})
        return PlannedFiles([output], plan)

    return PlanRequest({"model": model_path, "topology": topology_spec, "cost_table": options.cost_table},
                       planner_options, vars(options), f"planning the schedule of {model_path} on {topology.name}",
                       write, notices)


def summary(planned: PlannedFiles, output: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`mlopt plan schedule`'s --json summary and its one line about what was written."""
    payload = planned.plan.payload
    systems = ", ".join(f"{k} {v:.0f}" for k, v in payload["systems"].items())
    return {**planned.plan.summary(), "file": output}, (
        f"schedule: iteration {payload['predicted']['iteration_us']:.0f} us ({args['algorithm']}); "
        f"systems (us per iteration): {systems}; wrote {output}")


KIND = PlannerKind(
    name="schedule",
    options_type=ScheduleOptions,
    why_not=from_trace.why_not,
    run=from_trace.run,
    output_suffix=".plan.json",
    files=one_file,
    file_inputs=("model", "cost-table"),
    named_inputs=("topology",),
    validate=validate_schedule_plan,
    metrics=metrics,
    staleness=StalenessFacts(recorded_options=options_in_payload),
    simulation=SimulationFacts(apply=apply_schedule_plan, stage=2, needs_trace=True, at_most_one=True,
                               superseded_by=(("threads",), "it orders the trace's comm-ops; the thread plan "
                                                            "re-buckets them: simulate the schedule plan without "
                                                            "the thread plan")),
    command_options=COMMAND_OPTIONS,
    shared_options=SOLVERLESS_COMMAND_OPTIONS,
    prepare_plan=prepare_plan,
    command_help='Comm-op scheduling and execution plans (Syndicate), first version; -o schedule.plan.json.',
    summary=summary,
)

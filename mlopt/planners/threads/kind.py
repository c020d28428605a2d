"""The threads planner's entry in the registry (mlopt.planners.registry): LIBRA fusion groups and thread
counts, with an NCCL tuner CSV beside the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.loaders import load_trace_any
from mlopt.planners.options import SOLVERLESS_COMMAND_OPTIONS, CommandOption, planner_options_from_args
from mlopt.planners.protocol import PlannedFiles, PlannerKind, PlanRequest, SimulationFacts, StalenessFacts, \
    envelope_metrics, options_in_payload
from mlopt.planners.threads import from_trace
from mlopt.planners.threads.planner import ThreadsOptions
from mlopt.planners.threads.validate import validate_threads_plan
from mlopt.planners.workload_plans import apply_thread_plan


def files(output: str) -> list[str]:
    """`-o X.plan.json` writes X.plan.nccl-tuner.csv and the plan (last)."""
    return [from_trace.tuner_file_for(output).as_posix(), output]


def metrics(doc: dict[str, Any]) -> dict[str, Any]:
    payload = doc.get("payload", {})
    return {**envelope_metrics(doc), "algorithm": payload.get("algorithm"), "groups": len(payload.get("groups") or [])}


MAX_THREADS = 1 << 20  # communication threads per fusion group: far more than any GPU or CPU runs

# `mlopt plan threads`'s own options (ThreadsOptions' fields, the trace and the contention samples)
COMMAND_OPTIONS = (
    CommandOption("model", "text", "Trace to plan for (mlopt trace or PyTorch ET).", required=True),
    CommandOption("nodes", "int", "Data-parallel workers (N).", required=True, min=1),
    CommandOption("contention", "text", "Samples from `mlopt profile contention` to fit the contention model "
                                        "(default: documented defaults)."),
    CommandOption("threads", "text", "Communication thread counts to choose from (R).",
                  default="128,256,512,1024,2048,4096", show_default=True),
    CommandOption("max-groups", "int", "Most fusion groups (K).", default=10, min=1, show_default=True),
    CommandOption("chunks", "int", "Computation chunks of the DP grid (Z); the plan is within 1 + (K-1)/Z of the "
                                   "best.", default=150, min=1, show_default=True),
    CommandOption("algorithm", "choice", "libra: fusion and threads co-optimised; libra-m: threads only on "
                                         "MG-WFBP's fusion; the rest are fusion baselines at --default-threads.",
                  default="libra", choices=("libra", "libra-m", "ddp", "horovod", "mg-wfbp", "single"),
                  show_default=True),
    CommandOption("alpha-us", "float", "Per-step latency of the all-reduce (ring: a = 2(N-1) alpha).", default=5.0,
                  min=0, show_default=True),
    CommandOption("allreduce", "choice", "All-reduce cost model (eq. 3-4).", default="ring",
                  choices=("ring", "tree", "halving_doubling"), show_default=True),
    CommandOption("default-threads", "int", "Threads of the baselines that do not choose them (NCCL_NTHREADS).",
                  default=512, min=1, show_default=True),
    CommandOption("gpus-per-node", "int", "Ranks (GPUs) on each node: the NCCL tuner lines then name the "
                                          "communicator of nodes x this ranks (default: lines for any "
                                          "communicator). Not part of the cost model.", min=1),
)


def thread_set_of(text: str) -> tuple[int, ...]:
    """--threads 128,256,512 -> (128, 256, 512); InputError (exit 2) naming --threads otherwise."""
    try:
        thread_set = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError("--threads", "$", f"{text!r}: expected thread counts like 128,256,512") from None
    if not thread_set:
        raise InputError("--threads", "$", "the thread set is empty")
    if not all(1 <= r <= MAX_THREADS for r in thread_set):
        raise InputError("--threads", "$", f"{text!r}: thread counts run from 1 to {MAX_THREADS}")
    return thread_set


def prepare_plan(args: dict[str, Any]) -> PlanRequest:
    """`mlopt plan threads`: the thread set parsed and the options built (args by flag name); the trace is
    read when planning."""
    model_path, contention_path = args["model"], args["contention"]
    options = ThreadsOptions(args["nodes"], args["algorithm"], thread_set_of(args["threads"]), args["max-groups"],
                             args["chunks"], args["alpha-us"], args["allreduce"], args["default-threads"],
                             args["gpus-per-node"])
    planner_options = planner_options_from_args(args)
    inputs = {"model": model_path, "contention": contention_path}

    def write(output: Path, progress) -> PlannedFiles:
        plan = from_trace.plan_to_files(load_trace_any(model_path), model_path, options, planner_options,
                                        str(output), inputs, contention_path)
        return PlannedFiles([from_trace.tuner_file_for(output), output], plan)

    return PlanRequest(inputs, planner_options, vars(options), f"planning threads for {model_path}", write)


def summary(planned: PlannedFiles, output: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`mlopt plan threads`'s --json summary and its one line about what was written."""
    plan_obj, payload = planned.plan, planned.plan.payload
    baseline = ", ".join(f"{k} {v:.0f}" for k, v in payload["baselines"].items())
    return {**plan_obj.summary(), "file": output}, (
        f"threads: {len(payload['groups'])} groups, backward {plan_obj.objective:.0f} us ({plan_obj.status.value}); "
        f"baselines (us): {baseline}; wrote {output} and {planned.files[0]}")


KIND = PlannerKind(
    name="threads",
    options_type=ThreadsOptions,
    why_not=from_trace.why_not,
    run=from_trace.run,
    output_suffix=".plan.json",
    files=files,
    file_inputs=("model", "contention"),
    named_inputs=(),
    validate=validate_threads_plan,
    metrics=metrics,
    staleness=StalenessFacts(recorded_options=options_in_payload),
    simulation=SimulationFacts(apply=apply_thread_plan, stage=0, needs_trace=True, at_most_one=True),
    command_options=COMMAND_OPTIONS,
    shared_options=SOLVERLESS_COMMAND_OPTIONS,
    prepare_plan=prepare_plan,
    command_help='Communication threads per fusion group (LIBRA); -o threads.plan.json (+ .nccl-tuner.csv beside it).',
    summary=summary,
)

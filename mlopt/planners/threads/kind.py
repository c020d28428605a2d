"""The threads planner's entry in the registry (mlopt.planners.registry): LIBRA fusion groups and thread
counts, with an NCCL tuner CSV beside the plan."""

from __future__ import annotations

from typing import Any

from mlopt.planners.protocol import PlannerKind, SimulationFacts, StalenessFacts, envelope_metrics, \
    options_in_payload
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
)

"""The schedule planner's entry in the registry (mlopt.planners.registry): Syndicate's motifs and their order."""

from __future__ import annotations

from typing import Any

from mlopt.planners.protocol import PlannerKind, SimulationFacts, StalenessFacts, envelope_metrics, \
    options_in_payload, one_file
from mlopt.planners.schedule import from_trace
from mlopt.planners.schedule.planner import ScheduleOptions
from mlopt.planners.schedule.validate import validate_schedule_plan
from mlopt.planners.workload_plans import apply_schedule_plan


def metrics(doc: dict[str, Any]) -> dict[str, Any]:
    payload = doc.get("payload", {})
    predicted = payload.get("predicted") or {}
    return {**envelope_metrics(doc), "algorithm": payload.get("algorithm"), "iteration_us": predicted.get("iteration_us")}


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
)

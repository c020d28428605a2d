"""The memory planner's entry in the registry (mlopt.planners.registry): MONeT checkpointing plans."""

from __future__ import annotations

from typing import Any

from mlopt.planners.memory import from_trace
from mlopt.planners.memory.planner import MemoryOptions
from mlopt.planners.memory.validate import validate_memory_plan
from mlopt.planners.protocol import PlannerKind, SimulationFacts, StalenessFacts, envelope_metrics, one_file
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
)

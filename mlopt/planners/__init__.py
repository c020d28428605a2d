"""Planners: each a pure `plan(problem, options) -> Plan`, registered here for `mlopt plan --model`.

A registry entry says whether its planner applies to the given trace and topology (and why not), and how
to run it. Planners land with their issues (memory, collective, threads, schedule); until then the
umbrella command reports each as not available.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlopt.formats.plan import Plan
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.options import PlannerOptions


@dataclass(frozen=True)
class WrittenPlan:
    """One plan file a planner wrote into the output folder (its own extra files, e.g. XML, beside it)."""

    file: str  # name relative to the output folder
    plan: Plan


@dataclass(frozen=True)
class PlannerEntry:
    kind: str
    # None when the planner applies, else the reason it does not (e.g. "trace has no comm ops")
    why_not: Callable[[ModelTrace, Topology | None], str | None]
    # Plans for the trace, written atomically into the output folder; `inputs` names input files for provenance
    run: Callable[[ModelTrace, Topology | None, PlannerOptions, Path, dict[str, Any]], list[WrittenPlan]]


PLANNER_KINDS = ("memory", "collective", "threads", "schedule")


def registered_planners() -> tuple[PlannerEntry, ...]:
    """Planners available in this release, in the order the umbrella command runs them."""
    from mlopt.planners.collective import from_trace as collective
    from mlopt.planners.memory import from_trace as memory
    from mlopt.planners.schedule import from_trace as schedule
    from mlopt.planners.threads import from_trace as threads

    return (PlannerEntry("memory", memory.why_not, memory.run),
            PlannerEntry("collective", collective.why_not, collective.run),
            PlannerEntry("threads", threads.why_not, threads.run),
            PlannerEntry("schedule", schedule.why_not, schedule.run))

"""Planners: each a pure `plan(problem, options) -> Plan`, registered here for `mlopt plan --model`.

A registry entry says whether its planner applies to the given trace and topology (and why not), and how
to run it. Planners land with their issues (memory, collective, threads, schedule); until then the
umbrella command reports each as not available.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mlopt.formats.plan import Plan
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.options import PlannerOptions


@dataclass(frozen=True)
class PlannerEntry:
    kind: str
    # None when the planner applies, else the reason it does not (e.g. "trace has no comm ops")
    why_not: Callable[[ModelTrace, Topology | None], str | None]
    run: Callable[[ModelTrace, Topology | None, PlannerOptions], Plan]
    file_suffix: str = ".plan.json"


PLANNER_KINDS = ("memory", "collective", "threads", "schedule")


def registered_planners() -> tuple[PlannerEntry, ...]:
    """Planners available in this release, in the order the umbrella command runs them."""
    return ()

"""Every planner kind of this release, in the order `mlopt plan --model` runs them (issue 25).

Commands learn about plan kinds only here: `mlopt plan --model` (mlopt.planners.umbrella), `mlopt plan KIND`
(mlopt.cli: its flags from the kind's `command_options`, its work from `prepare_plan`), `mlopt validate`
(mlopt.validate), `mlopt sweep` (mlopt.sweep.cells: the kind's `plan_files`, without the command line),
`--check` (mlopt.plan_check) and `mlopt simulate` (mlopt.cli) look a kind up and use its `PlannerKind`
(mlopt.planners.protocol). A new kind is a
`mlopt/planners/<kind>/kind.py` with a `KIND` and one line in `_KINDS`.
"""

from __future__ import annotations

from typing import Any

from mlopt.errors import InputError
from mlopt.planners.collective import kind as collective
from mlopt.planners.memory import kind as memory
from mlopt.planners.protocol import PlannerKind
from mlopt.planners.schedule import kind as schedule
from mlopt.planners.threads import kind as threads

_KINDS: list[PlannerKind] = [memory.KIND, collective.KIND, threads.KIND, schedule.KIND]


def planner_kinds() -> tuple[PlannerKind, ...]:
    """The registered kinds, in the order the umbrella command runs them."""
    return tuple(_KINDS)


def kind_names() -> tuple[str, ...]:
    return tuple(k.name for k in _KINDS)


def find_kind(name: str) -> PlannerKind | None:
    return next((k for k in _KINDS if k.name == name), None)


def planner_kind(name: str, source: str = "<plan>", field: str = "$.kind") -> PlannerKind:
    """The kind named `name`; InputError (exit 2) naming the file when this mlopt has none."""
    found = find_kind(name)
    if found is None:
        raise InputError(source, field, f"no planner for plan kind {name!r} in this mlopt (it has "
                                        f"{', '.join(kind_names())})")
    return found


def register(kind: PlannerKind) -> None:
    """Add a kind (a plugin, or a test's); a second kind of the same name is a ValueError."""
    if find_kind(kind.name) is not None:
        raise ValueError(f"a planner kind {kind.name!r} is registered already")
    _KINDS.append(kind)


def unregister(name: str) -> None:
    """Remove a kind `register` added (tests restore the registry with it)."""
    _KINDS[:] = [k for k in _KINDS if k.name != name]


def plan_metrics(kind_name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Status, objective, gap and the kind's headline numbers from a plan envelope (a sweep summary's row)."""
    return planner_kind(kind_name).metrics(doc)

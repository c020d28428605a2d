"""`mlopt plan ... --check PLAN` (docs/plan-check.md): a plan, or every plan of an `mlopt plan --model` index,
against the inputs and options given now.

The envelope comparisons (inputs, options, version, a re-run's bytes) are mlopt.formats.staleness's; what
differs between kinds (options a kind records in its payload, a collective plan's XML and its hash, where a
re-run writes) is each kind's StalenessFacts in mlopt.planners.registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.plan import PlanFile
from mlopt.formats.staleness import PlanCheck, compare_inputs, compare_options, compare_version, current_inputs, \
    index_path_for, load_index, load_plan_of_kind, recorded_options
from mlopt.planners.protocol import StalenessFacts
from mlopt.planners.registry import find_kind, planner_kind


def facts_of(kind: str) -> StalenessFacts:
    """The kind's staleness facts; a kind this mlopt does not have (listed by an index) has none of its own."""
    found = find_kind(kind)
    return found.staleness if found is not None else StalenessFacts()


def _version_and_files(check: PlanCheck, path: Path, plan: PlanFile, facts: StalenessFacts,
                       strict_version: bool) -> None:
    check.stale += facts.file_checks(path, plan)
    stale, warnings = compare_version(plan.provenance.get("mlopt_version"), strict_version)
    check.stale += stale
    check.warnings += warnings


def check_plan(path: str | os.PathLike, kind: str, inputs: dict[str, Any], planner_options: dict[str, Any],
               specific: dict[str, Any] | None = None, strict_version: bool = False) -> PlanCheck:
    """Compare the plan at `path` with the inputs and options a planner subcommand was given now."""
    facts = planner_kind(kind, str(path)).staleness
    path = facts.plan_file(Path(path))
    plan = load_plan_of_kind(path, kind)
    result = PlanCheck(str(path), kind)
    result.stale += compare_inputs(plan.provenance.get("inputs"), current_inputs(inputs), inputs, str(path))
    recorded = recorded_options(plan, str(path), facts.recorded_options(plan.payload))
    expected = {**planner_options, **facts.expected_options(dict(specific or {}))}
    result.stale += compare_options(recorded, expected, complete=True)
    _version_and_files(result, path, plan, facts, strict_version)
    return result


def check_index(path: str | os.PathLike, inputs: dict[str, Any], planner_options: dict[str, Any],
                strict_version: bool = False) -> list[PlanCheck]:
    """The index itself (its inputs and version), then every plan it lists (its inputs, the shared planner
    options, its version); a listed plan that is missing or of another kind is stale, not bad input."""
    path = index_path_for(path)
    index = load_index(path)
    current = current_inputs(inputs)
    head = PlanCheck(str(path), "index")
    head.stale += compare_inputs(index.get("inputs"), current, inputs, str(path))
    stale, warnings = compare_version(index.get("mlopt_version"), strict_version)
    head.stale += stale
    head.warnings += warnings
    checks = [head]
    for i, entry in enumerate(index.get("plans", [])):
        plan_path = path.parent / str(entry.get("file"))
        check = PlanCheck(str(plan_path), str(entry.get("kind")))
        checks.append(check)
        if not plan_path.is_file():
            check.stale.append(f"listed in {path} ($.plans[{i}]) but missing")
            continue
        try:
            plan = load_plan_of_kind(plan_path, check.kind)
        except InputError as exc:
            check.stale.append(f"not the plan {path} lists: {exc}")
            continue
        facts = facts_of(check.kind)
        check.stale += compare_inputs(plan.provenance.get("inputs"), current, inputs, str(plan_path))
        recorded = recorded_options(plan, str(plan_path), facts.recorded_options(plan.payload))
        check.stale += compare_options(recorded, planner_options, complete=False)
        _version_and_files(check, plan_path, plan, facts, strict_version)
    return checks


def rerun_output(kind: str, plan_path: str | os.PathLike, tmp_dir: Path) -> Path:
    """Where a re-run writes (in `tmp_dir`) so that its files have the committed files' names: the index's
    folder for the umbrella command, else the name the kind gives (a collective plan: its XML's)."""
    if kind == "index":
        return tmp_dir / "plans"
    facts = planner_kind(kind, str(plan_path)).staleness
    path = facts.plan_file(Path(plan_path))
    return tmp_dir / facts.rerun_name(path, load_plan_of_kind(path, kind))

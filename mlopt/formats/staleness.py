"""Is a committed plan current? The comparisons behind `mlopt plan ... --check PLAN` (docs/plan-check.md).

A plan records, in its provenance, the sha256 of every input file (presets and generators hashed by their
name), the options it ran with and the mlopt version. The comparisons here know the plan envelope, not the
planners: `mlopt.plan_check` puts them together with each kind's own facts (mlopt.planners.registry) to check
a plan or every plan an `mlopt plan --model` index lists. `compare_outputs` is the `--resolve` half: the files a re-run wrote into a temporary folder
against the committed ones, byte for byte, naming the first differing JSON path (or line) when they differ.

A plan is *stale* when an input's hash, an input's presence, an option or (with `strict_version`) the mlopt
version differs, or when a re-run writes other bytes; a different mlopt version alone is a warning.
Bad input (PLAN missing, unreadable, not a plan, a plan of another kind) raises InputError (exit 2).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlopt import __version__
from mlopt.errors import InputError, MloptError
from mlopt.formats import document
from mlopt.formats.io import canonical_json, read_bytes, read_document
from mlopt.formats.plan import PlanFile, input_hashes, plan_from_dict

# Inputs that may name a preset or generator instead of a file (hashed by their name); every other input must
# be an existing file.
NAMED_INPUTS = ("topology",)
INDEX_FILE = "index.json"


class StalePlanError(MloptError):
    """`--check` found a stale plan: exit 1 (the verdict lines are printed before)."""

    exit_code = 1


@dataclass
class PlanCheck:
    """The verdict on one plan file: current when `stale` is empty."""

    plan: str  # the plan file checked (a collective plan: its JSON sidecar)
    kind: str
    stale: list[str] = field(default_factory=list)  # one line per reason
    warnings: list[str] = field(default_factory=list)
    resolved: bool = False  # a re-run was compared byte for byte (--resolve)

    @property
    def current(self) -> bool:
        return not self.stale

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "kind": self.kind, "status": "current" if self.current else "stale",
                "stale": list(self.stale), "warnings": list(self.warnings), "resolved": self.resolved}

    def lines(self) -> list[str]:
        """The verdict the CLI prints: `PLAN: current` or one `PLAN: stale: ...` line per reason."""
        return [f"{self.plan}: stale: {reason}" for reason in self.stale] or [
            f"{self.plan}: current" + (" (re-solved: same bytes)" if self.resolved else "")]


# ---------------------------------------------------------------------------------------------------------
# inputs


def current_inputs(inputs: dict[str, str | os.PathLike | None]) -> dict[str, str]:
    """sha256 of each input given now, as a planner records it; an input file that does not exist is bad input
    (a topology may be a preset or generator name, hashed by its name)."""
    for name, path in inputs.items():
        if path is None or name in NAMED_INPUTS:
            continue
        if not os.path.isfile(path):
            what = "is a directory, expected a file" if os.path.isdir(path) else "no such file"
            raise InputError(str(path), "$", what)
    return input_hashes(inputs)


def _short(digest: Any) -> str:
    return f"{str(digest)[:12]}.." if isinstance(digest, str) else repr(digest)


def compare_inputs(recorded: Any, current: dict[str, str], given: dict[str, Any], source: str) -> list[str]:
    """One line per input whose hash changed, that was recorded but is not given now, or the reverse."""
    if not isinstance(recorded, dict):
        raise InputError(source, "$.provenance.inputs", "missing or not an object of sha256 digests")
    out = []
    for name in sorted(set(recorded) | set(current)):
        shown = f"{name} ({given[name]})" if given.get(name) is not None else name
        if name not in current:
            out.append(f"input {name} is recorded (sha256 {_short(recorded[name])}) but not given now")
        elif name not in recorded:
            out.append(f"input {shown} is given now but the plan records none")
        elif recorded[name] != current[name]:
            out.append(f"input {shown} changed (sha256 {_short(recorded[name])} -> {_short(current[name])})")
    return out


def compare_version(recorded: Any, strict: bool) -> tuple[list[str], list[str]]:
    """(stale lines, warnings) for the mlopt version the plan was made with."""
    if recorded == __version__:
        return [], []
    line = f"made by mlopt {recorded}, this is mlopt {__version__}"
    return ([line], []) if strict else ([], [line + " (stale only with --strict-version)"])


# ---------------------------------------------------------------------------------------------------------
# options


def _plain(value: Any) -> Any:
    """A Python value as it reads back from a plan file (tuples as lists, floats rounded)."""
    return json.loads(canonical_json(value))


def recorded_options(plan: PlanFile, source: str, own: dict[str, tuple[str, Any]] | None = None
                     ) -> dict[str, tuple[str, Any]]:
    """Every option the plan records, by name: (its JSON path in the plan, its value). The shared planner
    options live in provenance.options (with the collective planner's own); `own` adds the options a kind keeps
    in its payload (its planner's StalenessFacts.recorded_options, mlopt.planners.protocol)."""
    options = plan.provenance.get("options")
    if not isinstance(options, dict):
        raise InputError(source, "$.provenance.options", "missing or not an object")
    out = {name: (f"$.provenance.options.{name}", value) for name, value in options.items()}
    out.update(own or {})
    return out


def compare_options(recorded: dict[str, tuple[str, Any]], expected: dict[str, Any], complete: bool) -> list[str]:
    """One `options differ: ...` line per option whose recorded value is not the value given now. With
    `complete` (a planner subcommand: `expected` names every option its plans record) an option recorded but not
    expected differs too; without (the umbrella command: only the shared planner options are known) it is
    left alone."""
    expected = _plain(expected)
    out = []
    for name in sorted(set(expected) | (set(recorded) if complete else set())):
        path, value = recorded.get(name, (None, None))
        if name not in expected:
            out.append(f"options differ: {name} ({path}): recorded {json.dumps(value)}, not given now")
        elif path is None:
            out.append(f"options differ: {name}: not recorded in the plan, now {json.dumps(expected[name])}")
        elif value != expected[name]:
            out.append(f"options differ: {name} ({path}): recorded {json.dumps(value)}, now "
                       f"{json.dumps(expected[name])}")
    return out


# ---------------------------------------------------------------------------------------------------------
# plan files


def load_plan_of_kind(path: str | os.PathLike, kind: str) -> PlanFile:
    """The plan at `path`, which must be a plan of `kind` (InputError, exit 2, otherwise)."""
    plan = plan_from_dict(read_document(path), str(path))
    if plan.kind != kind:
        raise InputError(str(path), "$.kind", f"a {plan.kind} plan, expected a {kind} plan (mlopt plan {kind})")
    if not isinstance(plan.provenance, dict) or not isinstance(plan.payload, dict):
        raise InputError(str(path), "$.provenance", "missing or not an object")
    return plan


def index_path_for(path: str | os.PathLike) -> Path:
    """PLAN of the umbrella command: its index.json, or the folder holding it."""
    path = Path(path)
    return path / INDEX_FILE if path.is_dir() else path


def load_index(path: Path) -> dict[str, Any]:
    doc = read_document(path)
    document.check_document(doc, document.PLAN_INDEX, str(path))
    return doc


# ---------------------------------------------------------------------------------------------------------
# --resolve: a re-run's files against the committed ones


def recorded_wall_time(paths: list[Path]) -> Path | None:
    """The first of these plan files that records wall times (--record-wall-time): its bytes cannot repeat."""
    for path in paths:
        try:
            doc = json.loads(read_bytes(path))
        except (InputError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("provenance"), dict) and "wall_time_s" in doc["provenance"]:
            return path
    return None


def first_difference(committed: Any, regenerated: Any, where: str = "$") -> str | None:
    """The first JSON path (sorted keys) at which the two documents differ, with both values; None if equal."""
    if isinstance(committed, dict) and isinstance(regenerated, dict):
        for key in sorted(set(committed) | set(regenerated)):
            here = f"{where}.{key}"
            if key not in regenerated:
                return f"{here}: in the committed file, not in the re-run"
            if key not in committed:
                return f"{here}: not in the committed file, in the re-run ({_brief(regenerated[key])})"
            found = first_difference(committed[key], regenerated[key], here)
            if found:
                return found
        return None
    if isinstance(committed, list) and isinstance(regenerated, list):
        for i, (a, b) in enumerate(zip(committed, regenerated)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        if len(committed) != len(regenerated):
            return f"{where}: {len(committed)} items committed, {len(regenerated)} in the re-run"
        return None
    if committed == regenerated and type(committed) is type(regenerated):
        return None
    return f"{where}: committed {_brief(committed)}, re-run {_brief(regenerated)}"


def _brief(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def _same_version(doc: Any) -> Any:
    """The document with its mlopt version set to this one's (a version difference alone is only a warning)."""
    if isinstance(doc, dict):
        doc = dict(doc)
        if "mlopt_version" in doc:
            doc["mlopt_version"] = __version__
        if isinstance(doc.get("provenance"), dict) and "mlopt_version" in doc["provenance"]:
            doc["provenance"] = {**doc["provenance"], "mlopt_version": __version__}
    return doc


def _file_difference(committed: Path, regenerated: Path, strict_version: bool) -> str | None:
    old, new = committed.read_bytes(), regenerated.read_bytes()
    if old == new:
        return None
    if committed.suffix == ".json":
        try:
            old_doc, new_doc = json.loads(old), json.loads(new)
        except ValueError:
            return "not JSON any more (the re-run writes JSON)"
        if not strict_version:  # only the version differs: compare_version warned
            old_doc, new_doc = _same_version(old_doc), _same_version(new_doc)
        found = first_difference(old_doc, new_doc)
        if found:
            return found
        if canonical_json(json.loads(old)).encode() != old:
            return "same JSON, other bytes (the file was reformatted)"
        return None
    old_lines, new_lines = old.decode("utf-8", "replace").splitlines(), new.decode("utf-8", "replace").splitlines()
    for number, (a, b) in enumerate(zip(old_lines, new_lines), start=1):
        if a != b:
            return f"line {number}: committed {_brief(a)}, re-run {_brief(b)}"
    if len(old_lines) != len(new_lines):
        return f"{len(old_lines)} lines committed, {len(new_lines)} in the re-run"
    return "same lines, other bytes (line endings or trailing newline)"


def compare_outputs(regenerated_dir: Path, committed_dir: Path, strict_version: bool = False) -> dict[str, str]:
    """Committed file -> why it differs from what the re-run wrote (every file the re-run wrote; a committed
    file missing counts). Empty when every byte agrees."""
    out = {}
    for new in sorted(p for p in regenerated_dir.rglob("*") if p.is_file()):
        committed = committed_dir / new.relative_to(regenerated_dir)
        if not committed.is_file():
            out[str(committed)] = "re-solved: the re-run writes it, but it is not there"
            continue
        why = _file_difference(committed, new, strict_version)
        if why:
            out[str(committed)] = f"re-solved: {why}"
    return out


def apply_resolve(checks: list[PlanCheck], differences: dict[str, str]) -> None:
    """Attach the re-run's differences to the check of the file they concern (or to the first check)."""
    by_file = {str(Path(c.plan)): c for c in checks}
    for check in checks:
        check.resolved = True
    for committed, why in differences.items():
        target = by_file.get(str(Path(committed)))
        if target is None:
            target = checks[0]
            why = f"{committed}: {why}"
        target.stale.append(why)


# ---------------------------------------------------------------------------------------------------------
# plans used with inputs: `mlopt validate PLAN --model ...`, `mlopt simulate PLAN --model ...`


def recorded_inputs_of(path: str | os.PathLike) -> tuple[str, dict[str, Any]] | None:
    """(JSON path of the recorded input hashes, the hashes) of a plan or plan index file; None for any other
    file (a trace, a topology, an XML). The file was loaded and checked before (load_any)."""
    if not str(path).endswith((".json", ".json.gz")):
        return None
    doc = read_document(path)
    fmt = document.format_of(doc)
    if fmt == document.PLAN.name and isinstance(doc.get("provenance"), dict):
        return "$.provenance.inputs", doc["provenance"].get("inputs") or {}
    if fmt == document.PLAN_INDEX.name:
        return "$.inputs", doc.get("inputs") or {}
    return None


def changed_inputs(path: str | os.PathLike, given: dict[str, str | None]) -> list[tuple[str, str]]:
    """(JSON path, line) for each input given now (model, topology) whose sha256 differs from the one the plan
    or index at `path` recorded. Inputs the file does not record, or that are not given now, are not compared:
    validate and simulate take only what they need."""
    recorded = recorded_inputs_of(path)
    if recorded is None:
        return []
    where, hashes = recorded
    named = {name: value for name, value in given.items() if value is not None and name in hashes}
    current = input_hashes(named)
    return [(f"{where}.{name}", f"input {name} ({named[name]}) is not the one it was made for (sha256 "
                                f"{_short(hashes[name])} recorded, {_short(current[name])} given)")
            for name in sorted(named) if hashes[name] != current[name]]

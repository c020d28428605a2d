"""The plan envelope every planner writes, and the index `mlopt plan --model` writes beside the plans.

Envelope: `format`, `schema_version`, `kind`, `provenance` (mlopt version, sha256 of each input, solver
name and version, status, objective, best bound, gap, options and, when asked for, wall time), `payload`
(the planner's own content, checked by that planner's validator).

Wall time is left out of the file unless `record_wall_time` is set: plans must be byte-identical for the
same inputs and seed (CI jobs diff regenerated plans), and a clock reading never is. The in-memory Plan
always carries it, and `--json` prints it.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlopt import __version__
from mlopt.formats import document
from mlopt.formats.io import read_document, sha256_bytes, sha256_file, write_json


class PlanStatus(str, enum.Enum):
    OPTIMAL = "optimal"  # the solver proved optimality within the requested gap
    FEASIBLE = "feasible"  # a solution with a gap (time limit or gap tolerance reached)
    HEURISTIC = "heuristic"  # not from a solver (baselines; or a start an ILP could not beat: its bound, if any)
    INFEASIBLE = "infeasible"
    TIME_LIMIT_NO_SOLUTION = "time-limit-no-solution"
    ERROR = "error"

    @property
    def has_plan(self) -> bool:
        return self in (PlanStatus.OPTIMAL, PlanStatus.FEASIBLE, PlanStatus.HEURISTIC)


@dataclass(frozen=True)
class Provenance:
    inputs: dict[str, str]  # input name -> sha256 of its bytes
    solver: str  # adapter name, or "none" for heuristics
    solver_version: str
    options: dict[str, Any]  # every option the planner ran with
    mlopt_version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        return {
            "mlopt_version": self.mlopt_version,
            "inputs": dict(sorted(self.inputs.items())),
            "solver": {"name": self.solver, "version": self.solver_version},
            "options": self.options,
        }


@dataclass(frozen=True)
class Plan:
    """The one result type every planner returns."""

    kind: str  # "memory", "collective", "threads", "schedule", ...
    status: PlanStatus
    objective: float | None
    best_bound: float | None
    gap: float | None  # relative; 0 when proven optimal, None without a bound
    wall_time_s: float
    payload: dict[str, Any]
    provenance: Provenance
    notes: tuple[str, ...] = field(default=())  # one-line remarks for the user (fallbacks, warnings)

    def to_dict(self, record_wall_time: bool = False) -> dict[str, Any]:
        prov = self.provenance.to_dict()
        prov.update(status=self.status.value, objective=self.objective, best_bound=self.best_bound, gap=self.gap)
        if record_wall_time:
            prov["wall_time_s"] = self.wall_time_s
        return {**document.header(document.PLAN), "kind": self.kind, "provenance": prov, "payload": self.payload}

    def summary(self) -> dict[str, Any]:
        """Machine-readable result for `--json` (always with wall time)."""
        return {
            "kind": self.kind, "status": self.status.value, "objective": self.objective,
            "best_bound": self.best_bound, "gap": self.gap, "wall_time_s": self.wall_time_s,
            "solver": self.provenance.solver, "notes": list(self.notes),
        }


@dataclass(frozen=True)
class PlanFile:
    """A plan as read back from disk (wall time present only if it was recorded)."""

    kind: str
    provenance: dict[str, Any]
    payload: dict[str, Any]

    @property
    def status(self) -> PlanStatus:
        return PlanStatus(self.provenance["status"])


def input_hashes(paths: dict[str, str | os.PathLike | None]) -> dict[str, str]:
    """sha256 of each named input file; presets and generated inputs are hashed by their name."""
    out = {}
    for name, path in paths.items():
        if path is None:
            continue
        out[name] = sha256_file(path) if os.path.isfile(path) else sha256_bytes(str(path).encode())
    return out


def save_plan(plan: Plan, path: str | os.PathLike, record_wall_time: bool = False) -> None:
    write_json(path, plan.to_dict(record_wall_time))


# The committed schema of each planner's payload: the fields its validator, the simulator and the runtime read
# (types, ranges, required keys), so that a mistyped or missing field is refused naming its JSON path instead
# of surfacing as a KeyError deep inside a replay. Kinds without one are checked by their validator alone.
PAYLOAD_SCHEMAS = {"memory": "memory-payload.schema.json", "threads": "threads-payload.schema.json",
                   "schedule": "schedule-payload.schema.json", "collective": "collective-payload.schema.json"}


def check_payload(kind: str, payload: Any, source: str) -> None:
    """InputError naming `$.payload...` when a payload breaks its kind's schema."""
    name = PAYLOAD_SCHEMAS.get(kind)
    if name is not None:
        document.validate_against(payload, document.load_schema_file(name), source, prefix="$.payload")


def envelope_from_dict(doc: Any, source: str = "<plan>") -> PlanFile:
    """The plan with its envelope checked but not its payload: for code that only sorts plans by kind (an
    index's listing, the simulator's classification), so that one bad payload is reported where it is used."""
    document.check_document(doc, document.PLAN, source)
    return PlanFile(doc["kind"], doc["provenance"], doc["payload"])


def plan_from_dict(doc: Any, source: str = "<plan>") -> PlanFile:
    plan = envelope_from_dict(doc, source)
    check_payload(plan.kind, plan.payload, source)
    return plan


def load_plan(path: str | os.PathLike) -> PlanFile:
    return plan_from_dict(read_document(path), str(path))


def sidecar_path(xml_path: str | os.PathLike) -> Path:
    """Where a collective plan's envelope (its sidecar) lies beside its MSCCL-EF XML: ag.xml -> ag.json; anything
    else gets `.json` appended."""
    xml = Path(xml_path)
    return xml.with_suffix(".json") if xml.suffix == ".xml" else xml.with_name(xml.name + ".json")

"""`mlopt validate`: check any mlopt file without a solver.

Topologies and traces get their schema and semantic checks; plans get the envelope check and then their
kind's payload validator (its entry in mlopt.planners.registry), which replays the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.loaders import Loaded, load_any
from mlopt.formats.msccl_contract import check_contract, effective_program, in_place_only
from mlopt.formats.plan import PlanFile
from mlopt.planners.collective.validate import proven_program
from mlopt.planners.registry import find_kind


@dataclass(frozen=True)
class ValidationResult:
    file: str
    kind: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "kind": self.kind, "ok": True, "detail": self.detail}


def _detail(loaded: Loaded) -> str:
    value = loaded.value
    if loaded.kind == "topology":
        return f"{value.num_ranks} ranks in {value.num_nodes} node(s), {len(value.links)} links"
    if loaded.kind == "trace":
        return f"{len(value.ops)} ops, {len(value.tensors)} tensors"
    if loaded.kind == "taccl-sketch":
        return f"sketch for {value.nnodes} node(s)"
    if loaded.kind == "plan-index":
        return f"{len(value['plans'])} plan(s)"
    return ""


def _check_msccl(loaded: Loaded) -> str:
    """The input contract first (the same rules and order as the C++ loader, docs/input-contract.md), then the
    symbolic proof of the program as it runs (an in-place-only program with its left-out buffer sized)."""
    program = loaded.value
    check_contract(program, loaded.source)
    ignored = ", ".join(program.origin.ignored) if program.origin else ""
    try:
        detail = proven_program(effective_program(program), loaded.source)
    except InputError as exc:
        if not ignored:
            raise
        # What was skipped may be what the program lacks (TE-CCL's <copy>): say so.
        message = f"{exc.message}; ignored as the executor does: {ignored}"
        raise InputError(exc.file, exc.field, message, exc.status) from None
    if in_place_only(program):
        detail += "; in place only"
    return detail + (f"; ignored as the executor does: {ignored}" if ignored else "")


def validate_file(path: str, model_path: str | None = None, topology_spec: str | None = None) -> ValidationResult:
    """Validate one file; raises InputError (exit 2) on the first problem."""
    loaded = load_any(path)
    if loaded.kind == "msccl":
        return ValidationResult(path, "msccl-ef program", _check_msccl(loaded))
    if loaded.kind != "plan":
        return ValidationResult(path, loaded.kind, _detail(loaded))
    plan: PlanFile = loaded.value
    kind = find_kind(plan.kind)
    if kind is None:
        raise InputError(path, "$.kind", f"no validator for plan kind {plan.kind!r} in this mlopt")
    return ValidationResult(path, f"{plan.kind} plan", kind.validate(plan, path, model_path, topology_spec))

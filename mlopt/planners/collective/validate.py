"""Checking collective plans without a solver: the XML must prove its collective and match its sidecar."""

from __future__ import annotations

from pathlib import Path

from mlopt.errors import InputError
from mlopt.formats.io import sha256_file
from mlopt.formats.msccl import Program
from mlopt.formats.msccl_xml import load_program
from mlopt.formats.plan import PlanFile
from mlopt.sim.symbolic import check_program


def proven_program(program: Program, source: str) -> str:
    """One-line verdict for a program that implements its collective; InputError (exit 2) otherwise."""
    report = check_program(program)
    if not report.ok:
        findings = report.problems + report.deadlock
        more = f" ({len(findings) - 1} more)" if len(findings) > 1 else ""
        raise InputError(source, "algo", f"does not implement {program.coll}: {findings[0]}{more}")
    spec = report.spec
    detail = (f"{program.coll}, {program.ngpus} ranks, {spec.chunks_per_rank if spec else '?'} chunk(s) per rank, "
              f"{report.steps_total} steps, proven for {' and '.join(report.variants)}")
    if report.bounded_fifo:
        detail += f"; may deadlock under the executor's bounded FIFOs: {report.bounded_fifo[0]}"
    return detail


def validate_collective_plan(plan: PlanFile, source: str, model_path: str | None, topology_spec: str | None) -> str:
    """The sidecar's XML exists, is the one the plan describes (sha256), and proves the collective."""
    payload = plan.payload
    for key in ("xml", "xml_sha256", "collective", "ngpus"):
        if key not in payload:
            raise InputError(source, f"$.payload.{key}", "missing required field")
    xml_path = Path(source).parent / payload["xml"]
    if Path(payload["xml"]).is_absolute() or ".." in Path(payload["xml"]).parts:
        raise InputError(source, "$.payload.xml", f"{payload['xml']!r} is not a file name beside the plan")
    if not xml_path.is_file():
        raise InputError(source, "$.payload.xml", f"algorithm file {xml_path} not found")
    if sha256_file(xml_path) != payload["xml_sha256"]:
        raise InputError(source, "$.payload.xml_sha256", f"{xml_path} changed since the plan was written")
    program = load_program(xml_path)
    if program.coll != payload["collective"] or program.ngpus != payload["ngpus"]:
        field = "$.payload.collective" if program.coll != payload["collective"] else "$.payload.ngpus"
        raise InputError(source, field,
                         f"plan says {payload['collective']} on {payload['ngpus']} ranks, XML has {program.coll} on {program.ngpus}")
    return proven_program(program, str(xml_path))

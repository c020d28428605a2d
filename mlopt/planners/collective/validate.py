"""Checking collective plans without a solver: the XML must prove its collective and match its sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import read_document, sha256_file
from mlopt.formats.msccl import Program
from mlopt.formats.msccl_xml import load_program
from mlopt.formats.plan import PlanFile, sidecar_path
from mlopt.planners.collective.size_bands import SizeBand, band_of, claimed_range, gap_problems, overlap_problems, xml_range
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
    check_size_band(payload, program, source)
    check_neighbours(payload, program, xml_path, source)
    return proven_program(program, str(xml_path))


def check_size_band(payload: dict[str, Any], program: Program, source: str) -> SizeBand:
    """The XML claims exactly the band its sidecar records, and the band holds the planned size."""
    band = band_of(payload, source)
    dialect = payload.get("xml_dialect", "executor")
    wanted = xml_range(band, dialect)
    if (program.min_bytes, program.max_bytes) != wanted:
        raise InputError(source, "$.payload.size_band", f"the XML claims minBytes={program.min_bytes} "
                         f"maxBytes={program.max_bytes}, the band {band.min_bytes}..{band.max_bytes} needs "
                         f"minBytes={wanted[0]} maxBytes={wanted[1]} ({dialect} dialect)")
    if "size_bytes" in payload and not band.contains(payload["size_bytes"]):
        raise InputError(source, "$.payload.size_band", f"the planned size {payload['size_bytes']} bytes is outside "
                                                        f"the band {band.min_bytes}..{band.max_bytes}")
    return band


def _same_calls(a: Program, b: Program) -> bool:
    """Whether MSCCL could pick either program for one call (same collective and ranks, a mode in common)."""
    return a.coll == b.coll and a.ngpus == b.ngpus and ((a.inplace and b.inplace) or (a.outofplace and b.outofplace))


def check_neighbours(payload: dict[str, Any], program: Program, xml_path: Path, source: str) -> None:
    """The plan's folder read as MSCCL_ALGO_DIR: no other collective plan there may claim a size this one claims
    for the same calls (MSCCL would run whichever it reads first), and the plans of this one's set must tile
    the set's sizes with no gap."""
    band = band_of(payload, source)
    dialect = payload.get("xml_dialect", "executor")
    claims = [(xml_path.name, claimed_range(program, dialect))]
    members = [(xml_path.name, (band.min_bytes, band.max_bytes))]
    for other_xml, other_payload in _collective_plans_beside(xml_path):
        other = load_program(other_xml)
        if not _same_calls(program, other):
            continue
        claims.append((other_xml.name, claimed_range(other, other_payload.get("xml_dialect", "executor"))))
        other_band = other_payload.get("size_band") or {}
        if (other_band.get("set_min_bytes"), other_band.get("set_max_bytes")) == (band.set_min_bytes,
                                                                                  band.set_max_bytes):
            members.append((other_xml.name, (other_band["min_bytes"], other_band["max_bytes"])))
    mine = claims[0][1]
    problems = [p for other in claims[1:] for p in overlap_problems([claims[0], other])]
    problems += gap_problems(members, (band.set_min_bytes, band.set_max_bytes))
    if problems:
        more = f" ({len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(source, "$.payload.size_band", f"{xml_path.name} claims {mine[0]}..{mine[1]} bytes: "
                                                        f"{problems[0]}{more}")


def _collective_plans_beside(xml_path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The other XMLs of the folder that have a collective plan sidecar, with its payload."""
    found = []
    for other in sorted(xml_path.parent.glob("*.xml")):
        sidecar = sidecar_path(other)
        if other == xml_path or not sidecar.is_file():
            continue
        try:
            doc = read_document(sidecar)
        except (InputError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == "collective" and isinstance(doc.get("payload"), dict):
            found.append((other, doc["payload"]))
    return found

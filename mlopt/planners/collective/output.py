"""Writing a collective plan: the MSCCL-EF XML and its JSON sidecar (plan envelope), atomically."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mlopt.formats.io import canonical_json, sha256_bytes, write_files
from mlopt.formats.msccl_xml import parse_program, write_program
from mlopt.formats.plan import sidecar_path
from mlopt.planners.collective.planner import CollectiveOptions, CollectivePlan
from mlopt.planners.collective.size_bands import SizeBand, exact_band, xml_range
from mlopt.planners.options import PlannerOptions


def collective_plan_files(result: CollectivePlan, xml_path: Path, copts: CollectiveOptions, options: PlannerOptions,
                          band: SizeBand | None = None) -> dict[Path, str]:
    """The XML's text and its sidecar's, by path (the sidecar last); the XML text is re-read and compared.

    The XML claims the band's sizes (minBytes/maxBytes, mlopt.planners.collective.size_bands); without a band,
    only the planned size: MSCCL runs the first file that claims a size, so a file must not claim sizes it
    was not chosen for."""
    band = band or exact_band(copts.size_bytes)
    min_bytes, max_bytes = xml_range(band, copts.xml_dialect)
    program = replace(result.program, min_bytes=min_bytes, max_bytes=max_bytes)
    text = write_program(program, copts.xml_dialect)
    if parse_program(text, str(xml_path), copts.xml_dialect) != program:
        raise AssertionError("the XML writer and reader disagree on this program")  # a bug, never user input
    payload = {**result.plan.payload, "size_band": band.to_dict(), "xml": xml_path.name,
               "xml_sha256": sha256_bytes(text.encode("utf-8"))}
    plan = result.plan.__class__(**{**result.plan.__dict__, "payload": payload})
    return {xml_path: text, sidecar_path(xml_path): canonical_json(plan.to_dict(options.record_wall_time))}


def write_collective_plan(result: CollectivePlan, output: str, copts: CollectiveOptions,
                          options: PlannerOptions, band: SizeBand | None = None) -> tuple[Path, Path]:
    """The XML and the sidecar that names it by hash, both or neither."""
    files = collective_plan_files(result, Path(output), copts, options, band)
    write_files(files)
    xml_path, sidecar = files
    return xml_path, sidecar

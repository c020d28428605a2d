"""Writing a collective plan: the MSCCL-EF XML and its JSON sidecar (plan envelope), atomically."""

from __future__ import annotations

from pathlib import Path

from mlopt.formats.io import canonical_json, sha256_bytes, write_files
from mlopt.formats.msccl_xml import parse_program, write_program
from mlopt.formats.plan import sidecar_path
from mlopt.planners.collective.planner import CollectiveOptions, CollectivePlan
from mlopt.planners.options import PlannerOptions


def write_collective_plan(result: CollectivePlan, output: str, copts: CollectiveOptions,
                          options: PlannerOptions) -> tuple[Path, Path]:
    """The XML and the sidecar that names it by hash, both or neither; the text written is re-read and compared."""
    xml_path = Path(output)
    text = write_program(result.program, copts.xml_dialect)
    if parse_program(text, str(xml_path), copts.xml_dialect) != result.program:
        raise AssertionError("the XML writer and reader disagree on this program")  # a bug, never user input
    payload = {**result.plan.payload, "xml": xml_path.name, "xml_sha256": sha256_bytes(text.encode("utf-8"))}
    plan = result.plan.__class__(**{**result.plan.__dict__, "payload": payload})
    sidecar = sidecar_path(xml_path)
    write_files({xml_path: text, sidecar: canonical_json(plan.to_dict(options.record_wall_time))})  # both or neither
    return xml_path, sidecar

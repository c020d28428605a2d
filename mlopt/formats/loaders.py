"""Resolving user-given names and paths to typed inputs, whatever format they are in."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats import document
from mlopt.formats.importers import taccl
from mlopt.formats.importers.pytorch_et import import_pytorch_et
from mlopt.formats.io import parse_document, read_bytes, read_document
from mlopt.formats.msccl_xml import parse_program
from mlopt.formats.plan import PlanFile, envelope_from_dict, plan_from_dict
from mlopt.formats.topology import Topology, from_spec, replicate, unreachable_ranks
from mlopt.formats.trace import ModelTrace


@dataclass(frozen=True)
class TopologyOptions:
    nodes: int | None = None  # replicate a one-node profile (TACCL files) over this many nodes
    chunk_bytes: float | None = None  # TACCL profile chunk size when its name does not carry it
    time_unit_us: float = 1.0  # TACCL profile: microseconds per unit of its (scaled) costs


def resolve_topology(spec: str, options: TopologyOptions = TopologyOptions()) -> Topology:
    """A preset/generator name, an mlopt topology file, or a TACCL node profile."""
    if os.path.exists(spec):
        doc = read_document(spec)
        if taccl.looks_like_taccl_topology(doc):
            return taccl.import_taccl_topology(doc, spec, options.nodes or 1, options.chunk_bytes, options.time_unit_us)
        topo = Topology.from_dict(doc, spec)
        check_connected(topo, spec)
    else:
        if "/" in spec or spec.endswith((".json", ".yaml", ".yml", ".gz")):
            raise InputError(spec, "$", "no such file")
        topo = from_spec(spec)
    return replicate(topo, options.nodes) if options.nodes else topo


def check_connected(topology: Topology, source: str) -> None:
    """Every rank reaches every other over the directed links (forwarding through ranks allowed): a topology
    file with a rank cut off, even in one direction, has no collective over its ranks, and the simulator and
    the planners would each fail on it in their own words. InputError naming `$.links`; the collective
    planner checks presets and generated topologies with the same `unreachable_ranks`."""
    unreachable = unreachable_ranks(topology)
    if unreachable:
        more = " ..." if len(unreachable) > 8 else ""
        raise InputError(source, "$.links", f"the topology is disconnected: rank 0 cannot reach rank(s) "
                                            f"{', '.join(map(str, unreachable[:8]))}{more} (or they cannot reach "
                                            f"it), so no collective over all ranks exists")


def load_trace_any(path: str) -> ModelTrace:
    """An mlopt trace, or a PyTorch Execution Trace imported on the fly."""
    doc = read_document(path)
    if document.format_of(doc) == document.TRACE.name:
        return ModelTrace.from_dict(doc, path)
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc:
        return import_pytorch_et(path)
    raise InputError(path, "$.format", f"expected {document.TRACE.name!r} or a PyTorch Execution Trace")


@dataclass(frozen=True)
class Loaded:
    """Any file mlopt understands, after detection."""

    kind: str  # "topology", "trace", "plan", "plan-index", "taccl-sketch", "msccl"
    value: Any
    source: str


def load_any(spec: str, topology_options: TopologyOptions = TopologyOptions(), *, payload: bool = True) -> Loaded:
    """Detect what a file (or preset name) is and load it with full validation (of a plan, only its envelope
    with payload=False)."""
    if not os.path.exists(spec):
        return Loaded("topology", resolve_topology(spec, topology_options), spec)
    raw = read_bytes(spec)
    if Path(spec).suffix.lower() == ".xml" or raw.lstrip()[:1] == b"<":
        return Loaded("msccl", parse_program(raw, spec), spec)
    doc = parse_document(raw, spec)
    fmt = document.format_of(doc)
    if fmt == document.TOPOLOGY.name or taccl.looks_like_taccl_topology(doc):
        return Loaded("topology", resolve_topology(spec, topology_options), spec)
    if taccl.looks_like_taccl_sketch(doc):
        return Loaded("taccl-sketch", taccl.import_taccl_sketch(doc, spec), spec)
    if fmt == document.TRACE.name or (isinstance(doc, dict) and "nodes" in doc and "schema" in doc):
        return Loaded("trace", load_trace_any(spec), spec)
    if fmt == document.PLAN.name:
        plan: PlanFile = plan_from_dict(doc, spec) if payload else envelope_from_dict(doc, spec)
        return Loaded("plan", plan, spec)
    if fmt == document.PLAN_INDEX.name:
        document.check_document(doc, document.PLAN_INDEX, spec)
        check_index_entries(doc, spec)
        return Loaded("plan-index", doc, spec)
    known = ", ".join(f.name for f in document.ALL_FORMATS)
    found = f"format {fmt!r}" if fmt else "a document without a `format` field"
    raise InputError(spec, "$.format", f"unrecognised file: found {found}; expected one of {known}, "
                     "a TACCL topology or sketch, or a PyTorch Execution Trace")


def check_index_entries(index: dict[str, Any], source: str) -> None:
    """Every plan a plan index lists is a plan file of the listed kind inside the index's folder (not the index
    itself, not a path leading out of the folder); InputError naming `$.plans[i].file` otherwise."""
    folder = Path(source).parent
    for i, entry in enumerate(index["plans"]):
        where = f"$.plans[{i}].file"
        name = entry["file"]
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts or relative.name == "":
            raise InputError(source, where, f"{name!r} is not a file name inside the index's folder")
        path = folder / relative
        if path.resolve() == Path(source).resolve():
            raise InputError(source, where, f"{name!r} is the index itself")
        if not path.is_file():
            what = "a directory" if path.is_dir() else "missing"
            raise InputError(source, where, f"{name!r} is {what}: expected the plan file beside the index")
        plan = _listed_plan(path, source, where)
        if plan.kind != entry["kind"]:
            raise InputError(source, f"$.plans[{i}].kind",
                             f"says {entry['kind']!r}, but {name} is a {plan.kind} plan")


def _listed_plan(path: Path, source: str, where: str) -> PlanFile:
    """The listed file's envelope (format, kind, provenance); its payload is checked when the plan itself is
    used, so that a consumer can report one bad plan of an index and apply the others."""
    doc = read_document(path)
    if document.format_of(doc) != document.PLAN.name:
        raise InputError(source, where, f"{path.name} is not a plan (format {document.format_of(doc)!r})")
    return envelope_from_dict(doc, str(path))

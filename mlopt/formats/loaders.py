"""Resolving user-given names and paths to typed inputs, whatever format they are in."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats import document
from mlopt.formats.importers import taccl
from mlopt.formats.io import parse_document, read_bytes, read_document
from mlopt.formats.plan import PlanFile, plan_from_dict
from mlopt.formats.topology import Topology, from_spec, replicate
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
    else:
        if "/" in spec or spec.endswith((".json", ".yaml", ".yml", ".gz")):
            raise InputError(spec, "$", "no such file")
        topo = from_spec(spec)
    return replicate(topo, options.nodes) if options.nodes else topo


def load_trace_any(path: str) -> ModelTrace:
    """An mlopt trace, or a PyTorch Execution Trace imported on the fly."""
    doc = read_document(path)
    if document.format_of(doc) == document.TRACE.name:
        return ModelTrace.from_dict(doc, path)
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc:
        from mlopt.formats.importers.pytorch_et import import_pytorch_et

        return import_pytorch_et(path)
    raise InputError(path, "$.format", f"expected {document.TRACE.name!r} or a PyTorch Execution Trace")


@dataclass(frozen=True)
class Loaded:
    """Any file mlopt understands, after detection."""

    kind: str  # "topology", "trace", "plan", "plan-index", "taccl-sketch", "msccl"
    value: Any
    source: str


def load_any(spec: str, topology_options: TopologyOptions = TopologyOptions()) -> Loaded:
    """Detect what a file (or preset name) is and load it with full validation."""
    if not os.path.exists(spec):
        return Loaded("topology", resolve_topology(spec, topology_options), spec)
    raw = read_bytes(spec)
    if Path(spec).suffix.lower() == ".xml" or raw.lstrip()[:1] == b"<":
        from mlopt.formats.msccl_xml import parse_program

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
        plan: PlanFile = plan_from_dict(doc, spec)
        return Loaded("plan", plan, spec)
    if fmt == document.PLAN_INDEX.name:
        document.check_document(doc, document.PLAN_INDEX, spec)
        return Loaded("plan-index", doc, spec)
    known = ", ".join(f.name for f in document.ALL_FORMATS)
    found = f"format {fmt!r}" if fmt else "a document without a `format` field"
    raise InputError(spec, "$.format", f"unrecognised file: found {found}; expected one of {known}, "
                     "a TACCL topology or sketch, or a PyTorch Execution Trace")

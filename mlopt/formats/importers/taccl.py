"""TACCL inputs: node topology profiles and communication sketches (microsoft/taccl, MIT).

TACCL's topology files describe one node. Their costs are per chunk and scaled so that ILP rounding keeps
information (TACCL's INPUT_GUIDE: "beta values are obtained by multiplying a beta (in us/MB) by the input
size (MB)", then all costs may be multiplied by a factor). So converting to our us and us/MB needs the
chunk size (read from the name suffix such as `NDv2_1MB`, `DGX2_1KB`, or given) and the time unit of the
file's numbers in us (`time_unit_us`: 1 for TACCL's 1 MB examples, 0.1 for 32 KB, 0.01 for 1 KB).

Base topologies, as TACCL's `known_topologies`: NDv2 (hybrid cube mesh; node_betas_list = [double NVLink,
single NVLink]), DGX2 (16 GPUs on NVSwitch, 8 NICs), HubAndSpoke (all pairs), and custom (`links` and
`betas` matrices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import check_finite
from mlopt.formats.topology import (
    HYBRID_CUBE_MESH_LANES,
    Link,
    Nic,
    Node,
    Switch,
    Topology,
    connect_nodes,
)

UNIT_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def looks_like_taccl_topology(doc: Any) -> bool:
    return isinstance(doc, dict) and "gpus_per_node" in doc and "format" not in doc


def looks_like_taccl_sketch(doc: Any) -> bool:
    return isinstance(doc, dict) and "nnodes" in doc and "format" not in doc


def chunk_bytes_from_name(name: str) -> float | None:
    """`NDv2_32KB` -> 32000.0; None when the name carries no size."""
    m = re.search(r"_(\d+(?:\.\d+)?)(B|KB|MB|GB)$", name)
    return float(m.group(1)) * UNIT_BYTES[m.group(2)] if m else None


def _number(doc: dict, key: str, source: str, minimum: float = 0.0) -> float:
    if key not in doc:
        raise InputError(source, f"$.{key}", "missing required field")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(source, f"$.{key}", f"expected a number, found {value!r}")
    if value < minimum:
        raise InputError(source, f"$.{key}", f"must be >= {minimum}, found {value}")
    return float(value)


def _number_list(doc: dict, key: str, source: str, length: int | None = None) -> list[float]:
    values = doc.get(key)
    if not isinstance(values, list) or not values:
        raise InputError(source, f"$.{key}", "expected a non-empty list of numbers")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise InputError(source, f"$.{key}[{i}]", f"expected a positive number, found {v!r}")
    if length is not None and len(values) != length:
        raise InputError(source, f"$.{key}", f"expected {length} values, found {len(values)}")
    return [float(v) for v in values]


def _lane_matrix(doc: dict, base: str, gpus: int, source: str) -> list[list[float]]:
    """Per-pair beta (file units per chunk); 0 where no link."""
    if base == "ndv2":
        if gpus != 8:
            raise InputError(source, "$.gpus_per_node", f"NDv2 has 8 GPUs, found {gpus}")
        double, single = _number_list(doc, "node_betas_list", source, 2)
        return [[{2: double, 1: single}.get(lanes, 0.0) for lanes in row] for row in HYBRID_CUBE_MESH_LANES]
    if base in ("dgx2", "hubandspoke"):
        (beta,) = _number_list(doc, "node_betas_list", source, 1)
        return [[0.0 if a == b else beta for b in range(gpus)] for a in range(gpus)]
    links, betas = doc.get("links"), doc.get("betas")
    if not (isinstance(links, list) and isinstance(betas, list)):
        raise InputError(source, "$.name", "unknown TACCL base topology: expected a name starting with "
                         "NDv2, DGX2 or HubAndSpoke, or `links` and `betas` matrices (custom)")
    for key, matrix in (("links", links), ("betas", betas)):
        if len(matrix) != gpus or any(not isinstance(row, list) or len(row) != gpus for row in matrix):
            raise InputError(source, f"$.{key}", f"expected a {gpus}x{gpus} matrix")
    return [[float(betas[a][b]) if links[a][b] else 0.0 for b in range(gpus)] for a in range(gpus)]


def _base_of(name: str) -> str:
    lowered = name.lower()
    for base in ("ndv2", "dgx2", "hubandspoke"):
        if lowered.startswith(base):
            return base
    return "custom"


def import_taccl_topology(
    doc: Any,
    source: str,
    num_nodes: int = 1,
    chunk_bytes: float | None = None,
    time_unit_us: float = 1.0,
) -> Topology:
    """Convert a TACCL node profile into a Topology of num_nodes identical nodes."""
    check_finite(doc, source)  # NaN or Infinity costs would become link alpha/beta
    if not looks_like_taccl_topology(doc):
        raise InputError(source, "$", "not a TACCL topology profile (no `gpus_per_node`)")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(source, "$.name", "missing or not a string")
    gpus = int(_number(doc, "gpus_per_node", source, 1))
    base = _base_of(name)
    if base == "dgx2":
        gpus = 16  # TACCL fixes these for DGX2, overriding the file
    chunk = chunk_bytes or chunk_bytes_from_name(name)
    if chunk is None:
        raise InputError(source, "$.name", "chunk size unknown: name it like NDv2_1MB or pass chunk_bytes")
    chunk_MB = chunk / 1e6
    alpha_us = _number(doc, "alpha", source) * time_unit_us
    betas = _lane_matrix(doc, base, gpus, source)
    nics_per_node = {"ndv2": 1, "dgx2": 8}.get(base, int(doc.get("nics_per_node", 1)))
    if nics_per_node < 1 or gpus % nics_per_node:
        raise InputError(source, "$.nics_per_node", f"{nics_per_node} NICs cannot be shared evenly by {gpus} GPUs")
    remote_alpha_us = _number(doc, "remote_alpha", source) * time_unit_us
    remote_beta = _number(doc, "remote_beta", source) * time_unit_us / chunk_MB
    if remote_beta <= 0:
        raise InputError(source, "$.remote_beta", "must be > 0")

    nodes, links, switches, nics = [], [], [], []
    per_nic = gpus // nics_per_node
    for i in range(num_nodes):
        off, node_name = i * gpus, f"node{i}"
        ranks = tuple(range(off, off + gpus))
        nodes.append(Node(node_name, ranks))
        switch_name = None
        if base == "dgx2":
            switch_name = f"{node_name}/nvswitch"
            switches.append(Switch(switch_name, "nvswitch", ranks, alpha_us, betas[0][1] * time_unit_us / chunk_MB))
        for a in range(gpus):
            for b in range(gpus):
                if betas[a][b] > 0:
                    lanes = HYBRID_CUBE_MESH_LANES[a][b] if base == "ndv2" else 1
                    link_class = "nvswitch" if base == "dgx2" else "nvlink"
                    links.append(Link(off + a, off + b, alpha_us, betas[a][b] * time_unit_us / chunk_MB,
                                      link_class, lanes, switch=switch_name))
        nics += [Nic(f"{node_name}/nic{k}", node_name, tuple(off + k * per_nic + j for j in range(per_nic)),
                     remote_alpha_us, remote_beta) for k in range(nics_per_node)]
    src = {"importer": "taccl", "taccl_name": name, "base": base, "chunk_bytes": chunk,
           "time_unit_us": time_unit_us, "nodes": num_nodes}
    full_name = name if num_nodes == 1 else f"{name}x{num_nodes}"
    return connect_nodes(full_name, nodes, links, switches, nics, src)


# ---------------------------------------------------------------------------------------------------------
# Communication sketches (read here so every planner and `mlopt show` share one parser)

HYPEREDGE_STRATEGIES = ("uc-max", "uc-min")


@dataclass(frozen=True)
class Sketch:
    """A TACCL communication sketch, fields as in TACCL's JSON (chapter 5.4.1 of the thesis)."""

    nnodes: int
    intranode_strategy: str  # "none", "switch", ...
    switches: tuple[tuple[int, ...], ...]  # local ranks of each switch hyperedge
    switch_hyperedge_strategy: tuple[str, ...]  # uc-max | uc-min, one per switch
    internode_strategy: str  # "relay", ...
    internode_conn: Any  # dict sender -> receivers, or "fully-connected" / "direct-map"
    gpus_to_sender_rev_map: dict[int, tuple[int, ...]]
    chunk_to_relay_map: tuple[int, ...]
    beta_split: dict[str, Any]
    enforce_ordering: bool
    symmetry_offsets: tuple[tuple[int, int], ...]  # (offset, group size)
    input_chunkup: int
    input_size: str | None
    raw: dict[str, Any]  # the document as given, for provenance and round trips


def _int_key_map(value: Any, source: str, field: str) -> dict[int, tuple[int, ...]]:
    if not isinstance(value, dict):
        raise InputError(source, field, "expected an object of rank -> list of ranks")
    out = {}
    for k, v in value.items():
        if not str(k).isdigit():
            raise InputError(source, f"{field}.{k}", "keys must be local GPU ranks")
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise InputError(source, f"{field}.{k}", "expected a list of ranks")
        out[int(k)] = tuple(v)
    return out


def import_taccl_sketch(doc: Any, source: str) -> Sketch:
    if not looks_like_taccl_sketch(doc):
        raise InputError(source, "$", "not a TACCL sketch (no `nnodes`)")
    check_finite(doc, source)
    nnodes = doc["nnodes"]
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 1:
        raise InputError(source, "$.nnodes", f"expected a positive integer, found {nnodes!r}")
    intra = doc.get("intranode_sketch", {"strategy": "none"})
    inter = doc.get("internode_sketch", {"strategy": "none"})
    for key, part in (("intranode_sketch", intra), ("internode_sketch", inter)):
        if not isinstance(part, dict) or not isinstance(part.get("strategy"), str):
            raise InputError(source, f"$.{key}.strategy", "missing or not a string")
    switches = intra.get("switches", [])
    if not isinstance(switches, list) or not all(isinstance(s, list) for s in switches):
        raise InputError(source, "$.intranode_sketch.switches", "expected a list of rank lists")
    strategies = intra.get("switch_hyperedge_strategy", ["uc-max"] * len(switches))
    if not isinstance(strategies, list) or len(strategies) != len(switches):
        raise InputError(source, "$.intranode_sketch.switch_hyperedge_strategy", "expected one strategy per switch")
    for i, s in enumerate(strategies):
        if s not in HYPEREDGE_STRATEGIES:
            raise InputError(source, f"$.intranode_sketch.switch_hyperedge_strategy[{i}]",
                             f"{s!r} is not one of: {', '.join(HYPEREDGE_STRATEGIES)}")
    conn = inter.get("internode_conn", "fully-connected")
    if isinstance(conn, dict):
        conn = _int_key_map(conn, source, "$.internode_sketch.internode_conn")
    elif conn not in ("fully-connected", "direct-map"):
        raise InputError(source, "$.internode_sketch.internode_conn", f"unknown connection {conn!r}")
    offsets = doc.get("symmetry_offsets", [])
    if not isinstance(offsets, list) or not all(
        isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) and x > 0 for x in o) for o in offsets
    ):
        raise InputError(source, "$.symmetry_offsets", "expected a list of [offset, group_size] pairs")
    hyper = doc.get("hyperparameters", {})
    chunkup = hyper.get("input_chunkup", 1)
    if not isinstance(chunkup, int) or isinstance(chunkup, bool) or chunkup < 1:
        raise InputError(source, "$.hyperparameters.input_chunkup", f"expected a positive integer, found {chunkup!r}")
    relay_map = inter.get("chunk_to_relay_map", [])
    return Sketch(
        nnodes=nnodes,
        intranode_strategy=intra["strategy"],
        switches=tuple(tuple(s) for s in switches),
        switch_hyperedge_strategy=tuple(strategies),
        internode_strategy=inter["strategy"],
        internode_conn=conn,
        gpus_to_sender_rev_map=_int_key_map(inter.get("gpus_to_sender_rev_map", {}), source,
                                            "$.internode_sketch.gpus_to_sender_rev_map"),
        chunk_to_relay_map=tuple(relay_map) if isinstance(relay_map, list) else (),
        beta_split=inter.get("beta_split", {}) if isinstance(inter.get("beta_split", {}), dict) else {},
        enforce_ordering=bool(inter.get("enforce_ordering", False)),
        symmetry_offsets=tuple((o[0], o[1]) for o in offsets),
        input_chunkup=chunkup,
        input_size=hyper.get("input_size"),
        raw=doc,
    )

"""Topologies: ranks (GPUs) grouped into nodes, alpha-beta links, shared switches and NICs.

Cost model (TACCL's): sending s MB over a link takes `alpha_us + beta_us_per_MB * s`. MB is 10^6 bytes,
so `beta_us_per_MB = 1000 / bandwidth_GBps`. A link's beta is that of the whole link (all its lanes):
an NDv2 double NVLink has lanes=2 and beta 23 us/MB, two lanes of 46 us/MB each.

Shared resources: links through a switch (`switch`) share the sending rank's and the receiving rank's
switch ports (each port sends at 1000 / port_beta_us_per_MB GB/s in each direction); links between nodes
go through NICs (`src_nic`, `dst_nic`), each shared by the ranks listed on the NIC.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from mlopt.errors import InputError
from mlopt.formats import document
from mlopt.formats.io import write_json

SWITCH_KINDS = ("nvswitch", "ib", "ethernet", "pcie", "generic")


def beta_from_GBps(bandwidth_GBps: float) -> float:
    """us per MB (10^6 bytes) at a bandwidth in GB/s (10^9 bytes/s)."""
    return 1000.0 / bandwidth_GBps


@dataclass(frozen=True)
class Node:
    name: str
    ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ranks": list(self.ranks)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Node":
        return Node(d["name"], tuple(d["ranks"]))


@dataclass(frozen=True)
class Link:
    src: int
    dst: int
    alpha_us: float  # fixed latency per send
    beta_us_per_MB: float  # time per MB for the whole link (all lanes)
    link_class: str  # "nvlink", "nvswitch", "ib", "pcie", ...
    lanes: int = 1  # parallel physical lanes bundled in this link
    switch: str | None = None  # switch this link crosses (its ports are shared)
    src_nic: str | None = None  # NIC the sender's traffic leaves through
    dst_nic: str | None = None  # NIC the receiver's traffic enters through

    @property
    def bandwidth_GBps(self) -> float:
        return 1000.0 / self.beta_us_per_MB

    def time_us(self, nbytes: float) -> float:
        """alpha-beta time to send nbytes over this link alone."""
        return self.alpha_us + self.beta_us_per_MB * nbytes / 1e6

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "src": self.src, "dst": self.dst, "alpha_us": self.alpha_us,
            "beta_us_per_MB": self.beta_us_per_MB, "link_class": self.link_class, "lanes": self.lanes,
        }
        for key in ("switch", "src_nic", "dst_nic"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Link":
        return Link(
            d["src"], d["dst"], float(d["alpha_us"]), float(d["beta_us_per_MB"]), d["link_class"],
            d.get("lanes", 1), d.get("switch"), d.get("src_nic"), d.get("dst_nic"),
        )


@dataclass(frozen=True)
class Switch:
    name: str
    kind: str  # one of SWITCH_KINDS
    ranks: tuple[int, ...]  # ranks with a port on this switch
    alpha_us: float
    port_beta_us_per_MB: float  # per port and direction

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "ranks": list(self.ranks),
            "alpha_us": self.alpha_us, "port_beta_us_per_MB": self.port_beta_us_per_MB,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Switch":
        return Switch(d["name"], d["kind"], tuple(d["ranks"]), float(d["alpha_us"]), float(d["port_beta_us_per_MB"]))


@dataclass(frozen=True)
class Nic:
    name: str
    node: str  # node name
    ranks: tuple[int, ...]  # ranks whose inter-node traffic shares this NIC
    alpha_us: float
    beta_us_per_MB: float  # per direction

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "node": self.node, "ranks": list(self.ranks),
            "alpha_us": self.alpha_us, "beta_us_per_MB": self.beta_us_per_MB,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Nic":
        return Nic(d["name"], d["node"], tuple(d["ranks"]), float(d["alpha_us"]), float(d["beta_us_per_MB"]))


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    switches: tuple[Switch, ...] = ()
    nics: tuple[Nic, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)  # preset/generator/importer that made it
    # Fixed cost of one collective call, paid once per program run on top of its messages (starting the run on
    # every rank: the runtime's threads, its handshake). A profile measures it as the fit's overhead term
    # (linkfit's "taccl+overhead" model); presets leave it 0, as TACCL's alpha-beta model has none.
    call_overhead_us: float = 0.0
    # Rate at which a rank adds a received chunk into its buffer (rrc, rrs, rrcs), GB/s; None: free, as TACCL
    # models GPUs that reduce while the data streams in. A runtime profile measures it (CPU ranks reduce after
    # the data arrived, in the receiving thread).
    reduce_GBps: float | None = None

    @property
    def num_ranks(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def node_of(self) -> dict[int, int]:
        """rank -> node index."""
        return {r: i for i, n in enumerate(self.nodes) for r in n.ranks}

    def link_map(self) -> dict[tuple[int, int], Link]:
        return {(l.src, l.dst): l for l in self.links}

    def to_dict(self) -> dict[str, Any]:
        return {
            **document.header(document.TOPOLOGY),
            "name": self.name,
            "source": self.source,
            "nodes": [n.to_dict() for n in self.nodes],
            "links": [l.to_dict() for l in self.links],
            "switches": [s.to_dict() for s in self.switches],
            "nics": [n.to_dict() for n in self.nics],
            **({"call_overhead_us": self.call_overhead_us} if self.call_overhead_us else {}),
            **({"reduce_GBps": self.reduce_GBps} if self.reduce_GBps is not None else {}),
        }

    @staticmethod
    def from_dict(d: dict[str, Any], source: str = "<topology>") -> "Topology":
        document.check_document(d, document.TOPOLOGY, source)
        topo = Topology(
            name=d["name"],
            nodes=tuple(Node.from_dict(n) for n in d["nodes"]),
            links=tuple(Link.from_dict(l) for l in d["links"]),
            switches=tuple(Switch.from_dict(s) for s in d.get("switches", ())),
            nics=tuple(Nic.from_dict(n) for n in d.get("nics", ())),
            source=d.get("source", {}),
            call_overhead_us=float(d.get("call_overhead_us", 0.0)),
            reduce_GBps=float(d["reduce_GBps"]) if d.get("reduce_GBps") is not None else None,
        )
        validate_topology(topo, source)
        return topo


def validate_topology(topo: Topology, source: str = "<topology>") -> None:
    """References and ranges the schema cannot check."""
    if not (math.isfinite(topo.call_overhead_us) and topo.call_overhead_us >= 0):
        raise InputError(source, "$.call_overhead_us", f"must be a finite number >= 0, got {topo.call_overhead_us}")
    if topo.reduce_GBps is not None and not (math.isfinite(topo.reduce_GBps) and topo.reduce_GBps > 0):
        raise InputError(source, "$.reduce_GBps", f"must be a finite number > 0, got {topo.reduce_GBps}")
    seen: dict[int, str] = {}
    for i, node in enumerate(topo.nodes):
        for j, r in enumerate(node.ranks):
            if r in seen:
                raise InputError(source, f"$.nodes[{i}].ranks[{j}]", f"rank {r} is already in node {seen[r]!r}")
            seen[r] = node.name
    n = len(seen)
    if sorted(seen) != list(range(n)):
        missing = sorted(set(range(n)) - set(seen))
        raise InputError(source, "$.nodes", f"ranks must be 0..{n - 1}; missing {missing[:5]}")
    node_names = {node.name for node in topo.nodes}
    switches = {s.name: s for s in topo.switches}
    nics = {x.name: x for x in topo.nics}
    for i, sw in enumerate(topo.switches):
        bad = [r for r in sw.ranks if r not in seen]
        if bad:
            raise InputError(source, f"$.switches[{i}].ranks", f"unknown rank {bad[0]}")
    for i, nic in enumerate(topo.nics):
        if nic.node not in node_names:
            raise InputError(source, f"$.nics[{i}].node", f"unknown node {nic.node!r}")
        bad = [r for r in nic.ranks if r not in seen]
        if bad:
            raise InputError(source, f"$.nics[{i}].ranks", f"unknown rank {bad[0]}")
    pairs: set[tuple[int, int]] = set()
    for i, link in enumerate(topo.links):
        where = f"$.links[{i}]"
        for key in ("src", "dst"):
            if getattr(link, key) not in seen:
                raise InputError(source, f"{where}.{key}", f"unknown rank {getattr(link, key)}")
        if link.src == link.dst:
            raise InputError(source, f"{where}.dst", f"link from rank {link.src} to itself")
        if (link.src, link.dst) in pairs:
            raise InputError(source, where, f"second link {link.src}->{link.dst}; merge them with lanes")
        pairs.add((link.src, link.dst))
        if link.beta_us_per_MB <= 0:
            raise InputError(source, f"{where}.beta_us_per_MB", "must be > 0")
        if link.switch is not None:
            sw = switches.get(link.switch)
            if sw is None:
                raise InputError(source, f"{where}.switch", f"unknown switch {link.switch!r}")
            if link.src not in sw.ranks or link.dst not in sw.ranks:
                raise InputError(source, f"{where}.switch", f"ranks {link.src}->{link.dst} are not both on {sw.name!r}")
        for key, rank in (("src_nic", link.src), ("dst_nic", link.dst)):
            name = getattr(link, key)
            if name is None:
                continue
            if name not in nics:
                raise InputError(source, f"{where}.{key}", f"unknown NIC {name!r}")
            if rank not in nics[name].ranks:
                raise InputError(source, f"{where}.{key}", f"rank {rank} does not use NIC {name!r}")


def unreachable_ranks(topo: Topology) -> list[int]:
    """Ranks not strongly connected with rank 0 over the topology's directed links (no collective over all ranks
    exists when there is one)."""
    forward: dict[int, set[int]] = {}
    backward: dict[int, set[int]] = {}
    for link in topo.links:
        forward.setdefault(link.src, set()).add(link.dst)
        backward.setdefault(link.dst, set()).add(link.src)
    both = _reachable(forward, 0) & _reachable(backward, 0)
    return [r for r in range(topo.num_ranks) if r not in both]


def _reachable(edges: dict[int, set[int]], start: int) -> set[int]:
    seen, stack = {start}, [start]
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def save_topology(topo: Topology, path: str | os.PathLike) -> None:
    write_json(path, topo.to_dict())


# ---------------------------------------------------------------------------------------------------------
# Presets and generators

NVLINK_ALPHA_US = 0.7  # TACCL's profiled NVLink alpha (NDv2 and DGX-2)
NDV2_LANE_BETA_US_PER_MB = 46.0  # TACCL: one V100 NVLink lane on NDv2
DGX2_NVSWITCH_BETA_US_PER_MB = 8.0  # TACCL: V100 to NVSwitch on DGX-2
IB_ALPHA_US = 1.7  # TACCL: InfiniBand alpha
IB_BETA_US_PER_MB = 106.0  # TACCL: InfiniBand beta (about 9.4 GB/s per NIC)

# Lanes of NVLink between the 8 V100s of a DGX-1 / NDv2 (hybrid cube mesh). Same connectivity and
# double/single assignment as TACCL's NDv2 node matrix; every GPU has 6 lanes (2 double + 2 single).
HYBRID_CUBE_MESH_LANES = (
    (0, 2, 1, 1, 2, 0, 0, 0),
    (2, 0, 1, 2, 0, 1, 0, 0),
    (1, 1, 0, 2, 0, 0, 2, 0),
    (1, 2, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 2, 1, 1),
    (0, 1, 0, 0, 2, 0, 1, 2),
    (0, 0, 2, 0, 1, 1, 0, 2),
    (0, 0, 0, 1, 1, 2, 2, 0),
)


@dataclass(frozen=True)
class NodeSpec:
    """One node of a preset: how its GPUs connect and how its NICs are shared."""

    name: str
    gpus: int
    nic_groups: tuple[tuple[int, ...], ...]  # local ranks sharing each NIC
    nic_alpha_us: float
    nic_beta_us_per_MB: float
    nvlink_alpha_us: float
    lane_beta_us_per_MB: float | None = None  # hybrid cube mesh: per-lane beta
    switch_beta_us_per_MB: float | None = None  # NVSwitch nodes: per-port beta
    description: str = ""


NODE_PRESETS: dict[str, NodeSpec] = {
    "ndv2": NodeSpec(
        "ndv2", 8, (tuple(range(8)),), IB_ALPHA_US, IB_BETA_US_PER_MB, NVLINK_ALPHA_US,
        lane_beta_us_per_MB=NDV2_LANE_BETA_US_PER_MB,
        description="Azure NDv2: 8x V100, hybrid cube mesh NVLink (double and single), 1 IB NIC, no PCIe P2P; TACCL's profiled costs",
    ),
    "dgx2": NodeSpec(
        "dgx2", 16, tuple((2 * k, 2 * k + 1) for k in range(8)), IB_ALPHA_US, IB_BETA_US_PER_MB, NVLINK_ALPHA_US,
        switch_beta_us_per_MB=DGX2_NVSWITCH_BETA_US_PER_MB,
        description="NVIDIA DGX-2: 16x V100 on NVSwitch, 8 IB NICs each shared by a GPU pair; TACCL's profiled costs",
    ),
    "dgx-a100": NodeSpec(
        "dgx-a100", 8, tuple((k,) for k in range(8)), IB_ALPHA_US, beta_from_GBps(25.0), NVLINK_ALPHA_US,
        switch_beta_us_per_MB=beta_from_GBps(300.0),
        description="NVIDIA DGX A100: 8x A100 on NVSwitch (300 GB/s per direction), 8x HDR 200 Gb/s NICs; nominal datasheet costs",
    ),
    "dgx-h100": NodeSpec(
        "dgx-h100", 8, tuple((k,) for k in range(8)), IB_ALPHA_US, beta_from_GBps(50.0), NVLINK_ALPHA_US,
        switch_beta_us_per_MB=beta_from_GBps(450.0),
        description="NVIDIA DGX H100: 8x H100 on NVSwitch (450 GB/s per direction), 8x NDR 400 Gb/s NICs; nominal datasheet costs",
    ),
}
PRESET_ALIASES = {"dgx1": "ndv2"}
GENERATORS = ("ring", "fully-connected", "switch", "torus")
GENERATOR_ALPHA_US = NVLINK_ALPHA_US  # generated fabrics use one V100 NVLink lane per link
GENERATOR_BETA_US_PER_MB = NDV2_LANE_BETA_US_PER_MB


def _node_topology(spec: NodeSpec, index: int, offset: int) -> tuple[Node, list[Link], list[Switch], list[Nic]]:
    node_name = f"node{index}"
    ranks = tuple(range(offset, offset + spec.gpus))
    links: list[Link] = []
    switches: list[Switch] = []
    if spec.lane_beta_us_per_MB is not None:
        for a in range(spec.gpus):
            for b in range(spec.gpus):
                lanes = HYBRID_CUBE_MESH_LANES[a][b]
                if lanes:
                    links.append(Link(offset + a, offset + b, spec.nvlink_alpha_us,
                                      spec.lane_beta_us_per_MB / lanes, "nvlink", lanes))
    else:
        sw = Switch(f"{node_name}/nvswitch", "nvswitch", ranks, spec.nvlink_alpha_us, spec.switch_beta_us_per_MB)
        switches.append(sw)
        links.extend(
            Link(a, b, sw.alpha_us, sw.port_beta_us_per_MB, "nvswitch", 1, switch=sw.name)
            for a in ranks for b in ranks if a != b
        )
    nics = [
        Nic(f"{node_name}/nic{k}", node_name, tuple(offset + r for r in group), spec.nic_alpha_us, spec.nic_beta_us_per_MB)
        for k, group in enumerate(spec.nic_groups)
    ]
    return Node(node_name, ranks), links, switches, nics


def connect_nodes(name: str, nodes: list[Node], links: list[Link], switches: list[Switch], nics: list[Nic],
                  source: dict[str, Any]) -> Topology:
    """Join nodes through their NICs and one non-blocking IB fabric: a link for every cross-node rank pair."""
    if len(nodes) > 1:
        nic_of = {r: nic for nic in nics for r in nic.ranks}
        all_ranks = tuple(r for n in nodes for r in n.ranks)
        missing = [r for r in all_ranks if r not in nic_of]
        if missing:
            raise InputError(name, "$.nics", f"rank {missing[0]} has no NIC, so nodes cannot be connected")
        fabric = Switch("ib", "ib", all_ranks, min(n.alpha_us for n in nics), max(n.beta_us_per_MB for n in nics))
        switches = switches + [fabric]
        node_of = {r: i for i, n in enumerate(nodes) for r in n.ranks}
        for a in all_ranks:
            for b in all_ranks:
                if node_of[a] != node_of[b]:
                    na, nb = nic_of[a], nic_of[b]
                    links.append(Link(a, b, max(na.alpha_us, nb.alpha_us), max(na.beta_us_per_MB, nb.beta_us_per_MB),
                                      "ib", 1, switch=fabric.name, src_nic=na.name, dst_nic=nb.name))
    links.sort(key=lambda l: (l.src, l.dst))
    return Topology(name, tuple(nodes), tuple(links), tuple(switches), tuple(nics), source)


def preset(name: str, num_nodes: int = 1) -> Topology:
    """A named machine (`ndv2`, `dgx2`, `dgx-a100`, `dgx-h100`, alias `dgx1`) repeated over num_nodes nodes."""
    spec = NODE_PRESETS[PRESET_ALIASES.get(name, name)]
    nodes, links, switches, nics = [], [], [], []
    for i in range(num_nodes):
        node, l, s, n = _node_topology(spec, i, i * spec.gpus)
        nodes.append(node)
        links += l
        switches += s
        nics += n
    full_name = name if num_nodes == 1 else f"{name}x{num_nodes}"
    source = {"preset": PRESET_ALIASES.get(name, name), "nodes": num_nodes, "description": spec.description}
    return connect_nodes(full_name, nodes, links, switches, nics, source)


def _generated(name: str, n: int, pairs: list[tuple[int, int]], switch: bool = False,
               betas: dict[tuple[int, int], float] | None = None) -> Topology:
    """Links for `pairs` at the generator's alpha and beta (`betas`: per-pair beta instead, direct links only)."""
    ranks = tuple(range(n))
    switches: tuple[Switch, ...] = ()
    if switch:
        sw = Switch("switch", "generic", ranks, GENERATOR_ALPHA_US, GENERATOR_BETA_US_PER_MB)
        switches = (sw,)
        links = [Link(a, b, GENERATOR_ALPHA_US, GENERATOR_BETA_US_PER_MB, "switch", 1, switch=sw.name) for a, b in pairs]
    else:
        links = [Link(a, b, GENERATOR_ALPHA_US, GENERATOR_BETA_US_PER_MB if betas is None else betas[(a, b)],
                      "nvlink", 1) for a, b in pairs]
    links.sort(key=lambda l: (l.src, l.dst))
    source = {"generator": name.split(":")[0], "spec": name}
    return Topology(name, (Node("node0", ranks),), tuple(links), switches, (), source)


def ring(n: int) -> Topology:
    pairs = sorted({(i, (i + d) % n) for i in range(n) for d in (1, -1) if (i + d) % n != i})
    return _generated(f"ring:{n}", n, pairs)


def fully_connected(n: int) -> Topology:
    return _generated(f"fully-connected:{n}", n, [(a, b) for a in range(n) for b in range(n) if a != b])


def switched(n: int) -> Topology:
    return _generated(f"switch:{n}", n, [(a, b) for a in range(n) for b in range(n) if a != b], switch=True)


def torus(dims: tuple[int, ...], bandwidths_GBps: tuple[float, ...] | None = None) -> Topology:
    """Wrap-around neighbours in every dimension; rank = mixed-radix index with the first dim fastest.

    `bandwidths_GBps`: one link bandwidth per dimension (asymmetric hierarchical fabrics such as ASTRA-sim's
    fast intra-package dim 0 and slower inter-package dims; spec `torus:4x8@400,50`). None: every link at the
    generator's beta. Alpha is the generator's either way.
    """
    n = 1
    for d in dims:
        n *= d
    if bandwidths_GBps is not None and len(bandwidths_GBps) != len(dims):
        raise ValueError(f"torus {dims}: {len(bandwidths_GBps)} bandwidths for {len(dims)} dimensions")

    def coords(r: int) -> list[int]:
        out = []
        for d in dims:
            out.append(r % d)
            r //= d
        return out

    def rank(c: list[int]) -> int:
        r, scale = 0, 1
        for x, d in zip(c, dims):
            r += x * scale
            scale *= d
        return r

    pairs: dict[tuple[int, int], int] = {}  # (src, dst) -> dimension
    for r in range(n):
        c = coords(r)
        for axis, d in enumerate(dims):
            for step in (1, -1):
                nc = list(c)
                nc[axis] = (c[axis] + step) % d
                if rank(nc) != r:
                    pairs[(r, rank(nc))] = axis
    name = "torus:" + "x".join(map(str, dims))
    betas = None
    if bandwidths_GBps is not None:
        name += "@" + ",".join(_format_GBps(b) for b in bandwidths_GBps)
        betas = {pair: beta_from_GBps(bandwidths_GBps[axis]) for pair, axis in pairs.items()}
    return _generated(name, n, sorted(pairs), betas=betas)


def _format_GBps(value: float) -> str:
    """Shortest text that reads back as the same float (400.0 -> '400', 162.5 -> '162.5')."""
    text = format(value, "g")
    return text if float(text) == value else repr(value)


def known_names() -> list[str]:
    names = sorted(set(NODE_PRESETS) | set(PRESET_ALIASES))
    return names + ["NAMExN", "ring:N", "fully-connected:N", "switch:N", "torus:AxBxC"]


def _parse_positive(text: str, spec: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise InputError(spec, "topology", f"{what} must be a positive integer, found {text!r}")
    return int(text)


def _parse_GBps(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InputError(spec, "topology", f"link bandwidth must be a positive number of GB/s, found {text!r}")
    return value


def from_spec(spec: str) -> Topology:
    """Resolve a preset (`ndv2`, `dgx2x4`) or generator (`ring:8`, `torus:4x4x2`) name.

    A torus may give one link bandwidth in GB/s per dimension after `@`: `torus:4x8@400,50`.
    """
    if ":" in spec:
        kind, _, arg = spec.partition(":")
        if kind not in GENERATORS:
            raise InputError(spec, "topology", f"unknown generator {kind!r}; known: {', '.join(GENERATORS)}")
        if kind == "torus":
            dims_text, at, bw_text = arg.partition("@")
            dims = tuple(_parse_positive(x, spec, "torus dimension") for x in dims_text.split("x"))
            if len(dims) > 3:
                raise InputError(spec, "topology", "torus takes at most 3 dimensions (AxBxC)")
            if not at:
                return torus(dims)
            bandwidths = tuple(_parse_GBps(x, spec) for x in bw_text.split(","))
            if len(bandwidths) != len(dims):
                raise InputError(spec, "topology", f"torus with {len(dims)} dimensions takes {len(dims)} link "
                                 f"bandwidths (GB/s, one per dimension), found {len(bandwidths)}")
            return torus(dims, bandwidths)
        n = _parse_positive(arg, spec, "rank count")
        if n < 2:
            raise InputError(spec, "topology", "needs at least 2 ranks")
        return {"ring": ring, "fully-connected": fully_connected, "switch": switched}[kind](n)
    base, nodes = spec, 1
    head, sep, tail = spec.rpartition("x")
    if sep and tail.isdigit() and (head in NODE_PRESETS or head in PRESET_ALIASES):
        base, nodes = head, _parse_positive(tail, spec, "node count")
    if base not in NODE_PRESETS and base not in PRESET_ALIASES:
        raise InputError(spec, "topology", f"unknown topology preset; known: {', '.join(known_names())}")
    return preset(base, nodes)


def replicate(topo: Topology, num_nodes: int) -> Topology:
    """Copies of a single-node topology joined through their NICs (for one-node profiles such as TACCL's)."""
    if num_nodes == 1:
        return topo
    if topo.num_nodes != 1:
        raise InputError(topo.name, "$.nodes", "only a single-node topology can be replicated over nodes")
    n = topo.num_ranks
    nodes, links, switches, nics = [], [], [], []
    for i in range(num_nodes):
        off = i * n
        rename = lambda s, i=i: s.replace("node0", f"node{i}", 1) if s else s  # noqa: E731
        nodes.append(Node(f"node{i}", tuple(r + off for r in topo.nodes[0].ranks)))
        switches += [replace(s, name=rename(s.name), ranks=tuple(r + off for r in s.ranks)) for s in topo.switches]
        nics += [replace(x, name=rename(x.name), node=f"node{i}", ranks=tuple(r + off for r in x.ranks)) for x in topo.nics]
        links += [replace(l, src=l.src + off, dst=l.dst + off, switch=rename(l.switch)) for l in topo.links]
    return connect_nodes(f"{topo.name}x{num_nodes}", nodes, links, switches, nics, {**topo.source, "nodes": num_nodes})

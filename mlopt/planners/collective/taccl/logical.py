"""Communication sketch -> logical topology, chunk model, symmetry and candidate routes (TACCL §5.4.1).

The logical topology is the subset of the physical links the synthesizer may use, with TACCL's cost model
per link at the chunk size: lat(u, v) = alpha(u, v) + beta(u, v) * chunk_MB (the paper's lat, §5.5).

What a sketch decides (fields as in TACCL's JSON, `mlopt.formats.importers.taccl.Sketch`):

- intra-node links: every physical link between two GPUs of one node (TACCL's intranode sketch does not
  remove links; it annotates switches). `switches` (local ranks, one list per switch, applied to every node)
  become switch-hyperedges whose links carry the uc-max / uc-min gamma term of eq. 5.11.
- switch ports: links through one switch share the sender's and the receiver's port (eq. 5.7/5.8 relaxed,
  5.20/5.21 exact). The port groups are the sketch's switches; with `physical_switches` (default) also every
  intra-node switch of the physical topology, named in the sketch or not (TACCL models a switch only when
  the sketch names it; we keep the hardware's ports so the predicted time stays physical).
- inter-node links ("relay"): `internode_conn` maps a local sender GPU to local receiver GPUs in every other
  node ("fully-connected": every pair, "direct-map": i -> i). A chunk crosses nodes at most once, from its
  source node, and only through its senders: `gpus_to_sender_rev_map` (sender -> local GPUs whose chunks it
  relays) and/or `chunk_to_relay_map` [r1, r2] (sender = (g // r1) * r1 + r2 for a chunk of local GPU g).
- NIC sharing (`beta_split`, sender -> n: its inter-node links get 1/n of the bandwidth, beta * n). Without
  it, each inter-node link's beta is multiplied by the number of logical inter-node links that share its
  sending NIC (or its receiving NIC, whichever is more) towards / from that node pair - TACCL's
  total_outgoing_links / nics_per_node rule, per NIC.
- `symmetry_offsets` [(o, g)]: rank r maps to (r % g + o) % g + (r // g) * g; a chunk maps to the chunk with
  the mapped source, destinations and chunk index; links with both ends in one group of g map to their image.
  The rotation must be an automorphism of the logical topology (checked).

Without a sketch (`default_sketch`): all physical links; intra-node switches are hyperedges with uc-max for
chunks up to `uc_threshold_bytes` and uc-min above (TACCL's rule, §5.4.2); inter-node links by
`default_internode` ("direct-map": local i <-> local i in every other node, the cheapest in variables and
one that uses every NIC; "fully-connected": all pairs); NIC sharing by the default rule; and node rotation
symmetry [(gpus per node, ranks)] when it is an automorphism.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from mlopt.errors import InputError
from mlopt.formats.importers.taccl import Sketch
from mlopt.formats.topology import Topology
from mlopt.planners.collective.algorithm import Algorithm
from mlopt.sim.collectives import CollectiveSpec

# JSON paths of the sketch fields errors name
F_NNODES = "$.nnodes"
F_INTRA = "$.intranode_sketch.strategy"
F_SWITCHES = "$.intranode_sketch.switches"
F_INTER = "$.internode_sketch.strategy"
F_CONN = "$.internode_sketch.internode_conn"
F_REVMAP = "$.internode_sketch.gpus_to_sender_rev_map"
F_RELAYMAP = "$.internode_sketch.chunk_to_relay_map"
F_BETASPLIT = "$.internode_sketch.beta_split"
F_SYM = "$.symmetry_offsets"
F_CHUNKUP = "$.hyperparameters.input_chunkup"
F_SIZE = "$.hyperparameters.input_size"

LAT_RTOL = 1e-9  # two latencies this close count as equal (symmetry check)


@dataclass(frozen=True)
class LogicalLink:
    src: int
    dst: int
    alpha_us: float
    beta_us_per_MB: float  # after the NIC split
    lat_us: float  # alpha + beta * chunk_MB: one chunk alone on this link
    internode: bool
    port: str | None  # switch whose send/recv ports this link shares (None: a dedicated link)
    gamma_sign: int  # +1 uc-min, -1 uc-max, 0 no switch-hyperedge policy
    contiguous: bool  # stage 3 may merge consecutive chunks on this link into one send
    beta_split: float = 1.0  # factor applied to the physical beta

    def lat_of(self, chunks: float) -> float:
        """Time to send `chunks` chunks as one message."""
        return self.alpha_us + (self.lat_us - self.alpha_us) * chunks


@dataclass(frozen=True)
class Generator:
    """One symmetry rotation: ranks and chunks it maps."""

    offset: int
    group: int
    rank: tuple[int, ...]  # rank -> image
    chunk: tuple[int, ...]  # chunk -> image

    def same_group(self, u: int, v: int) -> bool:
        return u // self.group == v // self.group


@dataclass(frozen=True)
class LogicalTopology:
    num_ranks: int
    gpus_per_node: int
    node_of: tuple[int, ...]
    links: dict[tuple[int, int], LogicalLink]
    chunk_bytes: float
    senders: dict[int, frozenset[int]] | None  # source rank -> ranks its chunks may cross nodes from
    enforce_ordering: bool  # a sender sends its own chunks over inter-node links before relayed ones
    symmetry: tuple[tuple[int, int], ...]  # (offset, group)
    description: tuple[str, ...] = field(default=())

    def out_links(self) -> dict[int, list[LogicalLink]]:
        out: dict[int, list[LogicalLink]] = {r: [] for r in range(self.num_ranks)}
        for key in sorted(self.links):
            out[key[0]].append(self.links[key])
        return out

    @property
    def max_lat(self) -> float:
        return max(l.lat_us for l in self.links.values())

    @property
    def min_lat(self) -> float:
        return min(l.lat_us for l in self.links.values())

    def transposed(self) -> "LogicalTopology":
        """Links reversed (u, v) -> (v, u) with the same cost: the topology an inverted algorithm runs on."""
        links = {(v, u): LogicalLink(v, u, l.alpha_us, l.beta_us_per_MB, l.lat_us, l.internode, l.port,
                                      l.gamma_sign, l.contiguous, l.beta_split)
                 for (u, v), l in self.links.items()}
        return LogicalTopology(self.num_ranks, self.gpus_per_node, self.node_of, links, self.chunk_bytes,
                               None, False, self.symmetry, self.description + ("transposed",))


# ---------------------------------------------------------------------------------------------------------
# Chunks of the routed (copy) collective

BASE_KIND = {"allgather": "allgather", "alltoall": "alltoall", "broadcast": "broadcast",
             "reducescatter": "allgather", "allreduce": "allgather", "reduce": "broadcast"}


@dataclass(frozen=True)
class ChunkModel:
    """Pre- and postconditions of a copy collective: each chunk has one source."""

    spec: CollectiveSpec
    source: tuple[int, ...]
    post: tuple[frozenset[int], ...]

    @property
    def num_chunks(self) -> int:
        return len(self.source)

    @staticmethod
    def of(spec: CollectiveSpec) -> "ChunkModel":
        alg = Algorithm("pre-post", spec, ())
        sources, posts = [], []
        for c in range(alg.num_chunks):
            (src,) = alg.sources(c)  # copy collectives: one source per chunk
            sources.append(src)
            posts.append(frozenset(alg.destinations(c)))
        return ChunkModel(spec, tuple(sources), tuple(posts))


def parse_size(text: str, source: str) -> float:
    """TACCL's input_size: "1M", "32K", "1G", "1MB", "512" (bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise InputError(source, F_SIZE, f"cannot read size {text!r}; write e.g. 1M, 32K, 1G")
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2).upper()]


# ---------------------------------------------------------------------------------------------------------
# Building the logical topology


def _layout(topology: Topology) -> tuple[int, list[tuple[int, ...]]]:
    sizes = {len(n.ranks) for n in topology.nodes}
    if len(sizes) != 1:
        raise InputError(topology.name, "$.nodes", "TACCL synthesis needs nodes with equal GPU counts")
    return sizes.pop(), [tuple(n.ranks) for n in topology.nodes]


def _check_local(value: int, gpus: int, source: str, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < gpus:
        raise InputError(source, path, f"GPU {value!r} does not exist: a node has local GPUs 0..{gpus - 1}")
    return value


def build_logical(topology: Topology, sketch: Sketch | None, spec: CollectiveSpec, chunk_bytes: float,
                  options, source: str) -> LogicalTopology:
    """The logical topology of a sketch (or of the default sketch) on a physical topology."""
    gpus, nodes = _layout(topology)
    n = topology.num_ranks
    node_of = [0] * n
    for i, ranks in enumerate(nodes):
        for r in ranks:
            node_of[r] = i
    phys = topology.link_map()
    description: list[str] = []
    if sketch is not None:
        _check_strategies(topology, sketch, nodes, source)
    hyper_of = _switch_hyperedges(topology, sketch, chunk_bytes, options, source, gpus, nodes, node_of, phys,
                                  description)
    draft = _intranode_links(topology, chunk_bytes, options, node_of, hyper_of)
    senders: dict[int, frozenset[int]] | None = None
    enforce = False
    if len(nodes) > 1:
        senders, enforce = _add_internode_links(draft, topology, sketch, chunk_bytes, options, source, gpus, nodes,
                                                node_of, phys, description)
    symmetry = tuple(sketch.symmetry_offsets) if sketch is not None else ()
    logical = LogicalTopology(n, gpus, tuple(node_of), draft, chunk_bytes, senders, enforce, symmetry,
                              tuple(description))
    return _checked_symmetry(logical, sketch, len(nodes), options, source)


def _check_strategies(topology: Topology, sketch: Sketch, nodes, source: str) -> None:
    """InputError unless the sketch is for this many nodes and uses strategies the synthesizer supports."""
    if sketch.nnodes != len(nodes):
        raise InputError(source, F_NNODES, f"sketch is for {sketch.nnodes} node(s), topology "
                         f"{topology.name!r} has {len(nodes)}")
    if sketch.intranode_strategy not in ("none", "switch"):
        raise InputError(source, F_INTRA, f"intranode strategy {sketch.intranode_strategy!r} is not "
                         "supported; use 'none' or 'switch'")
    if len(nodes) > 1 and sketch.internode_strategy != "relay":
        raise InputError(source, F_INTER, f"internode strategy {sketch.internode_strategy!r} is not "
                         "supported between nodes; use 'relay'")


def _switch_hyperedges(topology: Topology, sketch: Sketch | None, chunk_bytes: float, options, source: str, gpus,
                       nodes, node_of, phys, description: list[str]) -> dict[tuple[int, int], tuple[str, int]]:
    """Intra-node switch-hyperedges: link -> (hyperedge name, gamma sign of eq. 5.11), from the sketch's
    switches or (default sketch) from the topology's intra-node switches."""
    hyper_of: dict[tuple[int, int], tuple[str, int]] = {}
    if sketch is not None and sketch.intranode_strategy == "switch":
        seen: list[frozenset[int]] = []
        for i, members in enumerate(sketch.switches):
            path = f"{F_SWITCHES}[{i}]"
            local = [_check_local(g, gpus, source, f"{path}[{j}]") for j, g in enumerate(members)]
            if len(set(local)) != len(local) or len(local) < 2:
                raise InputError(source, path, "a switch needs at least 2 distinct GPUs")
            for other in seen:
                if other & set(local):
                    raise InputError(source, path, "switches must not share GPUs (TACCL splits bandwidth "
                                     "between identical switches; merge them into one)")
            seen.append(frozenset(local))
            sign = +1 if sketch.switch_hyperedge_strategy[i] == "uc-min" else -1
            for node_index, ranks in enumerate(nodes):
                for a in local:
                    for b in local:
                        if a == b:
                            continue
                        u, v = ranks[a], ranks[b]
                        if (u, v) not in phys:
                            raise InputError(source, path, f"GPUs {a} and {b} of node {node_index} have no link "
                                             f"in topology {topology.name!r}")
                        hyper_of[(u, v)] = (f"sketch-switch{i}/node{node_index}", sign)
    elif sketch is None:
        sign = -1 if chunk_bytes <= options.uc_threshold_bytes else +1
        description.append(f"default sketch: intra-node switches as {'uc-max' if sign < 0 else 'uc-min'} "
                           f"hyperedges (chunk {chunk_bytes:g} B vs threshold {options.uc_threshold_bytes:g} B)")
        for l in topology.links:
            if l.switch is not None and node_of[l.src] == node_of[l.dst]:
                hyper_of[(l.src, l.dst)] = (l.switch, sign)
    return hyper_of


def _intranode_links(topology: Topology, chunk_bytes: float, options, node_of,
                     hyper_of) -> dict[tuple[int, int], LogicalLink]:
    """Every physical link inside a node, with its switch port, gamma sign and contiguity."""
    chunk_MB = chunk_bytes / 1e6
    draft: dict[tuple[int, int], LogicalLink] = {}
    for l in topology.links:
        if node_of[l.src] != node_of[l.dst]:
            continue
        port = None
        if options.physical_switches and l.switch is not None:
            port = l.switch
        name_sign = hyper_of.get((l.src, l.dst))
        if name_sign is not None and port is None:
            port = name_sign[0]  # a sketch switch over links the topology does not route through a switch
        gamma = name_sign[1] if name_sign is not None else 0
        contiguous = options.contiguity == "all" and port is None
        draft[(l.src, l.dst)] = LogicalLink(l.src, l.dst, l.alpha_us, l.beta_us_per_MB,
                                            l.alpha_us + l.beta_us_per_MB * chunk_MB, False, port, gamma, contiguous)
    return draft


def _internode_conn(sketch: Sketch | None, options, source: str, gpus) -> dict[int, tuple[int, ...]]:
    """Local sender GPU -> local receiver GPUs in every other node (the sketch's internode_conn or the
    default)."""
    conn_field: object = sketch.internode_conn if sketch is not None else options.default_internode
    if isinstance(conn_field, dict):
        conn = {}
        for s, rs in sorted(conn_field.items()):
            _check_local(s, gpus, source, f"{F_CONN}.{s}")
            conn[s] = tuple(_check_local(r, gpus, source, f"{F_CONN}.{s}[{j}]") for j, r in enumerate(rs))
    elif conn_field == "fully-connected":
        conn = {s: tuple(range(gpus)) for s in range(gpus)}
    elif conn_field == "direct-map":
        conn = {s: (s,) for s in range(gpus)}
    else:
        raise InputError(source, F_CONN, f"unknown connection {conn_field!r}")
    return conn


def _add_internode_links(draft, topology: Topology, sketch: Sketch | None, chunk_bytes: float, options,
                         source: str, gpus, nodes, node_of, phys, description: list[str]):
    """Adds the inter-node ("relay") links to draft, with their NIC-sharing beta factor; returns the relay
    senders and whether enforce_ordering applies."""
    chunk_MB = chunk_bytes / 1e6
    conn = _internode_conn(sketch, options, source, gpus)
    if sketch is None:
        description.append(f"default sketch: inter-node {options.default_internode}")
    pairs = []  # (u, v) global
    for a, ranks_a in enumerate(nodes):
        for b, ranks_b in enumerate(nodes):
            if a == b:
                continue
            for s, rs in conn.items():
                for r in rs:
                    u, v = ranks_a[s], ranks_b[r]
                    if (u, v) not in phys:
                        raise InputError(source, F_CONN if sketch is not None else "topology",
                                         f"no physical link from GPU {s} of node {a} to GPU {r} of node {b} "
                                         f"in topology {topology.name!r}")
                    pairs.append((u, v))
    split = _beta_split(sketch, pairs, phys, node_of, nodes, conn, source)
    for (u, v) in pairs:
        l = phys[(u, v)]
        f = split[(u, v)]
        beta = l.beta_us_per_MB * f
        draft[(u, v)] = LogicalLink(u, v, l.alpha_us, beta, l.alpha_us + beta * chunk_MB, True, None, 0,
                                    options.contiguity in ("internode", "all"), f)
    senders: dict[int, frozenset[int]] | None = None
    enforce = False
    if sketch is not None:
        senders = _senders(sketch, conn, gpus, nodes, source)
        enforce = bool(sketch.enforce_ordering) and senders is not None
    return senders, enforce


def _checked_symmetry(logical: LogicalTopology, sketch: Sketch | None, num_nodes: int, options,
                      source: str) -> LogicalTopology:
    """The sketch's symmetry checked as an automorphism, or (default sketch) node rotation when it is one."""
    if sketch is None and num_nodes > 1 and options.default_symmetry:
        candidate = ((logical.gpus_per_node, logical.num_ranks),)
        try:
            _check_symmetry_links(logical, candidate, "<default>")
            _check_symmetry_senders(logical, candidate, "<default>")
            logical = with_symmetry(logical, candidate)
            logical = _with_description(logical, f"default sketch: node rotation symmetry {list(candidate[0])}")
        except InputError:
            logical = _with_description(logical, "default sketch: nodes not symmetric, no symmetry used")
    else:
        _check_symmetry_links(logical, logical.symmetry, source)
        _check_symmetry_senders(logical, logical.symmetry, source)
    return logical


def with_symmetry(logical: LogicalTopology, symmetry) -> LogicalTopology:
    return LogicalTopology(logical.num_ranks, logical.gpus_per_node, logical.node_of, logical.links,
                           logical.chunk_bytes, logical.senders, logical.enforce_ordering, tuple(symmetry),
                           logical.description)


def _with_description(logical: LogicalTopology, line: str) -> LogicalTopology:
    return LogicalTopology(logical.num_ranks, logical.gpus_per_node, logical.node_of, logical.links,
                           logical.chunk_bytes, logical.senders, logical.enforce_ordering, logical.symmetry,
                           logical.description + (line,))


def _beta_split(sketch, pairs, phys, node_of, nodes, conn, source) -> dict[tuple[int, int], float]:
    """Factor on each inter-node link's beta for sharing its NIC (see module docstring)."""
    given = sketch.beta_split if sketch is not None else {}
    local_factor: dict[int, float] = {}
    for key, value in (given or {}).items():
        if not str(key).isdigit() or int(key) not in conn:
            raise InputError(source, f"{F_BETASPLIT}.{key}", f"{key!r} is not a sender in internode_conn")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InputError(source, f"{F_BETASPLIT}.{key}", f"expected a positive number, found {value!r}")
        local_factor[int(key)] = float(value)
    out_count: dict[tuple[str, int], int] = {}
    in_count: dict[tuple[str, int], int] = {}
    for (u, v) in pairs:
        l = phys[(u, v)]
        out_count[(l.src_nic or f"rank{u}", node_of[v])] = out_count.get((l.src_nic or f"rank{u}", node_of[v]), 0) + 1
        in_count[(l.dst_nic or f"rank{v}", node_of[u])] = in_count.get((l.dst_nic or f"rank{v}", node_of[u]), 0) + 1
    split = {}
    for (u, v) in pairs:
        local_u = nodes[node_of[u]].index(u)
        if local_u in local_factor:
            split[(u, v)] = local_factor[local_u]
        else:
            l = phys[(u, v)]
            split[(u, v)] = float(max(out_count[(l.src_nic or f"rank{u}", node_of[v])],
                                      in_count[(l.dst_nic or f"rank{v}", node_of[u])]))
    return split


def _senders(sketch: Sketch, conn, gpus, nodes, source) -> dict[int, frozenset[int]] | None:
    """Source rank -> global ranks of its node that may send its chunks to other nodes (None: any sender)."""
    rev = sketch.gpus_to_sender_rev_map
    relay = sketch.chunk_to_relay_map
    if not rev and not relay:
        return None
    allowed: dict[int, set[int] | None] = {g: None for g in range(gpus)}
    if rev:
        for s, gs in sorted(rev.items()):
            if s >= gpus or s < 0:
                raise InputError(source, f"{F_REVMAP}.{s}", f"GPU {s} does not exist: local GPUs are 0..{gpus - 1}")
            if s not in conn:
                raise InputError(source, f"{F_REVMAP}.{s}", f"GPU {s} is not a sender in internode_conn")
            for j, g in enumerate(gs):
                _check_local(g, gpus, source, f"{F_REVMAP}.{s}[{j}]")
        for g in range(gpus):
            allowed[g] = {s for s, gs in rev.items() if g in gs}
    if relay:
        if len(relay) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in relay) \
                or relay[0] < 1 or not 0 <= relay[1] < relay[0]:
            raise InputError(source, F_RELAYMAP, f"expected [r1, r2] with 0 <= r2 < r1, found {list(relay)!r}")
        r1, r2 = relay
        for g in range(gpus):
            s = (g // r1) * r1 + r2
            if s >= gpus or s not in conn:
                raise InputError(source, F_RELAYMAP, f"maps GPU {g}'s chunks to GPU {s}, which is not a sender "
                                 "in internode_conn")
            allowed[g] = {s} if allowed[g] is None else allowed[g] & {s}
    out: dict[int, frozenset[int]] = {}
    for ranks in nodes:
        for g, r in enumerate(ranks):
            out[r] = frozenset(ranks[s] for s in (allowed[g] if allowed[g] is not None else conn))
    return out


# ---------------------------------------------------------------------------------------------------------
# Symmetry


def rotation(n: int, offset: int, group: int) -> tuple[int, ...]:
    """TACCL's sym_rank: (r % g + o) % g + (r // g) * g."""
    return tuple((r % group + offset) % group + (r // group) * group for r in range(n))


def _check_offsets(symmetry, n: int, source: str) -> None:
    for i, (o, g) in enumerate(symmetry):
        if g < 2 or n % g:
            raise InputError(source, f"{F_SYM}[{i}]", f"group size {g} does not divide the {n} ranks")
        if o % g == 0 or g % o:
            raise InputError(source, f"{F_SYM}[{i}]", f"offset {o} does not divide the group size {g} "
                             "(or is a multiple of it)")


def _check_symmetry_links(logical: LogicalTopology, symmetry, source: str) -> None:
    _check_offsets(symmetry, logical.num_ranks, source)
    for i, (o, g) in enumerate(symmetry):
        sigma = rotation(logical.num_ranks, o, g)
        for (u, v), l in sorted(logical.links.items()):
            if u // g != v // g:
                continue
            image = logical.links.get((sigma[u], sigma[v]))
            what = f"rotating by {o} in groups of {g} maps link {u}->{v} to {sigma[u]}->{sigma[v]}, "
            if image is None:
                raise InputError(source, f"{F_SYM}[{i}]", what + "which the logical topology lacks")
            if abs(image.lat_us - l.lat_us) > LAT_RTOL * max(l.lat_us, 1.0) or \
                    (image.port is None) != (l.port is None) or image.gamma_sign != l.gamma_sign:
                raise InputError(source, f"{F_SYM}[{i}]", what + "which costs or switches differently")


def _check_symmetry_senders(logical: LogicalTopology, symmetry, source: str) -> None:
    if logical.senders is None:
        return
    for i, (o, g) in enumerate(symmetry):
        sigma = rotation(logical.num_ranks, o, g)
        for r, allowed in logical.senders.items():
            if frozenset(sigma[s] for s in allowed) != logical.senders[sigma[r]]:
                raise InputError(source, f"{F_SYM}[{i}]", f"rotating by {o} in groups of {g} does not map the "
                                 f"inter-node senders of GPU {r}'s chunks to those of GPU {sigma[r]}'s")


def generators(logical: LogicalTopology, chunks: ChunkModel, source: str) -> list[Generator]:
    """The symmetry rotations with their chunk maps; InputError when the collective lacks the symmetry."""
    out = []
    k = chunks.spec.chunks_per_rank
    index = {}
    for c in range(chunks.num_chunks):
        index[(chunks.source[c], chunks.post[c], c % k)] = c
    for i, (o, g) in enumerate(logical.symmetry):
        sigma = rotation(logical.num_ranks, o, g)
        cmap = []
        for c in range(chunks.num_chunks):
            key = (sigma[chunks.source[c]], frozenset(sigma[r] for r in chunks.post[c]), c % k)
            if key not in index:
                raise InputError(source, f"{F_SYM}[{i}]", f"rotating by {o} in groups of {g} is not a symmetry "
                                 f"of {chunks.spec.kind} (chunk {c} has no image)")
            cmap.append(index[key])
        out.append(Generator(o, g, sigma, tuple(cmap)))
    return out


# ---------------------------------------------------------------------------------------------------------
# Candidate routes (shortest-path restriction)


@dataclass(frozen=True)
class Candidates:
    """Per chunk: the ranks (spset) and links stage 1 may use."""

    ranks: tuple[frozenset[int], ...]
    links: tuple[tuple[tuple[int, int], ...], ...]
    hops: dict  # (chunk, rank) -> hop distance from the source in the chunk's graph


def _allowed(logical: LogicalTopology, src: int, u: int, v: int) -> bool:
    """May a chunk whose source is `src` use logical link (u, v)?"""
    if v == src:
        return False  # never send a chunk back to its source
    l = logical.links[(u, v)]
    if not l.internode:
        return True
    # relay: cross nodes once, out of the source node, through the chunk's senders
    if logical.node_of[u] != logical.node_of[src]:
        return False
    return logical.senders is None or u in logical.senders[src]


def _bfs(adj: dict[int, list[int]], start: int) -> dict[int, int]:
    dist = {start: 0}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in adj.get(u, ()):
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def candidates(logical: LogicalTopology, chunks: ChunkModel, options, sketch_given: bool,
               source: str) -> Candidates:
    """TACCL's shortest-path restriction (§5.4.2), with a hop slack.

    spset(c) = ranks u on a path source -> d of at most dist(source, d) + hop_slack hops for some
    destination d of c. path_restriction "nodes" (TACCL's) lets c use every allowed link between two ranks of
    spset(c) (so a switch can still be used as a ring under uc-min); "links" only links (u, v) that lie on
    such a path (dist(s, u) + 1 + dist(v, d) <= dist(s, d) + slack): a much smaller model.
    """
    slack = options.hop_slack
    graphs: dict[int, tuple[dict, dict]] = {}
    out_ranks, out_links, hops = [], [], {}
    for c in range(chunks.num_chunks):
        s = chunks.source[c]
        if s not in graphs:
            fwd: dict[int, list[int]] = {}
            rev: dict[int, list[int]] = {}
            for (u, v) in sorted(logical.links):
                if _allowed(logical, s, u, v):
                    fwd.setdefault(u, []).append(v)
                    rev.setdefault(v, []).append(u)
            graphs[s] = (fwd, rev, _bfs(fwd, s), {})
        fwd, rev, ds, to_cache = graphs[s]
        dests = sorted(chunks.post[c] - {s})
        for d in dests:
            if d not in ds:
                _disconnected(logical, s, d, sketch_given, source)
            if d not in to_cache:
                to_cache[d] = _bfs(rev, d)
        spset = {s}
        for d in dests:
            dd = to_cache[d]
            limit = ds[d] + slack
            spset.update(u for u, du in ds.items() if u in dd and du + dd[u] <= limit)
        links = []
        for u in sorted(spset):
            for v in fwd.get(u, ()):
                if v not in spset:
                    continue
                if options.path_restriction == "links":
                    if not any(ds[u] + 1 + to_cache[d].get(v, 1 << 30) <= ds[d] + slack for d in dests):
                        continue
                links.append((u, v))
        out_ranks.append(frozenset(spset))
        out_links.append(tuple(links))
        for u in spset:
            hops[(c, u)] = ds[u]
    return Candidates(tuple(out_ranks), tuple(out_links), hops)


def _disconnected(logical: LogicalTopology, s: int, d: int, sketch_given: bool, source: str):
    """Name the sketch field that cut d off from s."""
    full = {}
    for (u, v) in logical.links:
        full.setdefault(u, []).append(v)
    reach = _bfs(full, s)
    same_node = logical.node_of[s] == logical.node_of[d]
    if not sketch_given:
        raise InputError(source, "topology", f"rank {d} cannot be reached from rank {s}: the topology is disconnected")
    if d in reach and not same_node:
        field_ = F_REVMAP if logical.senders is not None else F_CONN
        raise InputError(source, field_, f"disconnected logical topology: chunks of GPU {s} cannot reach GPU {d} "
                         "through their allowed inter-node senders (a chunk crosses nodes once, from its node)")
    if same_node:
        raise InputError(source, F_INTRA, f"disconnected logical topology: GPU {d} cannot be reached from GPU {s} "
                         "inside their node")
    raise InputError(source, F_CONN, f"disconnected logical topology: no inter-node route from GPU {s} to GPU {d}")

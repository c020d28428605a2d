"""Lower bounds on the time of a collective on a topology, in the simulator's alpha-beta model.

Sizes follow nccl-tests (the same convention as `simulate_program`): B = `buffer_bytes` is the whole
output buffer per rank for allgather and alltoall, the whole input per rank for reducescatter, and the
buffer for allreduce, broadcast and reduce. n = number of participating ranks; a share is B/n.

Model facts the bounds rest on (true of `mlopt.sim.network` and of TACCL's cost model):
  M1. Data moves only over topology links, and bytes that cross a link also cross every shared resource
      of that link (the link itself, switch ports, NIC directions), each of bounded capacity.
  M2. A message issued at t >= 0 on a link moves no bytes before t + alpha of that link.
  M3. Messages carry data of one element position each: a reduction only adds values of the same
      element (no network coding); nothing is compressed.

Capacity of a cut. For a set S of topology ranks, cap_in(S) is the largest total rate (bytes/us) of all
links entering S: the linear program  max sum_l x_l  s.t.  sum_{l in R} x_l <= c_R  for every shared
resource R (links, switch ports tx/rx, NIC tx/rx), x >= 0, over links l with dst in S and src outside S.
cap_out(S) likewise for links leaving S. cap_all is the same LP over every link of the topology.

Data a cut must carry (in_bytes(S), out_bytes(S)), with P the participants, p = |P ∩ S|, q = |P \\ S|:
  allgather      in: q shares if p > 0 (every share from outside is needed inside, and must enter once)
                 out: p shares if q > 0
  alltoall       in = out = p q shares (each (source, destination) share crosses the cut itself)
  reducescatter  in: p shares if q > 0 (each inside rank's result needs outside contributions: at least a
                 partial sum of its share must enter); out: q shares if p > 0 (symmetric)
  allreduce      in = out = B if p > 0 and q > 0 (every element's result inside needs outside data, and
                 vice versa)
  broadcast      in: B if root outside S and p > 0; out: B if root in S and q > 0
  reduce         in: B if root in S and q > 0; out: B if root outside S and p > 0
  (p, q counting ranks of P; shares are B/n)

Terms (each a valid lower bound; the overall bound is their maximum):
  ingress    max over participants r of  alpha_in(r) + in_bytes({r}) / cap_in({r})
             (the per-rank bound of the design brief: allgather/alltoall (n-1)/n B, allreduce B,
             reducescatter B/n, broadcast B at non-roots, reduce B at the root; by M1 the bytes entering r
             need in_bytes / cap_in of byte-moving time, and by M2 none moves before the smallest alpha
             of r's incoming links, alpha_in(r))
  egress     the same with out_bytes, cap_out and alpha_out (reducescatter (n-1)/n B: each of r's n-1
             foreign shares must leave r, by M3)
  cut        for a topology of several nodes, max over nodes N (S = all ranks of N) of
             alpha_cross + max(in_bytes(S) / cap_in(S), out_bytes(S) / cap_out(S)); alpha_cross is the
             smallest alpha of a link crossing the cut (e.g. allgather on 2 nodes: each node needs the
             other node's n/2 shares through its NICs' rx bandwidth)
  aggregate  alpha_min + T / cap_all, T the total bytes every algorithm must put on links:
             allgather (n-1) B (each share must enter each of the n-1 other ranks over some link),
             alltoall  sum over ordered pairs (s, d) of hops(s, d) * B/n (each share crosses at least
             the shortest path), reducescatter (n-1) B (the egress requirement summed), allreduce
             2 (n-1) B (per element, every rank needs the sum of n values: with one-way messages of
             single values that takes at least 2(n-1) messages, the directed gossip bound; this is the
             classic 2(n-1)/n B per rank of ring allreduce), broadcast and reduce (n-1) B.
  latency    max over the (source, destination) pairs that must communicate of the alpha-shortest
             path between them (all ordered pairs; broadcast root -> others; reduce others -> root):
             by M2 data crosses each link of its path no earlier than alpha after it got there.

The terms are reported separately and combined by max only: adding a latency term to a bandwidth term
is not valid in general (pipelining overlaps them), except for the alpha of the first hop into the cut,
which every byte crossing it pays (M2), and which the ingress, egress, cut and aggregate terms include.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from mlopt.errors import InputError
from mlopt.formats.topology import Topology
from mlopt.sim.network import NetworkModel, call_overhead_us

COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce")
TERM_ORDER = ("ingress", "egress", "cut", "aggregate", "latency")


@dataclass(frozen=True)
class Bound:
    time_us: float
    which: str  # the binding term (first in TERM_ORDER among the largest)
    terms: dict[str, float]  # every term computed, us
    collective: str = ""
    buffer_bytes: float = 0.0
    num_ranks: int = 0
    detail: dict[str, str] = field(default_factory=dict)  # where each term binds (rank, node, pair)

    @property
    def algbw_GBps(self) -> float:
        """The best algbw any algorithm can reach (buffer / bound)."""
        return self.buffer_bytes / self.time_us / 1e3 if self.time_us > 0 else math.inf

    def to_dict(self) -> dict:
        return {"collective": self.collective, "buffer_bytes": self.buffer_bytes, "num_ranks": self.num_ranks,
                "time_us": self.time_us, "which": self.which, "terms": dict(self.terms),
                "detail": dict(self.detail)}


def cut_requirements(collective: str, participants: Sequence[int], inside: set[int], buffer_bytes: float,
                     root: int = 0) -> tuple[float, float]:
    """(bytes that must enter, bytes that must leave) a set of topology ranks (see module docstring).

    `participants` are topology ranks in program-rank order; `root` is a program rank.
    """
    n = len(participants)
    share = buffer_bytes / n
    p = sum(1 for r in participants if r in inside)
    q = n - p
    root_in = participants[root] in inside
    if collective == "allgather":
        return (q * share if p else 0.0, p * share if q else 0.0)
    if collective == "alltoall":
        return (p * q * share, p * q * share)
    if collective == "reducescatter":
        return (p * share if q else 0.0, q * share if p else 0.0)
    if collective == "allreduce":
        both = p > 0 and q > 0
        return (buffer_bytes if both else 0.0, buffer_bytes if both else 0.0)
    if collective == "broadcast":
        return (buffer_bytes if not root_in and p else 0.0, buffer_bytes if root_in and q else 0.0)
    if collective == "reduce":
        return (buffer_bytes if root_in and q else 0.0, buffer_bytes if not root_in and p else 0.0)
    raise ValueError(f"unknown collective {collective!r}")


class _Capacities:
    """LP capacities of link sets over a topology's shared resources (scipy's HiGHS)."""

    def __init__(self, topology: Topology, laminar: bool = True):
        self.topology = topology
        self.laminar = laminar  # False: always the LP (tests compare both)
        self.model = NetworkModel(topology, local_GBps=None)
        self.routes = [self.model.route(l.src, l.dst) for l in topology.links]

    def max_rate(self, routes: list) -> float:
        """max sum x_l subject to every shared resource's capacity, bytes/us.

        When the resources, restricted to these links, form a laminar family (any two are disjoint or
        nested, as for one rank's incoming links) the LP is solved exactly bottom-up: a set carries
        min(its capacity, what its children carry). Otherwise scipy's HiGHS solves it.
        """
        if not routes:
            return 0.0
        rows: dict[int, list[int]] = {}
        for j, route in enumerate(routes):
            for r in route.account:
                rows.setdefault(r, []).append(j)
        caps = self.model.capacities
        got = _laminar_max({r: frozenset(cols) for r, cols in rows.items()}, caps) if self.laminar else None
        if got is not None:
            return got

        ii, jj, b = [], [], []
        for i, (r, cols) in enumerate(rows.items()):
            ii.extend([i] * len(cols))
            jj.extend(cols)
            b.append(caps[r])
        a = coo_matrix(([1.0] * len(ii), (ii, jj)), shape=(len(rows), len(routes))).tocsr()
        res = linprog([-1.0] * len(routes), A_ub=a, b_ub=b, bounds=(0, None), method="highs")
        if res.status != 0:  # pragma: no cover - the LP is bounded and feasible (x = 0)
            raise RuntimeError(f"capacity LP failed: {res.message}")
        return -res.fun

    def into(self, inside: set[int]) -> tuple[float, float]:
        """(capacity, smallest alpha) of the links entering `inside`."""
        routes = [r for r in self.routes if r.dst in inside and r.src not in inside]
        return self.max_rate(routes), min((r.alpha_us for r in routes), default=math.inf)

    def out_of(self, inside: set[int]) -> tuple[float, float]:
        routes = [r for r in self.routes if r.src in inside and r.dst not in inside]
        return self.max_rate(routes), min((r.alpha_us for r in routes), default=math.inf)


def _laminar_max(sets: dict[int, frozenset], caps: Sequence[float]) -> float | None:
    """max sum x subject to sum over each set <= its capacity, if the sets are laminar (else None).

    Every variable must lie in at least one set (each link has its own link resource)."""
    merged: dict[frozenset, float] = {}
    for r, members in sets.items():
        merged[members] = min(caps[r], merged.get(members, math.inf))
    order = sorted(merged, key=len)  # children before parents
    parent: dict[frozenset, frozenset | None] = {}
    for i, a in enumerate(order):
        parent[a] = None
        for b in order[i + 1:]:
            if a & b:
                if not a <= b:
                    return None  # crossing sets
                if parent[a] is None:
                    parent[a] = b  # the smallest superset
    carried: dict[frozenset, float] = dict.fromkeys(order, 0.0)
    covered: dict[frozenset, set] = {a: set() for a in order}
    total = 0.0
    for a in order:
        free = len(a) - len(covered[a])  # variables in no child: unbounded but for this set
        value = merged[a] if free else min(merged[a], carried[a])
        p = parent[a]
        if p is None:
            total += value
        else:
            carried[p] += value
            covered[p] |= a
    return total


def _shortest(topology: Topology, source: int, weight: str) -> dict[int, float]:
    """Dijkstra from source over links; weight 'alpha' (alpha_us) or 'hops' (1 per link)."""
    adj: dict[int, list[tuple[int, float]]] = {}
    for l in topology.links:
        adj.setdefault(l.src, []).append((l.dst, l.alpha_us if weight == "alpha" else 1.0))
    dist = {source: 0.0}
    heap = [(0.0, source)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v, w in adj.get(u, ()):
            if d + w < dist.get(v, math.inf):
                dist[v] = d + w
                heapq.heappush(heap, (d + w, v))
    return dist


def _pairs(collective: str, participants: Sequence[int], root: int) -> list[tuple[int, int]]:
    if collective == "broadcast":
        return [(participants[root], d) for d in participants if d != participants[root]]
    if collective == "reduce":
        return [(s, participants[root]) for s in participants if s != participants[root]]
    return [(s, d) for s in participants for d in participants if s != d]


class BoundModel:
    """The size-independent part of the bounds of one collective on one topology.

    Every term is a maximum of `alpha + buffer_bytes * k` over candidates (ranks, nodes, pairs): the data
    requirements scale linearly with the buffer. Building the model solves the capacity LPs once;
    `at(buffer_bytes)` evaluates it for any size (use it for size sweeps).
    """

    def __init__(self, collective: str, topology: Topology, *, ranks: Sequence[int] | None = None, root: int = 0):
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
        participants = list(range(topology.num_ranks)) if ranks is None else [int(r) for r in ranks]
        n = len(participants)
        if n < 1 or len(set(participants)) != n or not all(0 <= r < topology.num_ranks for r in participants):
            raise ValueError("ranks must be distinct topology ranks")
        if not 0 <= root < n:
            raise ValueError(f"root {root} outside 0..{n - 1}")
        self.collective, self.topology, self.participants, self.root = collective, topology, participants, root
        # term -> [(alpha_us, us per buffer byte, where)]
        self.candidates: dict[str, list[tuple[float, float, str]]] = {}
        if n == 1:
            self.candidates["latency"] = [(0.0, 0.0, "")]
            return

        # latency (and reachability)
        pairs = _pairs(collective, participants, root)
        dist_alpha = {s: _shortest(topology, s, "alpha") for s in sorted({s for s, _ in pairs})}
        lat = []
        for s, d in pairs:
            dd = dist_alpha[s].get(d, math.inf)
            if math.isinf(dd):
                raise InputError(topology.name, "links", f"no path from rank {s} to rank {d}")
            lat.append((dd, 0.0, f"{s}->{d}"))
        self.candidates["latency"] = lat

        caps = _Capacities(topology)

        def cut(inside: set[int], where: str) -> tuple[list, list]:
            need_in, need_out = cut_requirements(collective, participants, inside, 1.0, root)
            got_in, got_out = [], []
            if need_in > 0:
                cap, alpha = caps.into(inside)
                got_in.append((alpha, need_in / cap if cap > 0 else math.inf, where))
            if need_out > 0:
                cap, alpha = caps.out_of(inside)
                got_out.append((alpha, need_out / cap if cap > 0 else math.inf, where))
            return got_in, got_out

        self.candidates["ingress"], self.candidates["egress"] = [], []
        for r in participants:
            got_in, got_out = cut({r}, f"rank {r}")
            self.candidates["ingress"] += got_in
            self.candidates["egress"] += got_out
        if topology.num_nodes > 1:
            self.candidates["cut"] = []
            for node in topology.nodes:
                got_in, got_out = cut(set(node.ranks), node.name)
                self.candidates["cut"] += got_in + got_out

        if collective == "alltoall":
            share_hops = 0.0
            for s in participants:
                hops = _shortest(topology, s, "hops")
                share_hops += sum(hops[d] for d in participants if d != s)
            total = share_hops / n  # bytes per buffer byte
        elif collective == "allreduce":
            total = 2.0 * (n - 1)
        else:
            total = float(n - 1)
        cap_all = caps.max_rate(caps.routes)
        alpha_min = min(r.alpha_us for r in caps.routes)
        self.candidates["aggregate"] = [(alpha_min, total / cap_all, "all links")]

    def at(self, buffer_bytes: float) -> Bound:
        """The bound for one buffer size (nccl-tests' convention)."""
        if buffer_bytes < 0:
            raise ValueError("buffer_bytes must be >= 0")
        terms: dict[str, float] = {}
        detail: dict[str, str] = {}
        for name in TERM_ORDER:
            cands = self.candidates.get(name)
            if cands is None or (buffer_bytes == 0 and name != "latency"):
                continue
            best, where = 0.0, ""
            for alpha, k, w in cands:
                t = alpha + buffer_bytes * k if k < math.inf else math.inf
                if t > best:
                    best, where = t, w
            terms[name] = best
            if where:
                detail[name] = where
        top = max(terms.values())
        which = next(k for k, v in terms.items() if v >= top * (1 - 1e-12))
        overhead = call_overhead_us(self.topology, len(self.participants))  # every run pays it
        return Bound(top + overhead, which, terms, self.collective, buffer_bytes, len(self.participants), detail)


def lower_bound(collective: str, topology: Topology, buffer_bytes: float, *,
                ranks: Sequence[int] | None = None, root: int = 0) -> Bound:
    """Lower bound on the time (us) of `collective` for `buffer_bytes` (nccl-tests' size) on `topology`.

    `ranks`: the participating topology ranks in program-rank order (a program's rank map; default all);
    `root`: program rank of the root for broadcast and reduce. Raises InputError when some rank that
    must receive data cannot be reached, ValueError for bad arguments. For several sizes, build a
    `BoundModel` once and call `at(size)`.
    """
    if buffer_bytes < 0:
        raise ValueError("buffer_bytes must be >= 0")
    return BoundModel(collective, topology, ranks=ranks, root=root).at(buffer_bytes)

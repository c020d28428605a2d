"""Stage 2: heuristic ordering (TACCL §5.5.2) on a graph of transfers.

A `TransferGraph` is what stages 2 and 3 work on: chunk transfers over logical links with their
dependencies (a transfer may start once the transfers that deliver its chunk to its source have arrived:
one for copies, all of a rank's children for an inverted, reducing tree). Built from stage-1 routes
(`from_routes`) or by inverting an allgather (combining.py).

The ordering is a greedy list schedule. Candidates are the transfers whose dependencies are scheduled (the
next link of every path); each round the best candidate by the heuristic is placed at its earliest time
given what is already placed, and the running link, switch-port and chunk times move forward:

- link time: when the link is free; chunk time: when the chunk has arrived at the sender (the paper's two
  running estimates);
- switch ports: a rank sends to one switched destination at a time and receives from one switched source at
  a time (what eq. 5.20 / 5.21 enforce exactly);
- reduce serialization (combining): a rank reduces the receives of one chunk one at a time.

Heuristics (the keys compare candidates; ties end in (chunk, src, dst) order, so the result is deterministic):
- "longest-path-first": chunk-with-longest-path-from-now first (the latency still to travel from this link
  to the chunk's farthest destination, this link included), then earliest possible start, then
  chunk-with-shortest-path-until-now first (latency travelled from the source) - TACCL's switch heuristic;
- "earliest-first": earliest possible start first, then longest-path-from-now, then shortest-path-until-now
  (TACCL's multi-node NVLink heuristic);
- "mirror" (only with a `priority` per transfer, e.g. an inverted graph's mirrored copy schedule): lowest
  priority first, then earliest possible start;
- "auto": all that apply, keeping the one whose list schedule ends first (stage 3 starts from it).

Outputs: chunk_order(u, v) per link, switch_send_order(r) and switch_recv_order(r) per switch port, the
reduce order per (rank, chunk), and the list schedule itself (a feasible stage-3 schedule with no
contiguity, used as stage 3's warm start, big-M and fallback).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from mlopt.planners.collective.taccl.logical import ChunkModel, LogicalTopology

HEURISTICS = ("longest-path-first", "earliest-first")


@dataclass
class TransferGraph:
    chunk: list[int] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    reduce: list[bool] = field(default_factory=list)
    deps: list[tuple[int, ...]] = field(default_factory=list)  # must have arrived before this starts
    own_first: dict = field(default_factory=dict)  # link -> transfers that precede the others on it
    serialize_receives: bool = False  # reducing: a rank reduces one receive of a chunk at a time

    def __len__(self) -> int:
        return len(self.chunk)

    def add(self, chunk: int, src: int, dst: int, reduce: bool, deps: tuple[int, ...]) -> int:
        self.chunk.append(chunk)
        self.src.append(src)
        self.dst.append(dst)
        self.reduce.append(reduce)
        self.deps.append(deps)
        return len(self.chunk) - 1

    def link(self, t: int) -> tuple[int, int]:
        return (self.src[t], self.dst[t])

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(len(self))]
        for t, ds in enumerate(self.deps):
            for d in ds:
                out[d].append(t)
        return out


def from_routes(edges: tuple[tuple[tuple[int, int], ...], ...], chunks: ChunkModel,
                logical: LogicalTopology) -> TransferGraph:
    g = TransferGraph()
    for c, tree in enumerate(edges):
        into: dict[int, int] = {}
        for (u, v) in tree:  # in arrival order: the link into u comes first
            deps = (into[u],) if u in into else ()
            into[v] = g.add(c, u, v, False, deps)
    if logical.enforce_ordering:
        for t in range(len(g)):
            if logical.links[g.link(t)].internode and chunks.source[g.chunk[t]] == g.src[t]:
                g.own_first.setdefault(g.link(t), set()).add(t)
    return g


@dataclass
class Orders:
    heuristic: str
    link: dict  # (u, v) -> transfers in send order
    send_port: dict  # (switch, rank) -> transfers in send order
    recv_port: dict  # (switch, rank) -> transfers in receive order
    reduce: dict  # (rank, chunk) -> receives in reduce order
    start_us: list[float]  # the list schedule
    makespan_us: float


def lat_of(graph: TransferGraph, logical: LogicalTopology) -> list[float]:
    return [logical.links[graph.link(t)].lat_us for t in range(len(graph))]


def metrics(graph: TransferGraph, lat: list[float]) -> tuple[list[float], list[float]]:
    """(to_travel, has_travelled): the longest latency from this transfer's start to a final arrival, and the
    longest latency from the chunk's start to this transfer's source."""
    n = len(graph)
    children = graph.children()
    order = _topological(graph)
    to_travel = [0.0] * n
    for t in reversed(order):
        to_travel[t] = lat[t] + max((to_travel[ch] for ch in children[t]), default=0.0)
    travelled = [0.0] * n
    for t in order:
        travelled[t] = max((travelled[d] + lat[d] for d in graph.deps[t]), default=0.0)
    return to_travel, travelled


def _topological(graph: TransferGraph) -> list[int]:
    indeg = [len(ds) for ds in graph.deps]
    children = graph.children()
    ready = [t for t in range(len(graph)) if indeg[t] == 0]
    out = []
    while ready:
        t = ready.pop()
        out.append(t)
        for ch in children[t]:
            indeg[ch] -= 1
            if indeg[ch] == 0:
                ready.append(ch)
    if len(out) != len(graph):
        raise RuntimeError("transfer graph has a dependency cycle")
    return out


def order(graph: TransferGraph, logical: LogicalTopology, heuristic: str,
          priority: Sequence[float] | None = None) -> Orders:
    """Run one heuristic (see module docstring)."""
    if heuristic == "auto":
        best = None
        for h in HEURISTICS + (("mirror",) if priority is not None else ()):
            o = order(graph, logical, h, priority)
            if best is None or o.makespan_us < best.makespan_us - 1e-9 * max(1.0, best.makespan_us):
                best = o
        return best
    if heuristic == "mirror":
        if priority is None or len(priority) != len(graph):
            raise ValueError("the mirror ordering needs a priority for every transfer")
    elif heuristic not in HEURISTICS:
        raise ValueError(f"unknown ordering heuristic {heuristic!r}; choose auto or one of {HEURISTICS}")
    return _ListScheduler(graph, logical, heuristic, priority).run()


class _ListScheduler:
    """One heuristic's list schedule: transfers are placed one at a time, the smallest key first, each as
    early as its dependencies, link, switch ports and (combining) reduction slot allow."""

    def __init__(self, graph: TransferGraph, logical: LogicalTopology, heuristic: str,
                 priority: Sequence[float] | None):
        self.graph, self.heuristic, self.priority = graph, heuristic, priority
        n = len(graph)
        self.lat = lat_of(graph, logical)
        self.to_travel, self.travelled = metrics(graph, self.lat)
        self.children = graph.children()
        self.waiting = [len(ds) for ds in graph.deps]
        self.ready_at = [0.0] * n  # chunk time: when every dependency has arrived
        self.link_free: dict = {}
        self.send_free: dict = {}
        self.recv_free: dict = {}
        self.reduce_free: dict = {}
        self.own_left = {link: len(ts) for link, ts in graph.own_first.items()}
        self.blocked: dict = {}  # link -> transfers waiting for that link's own chunks
        self.start = [0.0] * n
        self.orders = Orders(heuristic, {}, {}, {}, {}, self.start, 0.0)
        self.ports = {}
        for t in range(n):
            l = logical.links[graph.link(t)]
            self.ports[t] = None if l.port is None else ((l.port, graph.src[t]), (l.port, graph.dst[t]))
        self.heap: list = []

    def est(self, t: int) -> float:
        """Earliest start of t given what is placed so far."""
        graph = self.graph
        link = graph.link(t)
        e = max(self.ready_at[t], self.link_free.get(link, 0.0))
        if self.ports[t] is not None:
            sp, rp = self.ports[t]
            e = max(e, self.send_free.get(sp, 0.0), self.recv_free.get(rp, 0.0))
        if graph.serialize_receives:
            e = max(e, self.reduce_free.get((graph.dst[t], graph.chunk[t]), 0.0))
        return e

    def key(self, t: int) -> tuple:
        """The heuristic's priority of t (smallest first)."""
        graph = self.graph
        tie = (graph.chunk[t], graph.src[t], graph.dst[t], t)
        if self.heuristic == "longest-path-first":
            return (-self.to_travel[t], self.est(t), self.travelled[t]) + tie
        if self.heuristic == "mirror":
            return (self.priority[t], self.est(t), -self.to_travel[t], self.travelled[t]) + tie  # type: ignore[index]
        return (self.est(t), -self.to_travel[t], self.travelled[t]) + tie

    def push(self, t: int) -> None:
        """Queue a ready transfer (or hold it back until its link's own chunks are sent: enforce_ordering)."""
        link = self.graph.link(t)
        if self.own_left.get(link, 0) > 0 and t not in self.graph.own_first[link]:
            self.blocked.setdefault(link, []).append(t)
            return
        heapq.heappush(self.heap, (self.key(t), t))

    def run(self) -> Orders:
        """Place every transfer; the orders per link, port and reduction, the starts and the makespan."""
        n, heap = len(self.graph), self.heap
        for t in range(n):
            if self.waiting[t] == 0:
                self.push(t)
        placed = 0
        while heap:
            k, t = heapq.heappop(heap)
            fresh = self.key(t)
            if fresh != k:  # resources moved since it was pushed: keys only grow, so re-queue (lazy update)
                heapq.heappush(heap, (fresh, t))
                continue
            self.place(t)
            placed += 1
        if placed != n:
            raise RuntimeError("ordering could not place every transfer")
        self.orders.makespan_us = max((self.start[t] + self.lat[t] for t in range(n)), default=0.0)
        return self.orders

    def place(self, t: int) -> None:
        """Start t at its earliest start, occupy its resources until it arrives, and release its children."""
        graph, orders = self.graph, self.orders
        s = self.est(t)
        f = s + self.lat[t]
        self.start[t] = s
        link = graph.link(t)
        self.link_free[link] = f
        orders.link.setdefault(link, []).append(t)
        if self.ports[t] is not None:
            sp, rp = self.ports[t]
            self.send_free[sp] = f
            self.recv_free[rp] = f
            orders.send_port.setdefault(sp, []).append(t)
            orders.recv_port.setdefault(rp, []).append(t)
        if graph.serialize_receives:
            rk = (graph.dst[t], graph.chunk[t])
            self.reduce_free[rk] = f
            orders.reduce.setdefault(rk, []).append(t)
        if link in self.own_left and t in graph.own_first[link]:
            self.own_left[link] -= 1
            if self.own_left[link] == 0:
                for b in self.blocked.pop(link, []):
                    heapq.heappush(self.heap, (self.key(b), b))
        for ch in self.children[t]:
            self.ready_at[ch] = max(self.ready_at[ch], f)
            self.waiting[ch] -= 1
            if self.waiting[ch] == 0:
                self.push(ch)

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
    n = len(graph)
    lat = lat_of(graph, logical)
    to_travel, travelled = metrics(graph, lat)
    children = graph.children()
    waiting = [len(ds) for ds in graph.deps]
    ready_at = [0.0] * n  # chunk time: when every dependency has arrived
    link_free: dict = {}
    send_free: dict = {}
    recv_free: dict = {}
    reduce_free: dict = {}
    own_left = {link: len(ts) for link, ts in graph.own_first.items()}
    blocked: dict = {}  # link -> transfers waiting for that link's own chunks
    start = [0.0] * n
    orders = Orders(heuristic, {}, {}, {}, {}, start, 0.0)
    ports = {}
    for t in range(n):
        l = logical.links[graph.link(t)]
        ports[t] = None if l.port is None else ((l.port, graph.src[t]), (l.port, graph.dst[t]))

    def est(t: int) -> float:
        link = graph.link(t)
        e = max(ready_at[t], link_free.get(link, 0.0))
        if ports[t] is not None:
            sp, rp = ports[t]
            e = max(e, send_free.get(sp, 0.0), recv_free.get(rp, 0.0))
        if graph.serialize_receives:
            e = max(e, reduce_free.get((graph.dst[t], graph.chunk[t]), 0.0))
        return e

    def key(t: int) -> tuple:
        tie = (graph.chunk[t], graph.src[t], graph.dst[t], t)
        if heuristic == "longest-path-first":
            return (-to_travel[t], est(t), travelled[t]) + tie
        if heuristic == "mirror":
            return (priority[t], est(t), -to_travel[t], travelled[t]) + tie  # type: ignore[index]
        return (est(t), -to_travel[t], travelled[t]) + tie

    heap: list = []

    def push(t: int) -> None:
        link = graph.link(t)
        if own_left.get(link, 0) > 0 and t not in graph.own_first[link]:
            blocked.setdefault(link, []).append(t)
            return
        heapq.heappush(heap, (key(t), t))

    for t in range(n):
        if waiting[t] == 0:
            push(t)
    placed = 0
    while heap:
        k, t = heapq.heappop(heap)
        fresh = key(t)
        if fresh != k:  # resources moved since it was pushed: keys only grow, so re-queue (lazy update)
            heapq.heappush(heap, (fresh, t))
            continue
        s = est(t)
        f = s + lat[t]
        start[t] = s
        placed += 1
        link = graph.link(t)
        link_free[link] = f
        orders.link.setdefault(link, []).append(t)
        if ports[t] is not None:
            sp, rp = ports[t]
            send_free[sp] = f
            recv_free[rp] = f
            orders.send_port.setdefault(sp, []).append(t)
            orders.recv_port.setdefault(rp, []).append(t)
        if graph.serialize_receives:
            rk = (graph.dst[t], graph.chunk[t])
            reduce_free[rk] = f
            orders.reduce.setdefault(rk, []).append(t)
        if link in own_left and t in graph.own_first[link]:
            own_left[link] -= 1
            if own_left[link] == 0:
                for b in blocked.pop(link, []):
                    heapq.heappush(heap, (key(b), b))
        for ch in children[t]:
            ready_at[ch] = max(ready_at[ch], f)
            waiting[ch] -= 1
            if waiting[ch] == 0:
                push(ch)
    if placed != n:
        raise RuntimeError("ordering could not place every transfer")
    orders.makespan_us = max((start[t] + lat[t] for t in range(n)), default=0.0)
    return orders

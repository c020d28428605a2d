"""System layer (ASTRA-sim's): collective algorithms as point-to-point message schedules, and their time.

ASTRA-sim splits a training-iteration simulator into a workload layer (what to communicate, when), a system
layer (how a collective becomes messages: ring, tree, all-to-all, multi-phase hierarchical; chunking) and a
network layer. This module is the system layer; the network layer is `mlopt.sim.network` (the only network
model in mlopt). A schedule is a list of `Message`s with dependencies, timed in one of two modes:

* "aware" (congestion-aware): `simulate_transfers`, max-min fair sharing of links, switch ports and NICs.
* "unaware" (congestion-unaware, ASTRA-sim's analytical backend): every message alone on the network. A message
  on a->b takes what a lone message takes in the engine: `alpha_us` of the link plus its bytes at the lowest
  capacity among the resources it crosses (link, both switch ports, both NICs: `lone_costs`), so a message alone
  on an idle network takes the same time in both modes, and "aware" is never faster than "unaware". The time is
  the exact longest path through the dependency DAG, evaluated step by step with numpy (every dependency points
  to an earlier step; a step's start is the max over its dependencies' finishes): for the symmetric algorithms
  this is the sum over steps of the step's slowest message, but asymmetric cases (trees, hierarchical phases,
  mixed link speeds) are exact too. 1024-rank ring allreduce (2 x 1023 steps x 1024 messages, 4 MiB): about
  0.25 s to build and time on ring:1024 (0.5 s on switch:1024, whose million links take a while to tabulate);
  bidirectional-ring (2048 messages a step) about 0.4 s (1 s). Caches: schedules per (collective, algorithm, p,
  dims, splits); the link table and per-message costs per Topology object (by identity, so always exact; the
  cache keeps a few topologies alive), so timing the same collective at another size redoes only the longest
  path (about 0.1 s for the 1024-rank ring, 0.2 s bidirectional). `cached_collective_time` memoises whole
  results.

Sizes follow nccl-tests (S = `nbytes`): allreduce, broadcast, reduce: the buffer; allgather, alltoall: the
output per rank; reducescatter: the input per rank. The group is `ranks` (topology ranks, in order); messages
name topology ranks. Broadcast and reduce are rooted at `ranks[0]`.

Algorithms (p ranks; "block" = S/p; in every schedule a rank sends data only after the messages that wrote it
have arrived, and a message that writes into a rank's buffer is ordered after that rank's earlier use of it,
which `verify_schedule` checks together with the collective's postcondition). Ranks run their steps in order:
a ring member's step-t send also waits for its own step t-1 send (one message in flight per rank and ring, as
in an NCCL ring channel; a bidirectional ring is two channels), a halving-doubling send for all the rank's
earlier messages; without that, a rank with a fast incoming and a slow outgoing link would queue messages on
the slow link for free in unaware mode.

| algorithm          | collectives              | schedule                                                          |
|--------------------|--------------------------|-------------------------------------------------------------------|
| ring               | all six                  | RS/AG: p-1 steps, rank i sends one block to i+1; allreduce RS+AG;  |
|                    |                          | alltoall: store-and-forward, step k carries p-k blocks; broadcast/ |
|                    |                          | reduce: a chain of p-1 whole-buffer messages (pipelines w. splits) |
| bidirectional-ring | allreduce, reducescatter,| NCCL/ASTRA-sim: every block halved; one half runs the ring schedule |
|                    | allgather                | around 0->1->...->p-1->0, the other around 0->p-1->...->1->0, at    |
|                    |                          | once (each direction its own ring channel; on a ring or torus each  |
|                    |                          | uses its own links, except rings of 2, whose halves share the link) |
| direct             | all six                  | every rank sends its piece to every peer at once (allreduce: RS,   |
|                    |                          | then AG); broadcast/reduce: root to/from every rank                 |
| halving-doubling   | all six, p a power of 2  | recursive halving RS, recursive doubling AG (Rabenseifner);        |
|                    |                          | alltoall: hypercube exchange of p/2 blocks per step; broadcast:    |
|                    |                          | binomial scatter + AG; reduce: RS + binomial gather                |
| double-binary-tree | allreduce, broadcast,    | NCCL's two complementary trees (ncclGetDtree), half the data each:  |
|                    | reduce                   | reduce up, broadcast down; broadcast/reduce on tree 0 only         |
| hierarchical       | allreduce, reducescatter,| ASTRA-sim multi-phase over dims (d0, d1, ...), d0 fastest: allreduce|
|                    | allgather                | = RS dim0, AR dim1, AR dim2, ..., AG dim0 (each a ring in its dim   |
|                    |                          | group, on the shard); RS = RS dim0, dim1, ...; AG = AG ..., dim0    |
| hierarchical-      | allreduce, reducescatter,| hierarchical with every per-dim ring bidirectional (as above)      |
| bidirectional      | allgather                |                                                                    |

`splits` (ASTRA-sim's chunking): the collective is cut into `splits` equal chunks, each running the whole
algorithm. Chunks are independent schedules sharing the network, except that a rank sends its chunks in order:
chunk k+1's copy of a message waits for chunk k's copy of the same message. That makes chunks pipeline (a
chained broadcast with k chunks takes (p-1+k-1) hops of S/k); in unaware mode chunks on one link do not slow
each other, so only "aware" shows the cost of sharing.

Shapes (ring hops, direct pairs, NCCL's trees, halving-doubling exchanges, per-dimension groups) come from
`mlopt.sim.collective_shapes`, which the collective planner's baselines build on too.

Phase boundaries that need several messages (direct allreduce, hierarchical phases) go through zero-byte
local "join" messages (src == dst), which `simulate_transfers` runs as free local tasks; they are not counted
as messages.

Permute (XLA's collective-permute) has no algorithm to choose: every (source, destination) pair is one message
of the whole S bytes, all sent at once (`permute_messages`, label "direct"). `permute_time` times them together
with fair sharing ("aware") whatever the mode: the sends of one permute are simultaneous, so sources or
destinations behind one NIC (ndv2: one NIC for 8 GPUs) really do split its bandwidth, and timing each message
alone would call such a permute as fast as a single send. The schedule planner prices permute motifs the same
way, so plans and simulation agree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from mlopt.errors import InputError
from mlopt.formats.msccl import Program
from mlopt.formats.msccl_xml import load_program
from mlopt.formats.topology import Topology
from mlopt.formats.trace import pairs_problem
from mlopt.sim.collective_shapes import (
    direct_pairs,
    double_binary_tree,
    grid_groups,
    recursive_doubling,
    recursive_halving,
    ring_hops,
    subtree_heights,
    tree_height,
)
from mlopt.sim.collectives import CollectiveSpec, Symbol, combine, postcondition_problems
from mlopt.sim.network import DEFAULT_LOCAL_GBPS, Message, call_overhead_us, simulate_program, simulate_transfers

ALGORITHMS = ("ring", "bidirectional-ring", "direct", "halving-doubling", "double-binary-tree", "hierarchical",
              "hierarchical-bidirectional")
HIERARCHICAL = ("hierarchical", "hierarchical-bidirectional")  # the algorithms that take dims
MODES = ("unaware", "aware", "fifo")  # no sharing / fair sharing / one message at a time per link
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "reduce")
SUPPORTED: Mapping[str, tuple[str, ...]] = MappingProxyType({  # algorithm -> collectives it implements
    "ring": COLLECTIVES,
    "bidirectional-ring": ("allreduce", "reducescatter", "allgather"),
    "direct": COLLECTIVES,
    "halving-doubling": COLLECTIVES,
    "double-binary-tree": ("allreduce", "broadcast", "reduce"),
    "hierarchical": ("allreduce", "reducescatter", "allgather"),
    "hierarchical-bidirectional": ("allreduce", "reducescatter", "allgather"),
})
_SCHEDULE_CACHE = 32  # schedules kept by _schedule (a 1024-rank ring allreduce holds about 50 MB)


@dataclass(frozen=True)
class CollectiveTiming:
    time_us: float
    algorithm: str  # what ran, e.g. "ring", "hierarchical(2x4x4)", "xml:ag.xml"
    messages: int  # point-to-point messages in the schedule (local joins excluded)
    bytes_sent: float  # over all ranks


# ---------------------------------------------------------------------------------------------------------
# Schedules: steps of messages in numpy arrays (message indices are global and numbered step by step)


@dataclass(frozen=True, eq=False)
class _Step:
    """Messages that may run together: every dependency points into an earlier step.

    src, dst: group indices (positions in `ranks`); deps: (m, k) global message indices, -1 for none;
    width: pieces per message (bytes = width * piece bytes; 0 for joins); op: what the receiver does with the
    pieces ("reduce" adds them, "copy" overwrites) or "join" (a local ordering point, src == dst, no data);
    pieces: builds the (m, width) piece ids on demand (symbolic checks only, so big schedules stay cheap).
    """

    src: np.ndarray
    dst: np.ndarray
    deps: np.ndarray
    width: int
    op: str
    pieces: Callable[[], np.ndarray] | None
    phase: str


@dataclass(frozen=True, eq=False)
class _Schedule:
    """A collective's schedule on p ranks in `splits` chunks.

    Pieces: ids 0 .. splits * space - 1, chunk k owning [k * space, (k + 1) * space); a piece is
    `piece_fraction` of nbytes. Within a chunk, `layout` says what a piece is: "buffer" (allreduce,
    broadcast, reduce: a slice of the one buffer), "blocks" (reducescatter, allgather: piece // q is the
    rank whose block it is), "pairs" (alltoall: piece // q = origin * p + destination).
    """

    collective: str
    p: int
    steps: tuple[_Step, ...]
    offsets: np.ndarray  # global index of each step's first message; offsets[-1] = total
    piece_fraction: float
    space: int
    layout: str
    q: int
    splits: int

    @property
    def size(self) -> int:
        return int(self.offsets[-1])


class _Builder:
    """Collects steps during one schedule's construction and numbers their messages."""

    def __init__(self) -> None:
        self.steps: list[_Step] = []
        self.count = 0

    def add(self, src, dst, deps, width: int, op: str, pieces: Callable[[], np.ndarray] | None,
            phase: str) -> np.ndarray:
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        m = len(src)
        if deps is None:
            deps = np.empty((m, 0), dtype=np.int64)
        else:
            deps = np.asarray(deps, dtype=np.int64).reshape(m, -1)
        for a in (src, dst, deps):
            a.setflags(write=False)  # schedules are cached and shared
        self.steps.append(_Step(src, dst, deps, int(width), op, pieces, phase))
        idx = np.arange(self.count, self.count + m, dtype=np.int64)
        self.count += m
        return idx

    def join(self, into: np.ndarray, previous: np.ndarray | None, phase: str) -> np.ndarray:
        """One local join per rank after everything in `into` (p, k) and the rank's previous join."""
        p = into.shape[0]
        deps = into if previous is None else np.hstack([into, previous[:, None]])
        return self.add(np.arange(p), np.arange(p), deps, 0, "join", None, phase)


def _pad(rows: Sequence[Sequence[int]]) -> np.ndarray:
    """Dependency lists -> (m, k) array padded with -1."""
    k = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), k), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def _lazy(fn: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """fn, computed once on first call (piece tables shared by the steps of a phase)."""
    return functools.cache(fn)


# ---------------------------------------------------------------------------------------------------------
# Ring phases (flat rings and the per-dimension rings of the hierarchical algorithm)


def _ring_pieces(parts: Callable[[], np.ndarray], gi: np.ndarray, pos: np.ndarray, shift: int,
                 d: int) -> np.ndarray:
    return parts()[gi, (pos - shift) % d]


def _ring_phase(b: _Builder, rings: np.ndarray, parts: Callable[[], np.ndarray], width: int, kind: str,
                first_deps: np.ndarray | None, recv_deps: np.ndarray | None, phase: str) -> np.ndarray:
    """Reduce-scatter ("rs") or all-gather ("ag") around every ring of a family at once.

    rings: (G, d) group indices, each row a ring in order; member j sends to member j+1. parts(): (G, d, w)
    piece ids, part k of ring g's data. RS step t: member j sends part j-t-1 (reduce), so member j ends with
    part j reduced over its ring; AG step t: member j sends part j-t (copy), starting with its own part j.
    A member's step-t send waits for its step t-1 receipt (the data it forwards) and for its own step t-1
    send (a rank runs its steps in order: one message in flight per rank and ring, as NCCL's ring channel;
    without it a rank with a fast incoming and a slow outgoing link would pile messages onto the slow link,
    free of charge in unaware mode); its first send waits for
    `first_deps` (aligned with rings.ravel()), and every message for `recv_deps` of its receiver (the
    receiver's join: it has finished its previous phase before its buffer is written).
    Returns two (G * d, d - 1) arrays, rows in rings.ravel() order: the message into and the message from each
    member at each step.
    """
    G, d = rings.shape
    src = rings.ravel()
    dst = np.roll(rings, -1, axis=1).ravel()
    pos = np.tile(np.arange(d), G)
    gi = np.repeat(np.arange(G), d)
    pred = gi * d + (pos - 1) % d
    succ = gi * d + (pos + 1) % d
    extra = None if recv_deps is None else recv_deps[succ].reshape(G * d, -1)
    into = np.empty((G * d, d - 1), dtype=np.int64)
    out = np.empty((G * d, d - 1), dtype=np.int64)
    shift = 1 if kind == "rs" else 0
    op = "reduce" if kind == "rs" else "copy"
    prev_into = None
    for t in range(d - 1):
        deps = first_deps if t == 0 else np.stack([prev_into, out[:, t - 1]], axis=1)
        if extra is not None:
            deps = extra if deps is None else np.hstack([deps, extra])
        pieces = functools.partial(_ring_pieces, parts, gi, pos, t + shift, d)
        idx = b.add(src, dst, deps, width, op, pieces, f"{phase} step {t}")
        prev_into = idx[pred]
        into[:, t] = prev_into
        out[:, t] = idx
    return into, out


def _by_rank(rings: np.ndarray, per_member: np.ndarray) -> np.ndarray:
    """Rows aligned with rings.ravel() -> rows indexed by group index. When the rings cover every rank r
    times (r = 2 for bidirectional rings), a rank's r rows are put side by side, in ring-family order."""
    flat = rings.ravel()
    p = int(flat.max()) + 1
    order = np.argsort(flat, kind="stable")
    return per_member[order].reshape(p, -1)


def _two_way(rings: np.ndarray) -> np.ndarray:
    """(G, d) rings -> (2G, d): the rings as they are, then each of them run the other way round (member j
    of the reverse ring is member -j mod d of the forward one: same members, every link reversed)."""
    d = rings.shape[1]
    return np.vstack([rings, rings[:, (-np.arange(d)) % d]])


def _two_way_parts(parts: Callable[[], np.ndarray], d: int) -> np.ndarray:
    """(G, d, w) block ids -> (2G, d, w) piece ids for `_two_way` rings: half h of block x is piece 2x + h;
    the forward rings carry the first halves, the reverse rings the second halves, and part j of a reverse
    ring is the part of the member it names (forward part -j mod d), so both directions end with the same
    member owning the same block."""
    blocks = parts()
    return np.concatenate([2 * blocks, 2 * blocks[:, (-np.arange(d)) % d] + 1], axis=0)


# ---------------------------------------------------------------------------------------------------------
# Algorithms: each builds one chunk's schedule on p ranks


def _ring(b: _Builder, collective: str, p: int) -> tuple[int, str, int]:
    """Returns (space, layout, q); piece fraction = 1 / (space for buffers, p * q for blocks and pairs)."""
    rings = np.arange(p)[None, :]
    parts = _lazy(lambda: np.arange(p).reshape(1, p, 1))
    if collective in ("allreduce", "reducescatter", "allgather"):
        first = None
        if collective != "allgather":
            into, out = _ring_phase(b, rings, parts, 1, "rs", None, None, "ring rs")
            first = np.stack([into[:, -1], out[:, -1]], axis=1)  # its own block is reduced; its last send left
        if collective != "reducescatter":
            _ring_phase(b, rings, parts, 1, "ag", first, None, "ring ag")
        return (p, "buffer", 1) if collective == "allreduce" else (p, "blocks", 1)
    if collective == "alltoall":
        r = np.arange(p)
        src, dst = r, (r + 1) % p
        prev = None
        for k in range(1, p):
            deps = None if prev is None else np.stack([prev[(r - 1) % p], prev], axis=1)  # data, own order

            def pieces(k=k):
                origin = (r - k + 1) % p
                dest = (r[:, None] + 1 + np.arange(p - k)[None, :]) % p
                return origin[:, None] * p + dest

            prev = b.add(src, dst, deps, p - k, "copy", pieces, f"ring alltoall step {k - 1}")
        return p * p, "pairs", 1
    # broadcast: root 0 -> 1 -> ... -> p-1; reduce: 1 -> 2 -> ... -> p-1 -> 0
    hops = ring_hops(range(p), 0 if collective == "broadcast" else 1, p - 1)
    op = "copy" if collective == "broadcast" else "reduce"
    prev = None
    for t, (a, c) in enumerate(hops):
        deps = None if prev is None else prev[:, None]
        prev = b.add([a], [c], deps, 1, op, lambda: np.zeros((1, 1), dtype=np.int64), f"ring {collective} hop {t}")
    return 1, "buffer", 1


def _bidirectional_ring(b: _Builder, collective: str, p: int) -> tuple[int, str, int]:
    """NCCL/ASTRA-sim bidirectional ring: every block split in two halves; the first halves run `_ring`'s
    schedule around 0 -> 1 -> ... -> p-1 -> 0, the second halves the same schedule around the reverse ring
    0 -> p-1 -> ... -> 1 -> 0, at the same time (one `_ring_phase` over both rings: step t holds both
    directions' step-t messages, 2p of them). Each direction is its own ring channel (one message in
    flight per rank and direction); the two never touch the same piece, so they need no ordering."""
    rings = _two_way(np.arange(p)[None, :])
    parts = _lazy(functools.partial(_two_way_parts, lambda: np.arange(p).reshape(1, p, 1), p))
    first = None
    if collective != "allgather":
        into, out = _ring_phase(b, rings, parts, 1, "rs", None, None, "bidirectional ring rs")
        first = np.stack([into[:, -1], out[:, -1]], axis=1)
    if collective != "reducescatter":
        _ring_phase(b, rings, parts, 1, "ag", first, None, "bidirectional ring ag")
    return (2 * p, "buffer", 1) if collective == "allreduce" else (2 * p, "blocks", 2)


def _direct(b: _Builder, collective: str, p: int) -> tuple[int, str, int]:
    if collective in ("broadcast", "reduce"):
        peers = np.arange(1, p)
        one = _lazy(lambda: np.zeros((p - 1, 1), dtype=np.int64))
        if collective == "broadcast":
            b.add(np.zeros(p - 1), peers, None, 1, "copy", one, "direct broadcast")
        else:
            b.add(peers, np.zeros(p - 1), None, 1, "reduce", one, "direct reduce")
        return 1, "buffer", 1
    # message (i, o): rank i to rank (i + 1 + o) % p, o = 0 .. p-2
    src, dst = direct_pairs(p)
    if collective == "alltoall":
        b.add(src, dst, None, 1, "copy", lambda: (src * p + dst)[:, None], "direct alltoall")
        return p * p, "pairs", 1
    layout = ("buffer" if collective == "allreduce" else "blocks")
    if collective in ("reducescatter", "allreduce"):
        rs = b.add(src, dst, None, 1, "reduce", lambda: dst[:, None], "direct rs")
        if collective == "reducescatter":
            return p, layout, 1
        j = np.arange(p)
        into = ((j[:, None] - 1 - np.arange(p - 1)[None, :]) % p) * (p - 1) + np.arange(p - 1)[None, :]
        joins = b.join(np.hstack([rs[into], rs.reshape(p, p - 1)]), None, "direct rs done")  # in and out
        b.add(src, dst, joins[src][:, None], 1, "copy", lambda: src[:, None], "direct ag")
        return p, layout, 1
    b.add(src, dst, None, 1, "copy", lambda: src[:, None], "direct ag")  # allgather
    return p, layout, 1


def _is_power_of_two(p: int) -> bool:
    return p >= 1 and p & (p - 1) == 0


def _halving_doubling(b: _Builder, collective: str, p: int) -> tuple[int, str, int]:
    """Every send waits for all the sender's earlier messages, in and out: its data may come from any earlier
    step, and a rank runs its steps in order (the root of a broadcast does not start the all-gather while
    its scatter is still on the wire)."""
    L = p.bit_length() - 1
    ranks = np.arange(p)
    history: list[np.ndarray] = []  # per step: (p,) message into each rank, then from each rank; -1 where none

    def deps_all(senders: np.ndarray) -> np.ndarray | None:
        return np.hstack([h.reshape(p, -1) for h in history])[senders] if history else None

    def exchange(d: int, pieces: Callable[[], np.ndarray], width: int, op: str, phase: str) -> None:
        partner = ranks ^ d
        idx = b.add(ranks, partner, deps_all(ranks), width, op, pieces, phase)
        history.extend([idx[partner], idx])

    def halving() -> None:  # recursive halving RS: rank i ends with block i
        for t, (d, start) in enumerate(recursive_halving(p)):
            exchange(d, lambda start=start, d=d: start[:, None] + np.arange(d)[None, :], d, "reduce",
                     f"hd rs step {t}")

    def doubling() -> None:  # recursive doubling AG: rank i starts with block i
        for t, (d, start) in enumerate(recursive_doubling(p)):
            exchange(d, lambda start=start, d=d: start[:, None] + np.arange(d)[None, :], d, "copy",
                     f"hd ag step {t}")

    if collective == "alltoall":
        for t in range(L):
            d = 1 << t

            def pieces(t=t, d=d):
                origin = ((ranks >> t) << t)[:, None] + np.arange(d)[None, :]
                dest = ((ranks & (d - 1)) | (~ranks & d))[:, None] + (np.arange(p >> (t + 1)) << (t + 1))[None, :]
                return (origin[:, :, None] * p + dest[:, None, :]).reshape(p, p // 2)

            exchange(d, pieces, p // 2, "copy", f"hd alltoall step {t}")
        return p * p, "pairs", 1
    if collective in ("reducescatter", "allreduce", "reduce"):
        halving()
    if collective in ("allgather", "allreduce"):
        doubling()
    if collective == "broadcast":  # binomial scatter from rank 0, then recursive doubling
        into: list[list[int]] = [[] for _ in range(p)]
        for t in range(L):
            d = p >> (t + 1)
            senders = np.arange(0, p, 2 * d)
            idx = b.add(senders, senders + d, _pad([into[s] for s in senders]), d, "copy",
                        lambda s=senders, d=d: (s + d)[:, None] + np.arange(d)[None, :], f"hd scatter step {t}")
            for s, k in zip(senders, idx):
                into[s + d].append(int(k))
                into[s].append(int(k))  # its own send
        history.append(_pad(into).reshape(p, -1) if any(into) else np.full((p, 1), -1, dtype=np.int64))
        doubling()
    if collective == "reduce":  # binomial gather to rank 0 after the halving
        for t in range(L):
            d = 1 << t
            senders = np.arange(d, p, 2 * d)
            idx = b.add(senders, senders - d, deps_all(senders), d, "copy",
                        lambda s=senders, d=d: s[:, None] + np.arange(d)[None, :], f"hd gather step {t}")
            got = np.full((p, 2), -1, dtype=np.int64)
            got[senders - d, 0] = idx
            got[senders, 1] = idx
            history.append(got)
    return p, ("blocks" if collective in ("reducescatter", "allgather") else "buffer"), 1


def _double_binary_tree(b: _Builder, collective: str, p: int) -> tuple[int, str, int]:
    """Tree t carries piece t (allreduce: half the buffer each; broadcast/reduce: tree 0, the whole buffer).

    Up (reduce): a node sends to its parent once all its children's messages have arrived; steps are
    heights. Down (copy): the root sends once the up phase reached it, a node forwards once its parent's
    message arrived; steps are depths.
    """
    trees = list(double_binary_tree(p)) if collective == "allreduce" else [double_binary_tree(p)[0]]
    children: list[list[list[int]]] = [[[] for _ in range(p)] for _ in trees]
    for kids, par in zip(children, trees):
        for c in range(p):
            if par[c] != -1:
                kids[par[c]].append(c)
    height = [subtree_heights(kids, par.index(-1)) for kids, par in zip(children, trees)]
    up_into: list[list[list[int]]] = [[[] for _ in range(p)] for _ in trees]
    if collective in ("allreduce", "reduce"):
        for level in range(max(max(h) for h in height)):
            items = [(t, r) for t, par in enumerate(trees) for r in range(p) if par[r] != -1 and height[t][r] == level]
            if not items:
                continue
            idx = b.add([r for _, r in items], [trees[t][r] for t, r in items], _pad([up_into[t][r] for t, r in items]),
                        1, "reduce", lambda items=items: np.array([[t] for t, _ in items]), f"tree up level {level}")
            for (t, r), k in zip(items, idx):
                up_into[t][trees[t][r]].append(int(k))
    if collective in ("allreduce", "broadcast"):
        down_into: list[list[list[int]]] = [[[] for _ in range(p)] for _ in trees]
        frontier = [(t, par.index(-1)) for t, par in enumerate(trees)]
        level = 0
        while frontier:
            items = [(t, r, c) for t, r in frontier for c in children[t][r]]
            if not items:
                break
            deps = [down_into[t][r] or up_into[t][r] for t, r, _ in items]
            idx = b.add([r for _, r, _ in items], [c for *_, c in items], _pad(deps), 1, "copy",
                        lambda items=items: np.array([[t] for t, _, _ in items]), f"tree down level {level}")
            for (t, _, c), k in zip(items, idx):
                down_into[t][c].append(int(k))
            frontier = [(t, c) for t, _, c in items]
            level += 1
    return len(trees), "buffer", 1


def _coords(p: int, dims: tuple[int, ...]) -> np.ndarray:
    """(len(dims), p): mixed-radix coordinates of every group index, dim 0 fastest."""
    out = np.empty((len(dims), p), dtype=np.int64)
    r = np.arange(p)
    for k, d in enumerate(dims):
        out[k] = r % d
        r = r // d
    return out


def _dim_rings(p: int, dims: tuple[int, ...], k: int) -> np.ndarray:
    """(p / d_k, d_k): the rings along dim k, members ordered by their dim-k coordinate."""
    return grid_groups(np.arange(p).reshape(dims[::-1]), k)


def _dim_parts(p: int, dims: tuple[int, ...], rings: np.ndarray, k: int, agree: tuple[int, ...]) -> np.ndarray:
    """(G, d_k, w) blocks: part j of ring g = blocks whose dim-k coordinate is j and that share the ring's
    coordinates on the dims in `agree` (what its members hold at that phase)."""
    c = _coords(p, dims)
    G, d = rings.shape
    head = rings[:, 0]
    mask = np.ones((G, d, p), dtype=bool)
    for a in agree:
        mask &= (c[a][None, None, :] == c[a][head][:, None, None])
    mask &= c[k][None, None, :] == np.arange(d)[None, :, None]
    w = int(mask[0, 0].sum())
    return np.nonzero(mask.reshape(G * d, p))[1].reshape(G, d, w)


def _hierarchical(b: _Builder, collective: str, p: int, dims: tuple[int, ...],
                  two_way: bool = False) -> tuple[int, str, int]:
    """ASTRA-sim's multi-phase collectives, every phase a ring inside its dimension group (dims of size 1
    skipped). Phases meet at per-rank joins (after every message into and from the rank in the phase): a
    phase's first send waits for the sender's join and every message for its receiver's join.

    two_way ("hierarchical-bidirectional"): every per-dimension ring is bidirectional (`_two_way`: half of
    each block one way round, half the other way, at once); pieces are then half-blocks (2x + h)."""
    joins: np.ndarray | None = None
    live = [k for k, d in enumerate(dims) if d > 1]

    def phase(k: int, kind: str, agree: tuple[int, ...], name: str, allreduce: bool = False) -> None:
        nonlocal joins
        rings = _dim_rings(p, dims, k)
        parts = _lazy(functools.partial(_dim_parts, p, dims, rings, k, agree))
        if two_way:
            parts = _lazy(functools.partial(_two_way_parts, parts, dims[k]))
            rings = _two_way(rings)
        width = p // int(np.prod([dims[a] for a in agree], dtype=np.int64)) // dims[k]
        member = rings.ravel()
        first = None if joins is None else joins[member][:, None]
        recv = None if joins is None else joins[member][:, None]
        into, out = _ring_phase(b, rings, parts, width, kind, first, recv, f"{name} {kind}")
        if allreduce:
            last = np.stack([into[:, -1], out[:, -1]], axis=1)
            into2, out2 = _ring_phase(b, rings, parts, width, "ag", last, recv, f"{name} ag")
            into, out = np.hstack([into, into2]), np.hstack([out, out2])
        joins = b.join(_by_rank(rings, np.hstack([into, out])), joins, f"{name} done")

    if collective == "allreduce":
        first_dim = 0 if dims[0] > 1 else None
        if first_dim is not None:
            phase(0, "rs", (), "dim 0")
        for k in live:
            if k != 0:
                phase(k, "rs", (0,), f"dim {k}", allreduce=True)
        if first_dim is not None:
            phase(0, "ag", (), "dim 0")
        return (2 * p, "buffer", 1) if two_way else (p, "buffer", 1)
    if collective == "reducescatter":
        for k in live:
            phase(k, "rs", tuple(range(k)), f"dim {k}")
    else:  # allgather: slow dims first, the fast dim 0 carries the most data last
        for k in reversed(live):
            phase(k, "ag", tuple(range(k)), f"dim {k}")
    return (2 * p, "blocks", 2) if two_way else (p, "blocks", 1)


# ---------------------------------------------------------------------------------------------------------
# Building, chunking and caching schedules


def _check_algorithm(collective: str, algorithm: str, p: int, dims: tuple[int, ...] | None) -> None:
    if collective == "permute":  # its time depends on its pairs, which a schedule keyed on p cannot know
        raise ValueError("a permute has no algorithm schedule: time it with permute_time(pairs, nbytes, topology)")
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if algorithm not in SUPPORTED:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)} or xml:PATH")
    if collective not in SUPPORTED[algorithm]:
        raise ValueError(f"algorithm {algorithm!r} does not implement {collective}; it does "
                         f"{', '.join(SUPPORTED[algorithm])}")
    if p < 1:
        raise ValueError(f"{algorithm} {collective}: needs at least one rank")
    if algorithm == "halving-doubling" and not _is_power_of_two(p):
        raise ValueError(f"algorithm 'halving-doubling' ({collective}) needs a power-of-two group, got {p} ranks")
    if algorithm in HIERARCHICAL:
        if dims is None:
            raise ValueError(f"algorithm {algorithm!r} ({collective}) needs dims (or a torus topology)")
        if any(d < 1 for d in dims) or math.prod(dims) != p:
            raise ValueError(f"algorithm {algorithm!r} ({collective}): dims {tuple(dims)} do not multiply to the "
                             f"group's {p} ranks")


def _split(s: _Schedule, k: int) -> _Schedule:
    """k chunks of s: step (i, chunk c) = step i with pieces shifted by c * space; chunk c's message waits for
    chunk c-1's copy of it. Steps are ordered (i, c), so dependencies still point into earlier steps."""
    if k == 1:
        return s
    offs = s.offsets
    sizes = np.diff(offs)
    new_off = np.concatenate([[0], np.cumsum(np.repeat(sizes, k))]).astype(np.int64)
    base = new_off[:-1].reshape(len(s.steps), k)  # global index of step (i, c)'s first message
    b = _Builder()
    for i, st in enumerate(s.steps):
        m = len(st.src)
        if st.deps.shape[1]:
            valid = st.deps >= 0
            g = np.where(valid, st.deps, 0)
            si = np.searchsorted(offs, g, side="right") - 1
            within = g - offs[si]
        for c in range(k):
            cols = []
            if st.deps.shape[1]:
                cols.append(np.where(valid, base[si, c] + within, -1))
            if c:
                cols.append((base[i, c - 1] + np.arange(m))[:, None])
            deps = np.hstack(cols) if cols else None
            pieces = None if st.pieces is None else functools.partial(_shift_pieces, st.pieces, c * s.space)
            b.add(st.src, st.dst, deps, st.width, st.op, pieces, f"{st.phase} chunk {c}")
    return _Schedule(s.collective, s.p, tuple(b.steps), new_off, s.piece_fraction / k, s.space, s.layout, s.q, k)


def _shift_pieces(pieces: Callable[[], np.ndarray], shift: int) -> np.ndarray:
    return pieces() + shift


@functools.lru_cache(maxsize=_SCHEDULE_CACHE)
def _schedule(collective: str, algorithm: str, p: int, dims: tuple[int, ...] | None, splits: int) -> _Schedule:
    """The schedule of one collective on p ranks (group indices), a pure function of its arguments."""
    _check_algorithm(collective, algorithm, p, dims)
    if not (isinstance(splits, int) and splits >= 1):
        raise ValueError(f"splits must be a positive integer, got {splits!r}")
    b = _Builder()
    if p == 1:
        space, layout, q = 1, "buffer", 1
    elif algorithm == "ring":
        space, layout, q = _ring(b, collective, p)
    elif algorithm == "bidirectional-ring":
        space, layout, q = _bidirectional_ring(b, collective, p)
    elif algorithm == "direct":
        space, layout, q = _direct(b, collective, p)
    elif algorithm == "halving-doubling":
        space, layout, q = _halving_doubling(b, collective, p)
    elif algorithm == "double-binary-tree":
        space, layout, q = _double_binary_tree(b, collective, p)
    else:
        space, layout, q = _hierarchical(b, collective, p, tuple(dims), two_way=algorithm != "hierarchical")
    offsets = np.concatenate([[0], np.cumsum([len(st.src) for st in b.steps], dtype=np.int64)]).astype(np.int64)
    fraction = 1.0 / space if layout == "buffer" else 1.0 / (p * q)
    one = _Schedule(collective, p, tuple(b.steps), offsets, fraction, space, layout, q, 1)
    return _split(one, splits)


def _resolve(collective: str, algorithm: str, ranks: Sequence[int], dims: Sequence[int] | None,
             splits: int) -> tuple[_Schedule, np.ndarray]:
    group = np.asarray([int(r) for r in ranks], dtype=np.int64)
    if len(group) == 0:
        raise ValueError("ranks: the group is empty")
    if (group < 0).any() or len(np.unique(group)) != len(group):
        raise ValueError(f"ranks must be distinct non-negative topology ranks, got {list(ranks)[:8]}")
    if int(splits) != splits or splits < 1:
        raise ValueError(f"splits must be a positive integer, got {splits!r}")
    dims_t = None if dims is None else tuple(int(d) for d in dims)
    return _schedule(collective, algorithm, len(group), dims_t, int(splits)), group


def torus_dims(topology: Topology) -> tuple[int, ...] | None:
    """The dims of a generated torus (`torus:4x4x2`, `torus:4x8@400,50`), None for any other topology."""
    if topology.source.get("generator") != "torus":
        return None
    spec = str(topology.source.get("spec", topology.name))
    return tuple(int(x) for x in spec.partition(":")[2].partition("@")[0].split("x"))


def algorithm_name(algorithm: str, dims: Sequence[int] | None) -> str:
    if algorithm in HIERARCHICAL and dims is not None:
        return f"{algorithm}({'x'.join(str(int(d)) for d in dims)})"
    return algorithm


# ---------------------------------------------------------------------------------------------------------
# Public API: messages, times, closed forms


def collective_messages(collective: str, algorithm: str, ranks: Sequence[int], nbytes: float, *,
                        dims: Sequence[int] | None = None, splits: int = 1) -> list[Message]:
    """The collective's schedule as `Message`s over topology ranks `ranks[i]` (for `simulate_transfers`).

    Message k's `deps` are indices into the returned list. Local zero-byte join messages (src == dst) order
    phases. Raises ValueError for an unknown collective or algorithm, or one that does not fit (e.g.
    halving-doubling on a group that is not a power of two, hierarchical dims that do not cover the group).
    """
    if algorithm.startswith("xml:"):
        raise ValueError("an MSCCL-EF program is not a message list: time it with collective_time or program_time")
    s, group = _resolve(collective, algorithm, ranks, dims, splits)
    unit = float(nbytes) * s.piece_fraction
    out: list[Message] = []
    for st in s.steps:
        src = group[st.src].tolist()
        dst = group[st.dst].tolist()
        nb = st.width * unit
        rows = st.deps.tolist()
        label = f"{collective} {algorithm} {st.phase}"
        for a, c, row in zip(src, dst, rows):
            out.append(Message(a, c, nb, tuple(d for d in row if d >= 0), label=label))
    return out


class _Same:
    """Hashable by identity, for caches keyed on one (immutable) Topology object: exact, unlike a name."""

    __slots__ = ("obj",)

    def __init__(self, obj: object):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


@functools.lru_cache(maxsize=4)
def _link_table(topology: _Same) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted src * N + dst, alpha_us, lone rate in bytes/us) over the topology's links."""
    topo: Topology = topology.obj
    links, n, N = topo.links, len(topo.links), topo.num_ranks
    keys = np.fromiter((l.src * N + l.dst for l in links), dtype=np.int64, count=n)
    alpha = np.fromiter((l.alpha_us for l in links), dtype=np.float64, count=n)
    rate = np.fromiter((1e6 / l.beta_us_per_MB for l in links), dtype=np.float64, count=n)
    if topo.switches:
        port = {sw.name: 1e6 / sw.port_beta_us_per_MB for sw in topo.switches}
        rate = np.minimum(rate, np.fromiter((port.get(l.switch, math.inf) for l in links), dtype=np.float64, count=n))
    if topo.nics:
        nic = {x.name: 1e6 / x.beta_us_per_MB for x in topo.nics}
        for attr in ("src_nic", "dst_nic"):
            rate = np.minimum(rate, np.fromiter((nic.get(getattr(l, attr), math.inf) for l in links),
                                                dtype=np.float64, count=n))
    order = np.argsort(keys, kind="stable")
    return keys[order], alpha[order], rate[order]


def lone_costs(topology: Topology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(alpha_us, bytes per us, index of the first pair without a link or -1) for each src->dst message.

    The rate is what `run_tasks` gives a message alone on an idle network: the lowest capacity among the
    resources `NetworkModel.route` makes it cross (the link, its switch's tx and rx ports, the sender's and
    receiver's NICs). Dominated resources left out of the route's rate computation never have the lowest
    capacity, so the minimum over all of them is the same. The link table is cached per Topology object.
    """
    keys, alpha, rate = _link_table(_Same(topology))
    q = np.asarray(src, dtype=np.int64) * topology.num_ranks + np.asarray(dst, dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
    ok = keys[pos] == q if len(keys) else np.zeros(len(q), dtype=bool)
    missing = -1 if ok.all() else int(np.nonzero(~ok)[0][0])
    return np.where(ok, alpha[pos] if len(keys) else 0.0, math.nan), \
        np.where(ok, rate[pos] if len(keys) else 0.0, math.nan), missing


@functools.lru_cache(maxsize=8)
def _message_costs(collective: str, algorithm: str, dims: tuple[int, ...] | None, splits: int,
                   group: tuple[int, ...], topology: _Same) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per message of the schedule on this group and topology: (alpha_us, us per piece-byte, pieces), zero for
    joins; cached so that timing one collective at many sizes only redoes the longest path. Steps that share
    their src and dst arrays (every step of a ring phase, every chunk of a step) are looked up once."""
    topo: Topology = topology.obj
    s = _schedule(collective, algorithm, len(group), dims, splits)
    g = np.asarray(group, dtype=np.int64)
    if (g >= topo.num_ranks).any():
        bad = int(g[g >= topo.num_ranks][0])
        raise InputError("<messages>", "ranks", f"topology rank {bad} outside 0..{topo.num_ranks - 1} "
                         f"of {topo.name!r}")
    n = s.size
    if n == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    seen: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (id(src), id(dst)) -> (alpha, 1 / rate)
    alphas, invs = [], []
    for st, off in zip(s.steps, s.offsets[:-1].tolist()):
        if st.op == "join":
            zero = np.zeros(len(st.src))
            alphas.append(zero)
            invs.append(zero)
            continue
        key = (id(st.src), id(st.dst))  # the step holds both arrays, so their ids stay theirs meanwhile
        if key not in seen:
            src, dst = g[st.src], g[st.dst]
            a, r, missing = lone_costs(topo, src, dst)
            if missing >= 0:
                x, y = int(src[missing]), int(dst[missing])
                raise InputError("<messages>", f"message {off + missing}",
                                 f"rank {x}->{y}: topology {topo.name!r} has no link {x}->{y}")
            seen[key] = (a, 1.0 / r)
        a, inv_r = seen[key]
        alphas.append(a)
        invs.append(inv_r)
    alpha, inv = np.concatenate(alphas), np.concatenate(invs)
    width = np.repeat(np.array([st.width if st.op != "join" else 0 for st in s.steps], dtype=np.float64),
                      np.diff(s.offsets))
    for arr in (alpha, inv, width):
        arr.setflags(write=False)
    return alpha, inv, width


def _unaware(collective: str, algorithm: str, dims: tuple[int, ...] | None, splits: int, group: tuple[int, ...],
             nbytes: float, topology: Topology) -> tuple[float, int, float]:
    """Longest path through the schedule's DAG with every message alone: (time, messages, bytes)."""
    s = _schedule(collective, algorithm, len(group), dims, splits)
    alpha, inv, width = _message_costs(collective, algorithm, dims, splits, group, _Same(topology))
    n = s.size
    if n == 0:
        return 0.0, 0, 0.0
    unit = float(nbytes) * s.piece_fraction
    dur = alpha + width * (unit * inv)
    finish = np.zeros(n + 1)  # finish[-1] stays 0: where the -1 padding of deps points
    for st, off in zip(s.steps, s.offsets[:-1].tolist()):
        m = len(st.src)
        start = finish[st.deps].max(axis=1) if st.deps.shape[1] else 0.0
        finish[off:off + m] = start + dur[off:off + m]
    return float(finish[:n].max()), int(np.count_nonzero(inv)), float(width.sum() * unit)


def collective_time(collective: str, algorithm: str, ranks: Sequence[int], nbytes: float, topology: Topology, *,
                    mode: str = "unaware", dims: Sequence[int] | None = None, splits: int = 1) -> CollectiveTiming:
    """Time of one collective on `topology` over the group `ranks` (topology ranks).

    mode "aware": `simulate_transfers` on `collective_messages` (fair sharing of links, ports, NICs).
    mode "fifo": the same, but each link, port and NIC carries one message at a time, first come first served
    (ASTRA-sim's congestion-aware analytical network; `network.run_tasks_fifo`).
    mode "unaware": every message alone (see the module docstring), fast enough for 1024-rank groups.
    algorithm "xml:PATH": an MSCCL-EF program (see `program_time`); its collective must match.
    hierarchical(-bidirectional) without dims: the dims of a torus topology (the group must be the whole torus).
    Raises InputError when the schedule needs a link the topology lacks, ValueError for bad arguments.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if algorithm.startswith("xml:"):
        path = algorithm[4:]
        program = load_program(path)
        if program.coll != collective:
            raise ValueError(f"{path}: the program is a {program.coll}, not a {collective}")
        timing = program_time(program, topology, nbytes, mode, ranks=ranks)
        return CollectiveTiming(timing.time_us, algorithm, timing.messages, timing.bytes_sent)
    if algorithm in HIERARCHICAL and dims is None:
        dims = torus_dims(topology)
        if dims is None:
            raise ValueError(f"algorithm {algorithm!r} needs dims: topology {topology.name!r} is not a torus")
    s, group = _resolve(collective, algorithm, ranks, dims, splits)
    name = algorithm_name(algorithm, dims)
    overhead = call_overhead_us(topology, len(group))  # simulate_program adds it to the XML path above
    if mode == "unaware":
        dims_t = None if dims is None else tuple(int(d) for d in dims)
        time_us, count, sent = _unaware(collective, algorithm, dims_t, int(splits), tuple(group.tolist()), nbytes,
                                        topology)
        return CollectiveTiming(time_us + overhead, name, count, sent)
    res = simulate_transfers(collective_messages(collective, algorithm, ranks, nbytes, dims=dims, splits=splits),
                             topology, sharing=_SHARING[mode])
    return CollectiveTiming(res.time_us + overhead, name, res.num_messages, res.bytes_sent)


_SHARING = {"unaware": "fair", "aware": "fair", "fifo": "fifo"}  # engine of each mode (unaware: no sharing)


class _TopologyKey:
    """Hashable stand-in for a Topology in the cache: equal when name, rank count and link count are."""

    __slots__ = ("topology", "key")

    def __init__(self, topology: Topology):
        self.topology = topology
        self.key = (topology.name, topology.num_ranks, len(topology.links), topology.call_overhead_us,
                    topology.reduce_GBps)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TopologyKey) and self.key == other.key


@functools.lru_cache(maxsize=4096)
def _cached_time(collective: str, algorithm: str, ranks: tuple[int, ...], nbytes: float, topology: _TopologyKey,
                 mode: str, dims: tuple[int, ...] | None, splits: int) -> CollectiveTiming:
    return collective_time(collective, algorithm, ranks, nbytes, topology.topology, mode=mode, dims=dims,
                           splits=splits)


def cached_collective_time(collective: str, algorithm: str, ranks: Sequence[int], nbytes: float,
                           topology: Topology, *, mode: str = "unaware", dims: Sequence[int] | None = None,
                           splits: int = 1) -> CollectiveTiming:
    """`collective_time` memoised on (collective, algorithm, ranks, nbytes, topology, mode, dims, splits).

    Topologies are told apart by (name, rank count, link count), not by content: two different topologies
    with the same name and sizes in one process would share entries (use `collective_time` for those).
    """
    return _cached_time(collective, algorithm, tuple(int(r) for r in ranks), float(nbytes), _TopologyKey(topology),
                        mode, None if dims is None else tuple(int(d) for d in dims), int(splits))


def program_time(program: Program, topology: Topology, nbytes: float, mode: str = "unaware", *,
                 ranks: Sequence[int] | None = None) -> CollectiveTiming:
    """An MSCCL-EF program's time: `simulate_program` with (aware) or without (unaware) bandwidth sharing.

    ranks: topology rank of each program rank (default 0..ngpus-1).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if ranks is not None and len(ranks) != program.ngpus:
        raise ValueError(f"{program.name or '<program>'}: {program.ngpus} ranks but a group of {len(ranks)}")
    res = simulate_program(program, topology, nbytes, rank_map=None if ranks is None else list(ranks),
                           congestion_aware=mode != "unaware", sharing=_SHARING[mode])
    return CollectiveTiming(res.time_us, f"xml:{program.name}", res.num_messages, res.bytes_sent)


def transfer_time(messages: Sequence[Message], topology: Topology, mode: str = "unaware", *,
                  model=None) -> float:
    """Time of any message list (deps: indices into the list, pointing backwards for "unaware").

    "aware": `simulate_transfers`; "unaware": longest path with every message alone (release_us and
    delay_us honoured, local messages cost their delay only plus their bytes at the engine's default local
    copy rate, as `simulate_transfers(congestion_aware=False)` does).
    `model`: a `network.NetworkModel` of the topology to reuse across calls ("aware" and "fifo" only).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if mode != "unaware":
        return simulate_transfers(messages, topology, sharing=_SHARING[mode], model=model, stats=False).time_us

    if not messages:
        return 0.0
    src = np.array([m.src for m in messages], dtype=np.int64)
    dst = np.array([m.dst for m in messages], dtype=np.int64)
    net = src != dst
    alpha = np.zeros(len(messages))
    rate = np.full(len(messages), DEFAULT_LOCAL_GBPS * 1e3)
    if net.any():
        a, r, missing = lone_costs(topology, src[net], dst[net])
        if missing >= 0:
            k = int(np.nonzero(net)[0][missing])
            raise InputError("<messages>", f"message {k}", f"rank {src[k]}->{dst[k]}: topology {topology.name!r} "
                             f"has no link {src[k]}->{dst[k]}")
        alpha[net], rate[net] = a, r
    finish = [0.0] * len(messages)
    for k, m in enumerate(messages):
        if any(d >= k or d < 0 for d in m.deps):
            raise ValueError(f"message {k}: dependencies must point to earlier messages")
        start = max([m.release_us] + [finish[d] for d in m.deps])
        finish[k] = start + m.delay_us + alpha[k] + (m.nbytes / rate[k] if m.nbytes > 0 else 0.0)
    return max(finish)


def permute_messages(pairs: Sequence[tuple[int, int]], nbytes: float) -> list[Message]:
    """A permute as messages: `nbytes` from every source to its destination (topology ranks), no deps (all
    at once). ValueError for pairs that are not a permutation (the trace's rules, `pairs_problem`, on ranks)."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    problem = pairs_problem("permute", [list(p) for p in pairs], None)
    if problem:
        raise ValueError(f"permute pairs: {problem}")
    return [Message(int(src), int(dst), float(nbytes), label="permute direct") for src, dst in pairs]


def permute_time(pairs: Sequence[tuple[int, int]], nbytes: float, topology: Topology,
                 mode: str = "aware") -> CollectiveTiming:
    """Time of a permute: `nbytes` from every source to its destination (topology ranks), all at once.

    Always `transfer_time(permute_messages(pairs, nbytes), topology, mode="aware")`: the messages share links,
    switch ports and NICs fairly in every mode (module docstring), so `mode` is only checked. No pairs: 0 us.
    Raises InputError when a pair has no link in the topology, ValueError for bad pairs or mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    messages = permute_messages(pairs, nbytes)
    time_us = transfer_time(messages, topology, mode="aware") if messages else 0.0
    return CollectiveTiming(time_us, "direct", len(messages), float(nbytes) * len(messages))


def closed_form_us(collective: str, algorithm: str, p: int, nbytes: float, alpha_us: float,
                   GBps: float | Sequence[float], *, dims: Sequence[int] | None = None) -> float:
    """Textbook alpha-beta time on a uniform network where each rank has its own link to every peer it talks
    to (a = alpha_us, S = nbytes, B = GBps, S/B in us = S / (B * 1e3); T(n) = a + S/(n B); L = log2 p):

    ring: allreduce 2(p-1) T(p); reducescatter, allgather (p-1) T(p); alltoall (store-and-forward, step k
      carries p-k blocks) (p-1) a + (p-1) S/(2B); broadcast, reduce (a chain, not pipelined) (p-1) T(1).
    direct: reducescatter, allgather, alltoall T(p); allreduce 2 T(p); broadcast, reduce T(1).
    halving-doubling: reducescatter, allgather L a + (p-1)/p S/B; allreduce, broadcast (scatter + allgather),
      reduce (reduce-scatter + gather) 2 L a + 2 (p-1)/p S/B; alltoall L (a + S/(2B)).
    double-binary-tree (not pipelined, splits=1): allreduce 2 h (a + S/(2B)), h = the taller of NCCL's two
      trees' heights (ceil(log2 p)); broadcast, reduce h0 (a + S/B) on tree 0.
    hierarchical: dims (d0, d1, ...) with one bandwidth per dim (GBps a sequence, or one for all); with
      T_k(n) = a + S/(n B_k): allreduce 2 (d0-1) T_0(d0) + sum_{k>=1} 2 (dk-1) T_k(d0 dk); reducescatter and
      allgather sum_k (dk-1) T_k(d0 ... dk).
    bidirectional-ring (each rank has B in each direction, to either neighbour): the ring's steps, each
      moving half a block per direction: allreduce 2(p-1) T(2p); reducescatter, allgather (p-1) T(2p).
    hierarchical-bidirectional: hierarchical with every per-dim ring bidirectional, T_k(n) = a + S/(2 n B_k).
    (Bidirectional rings of 2 members send both halves over the same link each way: only "unaware" mode,
    which times every message alone, reaches their closed form; "aware" gives the one-way ring's time.)
    """
    _check_algorithm(collective, algorithm, p, None if dims is None else tuple(dims))
    a, S = float(alpha_us), float(nbytes)
    if algorithm in HIERARCHICAL:
        halves = 2 if algorithm == "hierarchical-bidirectional" else 1
        bws = [float(GBps)] * len(dims) if not isinstance(GBps, Sequence) else [float(x) for x in GBps]
        if len(bws) != len(dims):
            raise ValueError(f"hierarchical: {len(bws)} bandwidths for {len(dims)} dims")

        def T(k: int, n: int) -> float:
            return a + S / (halves * n * bws[k] * 1e3)
        if collective == "allreduce":
            total = 2 * (dims[0] - 1) * T(0, dims[0])
            return total + sum(2 * (dims[k] - 1) * T(k, dims[0] * dims[k]) for k in range(1, len(dims)))
        return sum((dims[k] - 1) * T(k, math.prod(dims[:k + 1])) for k in range(len(dims)))
    B = float(GBps) * 1e3  # bytes per us

    def T1(n: int) -> float:
        return a + S / (n * B)
    if p == 1:
        return 0.0
    if algorithm == "bidirectional-ring":
        return (2 if collective == "allreduce" else 1) * (p - 1) * T1(2 * p)
    if algorithm == "ring":
        return {"allreduce": 2 * (p - 1) * T1(p), "reducescatter": (p - 1) * T1(p), "allgather": (p - 1) * T1(p),
                "alltoall": (p - 1) * a + (p - 1) * S / (2 * B), "broadcast": (p - 1) * T1(1),
                "reduce": (p - 1) * T1(1)}[collective]
    if algorithm == "direct":
        return {"allreduce": 2 * T1(p), "broadcast": T1(1), "reduce": T1(1)}.get(collective, T1(p))
    if algorithm == "halving-doubling":
        L = p.bit_length() - 1
        if collective in ("reducescatter", "allgather"):
            return L * a + (p - 1) / p * S / B
        if collective == "alltoall":
            return L * (a + S / (2 * B))
        return 2 * L * a + 2 * (p - 1) / p * S / B
    t0, t1 = double_binary_tree(p)
    if collective == "allreduce":
        return 2 * max(tree_height(t0), tree_height(t1)) * (a + S / (2 * B))
    return tree_height(t0) * (a + S / B)


# ---------------------------------------------------------------------------------------------------------
# Symbolic check of a schedule


def verify_schedule(collective: str, algorithm: str, p: int, *, dims: Sequence[int] | None = None,
                    splits: int = 1) -> list[str]:
    """Problems with a schedule (empty when it is correct): run it on symbolic values and check the result.

    Pieces are mapped onto the collective's buffers (`_buffers`) and judged by `CollectiveSpec`: every rank
    starts with `spec.initial`, values are its symbols (reductions add, so double counting shows), messages
    run in index order (a topological order), and `postcondition_problems` names each rank and piece whose
    output is wrong. That order stands for every execution only if conflicting accesses are ordered by the
    dependencies, which is checked first: for each (rank, piece), every pair among its writes (messages into
    the rank carrying the piece) and reads (messages from it carrying the piece) must be ordered by ancestry,
    except two reads or two reductions (which commute). Also checked: dependencies point into earlier steps,
    pieces per message match the bytes, joins are local and messages are not. Meant for small p (ancestry
    sets are bitsets over all messages).
    """
    return _verify(_schedule(collective, algorithm, p, None if dims is None else tuple(int(d) for d in dims), splits))


def _verify(s: _Schedule) -> list[str]:
    p = s.p
    problems: list[str] = []
    anc: list[int] = []
    access: dict[tuple[int, int], list[tuple[int, str]]] = {}
    msgs: list[tuple[int, int, str, tuple[int, ...]]] = []
    for st, off in zip(s.steps, s.offsets[:-1].tolist()):
        m = len(st.src)
        pieces = st.pieces() if st.pieces is not None else np.empty((m, 0), dtype=np.int64)
        if pieces.shape != (m, st.width):
            problems.append(f"{st.phase}: pieces {pieces.shape} but {m} messages of width {st.width}")
            continue
        for k in range(m):
            g = off + k
            a, c = int(st.src[k]), int(st.dst[k])
            deps = [int(d) for d in st.deps[k] if d >= 0]
            if any(d >= off for d in deps):
                problems.append(f"{st.phase}: message {g} depends on a message of its own or a later step")
            bits = 0
            for d in deps:
                if d < g:
                    bits |= anc[d] | (1 << d)
            anc.append(bits)
            if (st.op == "join") != (a == c):
                problems.append(f"{st.phase}: message {g} {a}->{c} ({st.op})")
            row = tuple(int(x) for x in pieces[k])
            msgs.append((a, c, st.op, row))
            for x in row:
                access.setdefault((a, x), []).append((g, "read"))
                access.setdefault((c, x), []).append((g, st.op))
    for (rank, x), acc in access.items():
        for i in range(len(acc)):
            for j in range(i + 1, len(acc)):
                (g1, k1), (g2, k2) = acc[i], acc[j]
                if k1 == k2 and k1 in ("read", "reduce"):
                    continue
                if not ((anc[g2] >> g1) & 1 or (anc[g1] >> g2) & 1):
                    problems.append(f"rank {rank} piece {x}: messages {g1} ({k1}) and {g2} ({k2}) are unordered")
                    if len(problems) > 20:
                        return problems
    spec, in_size, in_piece, out_size, out_piece = _buffers(s)
    state: list[dict[int, Symbol]] = [{} for _ in range(p)]
    for r in range(p):
        for i in range(in_size):
            value = spec.initial(r, i)
            if value:  # an empty input (a broadcast's non-root) holds nothing to send
                state[r][in_piece(r, i)] = value
    for g, (a, c, op, row) in enumerate(msgs):
        for x in row:
            v = state[a].get(x)
            if v is None:
                problems.append(f"message {g} {a}->{c}: rank {a} sends piece {x} it does not hold")
                continue
            state[c][x] = v if op == "copy" or x not in state[c] else combine(state[c][x], v)
    problems += postcondition_problems(spec, lambda r, j: state[r].get(out_piece(r, j)), output_chunks=out_size,
                                       where=lambda r, j: f"rank {r} piece {out_piece(r, j)} (output {j})",
                                       limit=max(1, 21 - len(problems)))
    return problems


def _buffers(s: _Schedule) -> tuple[CollectiveSpec, int, Callable[[int, int], int], int, Callable[[int, int], int]]:
    """The schedule's pieces as the collective's buffers, so that `CollectiveSpec` judges it: (spec, input
    size, piece of rank r's input index i, output size, piece of rank r's output index j).

    allreduce, broadcast, reduce: index = piece (an allreduce whose pieces are not a multiple of p, e.g. the
    double binary tree's two halves, is checked with that many chunks, as `symbolic` does). Blocks and pairs:
    piece = split * space + (block or origin * p + destination) * q + sub, with k = splits * q chunks per
    rank (or per pair) and local index split * q + sub.
    """
    p, space, q, kind = s.p, s.space, s.q, s.collective
    total = s.splits * space
    if kind in ("allreduce", "broadcast", "reduce"):
        k = max(1, total // p) if kind == "allreduce" else total
        same = _same_index
        return CollectiveSpec(kind, p, k), total, same, total, same
    k = s.splits * q

    def piece(block: int, local: int) -> int:
        split, sub = divmod(local, q)
        return split * space + block * q + sub

    def in_piece(r: int, i: int) -> int:
        if kind == "allgather":
            return piece(r, i)
        if kind == "reducescatter":
            return piece(i // k, i % k)
        return piece(r * p + i // k, i % k)  # alltoall: block origin * p + destination

    def out_piece(r: int, j: int) -> int:
        if kind == "allgather":
            return piece(j // k, j % k)
        if kind == "reducescatter":
            return piece(r, j)
        return piece((j // k) * p + r, j % k)

    spec = CollectiveSpec(kind, p, k)
    return spec, spec.input_chunks(), in_piece, spec.output_chunks(), out_piece


def _same_index(rank: int, index: int) -> int:
    return index

"""Realising a tree packing (`trees.packing_lp`) as chunk-level collectives, and an alpha-beta time estimate.

Chunks are split over the trees in proportion to their weights (largest-remainder rounding); each chunk
then follows one tree, rooted where the collective needs it:

- allreduce (undirected trees, rooted at the tree's centre): every non-root v sends its partial sum to its
  parent (`reduce=True`) at step j + height(v), so a node sends only after all its children (post-order);
  then the root's full sum goes down, parent p -> child at step j + H + depth(p) (overwrite);
- reduce / broadcast: the reduction / broadcast half, rooted at `spec.root`;
- allgather: chunk c of rank c // k is broadcast along a tree rooted at its owner (ForestColl-style: with an
  `allgather` packing the trees are per-root out-arborescences, with an `allreduce` packing every tree is
  hung from the owner); reducescatter: the mirror, chunk c reduced into rank c // k.

j is the chunk's position among its tree's chunks, which pipelines the chunks of one tree. Every hop is a
transfer over an existing topology link (a hop through a switch is the switch's all-pairs link). With
`buffer_bytes` (the collective's whole buffer) the realisers fill `start_us` from `list_schedule`.

Time: one network model. The LP, the estimates and the list schedule use the links, switch ports and NICs of
`mlopt.sim.resources` (`trees_resources` numbers them for the LP), the simulator's resources. Candidates (the
chunk counts of `choose_chunks_per_rank`) are timed by the simulator itself: `simulated_time_us` lowers the
algorithm and runs `mlopt.sim.network.simulate_program`, the time the planner records and `mlopt simulate`
gives. `estimate_time` adds the bandwidth bound, a pipeline estimate (`predicted_us`) and the list
schedule's makespan.

The list schedule stays as the *send order* the lowering follows (`start_us`), not as a time model. Tried
instead: the simulator's FIFO engine (`run_tasks_fifo`) on the transfers. It differs from the list schedule
in two rules: (1) alpha does not hold a resource there, so back-to-back messages on a link overlap their
latencies, while the list schedule (TACCL's eq. 5.19) holds the link for alpha + bytes / bandwidth; (2) it
grants resources in request order without backfilling, and a message holds every resource of its route
from the moment the last one frees. In the lowered program a threadblock sends one message at a time and
its next step starts after delivery, so per channel alpha does hold the link: the simulated program time
agrees with rule (1) of the list schedule (ndv2x2 allreduce 1 MiB, 8 chunks per rank: list schedule
338.4 us, simulated program 338.4 us, FIFO engine on transfers 122.5 us), and FIFO issue or service times
as the send order made the simulated programs slower (ndv2x2 allgather 64 MiB 3673 -> 3723 us, dgx2x2
allgather 64 MiB 888 -> 1024 us).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mlopt.formats.topology import Topology
from mlopt.planners.collective.algorithm import Algorithm, Transfer
from mlopt.planners.collective.lowering import lower
from mlopt.planners.collective.trees_graph import root_tree, tree_center
from mlopt.planners.collective.trees_resources import ResourceKey, resource_model
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.network import simulate_program

DEFAULT_ROUNDING_TOLERANCE = 0.02  # relative rate lost to rounding that choose_chunks_per_rank accepts
DEFAULT_MAX_CHUNKS_PER_RANK = 64
MIN_PIPELINE_GAIN = 0.01  # choose_chunks_per_rank doubles k only while the prediction improves by this much


# -------------------------------------------------------------------------------------------------------
# Splitting chunks over trees


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integers summing to `total` proportional to weights (Hamilton's method; ties to the earlier index)."""
    w = np.asarray(weights, dtype=float)
    if total < 0 or w.size == 0 or w.sum() <= 0:
        raise ValueError("need a positive total weight and total >= 0")
    quota = w / w.sum() * total
    counts = np.floor(quota).astype(int)
    rest = total - int(counts.sum())
    order = sorted(range(w.size), key=lambda i: (-(quota[i] - counts[i]), i))
    for i in order[:rest]:
        counts[i] += 1
    return counts.tolist()


def _groups(packing) -> dict:
    """root (None for unrooted packings) -> indices of its trees."""
    out: dict = defaultdict(list)
    for i, t in enumerate(packing.trees):
        out[t.root].append(i)
    return out


def _chunks_per_group(kind: str, num_ranks: int, chunks_per_rank: int) -> int:
    """Chunks split over one group of trees: all n k for allreduce, k per root otherwise."""
    return num_ranks * chunks_per_rank if kind == "allreduce" else chunks_per_rank


def _tree_fractions(packing, chunks_per_rank: int, kind: str) -> np.ndarray:
    """Fraction of its group's data each tree carries after rounding (the chunk split the realisers use)."""
    total = _chunks_per_group(kind, len(packing.ranks), chunks_per_rank)
    frac = np.zeros(len(packing.trees))
    for _, idx in _groups(packing).items():
        counts = largest_remainder([packing.trees[i].weight_GBps for i in idx], total)
        for i, c in zip(idx, counts):
            frac[i] = c / total
    return frac


def rounded_rate_GBps(topology: Topology, packing, chunks_per_rank: int, kind: str | None = None) -> float:
    """The packing's rate after rounding the tree weights to whole chunks of a `kind` collective (default
    the packing's mode), measured in the LP's own model (undirected trees use both directions)."""
    model = resource_model(topology, packing.ranks)
    directed = packing.mode != "allreduce"
    load = np.zeros(len(model.keys))
    for t, f in zip(packing.trees, _tree_fractions(packing, chunks_per_rank, kind or packing.mode)):
        if f > 0:
            load += f * model.usage(list(t.edges), directed).sum(axis=0)
    worst = float(np.max(load / model.capacity_GBps))
    return 1.0 / worst if worst > 0 else math.inf


def choose_chunks_per_rank(topology: Topology, packing, *, kind: str | None = None,
                           buffer_bytes: float | None = None, root: int | None = None,
                           tolerance: float = DEFAULT_ROUNDING_TOLERANCE,
                           max_chunks_per_rank: int = DEFAULT_MAX_CHUNKS_PER_RANK) -> int:
    """Chunks per rank k for realising `packing` as a `kind` collective (default: the packing's mode).

    First the smallest k whose largest-remainder split of the chunks over the trees keeps the rate within
    `tolerance` of the LP's (rounded_rate >= (1 - tolerance) rate; the best k up to the cap if none does).
    Allreduce splits n k chunks over the trees, the other collectives k per root. With buffer_bytes, more
    chunks are also tried (k, 2k, 4k, ... up to the cap, while each doubling cuts the simulated time,
    `simulated_time_us`, by at least MIN_PIPELINE_GAIN): smaller chunks shorten pipeline fill and drain but
    pay alpha more often."""
    kind = kind or packing.mode
    k0, best_rate = 1, -1.0
    for k in range(1, max_chunks_per_rank + 1):
        rate = rounded_rate_GBps(topology, packing, k, kind)
        if rate >= (1 - tolerance) * packing.rate_GBps:
            k0 = k
            break
        if rate > best_rate * (1 + 1e-12):
            k0, best_rate = k, rate
    if buffer_bytes is None:
        return k0
    realise = REALISERS[kind]
    if root is None:
        root = packing.root if packing.root is not None else 0
    best_k, best_time = k0, math.inf
    k = k0
    while k <= max_chunks_per_rank:
        spec = CollectiveSpec(kind, topology.num_ranks, k, root)
        try:
            simulated = simulated_time_us(realise(topology, spec, packing, buffer_bytes), topology, buffer_bytes)
        except ValueError:  # this k does not lower (limits): keep the best so far; k0's failure is the plan's
            break
        if simulated < best_time * (1 - MIN_PIPELINE_GAIN):
            best_k, best_time = k, simulated
        elif best_time < math.inf:
            break
        k *= 2
    return best_k


# -------------------------------------------------------------------------------------------------------
# Realisers


def _check(topology: Topology, spec: CollectiveSpec, packing, kind: str, modes: tuple[str, ...]) -> None:
    if spec.kind != kind:
        raise ValueError(f"spec is a {spec.kind}, expected {kind}")
    if spec.num_ranks != topology.num_ranks:
        raise ValueError(f"spec has {spec.num_ranks} ranks, topology {topology.name} has {topology.num_ranks}")
    if tuple(packing.ranks) != tuple(range(topology.num_ranks)):
        raise ValueError("the packing must span every rank of the topology")
    if packing.mode not in modes:
        raise ValueError(f"a {kind} needs a packing of mode {' or '.join(modes)}, got {packing.mode}")
    if packing.root is not None and kind in ("reduce", "broadcast") and packing.root != spec.root:
        raise ValueError(f"packing is rooted at {packing.root}, spec at {spec.root}")


def _parents(tree, root: int) -> dict[int, int]:
    """child -> parent of the tree hung from root (directed trees: from their arcs)."""
    if tree.root is None:
        parent, _, _ = root_tree(tree.edges, root)
        return parent
    if tree.root != root:
        raise ValueError(f"tree rooted at {tree.root} used from {root}")
    # arborescence arcs: into the root (child -> parent) or out of it (parent -> child)
    into_root = any(b == root for _, b in tree.edges)
    return {a: b for a, b in tree.edges} if into_root else {b: a for a, b in tree.edges}


def _depth_height(parent: dict[int, int], root: int) -> tuple[dict[int, int], dict[int, int]]:
    depth: dict[int, int] = {root: 0}

    def d(v: int) -> int:
        path = []
        while v not in depth:
            path.append(v)
            v = parent[v]
        for u in reversed(path):
            depth[u] = depth[parent[u]] + 1
        return depth[path[0]] if path else depth[v]

    for v in parent:
        d(v)
    height = {v: 0 for v in depth}
    for v in sorted(depth, key=lambda u: -depth[u]):
        if v in parent:
            height[parent[v]] = max(height[parent[v]], height[v] + 1)
    return depth, height


def _reduce_up(chunk: int, parent, height, offset: int) -> list[Transfer]:
    return [Transfer(chunk, v, p, offset + height[v], reduce=True) for v, p in sorted(parent.items())]


def _broadcast_down(chunk: int, parent, depth, offset: int) -> list[Transfer]:
    return [Transfer(chunk, p, v, offset + depth[p]) for v, p in sorted(parent.items())]


def _assign(packing, tree_ids: list[int], chunks: list[int]) -> list[tuple[int, int, int]]:
    """(chunk, tree index, position j among that tree's chunks), largest-remainder split, in chunk order."""
    counts = largest_remainder([packing.trees[i].weight_GBps for i in tree_ids], len(chunks))
    out, pos = [], 0
    for i, c in zip(tree_ids, counts):
        out += [(chunks[pos + j], i, j) for j in range(c)]
        pos += c
    return out


def _finish(name: str, spec: CollectiveSpec, transfers: list[Transfer], topology: Topology,
            buffer_bytes: float | None) -> Algorithm:
    links = topology.link_map()
    missing = [t for t in transfers if (t.src, t.dst) not in links]
    if missing:
        raise ValueError(f"transfer over a missing link {missing[0].src}->{missing[0].dst}")
    alg = Algorithm(name, spec, tuple(sorted(transfers, key=lambda t: (t.step, t.chunk, t.src, t.dst))))
    if buffer_bytes is not None:
        alg = list_schedule(alg, topology, buffer_bytes)[0]
    return alg


def tree_allreduce(topology: Topology, spec: CollectiveSpec, packing, buffer_bytes: float | None = None) -> Algorithm:
    """Allreduce over the weighted undirected trees of an `allreduce` packing: each of the n k chunks takes
    one tree (largest remainder), reduces up to the tree's centre and is broadcast back down. With
    buffer_bytes the transfers get `start_us` from `list_schedule`."""
    _check(topology, spec, packing, "allreduce", ("allreduce",))
    n, k = spec.num_ranks, spec.chunks_per_rank
    transfers: list[Transfer] = []
    rooted = {}
    for chunk, i, j in _assign(packing, list(range(len(packing.trees))), list(range(n * k))):
        if i not in rooted:
            tree = packing.trees[i]
            root = tree_center(tree.edges, packing.ranks)
            parent = _parents(tree, root)
            rooted[i] = (root, parent, *_depth_height(parent, root))
        root, parent, depth, height = rooted[i]
        transfers += _reduce_up(chunk, parent, height, j)
        transfers += _broadcast_down(chunk, parent, depth, j + height[root])
    return _finish(f"trees-allreduce-{topology.name}", spec, transfers, topology, buffer_bytes)


def _rooted_trees(packing, root: int) -> list[int]:
    ids = [i for i, t in enumerate(packing.trees) if t.root in (None, root)]
    if not ids:
        raise ValueError(f"packing has no tree rooted at {root}")
    return ids


def tree_reduce(topology: Topology, spec: CollectiveSpec, packing, buffer_bytes: float | None = None) -> Algorithm:
    """Reduce into spec.root along the packing's trees (a `reduce` packing's in-arborescences, or an
    `allreduce` packing's trees hung from the root)."""
    _check(topology, spec, packing, "reduce", ("reduce", "allreduce"))
    transfers: list[Transfer] = []
    for chunk, i, j in _assign(packing, _rooted_trees(packing, spec.root), list(range(spec.chunks_per_rank))):
        parent = _parents(packing.trees[i], spec.root)
        _, height = _depth_height(parent, spec.root)
        transfers += _reduce_up(chunk, parent, height, j)
    return _finish(f"trees-reduce-{topology.name}", spec, transfers, topology, buffer_bytes)


def tree_broadcast(topology: Topology, spec: CollectiveSpec, packing, buffer_bytes: float | None = None) -> Algorithm:
    """Broadcast from spec.root along the packing's trees (a `broadcast` packing's out-arborescences, or an
    `allreduce` packing's trees hung from the root)."""
    _check(topology, spec, packing, "broadcast", ("broadcast", "allreduce"))
    transfers: list[Transfer] = []
    for chunk, i, j in _assign(packing, _rooted_trees(packing, spec.root), list(range(spec.chunks_per_rank))):
        parent = _parents(packing.trees[i], spec.root)
        depth, _ = _depth_height(parent, spec.root)
        transfers += _broadcast_down(chunk, parent, depth, j)
    return _finish(f"trees-broadcast-{topology.name}", spec, transfers, topology, buffer_bytes)


def tree_allgather(topology: Topology, spec: CollectiveSpec, packing, buffer_bytes: float | None = None) -> Algorithm:
    """Allgather: rank r's k chunks are broadcast from r along trees rooted at r (an `allgather` packing's
    per-root out-arborescences, or every tree of an `allreduce` packing hung from r)."""
    _check(topology, spec, packing, "allgather", ("allgather", "allreduce"))
    k = spec.chunks_per_rank
    transfers: list[Transfer] = []
    for r in range(spec.num_ranks):
        for chunk, i, j in _assign(packing, _rooted_trees(packing, r), list(range(r * k, (r + 1) * k))):
            parent = _parents(packing.trees[i], r)
            depth, _ = _depth_height(parent, r)
            transfers += _broadcast_down(chunk, parent, depth, j)
    return _finish(f"trees-allgather-{topology.name}", spec, transfers, topology, buffer_bytes)


def tree_reducescatter(topology: Topology, spec: CollectiveSpec, packing,
                       buffer_bytes: float | None = None) -> Algorithm:
    """Reduce-scatter: chunk c is reduced into rank c // k along trees into that rank (a `reducescatter`
    packing's in-arborescences, or an `allreduce` packing's trees hung from it)."""
    _check(topology, spec, packing, "reducescatter", ("reducescatter", "allreduce"))
    k = spec.chunks_per_rank
    transfers: list[Transfer] = []
    for r in range(spec.num_ranks):
        for chunk, i, j in _assign(packing, _rooted_trees(packing, r), list(range(r * k, (r + 1) * k))):
            parent = _parents(packing.trees[i], r)
            _, height = _depth_height(parent, r)
            transfers += _reduce_up(chunk, parent, height, j)
    return _finish(f"trees-reducescatter-{topology.name}", spec, transfers, topology, buffer_bytes)


REALISERS = {
    "allreduce": tree_allreduce,
    "reduce": tree_reduce,
    "broadcast": tree_broadcast,
    "allgather": tree_allgather,
    "reducescatter": tree_reducescatter,
}


# -------------------------------------------------------------------------------------------------------
# Time under the alpha-beta model


@dataclass(frozen=True)
class TimeEstimate:
    """Alpha-beta estimates for an algorithm on a buffer (all in us).

    bandwidth_us: max over resources (links, switch ports, NICs) of bytes through it / its bandwidth. No
        schedule beats it, and for a tree algorithm it is >= D / R(G), hence >= Lemma 2.1's bound.
    busy_us: the same plus alpha for every message on a link: the busiest resource's total busy time.
    chain_us: the longest dependency chain of one chunk, each hop costing alpha + chunk / (its slowest
        resource): the time one chunk needs with the network to itself.
    predicted_us: the pipeline estimate busy_us + chain_us - bottleneck_hop_us: the chunks stream through
        the busiest resource back to back ((S - 1) messages after the first) and the last one still has
        to cross its whole chain (fill and drain). For S chunks on a uniform chain of L hops this is the
        textbook (S + L - 1) x hop.
    schedule_us: makespan of `list_schedule`, the one-message-per-resource schedule whose order the
        lowering follows (a check).
    simulated_us: what the simulator gives for the algorithm lowered to a program (`simulated_time_us`):
        the time the planner records and `choose_chunks_per_rank` compares.
    """

    bandwidth_us: float
    busy_us: float
    chain_us: float
    predicted_us: float
    schedule_us: float
    bottleneck: ResourceKey
    chunk_bytes: float
    simulated_us: float = math.nan


def _arc_resources(topology: Topology):
    return resource_model(topology), topology.link_map()


def list_schedule(alg: Algorithm, topology: Topology, buffer_bytes: float) -> tuple[Algorithm, float]:
    """A concrete schedule, for `start_us` (the send order of the lowering) and as a check on the estimate.
    It works over the simulator's resources (`trees_resources.resource_model`). Transfers are placed one by one
    in (step, chunk) order, each at the earliest time at which its source holds the chunk (every transfer
    of that chunk into the source placed so far has arrived) and every resource it uses (link, switch
    ports, NICs) is idle for alpha + chunk_bytes / (slowest of them), backfilling idle gaps. Each resource
    serves one message at a time, so the schedule respects the LP's capacities (and, unlike a fluid model,
    never shares a port between two messages). Returns the algorithm with `start_us`, and the makespan."""
    model, links = _arc_resources(topology)
    chunk_bytes = buffer_bytes / alg.num_chunks
    starts: dict[int, list[float]] = defaultdict(list)  # resource -> sorted busy intervals
    ends: dict[int, list[float]] = defaultdict(list)
    ready: dict[tuple[int, int], float] = {}
    out, makespan = [], 0.0
    for t in sorted(alg.transfers, key=lambda t: (t.step, t.chunk, t.src, t.dst)):
        rs = model.arcs[(t.src, t.dst)]
        dur = links[(t.src, t.dst)].alpha_us + chunk_bytes / (float(model.capacity_GBps[list(rs)].min()) * 1e3)
        begin = ready.get((t.chunk, t.src), 0.0)
        moved = True
        while moved:  # push begin past every busy interval that overlaps [begin, begin + dur)
            moved = False
            for r in rs:
                st, en = starts[r], ends[r]
                i = bisect.bisect_right(st, begin) - 1
                if i >= 0 and en[i] > begin + 1e-12:
                    begin, moved = en[i], True
                if i + 1 < len(st) and st[i + 1] < begin + dur - 1e-12:
                    begin, moved = en[i + 1], True
        for r in rs:
            _book(starts[r], ends[r], begin, begin + dur)
        ready[(t.chunk, t.dst)] = max(ready.get((t.chunk, t.dst), 0.0), begin + dur)
        makespan = max(makespan, begin + dur)
        out.append(replace(t, start_us=begin))
    return Algorithm(alg.name, alg.spec, tuple(out)), makespan


def simulated_time_us(alg: Algorithm, topology: Topology, buffer_bytes: float) -> float:
    """The time `mlopt simulate` gives for the algorithm: lowered to an MSCCL-EF program (one instance, the
    Simple protocol, as the planner lowers it by default) and run by the simulator's engine
    (`mlopt.sim.network.simulate_program`, max-min fair sharing over the links, switch ports and NICs of
    `mlopt.sim.resources`). A lowering failure is a ValueError (the planner reports it for the plan)."""
    return simulate_program(lower(alg), topology, buffer_bytes).time_us


def _book(starts: list[float], ends: list[float], begin: float, end: float) -> None:
    """Insert busy interval [begin, end) into disjoint sorted intervals, merging touching neighbours (so a
    resource kept busy back to back is one interval and later searches stay short)."""
    i = bisect.bisect_right(starts, begin)
    if i > 0 and ends[i - 1] >= begin - 1e-9:
        i -= 1
        ends[i] = max(ends[i], end)
    else:
        starts.insert(i, begin)
        ends.insert(i, end)
    while i + 1 < len(starts) and starts[i + 1] <= ends[i] + 1e-9:
        ends[i] = max(ends[i], ends[i + 1])
        del starts[i + 1], ends[i + 1]


def estimate_time(alg: Algorithm, topology: Topology, buffer_bytes: float, *, schedule: bool = True) -> TimeEstimate:
    """Alpha-beta time of `alg` on a buffer of buffer_bytes (the collective's whole buffer: n k chunks for
    allreduce / allgather / reducescatter, k for reduce / broadcast), over the simulator's resources.
    schedule=False skips the list schedule and the simulation (schedule_us and simulated_us are then nan)."""
    model, links = _arc_resources(topology)
    chunk_bytes = buffer_bytes / alg.num_chunks
    load = np.zeros(len(model.keys))
    busy = np.zeros(len(model.keys))
    hop: dict[Transfer, float] = {}
    for t in alg.transfers:
        rs = list(model.arcs[(t.src, t.dst)])
        alpha = links[(t.src, t.dst)].alpha_us
        load[rs] += chunk_bytes
        busy[rs] += chunk_bytes / (model.capacity_GBps[rs] * 1e3)
        busy[rs[0]] += alpha  # rs[0] is the link itself
        hop[t] = alpha + chunk_bytes / (float(model.capacity_GBps[rs].min()) * 1e3)
    if not alg.transfers:
        return TimeEstimate(0.0, 0.0, 0.0, 0.0, 0.0, ("none",), chunk_bytes)
    seconds = load / (model.capacity_GBps * 1e3)
    worst = int(np.argmax(busy))
    count = sum(1 for t in alg.transfers if worst in model.arcs[(t.src, t.dst)])
    bottleneck_hop = float(busy[worst]) / count
    chain = _longest_chain(alg, hop)
    makespan = simulated = math.nan
    if schedule:
        timed, makespan = list_schedule(alg, topology, buffer_bytes)
        simulated = simulated_time_us(timed, topology, buffer_bytes)
    return TimeEstimate(float(seconds.max()), float(busy[worst]), chain,
                        float(busy[worst]) + max(chain - bottleneck_hop, 0.0), makespan,
                        model.keys[worst], chunk_bytes, simulated)


def _longest_chain(alg: Algorithm, hop: dict[Transfer, float]) -> float:
    """Longest path (sum of hop times) through the transfers of a single chunk, by step."""
    arrive: dict[tuple[int, int], float] = {}
    longest = 0.0
    by_chunk: dict[int, list[Transfer]] = defaultdict(list)
    for t in alg.transfers:
        by_chunk[t.chunk].append(t)
    for chunk, ts in by_chunk.items():
        ts.sort(key=lambda t: t.step)
        i = 0
        while i < len(ts):  # a step sees the arrivals of smaller steps only
            j = i
            while j < len(ts) and ts[j].step == ts[i].step:
                j += 1
            done = [(t, arrive.get((chunk, t.src), 0.0) + hop[t]) for t in ts[i:j]]
            for t, end in done:
                arrive[(chunk, t.dst)] = max(arrive.get((chunk, t.dst), 0.0), end)
                longest = max(longest, end)
            i = j
    return longest

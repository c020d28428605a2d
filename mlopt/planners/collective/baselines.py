"""Baseline collective algorithms (what NCCL and hierarchical libraries do), as chunk-level Algorithms.

Each function takes a Topology and a CollectiveSpec (its kind and number of ranks; see each for how the
chunks per rank k are chosen), returns an `Algorithm` that `check_algorithm` accepts and whose every transfer
uses an existing link, and raises `BaselineError` (a ValueError) naming why it does not apply. Lower the
result with `mlopt.planners.collective.lowering.lower`.

Steps come from `schedule`: each chunk's hops in order, and at most one chunk per directed link and step, so
chunks that share a ring or tree take turns and pipeline. That is what NCCL does, and it keeps the lowered
program safe with the executor's bounded FIFOs. `direct` instead sends everything at step 0, each (source,
destination) pair's chunks grouped into one message (cnt = k), which is safe because its receives sit in
threadblocks of their own.

| baseline           | collectives                                              | needs                                |
|--------------------|----------------------------------------------------------|--------------------------------------|
| ring               | allgather, reducescatter, allreduce, alltoall (slow),    | a Hamiltonian cycle over the links   |
|                    | broadcast, reduce                                        |                                      |
| double_binary_tree | allreduce                                                | links along NCCL's two trees under   |
|                    |                                                          | some placement of ranks              |
| direct             | allgather, alltoall, reducescatter, allreduce            | a link between every pair of ranks   |
| hierarchical       | allreduce, allgather, reducescatter                      | equal nodes; a ring over each node's |
|                    |                                                          | links; links between same-index GPUs |
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlopt.formats.topology import Topology
from mlopt.planners.collective.algorithm import Algorithm, Transfer
from mlopt.planners.collective.baseline_graph import (
    BaselineError,
    bandwidths,
    best_cycles,
    embed,
    find_rings,
    no_cycle_reason,
)
from mlopt.sim.collective_shapes import (
    as_parent_map,
    direct_pairs,
    grid_groups,
    ring_hops,
    tree_depths,
)
from mlopt.sim.collective_shapes import double_binary_tree as nccl_double_binary_tree  # the name below is the baseline
from mlopt.sim.collectives import CollectiveSpec

__all__ = ["BaselineError", "ring", "double_binary_tree", "direct", "hierarchical", "BASELINES"]

DEFAULT_RING_CHANNELS = 2


def _check_spec(topology: Topology, spec: CollectiveSpec, name: str, kinds: tuple[str, ...]) -> None:
    if spec.kind not in kinds:
        raise BaselineError(f"the {name} baseline implements {', '.join(kinds)}, not {spec.kind}")
    if spec.num_ranks != topology.num_ranks:
        raise BaselineError(
            f"the collective has {spec.num_ranks} ranks but topology {topology.name} has {topology.num_ranks}"
        )
    if spec.chunks_per_rank < 1:
        raise BaselineError("chunks_per_rank must be at least 1")


def _links(topology: Topology) -> set[tuple[int, int]]:
    return {(l.src, l.dst) for l in topology.links}


# --------------------------------------------------------------------------------------------------------------
# Ring


Move = tuple[int, int, bool]  # (src, dst, reduce): one hop of one chunk, steps assigned by `schedule`


def schedule(moves: dict[int, list[Move]], chunk_order: list[int] | None = None) -> list[Transfer]:
    """Steps for each chunk's moves (listed in the order they must happen): a move waits for the earlier moves
    of its chunk that it interacts with (one delivering to its source, or reading or writing its
    destination), and every directed link carries at most one chunk per step (list scheduling, earliest
    free step). Moves are placed level by level (all first hops, then all second hops, ...), or, with
    `chunk_order`, chunk by chunk in that order (every hop of a chunk before the next chunk: the chunk then
    moves on at once wherever it can, so relays become receive-copy-send). One chunk per link and step
    keeps every FIFO of the lowered program short, so it also runs with the executor's bounded FIFOs
    (check_program's bounded_fifo stays empty)."""
    rank = {c: i for i, c in enumerate(chunk_order)} if chunk_order is not None else None
    items: list[tuple[int, int, int, int]] = []  # (level, chunk, index, ...)
    deps: dict[tuple[int, int], list[int]] = {}
    for chunk, ms in moves.items():
        level: list[int] = []
        for i, (src, dst, _red) in enumerate(ms):
            before = [j for j in range(i) if ms[j][1] == src or ms[j][0] == dst or ms[j][1] == dst]
            deps[(chunk, i)] = before
            level.append(max((level[j] + 1 for j in before), default=0))
            items.append((level[i], chunk, i, 0) if rank is None else (rank[chunk], level[i], i, chunk))
    items.sort()
    if rank is not None:
        items = [(lvl, chunk, i, 0) for _, lvl, i, chunk in items]
    busy: dict[tuple[int, int], set[int]] = {}
    step: dict[tuple[int, int], int] = {}
    out: list[Transfer] = []
    for _lvl, chunk, i, _ in items:
        src, dst, red = moves[chunk][i]
        t = max((step[(chunk, j)] + 1 for j in deps[(chunk, i)]), default=0)
        used = busy.setdefault((src, dst), set())
        while t in used:
            t += 1
        used.add(t)
        step[(chunk, i)] = t
        out.append(Transfer(chunk, src, dst, t, reduce=red))
    out.sort(key=lambda tr: (tr.step, tr.chunk, tr.src, tr.dst))
    return out


def _ring_moves(kind: str, rings: list[list[int]], n: int, k: int, root: int = 0) -> dict[int, list[Move]]:
    """Each chunk's hops around its ring; chunk index j of a rank rides ring j % len(rings)."""
    R = len(rings)
    moves: dict[int, list[Move]] = {}
    if kind == "alltoall":
        for s in range(n):
            for d in range(n):
                for j in range(k):
                    if s != d:
                        ring_ = rings[j % R]
                        hops = (ring_.index(d) - ring_.index(s)) % n
                        moves[(s * n + d) * k + j] = [(a, b, False) for a, b in ring_hops(ring_, s, hops)]
        return moves
    if kind in ("broadcast", "reduce"):
        for c in range(k):
            ring_ = rings[c % R]
            if kind == "broadcast":
                moves[c] = [(a, b, False) for a, b in ring_hops(ring_, root, n - 1)]
            else:  # reduce: start right after the root, end at it
                start = ring_[(ring_.index(root) + 1) % n]
                moves[c] = [(a, b, True) for a, b in ring_hops(ring_, start, n - 1)]
        return moves
    for c in range(n * k):
        owner, j = divmod(c, k)
        ring_ = rings[j % R]
        after = ring_[(ring_.index(owner) + 1) % n]
        ms: list[Move] = []
        if kind in ("reducescatter", "allreduce"):  # reduce around the ring, ending at the owner
            ms += [(a, b, True) for a, b in ring_hops(ring_, after, n - 1)]
        if kind in ("allgather", "allreduce"):  # then pass the result on from the owner
            ms += [(a, b, False) for a, b in ring_hops(ring_, owner, n - 1)]
        moves[c] = ms
    return moves


def ring(topology: Topology, spec: CollectiveSpec, channels: int | None = None) -> Algorithm:
    """NCCL-style multi-ring algorithm: `channels` rings (default 2) chosen by `find_rings` (best bandwidth
    first, later rings avoiding the links earlier ones use, e.g. the reverse direction; across nodes each
    ring enters and leaves every node once).

    Chunks: k = spec.chunks_per_rank rounded up to a multiple of the number of rings (chunk index j of each
    rank rides ring j % rings), so each ring carries 1/rings of the data, as NCCL's channels do; the
    returned Algorithm's spec has that k (broadcast/reduce keep k; chunk c rides ring c % rings). A ring
    carries one chunk per link and step: with k / rings > 1 the rounds follow one another.

    allgather: each chunk goes n - 1 hops from its owner; reducescatter: it is reduced over n - 1 hops
    ending at its owner; allreduce: reducescatter then allgather (2n - 2 steps per round, lowered to NCCL's
    s, rrs.., rrcs, rcs.., r); alltoall (slow): each chunk travels the ring from source to destination,
    farthest first, as a wave that keeps every link busy (n (n - 1) / 2 steps per round, relays lowered to
    rcs); broadcast/reduce: a chain from (to) the root.
    """
    kinds = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce")
    _check_spec(topology, spec, "ring", kinds)
    R = DEFAULT_RING_CHANNELS if channels is None else channels
    if R < 1:
        raise BaselineError(f"channels must be at least 1, got {channels}")
    rings = find_rings(topology, R)
    k = -(-spec.chunks_per_rank // R) * R
    if spec.kind in ("broadcast", "reduce"):
        k = spec.chunks_per_rank  # chunk c rides ring c % R
    out_spec = replace(spec, chunks_per_rank=k)
    moves = _ring_moves(spec.kind, rings, spec.num_ranks, k, spec.root)
    # alltoall: farthest chunks first, each riding the ring without stopping (a wave per distance)
    order = sorted(moves, key=lambda c: (-len(moves[c]), c)) if spec.kind == "alltoall" else None
    ts = schedule(moves, order)
    return Algorithm("ring", out_spec, tuple(ts))


# --------------------------------------------------------------------------------------------------------------
# Double binary tree


def _tree_moves(parent: dict[int, int]) -> list[Move]:
    """Allreduce on one tree: reduce up to the root (children before parents), then broadcast down."""
    depth = tree_depths(parent)
    order = sorted(parent, key=lambda x: (-depth[x], x))
    return [(x, parent[x], True) for x in order] + [(parent[x], x, False) for x in reversed(order)]


def double_binary_tree(topology: Topology, spec: CollectiveSpec) -> Algorithm:
    """NCCL's double binary tree allreduce on NCCL's two trees (ncclGetDtree: the binary tree, and its mirror
    for even n or its shift by one position for odd n; `collective_shapes.double_binary_tree`, the shape the
    simulator's `double-binary-tree` times too), each reducing half of the chunks to its root and broadcasting
    them back (chunks [0, h) on the first tree, [h, n k) on the second, h = ceil(n k / 2); k =
    spec.chunks_per_rank). Ranks are placed on tree positions in rank order when every tree
    edge is a link in both directions (switches, fully connected and multi-node presets), else by a search
    for a placement over the existing links (e.g. NDv2's hybrid cube mesh); BaselineError when none exists
    (e.g. ring:4, whose 4 links cannot carry the trees' 5 distinct edges)."""
    _check_spec(topology, spec, "double-binary-tree", ("allreduce",))
    n, k = spec.num_ranks, spec.chunks_per_rank
    if n == 1:
        return Algorithm("double-binary-tree", spec, ())
    trees = [as_parent_map(parents) for parents in nccl_double_binary_tree(n)]
    links = _links(topology)
    edges = sorted({tuple(sorted(e)) for t in trees for e in t.items()})
    place = embed(n, edges, range(n), lambda a, b: (a, b) in links and (b, a) in links)
    if place is None:
        raise BaselineError(
            f"double binary tree: no placement of {n} ranks on NCCL's two trees uses only links of {topology.name} "
            f"(the trees need {len(edges)} bidirectional links)"
        )
    total = n * k
    half = (total + 1) // 2
    moves: dict[int, list[Move]] = {}
    for tree, chunks in zip(trees, (range(0, half), range(half, total))):
        tree_moves = _tree_moves({place[c]: place[p] for c, p in tree.items()})
        for c in chunks:
            moves[c] = tree_moves
    return Algorithm("double-binary-tree", spec, tuple(schedule(moves)))


# --------------------------------------------------------------------------------------------------------------
# Direct


def direct(topology: Topology, spec: CollectiveSpec) -> Algorithm:
    """Every chunk straight from where it is to where it must be (k = spec.chunks_per_rank): alltoall and
    allgather in one step; reducescatter: every rank sends its contribution to the chunk's owner, which
    adds them up; allreduce: that, then the owner sends the sum to everyone (two steps). Needs a link between
    every pair of ranks."""
    _check_spec(topology, spec, "direct", ("alltoall", "allgather", "reducescatter", "allreduce"))
    n, k = spec.num_ranks, spec.chunks_per_rank
    links = _links(topology)
    pairs = sorted(zip(*(x.tolist() for x in direct_pairs(n))))  # (src, dst) in rank order
    missing = [pair for pair in pairs if pair not in links]
    if missing:
        raise BaselineError(
            f"direct needs a link between every pair of ranks; {topology.name} has no link "
            f"{missing[0][0]}->{missing[0][1]}"
            + (f" (and {len(missing) - 1} more pairs)" if len(missing) > 1 else "")
        )
    ts: list[Transfer] = []
    if spec.kind == "alltoall":
        for s, d in pairs:
            ts += [Transfer((s * n + d) * k + j, s, d, 0, group=0) for j in range(k)]
    else:
        senders = {r: [s for s, d in pairs if d == r] for r in range(n)}
        receivers = {r: [d for s, d in pairs if s == r] for r in range(n)}
        for c in range(n * k):
            owner = c // k
            if spec.kind in ("reducescatter", "allreduce"):
                ts += [Transfer(c, s, owner, 0, reduce=True, group=0) for s in senders[owner]]
            if spec.kind in ("allgather", "allreduce"):
                step = 1 if spec.kind == "allreduce" else 0
                ts += [Transfer(c, owner, d, step, group=1) for d in receivers[owner]]
    return Algorithm("direct", spec, tuple(ts))


# --------------------------------------------------------------------------------------------------------------
# Hierarchical


def hierarchical(topology: Topology, spec: CollectiveSpec) -> Algorithm:
    """Two-level algorithm over the topology's nodes (G GPUs each, M nodes, k = spec.chunks_per_rank).

    Chunk c belongs to rank c // k, with local index l in node m. Rings: one over each node's links (as
    `find_rings` picks) and, for every local index l, one over the nodes' l-th GPUs in node order.
    allreduce: intra-node reducescatter (in every node, chunk c is reduced onto the node's l-th GPU), then
    an allreduce among the l-th GPUs (ring reducescatter ending at node m, then ring allgather), then an
    intra-node allgather from the l-th GPU. allgather: inter-node ring allgather among the l-th GPUs, then
    intra-node ring allgather. reducescatter: intra-node ring reducescatter onto the l-th GPUs, then an
    inter-node ring reducescatter ending at rank c // k. One node: just the intra-node rings.
    """
    _check_spec(topology, spec, "hierarchical", ("allreduce", "allgather", "reducescatter"))
    n, k = spec.num_ranks, spec.chunks_per_rank
    nodes = [list(node.ranks) for node in topology.nodes]
    G, M = len(nodes[0]), len(nodes)
    if any(len(x) != G for x in nodes):
        sizes = sorted({len(x) for x in nodes})
        raise BaselineError(f"hierarchical needs nodes of equal size; {topology.name} has nodes of {sizes} GPUs")
    bw = bandwidths(topology)
    intra = []
    for m, ranks in enumerate(nodes):
        cyc = best_cycles(ranks, bw, 1)
        if not cyc:
            raise BaselineError(
                f"hierarchical: no ring over the links inside node {topology.nodes[m].name}: "
                + no_cycle_reason(ranks, bw)
            )
        intra.append(cyc[0])
    inter = grid_groups(np.array(nodes), 1).tolist()  # the nodes' l-th GPUs, in node order
    for l, peers in enumerate(inter):
        for a, b in zip(peers, peers[1:] + peers[:1]):
            if a != b and (a, b) not in bw:
                raise BaselineError(f"hierarchical: no link {a}->{b} between GPUs with local index {l}")
    where = {r: (m, l) for m, ranks in enumerate(nodes) for l, r in enumerate(ranks)}
    kind = spec.kind
    moves: dict[int, list[Move]] = {}
    for c in range(n * k):
        m, l = where[c // k]
        # in every node, reduce c onto its l-th GPU / pass c on from it
        intra_reduce = [
            (a, b, True) for mm in range(M)
            for a, b in ring_hops(intra[mm], intra[mm][(intra[mm].index(nodes[mm][l]) + 1) % G], G - 1)
        ]  # fmt: skip
        intra_gather = [(a, b, False) for mm in range(M) for a, b in ring_hops(intra[mm], nodes[mm][l], G - 1)]
        # among the l-th GPUs: reduce c onto node m's / pass it on from node m's
        inter_reduce = [(a, b, True) for a, b in ring_hops(inter[l], inter[l][(m + 1) % M], M - 1)]
        inter_gather = [(a, b, False) for a, b in ring_hops(inter[l], nodes[m][l], M - 1)]
        if kind == "allreduce":
            moves[c] = intra_reduce + inter_reduce + inter_gather + intra_gather
        elif kind == "allgather":
            moves[c] = inter_gather + intra_gather
        else:
            moves[c] = intra_reduce + inter_reduce
    return Algorithm("hierarchical", spec, tuple(schedule(moves)))


BASELINES = {
    "ring": ring,
    "double-binary-tree": double_binary_tree,
    "direct": direct,
    "hierarchical": hierarchical,
}

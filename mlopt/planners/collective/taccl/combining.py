"""Combining collectives (TACCL §5.7, "Synthesizing combining collectives").

REDUCESCATTER is the inverse of ALLGATHER: every allgather transfer of chunk c over (u, v) becomes a
transfer of c over (v, u) that v's partial sum reduces into u. The allgather tree of c (rooted at c's owner)
turns into a reduction tree towards the owner: a rank forwards its partial sum once every child's has
arrived. Inverting the sends alone is not enough (an allgather rank may send on several links at once, but
it cannot reduce several receives of one chunk at once), so the inverted transfers are re-ordered with the
heuristic ordering, with one-at-a-time reduction of a chunk's receives, and scheduled by stage 3. Besides
the forward heuristics, "auto" lists them in the order of the copy schedule run backwards (the "mirror"
ordering: links, ports and dependencies mirror, so where no rank multicasts a chunk the reducing half is as
fast as the copy half; on DGX-2 x2 with sketch 1 at 1 GiB the forward heuristics were 17 % slower).
The inverted algorithm runs on the transposed logical topology (link (v, u) costs what (u, v) did).

ALLREDUCE = REDUCESCATTER followed by the ALLGATHER (the steps and start times of the allgather come after
the reducescatter's). REDUCE is the inverse of BROADCAST in the same way.
"""

from __future__ import annotations

import heapq

from mlopt.planners.collective.taccl.ordering import TransferGraph


def invert(graph: TransferGraph) -> tuple[TransferGraph, list[int]]:
    """The reducing graph of a copy graph, and for each new transfer the copy transfer it inverts."""
    children = graph.children()
    inv = TransferGraph(serialize_receives=True)
    # a transfer's dependencies (its children's inverses) must exist first: add in reverse topological order
    order = _reverse_topological(graph, children)
    new_of: dict[int, int] = {}
    origin: list[int] = []
    for t in order:
        deps = tuple(new_of[ch] for ch in children[t])
        new_of[t] = inv.add(graph.chunk[t], graph.dst[t], graph.src[t], True, deps)
        origin.append(t)
    return inv, origin


def _reverse_topological(graph: TransferGraph, children: list[list[int]]) -> list[int]:
    pending = [len(ch) for ch in children]
    ready = [t for t in range(len(graph)) if pending[t] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        t = heapq.heappop(ready)
        out.append(t)
        for d in graph.deps[t]:
            pending[d] -= 1
            if pending[d] == 0:
                heapq.heappush(ready, d)
    if len(out) != len(graph):
        raise RuntimeError("transfer graph has a dependency cycle")
    return out

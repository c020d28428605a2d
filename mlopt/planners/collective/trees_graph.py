"""Graph helpers for `trees.py`: minimum spanning trees (Kruskal), minimum arborescences (Chu-Liu/Edmonds),
rooting a tree, and connectivity. Plain Python over small graphs (tens of ranks, a few thousand arcs)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence

import numpy as np


class _UnionFind:
    def __init__(self, items: Sequence[int]):
        self.parent = {x: x for x in items}

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[rb] = ra
        return True


def minimum_spanning_tree(nodes: Sequence[int], edges: Sequence[tuple[int, int]],
                          weights: np.ndarray) -> list[int] | None:
    """Kruskal: indices of the edges of a minimum-weight spanning tree (ties by edge index), None when the
    graph is disconnected. For a maximum-bottleneck tree pass negated bandwidths."""
    uf = _UnionFind(nodes)
    chosen: list[int] = []
    for i in np.argsort(np.asarray(weights, dtype=float), kind="stable"):
        a, b = edges[int(i)]
        if uf.union(a, b):
            chosen.append(int(i))
            if len(chosen) == len(nodes) - 1:
                break
    return chosen if len(chosen) == len(nodes) - 1 else None


def minimum_arborescence(nodes: Sequence[int], arcs: Sequence[tuple[int, int]], weights: np.ndarray,
                         root: int) -> list[int] | None:
    """Chu-Liu/Edmonds: indices of the arcs of a minimum-weight spanning out-arborescence rooted at `root`
    (every other node has exactly one incoming arc and is reachable from root), None if there is none.
    For an in-arborescence (all paths lead to root) pass the reversed arcs. Dense O(n^3) numpy version."""
    return ArborescenceOracle(nodes, arcs).solve(weights, root)


class ArborescenceOracle:
    """`minimum_arborescence` for many weight vectors on one arc set (the arc set is indexed once)."""

    def __init__(self, nodes: Sequence[int], arcs: Sequence[tuple[int, int]]):
        self.nodes = list(nodes)
        self.pos = {v: i for i, v in enumerate(self.nodes)}
        keep = [i for i, (u, v) in enumerate(arcs) if u in self.pos and v in self.pos and u != v]
        self.arc_index = np.asarray(keep, dtype=np.int64)
        self.src = np.asarray([self.pos[arcs[i][0]] for i in keep], dtype=np.int64)
        self.dst = np.asarray([self.pos[arcs[i][1]] for i in keep], dtype=np.int64)

    def solve(self, weights: np.ndarray, root: int) -> list[int] | None:
        m = len(self.nodes)
        x = np.asarray(weights, dtype=float)[self.arc_index]
        w = np.full((m, m), np.inf)
        np.minimum.at(w, (self.src, self.dst), x)
        arc_id = np.full((m, m), -1, dtype=np.int64)
        hit = w[self.src, self.dst] == x  # an arc achieving the minimum of its (u, v)
        arc_id[self.src[hit][::-1], self.dst[hit][::-1]] = self.arc_index[hit][::-1]  # first index wins
        r = self.pos[root]
        parent = _edmonds_dense(w, r)
        if parent is None:
            return None
        return [int(arc_id[parent[v], v]) for v in range(m) if v != r]


def _edmonds_dense(w: np.ndarray, root: int) -> np.ndarray | None:
    """parent[v] of a minimum out-arborescence on the complete weight matrix w (inf = no arc), or None.
    Picks each node's cheapest in-arc; if they close a cycle, contracts it (arcs into the cycle pay the
    difference to the in-arc they replace), solves the smaller problem and expands."""
    m = w.shape[0]
    w = w.copy()
    np.fill_diagonal(w, np.inf)
    w[:, root] = np.inf
    parent = w.argmin(axis=0)
    cheapest = w[parent, np.arange(m)]
    cheapest[root] = 0.0
    if np.isinf(cheapest).any():
        return None
    parent[root] = -1
    cycle = None
    state = np.zeros(m, dtype=np.int64)  # 0 unseen, else the walk that saw it first (1-based)
    for start in range(m):
        if state[start]:
            continue
        v = start
        path = []
        while v != root and not state[v]:
            state[v] = start + 1
            path.append(v)
            v = int(parent[v])
        if v != root and state[v] == start + 1:
            cycle = path[path.index(v):]
            break
    if cycle is None:
        return parent
    in_cycle = np.zeros(m, dtype=bool)
    in_cycle[cycle] = True
    rest = np.flatnonzero(~in_cycle)
    cyc = np.asarray(cycle)
    k = rest.size
    w2 = np.full((k + 1, k + 1), np.inf)
    w2[:k, :k] = w[np.ix_(rest, rest)]
    enter = w[np.ix_(rest, cyc)] - cheapest[cyc][None, :]  # (k, |C|): u -> v in cycle, replacing v's in-arc
    enter_arg = enter.argmin(axis=1)
    w2[:k, k] = enter[np.arange(k), enter_arg]
    leave = w[np.ix_(cyc, rest)]  # (|C|, k): cycle -> x
    leave_arg = leave.argmin(axis=0)
    w2[k, :k] = leave[leave_arg, np.arange(k)]
    root2 = int(np.searchsorted(rest, root))
    p2 = _edmonds_dense(w2, root2)
    if p2 is None:
        return None
    out = parent.copy()  # cycle nodes keep their cheapest in-arc except where the tree enters
    for v2 in range(k):
        if v2 == root2:
            continue
        u2 = int(p2[v2])
        out[rest[v2]] = cyc[leave_arg[v2]] if u2 == k else rest[u2]
    u2 = int(p2[k])
    out[cyc[enter_arg[u2]]] = rest[u2]
    out[root] = -1
    return out


def connected(nodes: Sequence[int], edges: Sequence[tuple[int, int]]) -> bool:
    return minimum_spanning_tree(nodes, edges, np.zeros(len(edges))) is not None if len(nodes) > 1 else True


def root_tree(edges: Sequence[tuple[int, int]], root: int) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """(parent, depth, height) of every node of the undirected tree `edges` hung from `root`;
    parent[root] is absent, height of a leaf is 0."""
    adj: dict[int, list[int]] = defaultdict(list)
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    parent: dict[int, int] = {}
    depth = {root: 0}
    order = [root]
    queue = deque([root])
    while queue:
        v = queue.popleft()
        for u in sorted(adj[v]):
            if u not in depth:
                depth[u] = depth[v] + 1
                parent[u] = v
                order.append(u)
                queue.append(u)
    if len(depth) != len(adj) and adj:
        raise ValueError("edges do not form a connected tree")
    height = {v: 0 for v in order}
    for v in reversed(order):
        if v in parent:
            height[parent[v]] = max(height[parent[v]], height[v] + 1)
    return parent, depth, height


def tree_center(edges: Sequence[tuple[int, int]], nodes: Sequence[int]) -> int:
    """A node of minimum eccentricity (smallest rank on ties): the root with the shallowest tree."""
    if not edges:
        return min(nodes)
    best, best_height = None, None
    for v in sorted(nodes):
        _, _, height = root_tree(edges, v)
        if best_height is None or height[v] < best_height:
            best, best_height = v, height[v]
    return best

"""Rank orders and tree shapes of the collective algorithm families, generated in one place.

Two forms build on these shapes: the message schedules of `mlopt.sim.collective_algorithms` (timed by the
simulator) and the chunk-level `Algorithm`s of `mlopt.planners.collective.baselines` (lowered to MSCCL-EF).
Each family's shape lives here once; each form only says what moves along it.

| family             | shape                                                                            |
|--------------------|----------------------------------------------------------------------------------|
| ring               | `ring_hops`: the (src, dst) hops from a member, around a ring given in order      |
| direct             | `direct_pairs`: every ordered pair of distinct ranks                             |
| trees              | `nccl_btree` (ncclGetBtree), `binary_tree`, `shifted_tree`, `mirrored_tree`,     |
|                    | `double_binary_tree` (ncclGetDtree); `tree_depths`, `tree_height`,               |
|                    | `subtree_heights`                                                                |
| halving-doubling   | `recursive_halving`, `recursive_doubling`: per step, the distance and the block  |
|                    | range every rank sends (partner = rank ^ distance)                               |
| hierarchical       | `grid_groups`: the groups along one dimension of a grid of ranks (a torus's      |
|                    | per-dimension rings; a cluster's nodes and its same-index GPUs across nodes)     |

Trees are parent lists (`parents[r]`, -1 for the root) or {child: parent} maps (`as_parent_map`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

# ---------------------------------------------------------------------------------------------------------
# Ring and direct


def ring_hops(ring: Sequence[int], start: int, hops: int) -> list[tuple[int, int]]:
    """`hops` consecutive (src, dst) hops around `ring` (members in ring order), starting at member `start`."""
    n = len(ring)
    p = list(ring).index(start)
    return [(ring[(p + h) % n], ring[(p + h + 1) % n]) for h in range(hops)]


def direct_pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of every ordered pair of distinct ranks: rank i's p - 1 pairs in a row, to i + 1, i + 2, ...
    (mod p), so the pairs of one offset form a permutation."""
    src = np.repeat(np.arange(p), p - 1)
    dst = (src + 1 + np.tile(np.arange(p - 1), p)) % p
    return src, dst


# ---------------------------------------------------------------------------------------------------------
# Trees


def nccl_btree(p: int, rank: int) -> tuple[int, int, int]:
    """NCCL's binary tree (src/graph/trees.cc ncclGetBtree): (parent, child0, child1), -1 for none; the root
    0 has one child."""
    bit = 1
    while bit < p:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if p > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= p:
        up = rank ^ bit
    lowbit = bit >> 1
    d0 = rank - lowbit if lowbit else -1
    d1 = rank + lowbit if lowbit else -1
    while d1 >= p:
        lowbit >>= 1
        d1 = rank + lowbit if lowbit else -1
    return up, d0, d1


def binary_tree(p: int) -> list[int]:
    """Parents in NCCL's binary tree over positions 0..p-1."""
    return [nccl_btree(p, r)[0] for r in range(p)]


def shifted_tree(parents: Sequence[int]) -> list[int]:
    """The tree with every position moved up by one (mod p): position r takes the place of r - 1."""
    p = len(parents)
    return [-1 if (u := parents[(r - 1) % p]) == -1 else (u + 1) % p for r in range(p)]


def mirrored_tree(parents: Sequence[int]) -> list[int]:
    """The tree with position r in the place of p - 1 - r."""
    p = len(parents)
    return [-1 if (u := parents[p - 1 - r]) == -1 else p - 1 - u for r in range(p)]


def double_binary_tree(p: int) -> tuple[list[int], list[int]]:
    """Parents in NCCL's two trees (ncclGetDtree): the binary tree, and the second tree that shifts it by one
    position (p odd) or mirrors it (p even)."""
    first = binary_tree(p)
    return first, (shifted_tree(first) if p % 2 else mirrored_tree(first))


def as_parent_map(parents: Sequence[int]) -> dict[int, int]:
    """A parent list as {child: parent}, roots left out."""
    return {c: u for c, u in enumerate(parents) if u >= 0}


def tree_depths(parent: Mapping[int, int]) -> dict[int, int]:
    """Edges from every node of the {child: parent} map (and every parent) up to its root."""
    depth: dict[int, int] = {}
    for start in list(parent) + list(parent.values()):
        path = []
        x = start
        while x not in depth and x in parent:
            path.append(x)
            x = parent[x]
        base = depth.setdefault(x, 0)
        for y in reversed(path):
            base += 1
            depth[y] = base
    return depth


def tree_height(parents: Sequence[int]) -> int:
    """Edges on the longest root-to-leaf path of a parent list."""
    return max(tree_depths(as_parent_map(parents)).values(), default=0)


def subtree_heights(children: list[list[int]], root: int) -> list[int]:
    """Edges from each node down to its deepest leaf."""
    order, stack = [], [root]
    while stack:
        r = stack.pop()
        order.append(r)
        stack.extend(children[r])
    h = [0] * len(children)
    for r in reversed(order):
        h[r] = 1 + max((h[c] for c in children[r]), default=-1)
    return h


# ---------------------------------------------------------------------------------------------------------
# Recursive halving and doubling (p a power of two)


def recursive_halving(p: int) -> Iterator[tuple[int, np.ndarray]]:
    """Per step t: (distance d = p / 2^(t+1), start): rank i sends blocks [start[i], start[i] + d) to
    i ^ d, the half that holds the partner's block; rank i ends with block i."""
    ranks = np.arange(p)
    for t in range(p.bit_length() - 1):
        d = p >> (t + 1)
        yield d, (ranks ^ d) & ~(d - 1)


def recursive_doubling(p: int) -> Iterator[tuple[int, np.ndarray]]:
    """Per step t: (distance d = 2^t, start): rank i sends blocks [start[i], start[i] + d), all it holds,
    to i ^ d; rank i starts with block i."""
    ranks = np.arange(p)
    for t in range(p.bit_length() - 1):
        d = 1 << t
        yield d, ranks & ~(d - 1)


# ---------------------------------------------------------------------------------------------------------
# Hierarchical groups


def grid_groups(grid: np.ndarray, dim: int) -> np.ndarray:
    """The groups along dimension `dim` of a grid of ranks: (groups, size of dim) rows, members in their
    dim coordinate's order, groups in the order of the other coordinates (slowest first).

    `grid` has dimension 0 (the fastest) last: `np.arange(p).reshape(dims[::-1])` for ASTRA-sim's dims,
    or `np.array(nodes)` (one row per node, M x G) for a cluster, whose dim 0 groups are the nodes and dim 1
    groups the same-index GPUs of every node."""
    axis = grid.ndim - 1 - dim
    return np.moveaxis(grid, axis, -1).reshape(-1, grid.shape[axis])

"""Capacitated resources of a topology, as the tree-packing LP of `trees.py` sees them.

A *resource* is anything with a bandwidth that several transfers share: the links, switch ports and NICs of
`mlopt.sim.resources` (the simulator's resources, with the same keys), here with capacities in GB/s
(10^9 bytes/s, `Resource.capacity_GBps`). A transfer over arc a->b uses once each resource of
`TopologyResources.hop` for that link: the link ("link", a, b), for a switched link the sender's port
("tx", switch, a) and the receiver's ("rx", switch, b), for a link through NICs ("nic_tx", src_nic) and
("nic_rx", dst_nic).

This is the paper's section 3 (Wang, Li, Liberty, Smola, SysML'18): a switch is a star vertex that cannot
aggregate; its star edges are the per-port, per-direction capacities above, and a rank-to-rank hop through
the switch crosses two of them (out of the sender's port, into the receiver's). A NIC shared by several
GPUs is one more such vertex: every inter-node hop of any of its GPUs counts against it. A *schedule* (a
tree over ranks) uses a resource S_e times, an integer that can exceed 1 (a rank with three tree
neighbours through a switch uses its port three times), exactly the paper's redefinition
P_e = sum_S alpha_S S_e with S_e in Z+.

The LP's columns are sums of *atoms*: undirected rank pairs {a, b} (allreduce: the reduction crosses the
pair in one direction and the broadcast in the other, so an atom uses arc a->b and arc b->a once each) or
directed arcs a->b (one-way trees: reduce, broadcast, allgather). `dominated` drops resources whose
constraint another resource implies for every column, which leaves the LP optimum unchanged and makes the
generalised Lemma 2.1 bound of `trees.py` tight where it can be (see there). It is the simulator's pruning
rule (`mlopt.sim.resources.never_binds`: a resource whose traffic another carries at no larger capacity)
stated on the LP's columns, where an undirected atom uses two links, so use counts are compared per atom.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlopt.errors import InputError
from mlopt.formats.topology import Topology
from mlopt.sim.resources import ResourceKey, TopologyResources


@dataclass(frozen=True)
class ResourceModel:
    """Resources of the sub-topology induced by `ranks`, and which resources each arc uses."""

    ranks: tuple[int, ...]
    keys: tuple[ResourceKey, ...]
    capacity_GBps: np.ndarray  # per resource
    arcs: dict[tuple[int, int], tuple[int, ...]]  # (a, b) -> resource indices a transfer a->b uses

    def pairs(self) -> list[tuple[int, int]]:
        """Undirected rank pairs (a < b) with links both ways: the atoms of allreduce trees."""
        return sorted((a, b) for (a, b) in self.arcs if a < b and (b, a) in self.arcs)

    def usage(self, atoms: list[tuple[int, int]], directed: bool) -> np.ndarray:
        """Matrix atoms x resources: how often one use of the atom uses each resource."""
        m = np.zeros((len(atoms), len(self.keys)))
        for i, (a, b) in enumerate(atoms):
            for r in self.arcs[(a, b)]:
                m[i, r] += 1
            if not directed:
                for r in self.arcs[(b, a)]:
                    m[i, r] += 1
        return m


def resource_model(topology: Topology, ranks: tuple[int, ...] | None = None) -> ResourceModel:
    """Resources of `topology` restricted to the links among `ranks` (all ranks when None), numbered in
    order of first use over the links sorted by (src, dst)."""
    all_ranks = tuple(range(topology.num_ranks))
    ranks = all_ranks if ranks is None else tuple(sorted(set(ranks)))
    bad = [r for r in ranks if r not in all_ranks]
    if bad or len(ranks) < 1:
        raise InputError(topology.name, "ranks", f"unknown rank {bad[0]}" if bad else "no ranks given")
    inside = set(ranks)
    shared = TopologyResources(topology)
    index: dict[ResourceKey, int] = {}
    caps: list[float] = []
    arcs: dict[tuple[int, int], tuple[int, ...]] = {}
    for link in sorted(topology.links, key=lambda l: (l.src, l.dst)):
        if link.src not in inside or link.dst not in inside:
            continue
        used = []
        for res in shared.hop(link):
            if res.key not in index:
                index[res.key] = len(caps)
                caps.append(res.capacity_GBps)
            used.append(index[res.key])
        arcs[(link.src, link.dst)] = tuple(used)
    keys = tuple(sorted(index, key=index.get))
    return ResourceModel(ranks, keys, np.asarray(caps, dtype=float), arcs)


def dominated(usage: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Mask of resources to drop: unused ones, and r whenever some r' has capacity(r') <= capacity(r) and
    usage[:, r'] >= usage[:, r] for every atom (then every column uses r' at least as often as r, so r's
    constraint follows from r''s). Exact ties (same capacity and usage) keep the lowest index. The relation
    is a strict partial order, so every dropped resource is implied by a kept one."""
    num = usage.shape[1]
    drop = ~(usage > 0).any(axis=0)
    for r in range(num):
        if drop[r]:
            continue
        rows = np.flatnonzero(usage[:, r] > 0)
        sub = usage[rows]
        cand = np.flatnonzero(np.all(sub >= sub[:, [r]], axis=0) & (capacity <= capacity[r]))
        cand = cand[cand != r]
        if cand.size == 0:
            continue
        strict = (capacity[cand] < capacity[r]) | (cand < r) | np.any(usage[:, cand] != usage[:, [r]], axis=0)
        if strict.any():
            drop[r] = True
    return drop

"""Graph searches behind the baselines: Hamiltonian rings over a topology's links and tree embeddings."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlopt.formats.topology import Topology


class BaselineError(ValueError):
    """A baseline that does not apply to the topology or collective; the message says why."""


def bandwidths(topology: Topology) -> dict[tuple[int, int], float]:
    """(src, dst) -> GB/s of the directed link."""
    return {(l.src, l.dst): l.bandwidth_GBps for l in topology.links}


def _cycles(ranks: Sequence[int], bw: dict, usage: dict, limit: int, budget: int) -> tuple[list[list[int]], bool]:
    """Hamiltonian cycles over `ranks` (directed links in bw), found by a budgeted depth-first search that
    tries the best remaining link first (bandwidth shared by the rings already using it); and whether the
    search stayed within its budget (so finding none proves there is none)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return [list(ranks)], True
    members = set(ranks)
    out: dict[int, list[int]] = {r: [] for r in ranks}
    for (a, b) in bw:
        if a in members and b in members:
            out[a].append(b)
    eff = {e: bw[e] / (1 + usage.get(e, 0)) for e in bw}
    for r in ranks:
        out[r].sort(key=lambda v, r=r: (-eff[(r, v)], v))
    start = ranks[0]
    path = [start]
    seen = {start}
    found: list[list[int]] = []
    steps = 0

    def dfs() -> bool:  # True: stop
        nonlocal steps
        steps += 1
        if steps > budget:
            return True
        u = path[-1]
        if len(path) == len(ranks):
            if (u, start) in bw:
                found.append(list(path))
                return len(found) >= limit
            return False
        for v in out[u]:
            if v not in seen:
                seen.add(v)
                path.append(v)
                if dfs():
                    return True
                path.pop()
                seen.discard(v)
        return False

    dfs()
    return found, steps <= budget


def _score(cycle: list[int], bw: dict, usage: dict) -> tuple[float, float]:
    if len(cycle) == 1:
        return (0.0, 0.0)
    effs = [bw[e] / (1 + usage.get(e, 0)) for e in zip(cycle, cycle[1:] + cycle[:1])]
    return (min(effs), sum(effs))


SEARCH_BUDGET = 50000  # depth-first search steps per ring


def best_cycles(
    ranks: Sequence[int], bw: dict, count: int, *, limit: int = 256, budget: int = SEARCH_BUDGET
) -> list[list[int]]:
    """`count` Hamiltonian cycles over ranks, each chosen to maximise its bottleneck (then total) bandwidth
    given the links the earlier ones use; [] when the search finds none."""
    usage: dict[tuple[int, int], int] = {}
    chosen: list[list[int]] = []
    for _ in range(count):
        cands, _ = _cycles(ranks, bw, usage, limit, budget)
        if not cands:
            return []
        best = max(cands, key=lambda c: _score(c, bw, usage))  # max keeps the first of equals
        chosen.append(best)
        for e in zip(best, best[1:] + best[:1]):
            if e[0] != e[1]:
                usage[e] = usage.get(e, 0) + 1
    return chosen


def find_rings(topology: Topology, count: int) -> list[list[int]]:
    """`count` rings (rank orders; consecutive ranks and last -> first are links) over all ranks.

    Several nodes: each ring crosses every node once, entering and leaving it once: a Hamiltonian path over
    the node's own links (a cycle of the node cut open, a different cut per ring so that different rings
    leave through different GPUs) and one inter-node link to the next node. Rings are chosen to maximise the
    bottleneck bandwidth given the links earlier rings use, so the second ring of a bidirectional ring is
    its reverse and NDv2's first two rings are the two directions of the double-NVLink Hamiltonian cycle.
    """
    bw = bandwidths(topology)
    n = topology.num_ranks
    if n == 1:
        return [[0] for _ in range(count)]
    if topology.num_nodes > 1:
        rings = _multinode_rings(topology, bw, count)
        if rings:
            return rings
    rings = best_cycles(range(n), bw, count)
    if not rings:
        raise BaselineError(f"no ring over the links of {topology.name}: {no_cycle_reason(range(n), bw)}")
    return rings


def no_cycle_reason(ranks: Sequence[int], bw: dict) -> str:
    """Why best_cycles found no Hamiltonian cycle over `ranks`."""
    members = set(ranks)
    out = {r: {b for (a, b) in bw if a == r and b in members} for r in members}
    inc = {r: {a for (a, b) in bw if b == r and a in members} for r in members}
    for r in sorted(members):
        if not out[r] or not inc[r]:
            return f"rank {r} has no link {'to' if not out[r] else 'from'} another rank"
    start = min(members)
    for adj in (out, inc):
        seen, stack = {start}, [start]
        while stack:
            for v in adj[stack.pop()]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        if seen != members:
            missing = sorted(members - seen)
            return (
                f"the links do not connect all ranks (rank {start} and rank {missing[0]} are not connected both ways)"
            )
    if _cycles(sorted(members), bw, {}, 1, SEARCH_BUDGET)[1]:
        return f"no cycle passes through all {len(members)} ranks (e.g. the links form a tree)"
    return f"no cycle through all {len(members)} ranks was found within the search budget"


def _multinode_rings(topology: Topology, bw: dict, count: int) -> list[list[int]] | None:
    per_node = []
    for node in topology.nodes:
        cyc = best_cycles(node.ranks, bw, count)
        if not cyc:
            return None
        per_node.append(cyc)
    rings = []
    for rho in range(count):
        ring = None
        for shift in range(max(len(node.ranks) for node in topology.nodes)):
            paths = []
            for m, node in enumerate(topology.nodes):
                cyc = per_node[m][rho]
                g = len(cyc)
                j = (rho * max(1, g // count) + shift) % g
                paths.append(cyc[j + 1:] + cyc[: j + 1])  # enters at cyc[j+1], leaves at cyc[j]
            if all((paths[m][-1], paths[(m + 1) % len(paths)][0]) in bw for m in range(len(paths))):
                ring = [r for p in paths for r in p]
                break
        if ring is None:
            return None
        rings.append(ring)
    return rings


def embed(positions: int, edges: Sequence[tuple[int, int]], ranks: Sequence[int],
          linked: Callable[[int, int], bool], budget: int = 200000) -> list[int] | None:
    """A map position -> rank (injective, onto `ranks`) under which every edge joins linked ranks, trying the
    identity first and then a budgeted backtracking search; None when none is found."""
    ranks = list(ranks)
    adj: dict[int, set[int]] = {p: set() for p in range(positions)}
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    if all(linked(ranks[a], ranks[b]) for a, b in edges):
        return ranks
    order: list[int] = []
    for p in sorted(range(positions), key=lambda p: -len(adj[p])):  # BFS from the busiest position
        if p in order:
            continue
        queue = [p]
        order.append(p)
        while queue:
            x = queue.pop(0)
            for y in sorted(adj[x], key=lambda y: -len(adj[y])):
                if y not in order:
                    order.append(y)
                    queue.append(y)
    assign: dict[int, int] = {}
    used: set[int] = set()
    steps = 0

    def go(i: int) -> bool:
        nonlocal steps
        if i == len(order):
            return True
        p = order[i]
        for r in ranks:
            steps += 1
            if steps > budget:
                return False
            if r in used:
                continue
            if all(linked(r, assign[q]) for q in adj[p] if q in assign):
                assign[p] = r
                used.add(r)
                if go(i + 1):
                    return True
                del assign[p]
                used.discard(r)
        return False

    if go(0):
        return [assign[p] for p in range(positions)]
    return None

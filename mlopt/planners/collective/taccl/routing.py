"""Stage 1: the routing MILP (TACCL §5.5.1, eq. 5.1-5.15).

Variables (Table 5.2), for chunk c, rank r and candidate link (u, v) of c (see logical.candidates):
  time              continuous  the collective's time (objective)
  start[c, r]       continuous  when c becomes available at r (r in spset(c), r not c's source)
  send[c, u, v]     continuous  when c is sent over (u, v)
  is_sent[c, u, v]  binary      c is sent over (u, v)
  is_util[u, v]     binary      some chunk uses switch-hyperedge link (u, v) (only links with a uc policy)

Symmetry (5.12-5.14) is imposed by sharing: all keys of one orbit of the symmetry group (start, send,
is_sent, is_util) are one model variable, so the model only has one variable per orbit, and rows that
become identical are added once. An orbit with a member that is not a candidate is fixed to 0.

Constraints: (5.2) time >= start at destinations; (5.3) start = 0 at the source (a constant); (5.4) send
after arrival; (5.5) is_sent -> start >= send + lat, big-M with M = H + lat - EA; (5.6) per-link relaxed
bandwidth; (5.7)/(5.8) per switch port; (5.9)/(5.10) is_util; (5.11) objective; (5.12)-(5.14) symmetry;
(5.15) inter-node. Besides the paper's rows (the text leaves "other less important constraints" out):
- each destination receives a chunk exactly once, any other rank at most once, and a rank forwards a chunk
  only if it received it (TACCL's code; without it an unreached rank's free start would let it send);
- TACCL's per-chunk switch row: a rank sends one chunk to its switched destinations one at a time;
- enforce_ordering from the sketch (TACCL's code);
- valid inequalities the LP needs (the big-M rows are void when is_sent is fractional): start[c, r] >=
  EA[c, r] as a bound and start[c, r] >= sum_u (EA[c, u] + lat(u, r)) is_sent[c, u, r], with EA the
  earliest arrival over c's candidate links. On ndv2x2 / sk2 this takes stage 1 from a 75 % gap after 60 s
  to proven optimal in 0.2 s.
On links where stage 3 may merge chunks, (5.6) charges alpha / max_group + beta * s per chunk instead of
lat (a merged message of g chunks costs alpha + g beta s), so that the stage-1 bound stays a lower bound of
every stage-3 schedule of the family (see synthesizer.py).

All times are scaled by `unit` (the largest link latency) inside the model so that coefficients are O(1).
"""

from __future__ import annotations

import heapq
import math
import time as _time
from dataclasses import dataclass, replace

import numpy as np

from mlopt.planners.collective.taccl.logical import Candidates, ChunkModel, Generator, LogicalTopology
from mlopt.solvers import Model, SolveOptions, SolveResult, Status


@dataclass(frozen=True)
class Routes:
    """Stage 1's answer: for each chunk, the links it is sent over (a tree from its source)."""

    edges: tuple[tuple[tuple[int, int], ...], ...]  # chunk -> links in order of arrival
    arrival_us: dict  # (chunk, rank) -> relaxed arrival time along the tree (stage-1 times, no contention)
    time_us: float | None  # stage-1 time (relaxed)
    util_links: frozenset  # switch-hyperedge links that carry a chunk


@dataclass(frozen=True)
class RoutingOutcome:
    routes: Routes | None
    result: SolveResult
    time_bound_us: float | None  # lower bound on `time` alone (the gamma term removed, see routing_bound)
    num_vars: int
    num_rows: int
    num_binaries: int
    build_s: float
    bound_result: SolveResult | None = None  # the re-solve for `time` alone (options.bound_resolve)


class _UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def add(self, key):
        self.parent.setdefault(key, key)

    def find(self, key):
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if rb < ra:
                ra, rb = rb, ra
            self.parent[rb] = ra  # smallest key is the root: deterministic


class _Rows:
    """Adds rows to a Model once: symmetric copies of a row are the same row after variable sharing."""

    def __init__(self, model: Model):
        self.model = model
        self.seen: set = set()

    def add(self, terms: list[tuple[int, float]], lb: float, ub: float) -> None:
        merged: dict[int, float] = {}
        for idx, coef in terms:
            merged[idx] = merged.get(idx, 0.0) + coef
        items = tuple(sorted((i, round(c, 12)) for i, c in merged.items() if c != 0.0))
        key = (items, lb, ub)
        if key in self.seen:
            return
        self.seen.add(key)
        if not items:
            return  # a constant row; callers only produce feasible ones (0 within [lb, ub])
        self.model.add_constraint([i for i, _ in items], [c for _, c in items], lb, ub)


def solve_routing(logical: LogicalTopology, chunks: ChunkModel, cand: Candidates, gens: list[Generator],
                  solver, options) -> RoutingOutcome:
    t_build = _time.perf_counter()
    m = _RoutingModel(logical, chunks, cand, gens, options)
    # Rows are added block by block in a fixed order: the MPS and the solver's path depend on it.
    for c in range(m.C):
        message = _add_eq5_2_receive_once(m, c)
        if message is not None:
            return _infeasible(m.model, message, t_build)
        _add_eq5_4_eq5_5_send_after_arrival(m, c)
    per_link = _sends_per_link(m)
    _add_eq5_6_link_bandwidth(m, per_link)
    _add_eq5_7_eq5_8_switch_ports(m, per_link)
    _add_eq5_7_per_chunk_switch_sends(m)
    util_terms = _add_eq5_9_eq5_10_is_util(m, per_link)
    _add_eq5_15_internode(m)
    _add_enforce_ordering(m)
    gamma = _set_eq5_1_eq5_11_objective(m, options, util_terms)
    build_s = _time.perf_counter() - t_build

    form = m.model.to_arrays()
    num_bin = int(form.integrality.sum())
    result = solver.solve(form, SolveOptions(time_limit_s=options.time_limit_s, node_limit=options.node_limit,
                                             mip_gap=options.mip_gap, threads=options.threads, seed=options.seed,
                                             verbose=options.verbose, dump_model=_dump(options, "routing")))
    time_bound, bound_result = _time_bound(m, result, solver, options, util_terms, gamma)
    routes = None
    if result.status.has_solution:
        routes = _read_routes(result.x, logical, chunks, cand, m.x, m.time_var, m.unit)
    return RoutingOutcome(routes, _scaled(result, m.unit), time_bound, form.num_vars, form.num_constraints,
                          num_bin, build_s, None if bound_result is None else _scaled(bound_result, m.unit))


class _RoutingModel:
    """The routing MILP under construction: link costs, symmetry orbits, EA bounds and one variable per orbit.

    Variables are created lazily on first use (var), so the order in which the constraint blocks ask for them
    is the model's column order: keep the blocks' order and their loops' order.
    """

    def __init__(self, logical: LogicalTopology, chunks: ChunkModel, cand: Candidates, gens: list[Generator],
                 options):
        self.logical, self.chunks, self.cand = logical, chunks, cand
        self.C = C = chunks.num_chunks
        self.unit = unit = logical.max_lat
        self.lat = {key: l.lat_us / unit for key, l in logical.links.items()}
        W = max(1, options.max_group)
        # Relaxed per-link cost of one more chunk in eq. 5.6: lat, or on links where stage 3 may merge up to W
        # chunks into one send, alpha / W + beta * s (a group of g chunks costs alpha + g beta s >= g (alpha/W + beta s)),
        # so that the stage-1 bound stays a lower bound of every stage-3 schedule.
        self.load = {key: (l.alpha_us / W + (l.lat_us - l.alpha_us)) / unit if l.contiguous and W > 1
                     else l.lat_us / unit for key, l in logical.links.items()}
        self.pre = pre = chunks.source
        self.uf, self.cand_set, self.util_links, self.dead_roots = _symmetry_orbits(logical, chunks, cand, gens)

        # Earliest arrival EA[c, r]: shortest latency from c's source to r over c's candidate links. Valid bounds
        # (every route of c to r takes at least that long) that the big-M rows alone do not give the LP.
        self.EA = EA = _earliest_arrivals(cand, pre, self.lat, C)

        self.model = Model("taccl_routing")
        self.rows = _Rows(self.model)
        self.var_of: dict = {}

        # Horizon: with given routes, setting every start to its earliest arrival is optimal for the relaxed
        # model, so some optimal solution has all starts within (longest simple path + 1 for enforce_ordering)
        # hops of the largest latency. Starts and sends live in [0, H]; M = H + 1 makes eq. 5.5 slack when unsent.
        H = float(max(len(r) for r in cand.ranks) + 1)
        self.M = H + 1.0
        self.H = max(H, max((max(ea.values()) for ea in EA), default=0.0))
        self.lower = _orbit_lower_bounds(self.uf, EA)

        self.time_var = self.model.add_var("time", 0.0)
        self.in_links: dict = {}
        self.out_links: dict = {}
        for c in range(C):
            for (u, v) in cand.links[c]:
                if self.var(("x", c, u, v)) is None:
                    continue
                self.in_links.setdefault((c, v), []).append(u)
                self.out_links.setdefault((c, u), []).append(v)

    def var(self, key):
        """The model variable of key's orbit (created on first use), or None for an orbit fixed to 0."""
        root = self.uf.find(key)
        if root in self.dead_roots:
            return None
        if root not in self.var_of:
            kind = root[0]
            name = f"{ {'x': 'is_sent', 's': 'send', 't': 'start', 'u': 'is_util'}[kind] }[{','.join(map(str, root[1:]))}]"
            name = name.replace(" ", "")
            if kind in ("x", "u"):
                self.var_of[root] = self.model.add_binary(name)
            else:
                self.var_of[root] = self.model.add_var(name, min(self.lower.get(root, 0.0), self.H), self.H)
        return self.var_of[root]

    def x(self, c, u, v):
        """is_sent[c, u, v], or None when (u, v) is not a candidate link of c (or its orbit is fixed to 0)."""
        return self.var(("x", c, u, v)) if (c, u, v) in self.cand_set else None

    def start_terms(self, c, r, coef):
        """coef * start[c, r] (start of a source is the constant 0: eq. 5.3)."""
        if r == self.pre[c]:
            return []
        return [(self.var(("t", c, r)), coef)]


def _symmetry_orbits(logical: LogicalTopology, chunks: ChunkModel, cand: Candidates, gens: list[Generator]):
    """The union-find of variable keys under (5.12)-(5.14), the candidate keys, the switch-hyperedge links
    some chunk may use, and the roots of orbits fixed to 0."""
    C, pre = chunks.num_chunks, chunks.source
    uf = _UnionFind()
    cand_set = set()
    for c in range(C):
        for (u, v) in cand.links[c]:
            cand_set.add((c, u, v))
            uf.add(("x", c, u, v))
            uf.add(("s", c, u, v))
        for r in cand.ranks[c]:
            if r != pre[c]:
                uf.add(("t", c, r))
    util_links = sorted(key for key, l in logical.links.items() if l.gamma_sign != 0)
    used_util = {(u, v) for (_, u, v) in cand_set if (u, v) in set(util_links)}
    util_links = [key for key in util_links if key in used_util]
    for key in util_links:
        uf.add(("u",) + key)
    # (5.12) start, (5.13) send, (5.14) is_sent of a chunk and link equal those of the rotated chunk and link:
    # union the keys (links only when both ends are in one symmetry group, as in TACCL; starts for all ranks)
    dead: set = set()
    for g in gens:
        sig, pi = g.rank, g.chunk
        for (c, u, v) in sorted(cand_set):
            if not g.same_group(u, v):
                continue
            img = (pi[c], sig[u], sig[v])
            if img in cand_set:
                uf.union(("x", c, u, v), ("x",) + img)
                uf.union(("s", c, u, v), ("s",) + img)
            else:
                dead.add(("x", c, u, v))
        for c in range(C):
            for r in cand.ranks[c]:
                if r == pre[c]:
                    continue
                img = ("t", pi[c], sig[r])
                if img in uf.parent:
                    uf.union(("t", c, r), img)
        for (u, v) in util_links:
            if g.same_group(u, v) and (sig[u], sig[v]) in used_util:
                uf.union(("u", u, v), ("u", sig[u], sig[v]))
    dead_roots = {uf.find(k) for k in dead}
    return uf, cand_set, util_links, dead_roots


def _orbit_lower_bounds(uf: _UnionFind, EA: list[dict[int, float]]) -> dict:
    """Lower bounds of shared start/send variables: the largest EA over the orbit's members."""
    lower: dict = {}
    for key in uf.parent:
        if key[0] == "t":
            lb = EA[key[1]].get(key[2], 0.0)
        elif key[0] == "s":
            lb = EA[key[1]].get(key[2], 0.0)
        else:
            continue
        root = uf.find(key)
        lower[root] = max(lower.get(root, 0.0), lb)
    return lower


def _add_eq5_2_receive_once(m: _RoutingModel, c: int) -> str | None:
    """(5.2) time >= start at c's destinations, receive-once rows and the valid EA row on start; returns why
    the model is infeasible when a destination has no candidate link in."""
    post = m.chunks.post[c]
    rows, x, in_links = m.rows, m.x, m.in_links
    for r in sorted(m.cand.ranks[c]):
        if r == m.pre[c]:
            continue
        senders_in = [x(c, u, r) for u in in_links.get((c, r), [])]
        # every destination receives c exactly once; any other rank at most once
        if r in post:
            # (5.2) time >= start[c, r] for every (c, r) in the postcondition
            rows.add([(m.time_var, 1.0)] + m.start_terms(c, r, -1.0), 0.0, math.inf)
            if not senders_in:
                return f"chunk {c} cannot reach rank {r} within its candidates"
            rows.add([(i, 1.0) for i in senders_in], 1.0, 1.0)
        elif senders_in:
            rows.add([(i, 1.0) for i in senders_in], -math.inf, 1.0)
        # (valid, with 5.4/5.5) start[c, r] >= sum_u (EA[c, u] + lat(u, r)) * is_sent[c, u, r]
        if senders_in:
            rows.add(m.start_terms(c, r, 1.0) + [(x(c, u, r), -(m.EA[c][u] + m.lat[(u, r)]))
                                                 for u in in_links.get((c, r), [])], 0.0, math.inf)
    return None


def _add_eq5_4_eq5_5_send_after_arrival(m: _RoutingModel, c: int) -> None:
    """(5.4) send after arrival, the flow row (forward only what was received) and (5.5) big-M arrival."""
    rows, x, lat, pre = m.rows, m.x, m.lat, m.pre
    for (u, v) in m.cand.links[c]:
        xi = x(c, u, v)
        if xi is None:
            continue
        si = m.var(("s", c, u, v))
        # (5.4) a chunk is sent on a link only after it has arrived at the sender
        rows.add([(si, 1.0)] + m.start_terms(c, u, -1.0), 0.0, math.inf)
        # ... and only from a rank that received it (a start of an unreached rank is free, so this
        # flow condition is what ties sending to holding)
        if u != pre[c]:
            rows.add([(xi, 1.0)] + [(x(c, w, u), -1.0) for w in m.in_links.get((c, u), [])], -math.inf, 0.0)
        # (5.5) is_sent[c,u,v] -> start[c,v] >= send[c,u,v] + lat(u,v), as a big-M row. The paper's
        # indicator has "=", but start only bounds time and later sends from below, so ">=" has the same
        # optimum and readback recomputes exact arrivals.
        Mi = m.H + lat[(u, v)] - m.EA[c][v]  # start[c,v] >= EA[c,v] and send <= H make the row slack if unsent
        rows.add(m.start_terms(c, v, 1.0) + [(si, -1.0), (xi, -Mi)], lat[(u, v)] - Mi, math.inf)


def _sends_per_link(m: _RoutingModel) -> dict:
    """link -> the is_sent variables of the chunks that may cross it."""
    per_link: dict = {}
    for (c, u, v) in sorted(m.cand_set):
        xi = m.x(c, u, v)
        if xi is not None:
            per_link.setdefault((u, v), []).append(xi)
    return per_link


def _add_eq5_6_link_bandwidth(m: _RoutingModel, per_link: dict) -> None:
    """(5.6) relaxed bandwidth per link: time >= sum_c lat(u, v) * is_sent[c, u, v]."""
    for key, xs in sorted(per_link.items()):
        m.rows.add([(m.time_var, 1.0)] + [(i, -m.load[key]) for i in xs], 0.0, math.inf)


def _add_eq5_7_eq5_8_switch_ports(m: _RoutingModel, per_link: dict) -> None:
    """(5.7) / (5.8) relaxed bandwidth per switch: everything r sends (receives) through one switch's port.

    The extracted text reads "forall r in S_send" with sums over dst in S_r^send (src in S_r^recv); we read
    it as one row per rank and switch: time >= sum_c sum_{dst switched from r} lat(r, dst) is_sent[c, r, dst]
    (and the same for receives), which is what the prose says and what TACCL's code adds.
    """
    send_port: dict = {}
    recv_port: dict = {}
    for key, xs in sorted(per_link.items()):
        l = m.logical.links[key]
        if l.port is None:
            continue
        send_port.setdefault((l.port, key[0]), []).extend((i, m.lat[key]) for i in xs)
        recv_port.setdefault((l.port, key[1]), []).extend((i, m.lat[key]) for i in xs)
    for _, terms in sorted(send_port.items()):
        m.rows.add([(m.time_var, 1.0)] + [(i, -w) for i, w in terms], 0.0, math.inf)
    for _, terms in sorted(recv_port.items()):
        m.rows.add([(m.time_var, 1.0)] + [(i, -w) for i, w in terms], 0.0, math.inf)


def _add_eq5_7_per_chunk_switch_sends(m: _RoutingModel) -> None:
    """(5.7, per chunk; TACCL's code) a rank sends one chunk to its switched destinations one at a time:
    time >= start[c, r] + sum_dst lat(r, dst) * is_sent[c, r, dst]."""
    for c in range(m.C):
        for u in sorted(m.cand.ranks[c]):
            switched = [(m.x(c, u, v), m.lat[(u, v)]) for v in m.out_links.get((c, u), [])
                        if m.logical.links[(u, v)].port is not None]
            if len(switched) >= 2:
                m.rows.add([(m.time_var, 1.0)] + m.start_terms(c, u, -1.0) + [(i, -w) for i, w in switched],
                           0.0, math.inf)


def _add_eq5_9_eq5_10_is_util(m: _RoutingModel, per_link: dict) -> list[tuple[int, int]]:
    """(5.9) / (5.10) is_util[u, v] = 1 iff some chunk is sent over switch-hyperedge link (u, v); returns the
    objective terms (is_util variable, gamma sign)."""
    util_terms = []
    for key in m.util_links:
        ui = m.var(("u",) + key)
        xs = per_link.get(key, [])
        for i in xs:
            m.rows.add([(ui, 1.0), (i, -1.0)], 0.0, math.inf)
        m.rows.add([(ui, 1.0)] + [(i, -1.0) for i in xs], -math.inf, 0.0)
        util_terms.append((ui, m.logical.links[key].gamma_sign))
    return util_terms


def _add_eq5_15_internode(m: _RoutingModel) -> None:
    """(5.15) a chunk with a destination in another node crosses into that node at least once."""
    node_of, pre, x = m.logical.node_of, m.pre, m.x
    for c in range(m.C):
        src_node = node_of[pre[c]]
        for dst_node in sorted({node_of[r] for r in m.chunks.post[c]} - {src_node}):
            xs = [x(c, u, v) for (u, v) in m.cand.links[c]
                  if node_of[u] == src_node and node_of[v] == dst_node and x(c, u, v) is not None]
            if xs:
                m.rows.add([(i, 1.0) for i in xs], 1.0, math.inf)


def _add_enforce_ordering(m: _RoutingModel) -> None:
    """enforce_ordering (sketch; TACCL's code): on its inter-node links a sender sends its own chunks first:
    is_sent[c_own, s, r] -> send[c, s, r] >= send[c_own, s, r] + lat(s, r) for relayed chunks c."""
    if not m.logical.enforce_ordering:
        return
    x, M = m.x, m.M
    for (u, v), l in sorted(m.logical.links.items()):
        if not l.internode:
            continue
        on_link = [c for c in range(m.C) if x(c, u, v) is not None]
        own = [c for c in on_link if m.pre[c] == u]
        relayed = [c for c in on_link if m.pre[c] != u]
        for co in own:
            for c in relayed:
                m.rows.add([(m.var(("s", c, u, v)), 1.0), (m.var(("s", co, u, v)), -1.0), (x(co, u, v), -M)],
                           m.lat[(u, v)] - M, math.inf)


def _set_eq5_1_eq5_11_objective(m: _RoutingModel, options, util_terms) -> float:
    """(5.1) minimise time, with (5.11) the switch-hyperedge term; returns gamma (in model time units).

    time + gamma * sum is_util over switch-hyperedge links; gamma > 0 for uc-min, < 0 for uc-max (per the
    link's switch policy). gamma is options.gamma times the smallest link latency (TACCL: 0.01 time units per
    link).
    """
    gamma = options.gamma * m.logical.min_lat / m.unit
    obj_idx = [m.time_var] + [i for i, _ in util_terms]
    obj_coef = [1.0] + [gamma * s for _, s in util_terms]
    m.model.set_objective(obj_idx, obj_coef, "min")
    return gamma


def _time_bound(m: _RoutingModel, result: SolveResult, solver, options, util_terms, gamma):
    """A lower bound on `time` alone (us) and the re-solve that tightens it (options.bound_resolve), if run."""
    # obj = time + gamma * (sum of uc-min links) - gamma * (sum of uc-max links),
    # so time >= bound - gamma * (number of uc-min links).
    time_bound = None
    if result.best_bound is not None and math.isfinite(result.best_bound):
        n_min = sum(1 for _, s in util_terms if s > 0)
        time_bound = max(0.0, (result.best_bound - gamma * n_min)) * m.unit
    bound_result = None
    if util_terms and options.bound_resolve and result.status is Status.OPTIMAL:
        # That bound is loose by the gamma term; re-solve for time alone (from this solution) to bound it.
        m.model.set_objective([m.time_var], [1.0], "min")
        bound_options = SolveOptions(time_limit_s=options.time_limit_s, node_limit=options.node_limit,
                                     mip_gap=options.mip_gap, threads=options.threads, seed=options.seed,
                                     verbose=options.verbose)
        bound_result = solver.solve(m.model, bound_options, start=result.x)
        if bound_result.best_bound is not None and math.isfinite(bound_result.best_bound):
            time_bound = max(time_bound or 0.0, bound_result.best_bound * m.unit)
    return time_bound, bound_result


def _earliest_arrivals(cand: Candidates, pre, lat, C) -> list[dict[int, float]]:
    out = []
    for c in range(C):
        adj: dict[int, list[int]] = {}
        for (u, v) in cand.links[c]:
            adj.setdefault(u, []).append(v)
        dist = {pre[c]: 0.0}
        heap = [(0.0, pre[c])]
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            for v in adj.get(u, ()):
                nd = d + lat[(u, v)]
                if nd < dist.get(v, math.inf):
                    dist[v] = nd
                    heapq.heappush(heap, (nd, v))
        out.append(dist)
    return out


def _dump(options, suffix):
    if not options.dump_model:
        return None
    stem = options.dump_model[:-4] if options.dump_model.endswith(".mps") else options.dump_model
    return f"{stem}-{suffix}.mps"


def _scaled(result: SolveResult, unit: float) -> SolveResult:
    """The result with objective and bound in us."""
    return replace(result, objective=None if result.objective is None else result.objective * unit,
                   best_bound=None if result.best_bound is None or not math.isfinite(result.best_bound)
                   else result.best_bound * unit)


def _infeasible(model, message, t_build):
    result = SolveResult(Status.INFEASIBLE, None, None, None, 0.0, None, "none", "", message)
    return RoutingOutcome(None, result, None, model.num_vars, model.num_constraints, 0,
                          _time.perf_counter() - t_build)


def _read_routes(xv: np.ndarray, logical, chunks: ChunkModel, cand: Candidates, x, time_var, unit) -> Routes:
    """Trees from is_sent; links that lead to no destination are pruned; relaxed arrivals recomputed."""
    edges_out = []
    arrival = {}
    util = set()
    for c in range(chunks.num_chunks):
        chosen = [(u, v) for (u, v) in cand.links[c] if (i := x(c, u, v)) is not None and xv[i] > 0.5]
        by_src: dict[int, list[int]] = {}
        for u, v in chosen:
            by_src.setdefault(u, []).append(v)
        # walk from the source (in order of arrival), keeping links from ranks that hold c
        s = chunks.source[c]
        t_at = {s: 0.0}
        order: list[tuple[int, int]] = []
        frontier = [s]
        while frontier:
            u = min(frontier, key=lambda r: (t_at[r], r))
            frontier.remove(u)
            for v in sorted(by_src.get(u, [])):
                if v in t_at:
                    continue
                t_at[v] = t_at[u] + logical.links[(u, v)].lat_us
                order.append((u, v))
                frontier.append(v)
        # prune links into ranks that are not destinations and forward nothing
        post = chunks.post[c]
        keep = list(order)
        changed = True
        while changed:
            changed = False
            senders = {u for u, _ in keep}
            for e in list(keep):
                if e[1] not in post and e[1] not in senders:
                    keep.remove(e)
                    changed = True
        edges_out.append(tuple(keep))
        held = {s} | {v for _, v in keep}
        missing = post - held
        if missing:
            raise RuntimeError(f"stage 1 returned a routing that misses chunk {c} at ranks {sorted(missing)}")
        for r in held:
            arrival[(c, r)] = t_at[r]
        for e in keep:
            if logical.links[e].gamma_sign != 0:
                util.add(e)
    time_us = float(xv[time_var]) * unit
    return Routes(tuple(edges_out), arrival, time_us, frozenset(util))

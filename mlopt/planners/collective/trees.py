"""Spanning-tree packing for aggregation: Wang, Li, Liberty, Smola, "Optimal Message Scheduling for
Aggregation", SysML'18 (paper text: shared/papers/002_248fbf44b361dd16.txt).

## The LP (paper eq. 2)

The paper sends a fraction alpha_T of the data along spanning tree T (sum alpha_T = 1, i.e. a point of the
spanning-tree polytope), streams it (a node aggregates what its children send before forwarding, so tree
depth costs only pipeline fill), and minimises the most loaded edge:

    C(G) = min_{alpha in P(G)} max_e P_e c_e,   P_e = sum_T alpha_T T_e,   c_e = time to send all data over e

(eq. 2; in the extracted text the polytope is written P(G) and the eq. 1 single-tree cost C(T) = max_e c_e
T_e). With y_T = alpha_T / C(G) this is the packing LP this module solves, in rate form:

    maximise R = sum_T y_T   s.t.   sum_T U_r(T) y_T <= cap_r  for every resource r,   y >= 0

where cap_r is a bandwidth (GB/s) and U_r(T) the number of times one unit of data on T crosses resource r
(see `trees_resources`). Then C(G) = D / R for data size D (`TreePacking.paper_C`): the aggregation
*capacity* R is what the brief calls C(G); the paper's C(G) is the time per D. For a plain graph (every
resource an undirected edge used once per tree) this is exactly eq. 2.

## Column generation, solved from the dual side

The LP has a column per spanning tree, exponentially many. Its dual is

    minimise sum_r cap_r w_r   s.t.   sum_r U_r(T) w_r >= 1 for every T,   w >= 0,

and since U_r(T) = sum_{atoms a in T} U_r(a), the separation / pricing problem "is there a tree of
w-weight below 1?" is a minimum spanning tree with atom weights pi_a = sum_r U_r(a) w_r (Kruskal). We keep a
restricted set S of trees, solve the restricted dual with the solver layer (which returns primal values,
not duals, so the dual is written out explicitly; this is Kelley's cutting-plane method, the dual view of
column generation), price with Kruskal, and add the tree while its weight m < 1. On exit, w / m is a
feasible dual for *all* trees, so R <= (sum cap w) / m: the certificate `upper_bound_GBps`; the restricted
primal (solved last, giving the weights y_T) reaches sum cap w, so the gap is 1/m - 1 and the minimum
reduced cost m - 1 is reported. Every step is polynomial (Kruskal, an LP with one row per generated tree).

## Directedness

Links are directed and may differ per direction. For `mode="allreduce"` (the paper's gather-scatter) a
tree is undirected: the reduction sends every tree edge {a, b} one way and the broadcast the other way, so
one unit on T uses link a->b *and* link b->a once each (and the switch ports / NICs on both directions).
With symmetric links this is "capacity = min of both directions"; a pair is a candidate edge only when links
exist both ways. One-way collectives use arborescences in the directed graph instead (pricing by
Chu-Liu/Edmonds): `mode="reduce"` in-arborescences into `root`, `mode="broadcast"` out-arborescences from
`root`, `mode="allgather"` out-arborescences from *every* rank with an equal rate per rank (ForestColl-style
bandwidth-optimal allgather: maximise x s.t. each rank's trees carry x), `mode="reducescatter"` its mirror.

## Switches and NICs (paper section 3)

A switch cannot aggregate, so trees are over ranks only and a hop a->b through a switch is mapped to the
existing all-pairs link a->b; its cost is the star model of section 3: it uses the sender's out-port and the
receiver's in-port, each a capacity 1000 / port_beta_us_per_MB per direction. A rank with d tree neighbours
through the switch uses its port d times per direction (the paper's S_e in Z+), so the LP prefers chains
through a switch; on `switch:n` it finds R = n B / (2 (n - 1)) (B = port bandwidth), the bandwidth of ring
allreduce, not the R = B a star with an aggregating hub would give. A NIC shared by several GPUs is a
resource (one per direction) that every inter-node hop of any of those GPUs counts against: a capacity
constraint on the sum over those links, as the brief suggests.

## Lemma 2.1 (eq. 3)

    max_e c_e >= C(T_MWST) >= C(G) >= (n - 1) / sum_e c_e^{-1}

(the extracted text drops the sum's range; it is over the edges of G, as the prose "sum of overall edge
bandwidths uniformly distributed over a single spanning tree (n - 1 edges)" says). In rate form the last
inequality is R <= sum_e bw_e / (n - 1): setting every w_e = 1/(n - 1) is dual feasible since every tree has
n - 1 edges. `Lemma21` implements that argument on the resources: R <= sum_r cap_r / K with K the fewest
resource uses of any tree (a minimum spanning tree with atom weights sum_r U_r(a)), after dropping
dominated resources (`trees_resources.dominated`). For a switch-free graph with symmetric links that is
*exactly* the lemma's (n - 1) / sum_e c_e^{-1} (each pair keeps one resource, K = n - 1); with switches it
is the same uniform-dual argument on the paper's star graph (for `switch:n` it is tight). `time_lower_us(D)`
is the lemma's bound on aggregation time, D (n - 1) / sum_e bw_e for a plain graph. C(T_MWST), the best
single tree, is the maximum-bottleneck spanning tree (Kruskal on bandwidth; the paper uses Boruvka).

Paper values (section 2): P3.16xlarge / DGX-1 (8 V100s, 24 NVLink lanes): C(G) = 7/24 in units of one
lane's transfer time, which equals the Lemma 2.1 bound; P3.8xlarge (4 GPUs): C(G) = 1/3. Our `ndv2`
preset gives R = 24/7 lanes (C = 7/24) and its ranks 0-3 (9 lanes) R = 3 lanes (C = 1/3).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from mlopt.errors import InfeasibleError, InputError
from mlopt.formats.topology import Topology
from mlopt.planners.collective.trees_graph import ArborescenceOracle, connected, minimum_spanning_tree
from mlopt.planners.collective.trees_resources import ResourceKey, ResourceModel, dominated, resource_model
from mlopt.planners.collective.trees_schedule import (  # noqa: F401 - the realisers are part of this API
    TimeEstimate,
    choose_chunks_per_rank,
    estimate_time,
    largest_remainder,
    list_schedule,
    rounded_rate_GBps,
    tree_allgather,
    tree_allreduce,
    tree_broadcast,
    tree_reduce,
    tree_reducescatter,
)
from mlopt.planners.options import PlannerOptions
from mlopt.solvers import Model, SolveOptions, Status, resolve_solver

__all__ = [
    "Lemma21", "PackedTree", "TimeEstimate", "TreePacking", "choose_chunks_per_rank", "estimate_time",
    "largest_remainder", "lemma21_paper_bound", "list_schedule", "packing_lp", "rounded_rate_GBps",
    "tree_allgather", "tree_allreduce", "tree_broadcast", "tree_reduce", "tree_reducescatter",
]

MODES = ("allreduce", "reduce", "broadcast", "allgather", "reducescatter")
ROOTED_MODES = ("reduce", "broadcast")
DEFAULT_TOLERANCE = 1e-7  # relative optimality gap at which column generation stops
DEFAULT_MAX_ITERATIONS = 5000
WEIGHT_EPS = 1e-9  # trees below this fraction of the total rate are dropped from the answer


@dataclass(frozen=True)
class PackedTree:
    """One tree of the packing and the rate it carries.

    edges: undirected rank pairs (a, b) with a < b for `allreduce` packings (rooted when realised); for the
    arborescence modes directed arcs (src, dst) in the direction the data flows: child -> parent into
    `root` (reduce, reducescatter) or parent -> child out of `root` (broadcast, allgather).
    """

    edges: tuple[tuple[int, int], ...]
    weight_GBps: float
    root: int | None = None


@dataclass(frozen=True)
class Lemma21:
    """The chain of eq. 3 in rate form (rates are 1 / time): min_e bw_e <= R(T_MWST) <= R <= rate_upper.

    rate_upper_GBps: sum_r cap_r / K (the lemma's sum_e c_e^{-1} / (n - 1), generalised; see module doc).
    mwst_rate_GBps / min_edge_GBps: the single maximum-bottleneck tree and the slowest edge (allreduce
    packings only, else None). The chain's left end (min_e bw_e <= R(T_MWST)) is the paper's section-2
    statement for plain graphs; through a switch a tree's rate also divides by port degree, so it need not
    hold there (switch:4: one pair alone gets B, the best-bottleneck tree B / 3).
    exact: True when the topology has no switch or NIC and symmetric links, so rate_upper is literally the
    paper's (n - 1) / sum_e c_e^{-1}.
    """

    rate_upper_GBps: float
    mwst_rate_GBps: float | None
    min_edge_GBps: float | None
    exact: bool

    def time_lower_us(self, nbytes: float) -> float:
        """Lemma 2.1's lower bound on the time to aggregate nbytes: nbytes (n - 1) / sum_e bw_e."""
        return nbytes / (self.rate_upper_GBps * 1e3)


@dataclass(frozen=True)
class TreePacking:
    """Result of `packing_lp`. rate_GBps is the aggregation capacity (the brief's C(G)): a collective of
    D bytes (per root for allgather / reducescatter) takes D / rate in the fluid limit."""

    topology: str
    mode: str
    ranks: tuple[int, ...]
    root: int | None
    trees: tuple[PackedTree, ...]
    rate_GBps: float
    upper_bound_GBps: float  # dual certificate: no packing does better
    status: Status  # OPTIMAL when the certificate closes the gap to the tolerance
    iterations: int
    min_reduced_cost: float  # min over groups of m_g - mu_g at exit (units with sum mu = 1); >= -tolerance
    # when optimal: m_g is the cheapest tree of group g under the final duals (allreduce: mu = 1, so this
    # is m - 1, the most negative reduced cost of any spanning tree)
    lemma: Lemma21
    binding: tuple[ResourceKey, ...]  # resources at capacity in the final packing
    solver: str
    wall_time_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def gap(self) -> float:
        return self.upper_bound_GBps / self.rate_GBps - 1.0 if self.rate_GBps > 0 else math.inf

    def paper_C(self, nbytes: float = 1e6) -> float:
        """The paper's C(G) (eq. 2) in us for nbytes of data: nbytes / rate."""
        return nbytes / (self.rate_GBps * 1e3)

    def time_us(self, nbytes: float) -> float:
        """Bandwidth time of the collective on a buffer of nbytes: nbytes / rate for allreduce, reduce and
        broadcast; (nbytes / n) / rate for allgather (output bytes) and reducescatter (input bytes)."""
        per_root = nbytes / len(self.ranks) if self.mode in ("allgather", "reducescatter") else nbytes
        return per_root / (self.rate_GBps * 1e3)

    def lemma21_time_us(self, nbytes: float) -> float:
        """Lemma 2.1's lower bound on the same time."""
        per_root = nbytes / len(self.ranks) if self.mode in ("allgather", "reducescatter") else nbytes
        return self.lemma.time_lower_us(per_root)


# -------------------------------------------------------------------------------------------------------
# Problem structure: atoms, groups and pricing oracles


@dataclass
class _Problem:
    model: ResourceModel
    mode: str
    atoms: list[tuple[int, int]]  # pairs (allreduce) or arcs
    usage: np.ndarray  # atoms x kept resources
    caps: np.ndarray  # kept resources, GB/s
    keys: list[ResourceKey]  # kept resources
    groups: list[int | None]  # roots (None: the one unrooted group of allreduce)
    oracle: ArborescenceOracle | None = None
    _columns: dict = field(default_factory=dict)

    def column(self, atoms: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(resource indices, uses) of a tree, the sparse column U(T)."""
        if atoms not in self._columns:
            u = self.usage[list(atoms)].sum(axis=0)
            nz = np.flatnonzero(u)
            self._columns[atoms] = (nz, u[nz])
        return self._columns[atoms]

    def price(self, group: int | None, weights: np.ndarray) -> list[int] | None:
        """Atoms of a minimum-weight tree of `group` under atom weights: Kruskal for undirected trees,
        Chu-Liu/Edmonds for arborescences (an in-arborescence is an out-arborescence of the reversed arcs)."""
        if self.mode == "allreduce":
            return minimum_spanning_tree(self.model.ranks, self.atoms, weights)
        if self.oracle is None:
            out = self.mode in ("broadcast", "allgather")
            self.oracle = ArborescenceOracle(self.model.ranks, self.atoms if out else [(b, a) for a, b in self.atoms])
        return self.oracle.solve(weights, group)


def _problem(topology: Topology, ranks: tuple[int, ...] | None, mode: str, root: int | None) -> _Problem:
    if mode not in MODES:
        raise InputError(topology.name, "mode", f"unknown packing mode {mode!r}; known: {', '.join(MODES)}")
    model = resource_model(topology, ranks)
    directed = mode != "allreduce"
    atoms = list(sorted(model.arcs)) if directed else model.pairs()
    if len(model.ranks) > 1 and not connected(model.ranks, atoms):
        both = "" if directed else " by links both ways"
        raise InfeasibleError(f"{topology.name}: ranks {list(model.ranks)} are not connected{both}; "
                              "no spanning tree exists")
    if mode in ROOTED_MODES:
        root = model.ranks[0] if root is None else root
        if root not in model.ranks:
            raise InputError(topology.name, "root", f"root {root} is not among the ranks")
        groups: list[int | None] = [root]
    elif mode == "allreduce":
        groups = [None]
    else:
        groups = list(model.ranks)
    usage = model.usage(atoms, directed)
    drop = dominated(usage, model.capacity_GBps)
    keep = np.flatnonzero(~drop)
    return _Problem(model, mode, atoms, usage[:, keep], model.capacity_GBps[keep],
                    [model.keys[r] for r in keep], groups)


# -------------------------------------------------------------------------------------------------------
# The LP


def packing_lp(topology: Topology, *, ranks: tuple[int, ...] | list[int] | None = None,
               options: PlannerOptions | None = None, mode: str = "allreduce", root: int | None = None,
               tolerance: float = DEFAULT_TOLERANCE, max_iterations: int = DEFAULT_MAX_ITERATIONS) -> TreePacking:
    """Maximum-rate packing of spanning trees (paper eq. 2) over `ranks` (default all) of `topology`, by
    column generation with a dual certificate. See the module docstring for the model."""
    options = options or PlannerOptions()
    solver, _ = resolve_solver(options.solver)
    t0 = time.perf_counter()
    ranks_t = None if ranks is None else tuple(ranks)
    prob = _problem(topology, ranks_t, mode, root)
    n = len(prob.model.ranks)
    if n == 1:
        lemma = _lemma21(topology, prob)
        return TreePacking(topology.name, mode, prob.model.ranks, root, (PackedTree((), math.inf, root),),
                           math.inf, math.inf, Status.OPTIMAL, 0, 0.0, lemma, (), solver.name,
                           time.perf_counter() - t0, ("a single rank needs no communication",))
    scale = float(prob.caps.max())
    caps = prob.caps / scale  # normalised capacities keep the LPs well scaled
    num_res = len(caps)
    columns: list[tuple[int, tuple[int, ...]]] = []  # (group index, atom indices)
    seen: set[tuple[int, tuple[int, ...]]] = set()

    def add(gi: int, atoms: list[int]) -> bool:
        key = (gi, tuple(sorted(atoms)))
        if key in seen:
            return False
        seen.add(key)
        columns.append(key)
        return True

    # start: for each group the tree that is cheapest in time-per-byte (sum_r U_r / cap_r) and in hops
    time_weights = prob.usage @ (1.0 / caps)
    for gi, g in enumerate(prob.groups):
        for weights in (time_weights, prob.usage.sum(axis=1)):
            tree = prob.price(g, weights)
            if tree is None:  # arborescence modes: not every rank is reachable from / can reach g
                way = "into" if mode in ("reduce", "reducescatter") else "out of"
                raise InfeasibleError(f"{topology.name}: no spanning arborescence {way} rank {g} over ranks "
                                      f"{list(prob.model.ranks)}")
            add(gi, tree)
    lemma = _lemma21(topology, prob)

    solve_opts = SolveOptions(threads=options.threads, seed=options.seed)
    num_groups = len(prob.groups)
    status, iterations, min_rc, w, mu = Status.FEASIBLE, 0, -math.inf, None, None
    lower, upper = 0.0, math.inf
    notes: list[str] = []
    while iterations < max_iterations:
        iterations += 1
        w, mu, lower = _solve_dual(solver, solve_opts, caps, prob, columns, num_groups)
        if w is None:
            status = Status.ERROR
            notes.append("restricted dual LP failed")
            break
        pi = prob.usage @ w
        added, mins = 0, []
        for gi, g in enumerate(prob.groups):
            tree = prob.price(g, pi)
            m = float(pi[tree].sum())
            mins.append(m)
            if m < mu[gi] - tolerance * max(1.0, mu[gi]) and add(gi, tree):
                added += 1
        total = sum(mins)
        if total > 0:
            upper = min(upper, float(caps @ w) / total)
        min_rc = min(m - u for m, u in zip(mins, mu))
        if added == 0:
            break
        if upper <= lower * (1 + tolerance):
            break
        if options.time_limit_s is not None and time.perf_counter() - t0 > options.time_limit_s:
            notes.append(f"time limit after {iterations} column-generation rounds")
            break
    else:
        notes.append(f"stopped after {max_iterations} column-generation rounds")

    y, rate = _solve_primal(solver, solve_opts, caps, prob, columns, num_groups)
    if y is None:
        raise RuntimeError(f"restricted primal LP failed on {topology.name}")
    if status is not Status.ERROR:
        status = Status.OPTIMAL if upper <= rate * (1 + 10 * tolerance) + 1e-12 else Status.FEASIBLE
    trees = []
    total_y = float(y.sum())
    for (gi, atoms), yt in zip(columns, y):
        if yt > WEIGHT_EPS * max(total_y, 1e-12):
            g = prob.groups[gi]
            trees.append(PackedTree(tuple(prob.atoms[a] for a in atoms), float(yt) * scale, g))
    load = np.zeros(num_res)
    for (gi, atoms), yt in zip(columns, y):
        load += yt * prob.usage[list(atoms)].sum(axis=0)
    binding = tuple(prob.keys[r] for r in np.flatnonzero(load >= caps * (1 - 1e-6)))
    return TreePacking(topology.name, mode, prob.model.ranks, prob.groups[0] if mode in ROOTED_MODES else None,
                       tuple(trees), rate * scale, max(upper, rate) * scale, status, iterations, min_rc, lemma,
                       binding, solver.name, time.perf_counter() - t0, tuple(notes))


def _solve_dual(solver, solve_opts, caps, prob: _Problem, columns, num_groups):
    """Restricted dual: min cap.w s.t. sum_g mu_g >= 1, U(T).w - mu_g >= 0 for T in S_g; w, mu >= 0."""
    model = Model("tree_packing_dual")
    w = model.add_vars("w", len(caps), obj=caps)
    mu = model.add_vars("mu", num_groups)
    model.add_ge(mu, np.ones(num_groups), 1.0)
    for gi, atoms in columns:
        nz, coef = prob.column(atoms)
        model.add_ge(np.append(w[nz], mu[gi]), np.append(coef, -1.0), 0.0)
    result = solver.solve(model, solve_opts)
    if result.status is not Status.OPTIMAL:
        return None, None, 0.0
    x = result.x
    return np.maximum(x[w], 0.0), x[mu], float(result.objective)


def _solve_primal(solver, solve_opts, caps, prob: _Problem, columns, num_groups):
    """Restricted primal: max x s.t. x <= sum_{T in S_g} y_T for each group, sum_T U(T) y_T <= cap."""
    model = Model("tree_packing")
    y = model.add_vars("y", len(columns))
    x = model.add_var("rate")
    usage = np.array([prob.usage[list(atoms)].sum(axis=0) for _, atoms in columns])  # columns x resources
    for r in range(len(caps)):
        nz = np.flatnonzero(usage[:, r])
        if nz.size:
            model.add_le(y[nz], usage[nz, r], float(caps[r]))
    for gi in range(num_groups):
        mine = [k for k, (g, _) in enumerate(columns) if g == gi]
        model.add_le(np.r_[x, y[mine]], np.r_[1.0, -np.ones(len(mine))], 0.0)
    model.set_objective([x], [1.0], "max")
    result = solver.solve(model, solve_opts)
    if result.status is not Status.OPTIMAL:
        return None, 0.0
    return np.maximum(result.x[y], 0.0), float(result.x[x])


# -------------------------------------------------------------------------------------------------------
# Lemma 2.1


def _lemma21(topology: Topology, prob: _Problem) -> Lemma21:
    ranks = prob.model.ranks
    if len(ranks) == 1:
        return Lemma21(math.inf, None, None, True)
    per_atom_uses = prob.usage.sum(axis=1)
    k_total = 0.0
    for g in prob.groups:
        tree = prob.price(g, per_atom_uses)
        k_total += float(per_atom_uses[tree].sum())
    rate_upper = float(prob.caps.sum()) / k_total
    mwst = min_edge = None
    if prob.mode == "allreduce":
        # bandwidth of an atom on its own: min_r cap_r / U_r(atom)
        with np.errstate(divide="ignore"):
            alone = np.where(prob.usage > 0, prob.caps[None, :] / np.where(prob.usage > 0, prob.usage, 1), np.inf)
        atom_bw = alone.min(axis=1)
        tree = minimum_spanning_tree(ranks, prob.atoms, -atom_bw)  # maximum-bottleneck tree
        uses = prob.usage[tree].sum(axis=0)
        mwst = float(np.min(prob.caps[uses > 0] / uses[uses > 0]))
        min_edge = float(atom_bw.min())
    links = topology.link_map()
    symmetric = all(
        (b, a) in links and math.isclose(links[(b, a)].beta_us_per_MB, l.beta_us_per_MB)
        for (a, b), l in links.items() if a in ranks and b in ranks
    )
    in_ranks = [l for l in topology.links if l.src in ranks and l.dst in ranks]
    exact = symmetric and not any(l.switch or l.src_nic or l.dst_nic for l in in_ranks)
    return Lemma21(rate_upper, mwst, min_edge, exact)


def lemma21_paper_bound(topology: Topology, ranks: tuple[int, ...] | None = None) -> float:
    """The right-hand side of eq. 3 literally, in rate form: sum_e bw_e / (n - 1) over the undirected rank
    pairs with links both ways (bw_e = min of the two directions). Meaningful for switch-free graphs."""
    model = resource_model(topology, ranks)
    links = topology.link_map()
    total = sum(min(links[(a, b)].bandwidth_GBps, links[(b, a)].bandwidth_GBps) for a, b in model.pairs())
    return total / (len(model.ranks) - 1)

"""Stage 3: contiguity and exact scheduling MILP (TACCL §5.5.3, eq. 5.16-5.21).

Given the routes (as a TransferGraph) and the orders of stage 2, decide which consecutive chunks on a link
are sent together as one message and the exact send times. For transfer t of chunk c over (src, r):

  send[t]              continuous  the send time (the paper's send[c, src, r])
  is_together[i, j]    binary      the i-th and j-th transfers of chunk_order(src, r) go as one message
                                   (only on links where merging is allowed and |i - j| < max_group)

Eq. 5.17 as printed, lat[c] = alpha + beta * sum_o is_together[c, o, r], only makes sense with
is_together[c, c, r] = 1 (TACCL's code fixes it so) and beta per chunk: we write
lat[t_i] = alpha + beta * chunk_MB * (1 + sum_{j != i} is_together[i, j]).
Contiguity groups are runs of consecutive transfers in chunk_order (as in TACCL, where is_together of
(c, o) implies is_together of c with every chunk between them). With y_i = is_together[i, i+1]:
is_together[i, j] = y_i * ... * y_{j-1}, linearised (<= each y, >= their sum - (j - i - 1)), and no run of
more than max_group transfers: sum_{k=i}^{i+max_group-1} y_k <= max_group - 1.

Eq. 5.19 (and 5.20, 5.21) are stated for every ordered pair (c, o) with pos(o) >= pos(c); for a total
order it is enough to state them for consecutive pairs (the rest follows by transitivity), which is what we
add. The order is fixed, so the only binaries are the is_together ones: without merging this is an LP.

All transfers of the (pruned) routes lead to a destination, so each arrival bounds time (5.2); the stage-2
list schedule is feasible (no merging) and gives the warm start, a cutoff time <= its makespan, and M.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, replace

import numpy as np

from mlopt.planners.collective.taccl.logical import LogicalTopology
from mlopt.planners.collective.taccl.ordering import Orders, TransferGraph
from mlopt.solvers import Model, SolveOptions, SolveResult


@dataclass(frozen=True)
class Schedule:
    start_us: tuple[float, ...]  # send time of each transfer
    group: tuple[int | None, ...]  # contiguity group (None: sent alone)
    time_us: float


@dataclass(frozen=True)
class SchedulingOutcome:
    schedule: Schedule | None
    result: SolveResult
    num_vars: int
    num_rows: int
    num_binaries: int
    build_s: float


def solve_schedule(graph: TransferGraph, orders: Orders, logical: LogicalTopology, solver, options,
                   tag: str = "scheduling") -> SchedulingOutcome:
    t_build = _time.perf_counter()
    s = _ScheduleModel(graph, orders, logical, options)
    # Rows are added block by block in a fixed order: the MPS and the solver's path depend on it.
    _add_eq5_17_contiguity(s, graph, orders, logical)
    _add_eq5_2_eq5_4_dependencies(s, graph)
    _add_eq5_16_eq5_19_link_order(s, orders)
    _add_eq5_20_eq5_21_switch_ports(s, graph, orders)
    _add_reduce_order(s, orders)
    s.model.set_objective([s.time_var], [1.0], "min")
    build_s = _time.perf_counter() - t_build
    form = s.model.to_arrays()
    warm = np.zeros(form.num_vars)
    warm[s.send] = np.asarray(orders.start_us) / s.unit
    warm[s.time_var] = orders.makespan_us / s.unit
    result = solver.solve(form, SolveOptions(time_limit_s=options.time_limit_s, node_limit=options.node_limit,
                                             mip_gap=options.mip_gap, threads=options.threads, seed=options.seed,
                                             verbose=options.verbose, dump_model=_dump(options, tag)), start=warm)
    unit = s.unit
    scaled = replace(result, objective=None if result.objective is None else result.objective * unit,
                     best_bound=None if result.best_bound is None or not math.isfinite(result.best_bound)
                     else result.best_bound * unit)
    schedule = _read_schedule(result.x, s, orders) if result.status.has_solution else None
    return SchedulingOutcome(schedule, scaled, form.num_vars, form.num_constraints,
                             int(form.integrality.sum()), build_s)


class _ScheduleModel:
    """The stage-3 MILP under construction: per-transfer costs (in units of the largest latency), the send
    and time variables, and the contiguity binaries with the latency terms they add (eq. 5.17)."""

    def __init__(self, graph: TransferGraph, orders: Orders, logical: LogicalTopology, options):
        self.n = n = len(graph)
        self.unit = unit = logical.max_lat
        links = [logical.links[graph.link(t)] for t in range(n)]
        self.per_chunk = [(l.lat_us - l.alpha_us) / unit for l in links]  # beta * chunk size
        self.lat = lat = [l.lat_us / unit for l in links]
        self.W = W = max(1, options.max_group)
        H = orders.makespan_us / unit * (1 + 1e-9) + 1e-9  # the list schedule's time: an upper bound
        self.M = H + W * max(lat, default=1.0)

        self.model = Model("taccl_schedule")
        self.send = self.model.add_vars("send", n, 0.0, H)
        self.time_var = self.model.add_var("time", 0.0, H)
        self.y: dict[tuple[int, int], int] = {}  # (t_i, t_next) -> is_together var
        self.lat_terms: list[list[tuple[int, float]]] = [[] for _ in range(n)]  # extra terms of lat[t]

    def arrival(self, t: int) -> tuple[list[int], list[float], float]:
        """(5.18) start[c, r] = send[t] + lat[t] as (indices, coefs, constant)."""
        idx = [int(self.send[t])] + [v for v, _ in self.lat_terms[t]]
        coef = [1.0] + [w for _, w in self.lat_terms[t]]
        return idx, coef, self.lat[t]

    def add_send_after_arrival(self, b: int, a: int, extra_idx=(), extra_coef=()) -> None:
        """send[b] (+ extra terms) >= arrival of a."""
        idx, coef, const = self.arrival(a)
        self.model.add_ge([int(self.send[b])] + idx + list(extra_idx), [1.0] + [-c for c in coef] + list(extra_coef),
                          const)


def _add_eq5_17_contiguity(s: _ScheduleModel, graph: TransferGraph, orders: Orders, logical: LogicalTopology):
    """Contiguity binaries per mergeable link: y for consecutive transfers, is_together[i, j] as the product of
    the y between them, the (5.17) latency terms each member's message carries, and at most max_group
    transfers per message."""
    model, W, y, lat_terms, per_chunk = s.model, s.W, s.y, s.lat_terms, s.per_chunk
    for link, seq in sorted(orders.link.items()):
        l = logical.links[link]
        if not l.contiguous or W == 1 or len(seq) < 2:
            continue
        own = graph.own_first.get(link, set())
        for a, b in zip(seq, seq[1:]):
            if (a in own) != (b in own):
                continue  # enforce_ordering: relayed chunks go after (not with) the sender's own ones
            y[(a, b)] = model.add_binary(f"is_together[{a},{b}]")
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + W)):
                chain = [y.get((seq[k], seq[k + 1])) for k in range(i, j)]
                if any(v is None for v in chain):
                    continue
                if j == i + 1:
                    z = chain[0]
                else:
                    z = model.add_binary(f"is_together[{seq[i]},{seq[j]}]")
                    for v in chain:
                        model.add_le([z, v], [1.0, -1.0], 0.0)
                    model.add_ge([z] + chain, [1.0] + [-1.0] * len(chain), -(len(chain) - 1))
                # (5.17) each member's message carries beta for every chunk it travels with
                lat_terms[seq[i]].append((z, per_chunk[seq[i]]))
                lat_terms[seq[j]].append((z, per_chunk[seq[j]]))
        # at most max_group transfers per message
        for i in range(len(seq) - W):
            window = [y.get((seq[k], seq[k + 1])) for k in range(i, i + W)]
            if all(v is not None for v in window):
                model.add_le(window, [1.0] * W, W - 1)


def _add_eq5_2_eq5_4_dependencies(s: _ScheduleModel, graph: TransferGraph) -> None:
    """(5.4) a transfer starts after its chunk has arrived at its source (every child, when reducing) and
    (5.2) time >= every arrival."""
    for t in range(s.n):
        for d in graph.deps[t]:
            s.add_send_after_arrival(t, d)
        idx, coef, const = s.arrival(t)
        s.model.add_ge([s.time_var] + idx, [1.0] + [-c for c in coef], const)


def _add_eq5_16_eq5_19_link_order(s: _ScheduleModel, orders: Orders) -> None:
    """(5.16) / (5.19) per link, consecutive pairs in chunk_order: together -> same send time; not together ->
    the next send waits for this one to arrive."""
    model, M = s.model, s.M
    for link, seq in sorted(orders.link.items()):
        for a, b in zip(seq, seq[1:]):
            v = s.y.get((a, b))
            if v is None:
                s.add_send_after_arrival(b, a)
                continue
            model.add_ge([int(s.send[b]), int(s.send[a])], [1.0, -1.0], 0.0)
            model.add_le([int(s.send[b]), int(s.send[a]), v], [1.0, -1.0, M], M)
            s.add_send_after_arrival(b, a, [v], [M])


def _add_eq5_20_eq5_21_switch_ports(s: _ScheduleModel, graph: TransferGraph, orders: Orders) -> None:
    """(5.20) switch_send_order(r) and (5.21) switch_recv_order(r): one switched transfer at a time per port
    (links through a switch are never merged, so arrival(a) is send[a] + lat[a])."""
    for port_orders in (orders.send_port, orders.recv_port):
        for _, seq in sorted(port_orders.items()):
            for a, b in zip(seq, seq[1:]):
                if graph.link(a) == graph.link(b):
                    continue  # already ordered by the link constraint
                s.model.add_ge([int(s.send[b]), int(s.send[a])], [1.0, -1.0], s.lat[a])


def _add_reduce_order(s: _ScheduleModel, orders: Orders) -> None:
    """Combining: a rank reduces the receives of one chunk one at a time."""
    for _, seq in sorted(orders.reduce.items()):
        for a, b in zip(seq, seq[1:]):
            s.add_send_after_arrival(b, a)


def _read_schedule(xv: np.ndarray, s: _ScheduleModel, orders: Orders) -> Schedule:
    """Send times and contiguity groups from a solution; a merged message's members share its start."""
    unit = s.unit
    starts = [float(xv[s.send[t]]) * unit for t in range(s.n)]
    group: list[int | None] = [None] * s.n
    gid = 0
    for link, seq in sorted(orders.link.items()):
        run = [seq[0]] if seq else []
        for a, b in zip(seq, seq[1:]):
            v = s.y.get((a, b))
            if v is not None and xv[v] > 0.5:
                run.append(b)
                continue
            gid = _close(run, group, gid)
            run = [b]
        gid = _close(run, group, gid)
    # a merged message leaves when its last member is ready: give members one start
    for link, seq in orders.link.items():
        for t in seq:
            if group[t] is not None:
                members = [m for m in seq if group[m] == group[t]]
                start = max(starts[m] for m in members)
                for m in members:
                    starts[m] = start
    return Schedule(tuple(starts), tuple(group), float(xv[s.time_var]) * unit)


def _close(run: list[int], group: list, gid: int) -> int:
    if len(run) > 1:
        for t in run:
            group[t] = gid
        return gid + 1
    return gid


def list_schedule(orders: Orders) -> Schedule:
    """The stage-2 list schedule as a Schedule (the fallback when stage 3 finds nothing)."""
    return Schedule(tuple(orders.start_us), tuple([None] * len(orders.start_us)), orders.makespan_us)


def _dump(options, suffix):
    if not options.dump_model:
        return None
    stem = options.dump_model[:-4] if options.dump_model.endswith(".mps") else options.dump_model
    return f"{stem}-{suffix}.mps"

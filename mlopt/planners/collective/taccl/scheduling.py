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
    n = len(graph)
    unit = logical.max_lat
    links = [logical.links[graph.link(t)] for t in range(n)]
    alpha = [l.alpha_us / unit for l in links]
    per_chunk = [(l.lat_us - l.alpha_us) / unit for l in links]  # beta * chunk size
    lat = [l.lat_us / unit for l in links]
    W = max(1, options.max_group)
    H = orders.makespan_us / unit * (1 + 1e-9) + 1e-9  # the list schedule's time: an upper bound
    M = H + W * max(lat, default=1.0)

    model = Model("taccl_schedule")
    send = model.add_vars("send", n, 0.0, H)
    time_var = model.add_var("time", 0.0, H)

    # Contiguity variables on mergeable links
    y: dict[tuple[int, int], int] = {}  # (t_i, t_next) -> var
    together: dict[tuple[int, int], int] = {}  # (t_i, t_j) (i before j on the link) -> var
    lat_terms: list[list[tuple[int, float]]] = [[] for _ in range(n)]  # extra terms of lat[t]
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
                together[(seq[i], seq[j])] = z
                # (5.17) each member's message carries beta for every chunk it travels with
                lat_terms[seq[i]].append((z, per_chunk[seq[i]]))
                lat_terms[seq[j]].append((z, per_chunk[seq[j]]))
        # at most max_group transfers per message
        for i in range(len(seq) - W):
            window = [y.get((seq[k], seq[k + 1])) for k in range(i, i + W)]
            if all(v is not None for v in window):
                model.add_le(window, [1.0] * W, W - 1)

    def arrival(t: int) -> tuple[list[int], list[float], float]:
        """(5.18) start[c, r] = send[t] + lat[t] as (indices, coefs, constant)."""
        idx = [int(send[t])] + [v for v, _ in lat_terms[t]]
        coef = [1.0] + [w for _, w in lat_terms[t]]
        return idx, coef, lat[t]

    for t in range(n):
        # (5.4) a transfer starts after its chunk has arrived at its source (every child, when reducing)
        for d in graph.deps[t]:
            idx, coef, const = arrival(d)
            model.add_ge([int(send[t])] + idx, [1.0] + [-c for c in coef], const)
        # (5.2) time >= arrival
        idx, coef, const = arrival(t)
        model.add_ge([time_var] + idx, [1.0] + [-c for c in coef], const)

    # (5.16) / (5.19) per link, consecutive pairs in chunk_order:
    #   together -> same send time; not together -> the next send waits for this one to arrive
    for link, seq in sorted(orders.link.items()):
        for a, b in zip(seq, seq[1:]):
            v = y.get((a, b))
            if v is None:
                idx, coef, const = arrival(a)
                model.add_ge([int(send[b])] + idx, [1.0] + [-c for c in coef], const)
                continue
            model.add_ge([int(send[b]), int(send[a])], [1.0, -1.0], 0.0)
            model.add_le([int(send[b]), int(send[a]), v], [1.0, -1.0, M], M)
            idx, coef, const = arrival(a)
            model.add_ge([int(send[b])] + idx + [v], [1.0] + [-c for c in coef] + [M], const)

    # (5.20) switch_send_order(r) and (5.21) switch_recv_order(r): one switched transfer at a time per port
    # (links through a switch are never merged, so arrival(a) is send[a] + lat[a])
    for port_orders in (orders.send_port, orders.recv_port):
        for _, seq in sorted(port_orders.items()):
            for a, b in zip(seq, seq[1:]):
                if graph.link(a) == graph.link(b):
                    continue  # already ordered by the link constraint
                model.add_ge([int(send[b]), int(send[a])], [1.0, -1.0], lat[a])
    # combining: a rank reduces the receives of one chunk one at a time
    for _, seq in sorted(orders.reduce.items()):
        for a, b in zip(seq, seq[1:]):
            idx, coef, const = arrival(a)
            model.add_ge([int(send[b])] + idx, [1.0] + [-c for c in coef], const)

    model.set_objective([time_var], [1.0], "min")
    build_s = _time.perf_counter() - t_build
    form = model.to_arrays()
    warm = np.zeros(form.num_vars)
    warm[send] = np.asarray(orders.start_us) / unit
    warm[time_var] = orders.makespan_us / unit
    result = solver.solve(form, SolveOptions(time_limit_s=options.time_limit_s, node_limit=options.node_limit,
                                             mip_gap=options.mip_gap, threads=options.threads, seed=options.seed,
                                             verbose=options.verbose, dump_model=_dump(options, tag)), start=warm)
    scaled = replace(result, objective=None if result.objective is None else result.objective * unit,
                     best_bound=None if result.best_bound is None or not math.isfinite(result.best_bound)
                     else result.best_bound * unit)
    schedule = None
    if result.status.has_solution:
        xv = result.x
        starts = [float(xv[send[t]]) * unit for t in range(n)]
        group: list[int | None] = [None] * n
        gid = 0
        for link, seq in sorted(orders.link.items()):
            run = [seq[0]] if seq else []
            for a, b in zip(seq, seq[1:]):
                v = y.get((a, b))
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
                    s = max(starts[m] for m in members)
                    for m in members:
                        starts[m] = s
        schedule = Schedule(tuple(starts), tuple(group), float(xv[time_var]) * unit)
    return SchedulingOutcome(schedule, scaled, form.num_vars, form.num_constraints,
                             int(form.integrality.sum()), build_s)


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

"""Alpha-beta network simulator: a discrete-event engine over messages that share bandwidth.

Three layers, each usable on its own:

* `run_tasks(tasks, capacities)`: the generic engine. A `Task` waits for its dependencies (and its
  `release_us`), spends `delay_us` in a latency phase that uses no bandwidth, then moves `nbytes` through
  a set of shared resources and completes when the last byte has passed. Resources are bytes/us servers.
* `NetworkModel(topology)`: turns a topology into resources and routes (`route(src, dst)`: the link's
  alpha and the resources a message on that link crosses). The links, switch ports and NICs, their
  capacities and the pruning rule are `mlopt.sim.resources`', shared with the trees planner's LP (whose
  module docstring lists how the two models differed before).
* Front ends: `simulate_transfers` (a plain list of point-to-point `Message`s with dependencies, for the
  planner's chunk-level algorithms and the training-iteration simulator) and `simulate_program` (an
  MSCCL-EF `Program` executed the way the MSCCL interpreter runs it; its options are `ProgramOptions`).

Link model (TACCL's alpha-beta, chapter 5.3): a message of s bytes on link a->b alone takes
`alpha_us + beta_us_per_MB * s / 1e6`. The message is issued at t, spends [t, t + alpha) in latency
(software, launch and wire latency: no bandwidth used), then its bytes flow at the rate the sharing model
gives it, and it is delivered when its last byte has arrived.

Sharing model (choice (b) of the design brief: fair sharing): every message in its byte phase is a flow
that crosses these resources, each a server of fixed capacity in bytes/us:

* the directed link a->b, all lanes together: 1e6 / link.beta_us_per_MB;
* for a link through a switch: the sender's port (tx) and the receiver's port (rx) on that switch, each
  1e6 / switch.port_beta_us_per_MB;
* for a link through NICs: the tx direction of `src_nic` and the rx direction of `dst_nic`, each
  1e6 / nic.beta_us_per_MB, shared by every rank on the NIC;
* for local steps (cpy, re) and local messages: the rank's memory ("mem r"), local_GBps.

Concurrent flows get the max-min fair allocation (progressive filling): all flows grow at the same rate
until a resource saturates; the flows through it are frozen at that rate, and the others keep growing.
Rates are recomputed exactly whenever a flow starts or ends (rates are piecewise constant in between, so
completion times are exact up to floating point), only for the connected component of flows that share a
resource with the change, and memoised by (flow class, count) so symmetric algorithms reuse them. Flows
with the same resource set form a class; a class keeps a "virtual byte counter" (bytes delivered per flow
since the class became busy), so a flow finishes when the counter reaches its start value plus its size.

Why fair sharing and not per-resource FIFO (TACCL's one-chunk-at-a-time link): NICs shared by 8 GPUs and
switch ports carry concurrent flows from different threadblocks, and a link used by several channels
splits its bandwidth between them; FIFO serialisation would order them arbitrarily. Fair sharing is
work-conserving, so a resource that carries D bytes is busy at least D / capacity: simulated times are
never below the bandwidth lower bounds of `mlopt.sim.bounds`. Unlike TACCL's eq. 5.19, alpha does not
occupy a link, so two channels on one link overlap their latencies.

A resource that can never bind is left out of the rate computation (kept for accounting): one whose set
of links is contained in another resource's on the same route with no larger capacity (the link of a
switched connection whose port is as slow as the link; an IB port behind its NIC; `resources.never_binds`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.msccl import RECEIVING_STEPS, REDUCING_STEPS, SENDING_STEPS, STEP_TYPES, Program
from mlopt.formats.topology import Link, Topology
from mlopt.sim.resources import TopologyResources

MSCCL_SIMPLE_TILE_BYTES = 2 * 2**20  # MSCCL Simple protocol tile per chunk and loop: 4 MiB NCCL_BUFFSIZE / 2
DEFAULT_LOCAL_GBPS = 1000.0  # local copy/reduce throughput: generous (above a V100's or A100's copy rate)
BUSBW_FACTOR = {  # nccl-tests' bus bandwidth factor, n ranks
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "allreduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
_TIME_EPS = 1e-10  # relative: events this close are processed together
_BYTES_EPS = 1e-9  # relative to its size: a flow this close to its end is done


# ---------------------------------------------------------------------------------------------------------
# Generic engine


@dataclass(frozen=True)
class Task:
    """One unit of work for `run_tasks`.

    Starts when every task in `deps` has finished and not before `release_us`; then waits `delay_us`
    (latency: alpha, compute, anything that uses no shared bandwidth); then moves `nbytes` through
    `resources` (indices into the capacity list) at its max-min fair rate. A task without resources or
    bytes finishes right after its delay. `account` lists the resources charged with its bytes and busy
    time (default: `resources`); it may include resources left out of the rate computation.
    """

    delay_us: float = 0.0
    nbytes: float = 0.0
    resources: tuple[int, ...] = ()
    deps: tuple[int, ...] = ()
    release_us: float = 0.0
    account: tuple[int, ...] | None = None


@dataclass
class EngineResult:
    makespan_us: float
    start_us: list[float]  # when each task's dependencies were met (start of its delay); nan if never
    finish_us: list[float]  # nan for tasks that never ran (dependency cycle)
    busy_us: list[float]  # per resource: time with at least one flow in its byte phase
    bytes: list[float]  # per resource: bytes carried (account resources)
    unfinished: list[int]  # tasks that never finished: a dependency cycle


def _max_min(classes: list[int], weight: dict[int, int], cres: list[tuple[int, ...]],
             capacity: Sequence[float]) -> dict[int, float]:
    """Max-min fair rate per flow of each class (weight = flows in the class), by progressive filling.

    Each round finds the resources with the smallest fair share (residual capacity / unfrozen flows),
    freezes every flow through them at that share, and charges the share to the other resources those
    flows cross. Shares never decrease from one round to the next.
    """
    residual: dict[int, float] = {}
    wsum: dict[int, int] = {}
    users: dict[int, list[int]] = {}
    for c in classes:
        w = weight[c]
        for r in cres[c]:
            if r in residual:
                wsum[r] += w
                users[r].append(c)
            else:
                residual[r] = capacity[r]
                wsum[r] = w
                users[r] = [c]
    rate: dict[int, float] = {}
    live = dict.fromkeys(residual)  # resources with unfrozen flows
    while live:
        share = min(residual[r] / wsum[r] for r in live)
        cut = share * (1 + 1e-12)
        for r in [r for r in live if residual[r] / wsum[r] <= cut]:
            if r not in live:
                continue
            for c in users[r]:
                if c in rate:
                    continue
                rate[c] = share
                w = weight[c]
                for r2 in cres[c]:
                    residual[r2] = max(residual[r2] - share * w, 0.0)
                    wsum[r2] -= w
                    if wsum[r2] <= 0:
                        live.pop(r2, None)
    return rate


def _check_capacities(capacities: Sequence[float]) -> None:
    """ValueError naming the first resource whose capacity is not > 0."""
    for r, cap in enumerate(capacities):
        if not cap > 0:
            raise ValueError(f"resource {r} has capacity {cap}; capacities must be > 0")


def run_tasks(tasks: Sequence[Task], capacities: Sequence[float], *, memo_limit: int = 200_000) -> EngineResult:
    """Simulate tasks sharing resources of the given capacities (bytes/us). Deterministic."""
    _check_capacities(capacities)
    return _FairShareEngine(tasks, capacities, memo_limit).run()


# Event kinds of the fair-share engine: a task's latency phase ends (its bytes enter), a task's release time
# is reached, a class's head flow is predicted to finish.
_ENTER, _START, _FLOW = 0, 1, 2


class _FairShareEngine:
    """One `run_tasks` run: the tasks grouped into flow classes, the event queue and the classes' flows.

    Tasks with the same (constraining, accounting) resources form a class and share its rate. A class keeps a
    virtual byte counter (bytes per flow since it became busy: vbase at tbase, growing at crate), and its
    flows in a heap by the counter value at which each finishes. Events are (time, seq, kind, a, b): seq, one
    counter for events and flows, keeps ties in the order they were made; a FLOW event carries its class and
    the class's version, stale once the class's rate changes.
    """

    def __init__(self, tasks: Sequence[Task], capacities: Sequence[float], memo_limit: int):
        self.capacities = capacities
        self.memo_limit = memo_limit
        self._index_tasks(tasks, len(capacities))
        n, nres, nclasses = len(tasks), len(capacities), len(self.cres)
        self.count = [0] * nclasses  # flows in the byte phase per class
        self.vbase = [0.0] * nclasses  # virtual bytes per flow at time tbase
        self.tbase = [0.0] * nclasses
        self.crate = [0.0] * nclasses  # bytes/us per flow
        self.cversion = [0] * nclasses
        self.cflows: list[list[tuple[float, int, int]]] = [[] for _ in range(nclasses)]  # (target, seq, task)
        self.res_classes: list[dict[int, None]] = [{} for _ in range(nres)]  # active classes per constraining resource
        self.active_acc = [0] * nres
        self.busy_start = [0.0] * nres
        self.busy = [0.0] * nres
        self.memo: dict[tuple, tuple[float, ...]] = {}
        self.start = [math.nan] * n
        self.finish = [math.nan] * n
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, a, b)
        self.seq = 0
        self.changed: dict[int, None] = {}  # classes whose flows changed at this instant, in order

    def _index_tasks(self, tasks: Sequence[Task], nres: int) -> None:
        """Check the tasks, group those with bytes and resources into flow classes, count dependencies."""
        n = len(tasks)
        class_key: dict[tuple, int] = {}
        self.cres: list[tuple[int, ...]] = []
        self.cacc: list[tuple[int, ...]] = []
        self.cls = cls = [-1] * n
        self.delay = delay = [0.0] * n
        self.size = size = [0.0] * n
        self.release = release = [0.0] * n
        self.ndeps = ndeps = [0] * n
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        self.res_bytes = res_bytes = [0.0] * nres
        for i, t in enumerate(tasks):
            if t.delay_us < 0 or t.nbytes < 0 or math.isnan(t.delay_us) or math.isnan(t.nbytes):
                raise ValueError(f"task {i}: delay and bytes must be >= 0")
            delay[i] = float(t.delay_us)
            size[i] = float(t.nbytes)
            release[i] = float(t.release_us)
            acc = t.resources if t.account is None else t.account
            for r in acc:
                res_bytes[r] += size[i]
            if t.nbytes > 0 and t.resources:
                key = (t.resources, acc)
                c = class_key.get(key)
                if c is None:
                    for r in set(t.resources) | set(acc):
                        if not 0 <= r < nres:
                            raise ValueError(f"task {i}: unknown resource {r}")
                    c = class_key[key] = len(self.cres)
                    self.cres.append(tuple(dict.fromkeys(t.resources)))
                    self.cacc.append(tuple(dict.fromkeys(acc)))
                cls[i] = c
            deps = dict.fromkeys(t.deps)
            ndeps[i] = len(deps)
            for d in deps:
                if not 0 <= d < n or d == i:
                    raise ValueError(f"task {i}: bad dependency {d}")
                self.dependents[d].append(i)

    def run(self) -> EngineResult:
        """Start the tasks without dependencies, process every instant in time order, collect the result."""
        todo = [i for i in range(len(self.cls)) if self.ndeps[i] == 0]
        todo.reverse()
        self._settle(todo, 0.0)
        if self.changed:
            self._rebalance(0.0)
        now = 0.0
        while self.events:
            now = self._process_instant()
        return self._result(now)

    def _result(self, now: float) -> EngineResult:
        """The EngineResult once no event is left (`now`: the last instant)."""
        busy, finish = self.busy, self.finish
        for r in range(len(busy)):
            if self.active_acc[r]:  # cannot happen when every flow finished
                busy[r] += now - self.busy_start[r]
        unfinished = [i for i in range(len(finish)) if math.isnan(finish[i])]
        makespan = max((f for f in finish if not math.isnan(f)), default=0.0)
        return EngineResult(makespan, self.start, finish, busy, self.res_bytes, unfinished)

    def _push(self, time_us: float, kind: int, a: int, b: int = 0) -> None:
        """Queue an event after every one made before it."""
        self.seq += 1
        heapq.heappush(self.events, (time_us, self.seq, kind, a, b))

    def _virtual_bytes(self, c: int, t: float) -> float:
        """Bytes each flow of class c has moved since the class became busy, at time t."""
        return self.vbase[c] + self.crate[c] * (t - self.tbase[c])

    # Event handling

    def _process_instant(self) -> float:
        """Handle every event within the time tolerance of the earliest, then recompute the rates it changed;
        returns the instant."""
        events, handle, settle = self.events, self._handle, self._settle
        t = events[0][0]
        limit = t + _TIME_EPS * max(1.0, abs(t))
        todo: list[int] = []
        while events and events[0][0] <= limit:
            handle(heapq.heappop(events), t, todo)
            if todo:
                settle(todo, t)
        if self.changed:
            self._rebalance(t)
        return t

    def _handle(self, event: tuple[float, int, int, int, int], t: float, todo: list[int]) -> None:
        """One event at instant t: a (still current) flow prediction, a latency phase's end, a release."""
        te, _, kind, a, b = event
        if kind == _FLOW:
            if b == self.cversion[a]:
                self._finish_flows(a, te, t, todo)
        elif kind == _ENTER:
            self._enter(a, t, todo)
        else:  # _START: release time reached
            self._start(a, t, todo)

    def _settle(self, todo: list[int], t: float) -> None:
        """Start the tasks whose dependencies were met at instant t (a worklist, no recursion: zero-cost
        chains can be long); one not yet released waits for its release time."""
        while todo:
            i = todo.pop()
            if self.release[i] > t * (1 + _TIME_EPS) + 1e-12:
                self._push(self.release[i], _START, i)
                continue
            self._start(i, t, todo)

    def _start(self, i: int, t: float, todo: list[int]) -> None:
        """Task i starts at t: its latency phase, or its byte phase at once without a delay."""
        self.start[i] = t
        if self.delay[i] > 0:
            self._push(t + self.delay[i], _ENTER, i)
        else:
            self._enter(i, t, todo)

    def _enter(self, i: int, t: float, todo: list[int]) -> None:
        """Task i's bytes start to flow at t (a task without bytes or resources completes)."""
        c = self.cls[i]
        if c < 0:
            self._complete(i, t, todo)
            return
        if self.count[c] == 0:
            self._class_busy(c, t)
        self.count[c] += 1
        self.seq += 1
        heapq.heappush(self.cflows[c], (self._virtual_bytes(c, t) + self.size[i], self.seq, i))
        self.changed[c] = None

    def _class_busy(self, c: int, t: float) -> None:
        """Class c gets its first flow at t: reset its counter, put it on its resources, open busy intervals."""
        self.vbase[c] = 0.0
        self.tbase[c] = t
        for r in self.cres[c]:
            self.res_classes[r][c] = None
        for r in self.cacc[c]:
            self.active_acc[r] += 1
            if self.active_acc[r] == 1:
                self.busy_start[r] = t

    def _class_idle(self, c: int, t: float) -> None:
        """Class c's last flow finished at t: take it off its resources, close busy intervals."""
        for r in self.cres[c]:
            del self.res_classes[r][c]
        for r in self.cacc[c]:
            self.active_acc[r] -= 1
            if self.active_acc[r] == 0:
                self.busy[r] += t - self.busy_start[r]

    def _complete(self, i: int, t: float, todo: list[int]) -> None:
        """Task i finishes at t; the dependents it was the last dependency of join the worklist."""
        self.finish[i] = t
        ndeps = self.ndeps
        for j in self.dependents[i]:
            ndeps[j] -= 1
            if ndeps[j] == 0:
                todo.append(j)

    def _finish_flows(self, c: int, t_check: float, t: float, todo: list[int]) -> None:
        """Complete at t the flows of class c whose bytes have passed by t_check (within the tolerances)."""
        if not self.count[c]:
            return
        v = self._virtual_bytes(c, t_check)
        flows = self.cflows[c]
        size = self.size
        done = False
        slack = 4 * self.crate[c] * _TIME_EPS * max(1.0, t_check)  # bytes moved within the time tolerance
        while flows and flows[0][0] - v <= max(_BYTES_EPS * size[flows[0][2]], 1e-13 * flows[0][0], slack):
            _, _, i = heapq.heappop(flows)
            self.count[c] -= 1
            done = True
            self._complete(i, t, todo)
        self.changed[c] = None  # new prediction even if rounding left the head flow a hair short
        if done and self.count[c] == 0:
            self._class_idle(c, t)

    # Fair-share rates

    def _rebalance(self, t: float) -> None:
        """Recompute rates for every component touched by this instant's changes."""
        crate, changed = self.crate, self.changed
        seen: set[int] = set()
        seen_res: set[int] = set()
        for seed in self._rebalance_seeds():
            if seed in seen:
                continue
            comp = self._component(seed, seen, seen_res)
            for c, rt in zip(comp, self._fair_rates(comp)):
                if rt == crate[c] and c not in changed:
                    continue  # same rate, same head flow: its pending prediction still holds
                self._set_rate(c, rt, t)
        changed.clear()

    def _rebalance_seeds(self) -> list[int]:
        """The changed classes that still have flows, and the classes sharing a resource with a changed class
        that has none left (whose rate drops to 0 here)."""
        seeds: list[int] = []
        for c in self.changed:
            if self.count[c]:
                seeds.append(c)
            else:
                self.crate[c] = 0.0
                self.cversion[c] += 1
                for r in self.cres[c]:
                    seeds.extend(self.res_classes[r])
        return seeds

    def _component(self, seed: int, seen: set[int], seen_res: set[int]) -> list[int]:
        """The busy classes connected to `seed` through shared resources, in class order (marks them seen)."""
        cres, res_classes = self.cres, self.res_classes
        comp = [seed]
        seen.add(seed)
        k = 0
        while k < len(comp):
            for r in cres[comp[k]]:
                if r in seen_res:
                    continue
                seen_res.add(r)
                for c2 in res_classes[r]:
                    if c2 not in seen:
                        seen.add(c2)
                        comp.append(c2)
            k += 1
        comp.sort()
        return comp

    def _fair_rates(self, comp: list[int]) -> tuple[float, ...]:
        """The max-min fair rate per flow of each class of a component, memoised by (class, flows) pairs."""
        count = self.count
        key = tuple((c, count[c]) for c in comp)
        rates = self.memo.get(key)
        if rates is None:
            got = _max_min(comp, {c: count[c] for c in comp}, self.cres, self.capacities)
            rates = tuple(got[c] for c in comp)
            if len(self.memo) >= self.memo_limit:
                self.memo.clear()
            self.memo[key] = rates
        return rates

    def _set_rate(self, c: int, rate: float, t: float) -> None:
        """Class c moves at `rate` from t on: carry its counter over and predict its head flow's finish."""
        self.vbase[c] = self.vbase[c] + self.crate[c] * (t - self.tbase[c])
        self.tbase[c] = t
        self.crate[c] = rate
        self.cversion[c] += 1
        if rate > 0:
            self._push(t + (self.cflows[c][0][0] - self.vbase[c]) / rate, _FLOW, c, self.cversion[c])


def run_tasks_fifo(tasks: Sequence[Task], capacities: Sequence[float]) -> EngineResult:
    """The FIFO-per-link variant of `run_tasks` (ASTRA-sim's congestion-aware analytical network): a task's
    bytes hold every resource it crosses, one task at a time per resource, in the order the tasks asked for
    them (the end of their delay; ties by index), at the lowest capacity among those resources (cut-through:
    the whole route at once, no store-and-forward per hop). Deterministic.

    Requests are served in time order: a task's request time depends only on tasks that finished before it,
    so when the earliest outstanding request is served every request before it on its resources is known.
    """
    n = len(tasks)
    _check_capacities(capacities)
    dependents: list[list[int]] = [[] for _ in range(n)]
    missing = [0] * n
    for i, t in enumerate(tasks):
        if t.delay_us < 0 or t.nbytes < 0 or math.isnan(t.delay_us) or math.isnan(t.nbytes):
            raise ValueError(f"task {i}: delay and bytes must be >= 0")
        for d in t.deps:
            if not 0 <= d < n or d == i:
                raise ValueError(f"task {i}: bad dependency {d}")
            dependents[d].append(i)
        missing[i] = len(t.deps)
    start = [math.nan] * n
    finish = [math.nan] * n
    free_at = [0.0] * len(capacities)
    busy = [0.0] * len(capacities)
    carried = [0.0] * len(capacities)
    ready_at = [0.0] * n
    requests: list[tuple[float, int]] = []
    for i, t in enumerate(tasks):
        if missing[i] == 0:
            start[i] = max(0.0, t.release_us)
            heapq.heappush(requests, (start[i] + t.delay_us, i))
    while requests:
        asked, i = heapq.heappop(requests)
        t = tasks[i]
        if t.nbytes > 0 and t.resources:
            begin = max([asked] + [free_at[r] for r in t.resources])
            end = begin + t.nbytes / min(capacities[r] for r in t.resources)
            for r in t.resources:
                free_at[r] = end
            for r in (t.resources if t.account is None else t.account):
                busy[r] += end - begin
                carried[r] += t.nbytes
        else:
            end = asked
        finish[i] = end
        for j in dependents[i]:
            ready_at[j] = max(ready_at[j], end)
            missing[j] -= 1
            if missing[j] == 0:
                start[j] = max(ready_at[j], tasks[j].release_us)
                heapq.heappush(requests, (start[j] + tasks[j].delay_us, j))
    unfinished = [i for i in range(n) if math.isnan(finish[i])]
    makespan = max((f for f in finish if not math.isnan(f)), default=0.0)
    return EngineResult(makespan, start, finish, busy, carried, unfinished)


def unshared(tasks: Sequence[Task], capacities: Sequence[float]) -> tuple[list[Task], list[float]]:
    """The congestion-unaware variant of a task set: nothing shares bandwidth.

    Every task with bytes gets a private resource at the lowest capacity among its own resources, the rate it
    would get alone on an idle network (so a lone task takes the same time either way, and with sharing a task
    is never faster). Its bytes stay accounted on the shared resources (`account`), which can then show a
    utilization above 1. Used for ASTRA-sim's congestion-unaware mode (mlopt.sim.collective_algorithms).
    """
    caps = list(capacities)
    out: list[Task] = []
    for t in tasks:
        if t.nbytes > 0 and t.resources:
            caps.append(min(capacities[r] for r in t.resources))
            out.append(Task(t.delay_us, t.nbytes, (len(caps) - 1,), t.deps, t.release_us,
                            t.resources if t.account is None else t.account))
        else:
            out.append(t)
    return out, caps


def _engine(tasks: Sequence[Task], capacities: Sequence[float], congestion_aware: bool, sharing: str) -> EngineResult:
    """The engine a front end's options ask for: fair sharing, FIFO per resource, or no sharing."""
    if sharing not in ("fair", "fifo"):
        raise ValueError(f"sharing {sharing!r} is not fair or fifo")
    if not congestion_aware:
        return run_tasks(*unshared(tasks, capacities))
    return run_tasks_fifo(tasks, capacities) if sharing == "fifo" else run_tasks(tasks, capacities)


# ---------------------------------------------------------------------------------------------------------
# Topology -> resources


@dataclass(frozen=True)
class Route:
    """What a message on one link costs: latency and the resources its bytes cross."""

    src: int
    dst: int
    alpha_us: float
    resources: tuple[int, ...]  # constraining resources (dominated ones left out)
    account: tuple[int, ...]  # every resource crossed, for statistics
    link: Link


class NetworkModel:
    """Resources of a topology (capacities in bytes/us) and routes over its direct links.

    The links, switch ports and NICs and the rule that prunes them are `mlopt.sim.resources`' (shared with the
    trees planner); this class numbers them for the engine, in the order routes are first asked for, and adds
    one memory resource per rank for local copies."""

    def __init__(self, topology: Topology, *, local_GBps: float | None = DEFAULT_LOCAL_GBPS):
        if local_GBps is not None and not local_GBps > 0:
            raise ValueError("local_GBps must be > 0 (or None for free local operations)")
        self.topology = topology
        self.local_GBps = local_GBps
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.capacities: list[float] = []  # bytes/us
        self._index: dict[tuple, int] = {}
        self._links = topology.link_map()
        self.resources = TopologyResources(topology)
        self._routes: dict[tuple[int, int], Route | None] = {}

    def _resource(self, key: tuple, name: str, kind: str, capacity: float) -> int:
        r = self._index.get(key)
        if r is None:
            r = self._index[key] = len(self.names)
            self.names.append(name)
            self.kinds.append(kind)
            self.capacities.append(capacity)
        return r

    def route(self, src: int, dst: int) -> Route | None:
        """The direct link src->dst (topology ranks), or None when the topology has none."""
        if (src, dst) in self._routes:
            return self._routes[(src, dst)]
        link = self._links.get((src, dst))
        if link is None:
            self._routes[(src, dst)] = None
            return None
        parts = self.resources.hop(link)
        ids = [self._resource(p.key, p.name, p.kind, p.capacity_bytes_per_us) for p in parts]
        keep = [r for r, binds in zip(ids, self.resources.binding_mask(parts)) if binds]
        route = Route(src, dst, link.alpha_us, tuple(keep), tuple(ids), link)
        self._routes[(src, dst)] = route
        return route

    def memory(self, rank: int) -> int | None:
        """The rank's local copy resource (None when local operations are free)."""
        if self.local_GBps is None:
            return None
        return self._resource(("mem", rank), f"mem {rank}", "mem", self.local_GBps * 1e3)


# ---------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ResourceStats:
    name: str
    kind: str  # link, switch_tx, switch_rx, nic_tx, nic_rx, mem
    capacity_GBps: float
    bytes: float
    busy_us: float  # time with at least one flow in its byte phase
    utilization: float  # bytes / (capacity * simulated time): average fraction of capacity used

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "capacity_GBps": self.capacity_GBps, "bytes": self.bytes,
                "busy_us": self.busy_us, "utilization": self.utilization}


@dataclass(frozen=True)
class TimelineEntry:
    start_us: float  # issue time (start of the alpha phase)
    end_us: float  # delivery time
    src: int  # topology ranks
    dst: int
    bytes: float
    label: str = ""


def _resource_stats(model: NetworkModel, res: EngineResult, time_us: float) -> dict[str, ResourceStats]:
    stats = {}
    for r, name in enumerate(model.names):
        if res.bytes[r] <= 0:
            continue
        cap = model.capacities[r]
        util = res.bytes[r] / (cap * time_us) if time_us > 0 else 0.0
        stats[name] = ResourceStats(name, model.kinds[r], cap / 1e3, res.bytes[r], res.busy_us[r], util)
    return stats


@dataclass
class TransferResult:
    time_us: float
    start_us: list[float]  # per message: when its dependencies were met (issue time)
    end_us: list[float]  # per message: delivery time
    num_messages: int  # messages between different ranks
    bytes_sent: float  # network bytes (local messages excluded)
    resources: dict[str, ResourceStats]
    link_bytes: dict[tuple[int, int], float]  # topology ranks
    timeline: list[TimelineEntry] | None = None


@dataclass
class SimResult:
    """Outcome of `simulate_program`. Bandwidths in GB/s (1e9 bytes/s), nccl-tests' definitions."""

    collective: str
    num_ranks: int
    buffer_bytes: float
    chunk_bytes: float  # bytes of one chunk over the whole buffer
    loop_iterations: int
    time_us: float
    algbw_GBps: float  # buffer_bytes / time
    busbw_GBps: float  # algbw * nccl-tests' factor for the collective
    num_messages: int
    bytes_sent: float
    resources: dict[str, ResourceStats]
    link_bytes: dict[tuple[int, int], float]  # topology ranks
    timeline: list[TimelineEntry] | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "collective": self.collective, "num_ranks": self.num_ranks, "buffer_bytes": self.buffer_bytes,
            "chunk_bytes": self.chunk_bytes, "loop_iterations": self.loop_iterations, "time_us": self.time_us,
            "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps, "num_messages": self.num_messages,
            "bytes_sent": self.bytes_sent, "params": dict(self.params),
            "resources": [s.to_dict() for s in self.resources.values()],
        }
        if timeline and self.timeline is not None:
            d["timeline"] = [[e.start_us, e.end_us, e.src, e.dst, e.bytes, e.label] for e in self.timeline]
        return d


def busbw_factor(collective: str, n: int) -> float:
    if collective not in BUSBW_FACTOR:
        raise ValueError(f"unknown collective {collective!r}")
    return BUSBW_FACTOR[collective](n)


# ---------------------------------------------------------------------------------------------------------
# Front end: point-to-point messages


@dataclass(frozen=True)
class Message:
    """A point-to-point message for `simulate_transfers`.

    Sent over the direct link src->dst once every message in `deps` (indices into the list) has been
    delivered and not before `release_us`, after an extra `delay_us` (compute, reduction) on top of the
    link's alpha. src == dst is a local task: `delay_us` plus a copy of `nbytes` on the rank's memory
    resource (so compute can be modelled as Message(r, r, 0, delay_us=t)).
    """

    src: int
    dst: int
    nbytes: float
    deps: tuple[int, ...] = ()
    release_us: float = 0.0
    delay_us: float = 0.0
    label: str = ""


def _normalise_rank_map(rank_map: Sequence[int] | Mapping[int, int] | None, n: int, topology: Topology,
                        source: str) -> list[int]:
    if rank_map is None:
        if n > topology.num_ranks:
            raise InputError(source, "ngpus", f"{n} ranks but topology {topology.name!r} has {topology.num_ranks}")
        return list(range(n))
    if isinstance(rank_map, Mapping):
        missing = [r for r in range(n) if r not in rank_map]
        if missing:
            raise InputError(source, "rank_map", f"no topology rank for rank {missing[0]}")
        out = [int(rank_map[r]) for r in range(n)]
    else:
        out = [int(x) for x in rank_map]
        if len(out) < n:
            raise InputError(source, "rank_map", f"maps {len(out)} ranks, needs {n}")
        out = out[:n]
    bad = [x for x in out if not 0 <= x < topology.num_ranks]
    if bad:
        raise InputError(source, "rank_map", f"topology rank {bad[0]} outside 0..{topology.num_ranks - 1}")
    if len(set(out)) != len(out):
        raise InputError(source, "rank_map", "two ranks map to the same topology rank")
    return out


def simulate_transfers(messages: Sequence[Message], topology: Topology, *,
                       rank_map: Sequence[int] | Mapping[int, int] | None = None,
                       local_GBps: float | None = DEFAULT_LOCAL_GBPS, timeline: bool = False,
                       congestion_aware: bool = True, sharing: str = "fair",
                       model: "NetworkModel | None" = None, stats: bool = True) -> TransferResult:
    """Simulate point-to-point messages with dependencies on a topology (same engine as programs).

    Ranks are mapped to topology ranks by `rank_map` (default identity). Raises InputError when a message
    uses a link the topology lacks, ValueError for bad dependencies or a dependency cycle.
    `congestion_aware=False`: no sharing, every message moves at its lone rate (`unshared`).
    `sharing="fifo"` (congestion-aware only): one message at a time per link, port and NIC, first come first
    served (`run_tasks_fifo`), instead of max-min fair sharing.
    `model`: a `NetworkModel` of this topology kept by a caller that times many message lists on it (its routes
    are built once); its resources then include those of earlier calls, which only the statistics list.
    `stats=False`: no per-resource statistics (empty `resources`), for callers that want the time only.
    """
    nmax = 1 + max((max(m.src, m.dst) for m in messages), default=-1)
    ranks = _normalise_rank_map(rank_map, nmax, topology, "<messages>")
    if model is None:
        model = NetworkModel(topology, local_GBps=local_GBps)
    elif model.topology is not topology or model.local_GBps != local_GBps:
        raise ValueError("model: a NetworkModel of another topology or local copy rate")
    tasks: list[Task] = []
    link_bytes: dict[tuple[int, int], float] = {}
    sent = 0.0
    nnet = 0
    for k, m in enumerate(messages):
        if m.src < 0 or m.dst < 0:
            raise ValueError(f"message {k}: negative rank")
        a, b = ranks[m.src], ranks[m.dst]
        if a == b:
            mem = model.memory(a)
            res = (mem,) if mem is not None and m.nbytes > 0 else ()
            tasks.append(Task(m.delay_us, m.nbytes, res, tuple(m.deps), m.release_us))
            continue
        route = model.route(a, b)
        if route is None:
            raise InputError("<messages>", f"message {k}", f"rank {m.src}->{m.dst}: topology {topology.name!r} "
                             f"has no link {a}->{b}")
        tasks.append(Task(route.alpha_us + m.delay_us, m.nbytes, route.resources, tuple(m.deps), m.release_us,
                          route.account))
        link_bytes[(a, b)] = link_bytes.get((a, b), 0.0) + m.nbytes
        sent += m.nbytes
        nnet += 1
    res = _engine(tasks, model.capacities, congestion_aware, sharing)
    if res.unfinished:
        raise ValueError(f"dependency cycle: message {res.unfinished[0]} never runs")
    tl = None
    if timeline:
        tl = [TimelineEntry(res.start_us[k], res.finish_us[k], ranks[m.src], ranks[m.dst], m.nbytes, m.label)
              for k, m in enumerate(messages) if ranks[m.src] != ranks[m.dst]]
    return TransferResult(res.makespan_us, res.start_us, res.finish_us, nnet, sent,
                          _resource_stats(model, res, res.makespan_us) if stats else {}, link_bytes, tl)


# ---------------------------------------------------------------------------------------------------------
# Front end: MSCCL-EF programs


def buffer_chunks(program: Program) -> int:
    """Chunks in the buffer that `buffer_bytes` measures (nccl-tests' size convention).

    allgather, alltoall: the output buffer; reducescatter: the input; allreduce, broadcast, reduce: the
    (single) buffer. Read from gpu 0, falling back to the other buffer and then to nchunksperloop.
    """
    g = program.gpus[0] if program.gpus else None
    i_chunks = g.i_chunks if g else 0
    o_chunks = g.o_chunks if g else 0
    if program.coll == "reducescatter":
        first, second = i_chunks, o_chunks
    elif program.coll in ("allgather", "alltoall"):
        first, second = o_chunks, i_chunks
    else:
        first, second = max(i_chunks, o_chunks), 0
    return first or second or program.nchunksperloop


def call_overhead_us(topology: Topology, ranks: int) -> float:
    """The fixed cost one collective call of `ranks` ranks adds to its messages (Topology.call_overhead_us; none
    for a single rank, which moves nothing)."""
    return topology.call_overhead_us if ranks > 1 else 0.0


@dataclass(frozen=True)
class ProgramOptions:
    """How `simulate_program` runs a program; the fields are also its keyword arguments (see there)."""

    rank_map: Sequence[int] | Mapping[int, int] | None = None  # program rank -> topology rank (default identity)
    chunk_bytes: float | None = None  # default buffer_bytes / buffer_chunks(program)
    loop_chunk_bytes: float | None = None  # MSCCL loop tile; None: one iteration over the whole buffer
    local_GBps: float | None = DEFAULT_LOCAL_GBPS  # cpy/re through the rank's memory; None: free
    reduce_GBps: float | None = None  # reduction compute; None: the topology's, else free
    timeline: bool = False  # keep one TimelineEntry per message
    congestion_aware: bool = True  # False: nothing shares bandwidth (`unshared`)
    sharing: str = "fair"  # fair (max-min) or fifo (`run_tasks_fifo`)


def simulate_program(program: Program, topology: Topology, buffer_bytes: float,
                     options: ProgramOptions | None = None, **option_fields: Any) -> SimResult:
    """Simulate an MSCCL-EF program on a topology for a buffer of `buffer_bytes` per rank.

    Sizes (nccl-tests' convention): `buffer_bytes` is the whole output buffer per rank for allgather and
    alltoall, the buffer for allreduce, the whole input per rank for reducescatter, and the buffer (input
    = output) for broadcast and reduce. A chunk is `buffer_bytes / buffer_chunks(program)` bytes unless
    `chunk_bytes` says otherwise (algbw still uses `buffer_bytes`).

    Loops: MSCCL runs the program's loop over tiles of every chunk, each threadblock running all its
    steps once per tile, dependencies matching within a tile (the interpreter's flags carry the
    iteration). A tile is at most the protocol's chunk size (Simple: NCCL_BUFFSIZE / 2, see
    `MSCCL_SIMPLE_TILE_BYTES`). Assumption, by default (`loop_chunk_bytes=None`): one iteration covers
    the whole buffer, so every chunk moves as one message (chunk = buffer / chunks). With
    `loop_chunk_bytes=T` the steps run ceil(chunk / T) times on tiles of T bytes (the last one smaller);
    threadblocks are not synchronised across iterations beyond their own order, their dependencies and
    their messages. A step's cnt is not split at the executor's maximum count per call.

    Execution: each threadblock runs its steps in order. A step starts when the previous step of its
    threadblock (the previous iteration's last step for the first) and the step named by depid/deps
    (same iteration) have finished. Receiving steps (r, rcs, rrs, rrc, rrcs) also wait until the matching
    message has fully arrived; messages match in FIFO order per (sender, receiver, channel), and the
    receiver buffers without limit (MSCCL's NCCL_STEPS slots are not modelled), so a send never waits for
    its receiver. Sending steps (s, rcs, rrs, rrcs) put cnt chunks on the link after the receive part and
    finish when the message is delivered (conservative: no slice pipelining inside a step, so rcs
    forwards store-and-forward as in TACCL's model). Against the executor (msccl-executor-nccl,
    prims_simple.h genericOp: per slice, waitPeer for a free FIFO slot, reduceCopy by the threadblock's
    threads, postPeer): a send is copied by the threadblock itself, so holding it until delivery is what
    happens over NVLink/NVSwitch P2P; over the network transport the last slices may sit in the proxy's
    FIFO (NCCL_STEPS slots, 4 MiB by default) when the step ends, and rcs/rrs forward slice by slice as the
    data arrives: both only make the executor faster than this model. A step that depends on an rcs waits
    for its send too (flags are set when a step completes), as here. Costs: r and nop are free; cpy and re
    move cnt chunks through the rank's memory at `local_GBps` (shared by concurrent local steps; None:
    free); rrs, rrc, rrcs add cnt chunks / `reduce_GBps` of compute (None, the default: free, as MSCCL
    reduces while the data streams in), or the topology's `reduce_GBps` when it has one (a profiled CPU rank).

    Options (`ProgramOptions`, or its fields as keywords: `simulate_program(p, t, b, sharing="fifo")`):
    `congestion_aware=False`: nothing shares bandwidth, every send and local step moves at its lone rate
    (`unshared`; ASTRA-sim's congestion-unaware mode). `sharing="fifo"`: one transfer at a time per resource,
    first come first served (`run_tasks_fifo`).

    Errors: InputError (exit 2 in the CLI) when the program does not fit the topology (more ranks than
    the topology, a bad rank_map, a send over a link the topology lacks), when sends and receives do not
    match, or when the program deadlocks; ValueError for bad numeric arguments.
    """
    opts = replace(options or ProgramOptions(), **option_fields)
    src = program.name or "<program>"
    if not buffer_bytes > 0 and opts.chunk_bytes is None:
        raise ValueError("buffer_bytes must be > 0")
    if program.coll not in BUSBW_FACTOR:
        raise InputError(src, "coll", f"unknown collective {program.coll!r}")
    n = program.ngpus
    ranks = _normalise_rank_map(opts.rank_map, n, topology, src)
    chunk_bytes = _chunk_bytes(program, buffer_bytes, opts.chunk_bytes, src)
    tiles = _loop_tiles(chunk_bytes, opts.loop_chunk_bytes)
    reduce_GBps = topology.reduce_GBps if opts.reduce_GBps is None else opts.reduce_GBps  # None on both: free
    if reduce_GBps is not None and not reduce_GBps > 0:
        raise ValueError("reduce_GBps must be > 0 (or None for free reductions)")
    model = NetworkModel(topology, local_GBps=opts.local_GBps)
    steps = _index_steps(program, ranks, model, len(tiles), src)
    matched = _match_messages(steps, src)
    built = _program_tasks(steps, matched, ranks, model, tiles, reduce_GBps, src)
    res = _engine(built.tasks, model.capacities, opts.congestion_aware, opts.sharing)
    if res.unfinished:
        raise _deadlock(steps, built.tasks, res.unfinished, src)
    time_us = res.makespan_us + call_overhead_us(topology, n)
    tl = _program_timeline(steps, built, res, ranks) if opts.timeline else None
    algbw = buffer_bytes / time_us / 1e3 if time_us > 0 else math.inf
    return SimResult(
        collective=program.coll, num_ranks=n, buffer_bytes=buffer_bytes, chunk_bytes=float(chunk_bytes),
        loop_iterations=len(tiles), time_us=time_us, algbw_GBps=algbw,
        busbw_GBps=algbw * busbw_factor(program.coll, n), num_messages=len(built.timeline_of),
        bytes_sent=built.sent, resources=_resource_stats(model, res, time_us), link_bytes=built.link_bytes,
        timeline=tl,
        params={"local_GBps": opts.local_GBps, "reduce_GBps": reduce_GBps, "loop_chunk_bytes": opts.loop_chunk_bytes,
                "rank_map": ranks, "sharing": "max-min fair" if opts.congestion_aware else "none"},
    )


def _chunk_bytes(program: Program, buffer_bytes: float, chunk_bytes: float | None, src: str) -> float:
    """Bytes of one chunk: given, or the buffer over `buffer_chunks(program)`."""
    if chunk_bytes is None:
        nchunks = buffer_chunks(program)
        if nchunks <= 0:
            raise InputError(src, "gpus", "cannot tell the chunk count of the buffer")
        chunk_bytes = buffer_bytes / nchunks
    if not chunk_bytes > 0:
        raise ValueError("chunk_bytes must be > 0")
    return chunk_bytes


def _loop_tiles(chunk_bytes: float, loop_chunk_bytes: float | None) -> list[float]:
    """Bytes per chunk of each loop iteration: the whole chunk at once, or tiles of loop_chunk_bytes (the
    last one smaller)."""
    if loop_chunk_bytes is None or loop_chunk_bytes >= chunk_bytes:
        return [float(chunk_bytes)]
    if not loop_chunk_bytes > 0:
        raise ValueError("loop_chunk_bytes must be > 0")
    full = int(chunk_bytes // loop_chunk_bytes)
    tiles = [float(loop_chunk_bytes)] * full
    rest = chunk_bytes - full * loop_chunk_bytes
    if rest > 1e-9 * chunk_bytes:
        tiles.append(float(rest))
    return tiles


@dataclass
class _StepIndex:
    """Every step of every threadblock and loop iteration, numbered as engine tasks, with its message queues."""

    niter: int
    tbmap: dict[tuple[int, int], Any]  # (gpu, tb id) -> threadblock
    where: list[tuple[int, int, int, int]] = field(default_factory=list)  # task -> (gpu, tb id, iteration, step)
    first_id: dict[tuple[int, int], int] = field(default_factory=dict)  # (gpu, tb id) -> id of its first task
    send_q: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)  # (sender, receiver, channel)
    recv_q: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)

    def describe(self, task: int) -> str:
        g, t, i, k = self.where[task]
        st = self.tbmap[(g, t)].steps[k]
        return f"gpu {g} tb {t} step {st.s} ({st.type})" + (f" iteration {i}" if self.niter > 1 else "")


def _index_steps(program: Program, ranks: list[int], model: NetworkModel, niter: int, src: str) -> _StepIndex:
    """Number the tasks (threadblock by threadblock, iteration by iteration) and check every threadblock's
    peers, channels and steps against the program and the topology."""
    n = program.ngpus
    topology = model.topology
    gpus = {g.id: g for g in program.gpus}
    if sorted(gpus) != list(range(len(gpus))) or len(gpus) > n:
        raise InputError(src, "gpus", f"gpu ids must be 0..{n - 1}")
    index = _StepIndex(niter, {(g.id, tb.id): tb for g in program.gpus for tb in g.tbs})
    send_owner: dict[tuple[int, int, int], int] = {}
    recv_owner: dict[tuple[int, int, int], int] = {}
    for gid in range(len(gpus)):
        g = gpus[gid]
        tb_ids = [tb.id for tb in g.tbs]
        if len(set(tb_ids)) != len(tb_ids):
            raise InputError(src, f"gpu {gid}", "two threadblocks share an id")
        for tb in g.tbs:
            loc = f"gpu {gid} tb {tb.id}"
            sends = any(st.type in SENDING_STEPS for st in tb.steps)
            recvs = any(st.type in RECEIVING_STEPS for st in tb.steps)
            for st in tb.steps:
                if st.type not in STEP_TYPES:
                    raise InputError(src, f"{loc} step {st.s}", f"unknown step type {st.type!r}")
                if st.cnt < 0:
                    raise InputError(src, f"{loc} step {st.s}", "negative cnt")
            if sends:
                if not 0 <= tb.send < n or tb.send == gid:
                    raise InputError(src, loc, f"sending steps but send peer {tb.send}")
                a, b = ranks[gid], ranks[tb.send]
                if model.route(a, b) is None:
                    raise InputError(src, loc, f"sends to rank {tb.send} but topology {topology.name!r} has no "
                                     f"link {a}->{b}")
                key = (gid, tb.send, tb.chan)
                if key in send_owner:
                    raise InputError(src, loc, f"threadblocks {send_owner[key]} and {tb.id} both send to rank "
                                     f"{tb.send} on channel {tb.chan}")
                send_owner[key] = tb.id
                index.send_q[key] = []
            if recvs:
                if not 0 <= tb.recv < n or tb.recv == gid:
                    raise InputError(src, loc, f"receiving steps but recv peer {tb.recv}")
                key = (tb.recv, gid, tb.chan)
                if key in recv_owner:
                    raise InputError(src, loc, f"threadblocks {recv_owner[key]} and {tb.id} both receive from "
                                     f"rank {tb.recv} on channel {tb.chan}")
                recv_owner[key] = tb.id
                index.recv_q[key] = []
            index.first_id[(gid, tb.id)] = len(index.where)
            for it in range(niter):
                for k, st in enumerate(tb.steps):
                    task = len(index.where)
                    index.where.append((gid, tb.id, it, k))
                    if st.type in SENDING_STEPS:
                        index.send_q[(gid, tb.send, tb.chan)].append(task)
                    if st.type in RECEIVING_STEPS:
                        index.recv_q[(tb.recv, gid, tb.chan)].append(task)
    return index


def _match_messages(steps: _StepIndex, src: str) -> dict[int, int]:
    """receiving task -> sending task: FIFO order per (sender, receiver, channel)."""
    matched: dict[int, int] = {}
    for key in sorted(set(steps.send_q) | set(steps.recv_q)):
        s_list, r_list = steps.send_q.get(key, []), steps.recv_q.get(key, [])
        a, b, ch = key
        if len(s_list) != len(r_list):
            raise InputError(src, f"gpu {b}" if len(r_list) > len(s_list) else f"gpu {a}",
                             f"rank {a} sends {len(s_list) // steps.niter} messages to rank {b} on channel {ch}, "
                             f"rank {b} receives {len(r_list) // steps.niter}")
        for s_task, r_task in zip(s_list, r_list):
            matched[r_task] = s_task
    return matched


@dataclass
class _ProgramTasks:
    tasks: list[Task]
    timeline_of: list[int]  # the sending tasks
    nbytes_of: list[float]  # per task
    link_bytes: dict[tuple[int, int], float]  # topology ranks
    sent: float


def _program_tasks(steps: _StepIndex, matched: dict[int, int], ranks: list[int], model: NetworkModel,
                   tiles: list[float], reduce_GBps: float | None, src: str) -> _ProgramTasks:
    """One engine task per step and iteration: its dependencies (threadblock order, depid/deps, the matching
    send) and its cost (a send crosses its route, cpy/re the rank's memory, reductions add compute)."""
    out = _ProgramTasks([], [], [], {}, 0.0)
    tbmap, first_id = steps.tbmap, steps.first_id
    for task, (gid, tbid, it, k) in enumerate(steps.where):
        tb = tbmap[(gid, tbid)]
        st = tb.steps[k]
        nbytes = st.cnt * tiles[it]
        deps = []
        if task > first_id[(gid, tbid)]:
            deps.append(task - 1)
        if st.depid >= 0:
            if (gid, st.depid) not in first_id:
                raise InputError(src, f"gpu {gid} tb {tbid} step {st.s}", f"depends on unknown threadblock {st.depid}")
            dep_tb = tbmap[(gid, st.depid)]
            if not 0 <= st.deps < len(dep_tb.steps):
                raise InputError(src, f"gpu {gid} tb {tbid} step {st.s}",
                                 f"depends on step {st.deps} of threadblock {st.depid}, which has "
                                 f"{len(dep_tb.steps)} steps")
            deps.append(first_id[(gid, st.depid)] + it * len(dep_tb.steps) + st.deps)
        if st.type in RECEIVING_STEPS:
            s_task = matched[task]
            sg, stb, _, sk = steps.where[s_task]
            s_step = tbmap[(sg, stb)].steps[sk]
            if s_step.cnt != st.cnt:
                raise InputError(src, f"gpu {gid} tb {tbid} step {st.s}",
                                 f"receives {st.cnt} chunks but gpu {sg} tb {stb} step {s_step.s} sends {s_step.cnt}")
            deps.append(s_task)
        extra = nbytes / (reduce_GBps * 1e3) if reduce_GBps is not None and st.type in REDUCING_STEPS \
            and st.type != "re" else 0.0
        if st.type in SENDING_STEPS:
            a, b = ranks[gid], ranks[tb.send]
            route = model.route(a, b)
            out.tasks.append(Task(route.alpha_us + extra, nbytes, route.resources, tuple(deps), 0.0, route.account))
            out.timeline_of.append(task)
            out.link_bytes[(a, b)] = out.link_bytes.get((a, b), 0.0) + nbytes
            out.sent += nbytes
        elif st.type in ("cpy", "re"):
            mem = model.memory(ranks[gid])
            res = (mem,) if mem is not None and nbytes > 0 else ()
            out.tasks.append(Task(0.0, nbytes if res else 0.0, res, tuple(deps)))
        else:  # r, rrc (reduce compute only), nop
            out.tasks.append(Task(extra, 0.0, (), tuple(deps)))
        out.nbytes_of.append(nbytes)
    return out


def _deadlock(steps: _StepIndex, tasks: list[Task], unfinished: list[int], src: str) -> InputError:
    """A dependency cycle: name the first step a threadblock is blocked on (its predecessor in the threadblock
    finished, or it is the first) and the stuck steps it waits for."""
    stuck = set(unfinished)
    blocked = [i for i in unfinished if i == steps.first_id[steps.where[i][:2]] or i - 1 not in stuck]
    task = blocked[0] if blocked else unfinished[0]
    waits = [steps.describe(d) for d in tasks[task].deps if d in stuck]
    gid, tbid, it, k = steps.where[task]
    return InputError(src, steps.describe(task).split(" (")[0],
                      f"deadlock: step {steps.tbmap[(gid, tbid)].steps[k].type!r} waits for "
                      f"{', '.join(waits) or 'a stuck step'}; {len(stuck)} steps never run")


def _program_timeline(steps: _StepIndex, built: _ProgramTasks, res: EngineResult, ranks: list[int]) -> list[TimelineEntry]:
    tl = []
    for task in built.timeline_of:
        gid, tbid, it, k = steps.where[task]
        tb = steps.tbmap[(gid, tbid)]
        tl.append(TimelineEntry(res.start_us[task], res.finish_us[task], ranks[gid], ranks[tb.send],
                                built.nbytes_of[task], f"g{gid} tb{tbid} s{k}" + (f" i{it}" if steps.niter > 1 else "")))
    return tl

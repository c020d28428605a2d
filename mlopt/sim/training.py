"""Training-iteration simulator (ASTRA-SIM style): a workload's compute and collectives on one rank's timeline.

Discrete-event, SPMD (see mlopt.sim.workload): one rank's item stream stands for all ranks.
  - Compute items run one at a time, in issue order, on the "compute" lane, each once its deps are done; a
    compute item blocked on a dep blocks the ones after it (an in-order stream, like one CUDA stream).
  - A comm item becomes ready when its deps are done and waits in a queue. Whenever one of the
    `channels` collective lanes ("channel 0", ...) is free, the policy picks the next collective: fifo, the
    earliest ready (ties: issue order); lifo, the latest ready (ties: last issued); explicit, the next id of
    `order`, which blocks the queue until that item is ready (in-order issue, as the Syndicate enforcer does).
    The collective holds its channel for timer(item)[0] us.
The collective timer (the system and network layers) is injected: `timer(item) -> (duration_us, algorithm)`.
It is called once per distinct (collective, nbytes, group, pairs), in issue order, whatever the policy (a
permute's time depends on which pairs it moves, not only on its group).

Accounting over the makespan [0, T]: compute (lane busy), comm (union of the channels' busy time),
overlapped = comm while compute is busy, exposed = comm while compute is idle, idle = neither. So
compute + exposed + idle = T and overlapped + exposed = comm. Per collective, exposed_us is the part of its
own interval during which the compute lane is idle (collectives on several channels may share exposed time).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable

from mlopt.sim.workload import COMM, COMPUTE, WorkItem, Workload

POLICIES = ("fifo", "lifo", "explicit")
COMPUTE_LANE = "compute"
DIGITS = 3  # report times in us, rounded to the nanosecond

CollectiveTimer = Callable[[WorkItem], tuple[float, str]]  # -> (duration_us, algorithm label)
Interval = tuple[float, float]


@dataclass(frozen=True)
class SimOptions:
    policy: str = "fifo"  # fifo | lifo | explicit (order from a plan: `order` below)
    channels: int = 1  # collectives in flight at once (each on its own channel); compute is one more lane
    order: tuple[int, ...] = ()  # explicit: comm item ids in issue order
    iterations: int = 1  # informational; chaining is done by the workload builder


@dataclass(frozen=True)
class ItemTiming:
    id: int
    name: str
    kind: str  # "compute" | "comm"
    lane: str  # "compute" | "channel 0" | ...
    start_us: float
    end_us: float
    iteration: int = 0
    phase: str = ""
    layer: str = ""
    collective: str = ""
    nbytes: int = 0
    algorithm: str = ""
    exposed_us: float = 0.0  # comm only: the part of [start, end) during which the compute lane is idle
    ready_us: float = 0.0  # when its deps were all done (comm: start - ready is time queued)
    group_size: int = 0
    source_op: int | None = None

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id, "name": self.name, "kind": self.kind, "lane": self.lane,
            "start_us": _r(self.start_us), "end_us": _r(self.end_us), "iteration": self.iteration,
            "phase": self.phase, "layer": self.layer, "source_op": self.source_op,
        }
        if self.kind == COMM:
            d.update(collective=self.collective, nbytes=self.nbytes, group_size=self.group_size,
                     algorithm=self.algorithm, ready_us=_r(self.ready_us), exposed_us=_r(self.exposed_us))
        return d


@dataclass(frozen=True)
class IterationReport:
    iteration_time_us: float  # makespan
    per_iteration_us: tuple[float, ...]  # end of each iteration's last item minus the previous one's
    compute_us: float
    comm_us: float  # union of comm intervals
    overlapped_us: float  # comm while compute is busy
    exposed_us: float  # comm while compute is idle
    idle_us: float  # neither
    items: tuple[ItemTiming, ...]
    workload: str = ""
    world_size: int = 1
    policy: str = "fifo"
    channels: int = 1

    def lanes(self) -> list[str]:
        return [COMPUTE_LANE] + [f"channel {c}" for c in range(self.channels)]

    def iteration_ends(self) -> list[float]:
        """Cumulative end of each iteration (the boundaries per_iteration_us measures)."""
        ends, t = [], 0.0
        for d in self.per_iteration_us:
            t += d
            ends.append(t)
        return ends

    def exposed_intervals(self) -> list[Interval]:
        """Where some collective runs while the compute lane is idle."""
        compute = _union((t.start_us, t.end_us) for t in self.items if t.kind == COMPUTE)
        comm = _union((t.start_us, t.end_us) for t in self.items if t.kind == COMM)
        return _subtract(comm, compute)

    def collective_rows(self) -> list[dict[str, Any]]:
        """One row per collective, in start order."""
        rows = []
        for t in sorted((t for t in self.items if t.kind == COMM), key=lambda t: (t.start_us, t.id)):
            dur = t.duration_us
            rows.append({
                "id": t.id, "name": t.name, "layer": t.layer, "iteration": t.iteration,
                "collective": t.collective, "bytes": t.nbytes, "group_size": t.group_size,
                "algorithm": t.algorithm, "lane": t.lane, "ready_us": _r(t.ready_us),
                "start_us": _r(t.start_us), "end_us": _r(t.end_us), "duration_us": _r(dur),
                "queued_us": _r(t.start_us - t.ready_us), "exposed_us": _r(t.exposed_us),
                "exposed_share": round(t.exposed_us / dur, 4) if dur > 0 else 0.0,
            })
        return rows

    def to_dict(self) -> dict[str, Any]:
        T = self.iteration_time_us
        return {
            "workload": self.workload, "world_size": self.world_size, "policy": self.policy,
            "channels": self.channels, "iteration_time_us": _r(T),
            "per_iteration_us": [_r(x) for x in self.per_iteration_us],
            "compute_us": _r(self.compute_us), "comm_us": _r(self.comm_us),
            "overlapped_us": _r(self.overlapped_us), "exposed_us": _r(self.exposed_us), "idle_us": _r(self.idle_us),
            "exposed_share": round(self.exposed_us / T, 4) if T > 0 else 0.0,
            "items": [t.to_dict() for t in self.items],
        }


def _r(x: float) -> float:
    return round(float(x), DIGITS) + 0.0  # + 0.0: no negative zero


def constant_timer(us: float, algorithm: str = "constant") -> CollectiveTimer:
    """A timer pricing every collective at `us` (tests, what-if studies)."""
    return lambda item: (float(us), algorithm)


# ---------------------------------------------------------------------------------------------------------
# Checks and the memoised timer


def _check(workload: Workload, options: SimOptions) -> dict[int, int]:
    """Position of each item id; ValueError for malformed workloads or options."""
    if options.policy not in POLICIES:
        raise ValueError(f"unknown policy {options.policy!r} (expected one of {', '.join(POLICIES)})")
    if not isinstance(options.channels, int) or options.channels < 1:
        raise ValueError(f"channels must be a positive integer, not {options.channels!r}")
    pos: dict[int, int] = {}
    for i, it in enumerate(workload.items):
        if it.id in pos:
            raise ValueError(f"workload {workload.name!r}: duplicate item id {it.id}")
        if it.kind not in (COMPUTE, COMM):
            raise ValueError(f"item {it.id} ({it.name}): kind {it.kind!r}, expected 'compute' or 'comm'")
        if it.kind == COMPUTE and not (math.isfinite(it.duration_us) and it.duration_us >= 0):
            raise ValueError(f"item {it.id} ({it.name}): duration_us {it.duration_us} is not a time >= 0")
        pos[it.id] = i
    for it in workload.items:
        bad = [d for d in it.deps if d not in pos or d == it.id]
        if bad:
            raise ValueError(f"item {it.id} ({it.name}) depends on unknown or itself: {bad}")
    if options.policy == "explicit":
        _check_order(workload, options.order, pos)
    return pos


def _check_order(workload: Workload, order: tuple[int, ...], pos: dict[int, int]) -> None:
    comm = [it.id for it in workload.items if it.kind == COMM]
    unknown = [i for i in order if i not in pos or workload.items[pos[i]].kind != COMM]
    if unknown:
        raise ValueError(f"explicit order names ids that are not comm items: {unknown}")
    seen = set()
    twice = sorted({i for i in order if i in seen or seen.add(i)})
    if twice:
        raise ValueError(f"explicit order names comm items more than once: {twice}")
    missing = [i for i in comm if i not in seen]
    if missing:
        names = ", ".join(f"{i} ({workload.items[pos[i]].name})" for i in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ValueError(f"explicit order leaves out comm items {names}{more}")


def _comm_costs(items: tuple[WorkItem, ...], timer: CollectiveTimer) -> dict[int, tuple[float, str]]:
    """(duration, algorithm) of every comm item, one timer call per distinct (collective, nbytes, group, pairs)."""
    memo: dict[tuple[str, int, tuple[int, ...], tuple[tuple[int, int], ...]], tuple[float, str]] = {}
    costs = {}
    for it in items:
        if it.kind != COMM:
            continue
        key = (it.collective, it.nbytes, it.group, it.pairs)
        if key not in memo:
            us, algorithm = timer(it)
            us = float(us)
            if not math.isfinite(us) or us < 0:
                raise ValueError(f"collective timer gave {us} us for item {it.id} ({it.name}), expected a time >= 0")
            memo[key] = (us, str(algorithm))
        costs[it.id] = memo[key]
    return costs


# ---------------------------------------------------------------------------------------------------------
# The event loop


class _Queue:
    """Ready comm items (positions) and the policy that picks the next one."""

    def __init__(self, policy: str, order: list[int]) -> None:
        self.policy, self.order, self.next = policy, order, 0
        self.heap: list[tuple[float, int]] = []
        self.ready: set[int] = set()

    def push(self, pos: int, t: float) -> None:
        self.ready.add(pos)
        if self.policy == "fifo":
            heapq.heappush(self.heap, (t, pos))
        elif self.policy == "lifo":
            heapq.heappush(self.heap, (-t, -pos))

    def pop(self) -> int | None:
        if self.policy == "explicit":
            if self.next < len(self.order) and self.order[self.next] in self.ready:
                self.next += 1
                self.ready.discard(self.order[self.next - 1])
                return self.order[self.next - 1]
            return None
        if not self.heap:
            return None
        _, p = heapq.heappop(self.heap)
        p = abs(p)
        self.ready.discard(p)
        return p


def _schedule(items: tuple[WorkItem, ...], pos: dict[int, int], costs: dict[int, tuple[float, str]],
              options: SimOptions) -> tuple[list[float], list[float], list[float], list[str]]:
    """Ready, start and end time and lane of each item (by position)."""
    n = len(items)
    remaining = [len(set(it.deps)) for it in items]
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, it in enumerate(items):
        for d in set(it.deps):
            dependents[pos[d]].append(i)
    duration = [costs[it.id][0] if it.kind == COMM else it.duration_us for it in items]
    ready, start, end = [math.nan] * n, [math.nan] * n, [math.nan] * n
    lane = [""] * n
    compute = [i for i, it in enumerate(items) if it.kind == COMPUTE]
    queue = _Queue(options.policy, [pos[i] for i in options.order])
    free_channels = list(range(options.channels))  # a heap: the lowest free channel first
    events: list[tuple[float, int, int]] = []  # (end, position, channel or -1 for compute)
    next_compute, compute_busy = 0, False

    def mark_ready(i: int, t: float) -> None:
        ready[i] = t
        if items[i].kind == COMM:
            queue.push(i, t)

    def begin(i: int, t: float, where: str, channel: int) -> None:
        start[i], end[i], lane[i] = t, t + duration[i], where
        heapq.heappush(events, (end[i], i, channel))

    for i in range(n):
        if remaining[i] == 0:
            mark_ready(i, 0.0)
    t = 0.0
    while True:
        if not compute_busy and next_compute < len(compute) and remaining[compute[next_compute]] == 0:
            begin(compute[next_compute], t, COMPUTE_LANE, -1)
            next_compute, compute_busy = next_compute + 1, True
        while free_channels:
            i = queue.pop()
            if i is None:
                break
            c = heapq.heappop(free_channels)
            begin(i, t, f"channel {c}", c)
        if not events:
            break
        t = events[0][0]
        while events and events[0][0] <= t:
            _, i, c = heapq.heappop(events)
            if c < 0:
                compute_busy = False
            else:
                heapq.heappush(free_channels, c)
            for j in dependents[i]:
                remaining[j] -= 1
                if remaining[j] == 0:
                    mark_ready(j, t)
    stuck = [i for i in range(n) if math.isnan(end[i])]
    if stuck:
        raise ValueError(_deadlock_message(items, pos, end, stuck))
    return ready, start, end, lane


def _deadlock_message(items: tuple[WorkItem, ...], pos: dict[int, int], end: list[float], stuck: list[int]) -> str:
    first = items[stuck[0]]
    waits = [d for d in first.deps if math.isnan(end[pos[d]])]
    why = f"waits for {waits}" if waits else "is ready but blocked (in-order compute stream or explicit order)"
    return (f"deadlock: {len(stuck)} items never ran; the first, item {first.id} ({first.name}), {why}: "
            "check deps against issue order and the explicit collective order")


# ---------------------------------------------------------------------------------------------------------
# Interval arithmetic


def _union(intervals: Any) -> list[Interval]:
    merged: list[list[float]] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def _overlap(a: list[Interval], b: list[Interval]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of a (sorted, disjoint) outside b (sorted, disjoint)."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _busy_within(busy: list[Interval], starts: list[float], s: float, e: float) -> float:
    """Length of busy (sorted, disjoint; `starts` its start points) inside [s, e)."""
    total, k = 0.0, max(bisect_right(starts, s) - 1, 0)
    while k < len(busy) and busy[k][0] < e:
        lo, hi = max(busy[k][0], s), min(busy[k][1], e)
        if hi > lo:
            total += hi - lo
        k += 1
    return total


# ---------------------------------------------------------------------------------------------------------
# The report


def _per_iteration(items: tuple[WorkItem, ...], end: list[float]) -> tuple[float, ...]:
    last: dict[int, float] = {}
    for it, e in zip(items, end):
        last[it.iteration] = max(last.get(it.iteration, 0.0), e)
    out, boundary = [], 0.0
    for k in sorted(last):
        nxt = max(boundary, last[k])
        out.append(nxt - boundary)
        boundary = nxt
    return tuple(out)


def simulate_iteration(workload: Workload, timer: CollectiveTimer,
                       options: SimOptions = SimOptions()) -> IterationReport:
    """Simulate `workload` (one or more chained iterations); see the module docstring for the semantics.
    ValueError for malformed workloads, bad options, an explicit order that leaves out comm items, or a
    deadlock (a compute item waiting on one issued after it)."""
    pos = _check(workload, options)
    items = workload.items
    costs = _comm_costs(items, timer)
    ready, start, end, lane = _schedule(items, pos, costs, options)
    compute = _union((start[i], end[i]) for i, it in enumerate(items) if it.kind == COMPUTE)
    comm = _union((start[i], end[i]) for i, it in enumerate(items) if it.kind == COMM)
    starts = [s for s, _ in compute]
    T = max(end, default=0.0)
    timings = []
    for i, it in enumerate(items):
        is_comm = it.kind == COMM
        exposed = (end[i] - start[i]) - _busy_within(compute, starts, start[i], end[i]) if is_comm else 0.0
        timings.append(ItemTiming(
            id=it.id, name=it.name, kind=it.kind, lane=lane[i], start_us=start[i], end_us=end[i],
            iteration=it.iteration, phase=it.phase, layer=it.layer, collective=it.collective, nbytes=it.nbytes,
            algorithm=costs[it.id][1] if is_comm else "", exposed_us=max(exposed, 0.0), ready_us=ready[i],
            group_size=len(it.group), source_op=it.source_op,
        ))
    compute_us, comm_us = _length(compute), _length(comm)
    overlapped = _overlap(compute, comm)
    exposed = comm_us - overlapped
    return IterationReport(
        iteration_time_us=T, per_iteration_us=_per_iteration(items, end), compute_us=compute_us,
        comm_us=comm_us, overlapped_us=overlapped, exposed_us=exposed, idle_us=max(T - compute_us - exposed, 0.0),
        items=tuple(timings), workload=workload.name, world_size=workload.world_size, policy=options.policy,
        channels=options.channels,
    )

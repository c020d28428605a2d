"""optSched (Syndicate, Pseudocode 1, lines 12-29): the cost of one execution plan of a training DAG.

The problem is abstract: a DAG of compute and comm tasks, and for each comm task a tuple of candidate
execution plans, each a tuple of motifs with a duration and the set of channels it holds while it runs.

Reading of Pseudocode 1 and the deviations from it
--------------------------------------------------
The paper keeps two clocks, ``comp_time`` and ``comm_time``, and alternates: while the compute clock is
not ahead it ``fifoDequeue``s the next compute task; while the comm clock is behind it
``criticalPathDequeue``s the ready motif on the critical path and sets
``comm_time = max(comm_time, startTime + motif.time())``; it returns ``max(comm_time, comp_time)``.
Scheduling an item "enqueues ready motifs / compute" (its successors). The pseudocode leaves implicit
the outer loop around the two inner loops, that a compute task waits for its comm dependencies, and has
one comm clock (every motif serialised). We implement the same alternation as an event-driven list
scheduler, which is what the two-clock loop computes once those gaps are filled:

* compute tasks run one at a time on one compute stream, strictly in issue order (the order in
  ``problem.tasks``): a compute task whose deps are not finished blocks the ones issued after it
  (head-of-line, like a CUDA stream), and starts at ``max(stream free, deps finished)``;
* a comm task, when all its deps have finished, expands into the motifs of its chosen plan; a motif is
  ready when the comm task is expanded and the motifs it depends on (same comm task) have finished;
* **deviation**: instead of one ``comm_time`` there is one clock per channel. A motif holds all its
  channels exclusively from start to end; motifs on disjoint channel sets overlap each other and
  compute. With a single channel this is exactly the paper's single ``comm_time``;
* at every event time the ready motifs are considered in priority order and each one whose channels are
  all free starts now (greedy, non-delay, with backfilling: a lower-priority motif on free channels is
  not held back by a higher-priority one waiting on a busy channel);
* priority (``order``): ``"critical"`` = the paper's criticalPathDequeue (largest critical path first,
  see :func:`critical_paths`); ``"needed"`` = the comm task whose result the compute stream needs soonest
  (:func:`needed_by`: the hand-tuned priority baseline); ``"fifo"`` = the comm task that became ready first (ties: issue order),
  motifs of one task in plan order (PyTorch default); ``"lifo"`` = the comm task that became ready last
  first (ByteScheduler). Ties always break by issue order, then motif index, so results are deterministic;
* the comm task ends when its last motif ends; its successors are then released.

Sequence numbers (the scheduling order, Pseudocode 2's ``seq_num``): the distinct start times of all
motifs, sorted ascending and numbered densely from 0; every motif gets the number of its start time.
Motifs issued at the same instant (they overlap on disjoint channels) therefore share a number, and the
enforcer's counter advances once per instant. Numbers span the whole problem (both unrolled iterations);
the caller resets them per iteration if it wants the enforcer's per-iteration counter.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

Order = Literal["fifo", "lifo", "critical", "needed"]
ORDERS: tuple[str, ...] = ("fifo", "lifo", "critical", "needed")


@dataclass(frozen=True)
class Task:
    id: int
    kind: str  # "compute" | "comm"
    duration_us: float  # compute time; ignored for comm tasks (their plan's motifs give the time)
    deps: tuple[int, ...]
    name: str = ""
    iteration: int = 0  # unrolled training iteration the task belongs to (reports and the enforcer's table)


@dataclass(frozen=True)
class MotifRun:
    name: str
    duration_us: float
    channels: frozenset[str]
    deps: tuple[int, ...] = ()  # indices of earlier motifs of the same plan that must finish first


@dataclass(frozen=True)
class ExecutionPlan:
    label: str
    motifs: tuple[MotifRun, ...]

    @property
    def total_us(self) -> float:
        return sum(m.duration_us for m in self.motifs)


@dataclass(frozen=True)
class ScheduleProblem:
    tasks: tuple[Task, ...]
    options: dict[int, tuple[ExecutionPlan, ...]]  # comm task id -> candidate plans; [0] is the default
    channels: tuple[str, ...]
    # What the motifs do, for plans and the runtime's enforcer (problem.py fills them; optSched ignores them):
    # comm task id -> its collective (a motifs.CommOp), and per option, per MotifRun, the motifs.Motifs it
    # issues together (their deps index the option's motifs flattened in run order).
    ops: dict[int, Any] = field(default_factory=dict)
    decompositions: dict[int, tuple[tuple[Any, ...], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class MotifSlot:
    task_id: int
    motif_index: int
    name: str
    channels: frozenset[str]
    start_us: float
    end_us: float
    seq: int  # dense rank of start_us among all motif start times (equal for simultaneous issue)
    priority: float  # critical path (us) from this motif's start to the end of the DAG


@dataclass(frozen=True)
class Schedule:
    makespan_us: float
    order: str
    plan: dict[int, int]  # comm task id -> chosen option index
    task_times: dict[int, tuple[float, float]]  # task id -> (start, end); comm: first motif start, last end
    motifs: tuple[MotifSlot, ...]  # sorted by (seq, task issue position, motif index)
    compute_idle_pct: float  # 100 * (makespan - compute busy time) / makespan; 0 for an empty DAG

    def sequence(self) -> dict[tuple[int, int], int]:
        """(comm task id, motif index) -> sequence number: the scheduling order for the enforcer."""
        return {(m.task_id, m.motif_index): m.seq for m in self.motifs}


# ----------------------------------------------------------------------------------------- validation


def _label(task: Task) -> str:
    return f"task {task.id}" + (f" ({task.name!r})" if task.name else "")


def _check_duration(value: float, where: str) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: duration must be a finite number >= 0, got {value!r}")


def _check_plan(task: Task, k: int, plan: ExecutionPlan, channels: frozenset[str]) -> None:
    where = f"{_label(task)} option {k} ({plan.label!r})"
    if not plan.motifs:
        raise ValueError(f"{where}: an execution plan needs at least one motif")
    for i, m in enumerate(plan.motifs):
        _check_duration(m.duration_us, f"{where} motif {i}")
        if not m.channels:
            raise ValueError(f"{where} motif {i} ({m.name!r}): needs at least one channel")
        unknown = sorted(set(m.channels) - channels)
        if unknown:
            raise ValueError(f"{where} motif {i} ({m.name!r}): unknown channel(s) {unknown}")
        bad = [d for d in m.deps if not isinstance(d, int) or not 0 <= d < i]
        if bad:
            raise ValueError(f"{where} motif {i} ({m.name!r}): deps {bad} must be indices of earlier motifs")


def _topo_order(tasks: tuple[Task, ...]) -> list[int]:
    """Task positions in a topological order; ValueError naming a task on a cycle."""
    index = {t.id: i for i, t in enumerate(tasks)}
    indeg = [len(set(t.deps)) for t in tasks]
    succ: list[list[int]] = [[] for _ in tasks]
    for i, t in enumerate(tasks):
        for d in set(t.deps):
            succ[index[d]].append(i)
    order = [i for i, n in enumerate(indeg) if n == 0]
    for i in order:  # order grows while iterating
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) < len(tasks):
        cycle = _find_cycle(tasks, {i for i, n in enumerate(indeg) if n > 0}, index)
        path = " -> ".join(str(tasks[i].id) for i in cycle)
        raise ValueError(f"{_label(tasks[cycle[0]])}: dependency cycle (depends on: {path})")
    return order


def _find_cycle(tasks: tuple[Task, ...], stuck: set[int], index: dict[int, int]) -> list[int]:
    """Positions along one dependency cycle among the stuck tasks (each stuck task has a stuck dep)."""
    i = min(stuck, key=lambda k: tasks[k].id)
    seen: list[int] = []
    while i not in seen:
        seen.append(i)
        i = min((index[d] for d in tasks[i].deps if index[d] in stuck), key=lambda k: tasks[k].id)
    cycle = seen[seen.index(i):]
    return cycle + [cycle[0]]


def validate(problem: ScheduleProblem) -> list[int]:
    """Check the problem; ValueError names the culprit.

    Returns task positions in reverse topological order of the DAG plus the FIFO compute-stream edges.
    """
    channels = frozenset(problem.channels)
    seen: set[int] = set()
    for t in problem.tasks:
        if t.id in seen:
            raise ValueError(f"{_label(t)}: duplicate task id")
        seen.add(t.id)
        if t.kind not in ("compute", "comm"):
            raise ValueError(f"{_label(t)}: kind must be 'compute' or 'comm', got {t.kind!r}")
    for t in problem.tasks:
        unknown = [d for d in t.deps if d not in seen]
        if unknown:
            raise ValueError(f"{_label(t)}: unknown dependency id(s) {unknown}")
        if t.id in t.deps:
            raise ValueError(f"{_label(t)}: depends on itself (dependency cycle)")
        if t.kind == "compute":
            _check_duration(t.duration_us, _label(t))
        else:
            plans = problem.options.get(t.id)
            if not plans:
                raise ValueError(f"{_label(t)}: comm task has no execution plan options")
            for k, plan in enumerate(plans):
                _check_plan(t, k, plan, channels)
    kinds = {t.id: t.kind for t in problem.tasks}
    for tid in problem.options:
        if kinds.get(tid) != "comm":
            raise ValueError(f"options given for task {tid}, which is not a comm task")
    _topo_order(problem.tasks)  # plain dependency cycles first, with the plainer message
    return _combined_reverse_order(problem.tasks, _successors(problem.tasks))


def _successors(tasks: tuple[Task, ...]) -> list[set[int]]:
    """Per task position, successor positions: dependency edges plus compute-stream FIFO edges."""
    pos = {t.id: i for i, t in enumerate(tasks)}
    succ: list[set[int]] = [set() for _ in tasks]
    for i, t in enumerate(tasks):
        for d in t.deps:
            succ[pos[d]].add(i)
    compute_pos = [i for i, t in enumerate(tasks) if t.kind == "compute"]
    for a, b in zip(compute_pos, compute_pos[1:]):
        succ[a].add(b)
    return succ


def framework_issue(problem: ScheduleProblem) -> ScheduleProblem:
    """The problem as a framework issues comm-ops without an enforcer (PyTorch's ProcessGroupNCCL): a
    collective is enqueued when the application thread reaches it, behind an event on the compute stream, so
    it cannot start before the compute task issued just before it has finished. Each comm task gains that
    dependency; the data-prep all-to-all of the next batch therefore waits for this iteration's last compute,
    which Syndicate's enforcer (Pseudocode 2, the plan's order and data dependencies only) does not."""
    tasks, last_compute = [], None
    for t in problem.tasks:
        if t.kind == "comm" and last_compute is not None and last_compute not in t.deps:
            t = replace(t, deps=t.deps + (last_compute,))
        if t.kind == "compute":
            last_compute = t.id
        tasks.append(t)
    return replace(problem, tasks=tuple(tasks))


def contention_free_bound(problem: ScheduleProblem) -> Schedule:
    """A lower bound on the makespan of every plan, order and issue model. Each comm task becomes one motif on a
    channel of its own (no contention between comm tasks), lasting the least any of its options can take
    alone (`_least_alone_us`); data dependencies only. With no contention the list scheduler starts every
    task as early as its dependencies and the (fixed-order) compute stream allow, which is optimal for this
    relaxation; any real schedule only adds delays (shared channels, slower options, framework issue): every
    start is monotone in the durations and release times before it, by induction over the issue order."""
    relaxed = _relaxed(problem)
    return simulate(relaxed, default_plan(relaxed), "fifo", validate(relaxed))


def _relaxed(problem: ScheduleProblem) -> ScheduleProblem:
    """Every comm task as one motif of its least time alone, on a channel of its own."""
    options = {}
    for tid, plans in problem.options.items():
        best = min(plans, key=_least_alone_us)
        options[tid] = (ExecutionPlan(best.label, (MotifRun(f"{best.label}:alone", _least_alone_us(best),
                                                            frozenset([f"{tid}/alone"])),)),)
    channels = tuple(c for plans in options.values() for m in plans[0].motifs for c in m.channels)
    return replace(problem, options=options, channels=channels)


def channel_window_bound_us(problem: ScheduleProblem) -> float:
    """A second lower bound on the makespan of every plan, order and issue model (Carlier's one-machine bound,
    per channel). A motif holds its channels exclusively, so comm task j keeps channel c busy at least p_j (the
    least any of its options holds c), somewhere between its head r_j (its start in the contention-free
    relaxation, which no schedule beats) and the makespan minus its tail q_j (the longest path after it: its
    successors and the compute stream in issue order, at their least durations). For any set S of tasks on c:
    makespan >= min_S r + sum_S p + min_S q. Taken over every S = {j : r_j >= a, q_j >= b}. It binds where the
    network, not the DAG, is the bottleneck (a DLRM on 16 nodes sends more over its NICs than it computes)."""
    relaxed = _relaxed(problem)
    rev = validate(relaxed)
    heads = simulate(relaxed, default_plan(relaxed), "fifo", rev).task_times
    paths, _ = critical_paths(relaxed, default_plan(relaxed), rev)
    best = 0.0
    for c in sorted({c for plans in problem.options.values() for p in plans for m in p.motifs for c in m.channels}):
        jobs = []  # (head, busy, tail) of every comm task that must hold c
        for tid, plans in problem.options.items():
            busy = min(sum(m.duration_us for m in p.motifs if c in m.channels) for p in plans)
            if busy > 0:
                tail = paths[tid] - relaxed.options[tid][0].motifs[0].duration_us
                jobs.append((heads[tid][0], busy, tail))
        for a in sorted({r for r, _, _ in jobs}):
            later = [(p, q) for r, p, q in jobs if r >= a]
            for b in sorted({q for _, q in later}):
                best = max(best, a + sum(p for p, q in later if q >= b) + b)
    return best


def lower_bound_us(problem: ScheduleProblem) -> float:
    """The better of the two valid lower bounds: the contention-free relaxation and the channel windows."""
    return max(contention_free_bound(problem).makespan_us, channel_window_bound_us(problem))


def _least_alone_us(plan: ExecutionPlan) -> float:
    """The least time a comm task can take on this plan even with the network to itself: its motifs' critical
    path, and on every channel the sum of the motifs holding it (a motif holds its channels exclusively from
    start to end, so two motifs of one plan sharing a channel never overlap). The task's motifs are all
    released together and it ends with its last one, so it lasts at least the larger of the two."""
    load: dict[str, float] = {}
    for m in plan.motifs:
        for c in m.channels:
            load[c] = load.get(c, 0.0) + m.duration_us
    return max(_plan_critical_path(plan), max(load.values(), default=0.0))


def _plan_critical_path(plan: ExecutionPlan) -> float:
    finish: list[float] = []
    for m in plan.motifs:  # deps point to earlier motifs
        finish.append(m.duration_us + max((finish[d] for d in m.deps), default=0.0))
    return max(finish, default=0.0)


def default_plan(problem: ScheduleProblem) -> dict[int, int]:
    """Option 0 for every comm task."""
    return {t.id: 0 for t in problem.tasks if t.kind == "comm"}


def check_plan(problem: ScheduleProblem, plan: Mapping[int, int]) -> dict[int, int]:
    """A complete, valid choice (comm task id -> option index); missing tasks get the default."""
    out = default_plan(problem)
    for tid, k in plan.items():
        if tid not in out:
            raise ValueError(f"plan chooses an option for task {tid}, which is not a comm task")
        if not isinstance(k, int) or not 0 <= k < len(problem.options[tid]):
            raise ValueError(f"task {tid}: option {k!r} out of range 0..{len(problem.options[tid]) - 1}")
        out[tid] = k
    return out


# ------------------------------------------------------------------------------------ critical paths


def critical_paths(
    problem: ScheduleProblem, plan: Mapping[int, int], rev: list[int] | None = None
) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """Longest remaining path to the end of the DAG, including the node's own duration.

    Returns (per task: from the task's start/expansion, per (comm id, motif index): from the motif's start).
    Edges: task deps; motif deps within a plan; a comm task's successors follow each of its motifs; and,
    because compute is FIFO on one stream, each compute task precedes the next compute task in issue order.
    A comm task's value is its largest root motif's value.
    """
    tasks = problem.tasks
    rev = validate(problem) if rev is None else rev
    succ = _successors(tasks)
    task_cp: dict[int, float] = {}
    motif_cp: dict[tuple[int, int], float] = {}
    for i in rev:
        t = tasks[i]
        tail = max((task_cp[tasks[s].id] for s in succ[i]), default=0.0)
        if t.kind == "compute":
            task_cp[t.id] = t.duration_us + tail
            continue
        motifs = problem.options[t.id][plan[t.id]].motifs
        msucc: list[list[int]] = [[] for _ in motifs]
        for j, m in enumerate(motifs):
            for d in m.deps:
                msucc[d].append(j)
        for j in range(len(motifs) - 1, -1, -1):
            after = max((motif_cp[(t.id, k)] for k in msucc[j]), default=0.0)
            motif_cp[(t.id, j)] = motifs[j].duration_us + max(tail, after)
        task_cp[t.id] = max(motif_cp[(t.id, j)] for j, m in enumerate(motifs) if not m.deps)
    return task_cp, motif_cp


def _combined_reverse_order(tasks: tuple[Task, ...], succ: list[set[int]]) -> list[int]:
    """Reverse topological order of the graph with the FIFO compute edges added.

    The FIFO edges can create a cycle with dependencies (a compute task depending on one issued after it);
    such a problem would deadlock the compute stream, so it is rejected here naming the task.
    """
    indeg = [0] * len(tasks)
    for i in range(len(tasks)):
        for s in succ[i]:
            indeg[s] += 1
    order = [i for i in range(len(tasks)) if indeg[i] == 0]
    for i in order:
        for s in sorted(succ[i]):
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) < len(tasks):
        stuck = min((i for i, n in enumerate(indeg) if n > 0), key=lambda i: tasks[i].id)
        raise ValueError(
            f"{_label(tasks[stuck])}: compute tasks run in issue order, so a compute task may not depend "
            "(directly or through comm) on a compute task issued after it"
        )
    return order[::-1]


def needed_by(problem: ScheduleProblem, rev: list[int]) -> dict[int, float]:
    """Per task, the issue position of the first compute task that waits for it (itself for a compute
    task; through other comm tasks too); inf when no compute task does. The "needed" order (the hand-tuned
    priority a person would write: the comm-op the compute stream needs soonest goes first) sorts by it."""
    tasks = problem.tasks
    pos = {t.id: i for i, t in enumerate(tasks)}
    succ: list[list[int]] = [[] for _ in tasks]
    for i, t in enumerate(tasks):
        for d in set(t.deps):
            succ[pos[d]].append(i)
    out: dict[int, float] = {}
    for i in rev:
        t = tasks[i]
        out[t.id] = float(i) if t.kind == "compute" else min((out[tasks[k].id] for k in succ[i]),
                                                               default=math.inf)
    return out


# ------------------------------------------------------------------------------------------ scheduler


def optsched(problem: ScheduleProblem, plan: Mapping[int, int] | None = None, order: str = "critical") -> Schedule:
    """Schedule the DAG with the chosen plans (default plans where missing) and return the Schedule."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    rev = validate(problem)
    chosen = check_plan(problem, plan or {})
    return simulate(problem, chosen, order, rev)


def simulate(problem: ScheduleProblem, plan: dict[int, int], order: str, rev: list[int]) -> Schedule:
    """optsched without re-validation: `plan` complete and checked, `rev` from :func:`validate`."""
    tasks = problem.tasks
    pos = {t.id: i for i, t in enumerate(tasks)}
    _, motif_cp = critical_paths(problem, plan, rev)
    needed = needed_by(problem, rev) if order == "needed" else {}
    waiting = {t.id: len(set(t.deps)) for t in tasks}
    succ: dict[int, list[int]] = {t.id: [] for t in tasks}
    for t in tasks:
        for d in set(t.deps):
            succ[d].append(t.id)
    compute_queue = [t.id for t in tasks if t.kind == "compute"]
    head = 0
    comp_free = 0.0
    chan_free = {c: 0.0 for c in problem.channels}
    done: dict[int, float] = {}
    task_start: dict[int, float] = {}
    comm_ready: dict[int, float] = {}
    motif_wait: dict[tuple[int, int], int] = {}
    motifs_left: dict[int, int] = {}
    ready: list[tuple[tuple, int, int]] = []  # (priority key, comm id, motif index) ready to run
    running: list[tuple[float, int, str, int, int]] = []  # (end, tiebreak, kind, id, motif)
    slots: dict[tuple[int, int], tuple[float, float]] = {}
    counter = 0
    now = 0.0
    channel_free_motifs = any(not m.channels for tid, k in plan.items() for m in problem.options[tid][k].motifs)

    def release(tid: int, at: float) -> None:
        """Task tid became dependency-free at time `at`."""
        t = tasks[pos[tid]]
        if t.kind == "compute":
            return
        comm_ready[tid] = at
        motifs = problem.options[tid][plan[tid]].motifs
        motifs_left[tid] = len(motifs)
        for j, m in enumerate(motifs):
            motif_wait[(tid, j)] = len(set(m.deps))
            if not m.deps:
                ready.append((key((tid, j)), tid, j))

    def finish_task(tid: int, at: float) -> None:
        done[tid] = at
        for s in succ[tid]:
            waiting[s] -= 1
            if waiting[s] == 0:
                release(s, at)

    def key(item: tuple[int, int]) -> tuple:
        """Priority (smallest first); fixed once the motif is ready, so computed once when it becomes ready."""
        tid, j = item
        if order == "critical":
            return (-motif_cp[item], pos[tid], j)
        if order == "fifo":
            return (comm_ready[tid], pos[tid], j)
        if order == "needed":
            return (needed[tid], pos[tid], j)
        return (-comm_ready[tid], -pos[tid], j)

    for t in tasks:
        if waiting[t.id] == 0:
            release(t.id, 0.0)

    while True:
        # start the compute head if the stream is free and its deps are done
        if head < len(compute_queue) and comp_free <= now:
            tid = compute_queue[head]
            if waiting[tid] == 0:
                t = tasks[pos[tid]]
                task_start[tid] = now
                comp_free = now + t.duration_us
                heapq.heappush(running, (comp_free, counter, "compute", tid, -1))
                counter += 1
                head += 1
        # start ready motifs in priority order whose channels are all free now
        ready.sort()
        still: list[tuple[tuple, int, int]] = []
        free = {c for c, at in chan_free.items() if at <= now}
        for i, entry in enumerate(ready):
            if not free and not channel_free_motifs:  # nothing else can start now: keep the rest as they are
                still.extend(ready[i:])
                break
            _, tid, j = entry
            m = problem.options[tid][plan[tid]].motifs[j]
            if m.channels <= free:
                end = now + m.duration_us
                if end > now:  # a zero-length motif leaves its channels free at this instant
                    free -= m.channels
                for c in m.channels:
                    chan_free[c] = end
                slots[(tid, j)] = (now, end)
                task_start.setdefault(tid, now)
                heapq.heappush(running, (end, counter, "motif", tid, j))
                counter += 1
            else:
                still.append(entry)
        ready = still
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] <= now:
            end, _, kind, tid, j = heapq.heappop(running)
            if kind == "compute":
                finish_task(tid, end)
                continue
            motifs = problem.options[tid][plan[tid]].motifs
            for k, m in enumerate(motifs):
                if j in m.deps:
                    motif_wait[(tid, k)] -= 1
                    if motif_wait[(tid, k)] == 0:
                        ready.append((key((tid, k)), tid, k))
            motifs_left[tid] -= 1
            if motifs_left[tid] == 0:
                finish_task(tid, end)

    if len(done) < len(tasks):  # cannot happen after validation; guard against silent wrong answers
        missing = next(t for t in tasks if t.id not in done)
        raise ValueError(f"{_label(missing)}: could not be scheduled")
    return _build_schedule(problem, plan, order, task_start, done, slots, motif_cp)


def _build_schedule(problem, plan, order, task_start, done, slots, motif_cp) -> Schedule:
    pos = {t.id: i for i, t in enumerate(problem.tasks)}
    makespan = max(done.values(), default=0.0)
    starts = sorted({s for s, _ in slots.values()})
    rank = {s: i for i, s in enumerate(starts)}
    motifs = []
    for (tid, j), (s, e) in slots.items():
        m = problem.options[tid][plan[tid]].motifs[j]
        motifs.append(MotifSlot(tid, j, m.name, m.channels, s, e, rank[s], motif_cp[(tid, j)]))
    motifs.sort(key=lambda m: (m.seq, pos[m.task_id], m.motif_index))
    busy = sum(t.duration_us for t in problem.tasks if t.kind == "compute")
    idle = 100.0 * (makespan - busy) / makespan if makespan > 0 else 0.0
    times = {t.id: (task_start[t.id], done[t.id]) for t in problem.tasks}
    return Schedule(makespan, order, dict(plan), times, tuple(motifs), idle)

"""Baseline memory schedules; every one replays cleanly (replay.py) on problems built by build.py.

* store_all: PyTorch's default. Default implementations, every value some D_k needs is stored, no
  recomputation; a stored value is kept until the last stage that needs it.
* sqrt_segments: Chen et al. 2016. ~sqrt(N) segments cut where the fewest bytes cross (a residual
  block's output in a ResNet); the values crossing each cut are stored, and when the backward pass
  reaches a segment (its highest stage) everything the segment's stages need is recomputed at once
  and kept until its last stage.
* greedy(budget): store-all; then memory-lean implementations; then repeatedly drop, among the stored
  values live at the replayed peak (and not needed by the peak's own stage), the one with the most
  bytes per microsecond of recomputation; None when nothing is left to drop.
* least_memory: nothing stored, nothing kept between stages (each stage recomputes its needs from
  the constants), leanest implementations; the smallest peak of a few such variants.

All of them go through `schedule_from_stored`, whose policy is:

* forward: the given implementation of each node; an in-place one is replaced by the first
  out-of-place implementation where it would overwrite a stored or final value; store = `stored`,
  less values that a later node can only overwrite in place (a traced add_ has no other kernel here),
  which are recomputed on demand instead.
* stage k: recompute the minimal chain that makes D_k (plus `extra targets`, used by sqrt) live from
  the values live on entry: a missing value is recomputed, and so, recursively, are its missing
  inputs; an intermediate node brings its creator (recomputed even if live). Recomputations use the
  node's implementation, out of place where in place would overwrite a value still needed.
* keep (S^{k-1}): a stored value (or final output) while any later stage needs it directly or as a
  recomputation source (conservatively: a later D value derives from it through unstored values);
  with keep_recomputed, also recomputed values while a later stage's D_k needs them (so they are
  recomputed once), else recomputed values die with their stage (the leanest choice).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.memory.replay import ScheduleError, replay_detailed
from mlopt.planners.memory.schedule import BackwardStage, ForwardStep, Schedule

# Greedy ranks values by bytes freed per us of recomputation; this keeps free (0 us) ones finite.
_MIN_COST_US = 1e-3


# --------------------------------------------------------------------------------------- choices


def default_impls(problem: MemoryProblem) -> tuple[dict[int, str], dict[int, str]]:
    forward = {node.index: node.forward[0].name for node in problem.nodes}
    backward = {node.index: node.backward[0].name for node in problem.nodes if node.backward}
    return forward, backward


def _deps(problem: MemoryProblem, backward: dict[int, str]) -> list[frozenset[int]]:
    deps: list[frozenset[int]] = []
    for node in problem.nodes:
        impl = next((b for b in node.backward if b.name == backward.get(node.index)), None)
        deps.append(frozenset(impl.deps) if impl else frozenset())
    return deps


def _impls_arg(problem: MemoryProblem, impls: dict | None) -> tuple[dict[int, str], dict[int, str]]:
    forward, backward = default_impls(problem)
    if impls:
        forward.update(impls.get("forward", {}))
        backward.update(impls.get("backward", {}))
    return forward, backward


def lean_impls(problem: MemoryProblem, absolute: bool = False) -> dict[str, dict[int, str]]:
    """Memory-lean choices: forward by (workspace + new output bytes, time); backward by (workspace +
    bytes of its deps, time), counting only deps no other stage's default needs unless `absolute`."""
    forward = {node.index: min((f for f in node.forward if not f.reuses_intermediates),
                               key=lambda f: (f.workspace_bytes + (0 if f.inplace else node.out_bytes),
                                              f.compute_us)).name
               for node in problem.nodes}
    _, default_backward = default_impls(problem)
    default_deps = _deps(problem, default_backward)
    needed_by = Counter(v for deps in default_deps for v in deps)  # how many stages' defaults need v
    backward: dict[int, str] = {}
    for node in problem.nodes:
        if not node.backward:
            continue
        own = default_deps[node.index]

        def cost(b, own=own):
            counted = [d for d in b.deps if absolute or needed_by[d] - (d in own) == 0]
            return (b.workspace_bytes + sum(problem.nodes[d].out_bytes for d in counted), b.compute_us)

        backward[node.index] = min(node.backward, key=cost).name
    return {"forward": forward, "backward": backward}


# --------------------------------------------------------------------------------------- generic engine


def _impl(problem: MemoryProblem, i: int, name: str):
    return next(f for f in problem.nodes[i].forward if f.name == name)


def _out_of_place(problem: MemoryProblem, i: int, name: str) -> str:
    """`name` if it is out of place, else the node's first out-of-place implementation (if any)."""
    if not _impl(problem, i, name).inplace:
        return name
    return next((f.name for f in problem.nodes[i].forward if not f.inplace), name)


def _forward_steps(problem: MemoryProblem, forward: dict[int, str], stored: set[int]) -> tuple[ForwardStep, ...]:
    users = problem.forward_users()
    finals = set(problem.final_outputs)
    steps = []
    for node in problem.nodes:
        name = forward[node.index]
        j = node.inplace_input
        if _impl(problem, node.index, name).inplace and (
                j in stored or j in finals or any(u > node.index for u in users[j])):
            name = _out_of_place(problem, node.index, name)
        steps.append(ForwardStep(node.index, name, node.index in stored))
    return tuple(steps)


def _sources(problem: MemoryProblem, base: set[int]) -> list[frozenset[int]]:
    """sources[w]: the base (stored or final) values a recomputation of w starts from."""
    sources: list[frozenset[int]] = []
    for node in problem.nodes:  # inputs precede their readers, so sources are ready in index order
        w = node.index
        if w in base:
            sources.append(frozenset({w}))
            continue
        reads = list(node.inputs)
        if node.intermediate_of is not None:  # its creator is recomputed too, from the creator's inputs
            c = node.intermediate_of
            reads = [u for u in reads if u != c] + list(problem.nodes[c].inputs)
        sources.append(frozenset().union(*(sources[u] for u in reads)))
    return sources


def _closure(problem: MemoryProblem, targets: set[int], live: set[int]) -> set[int]:
    """Nodes to recompute so that every target is live: missing values, their missing inputs, and the
    creators of intermediates (which are recomputed even when live)."""
    recompute: set[int] = set()
    stack = [(t, False) for t in targets]
    while stack:
        v, forced = stack.pop()
        if v in recompute or (v in live and not forced):
            continue
        recompute.add(v)
        node = problem.nodes[v]
        if node.intermediate_of is not None:
            stack.append((node.intermediate_of, True))
        stack.extend((u, False) for u in node.inputs)
    return recompute


def _recompute_impls(problem: MemoryProblem, order: list[int], forward: dict[int, str], keep: set[int],
                     deps: frozenset[int]) -> list[tuple[int, str]]:
    last_read: dict[int, int] = {}
    for position, i in enumerate(order):
        for j in problem.nodes[i].inputs:
            last_read[j] = position
    chosen = []
    for position, i in enumerate(order):
        name = forward[i]
        j = problem.nodes[i].inplace_input
        if _impl(problem, i, name).inplace and (last_read.get(j, -1) > position or j in keep or j in deps):
            name = _out_of_place(problem, i, name)
        chosen.append((i, name))
    return chosen


def _backward_stages(problem: MemoryProblem, forward: dict[int, str], backward: dict[int, str],
                     stored: set[int], keep_recomputed: bool,
                     extra_targets: Callable[[int], set[int]] | None) -> tuple[BackwardStage, ...]:
    n = problem.n
    deps = _deps(problem, backward)
    base = set(stored) | set(problem.final_outputs)
    sources = _sources(problem, base)
    # last_need[v]: the smallest stage index (the last stage to run) whose D needs v directly;
    # last_source[v]: ... whose D needs v as a recomputation source.
    last_need: dict[int, int] = {}
    last_source: dict[int, int] = {}
    for k in range(n):
        for w in deps[k]:
            last_need.setdefault(w, k)
            for v in sources[w]:
                last_source.setdefault(v, k)
    live = set(base)
    stages = []
    for k in range(n - 1, -1, -1):
        targets = set(deps[k]) | (extra_targets(k) if extra_targets else set())
        recompute = _closure(problem, targets, live)
        present = live | recompute
        keep = {v for v in present
                if (v in base and last_source.get(v, n) < k) or (keep_recomputed and last_need.get(v, n) < k)}
        order = sorted(recompute)
        stages.append(BackwardStage(k, backward.get(k, ""), tuple(_recompute_impls(problem, order, forward, keep,
                                                                                      deps[k])),
                                    tuple(sorted(keep))))
        live = keep
    return tuple(stages)


def schedule_from_stored(problem: MemoryProblem, stored: set[int], impls: dict | None = None, *,
                         keep_recomputed: bool = True,
                         extra_targets: Callable[[int], set[int]] | None = None) -> Schedule:
    """The schedule that stores `stored` in the forward pass and recomputes the rest on demand (policy in
    the module docstring). `impls`: {"forward": {node: impl}, "backward": {node: impl}}, defaults elsewhere;
    forward choices are used for recomputations too. `extra_targets(k)`: more values stage k must make
    live (recomputed with the stage's own needs)."""
    forward, backward = _impls_arg(problem, impls)
    stored = set(stored) - unstorable(problem)
    fsteps = _forward_steps(problem, forward, stored)
    # Recomputations start from the requested implementations: their in-place legality is per stage.
    bstages = _backward_stages(problem, forward, backward, stored, keep_recomputed, extra_targets)
    return Schedule(fsteps, bstages)


def reuse_intermediates(problem: MemoryProblem, schedule: Schedule) -> Schedule:
    """`schedule` with every recomputation that can reuse its node's intermediates doing so: where all of
    them entered the stage (e.g. batch norm's saved statistics, kept for its own backward), the node is
    recomputed with its reusing implementation and the redundant recomputations of those intermediates
    go. Never more memory or time: the reusing implementation is cheaper and allocates only the output."""
    reusing = {node.index: next(f.name for f in node.forward if f.reuses_intermediates)
               for node in problem.nodes if any(f.reuses_intermediates for f in node.forward)}
    if not reusing:
        return schedule
    entering = {f.node for f in schedule.forward if f.store} | set(problem.final_outputs)
    stages = []
    for stage in schedule.backward:
        swapped = {i for i, _ in stage.recompute
                   if i in reusing and set(problem.intermediates_of(i)) <= entering}
        dropped = {m for i in swapped for m in problem.intermediates_of(i)}
        recompute = tuple((i, reusing[i] if i in swapped else name) for i, name in stage.recompute
                          if i not in dropped)
        stages.append(BackwardStage(stage.node, stage.impl, recompute, stage.keep))
        entering = set(stage.keep)
    return Schedule(schedule.forward, tuple(stages))


def unstorable(problem: MemoryProblem) -> set[int]:
    """Values a later node can only overwrite in place (e.g. a traced add_): storing them is illegal."""
    return {node.inplace_input for node in problem.nodes
            if node.inplace_input is not None and all(f.inplace for f in node.forward)}


def needed_values(problem: MemoryProblem, impls: dict | None = None) -> set[int]:
    """Every value some D_k (of the chosen backward implementations) needs."""
    _, backward = _impls_arg(problem, impls)
    return set().union(*_deps(problem, backward)) if problem.n else set()


# --------------------------------------------------------------------------------------- baselines


def store_all(problem: MemoryProblem) -> Schedule:
    """PyTorch's default: default implementations, store what backward needs, recompute nothing."""
    return schedule_from_stored(problem, needed_values(problem))


def _crossing_bytes(problem: MemoryProblem) -> list[float]:
    """crossing[b]: bytes of values x_j, j <= b, that a forward node after b reads."""
    n = problem.n
    delta = [0] * (n + 1)
    for j, readers in enumerate(problem.forward_users()):
        last = max(readers, default=j)
        if last > j:
            delta[j] += problem.nodes[j].out_bytes
            delta[last] -= problem.nodes[j].out_bytes
    crossing, running = [], 0
    for b in range(n):
        running += delta[b]
        crossing.append(running)
    return crossing


def segment_ends(problem: MemoryProblem, segments: int | None = None) -> list[int]:
    """Last node of each segment (ascending, the final one is N-1): cuts near equal spacing where the
    fewest bytes cross, looking within half a segment of each ideal cut."""
    n = problem.n
    if n == 0:
        return []
    count = max(1, min(n, segments if segments else round(math.sqrt(n))))
    crossing = _crossing_bytes(problem)
    # A cut whose crossing values include one that must be overwritten in place cannot be stored.
    blocked = unstorable(problem)
    users = problem.forward_users()
    for j in blocked:
        for b in range(j, max(users[j], default=j)):
            crossing[b] = math.inf
    cuts: list[int] = []
    half = max(1, n // (2 * count))
    for s in range(1, count):
        ideal = round(s * n / count) - 1
        window = [b for b in range(max(0, ideal - half), min(n - 1, ideal + half + 1))
                  if (not cuts or b > cuts[-1])]
        if window:
            cuts.append(min(window, key=lambda b: (crossing[b], abs(b - ideal))))
    return cuts + [n - 1]


def sqrt_segments(problem: MemoryProblem, segments: int | None = None) -> Schedule:
    """Chen et al. 2016: store the values crossing ~sqrt(N) segment cuts; recompute each segment's needs
    when its backward begins and keep them through the segment."""
    ends = segment_ends(problem, segments)
    users = problem.forward_users()
    stored: set[int] = set()
    for b in ends[:-1]:
        stored.update(j for j in range(b + 1) if any(u > b for u in users[j]))
    _, backward = default_impls(problem)
    deps = _deps(problem, backward)
    prefetch: dict[int, set[int]] = {}
    start = 0
    for end in ends:
        prefetch[end] = set().union(*(deps[k] for k in range(start, end + 1)))
        start = end + 1
    return schedule_from_stored(problem, stored, extra_targets=lambda k: prefetch.get(k, set()))


def _recompute_cost_us(problem: MemoryProblem, v: int, base: set[int], forward: dict[int, str]) -> float:
    chain = _closure(problem, {v}, base - {v})
    return sum(_impl(problem, i, forward[i]).compute_us for i in chain)


def _try(problem: MemoryProblem, stored: set[int], impls: dict, keep_recomputed: bool):
    schedule = schedule_from_stored(problem, stored, impls, keep_recomputed=keep_recomputed)
    try:
        return schedule, replay_detailed(problem, schedule)
    except ScheduleError:
        return schedule, None


def greedy(problem: MemoryProblem, budget_bytes: int) -> Schedule | None:
    """A simple heuristic that tries to fit `budget_bytes` (see the module docstring); None if it cannot."""
    defaults = {"forward": default_impls(problem)[0], "backward": default_impls(problem)[1]}
    lean = lean_impls(problem)
    for impls in (defaults, lean):
        schedule, detail = _try(problem, needed_values(problem, impls), impls, True)
        if detail is not None and detail.result.peak_bytes <= budget_bytes:
            return schedule
    deps = _deps(problem, lean["backward"])
    finals = set(problem.final_outputs)
    for keep_recomputed in (True, False):
        stored = needed_values(problem, lean)
        for _ in range(problem.n + 1):
            schedule, detail = _try(problem, stored, lean, keep_recomputed)
            if detail is None:
                break
            if detail.result.peak_bytes <= budget_bytes:
                return schedule
            event = detail.result.peak_event
            protected = deps[event.stage] if event.phase != "forward" else frozenset()
            candidates = [v for v in detail.peak_live if v in stored and v not in protected and v not in finals]
            if not candidates:
                break
            base = stored | finals
            best = max(candidates, key=lambda v: (problem.nodes[v].out_bytes
                                                  / max(_MIN_COST_US, _recompute_cost_us(problem, v, base,
                                                                                         lean["forward"])), -v))
            stored = stored - {best}
    return None


def least_memory(problem: MemoryProblem) -> Schedule:
    """The leanest schedule found: store nothing, keep nothing recomputed, leanest implementations (the
    smallest replayed peak among a few such variants, store-all as the last resort)."""
    defaults = {"forward": default_impls(problem)[0], "backward": default_impls(problem)[1]}
    variants = [lean_impls(problem, absolute=True), lean_impls(problem), defaults]
    best: tuple[int, Schedule] | None = None
    for impls in variants:
        schedule, detail = _try(problem, set(), impls, False)
        if detail is not None and (best is None or detail.result.peak_bytes < best[0]):
            best = (detail.result.peak_bytes, schedule)
    return best[1] if best else store_all(problem)

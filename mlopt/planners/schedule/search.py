"""Syndicate's joint search (Pseudocode 1, MCMCSEARCH) and the paper's baselines (section 6.4).

MCMC (Metropolis-Hastings) over execution plans; the cost of a plan is optSched's makespan.

* start: ``initial``, else the better under `order` of the greedy plan (per comm task, independently, the
  option with the least total motif duration; ties keep the lower index) and the default plan (every comm
  task at option 0), so the search never returns worse than the default;
* proposal (``transform``): pick a comm task uniformly among those with more than one option, then a new
  option uniformly among its *other* options (never a no-op). The proposal is symmetric, so the MH
  acceptance is ``min(1, exp(-beta * (new - old) / old))``;
* ``beta`` (default 10): a plan 1% slower is accepted with p ~ 0.90, 5% slower ~ 0.61, 10% ~ 0.37, 25%
  ~ 0.08, 50% ~ 0.007; plans no worse are always accepted. Relative change makes beta independent of the
  time unit. beta = 20 got stuck in 2-step local minima (one op must move to a worse plan before another
  can move) on small hand-made DAGs within 300 steps for ~1 seed in 8; beta = 10 and 5 did not;
* result: the best plan visited (Pseudocode 1 returns the current state G*; the best visited is never
  worse, and equal to it whenever the chain ends at its best), then polished by coordinate descent
  (``polish``, default on: every single-task change tried in issue order until none improves; an addition
  to the paper: on the DLRM example 2000 MH steps at beta 10 end ~8% above the nearest such local optimum,
  and a higher beta gets stuck in 2-step local minima on small DAGs);
* stop: ``max_steps`` proposals; or ``budget_s`` seconds elapsed; or (after ``min_steps`` proposals, so
  tiny problems still search) when no better plan was found for more than half the elapsed time
  ("stagnation", the paper's rule; with ``stagnation_in_steps`` "time" is counted in proposals, so the stop
  is deterministic). Time is read from ``clock``; tests pass ``max_steps`` with a huge budget
  and ``stop_on_stagnation=False`` (or a deterministic clock) so results do not depend on machine speed;
* deterministic for a seed: one ``random.Random(seed)``, options and tasks visited in issue order.

Costs of already-seen plans are memoised for the duration of one call (pure speed-up).

Baselines (all return a :class:`SearchResult`):

* :func:`fifo_default` - PyTorch default: default plans, comm motifs in order of readiness;
* :func:`lifo_oracle` - ByteScheduler+ (BS+): LIFO order, with a "segment oracle": for each comm task
  independently, every admissible option is tried alone (all other comm tasks at their default) under
  LIFO, and the one with the least makespan kept (ties: lower index). Admissible = segmentation only:
  the same channel set as the default plan and (when the problem records its motifs) every motif the op's
  own collective over all its ranks (ByteScheduler partitions tensors on the traditional stack; it does
  not splin or change algorithms), unless ``same_channels_only=False``;
* :func:`hand_priority` - hand-optimised priority: default plans, the comm-op needed soonest first;
* :func:`s_exec` - Syndicate-Exec: MCMC over plans, each costed with FIFO order;
* :func:`s_sched` - Syndicate-Sched: default plans, critical-path order (the paper handicaps S-Sched
  with the default a2a plan; ``oracle=True`` gives it the segment oracle instead, under critical order);
* :func:`syndicate` - the full search (= :func:`mcmc` with critical-path order).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from mlopt.planners.schedule.optsched import (
    ORDERS,
    Schedule,
    ScheduleProblem,
    check_plan,
    default_plan,
    simulate,
    validate,
)

DEFAULT_BETA = 10.0
DEFAULT_MIN_STEPS = 50


@dataclass(frozen=True)
class SearchResult:
    name: str
    plan: dict[int, int]  # comm task id -> chosen option index
    schedule: Schedule
    history: tuple[float, ...]  # makespans of the accepted states, starting with the initial one
    iterations: int  # proposals evaluated (0 for fixed-plan baselines)
    stop_reason: str  # "max_steps" | "budget" | "stagnation" | "no_choices" | "fixed"
    polish_evaluations: int = 0  # plans tried by the final coordinate descent (after the chain)

    @property
    def makespan_us(self) -> float:
        return self.schedule.makespan_us


def greedy_plan(problem: ScheduleProblem) -> dict[int, int]:
    """Per comm task, the option with the least total motif duration (first such on ties)."""
    plan = default_plan(problem)
    for tid in plan:
        totals = [sum(m.duration_us for m in p.motifs) for p in problem.options[tid]]
        plan[tid] = totals.index(min(totals))
    return plan


def _key(plan: Mapping[int, int], ids: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(plan[i] for i in ids)


def mcmc(
    problem: ScheduleProblem,
    budget_s: float,
    seed: int,
    *,
    initial: Mapping[int, int] | None = None,
    order: str = "critical",
    beta: float = DEFAULT_BETA,
    max_steps: int | None = None,
    min_steps: int = DEFAULT_MIN_STEPS,
    stop_on_stagnation: bool = True,
    stagnation_in_steps: bool = False,
    polish: bool = True,
    clock: Callable[[], float] = time.monotonic,
    name: str = "syndicate",
) -> SearchResult:
    """Metropolis-Hastings search over execution plans; cost = optSched makespan under `order`."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if beta < 0 or not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    rev = validate(problem)
    starts = [greedy_plan(problem), default_plan(problem)] if initial is None else [dict(initial)]
    ids = tuple(check_plan(problem, starts[0]))
    movable = tuple(i for i in ids if len(problem.options[i]) > 1)
    cache: dict[tuple[int, ...], Schedule] = {}

    def cost(plan: dict[int, int]) -> Schedule:
        k = _key(plan, ids)
        if k not in cache:
            cache[k] = simulate(problem, plan, order, rev)
        return cache[k]

    rng = random.Random(seed)
    current = min((check_plan(problem, p) for p in starts), key=lambda p: cost(p).makespan_us)  # first on ties
    cur_s = cost(current)
    best, best_s = dict(current), cur_s
    history = [cur_s.makespan_us]
    t0 = clock()
    t_best = t0
    steps = step_best = 0
    reason = "no_choices" if not movable else ""
    while not reason:
        now = clock()
        elapsed, since = (steps, steps - step_best) if stagnation_in_steps else (now - t0, now - t_best)
        reason = _stop_reason(steps, now - t0, elapsed, since, budget_s, max_steps, min_steps, stop_on_stagnation)
        if reason:
            break
        proposal = _propose(problem, current, movable, rng)
        new_s = cost(proposal)
        steps += 1
        if _accept(cur_s.makespan_us, new_s.makespan_us, beta, rng):
            current, cur_s = proposal, new_s
            history.append(new_s.makespan_us)
            if new_s.makespan_us < best_s.makespan_us:
                best, best_s = dict(proposal), new_s
                t_best, step_best = clock(), steps
    polished = 0
    if polish and movable:
        best, best_s, polished = _polish(problem, best, best_s, movable, cost, lambda: clock() - t0 >= budget_s)
    return SearchResult(name, best, best_s, tuple(history), steps, reason, polished)


def _polish(problem, plan, schedule, movable, cost, out_of_time):
    """Coordinate descent from the chain's best plan: sweep the comm tasks in issue order, trying each one's
    other options and keeping any that is strictly better, until a sweep improves nothing (a local optimum
    for single changes; MCMC's random walk rarely lands exactly on one when there are many tasks and
    options) or the budget is spent. Deterministic. Returns (plan, schedule, evaluations)."""
    evaluations, improved = 0, True
    while improved and not out_of_time():
        improved = False
        for tid in movable:
            for k in range(len(problem.options[tid])):
                if k == plan[tid]:
                    continue
                trial = {**plan, tid: k}
                trial_s = cost(trial)
                evaluations += 1
                if trial_s.makespan_us < schedule.makespan_us:
                    plan, schedule, improved = trial, trial_s, True
    return plan, schedule, evaluations


def _stop_reason(steps, wall_s, elapsed, since_best, budget_s, max_steps, min_steps, stagnation) -> str:
    """elapsed / since_best: seconds, or proposals with stagnation_in_steps (the paper's rule on a
    deterministic clock)."""
    if max_steps is not None and steps >= max_steps:
        return "max_steps"
    if wall_s >= budget_s:
        return "budget"
    if stagnation and steps >= min_steps and since_best > elapsed / 2:
        return "stagnation"
    return ""


def _propose(
    problem: ScheduleProblem, plan: dict[int, int], movable: tuple[int, ...], rng: random.Random
) -> dict[int, int]:
    """Change one comm task's plan: uniform task (with >1 option), uniform other option."""
    tid = movable[rng.randrange(len(movable))]
    others = [k for k in range(len(problem.options[tid])) if k != plan[tid]]
    out = dict(plan)
    out[tid] = others[rng.randrange(len(others))]
    return out


def _accept(old: float, new: float, beta: float, rng: random.Random) -> bool:
    """Metropolis-Hastings: always take a plan that is no worse; else with exp(-beta * (new-old)/old)."""
    u = rng.random()  # always drawn, so the random stream does not depend on the comparison
    if new <= old:
        return True
    if old <= 0:
        return False
    return u < math.exp(-beta * (new - old) / old)


# ------------------------------------------------------------------------------------------ baselines


def _fixed(problem: ScheduleProblem, plan: Mapping[int, int], order: str, name: str) -> SearchResult:
    rev = validate(problem)
    chosen = check_plan(problem, plan)
    sched = simulate(problem, chosen, order, rev)
    return SearchResult(name, chosen, sched, (sched.makespan_us,), 0, "fixed")


def fifo_default(problem: ScheduleProblem) -> SearchResult:
    """PyTorch default: default plans, FIFO order."""
    return _fixed(problem, default_plan(problem), "fifo", "fifo")


def _segmentation_only(problem: ScheduleProblem, tid: int, k: int) -> bool:
    """Option k of comm task tid only cuts the payload: every motif is the op's own collective over all its
    ranks (ByteScheduler partitions tensors; it does not change the algorithm). True when the problem does
    not say what its motifs do (abstract problems: the channel test alone decides)."""
    if tid not in problem.decompositions or tid not in problem.ops:
        return True
    op = problem.ops[tid]
    return all(m.collective == op.collective and tuple(m.ranks) == tuple(op.ranks) and m.pattern == op.pairs
               for run in problem.decompositions[tid][k] for m in run)


def oracle_plan(problem: ScheduleProblem, order: str, *, same_channels_only: bool = True) -> dict[int, int]:
    """Segment oracle: per comm task, the admissible option best when tried alone (others at default)."""
    rev = validate(problem)
    base = default_plan(problem)
    chosen = dict(base)
    for tid in base:
        plans = problem.options[tid]
        channels = frozenset().union(*(m.channels for m in plans[0].motifs))
        best_k, best_t = 0, math.inf
        for k, p in enumerate(plans):
            if same_channels_only and (frozenset().union(*(m.channels for m in p.motifs)) != channels
                                       or not _segmentation_only(problem, tid, k)):
                continue
            t = simulate(problem, {**base, tid: k}, order, rev).makespan_us
            if t < best_t:
                best_k, best_t = k, t
        chosen[tid] = best_k
    return chosen


def lifo_oracle(problem: ScheduleProblem, *, same_channels_only: bool = True) -> SearchResult:
    """ByteScheduler+ : LIFO order with the segment oracle."""
    plan = oracle_plan(problem, "lifo", same_channels_only=same_channels_only)
    return _fixed(problem, plan, "lifo", "bs+")


def s_sched(problem: ScheduleProblem, *, oracle: bool = False) -> SearchResult:
    """Syndicate-Sched: critical-path scheduling, default plans (or the segment oracle's)."""
    plan = oracle_plan(problem, "critical") if oracle else default_plan(problem)
    return _fixed(problem, plan, "critical", "s-sched")


def hand_priority(problem: ScheduleProblem) -> SearchResult:
    """Hand-optimised priority: default plans, the comm-op the compute stream needs soonest first
    (order "needed"; what a person tuning priorities by hand, as for the paper's production models, does)."""
    return _fixed(problem, default_plan(problem), "needed", "hand")


def s_exec(problem: ScheduleProblem, budget_s: float, seed: int, **kwargs) -> SearchResult:
    """Syndicate-Exec: MCMC over plans, each costed with FIFO order (PyTorch's scheduler)."""
    return mcmc(problem, budget_s, seed, order="fifo", name="s-exec", **kwargs)


def syndicate(problem: ScheduleProblem, budget_s: float, seed: int, **kwargs) -> SearchResult:
    """Full Syndicate: MCMC over plans, each costed with optSched's critical-path order."""
    return mcmc(problem, budget_s, seed, order="critical", name="syndicate", **kwargs)


def compare(problem: ScheduleProblem, budget_s: float, seed: int, **kwargs) -> dict[str, SearchResult]:
    """All systems on one problem: fifo, bs+, s-exec, s-sched, syndicate (kwargs go to both searches)."""
    return {
        "fifo": fifo_default(problem),
        "bs+": lifo_oracle(problem),
        "s-exec": s_exec(problem, budget_s, seed, **kwargs),
        "s-sched": s_sched(problem),
        "syndicate": syndicate(problem, budget_s, seed, **kwargs),
    }

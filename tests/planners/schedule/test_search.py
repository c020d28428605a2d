"""optSched list scheduler, MCMC plan search and baselines on hand-solved DAGs (no wall-clock)."""

from __future__ import annotations

import itertools

import pytest

from mlopt.planners.schedule.optsched import (
    ExecutionPlan,
    MotifRun,
    ScheduleProblem,
    Task,
    contention_free_bound,
    ORDERS,
    channel_window_bound_us,
    critical_paths,
    default_plan,
    framework_issue,
    lower_bound_us,
    optsched,
)
from mlopt.planners.schedule.search import (
    compare,
    fifo_default,
    greedy_plan,
    hand_priority,
    lifo_oracle,
    mcmc,
    oracle_plan,
    s_exec,
    s_sched,
    syndicate,
)

DET = dict(max_steps=300, stop_on_stagnation=False)  # deterministic: no wall-clock stop
HUGE = 1e9


def M(name, d, *channels, deps=()):
    return MotifRun(name, float(d), frozenset(channels), tuple(deps))


def P(label, *motifs):
    return ExecutionPlan(label, tuple(motifs))


def comp(i, d, *deps, name=""):
    return Task(i, "compute", float(d), tuple(deps), name)


def comm(i, *deps, name=""):
    return Task(i, "comm", 0.0, tuple(deps), name)


def two_comms(ch_a, ch_b):
    tasks = (comp(0, 10), comm(1, 0), comm(2, 0), comp(3, 5, 1, 2))
    opts = {1: (P("a", M("a", 4, ch_a)),), 2: (P("b", M("b", 4, ch_b)),)}
    return ScheduleProblem(tasks, opts, ("x", "y"))


# ------------------------------------------------------------------------------------------- optSched


def test_same_channel_serialises():
    s = optsched(two_comms("x", "x"))
    assert s.makespan_us == 23.0  # 10 + 4 + 4 + 5
    assert s.task_times == {0: (0.0, 10.0), 1: (10.0, 14.0), 2: (14.0, 18.0), 3: (18.0, 23.0)}
    assert s.sequence() == {(1, 0): 0, (2, 0): 1}
    assert s.compute_idle_pct == pytest.approx(100 * 8 / 23)


def test_disjoint_channels_overlap_and_share_sequence_number():
    s = optsched(two_comms("x", "y"))
    assert s.makespan_us == 19.0  # 10 + 4 + 5
    assert s.sequence() == {(1, 0): 0, (2, 0): 0}  # issued at the same instant
    assert s.compute_idle_pct == pytest.approx(100 * 4 / 19)


def test_multi_channel_motif_blocks_both_channels():
    tasks = (comm(0), comm(1), comm(2))
    opts = {0: (P("xy", M("xy", 5, "x", "y")),), 1: (P("x", M("x", 3, "x")),), 2: (P("y", M("y", 3, "y")),)}
    s = optsched(ScheduleProblem(tasks, opts, ("x", "y")), order="fifo")
    assert s.task_times == {0: (0.0, 5.0), 1: (5.0, 8.0), 2: (5.0, 8.0)}
    assert s.sequence() == {(0, 0): 0, (1, 0): 1, (2, 0): 1}


def test_motif_deps_within_plan_and_parallel_split():
    tasks = (comm(0),)
    chained = P("chain", M("m0", 4, "x"), M("m1", 4, "y", deps=(0,)))
    split = P("split", M("m0", 4, "x"), M("m1", 4, "y"))
    prob = ScheduleProblem(tasks, {0: (chained, split)}, ("x", "y"))
    assert optsched(prob, {0: 0}).makespan_us == 8.0
    assert optsched(prob, {0: 1}).makespan_us == 4.0
    s = optsched(prob, {0: 0})
    assert [(m.motif_index, m.start_us, m.seq) for m in s.motifs] == [(0, 0.0, 0), (1, 4.0, 1)]


def critical_beats_fifo_problem():
    # comm 1 (issued first) has no successor; comm 2 feeds a long compute task.
    tasks = (comp(0, 1), comm(1, 0, name="a"), comm(2, 0, name="b"), comp(3, 20, 2))
    opts = {1: (P("a-x", M("a", 10, "x")), P("a-y", M("a", 12, "y"))),
            2: (P("b-x", M("b", 10, "x")), P("b-y", M("b", 12, "y")))}
    return ScheduleProblem(tasks, opts, ("x", "y"))


def test_critical_path_priority_beats_fifo():
    prob = critical_beats_fifo_problem()
    fifo = optsched(prob, order="fifo")
    crit = optsched(prob, order="critical")
    assert fifo.makespan_us == 41.0  # a 1-11, b 11-21, compute 21-41
    assert crit.makespan_us == 31.0  # b 1-11, compute 11-31 (a 11-21 overlaps)
    assert crit.task_times[2] == (1.0, 11.0) and crit.task_times[1] == (11.0, 21.0)
    assert optsched(prob, order="lifo").makespan_us == 31.0  # last ready (b) first
    task_cp, motif_cp = critical_paths(prob, default_plan(prob))
    assert motif_cp[(2, 0)] == 30.0 and motif_cp[(1, 0)] == 10.0 and task_cp[0] == 31.0


def test_compute_stays_fifo():
    # compute 3 has no deps but is issued after compute 2, which waits for the comm: it must wait too.
    tasks = (comp(0, 1), comm(1, 0), comp(2, 5, 1), comp(3, 3))
    prob = ScheduleProblem(tasks, {1: (P("m", M("m", 10, "x")),)}, ("x",))
    s = optsched(prob)
    assert s.task_times[2] == (11.0, 16.0)
    assert s.task_times[3] == (16.0, 19.0)
    assert s.makespan_us == 19.0
    assert s.compute_idle_pct == pytest.approx(100 * (19 - 9) / 19)


def test_validation_errors_name_the_task():
    x = ("x",)
    with pytest.raises(ValueError, match=r"task 0: dependency cycle \(depends on: 0 -> 2 -> 1 -> 0\)"):
        optsched(ScheduleProblem((comp(0, 1, 2), comp(1, 1, 0), comp(2, 1, 1)), {}, x))
    with pytest.raises(ValueError, match=r"task 1 \('late'\): unknown dependency id\(s\) \[7\]"):
        optsched(ScheduleProblem((comp(0, 1), comp(1, 1, 7, name="late")), {}, x))
    with pytest.raises(ValueError, match="task 0: comm task has no execution plan"):
        optsched(ScheduleProblem((comm(0),), {}, x))
    with pytest.raises(ValueError, match=r"task 0 option 0 .*unknown channel"):
        optsched(ScheduleProblem((comm(0),), {0: (P("p", M("m", 1, "z")),)}, x))
    with pytest.raises(ValueError, match="task 0: .*issue order"):  # compute 0 waits for compute 1
        optsched(ScheduleProblem((comp(0, 1, 1), comp(1, 1)), {}, x))
    with pytest.raises(ValueError, match="order"):
        optsched(ScheduleProblem((comp(0, 1),), {}, x), order="random")
    with pytest.raises(ValueError, match="task 0: option 3 out of range"):
        optsched(ScheduleProblem((comm(0),), {0: (P("p", M("m", 1, "x")),)}, x), {0: 3})


# ---------------------------------------------------------------------------------------------- MCMC


def tiny_search_problem():
    """Three comm ops ready together plus a dependent compute; greedy (all on fast x) is not optimal."""
    tasks = (comp(0, 2), comm(1, 0), comm(2, 0), comm(3, 0), comp(4, 6, 1, 2), comp(5, 4, 3))
    def options(fast, slow):
        return (P("x", M("x", fast, "x")), P("y", M("y", slow, "y")),
                P("seg", M("s0", fast / 2 + 1, "x"), M("s1", fast / 2 + 1, "x", deps=(0,))))
    return ScheduleProblem(tasks, {1: options(6, 9), 2: options(5, 7), 3: options(4, 11)}, ("x", "y"))


def brute_force(prob, order="critical"):
    ids = [t.id for t in prob.tasks if t.kind == "comm"]
    ranges = [range(len(prob.options[i])) for i in ids]
    return min(optsched(prob, dict(zip(ids, ks)), order).makespan_us for ks in itertools.product(*ranges))


def test_mcmc_finds_brute_force_optimum():
    prob = tiny_search_problem()
    best = brute_force(prob)
    greedy = optsched(prob, greedy_plan(prob)).makespan_us
    assert best < greedy  # the search has something to find
    res = mcmc(prob, HUGE, seed=1, **DET)
    assert res.makespan_us == best
    assert res.stop_reason == "max_steps" and res.iterations == 300
    assert res.history[0] == greedy
    assert optsched(prob, res.plan).makespan_us == best


def test_mcmc_deterministic_for_seed():
    prob = tiny_search_problem()
    a = mcmc(prob, HUGE, seed=7, **DET)
    b = mcmc(prob, HUGE, seed=7, **DET)
    assert (a.plan, a.history, a.iterations) == (b.plan, b.history, b.iterations)
    assert a.schedule == b.schedule


class StepClock:
    """A fake clock that advances one unit per reading: time-based stops become step-based."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_mcmc_stops_on_stagnation_and_budget():
    prob = tiny_search_problem()
    res = mcmc(prob, HUGE, seed=3, min_steps=20, clock=StepClock())
    assert res.stop_reason == "stagnation" and res.iterations >= 20
    res = mcmc(prob, 10, seed=3, stop_on_stagnation=False, clock=StepClock())
    assert res.stop_reason == "budget" and 0 < res.iterations < 20
    res = mcmc(ScheduleProblem((comm(0),), {0: (P("p", M("m", 1, "x")),)}, ("x",)), HUGE, seed=0)
    assert res.stop_reason == "no_choices" and res.iterations == 0


def test_mcmc_initial_plan_and_beta_zero_random_walk():
    prob = tiny_search_problem()
    res = mcmc(prob, HUGE, seed=2, initial={1: 2, 2: 2, 3: 2}, beta=0.0, max_steps=50)
    assert res.history[0] == optsched(prob, {1: 2, 2: 2, 3: 2}).makespan_us
    assert len(res.history) == 51  # beta 0 accepts every proposal
    assert res.makespan_us == min(res.history)


# ------------------------------------------------------------------------------------------ baselines


def test_baselines_ordered_on_constructed_example():
    prob = critical_beats_fifo_problem()
    r = compare(prob, HUGE, seed=0, **DET)
    assert r["fifo"].makespan_us == 41.0
    assert r["s-sched"].makespan_us == 31.0
    assert r["s-exec"].makespan_us == 31.0  # a moved to channel y, overlapping b under FIFO
    assert r["s-exec"].plan == {1: 1, 2: 0}
    assert r["syndicate"].makespan_us == 31.0  # = lower bound 1 + 10 + 20
    assert r["bs+"].makespan_us == 31.0
    assert r["syndicate"].makespan_us <= r["s-exec"].makespan_us
    assert r["s-sched"].makespan_us <= r["fifo"].makespan_us
    assert fifo_default(prob).schedule.order == "fifo" and s_sched(prob).plan == {1: 0, 2: 0}


def test_joint_search_beats_either_alone():
    # issue order a, d, b; b feeds a short compute, a and d feed the last compute. Channel x is fast,
    # y slow. Best: move one of a/d to y AND run b first on x. S-Exec gets the plan but not the order,
    # S-Sched the order but not the plan.
    tasks = (comp(0, 1), comm(1, 0, name="a"), comm(2, 0, name="d"), comm(3, 0, name="b"),
             comp(4, 5, 3), comp(5, 5, 1, 2))
    xy = (P("x", M("m", 10, "x")), P("y", M("m", 22, "y")))
    prob = ScheduleProblem(tasks, {1: xy, 2: xy, 3: (P("x", M("b", 10, "x")),)}, ("x", "y"))
    r = {k: v.makespan_us for k, v in compare(prob, HUGE, seed=0, **DET).items()}
    assert r["fifo"] == 41.0  # x: a 1-11, d 11-21, b 21-31; c4 31-36; c5 36-41
    assert r["s-sched"] == 36.0  # x: b 1-11, a 11-21, d 21-31; c4 11-16; c5 31-36
    assert r["s-exec"] == 31.0  # a on y 1-23; x: d 1-11, b 11-21; c4 21-26; c5 26-31
    assert r["syndicate"] == 28.0  # a on y 1-23; x: b 1-11, d 11-21; c4 11-16; c5 23-28
    assert r["syndicate"] < r["s-exec"] and r["syndicate"] < r["s-sched"] < r["fifo"]
    assert r["syndicate"] == brute_force(prob) and r["s-exec"] == brute_force(prob, "fifo")


def test_lifo_oracle_picks_best_same_channel_option():
    tasks = (comm(0),)
    opts = {0: (P("one", M("m", 10, "x")),
                P("seg", M("s0", 4, "x"), M("s1", 4, "x", deps=(0,))),
                P("other-channel", M("m", 1, "y")))}
    prob = ScheduleProblem(tasks, opts, ("x", "y"))
    assert oracle_plan(prob, "lifo") == {0: 1}  # y differs from the default's channels: inadmissible
    assert oracle_plan(prob, "lifo", same_channels_only=False) == {0: 2}
    res = lifo_oracle(prob)
    assert res.makespan_us == 8.0 and res.schedule.order == "lifo" and res.name == "bs+"
    assert s_exec(prob, HUGE, 0, **DET).makespan_us == 1.0
    assert syndicate(prob, HUGE, 0, **DET).makespan_us == 1.0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("order", ["critical", "fifo"])
def test_mcmc_optimum_across_seeds(seed, order):
    prob = tiny_search_problem()
    assert mcmc(prob, HUGE, seed, order=order, **DET).makespan_us == brute_force(prob, order)


def test_framework_issue_holds_a_comm_op_behind_the_compute_issued_before_it():
    # c0 (10) ; prep (needs nothing) ; c2 (5, needs prep). An enforcer may start prep at 0, overlapping c0;
    # PyTorch enqueues prep behind c0 on the stream, so it starts at 10.
    tasks = (comp(0, 10), comm(1, name="prep"), comp(2, 5, 1))
    prob = ScheduleProblem(tasks, {1: (P("p", M("m", 8, "x")),)}, ("x",))
    assert optsched(prob, order="fifo").makespan_us == 15.0  # prep 0-8 under c0, c2 10-15
    framework = framework_issue(prob)
    assert framework.tasks[1].deps == (0,) and framework.tasks[0] == tasks[0] and framework.tasks[2] == tasks[2]
    assert optsched(framework, order="fifo").makespan_us == 23.0  # prep 10-18, c2 18-23


def test_hand_priority_serves_the_comm_op_needed_first():
    # a and b both ready at 1 on one channel; b feeds the next compute, a only the last one. FIFO (issue
    # order) sends a first; "needed" sends b first.
    tasks = (comp(0, 1), comm(1, 0, name="a"), comm(2, 0, name="b"), comp(3, 2, 2), comp(4, 30), comp(5, 1, 1))
    opts = {1: (P("a", M("a", 10, "x")),), 2: (P("b", M("b", 10, "x")),)}
    prob = ScheduleProblem(tasks, opts, ("x",))
    assert optsched(prob, order="fifo").makespan_us == 54.0  # a 1-11, b 11-21, c3 21-23, c4 23-53, c5 53-54
    hand = hand_priority(prob)
    assert hand.name == "hand" and hand.schedule.order == "needed"
    assert hand.makespan_us == 44.0  # b 1-11, a 11-21, c3 11-13, c4 13-43, c5 43-44


def test_contention_free_bound_is_below_every_plan_and_order():
    for prob in (tiny_search_problem(),):
        bound = contention_free_bound(prob).makespan_us
        for order in ("fifo", "lifo", "critical", "needed"):
            assert bound <= brute_force(prob, order) + 1e-9
            assert bound <= brute_force(framework_issue(prob), order) + 1e-9


def test_contention_free_bound_hand_solved():
    # one comm task, two options: one motif of 10 us, or two chained motifs of 3 + 4 us (critical path 7)
    # sharing channel x with a second comm task of 5 us; compute (1 us) needs both. On the shared channel the
    # best is 7 + 5 + 1 = 13; the relaxation lets a and b overlap: max(7, 5) + 1 = 8.
    tasks = (comm(0, name="a"), comm(1, name="b"), comp(2, 1, 0, 1))
    opts = {0: (P("one", M("m", 10, "x")), P("two", M("s0", 3, "x"), M("s1", 4, "x", deps=(0,)))),
            1: (P("b", M("b", 5, "x")),)}
    prob = ScheduleProblem(tasks, opts, ("x",))
    assert contention_free_bound(prob).makespan_us == 8.0
    assert brute_force(prob) == 13.0


def test_bound_serialises_one_plans_motifs_on_a_shared_channel():
    # Two unchained 5 us segments both hold channel x: alone on the network they still take 10 us, not 5. A
    # third segment on y runs beside them. Compute (1 us) waits for the op: the bound is 10 + 1, which the
    # plan reaches, so the bound is tight here.
    tasks = (comm(0, name="a"), comp(1, 1, 0))
    split = P("seg", M("s0", 5, "x"), M("s1", 5, "x"), M("s2", 7, "y"))
    prob = ScheduleProblem(tasks, {0: (split,)}, ("x", "y"))
    assert contention_free_bound(prob).makespan_us == 11.0
    assert brute_force(prob) == 11.0


def random_problem(rng):
    """A small random DAG: compute and comm tasks in issue order, each comm task with 1-3 options of 1-3
    motifs on channels x / y (some chained, some on both)."""
    tasks, options = [], {}
    for i in range(rng.randint(3, 6)):
        deps = tuple(sorted(rng.sample(range(i), min(i, rng.randint(0, 2)))))
        if rng.random() < 0.5:
            tasks.append(comp(i, rng.randint(1, 6), *deps))
            continue
        tasks.append(comm(i, *deps))
        plans = []
        for k in range(rng.randint(1, 3)):
            motifs = []
            for j in range(rng.randint(1, 3)):
                chans = rng.choice((("x",), ("y",), ("x", "y")))
                chain = (j - 1,) if j and rng.random() < 0.5 else ()
                motifs.append(M(f"m{j}", rng.randint(1, 6), *chans, deps=chain))
            plans.append(P(f"o{k}", *motifs))
        options[i] = tuple(plans)
    return ScheduleProblem(tuple(tasks), options, ("x", "y"))


def test_bound_below_brute_force_on_random_problems():
    import random

    rng = random.Random(8)
    tight = 0
    for _ in range(60):
        prob = random_problem(rng)
        best = min(brute_force(p, order) for p in (prob, framework_issue(prob)) for order in ORDERS)
        assert contention_free_bound(prob).makespan_us <= best + 1e-9
        assert channel_window_bound_us(prob) <= best + 1e-9
        bound = lower_bound_us(prob)
        assert bound <= best + 1e-9
        tight += bound == best
    assert tight >= 10  # the bound is not vacuous: it is reached on some of them


def test_channel_window_bound_when_the_network_is_the_bottleneck():
    # Three independent comm tasks after a 1 us compute, each on x alone (4 us) or on x and y at once (3 us),
    # then a 2 us compute that needs the first. The DAG relaxation lets them overlap (1 + 3 + 2 = 6); channel x
    # carries at least 3 x 3 = 9 us, from t = 1 on: 1 + 9 = 10. With the tail: a set holding only the first
    # task gives 1 + 3 + 2, less. Brute force: 1 + 9 = 10 with the first task run first and the compute after it.
    tasks = (comp(0, 1), comm(1, 0), comm(2, 0), comm(3, 0), comp(4, 2, 1))
    opts = {i: (P("x", M("x", 4, "x")), P("xy", M("xy", 3, "x", "y"))) for i in (1, 2, 3)}
    prob = ScheduleProblem(tasks, opts, ("x", "y"))
    assert contention_free_bound(prob).makespan_us == 6.0
    assert channel_window_bound_us(prob) == 10.0
    assert lower_bound_us(prob) == 10.0
    assert brute_force(prob) == 10.0


def test_channel_window_bound_counts_the_tail_after_the_channel():
    # Two comm tasks on x (5 us each, no other option), each followed by its own 4 us compute; the compute stream
    # runs them in issue order. Whatever runs second on x ends at 10 at the earliest and its compute (4) follows,
    # so 14; the windows see it as heads 0, busy 5 + 5, tail >= 4.
    tasks = (comm(0, name="a"), comm(1, name="b"), comp(2, 4, 0), comp(3, 4, 1))
    opts = {0: (P("a", M("a", 5, "x")),), 1: (P("b", M("b", 5, "x")),)}
    prob = ScheduleProblem(tasks, opts, ("x",))
    assert contention_free_bound(prob).makespan_us == 13.0  # a, b at once: 5 + 4 + 4
    assert channel_window_bound_us(prob) == 14.0
    assert brute_force(prob) == 14.0

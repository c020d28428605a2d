"""MONeT's ILP (mlopt.planners.memory.ilp) against exhaustive search on tiny problems.

The ground truth is the replay (replay.py): the brute force below enumerates every schedule of a tiny
problem stage by stage (forward store set and implementations, then per backward stage every
implementation, recomputation set with implementations and keep set), judging each stage with the
replay itself, and keeps the (compute, peak) Pareto front per live set. The ILP's optimum must equal
the front's best compute at slack, binding and infeasible budgets, and every decoded schedule must
replay within the budget with compute equal to the ILP's objective.
"""

from __future__ import annotations

import itertools
import random

import pytest

from mlopt.planners.memory.ilp import IlpOutcome, solve_memory_ilp
from mlopt.planners.memory.problem import BackwardImpl, ForwardImpl, MemoryProblem, Node
from mlopt.planners.memory.replay import ScheduleError, replay
from mlopt.planners.memory.schedule import BackwardStage, ForwardStep, Schedule
from mlopt.planners.options import PlannerOptions
from mlopt.solvers import Status

OPTS = PlannerOptions(solver="highs", time_limit_s=30)
CONST = 5


# --------------------------------------------------------------------------------------- problems


def tiny_problem(seed: int, n_main: int = 3) -> MemoryProblem:
    """A random chain/diamond of `n_main` ops (plus mask nodes): forward implementations trading time for
    workspace, in-place variants, backward implementations with different dependencies (input-,
    output-, intermediate-activated) and intermediate nodes recomputable only with their creator."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    mains: list[int] = []
    for m in range(n_main):
        i = len(nodes)
        inputs: tuple[int, ...] = ()
        if mains:
            inputs = (mains[-1],)
            if len(mains) > 1 and rng.random() < 0.35:
                inputs = tuple(sorted({mains[-1], rng.choice(mains[:-1])}))
        size = 10 * rng.randint(1, 5)
        tau = float(rng.randint(1, 9))
        fwd = [ForwardImpl("fast", tau, rng.choice([0, 0, 10, 20]))]
        if rng.random() < 0.4:
            fwd.append(ForwardImpl("lean", tau + rng.randint(1, 4), 0))
        inplace_input = None
        if inputs and rng.random() < 0.35:
            inplace_input = inputs[-1]
            size = nodes[inplace_input].out_bytes
            fwd.append(ForwardImpl("inplace", tau, 0, inplace=True))
        mask = m < n_main - 1 and rng.random() < 0.3 and len(nodes) == len(mains)  # at most one mask
        bwd: list[BackwardImpl] = []
        if rng.random() < 0.85:
            options = [inputs, (i,), ()] if inputs else [(i,), ()]
            deps = rng.choice(options)
            bwd.append(BackwardImpl("b", float(rng.randint(1, 9)), rng.choice([0, 0, 10]), deps))
            alt = (i + 1,) if mask else rng.choice([d for d in options if d != deps])
            if mask or rng.random() < 0.4:
                bwd.append(BackwardImpl("b_alt", bwd[0].compute_us + rng.randint(0, 3), rng.choice([0, 20]), alt))
        nodes.append(Node(i, 100 + i, f"op{m}", size, inputs, tuple(fwd), tuple(bwd), inplace_input, None,
                          y_bytes=rng.choice([0, 10]), grad_live_bytes=rng.choice([0, 10, 20])))
        mains.append(i)
        if mask:
            nodes.append(Node(i + 1, 100 + i, f"op{m}.mask", 5, (i,), (ForwardImpl("mask", 1.0),),
                              intermediate_of=i, grad_live_bytes=rng.choice([0, 10])))
    return MemoryProblem(f"tiny{seed}", tuple(nodes), CONST, final_outputs=(mains[-1],))


def chain3() -> MemoryProblem:
    """x0 -> x1 -> x2 (the loss); backward_k reads x_{k-1}; x1 is big (the replay tests' hand-solved chain)."""
    from tests.planners.memory.test_replay import chain3 as replay_chain3

    return replay_chain3()


# --------------------------------------------------------------------------------------- brute force


def _subsets(xs):
    xs = sorted(xs)
    return itertools.chain.from_iterable(itertools.combinations(xs, r) for r in range(len(xs) + 1))


def _out_of_place(node: Node) -> str:
    return next(f.name for f in node.forward if not f.inplace)


def _completion(problem: MemoryProblem, below: int) -> list[BackwardStage]:
    """Stages below-1..0 that always execute: each recomputes everything its default backward needs
    (out of place, creators with their intermediates) and keeps nothing."""
    stages = []
    for k in range(below - 1, -1, -1):
        node = problem.nodes[k]
        if not node.backward:
            stages.append(BackwardStage(k, "", (), ()))
            continue
        need, todo = set(), list(node.backward[0].deps)
        while todo:
            j = todo.pop()
            if j not in need:
                need.add(j)
                todo.extend(problem.nodes[j].inputs)
                if problem.nodes[j].intermediate_of is not None:
                    todo.append(problem.nodes[j].intermediate_of)
        rec = tuple((j, _out_of_place(problem.nodes[j])) for j in sorted(need))
        stages.append(BackwardStage(k, node.backward[0].name, rec, ()))
    return stages


_PARETO: dict[tuple[str, bool], tuple] = {}


def pareto(problem: MemoryProblem, joint: bool = True) -> tuple[tuple[float, int, Schedule], ...]:
    """Every (compute, peak) Pareto-optimal schedule, by dynamic programming over backward stages whose
    state is the live set; each stage is judged by the replay (the prefix that reaches a state and an
    always-executable completion make the schedule whole)."""
    key = (repr(problem), joint)
    if key not in _PARETO:
        _PARETO[key] = _pareto(problem, joint)
    return _PARETO[key]


def _pareto(problem: MemoryProblem, joint: bool) -> tuple[tuple[float, int, Schedule], ...]:
    n = problem.n
    fimpl = [[f.name for f in node.forward][: None if joint else 1] for node in problem.nodes]
    bimpl = [[b.name for b in node.backward][: None if joint else 1] or [""] for node in problem.nodes]
    # state (live set) -> list of (compute, peak, forward steps, stages so far)
    front: dict[frozenset, list] = {}
    for stores in itertools.product([False, True], repeat=n):
        for impls in itertools.product(*fimpl):
            steps = tuple(ForwardStep(i, impls[i], stores[i]) for i in range(n))
            try:
                r = replay(problem, Schedule(steps, tuple(_completion(problem, n))))
            except ScheduleError:
                continue
            peak = max(e.bytes for e in r.timeline if e.phase == "forward")
            live = frozenset(i for i in range(n) if stores[i] or i in problem.final_outputs)
            front.setdefault(live, []).append((r.forward_us, peak, steps, ()))
    front = {s: _prune(v) for s, v in front.items()}
    for k in range(n - 1, -1, -1):
        nxt: dict[frozenset, list] = {}
        for live, entries in front.items():
            _, _, steps, prefix = entries[0]
            for bname in bimpl[k]:
                for rec_nodes in _subsets(range(n)):
                    for rec_impls in itertools.product(*(fimpl[i] for i in rec_nodes)):
                        rec = tuple(zip(rec_nodes, rec_impls))
                        for keep in _subsets(live | set(rec_nodes)):
                            stage = BackwardStage(k, bname, rec, keep)
                            try:
                                r = replay(problem, Schedule(steps, prefix + (stage,) + tuple(_completion(problem, k))))
                            except ScheduleError as exc:
                                if exc.stage is not None and exc.stage < k:
                                    raise AssertionError(f"completion failed: {exc}") from exc
                                continue
                            events = [e.bytes for e in r.timeline if e.stage == k]
                            peak = max(events, default=0)
                            cost = sum(next(f.compute_us for f in problem.nodes[i].forward if f.name == l)
                                       for i, l in rec)
                            cost += next((b.compute_us for b in problem.nodes[k].backward if b.name == bname), 0.0)
                            for c0, p0, st0, pre0 in entries:
                                nxt.setdefault(frozenset(keep), []).append((c0 + cost, max(p0, peak), st0,
                                                                             pre0 + (stage,)))
        front = {s: _prune(v) for s, v in nxt.items()}
    final = _prune([e for v in front.values() for e in v])
    return tuple((c, p, Schedule(st, pre)) for c, p, st, pre in final)


def _prune(entries: list) -> list:
    """Pareto front in (compute, peak): ascending compute, strictly descending peak."""
    out = []
    for e in sorted(entries, key=lambda e: (e[0], e[1])):
        if not out or e[1] < out[-1][1]:
            out.append(e)
    return out


def brute_force(problem: MemoryProblem, budget: int, joint: bool = True) -> float | None:
    feasible = [c for c, p, _ in pareto(problem, joint) if p <= budget]
    return min(feasible) if feasible else None


def check_replays(problem: MemoryProblem, budget: int, out: IlpOutcome) -> None:
    assert out.schedule is not None
    r = replay(problem, out.schedule)
    assert r.peak_bytes <= budget
    assert r.compute_us == pytest.approx(out.result.objective, rel=1e-9, abs=1e-9)


def budgets(problem: MemoryProblem, joint: bool = True) -> list[int]:
    """Slack (no limit), every binding Pareto peak, and one byte under the least feasible peak."""
    peaks = sorted({p for _, p, _ in pareto(problem, joint)})
    return [10**9] + peaks + [peaks[0] - 1]


# --------------------------------------------------------------------------------------- tests

SEEDS = [0, 1, 2, 3, 4, 5, 7, 11]


@pytest.mark.parametrize("seed", SEEDS)
def test_optimum_equals_brute_force(seed):
    problem = tiny_problem(seed)
    for budget in budgets(problem):
        best = brute_force(problem, budget)
        out = solve_memory_ilp(problem, budget, OPTS)
        if best is None:
            assert out.result.status is Status.INFEASIBLE, (seed, budget)
            assert out.schedule is None
            continue
        assert out.result.status is Status.OPTIMAL, (seed, budget, out.result.message)
        assert out.result.objective == pytest.approx(best, abs=1e-9), (seed, budget)
        check_replays(problem, budget, out)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_checkpoint_only_equals_its_brute_force_and_joint_is_never_worse(seed):
    problem = tiny_problem(seed)
    for budget in budgets(problem, joint=False):
        best = brute_force(problem, budget, joint=False)
        out = solve_memory_ilp(problem, budget, OPTS, joint=False)
        assert out.stats["formulation"] == "checkpoint-only"
        if best is None:
            assert out.result.status is Status.INFEASIBLE
            continue
        assert out.result.objective == pytest.approx(best, abs=1e-9)
        check_replays(problem, budget, out)
        for f in out.schedule.forward:
            assert f.impl == problem.nodes[f.node].forward[0].name
        joint = solve_memory_ilp(problem, budget, OPTS, joint=True)
        assert joint.result.objective <= out.result.objective + 1e-9


def test_chain3_by_hand():
    problem = chain3()
    # store-all peaks in the forward pass at 1350 with compute 105 (see test_memory_replay).
    out = solve_memory_ilp(problem, 1350, OPTS)
    assert out.result.objective == 105.0
    check_replays(problem, 1350, out)
    # 1300: x0 (100) cannot stay stored next to x1 and the loss; store x1 only and recompute x0 at
    # stage 1 (+10 us, peak 1300 while f1 runs).
    out = solve_memory_ilp(problem, 1300, OPTS)
    assert out.result.objective == 115.0 == brute_force(problem, 1300)
    assert [f.store for f in out.schedule.forward[:2]] == [False, True]
    assert out.schedule.backward[1].recompute == ((0, "d"),)
    check_replays(problem, 1300, out)
    assert solve_memory_ilp(problem, 1299, OPTS).result.status is Status.INFEASIBLE


def workspace_problem() -> MemoryProblem:
    """A conv-like node with a fast default needing 300 bytes of workspace and a slow lean variant."""
    return MemoryProblem("ws", (
        Node(0, 0, "conv", 100, (), (ForwardImpl("fast", 10.0, 300), ForwardImpl("lean", 14.0, 0)),
             (BackwardImpl("b", 10.0, 0, ()),)),
        Node(1, 1, "relu", 100, (0,), (ForwardImpl("f", 2.0),), (BackwardImpl("b", 2.0, 0, (0,)),)),
        Node(2, 2, "loss", 10, (1,), (ForwardImpl("f", 1.0),), (BackwardImpl("b", 1.0, 0, (1,)),)),
    ), constant_bytes=0, final_outputs=(2,))


def test_slow_lean_implementation_only_when_the_budget_binds():
    problem = workspace_problem()
    slack = solve_memory_ilp(problem, 10**6, OPTS)
    assert slack.schedule.forward[0].impl == "fast" and slack.result.objective == 26.0
    # 300: conv's 100 + 300 workspace no longer fits in the forward pass; recomputing it at stage 1 would
    # need the workspace again, so only the lean variant (+4 us) fits.
    tight = solve_memory_ilp(problem, 300, OPTS)
    assert tight.result.status is Status.OPTIMAL
    assert tight.schedule.forward[0].impl == "lean" and tight.result.objective == 30.0
    check_replays(problem, 300, tight)
    assert solve_memory_ilp(problem, 300, OPTS, joint=False).result.status is Status.INFEASIBLE
    assert brute_force(problem, 300) == 30.0 and brute_force(problem, 300, joint=False) is None


def inplace_problem(read_later: bool = False) -> MemoryProblem:
    """x0 -> relu x1 (in place or not) -> x2; backward of the relu reads its output only. With
    read_later, x2 also reads x0, so the relu may not overwrite it."""
    relu = (ForwardImpl("outofplace", 3.0), ForwardImpl("inplace", 3.0, inplace=True))
    return MemoryProblem("inplace", (
        Node(0, 0, "bn", 100, (), (ForwardImpl("f", 5.0),), (BackwardImpl("b", 5.0, 0, ()),)),
        Node(1, 1, "relu", 100, (0,), relu, (BackwardImpl("b", 3.0, 0, (1,)),), inplace_input=0),
        Node(2, 2, "loss", 10, (0, 1) if read_later else (1,), (ForwardImpl("f", 1.0),),
             (BackwardImpl("b", 1.0, 0, (1,)),)),
    ), constant_bytes=0, final_outputs=(2,))


def test_inplace_is_picked_when_it_saves_memory_and_is_legal():
    problem = inplace_problem()
    out = solve_memory_ilp(problem, 110, OPTS)  # relu out of place would peak at 200
    assert out.result.status is Status.OPTIMAL
    assert out.schedule.forward[1].impl == "inplace"
    check_replays(problem, 110, out)
    assert brute_force(problem, 110) == out.result.objective
    assert solve_memory_ilp(problem, 110, OPTS, joint=False).result.status is Status.INFEASIBLE
    # x0 read again by the loss: overwriting it is illegal, so 110 is infeasible.
    illegal = inplace_problem(read_later=True)
    assert solve_memory_ilp(illegal, 250, OPTS).schedule.forward[1].impl == "outofplace"
    assert solve_memory_ilp(illegal, 199, OPTS).result.status is Status.INFEASIBLE
    assert brute_force(illegal, 199) is None


def test_random_problems_replay_within_budget():
    for seed in range(20, 32):
        problem = tiny_problem(seed, n_main=4)
        top = solve_memory_ilp(problem, 10**9, OPTS)
        peak = replay(problem, top.schedule).peak_bytes
        for budget in range(peak, 0, -15):
            out = solve_memory_ilp(problem, budget, OPTS)
            if out.schedule is None:
                assert out.result.status is Status.INFEASIBLE
                break
            check_replays(problem, budget, out)


def test_warm_start_is_accepted_and_partial_when_not_encodable():
    problem = tiny_problem(3)
    front = pareto(problem)
    cost, peak, schedule = front[-1]  # the leanest optimal schedule
    out = solve_memory_ilp(problem, peak, OPTS, warm_start=schedule)
    assert out.stats["warm_start"] == "accepted"
    assert out.stats["warm_start_objective"] == pytest.approx(replay(problem, schedule).compute_us)
    assert out.result.objective == pytest.approx(cost)
    # A schedule the reduced model cannot encode (a recomputation outside a 1-node window) is passed on
    # as a partial start: its forward-pass choices only.
    chain = chain3()
    recompute_far = Schedule(
        tuple(ForwardStep(i, "d", s) for i, s in enumerate([True, False, False])),
        (BackwardStage(2, "d", ((1, "d"),), (0,)), BackwardStage(1, "d", (), ()), BackwardStage(0, "d", (), ())))
    out = solve_memory_ilp(chain, 1350, OPTS, warm_start=recompute_far, window=1)
    assert out.stats["warm_start"].startswith("partial"), out.stats["warm_start"]
    assert out.result.objective == 105.0


def test_stats_determinism_and_dump(tmp_path):
    problem = tiny_problem(5, n_main=4)
    peak = replay(problem, solve_memory_ilp(problem, 10**9, OPTS).schedule).peak_bytes
    options = PlannerOptions(solver="highs", seed=3, dump_model=str(tmp_path / "m.mps"))
    first = solve_memory_ilp(problem, peak - 10, options, dump_suffix="-a")
    second = solve_memory_ilp(problem, peak - 10, options, dump_suffix="-a")
    assert first.schedule == second.schedule and first.result.objective == second.result.objective
    assert (tmp_path / "m-a.mps").exists()
    for key in ("rows", "cols", "binaries", "nonzeros", "reductions", "rows_by_equation", "window", "build_s",
                "solve_s", "warm_start"):
        assert key in first.stats
    assert first.stats["rows"] == sum(first.stats["rows_by_equation"].values())


def long_chain(n: int = 12) -> MemoryProblem:
    """A chain of conv-like nodes, each with free tiny statistics (batch norm's) its backward reads."""
    nodes = []
    for m in range(n):
        i = len(nodes)
        inputs = (i - 2,) if m else ()
        nodes.append(Node(i, m, f"conv{m}", 10**6 * (1 + m % 3), inputs, (ForwardImpl("d", 5.0 + m % 4),),
                          (BackwardImpl("d", 6.0, 0, inputs + (i + 1,)),), y_bytes=10**5, grad_live_bytes=10**5))
        nodes.append(Node(i + 1, m, f"conv{m}.stats", 8, (i,), (ForwardImpl("d", 0.0),), intermediate_of=i))
    return MemoryProblem("long", tuple(nodes), 10**7, final_outputs=(len(nodes) - 2,))


def test_window_grows_while_time_is_left_and_tiny_statistics_are_pinned():
    problem = long_chain()
    store_all = solve_memory_ilp(problem, 10**9, OPTS)
    peak = replay(problem, store_all.schedule).peak_bytes
    budget = 10**7 + (peak - 10**7) // 3
    out = solve_memory_ilp(problem, budget, OPTS)
    phases = out.stats["phases"]
    assert [p["window"] for p in phases[:2]] == [16, 24] and phases[0]["status"] == "optimal"
    assert out.stats["window"] == phases[-1]["window"]
    assert out.result.objective <= phases[0]["objective"]
    assert out.stats["reductions"]["tiny_free_values_pinned"] == 12
    assert all(f.store for f in out.schedule.forward[1::2])
    check_replays(problem, budget, out)
    fixed = solve_memory_ilp(problem, budget, OPTS, window=8)
    assert "phases" not in fixed.stats and fixed.stats["window"] == 8
    assert fixed.result.objective >= out.result.objective - 1e-9
    check_replays(problem, budget, fixed)


def with_reusing_recomputation(problem: MemoryProblem) -> MemoryProblem:
    """`problem` where every creator of intermediates also has a recomputation-only implementation that
    reads them instead of producing them (as batch norm's "reuse-stats" reads its saved statistics)."""
    from dataclasses import replace

    creators = {node.intermediate_of for node in problem.nodes if node.intermediate_of is not None}
    nodes = tuple(replace(node, forward=node.forward + (
        ForwardImpl("reuse", node.forward[0].compute_us / 2, 0, reuses_intermediates=True),))
        if node.index in creators else node for node in problem.nodes)
    return replace(problem, nodes=nodes)


REUSE_SEEDS = [s for s in range(12) if any(node.intermediate_of is not None for node in tiny_problem(s).nodes)][:4]


@pytest.mark.parametrize("seed", REUSE_SEEDS)
def test_recomputation_reusing_intermediates_equals_brute_force(seed):
    problem = with_reusing_recomputation(tiny_problem(seed))
    for budget in budgets(problem):
        best = brute_force(problem, budget)
        out = solve_memory_ilp(problem, budget, OPTS)
        if best is None:
            assert out.result.status is Status.INFEASIBLE, (seed, budget)
            continue
        assert out.result.objective == pytest.approx(best, abs=1e-9), (seed, budget)
        check_replays(problem, budget, out)
        assert all(f.impl != "reuse" for f in out.schedule.forward)


def test_reusing_recomputation_by_hand():
    """a -> bn (+ its statistics, an intermediate) -> b -> c (60 bytes, the loss). bn's backward reads a and
    the statistics, b's reads bn's output. Storing both a and bn's output peaks at c's forward
    (5 + 50 + 50 + 1 + 1 + 60 = 167), so at 130 one of them goes: recomputing a for bn's stage costs 5,
    recomputing bn for b's stage 8, or 4 reusing the statistics (kept for bn's own backward anyway).
    Forward 15 + backward 4 + 4 = 23; without the reusing implementation, 24."""
    nodes = (
        Node(0, 0, "a", 50, (), (ForwardImpl("default", 5.0),), (BackwardImpl("b", 1.0, 0, ()),)),
        Node(1, 1, "bn", 50, (0,), (ForwardImpl("default", 8.0),
                                    ForwardImpl("reuse", 4.0, 0, reuses_intermediates=True)),
             (BackwardImpl("b", 1.0, 0, (0, 2)),)),
        Node(2, 1, "bn.stats", 1, (1,), (ForwardImpl("default", 0.0),), intermediate_of=1),
        Node(3, 3, "b", 1, (1,), (ForwardImpl("default", 1.0),), (BackwardImpl("b", 1.0, 0, (1,)),)),
        Node(4, 4, "c", 60, (3,), (ForwardImpl("default", 1.0),), (BackwardImpl("b", 1.0, 0, ()),)),
    )
    problem = MemoryProblem("reuse", nodes, CONST, final_outputs=(4,))
    out = solve_memory_ilp(problem, 130, OPTS)
    assert out.result.status is Status.OPTIMAL and out.result.objective == pytest.approx(23.0)
    check_replays(problem, 130, out)
    stage3 = next(b for b in out.schedule.backward if b.node == 3)
    assert stage3.recompute == ((1, "reuse"),)
    assert solve_memory_ilp(problem, 130, OPTS, joint=False).result.objective == pytest.approx(24.0)
    assert brute_force(problem, 130) == pytest.approx(23.0)

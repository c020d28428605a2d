"""Large-neighbourhood search on the memory ILP (mlopt.planners.memory.neighbourhood).

The search must only ever move to feasible, cheaper vectors of the same ILP; once its band spans the
model a round is the whole ILP, so a search that converges ends at the brute-force optimum. Through
the planner, a searched plan validates, records the search and is never worse than its warm start.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mlopt.planners.memory import neighbourhood
from mlopt.planners.memory.ilp import _Builder, _not_worse_than, solve_memory_ilp
from mlopt.planners.memory.planner import DEFAULT_SEARCH_SHARE, MemoryOptions, plan_memory
from mlopt.planners.memory.replay import replay
from mlopt.planners.options import PlannerOptions
from mlopt.solvers import SolveResult, Status, is_feasible, resolve_solver
from mlopt.solvers.base import SolveOptions
from tests.planners.memory.test_ilp import brute_force, budgets, tiny_problem

OPTS = PlannerOptions(solver="highs", time_limit_s=30)


def test_column_nodes_name_the_nodes_a_decision_concerns():
    assert neighbourhood.column_nodes(("sN", 4)) == (4,)
    assert neighbourhood.column_nodes(("d", 3, 1)) == (3,)
    assert neighbourhood.column_nodes(("dh", 7, 0)) == (7,)
    assert neighbourhood.column_nodes(("r", 9, 2)) == (9, 2)
    assert neighbourhood.column_nodes(("dk", 9, 2, 1)) == (9, 2)
    assert neighbourhood.column_nodes(("K", 9, 5)) == (9, 5)
    assert neighbourhood.column_nodes(("sigma", 9, 0, 5)) is None  # continuous auxiliaries stay free


def _model(problem, budget):
    builder = _Builder(problem, budget, True, None, False)
    builder.build()
    builder.objective()
    return builder, builder.model.to_arrays()


def _binding_cases(seeds, n_main=3):
    """(seed, problem, budget, checkpoint-only outcome) for every budget the checkpoint-only ILP fits."""
    for seed in seeds:
        problem = tiny_problem(seed, n_main)
        for budget in budgets(problem, joint=False):
            start = solve_memory_ilp(problem, budget, OPTS, joint=False)
            if start.schedule is not None:
                yield seed, problem, budget, start


def test_band_bounds_fix_everything_outside_the_band():
    problem = tiny_problem(3, 5)
    builder, form = _model(problem, 10**9)
    nodes = [neighbourhood.column_nodes(m) for m in builder.meaning]
    x = np.zeros(form.num_vars)
    lb, ub, free = neighbourhood.band_bounds(form, nodes, x, 2, 4)
    for c, where in enumerate(nodes):
        inside = where is not None and any(2 <= v < 4 for v in where)
        if where is not None and form.integrality[c] and not inside:
            assert lb[c] == ub[c] == 0.0
        else:
            assert (lb[c], ub[c]) == (form.col_lb[c], form.col_ub[c])
    assert 0 < free < int(form.integrality.sum())


def test_search_from_the_checkpoint_only_plan_reaches_the_brute_force_optimum():
    solver, _ = resolve_solver("highs")
    checked = improved = 0
    for seed, problem, budget, start in _binding_cases([0, 1, 2, 5, 7]):
        builder, form = _model(problem, budget)
        x0, _, why = builder.encode(start.schedule)
        assert x0 is not None, why
        found = neighbourhood.search(form, builder.meaning, builder.n, x0, solver,
                                     SolveOptions(time_limit_s=30, mip_gap=1e-9), 60.0, builder._fill_aux,
                                     first_band=1)
        assert is_feasible(form, found.x)
        cost = float(form.c @ found.x + form.constant)
        assert cost <= float(form.c @ x0 + form.constant) + 1e-9
        assert found.stats["ended"] == "converged" and found.stats["last_band_nodes"] == builder.n
        assert cost == pytest.approx(brute_force(problem, budget), abs=1e-9), (seed, budget)
        played = replay(problem, builder.decode(found.x))
        assert played.peak_bytes <= budget and played.compute_us == pytest.approx(cost)
        checked += 1
        improved += found.stats["improvements"] > 0
    assert checked >= 10 and improved >= 1, (checked, improved)


def test_search_without_time_returns_its_start():
    _, problem, budget, start = next(_binding_cases([1]))
    builder, form = _model(problem, budget)
    x0, _, _ = builder.encode(start.schedule)
    solver, _ = resolve_solver("highs")
    found = neighbourhood.search(form, builder.meaning, builder.n, x0, solver, SolveOptions(), 0.0, builder._fill_aux)
    assert found.stats["rounds"] == 0 and found.stats["ended"] == "time"
    assert np.array_equal(found.x, x0)


def _result(status, objective=None, bound=None, x=None):
    return SolveResult(status, objective, bound, None, 1.0, x, "highs", "test", "")


@pytest.mark.parametrize("status", [Status.TIME_LIMIT_NO_SOLUTION, Status.ERROR])
def test_a_searched_vector_stands_in_for_a_solver_that_returned_none(status):
    problem = tiny_problem(2, 4)
    builder, form = _model(problem, 10**9)
    x = np.zeros(form.num_vars)
    out = _not_worse_than(_result(status), form, x)
    assert out.status is Status.FEASIBLE and out.x is x and out.best_bound is None and out.gap is None
    assert out.objective == pytest.approx(float(form.c @ x + form.constant))


def test_the_solver_result_wins_unless_the_searched_vector_is_cheaper():
    problem = tiny_problem(2, 4)
    _, form = _model(problem, 10**9)
    x = np.zeros(form.num_vars)
    cost = float(form.c @ x + form.constant)
    cheaper = _result(Status.FEASIBLE, cost - 1.0, cost - 2.0, x + 1)
    assert _not_worse_than(cheaper, form, x) is cheaper
    dearer = _result(Status.FEASIBLE, cost + 5.0, cost - 1.0, x + 1)
    out = _not_worse_than(dearer, form, x)
    assert out.objective == pytest.approx(cost) and out.x is x and out.best_bound == cost - 1.0
    assert out.gap == pytest.approx(1.0 / max(abs(cost), 1e-9)) and out.status is Status.FEASIBLE
    # A bound above the searched vector's cost cannot be right for it: dropped rather than reported.
    wrong = _not_worse_than(_result(Status.FEASIBLE, cost + 5.0, cost + 1.0, x + 1), form, x)
    assert wrong.best_bound is None and wrong.gap is None


class Stalling:
    """HiGHS, except that the first solve of each model given a complete start stops at once with that
    start as its incumbent and a bound of 0 (branch and bound that stalled, as on ResNet-50); the
    search's rounds that follow are solved for real."""

    def __init__(self):
        self.real, _ = resolve_solver("highs")
        self.stalled = 0
        self.seen: set[int] = set()  # model sizes already stalled once

    def solve(self, form, options, start=None):
        if form.num_vars in self.seen or not isinstance(start, np.ndarray):
            return self.real.solve(form, options, start=start)
        self.seen.add(form.num_vars)
        self.stalled += 1
        return SolveResult(Status.FEASIBLE, float(form.c @ start + form.constant), 0.0, None, 0.0, start.copy(),
                           "highs", "stalled", "stalled on purpose")


def _stalling(monkeypatch) -> Stalling:
    solver = Stalling()
    monkeypatch.setattr("mlopt.planners.memory.ilp.resolve_solver", lambda name: (solver, "stalling highs"))
    return solver


def test_a_stalled_solve_is_searched_and_keeps_the_branch_and_bound_bound(monkeypatch):
    cases = list(_binding_cases([0, 2]))
    for seed, problem, budget, start in cases:
        stalling = _stalling(monkeypatch)
        out = solve_memory_ilp(problem, budget, OPTS, joint=True, warm_start=start.schedule, window=problem.n,
                               search_share=0.5)
        assert "search" in out.stats, (seed, budget)
        assert out.result.status is Status.FEASIBLE  # never "optimal" on the search's word
        assert out.result.best_bound == 0.0 and out.result.gap == pytest.approx(1.0)
        assert out.result.objective == pytest.approx(brute_force(problem, budget), abs=1e-9)
        played = replay(problem, out.schedule)
        assert played.peak_bytes <= budget and played.compute_us == pytest.approx(out.result.objective)
        assert stalling.stalled == 1
    # Without a share (or a time limit) nothing is searched.
    seed, problem, budget, start = cases[0]
    plain = solve_memory_ilp(problem, budget, OPTS, joint=True, warm_start=start.schedule, window=problem.n)
    assert "search" not in plain.stats


def test_planner_passes_its_share_and_the_searched_plan_validates(monkeypatch):
    _stalling(monkeypatch)
    problem = tiny_problem(2, 3)
    reference = replay(problem, __import__("mlopt.planners.memory.baselines", fromlist=["x"]).store_all(problem))
    budget = min(b for b in budgets(problem, joint=False))
    options = PlannerOptions(solver="highs", time_limit_s=20)
    searched = plan_memory(problem, MemoryOptions("monet", budget_bytes=budget), options, {})
    ilp = searched.plan.payload["ilp"]
    assert ilp["search"]["objective"] <= ilp["search"]["start_objective"] + 1e-9
    assert searched.plan.objective == pytest.approx(brute_force(problem, budget), abs=1e-9)
    assert searched.plan.payload["predicted"]["peak_bytes"] <= budget
    assert searched.plan.payload["predicted"]["compute_us"] >= reference.compute_us - 1e-9
    assert searched.plan.provenance.options is not None
    off = plan_memory(problem, MemoryOptions("monet", budget_bytes=budget, search_share=0.0), options, {})
    assert "search" not in off.plan.payload["ilp"]


def test_cli_flag_mirrors_the_option(run_cli, tmp_path):
    from mlopt.cli import plan_memory_cmd

    flag = next(p for p in plan_memory_cmd.params if p.name == "search_share")
    assert flag.default == DEFAULT_SEARCH_SHARE == MemoryOptions().search_share
    r = run_cli("plan", "memory", "--model", "x.json", "--budget-ratio", "0.5", "--search-share", "1.5",
                "-o", tmp_path / "p.json")
    assert r.code == 2 and "--search-share" in r.err and not (tmp_path / "p.json").exists()


def test_a_plan_made_with_another_share_is_stale(run_cli, ddp_example_trace, tmp_path):
    plan = tmp_path / "m.json"
    assert run_cli("-q", "plan", "memory", "--model", ddp_example_trace, "--budget-ratio", "1.0", "-o", plan).code == 0
    assert json.loads(plan.read_text())["payload"]["search_share"] == DEFAULT_SEARCH_SHARE
    same = run_cli("plan", "memory", "--model", ddp_example_trace, "--budget-ratio", "1.0", "--check", plan)
    assert same.code == 0
    other = run_cli("plan", "memory", "--model", ddp_example_trace, "--budget-ratio", "1.0", "--search-share", "0",
                    "--check", plan)
    assert other.code == 1 and "search_share ($.payload.search_share): recorded 0.5, now 0" in other.out + other.err


def test_the_first_window_holds_the_whole_warm_start():
    from mlopt.planners.memory.ilp import DEFAULT_WINDOW, WINDOW_GROWTH, _window_for_start
    from mlopt.planners.memory.schedule import BackwardStage, Schedule

    _, problem, budget, start = next(_binding_cases([2]))
    builder = _Builder(problem, budget, True, None, False)
    assert builder.window_for(start.schedule) <= builder.full_window
    # A schedule that recomputes node 0 at the last stage needs a window reaching from that stage's highest
    # needed value down to node 0.
    last = max(builder.active)
    far = Schedule(start.schedule.forward, tuple(
        BackwardStage(b.node, b.impl, ((0, problem.nodes[0].forward[0].name),) if b.node == last else (), b.keep)
        for b in start.schedule.backward))
    assert builder.window_for(far) == builder.hi[last] + 1
    chosen = _window_for_start(problem, budget, True, far)
    assert chosen is None if builder.hi[last] + 1 <= DEFAULT_WINDOW else chosen >= builder.hi[last] + 1
    assert _window_for_start(problem, budget, True, start.schedule) in (None, math.ceil(DEFAULT_WINDOW * WINDOW_GROWTH))


def test_a_full_share_searches_from_the_warm_start(monkeypatch):
    # share 1: branch and bound gets no time of its own (1 ms); the search starts from the warm start.
    seed, problem, budget, start = next(_binding_cases([2]))
    out = solve_memory_ilp(problem, budget, OPTS, joint=True, warm_start=start.schedule, window=problem.n,
                           search_share=1.0)
    assert out.schedule is not None
    assert out.result.objective <= start.result.objective + 1e-9
    played = replay(problem, out.schedule)
    assert played.peak_bytes <= budget and played.compute_us == pytest.approx(out.result.objective)

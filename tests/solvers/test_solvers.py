"""Tests for mlopt.solvers: known optima on every available backend, statuses, MPS, registry, licences."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np
import pytest

from mlopt.errors import MloptError
from mlopt.solvers import (
    Model,
    SolveOptions,
    SolverUnavailable,
    Status,
    get_solver,
    is_feasible,
    list_solvers,
    max_violation,
    resolve_solver,
    write_mps,
)
from mlopt.solvers import cbc as cbc_module
from mlopt.solvers import highs as highs_module
from mlopt.solvers.gurobi import SIZE_LIMITED_MAX_VARS, probe_licence

INF = math.inf


# -- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(params=list_solvers())
def solver(request):
    """Every registered backend; the unavailable ones are skipped with the reason they give."""
    backend = get_solver(request.param)
    availability = backend.available()
    if not availability.ok:
        pytest.skip(f"{request.param}: {availability.reason}")
    return backend


# -- known-optimum problems (answers checked by hand in the comments) ----------------------------------


@dataclass(frozen=True)
class Case:
    build: Callable[[], Model]
    status: Status
    objective: float | None = None
    x: tuple[float, ...] | None = None  # only where the optimum is unique


def lp_vertex() -> Model:
    # Wyndor glass: max 3x + 5y s.t. x <= 4, 2y <= 12, 3x + 2y <= 18, x, y >= 0.
    # Vertices: (0,0)=0, (4,0)=12, (4,3)=27, (2,6)=36, (0,6)=30 -> optimum 36 at (2, 6).
    m = Model("wyndor")
    x, y = m.add_var("x"), m.add_var("y")
    m.add_le([x], [1], 4)
    m.add_le([y], [2], 12)
    m.add_le([x, y], [3, 2], 18)
    m.set_objective([x, y], [3, 5], sense="max")
    return m


def knapsack() -> Model:
    # (weight, value): (12,4) (2,2) (1,1) (1,2) (4,10), capacity 15. Without the 12-weight item all others fit
    # (weight 8, value 15); with it only weight 3 is left, best (2,2)+(1,2) -> 4+4 = 8. Optimum 15 = 0,1,1,1,1.
    m = Model("knapsack")
    items = m.add_vars("take", 5, ub=1, integer=True)
    m.add_le(items, [12, 2, 1, 1, 4], 15, name="capacity")
    m.set_objective(items, [4, 2, 1, 2, 10], sense="max")
    return m


def assignment() -> Model:
    # Costs [[4,1,3],[2,0,5],[3,2,2]]. The 6 permutations cost 6, 11, 5, 9, 7, 6; optimum 5:
    # worker 0 -> task 1 (1), worker 1 -> task 0 (2), worker 2 -> task 2 (2).
    cost = np.array([[4, 1, 3], [2, 0, 5], [3, 2, 2]])
    m = Model("assignment")
    x = np.array([[m.add_binary(f"x[{i},{j}]", obj=cost[i, j]) for j in range(3)] for i in range(3)])
    for k in range(3):
        m.add_eq(x[k, :], [1, 1, 1], 1, name=f"worker[{k}]")
        m.add_eq(x[:, k], [1, 1, 1], 1, name=f"task[{k}]")
    return m


def integer_gap(integer: bool = True) -> Model:
    # max x + y s.t. -2x + 2y >= 1, -8x + 10y <= 13, x, y >= 0.
    # LP: y >= x + 0.5 and y <= 1.3 + 0.8x meet at (4, 4.5) -> 8.5.
    # Integer: y >= x + 1 and y <= 1.3 + 0.8x force x <= 1.5; x = 1 -> y = 2 (3), x = 0 -> y = 1 (1). Optimum 3.
    m = Model("integer_gap")
    x, y = m.add_var("x", integer=integer), m.add_var("y", integer=integer)
    m.add_ge([x, y], [-2, 2], 1)
    m.add_le([x, y], [-8, 10], 13)
    m.set_objective([x, y], [1, 1], sense="max")
    return m


def ranged_lower_binding() -> Model:
    # min x + 2y + 3z s.t. x + y + z = 6, 2 <= y - x <= 4, z >= 1. z is dearest, so z = 1 and x + y = 5;
    # x is cheapest, so push x up until y - x = 2: x = 1.5, y = 3.5 -> 1.5 + 7 + 3 = 11.5.
    m = Model("ranged_lo")
    x, y, z = m.add_var("x"), m.add_var("y"), m.add_var("z", lb=1)
    m.add_eq([x, y, z], [1, 1, 1], 6)
    m.add_constraint([y, x], [1, -1], lb=2, ub=4, name="spread")
    m.set_objective([x, y, z], [1, 2, 3])
    return m


def ranged_upper_binding() -> Model:
    # min 2x + y + 3z, same rows: z = 1, x + y = 5, now y is cheapest: push y up until y - x = 4:
    # x = 0.5, y = 4.5 -> 1 + 4.5 + 3 = 8.5.
    m = ranged_lower_binding()
    m.set_objective([0, 1, 2], [2, 1, 3])
    return m


def negative_bounds_max() -> Model:
    # max 2x - y + z + 0.5 with x integer and free, y in [-3, 2], z in (-inf, 2], x + y <= 1.5, x - z >= -10.
    # z = 2 (its upper bound). 2x - y <= 2(1.5 - y) - y = 3 - 3y is largest at y = -3, where x <= 4.5 -> x = 4
    # (integer); then y = -3 still best: 8 + 3 + 2 + 0.5 = 13.5. (LP relaxation: x = 4.5 -> 14.5.)
    m = Model("negative")
    x = m.add_var("x", lb=-INF, ub=INF, integer=True)
    y = m.add_var("y", lb=-3, ub=2)
    z = m.add_var("z", lb=-INF, ub=2)
    m.add_le([x, y], [1, 1], 1.5)
    m.add_ge([x, z], [1, -1], -10)
    m.set_objective([x, y, z], [2, -1, 1], sense="max", constant=0.5)
    return m


def duplicate_entries() -> Model:
    # The row lists x twice (1 + 1 = 2): min -x s.t. 2x <= 3, x continuous -> x = 1.5, objective -1.5.
    m = Model()
    x = m.add_var()
    m.add_le([x, x], [1, 1], 3)
    m.set_objective([x], [-1])
    return m


def fractional_integer_bounds() -> Model:
    # max -x0 + 4x1 - 5x2 + 5x3 + 5x4 - 2x5 - 2x6 - 4x7 + 3x8 + 1.5
    # s.t. -5x0 - x3 - 3x7 <= 7, 0 <= x8 <= 7.5; integers x0 <= 3.5, x1 <= 3.5 (both free below), x4 in [2, 3.5],
    # x6 in [0, 10], x8 in [-5, 3.5]; continuous x2 in [0, 10], x3 in [0, 3.5], x5 >= 2, x7 in [-5, 3.5].
    # Each variable at its best bound: x1 = 3 (12), x2 = 0, x3 = 3.5 (17.5), x4 = 3 (15), x5 = 2 (-4), x6 = 0,
    # x7 = -5 (20), x8 = 3 (9); the row then needs -5x0 <= 7 + 3.5 - 15, x0 >= 0.9 -> x0 = 1 (-1). Total 70.
    # HiGHS 1.15's presolve calls this infeasible unless integer bounds are rounded to integers first.
    m = Model("fractional_bounds")
    spec = [(-INF, 3.5, True), (-INF, 3.5, True), (0, 10, False), (0, 3.5, False), (2, 3.5, True),
            (2, INF, False), (0, 10, True), (-5, 3.5, False), (-5, 3.5, True)]
    x = [m.add_var(f"x{j}", lb, ub, integer) for j, (lb, ub, integer) in enumerate(spec)]
    m.add_le([x[0], x[3], x[7]], [-5, -1, -3], 7)
    m.add_constraint([x[8]], [1], lb=0, ub=7.5)
    m.set_objective(x, [-1, 4, -5, 5, 5, -2, -2, -4, 3], sense="max", constant=1.5)
    return m


def preprocessing_trap() -> Model:
    # min 5x0 - 3x1 - 2x3 + 1.5 s.t. 5x0 + 4x1 + 3x2 >= 5, 2x0 + 4x1 >= -14; x0 >= -5 continuous,
    # integers x1 in [2, 3.5], x2 >= -5 (cost 0), x3 in [-5, 3.5]. Best: x1 = 3, x3 = 3, x0 = -5 with
    # x2 >= (5 - 12 + 25) / 3 = 6: -25 - 9 - 6 + 1.5 = -38.5 (x2 not unique). CBC 2.10.3's preprocessing
    # postsolves this to x2 = 1, x0 = -2 (-23.5) while its log says -40 + 1.5; the adapter re-solves.
    m = Model("preprocessing_trap")
    x0 = m.add_var("x0", lb=-5)
    x1 = m.add_var("x1", lb=2, ub=3.5, integer=True)
    x2 = m.add_var("x2", lb=-5, integer=True)
    x3 = m.add_var("x3", lb=-5, ub=3.5, integer=True)
    m.add_ge([x0, x1, x2], [5, 4, 3], 5)
    m.add_ge([x0, x1], [2, 4], -14)
    m.set_objective([x0, x1, x3], [5, -3, -2], constant=1.5)
    return m


def infeasible_lp() -> Model:
    # x + y >= 5 with x, y <= 2.
    m = Model()
    x, y = m.add_var(ub=2), m.add_var(ub=2)
    m.add_ge([x, y], [1, 1], 5)
    return m


def infeasible_mip() -> Model:
    # 2x = 1 has the LP solution x = 0.5 but no integer one.
    m = Model()
    x = m.add_var(integer=True, ub=10)
    m.add_eq([x], [2], 1)
    m.set_objective([x], [1])
    return m


def unbounded(integer: bool) -> Model:
    # max x + y s.t. x - y <= 1: (t + 1, t) is feasible for every t >= 0.
    m = Model()
    x, y = m.add_var(integer=integer), m.add_var(integer=integer)
    m.add_le([x, y], [1, -1], 1)
    m.set_objective([x, y], [1, 1], sense="max")
    return m


def unbounded_free_integer() -> Model:
    # max y, y a free integer; x (integer, no lower bound) is pinned by -x = 5. y grows without limit.
    # CBC 2.10 itself answers "infeasible" here; the adapter must still say unbounded.
    m = Model()
    y = m.add_var("y", lb=-INF, integer=True)
    x = m.add_var("x", lb=-INF, ub=10, integer=True)
    m.add_eq([x], [-1], 5)
    m.set_objective([y], [1], sense="max")
    return m


CASES = {
    "lp_vertex": Case(lp_vertex, Status.OPTIMAL, 36.0, (2.0, 6.0)),
    "knapsack": Case(knapsack, Status.OPTIMAL, 15.0, (0, 1, 1, 1, 1)),
    "assignment": Case(assignment, Status.OPTIMAL, 5.0, (0, 1, 0, 1, 0, 0, 0, 0, 1)),
    "integer_gap_mip": Case(integer_gap, Status.OPTIMAL, 3.0, (1.0, 2.0)),
    "integer_gap_lp": Case(lambda: integer_gap(integer=False), Status.OPTIMAL, 8.5, (4.0, 4.5)),
    "ranged_lower": Case(ranged_lower_binding, Status.OPTIMAL, 11.5, (1.5, 3.5, 1.0)),
    "ranged_upper": Case(ranged_upper_binding, Status.OPTIMAL, 8.5, (0.5, 4.5, 1.0)),
    "negative_bounds_max": Case(negative_bounds_max, Status.OPTIMAL, 13.5, (4.0, -3.0, 2.0)),
    "duplicate_entries": Case(duplicate_entries, Status.OPTIMAL, -1.5, (1.5,)),
    "fractional_integer_bounds": Case(fractional_integer_bounds, Status.OPTIMAL, 70.0, (1, 3, 0, 3.5, 3, 2, 0, -5, 3)),
    "preprocessing_trap": Case(preprocessing_trap, Status.OPTIMAL, -38.5),
    "infeasible_lp": Case(infeasible_lp, Status.INFEASIBLE),
    "infeasible_mip": Case(infeasible_mip, Status.INFEASIBLE),
    "unbounded_lp": Case(lambda: unbounded(False), Status.UNBOUNDED),
    "unbounded_mip": Case(lambda: unbounded(True), Status.UNBOUNDED),
    "unbounded_free_integer": Case(unbounded_free_integer, Status.UNBOUNDED),
}
OPTIMAL_CASES = [name for name, case in CASES.items() if case.status is Status.OPTIMAL]


def assert_consistent(result, model: Model, options: SolveOptions = SolveOptions()) -> None:
    """Objective/bound/gap semantics every backend must share."""
    form = model.to_arrays()
    if not result.status.has_solution:
        assert result.x is None and result.objective is None and result.gap is None
        return
    assert result.x.shape == (form.num_vars,)
    assert is_feasible(form, result.x)
    assert result.objective == pytest.approx(float(form.c @ result.x + form.constant), abs=1e-6)
    if result.status is Status.OPTIMAL:
        assert result.gap == 0.0
        assert result.best_bound == pytest.approx(result.objective, rel=options.mip_gap, abs=1e-6)


# -- known optima on every backend -----------------------------------------------------------------------


@pytest.mark.parametrize("case_name", list(CASES))
def test_known_result(solver, case_name):
    case = CASES[case_name]
    model = case.build()
    result = solver.solve(model, SolveOptions())
    assert result.status is case.status, result.message
    assert result.solver == solver.name and result.solver_version
    assert result.wall_time_s >= 0
    assert_consistent(result, model)
    if case.objective is not None:
        assert result.objective == pytest.approx(case.objective, abs=1e-6)
    if case.x is not None:
        np.testing.assert_allclose(result.x, case.x, atol=1e-6)


@pytest.mark.parametrize("start_kind", ["dict", "dense"])
def test_warm_start_optimal_start_keeps_optimum(solver, start_kind):
    model = knapsack()
    best = np.array([0, 1, 1, 1, 1], dtype=float)
    start = {i: v for i, v in enumerate(best)} if start_kind == "dict" else best
    result = solver.solve(model, SolveOptions(), start=start)
    assert result.status is Status.OPTIMAL
    assert result.objective == pytest.approx(15.0)


def test_partial_warm_start(solver):
    # Only "take_4" given; the solver completes (or ignores) it and still proves the optimum.
    result = solver.solve(knapsack(), SolveOptions(), start={4: 1.0})
    assert result.status is Status.OPTIMAL and result.objective == pytest.approx(15.0)


def test_empty_model(solver):
    model = Model()
    model.set_objective([], [], constant=4.0)
    result = solver.solve(model)
    assert result.status is Status.OPTIMAL and result.objective == 4.0 and result.x.shape == (0,)


# -- limits: hard instances ------------------------------------------------------------------------------


def market_split(rows: int, seed: int, with_slack: bool) -> tuple[Model, np.ndarray | None]:
    """Cornuejols-Dawande market split: sum_j a_ij x_j = d_i, x binary, a_ij in [0, 99], d_i = sum_j a_ij // 2,
    10 (rows - 1) columns; notoriously hard for branch and bound. With slack: minimise sum |slack_i|, which
    always has a feasible point (x = 0, positive slack = d); returns that point as a warm start."""
    rng = np.random.default_rng(seed)
    cols = 10 * (rows - 1)
    a = rng.integers(0, 100, size=(rows, cols))
    d = a.sum(axis=1) // 2
    m = Model("market_split")
    x = m.add_vars("x", cols, ub=1, integer=True)
    if not with_slack:
        for i in range(rows):
            m.add_eq(x, a[i], d[i])
        return m, None
    over = m.add_vars("over", rows, obj=1.0)
    under = m.add_vars("under", rows, obj=1.0)
    for i in range(rows):
        m.add_eq(np.r_[x, over[i], under[i]], np.r_[a[i], -1, 1], d[i])
    start = np.r_[np.zeros(cols), np.zeros(rows), d.astype(float)]
    return m, start


def test_time_limit_with_warm_start_returns_feasible_with_gap(solver):
    model, start = market_split(rows=5, seed=7, with_slack=True)
    start_objective = float(start @ model.to_arrays().c)
    options = SolveOptions(time_limit_s=1.0)
    result = solver.solve(model, options, start=start)
    assert result.status is Status.FEASIBLE, result.message
    assert_consistent(result, model, options)
    assert result.objective <= start_objective + 1e-6
    assert result.best_bound is not None and result.best_bound <= result.objective + 1e-6
    assert 0 < result.gap < INF
    assert result.gap == pytest.approx(abs(result.objective - result.best_bound) / abs(result.objective))


def test_node_limit_stops_at_the_same_point_every_run(solver):
    """A node limit is a work limit: two runs return the same incumbent and bound (a time limit would not)."""
    model, start = market_split(rows=5, seed=7, with_slack=True)
    options = SolveOptions(node_limit=20)
    first, second = (solver.solve(model, options, start=start) for _ in range(2))
    assert first.status is Status.FEASIBLE, first.message
    assert_consistent(first, model, options)
    assert 0 < first.gap < INF
    assert np.array_equal(first.x, second.x)
    assert (first.objective, first.best_bound) == (second.objective, second.best_bound)


def test_node_limit_must_be_positive():
    with pytest.raises(ValueError, match="node_limit"):
        SolveOptions(node_limit=0)


def test_time_limit_without_solution(solver):
    model, _ = market_split(rows=6, seed=3, with_slack=False)
    result = solver.solve(model, SolveOptions(time_limit_s=0.5))
    assert result.status is Status.TIME_LIMIT_NO_SOLUTION, result.message
    assert result.x is None and result.objective is None and result.gap is None


def test_threads_can_change_between_solves(solver):
    # HiGHS fixes its thread pool on the first run in a process; the adapter must cope with a change.
    for threads in (1, 2, 1):
        result = solver.solve(lp_vertex(), SolveOptions(threads=threads, seed=threads))
        assert result.status is Status.OPTIMAL and result.objective == pytest.approx(36.0)


# -- failures come back as values -----------------------------------------------------------------------


def test_highs_failure_is_a_value(monkeypatch):
    def broken(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(highs_module, "_pass_model", broken)
    result = get_solver("highs").solve(lp_vertex())
    assert result.status is Status.ERROR and "boom" in result.message and result.x is None


def test_cbc_crash_is_a_value(monkeypatch, tmp_path):
    if not get_solver("cbc").available().ok:
        pytest.skip("cbc unavailable")
    fake = tmp_path / "cbc"
    fake.write_text("#!/bin/sh\necho 'segfault pretending' ; exit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cbc_module, "find_cbc", lambda: str(fake))
    result = get_solver("cbc").solve(lp_vertex())
    assert result.status is Status.ERROR and "exit code 3" in result.message


def test_unwritable_dump_is_a_value(tmp_path):
    result = get_solver("highs").solve(lp_vertex(), SolveOptions(dump_model=str(tmp_path / "missing" / "m.mps")))
    assert result.status is Status.ERROR and "dump_model" in result.message


def test_bad_start_raises_value_error():
    with pytest.raises(ValueError):
        get_solver("highs").solve(lp_vertex(), start={7: 1.0})
    with pytest.raises(ValueError):
        get_solver("highs").solve(lp_vertex(), start=np.zeros(3))


# -- CBC output parsing ----------------------------------------------------------------------------------


def test_cbc_bound_parsing_prefers_the_more_precise_print():
    log = "Cbc0005I Partial search - best objective 14 (best possible 10.1234), took 3 iterations\n" \
          "Result - Stopped on time limit\n\nObjective value:  14.0\nLower bound:                    10.123\n"
    assert cbc_module.parse_bound(log) == pytest.approx(10.1234)
    assert cbc_module.parse_bound("Result - Optimal solution found\n") is None


def test_cbc_binary_solution_parsing():
    rows, cols = 1, 2
    body = np.array([7.0, 3.0, 0.5, 1.0 / 3.0, 2.0, 0.0, 0.0])  # objective, activity, dual, x0, x1, reduced costs
    data = np.array([rows, cols], dtype=np.int32).tobytes() + body.tobytes()
    np.testing.assert_array_equal(cbc_module.parse_binary_solution(data, rows, cols), [1.0 / 3.0, 2.0])
    assert cbc_module.parse_binary_solution(data, 2, 2) is None  # other model: ignored


def test_cbc_solution_file_parsing():
    text = "Stopped on time - objective value 3\n      0 R0  784  1\n**       1 C1  0.5  0\n      0 C0  1  0\n"
    status_line, x = cbc_module.parse_solution_file(text, 3)
    assert status_line.startswith("Stopped on time")
    np.testing.assert_allclose(x, [1.0, 0.5, 0.0])


# -- MPS -------------------------------------------------------------------------------------------------


def highs_optimum_of_file(path) -> tuple[str, float]:
    h = highspy.Highs()
    h.silent()
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    h.run()
    return h.modelStatusToString(h.getModelStatus()), h.getInfo().objective_function_value


@pytest.mark.parametrize("case_name", OPTIMAL_CASES)
def test_mps_round_trip(tmp_path, case_name):
    case = CASES[case_name]
    path = tmp_path / f"{case_name}.mps"
    write_mps(case.build(), path)
    status, objective = highs_optimum_of_file(path)
    assert status == "Optimal"
    assert objective == pytest.approx(case.objective, abs=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # atomic write leaves no temp file


def test_mps_sections(tmp_path):
    path = tmp_path / "m.mps"
    write_mps(negative_bounds_max(), path)
    text = path.read_text()
    for expected in ("OBJSENSE", "MAX", "'INTORG'", "'INTEND'", " FR BND  x", " MI BND  z", " UP BND  z  2.0",
                     " LO BND  y  -3.0", "RHS  obj  -0.5"):
        assert expected in text
    write_mps(knapsack(), path)
    assert " BV BND  take_0" in path.read_text()
    write_mps(ranged_lower_binding(), path)
    assert "RANGES" in path.read_text() and "RNG  spread  2.0" in path.read_text()


def test_mps_rejects_duplicate_names(tmp_path):
    m = Model()
    m.add_var("a")
    m.add_var("a")
    with pytest.raises(ValueError, match="duplicate"):
        write_mps(m, tmp_path / "dup.mps")
    assert list(tmp_path.iterdir()) == []


def test_dump_model_writes_a_resolvable_file(tmp_path):
    path = tmp_path / "dump.mps"
    result = get_solver("highs").solve(knapsack(), SolveOptions(dump_model=str(path)))
    assert result.status is Status.OPTIMAL
    assert highs_optimum_of_file(path) == ("Optimal", pytest.approx(15.0))


# -- model builder ---------------------------------------------------------------------------------------


def test_model_arrays():
    m = Model()
    xs = m.add_vars("v", 3, lb=[0, -1, -INF], ub=5, obj=[1, 2, 3])
    b = m.add_binary()
    m.add_constraint([0, 1, 0], [1.0, 2.0, 3.0], lb=1, ub=9)
    m.add_ge(np.array([2, b]), np.array([1.0, -1.0]), 0)
    form = m.to_arrays()
    assert list(xs) == [0, 1, 2] and b == 3
    assert form.col_names == ("v_0", "v_1", "v_2", "x3") and form.row_names == ("c0", "c1")
    assert form.A.toarray().tolist() == [[4.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]]  # duplicates summed
    assert form.integrality.tolist() == [False, False, False, True] and form.is_mip
    assert form.col_lb.tolist() == [0, -1, -INF, 0] and form.c.tolist() == [1, 2, 3, 0]
    with pytest.raises(ValueError):
        form.c[0] = 7.0  # frozen


@pytest.mark.parametrize(
    "bad",
    [
        lambda m: m.add_var("has space"),
        lambda m: m.add_var(lb=2, ub=1),
        lambda m: m.add_var(lb=math.nan),
        lambda m: m.add_constraint([5], [1.0]),
        lambda m: m.add_constraint([0, 0], [1.0]),
        lambda m: m.add_constraint([0], [1.0], lb=3, ub=2),
        lambda m: m.set_objective([0], [1.0], sense="maximise"),
        lambda m: m.add_vars("w", 2, ub=[1, 2, 3]),
    ],
)
def test_model_rejects_bad_input(bad):
    m = Model()
    m.add_var("a")
    with pytest.raises(ValueError):
        bad(m)


def test_max_violation():
    form = knapsack().to_arrays()
    assert max_violation(form, np.array([0, 1, 1, 1, 1.0])) == 0.0
    assert max_violation(form, np.array([1, 1, 1, 1, 1.0])) == pytest.approx(5.0)  # 20 > 15
    assert max_violation(form, np.array([0, 0.5, 0, 0, 0])) == pytest.approx(0.5)  # fractional binary


# -- registry, auto choice and Gurobi licence detection ------------------------------------------------


class FakeGurobiError(Exception):
    def __init__(self, errno: int, message: str):
        super().__init__(message)
        self.errno = errno
        self.message = message


SIZE_LIMIT_MESSAGE = (  # as gurobipy's pip licence words it
    "Model too large for size-limited license; visit https://gurobi.com/unrestricted for more information"
)


class FakeMVar:
    def __init__(self, n: int):
        self.X = np.zeros(n)
        self.Start = None


def fake_gurobipy(max_vars: int | None, licence_error: tuple[int, str] | None = None) -> types.ModuleType:
    """A stand-in for gurobipy with the calls the adapter makes; optimize() solves the recorded model with
    scipy's HiGHS-based milp, so the model the adapter builds is checked for real. max_vars=None: full licence."""
    module = types.ModuleType("gurobipy")
    probed_sizes: list[int] = []
    grb = types.SimpleNamespace(INTEGER="I", CONTINUOUS="C", MINIMIZE=1, MAXIMIZE=-1, UNDEFINED=1e101)

    class Env:
        def __init__(self, empty: bool = False):
            self.params = {}

        def setParam(self, name, value):
            self.params[name] = value

        def start(self):
            if licence_error:
                raise FakeGurobiError(*licence_error)

        def dispose(self):
            pass

    class Model:
        def __init__(self, name: str = "", env=None):
            self.num_vars, self.rows, self.x = 0, [], None
            self.ModelSense, self.ObjCon, self.Params = grb.MINIMIZE, 0.0, types.SimpleNamespace()

        def addVars(self, n):
            self.num_vars += n

        def addMVar(self, n, lb, ub, obj, vtype):
            self.num_vars, self.x = n, FakeMVar(n)
            self.lb, self.ub, self.obj, self.vtype = map(np.asarray, (lb, ub, obj, vtype))
            return self.x

        def addMConstr(self, A, x, sense, b):
            assert x is self.x and sense in "<>="
            self.rows.append((A.toarray(), sense, np.asarray(b)))

        def optimize(self):
            probed_sizes.append(self.num_vars)
            if max_vars is not None and self.num_vars > max_vars:
                raise FakeGurobiError(10010, SIZE_LIMIT_MESSAGE)
            self.Status, self.SolCount = 2, 1
            if self.x is not None:
                self._solve()

        def _solve(self):
            from scipy.optimize import Bounds, LinearConstraint, milp

            sign = float(self.ModelSense)
            limits = {"<": lambda b: (-INF, b), ">": lambda b: (b, INF), "=": lambda b: (b, b)}
            rows = [LinearConstraint(A, *limits[sense](b)) for A, sense, b in self.rows]
            res = milp(sign * self.obj, constraints=rows, integrality=(self.vtype == "I").astype(int),
                       bounds=Bounds(self.lb, self.ub))
            module.last_start = self.x.Start
            self.Status = {0: 2, 2: 3, 3: 5}[res.status]
            self.SolCount = int(res.x is not None)
            if res.x is not None:
                self.x.X = res.x
                self.ObjVal = self.ObjBound = float(self.obj @ res.x) + self.ObjCon

        def dispose(self):
            pass

    module.Env, module.Model, module.GurobiError, module.GRB = Env, Model, FakeGurobiError, grb
    module.gurobi = types.SimpleNamespace(version=lambda: (12, 0, 0))
    module.probed_sizes = probed_sizes
    return module


@pytest.mark.parametrize("case_name", list(CASES))
def test_gurobi_adapter_builds_the_right_model(monkeypatch, case_name):
    # Checks the adapter's translation (row senses, ranged rows, bounds, sense, constant) against the fake,
    # which re-solves what it was given. The real gurobipy API is not available here.
    fake = fake_gurobipy(max_vars=None)
    monkeypatch.setitem(sys.modules, "gurobipy", fake)
    case = CASES[case_name]
    if case_name in ("unbounded_mip", "unbounded_free_integer"):
        pytest.skip("scipy's milp reports unbounded MIPs as 'not solved'; nothing to learn from the fake")
    model = case.build()
    result = get_solver("gurobi").solve(model, SolveOptions(), start={0: 0.0})
    assert result.status is case.status, result.message
    assert result.solver_version == "12.0.0"
    assert fake.last_start[0] == 0.0 and np.all(fake.last_start[1:] == fake.GRB.UNDEFINED)  # partial MIP start
    assert_consistent(result, model)
    if case.objective is not None:
        assert result.objective == pytest.approx(case.objective, abs=1e-6)


def test_size_limited_gurobi_is_detected(monkeypatch):
    fake = fake_gurobipy(max_vars=SIZE_LIMITED_MAX_VARS)
    monkeypatch.setitem(sys.modules, "gurobipy", fake)
    availability = get_solver("gurobi").available()
    assert not availability.ok
    assert availability.reason == "size-limited pip licence detected (Model too large for size-limited license)"
    assert fake.probed_sizes == [SIZE_LIMITED_MAX_VARS + 1]  # probes just beyond the limit
    solver, note = resolve_solver("auto")
    assert solver.name == "highs"
    assert note == "gurobi: size-limited pip licence detected (Model too large for size-limited license); using highs"


def test_full_gurobi_licence_is_picked_by_auto(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", fake_gurobipy(max_vars=None))
    assert probe_licence(sys.modules["gurobipy"]).ok
    solver, note = resolve_solver("auto")
    assert solver.name == "gurobi" and note == "auto: gurobi with a full licence"


def test_missing_gurobi_licence(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", fake_gurobipy(None, licence_error=(10009, "No Gurobi license found")))
    availability = get_solver("gurobi").available()
    assert not availability.ok and availability.reason == "no usable Gurobi licence (No Gurobi license found)"


def test_auto_without_gurobipy(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", None)  # makes `import gurobipy` fail
    solver, note = resolve_solver("auto")
    assert solver.name == "highs"
    assert note.startswith("gurobi: gurobipy not installed (") and note.endswith("; using highs")
    assert "\n" not in note


def test_explicit_unavailable_solver_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", fake_gurobipy(max_vars=SIZE_LIMITED_MAX_VARS))
    with pytest.raises(SolverUnavailable) as info:
        resolve_solver("gurobi")
    assert isinstance(info.value, MloptError) and info.value.exit_code == 2
    assert str(info.value) == (
        "solver 'gurobi' is unavailable: size-limited pip licence detected (Model too large for size-limited license)"
    )
    with pytest.raises(SolverUnavailable, match="unknown solver"):
        resolve_solver("cplex")


def test_explicit_available_solver():
    solver, note = resolve_solver("highs")
    assert solver.name == "highs" and note == "highs: requested explicitly"
    assert set(list_solvers()) >= {"highs", "cbc", "gurobi"}


def test_options_are_validated():
    for bad in ({"time_limit_s": 0}, {"mip_gap": -1}, {"threads": 0}, {"seed": -1}):
        with pytest.raises(ValueError):
            SolveOptions(**bad)
    assert Status.OPTIMAL.has_solution and Status.FEASIBLE.has_solution
    no_solution = (Status.INFEASIBLE, Status.UNBOUNDED, Status.TIME_LIMIT_NO_SOLUTION, Status.ERROR)
    assert not any(s.has_solution for s in no_solution)

"""LIBRA's cost model (mlopt.planners.threads.model): contention functions, all-reduce costs, validation and
the stage model (eq. 7-15), checked by hand and against an independent event-driven simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlopt.planners.threads.model import (ALLREDUCE_COSTS, AllReduceCost, ContentionParams, Group, Layer,
                                          ThreadsProblem, _stage_parts_scalar, allreduce_cost,
                                          assumption_violations, comm_durations, evaluate, stage_parts)

R6 = (128, 256, 512, 1024, 2048, 4096)


def nice_params(**overrides) -> ContentionParams:
    """A plausible fit (V100 + 50 Gb/s): compute slows to 59 % at 4096 threads, ~6 GB/s at best."""
    values = dict(alpha1=1.0, alpha2=1e-4, gamma1=6000.0, gamma2=5500.0, gamma3=0.05,
                  delta1=6200.0, delta2=5600.0, delta3=0.06)
    values.update(overrides)
    return ContentionParams(**values)


def flat_params(kappa_at_1000=0.75, overlapped=10.0, exposed=20.0) -> ContentionParams:
    """Rates independent of r (gamma2 = delta2 = 0) and kappa = 1 - (1 - kappa_at_1000) r / 1000."""
    return ContentionParams(alpha1=1.0, alpha2=(1 - kappa_at_1000) / 1000, gamma1=overlapped, gamma2=0.0,
                            gamma3=0.1, delta1=exposed, delta2=0.0, delta3=0.1)


def problem_of(spec, params=None, nodes=2, alpha_us=5.0, threads=(1000,), algorithm="ring") -> ThreadsProblem:
    layers = tuple(Layer(f"l{k}", float(b), int(c)) for k, (b, c) in enumerate(spec))
    return ThreadsProblem(layers, nodes, alpha_us, threads, params or flat_params(), algorithm)


# ------------------------------------------------------------------------------------ contention


def test_contention_functions_follow_eq_5_and_6():
    p = nice_params()
    assert p.compute_us(100.0, 1000) == pytest.approx(100.0 / (1.0 - 0.1))
    assert p.overlapped_comm_us(6e6, 512) == pytest.approx(6e6 / (6000 - 5500 * math.exp(-0.05 * 512 ** 0.6)))
    assert p.exposed_comm_us(6e6, 512) == pytest.approx(6e6 / (6200 - 5600 * math.exp(-0.06 * 512 ** 0.6)))
    assert p.gamma4 == 0.6
    r = np.array(R6)
    np.testing.assert_allclose(p.compute_us(np.full(6, 10.0), r), 10.0 / (1.0 - 1e-4 * r))
    assert isinstance(p.compute_us(1.0, 128), float)
    # more threads: faster communication, slower compute
    assert np.all(np.diff(p.overlapped_comm_us(1e6, r)) < 0) and np.all(np.diff(p.compute_us(1.0, r)) > 0)


def test_contention_params_are_keyword_only_and_finite():
    with pytest.raises(TypeError):
        ContentionParams(1.0, 1e-4, 6000.0, 5500.0, 0.05, 6200.0, 5600.0, 0.06)  # noqa: the order is not the API
    with pytest.raises(ValueError, match="gamma1"):
        nice_params(gamma1=float("nan"))
    assert nice_params().delta4 == 0.6 and nice_params(gamma4=0.5).delta4 == 0.5
    assert nice_params(delta4=0.7).exposed_rate(512) == pytest.approx(6200 - 5600 * math.exp(-0.06 * 512 ** 0.7))
    assert type(nice_params(alpha1=np.float32(1.0)).alpha1) is float


def test_nonpositive_denominator_names_the_thread_count():
    with pytest.raises(ValueError, match=r"alpha1 - alpha2\*r .* at r=4096"):
        problem_of([(10, 100)], params=nice_params(alpha2=3e-4), threads=(128, 4096))
    with pytest.raises(ValueError, match="r=128"):
        problem_of([(10, 100)], params=nice_params(gamma2=7000.0, gamma3=0.001), threads=(128, 4096))
    with pytest.raises(ValueError, match=r"delta1 .* at r=256"):
        problem_of([(10, 100)], params=nice_params(delta2=9000.0, delta3=0.001), threads=(256,))
    prob = problem_of([(10, 100)], params=nice_params(alpha2=2e-4), threads=(128,))
    with pytest.raises(ValueError, match="r=8192"):  # outside R: checked when evaluated
        evaluate(prob, [Group(0, 0, 8192)])


# ------------------------------------------------------------------------------------ all-reduce


def test_allreduce_costs():
    ring = ALLREDUCE_COSTS["ring"](8, 3.0)
    assert ring == AllReduceCost(2 * 7 * 3.0, 2 * 7 / 8)  # (4)
    assert ALLREDUCE_COSTS["tree"](8, 3.0) == AllReduceCost(2 * 3 * 3.0, 2.0)
    assert ALLREDUCE_COSTS["halving_doubling"](6, 1.0) == AllReduceCost(6.0, 2 * 5 / 6)
    for fn in ALLREDUCE_COSTS.values():
        assert fn(1, 3.0) == AllReduceCost(0.0, 0.0)
    custom = problem_of([(10, 100)], algorithm=lambda n, a: AllReduceCost(7.0, 0.5))
    assert allreduce_cost(custom) == AllReduceCost(7.0, 0.5)
    with pytest.raises(ValueError, match="unknown all-reduce algorithm 'mesh'"):
        problem_of([(10, 100)], algorithm="mesh")


def test_comm_durations_are_p_plus_a_and_zero_without_bytes():
    prob = problem_of([(10, 100)], nodes=4, alpha_us=2.0, params=flat_params(overlapped=10.0, exposed=20.0))
    d, e = comm_durations(prob, np.array([0, 1000]), 1000)
    c_hat = 2 * 3 / 4 * 1000
    np.testing.assert_allclose(d, [0.0, c_hat / 10.0 + 12.0])
    np.testing.assert_allclose(e, [0.0, c_hat / 20.0 + 12.0])


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("spec, threads, message", [
    ([], (128,), "no layers"),
    ([(10, 0), (5, 0)], (128,), "every layer has zero gradient bytes"),
    ([(10, 100)], (), "empty thread set"),
    ([(10, 100)], (128, 128), "duplicates"),
    ([(10, 100)], (0,), "positive integers"),
    ([(-1, 100)], (128,), "compute_us"),
    ([(1, -5)], (128,), "grad_bytes"),
])
def test_problem_validation(spec, threads, message):
    with pytest.raises(ValueError, match=message):
        problem_of(spec, params=nice_params(), threads=threads)


def test_problem_validation_of_nodes_and_alpha():
    with pytest.raises(ValueError, match="nodes"):
        problem_of([(10, 100)], nodes=0)
    with pytest.raises(ValueError, match="alpha_us"):
        problem_of([(10, 100)], alpha_us=-1.0)


@pytest.mark.parametrize("groups, message", [
    ([], "no groups"),
    ([Group(0, 0, 1000)], "groups end at layer 0"),
    ([Group(0, 0, 1000), Group(2, 2, 1000)], "must start at layer 1"),
    ([Group(0, 1, 1000), Group(1, 2, 1000)], "must start at layer 2"),
    ([Group(1, 2, 1000)], "must start at layer 0"),
    ([Group(0, 2, 0)], "threads must be a positive integer"),
])
def test_groups_must_tile_the_layers(groups, message):
    prob = problem_of([(1, 10), (1, 10), (1, 10)])
    with pytest.raises(ValueError, match=message):
        evaluate(prob, groups)


def test_assumption_violations():
    assert assumption_violations(problem_of([(1, 10)], params=nice_params(), threads=R6)) == ()
    fast_overlap = problem_of([(1, 10)], params=flat_params(overlapped=30.0, exposed=20.0))
    assert any("Assumption 2" in v for v in assumption_violations(fast_overlap))
    slow_overlap = problem_of([(1, 10)], params=flat_params(kappa_at_1000=0.5, overlapped=5.0, exposed=20.0))
    assert any("Assumption 3" in v for v in assumption_violations(slow_overlap))
    speedup = problem_of([(1, 10)], params=nice_params(alpha1=1.1), threads=(128,))
    assert any("> 1" in v for v in assumption_violations(speedup))


# ------------------------------------------------------------------------------------ stage model


def test_stage_parts_scalar_matches_vectorised():
    rng = np.random.default_rng(3)
    b = rng.uniform(0, 100, 500) * (rng.random(500) > 0.2)
    rate = rng.uniform(0.3, 1.0, 500)
    d = rng.uniform(0, 150, 500) * (rng.random(500) > 0.2)
    e = d * rng.uniform(0.5, 1.0, 500)
    f_o, f_b, f_c = stage_parts(b, rate, d, e)
    for k in range(500):
        assert _stage_parts_scalar(b[k], rate[k], d[k], e[k]) == (f_o[k], f_b[k], f_c[k])
    assert np.all((f_b == 0) | (f_c == 0))  # t_b and t_c cannot both be nonzero


def test_evaluate_by_hand_comm_first():
    # kappa = 0.75 at 1000 threads; ring N=2: a = 10 us, c_hat = c; p = c/10, q = c/20
    prob = problem_of([(100, 900), (200, 1000), (100, 800)])
    ev = evaluate(prob, [Group(0, 0, 1000), Group(1, 2, 1000)])
    s1, s2 = ev.stages
    assert s1["comm_start_us"] == 100.0 and s1["remaining_compute_us"] == 300.0  # stage 0 = b_1
    assert s1["overlapped_comm_us"] == pytest.approx(100.0) and s1["exposed_comm_us"] == pytest.approx(55.0)
    assert s1["overlap_us"] == pytest.approx(100.0)  # (8) min(D = 100, g = 400)
    assert s1["residual_compute_us"] == pytest.approx(225.0)  # (9), (11), (13): 300 (1 - 100/400)
    assert s1["residual_comm_us"] == 0.0
    assert s2["comm_start_us"] == pytest.approx(425.0) and s2["remaining_compute_us"] == pytest.approx(0.0)
    assert s2["overlap_us"] == 0.0 and s2["residual_comm_us"] == pytest.approx(1800 / 20 + 10)  # q + a
    assert ev.backward_us == pytest.approx(100 + 325 + 100)


def test_evaluate_by_hand_compute_first():
    prob = problem_of([(100, 4900), (200, 1000), (100, 800)])
    s1 = evaluate(prob, [Group(0, 0, 1000), Group(1, 2, 1000)]).stages[0]
    # D = 500 > g(300) = 400: compute ends first, delta_c = 0.2 of E = 255 remains exposed (10), (11)
    assert s1["overlap_us"] == pytest.approx(400.0)
    assert s1["residual_compute_us"] == 0.0
    assert s1["residual_comm_us"] == pytest.approx(0.2 * 255.0)
    assert s1["comm_end_us"] == pytest.approx(100 + 400 + 51)


def test_evaluate_by_hand_waits_for_next_gradients():
    prob = problem_of([(100, 900), (200, 400), (100, 200)])
    ev = evaluate(prob, [Group(0, 0, 1000), Group(1, 1, 1000), Group(2, 2, 1000)])
    s1, s2, s3 = ev.stages
    assert s1["residual_compute_us"] == pytest.approx(125.0)  # (13): 225 left, 100 of it is group 3's
    assert s2["comm_start_us"] == pytest.approx(100 + 100 + 125) and s2["remaining_compute_us"] == pytest.approx(100)
    assert s2["overlap_us"] == pytest.approx(50.0) and s2["residual_compute_us"] == pytest.approx(62.5)
    assert s3["residual_comm_us"] == pytest.approx(20.0)
    assert ev.backward_us == pytest.approx(100 + 225 + 112.5 + 20)


def test_zero_byte_group_and_single_node():
    prob = problem_of([(100, 900), (50, 0), (100, 100)])
    ev = evaluate(prob, [Group(0, 0, 1000), Group(1, 1, 1000), Group(2, 2, 1000)])
    assert ev.stages[1]["overlapped_comm_us"] == 0.0 and ev.stages[1]["residual_comm_us"] == 0.0
    solo = problem_of([(100, 900), (50, 300)], nodes=1)
    assert evaluate(solo, [Group(0, 0, 1000), Group(1, 1, 1000)]).backward_us == pytest.approx(150.0)


def simulate(problem: ThreadsProblem, groups) -> float:
    """Independent oracle: an event simulation with rates. While an all-reduce runs, compute progresses at
    kappa_r (uncontended us per us) and the all-reduce at 1/D of itself per us; alone, compute runs at 1
    and the all-reduce at 1/E. An all-reduce starts once its gradients exist and the previous one ended."""
    layers, p = problem.layers, problem.params
    total = math.fsum(layer.compute_us for layer in layers)
    t = done = 0.0
    for g in groups:
        ready = math.fsum(layer.compute_us for layer in layers[:g.last + 1])
        if done < ready:
            t, done = t + ready - done, ready
        d, e = (float(x) for x in comm_durations(problem, sum(x.grad_bytes for x in layers[g.first:g.last + 1]),
                                                  g.threads))
        if d == 0:
            continue
        kappa, progress = p.compute_rate(g.threads), 0.0
        if total - done > 0:
            overlap = min(d, (total - done) / kappa)
            t, done, progress = t + overlap, min(total, done + overlap * kappa), overlap / d
        t += (1 - progress) * e
    return max(t, total)


def random_problem(rng, L, threads=R6, params=None) -> ThreadsProblem:
    scale = 10 ** rng.uniform(4, 7.5)
    layers = [Layer(f"l{k}", float(rng.uniform(0, 2000) * (rng.random() > 0.1)),
                    int(rng.uniform(0, scale) * (rng.random() > 0.2))) for k in range(L)]
    if all(layer.grad_bytes == 0 for layer in layers):
        layers[-1] = Layer("last", layers[-1].compute_us, 1000)
    return ThreadsProblem(tuple(layers), int(rng.integers(1, 17)), float(rng.uniform(0, 50)), threads,
                          params or nice_params(), str(rng.choice(list(ALLREDUCE_COSTS))))


def random_plan(rng, L, threads):
    cuts = sorted(rng.choice(np.arange(1, L), int(rng.integers(0, L)), replace=False).tolist()) if L > 1 else []
    bounds = [0, *cuts, L]
    return [Group(bounds[n], bounds[n + 1] - 1, int(rng.choice(threads))) for n in range(len(bounds) - 1)]


def test_evaluate_matches_event_simulation_and_invariants():
    rng = np.random.default_rng(11)
    for _ in range(400):
        L = int(rng.integers(1, 12))
        prob = random_problem(rng, L)
        groups = random_plan(rng, L, (*R6, 300))  # 300 is not in R: evaluate takes any covered count
        ev = evaluate(prob, groups)
        assert ev.backward_us == pytest.approx(simulate(prob, groups), rel=1e-9, abs=1e-9)
        total = sum(layer.compute_us for layer in prob.layers)
        assert ev.backward_us >= total * (1 - 1e-12)  # kappa <= 1
        assert ev.stages[-1]["stage_end_us"] == ev.backward_us
        ready = 0.0
        for n, (g, s) in enumerate(zip(groups, ev.stages)):
            ready += sum(layer.compute_us for layer in prob.layers[g.first:g.last + 1])
            assert s["comm_start_us"] >= ready * (1 - 1e-12) - 1e-9  # gradients exist
            if n:
                assert s["comm_start_us"] >= ev.stages[n - 1]["comm_end_us"] * (1 - 1e-12) - 1e-9  # sequential
            assert s["residual_compute_us"] == 0.0 or s["residual_comm_us"] == 0.0

"""LIBRA's dynamic programs (mlopt.planners.threads.dp) and fusion baselines (baselines.py).

Tolerances. backward_us is evaluate()'s own number for the returned groups, so it must agree with a
re-evaluation exactly (1e-12 relative). The DP's value grid_us is the time of the same plan with every
all-reduce started at a chunk edge (the DP adds the algebraically equal W + D (1 - kappa) instead of
f_o + f_b, hence 1e-9 relative when comparing tables); evaluate() starts them as early as possible, so
  evaluate <= grid_us                  (Lemma 4: starting earlier never hurts)
  grid_us <= evaluate + (k - 1) w      (Lemma 3: each of the first k-1 starts moves by < w to its edge)
both under the paper's assumptions (model.assumption_violations() is empty for the parameters used).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np
import pytest

from mlopt.planners.threads import dp
from mlopt.planners.threads.baselines import (DEFAULT_THREADS, ddp_buckets, horovod, libra_m, mg_wfbp,
                                              single_bucket)
from mlopt.planners.threads.dp import brute_force, co_optimise, threads_for_fusion
from mlopt.planners.threads.model import (ContentionParams, Group, Layer, ThreadsProblem, _stage_parts_scalar,
                                          assumption_violations, comm_durations, evaluate)

from tests.planners.threads.test_model import R6, flat_params, nice_params, problem_of, random_plan

REL = 1e-9


def random_params(rng) -> ContentionParams:
    """Random fits that satisfy Theorem 1's assumptions (checked)."""
    while True:
        a1 = rng.uniform(0.8, 1.0)
        g1, d1 = rng.uniform(2000, 8000, 2)
        params = ContentionParams(alpha1=a1, alpha2=rng.uniform(0, (a1 - 0.2) / 4096), gamma1=g1,
                                  gamma2=rng.uniform(0, 0.95 * g1), gamma3=rng.uniform(0.01, 0.2), delta1=d1,
                                  delta2=rng.uniform(0, 0.95 * d1), delta3=rng.uniform(0.01, 0.2))
        probe = ThreadsProblem((Layer("x", 1.0, 1),), 2, 1.0, R6, params)
        if not assumption_violations(probe):
            return params


def random_problem(rng, L, J, params=None, threads=None) -> ThreadsProblem:
    scale = 10 ** rng.uniform(4, 7.5)  # from comm-light to comm-bound
    layers = [Layer(f"l{k}", float(rng.uniform(0, 2000) * (rng.random() > 0.1)),
                    int(rng.uniform(0, scale) * (rng.random() > 0.2))) for k in range(L)]
    if all(layer.grad_bytes == 0 for layer in layers):
        layers[-1] = Layer("last", layers[-1].compute_us, 1000)
    threads = threads or tuple(sorted(rng.choice(R6, J, replace=False).tolist()))
    return ThreadsProblem(tuple(layers), 8, float(rng.uniform(0, 50)), threads, params or random_params(rng))


def chunk_us(problem, Z) -> float:
    return sum(layer.compute_us for layer in problem.layers) / Z


def brute_force_threads(problem, fusion) -> float:
    return min(evaluate(problem, [Group(a, b, r) for (a, b), r in zip(fusion, rs)]).backward_us
               for rs in itertools.product(problem.thread_set, repeat=len(fusion)))


def check_consistent(problem, result, Z):
    """backward_us is evaluate()'s; evaluate <= grid_us <= evaluate + (k-1) w (Lemmas 4 and 3)."""
    assert evaluate(problem, result.groups).backward_us == pytest.approx(result.backward_us, rel=1e-12)
    assert all(g.threads in problem.thread_set for g in result.groups)
    tol = REL * result.backward_us
    assert result.backward_us <= result.grid_us + tol
    assert result.grid_us <= result.backward_us + (len(result.groups) - 1) * chunk_us(problem, Z) + tol


# ------------------------------------------------------------------------- the DP is eq. (17)/(23)


def naive_tables(problem, K, Z):
    """(23) literally: every (l', z', r) for every (i, l, z), h from eq. (18)-(19)."""
    grid = dp._grid(problem, Z)
    L = len(problem.layers)
    table = np.full((K + 1, L + 1, Z + 1), np.inf)
    table[0, 0] = np.arange(Z + 1) * grid.w
    durations = {(lp, l, r): tuple(float(x) for x in comm_durations(
        problem, int(grid.cum_bytes[l] - grid.cum_bytes[lp]), r))
        for lp, l, r in itertools.product(range(L + 1), range(L + 1), problem.thread_set) if lp < l}
    for i, l, z in itertools.product(range(1, K + 1), range(1, L + 1), range(Z + 1)):
        for lp, zp, r in itertools.product(range(l), range(int(grid.zlo[l]), z + 1), problem.thread_set):
            if not math.isfinite(table[i - 1, lp, zp]):
                continue
            d, e = durations[lp, l, r]
            f_o, f_b, f_c = _stage_parts_scalar((z - zp) * grid.w, problem.params.compute_rate(r), d, e)  # (18)
            if z < Z and f_c > 0:  # (19)
                continue
            table[i, l, z] = min(table[i, l, z], table[i - 1, lp, zp] + f_o + f_b + f_c)
    return table


def test_vectorised_dp_equals_literal_recursion():
    rng = np.random.default_rng(5)
    finite_states = 0
    for _ in range(20):
        L, K = int(rng.integers(3, 8)), int(rng.integers(2, 5))
        Z, J = int(rng.integers(10, 41)), int(rng.integers(1, 4))
        threads = tuple(sorted(rng.choice(R6, J, replace=False).tolist()))
        # compute-bound to comm-bound: a layer's all-reduce lasts ~0.1 to ~10 of its compute
        layers = tuple(Layer(f"l{k}", float(rng.uniform(100, 1000)), int(10 ** rng.uniform(4, 7))) for k in range(L))
        problem = ThreadsProblem(layers, 4, float(rng.uniform(0, 5)), threads, random_params(rng))
        K = min(K, L)
        fast = dp._co_tables(problem, K, dp._grid(problem, Z))[0]
        slow = naive_tables(problem, K, Z)
        assert np.array_equal(np.isfinite(fast), np.isfinite(slow))
        finite = np.isfinite(slow)
        finite_states += int(finite.sum())
        np.testing.assert_allclose(fast[finite], slow[finite], rtol=REL)
    assert finite_states > 1500  # states the DP can reach, all compared


def naive_fixed(problem, fusion, Z) -> float:
    """(16)-(19) literally for a fixed fusion: T(k, Z)."""
    grid = dp._grid(problem, Z)
    row = np.arange(Z + 1) * grid.w
    for first, last in fusion:
        new = np.full(Z + 1, np.inf)
        for z, zp, r in itertools.product(range(Z + 1), range(int(grid.zlo[last + 1]), Z + 1), problem.thread_set):
            if zp > z or not math.isfinite(row[zp]):
                continue
            d, e = (float(x) for x in comm_durations(problem, int(grid.cum_bytes[last + 1] - grid.cum_bytes[first]), r))
            f_o, f_b, f_c = _stage_parts_scalar((z - zp) * grid.w, problem.params.compute_rate(r), d, e)
            if z == Z or f_c == 0:
                new[z] = min(new[z], row[zp] + f_o + f_b + f_c)
        row = new
    return row[Z]


def test_fixed_fusion_dp_equals_literal_recursion():
    rng = np.random.default_rng(6)
    for _ in range(20):
        L = int(rng.integers(1, 8))
        problem = random_problem(rng, L, int(rng.integers(1, 4)))
        Z = int(rng.choice([1, 3, 10, 40]))
        fusion = [(g.first, g.last) for g in random_plan(rng, L, (1,))]
        result = threads_for_fusion(problem, fusion, Z)
        assert [(g.first, g.last) for g in result.groups] == fusion
        assert result.grid_us == pytest.approx(naive_fixed(problem, fusion, Z), rel=REL)


# ------------------------------------------------------------------------------ Theorem 1 checks


def test_threads_for_fusion_against_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(150):
        L = int(rng.integers(1, 7))
        problem = random_problem(rng, L, int(rng.integers(1, 4)))
        Z = int(rng.choice([1, 2, 3, 5, 10, 150]))
        fusion = [(g.first, g.last) for g in random_plan(rng, L, (1,))]
        result = threads_for_fusion(problem, fusion, Z)
        best = brute_force_threads(problem, fusion)
        check_consistent(problem, result, Z)
        assert result.bound_factor == 1 + (len(fusion) - 1) / Z
        assert best * (1 - 1e-12) <= result.backward_us <= result.bound_factor * best * (1 + 1e-12)
        polished = threads_for_fusion(problem, fusion, Z, polish=True)
        assert polished.backward_us <= result.backward_us


def test_co_optimise_against_brute_force():
    """brute force <= DP <= (1 + (K-1)/Z) brute force on L <= 6, |R| <= 3, K <= 3 (Theorem 1)."""
    rng = np.random.default_rng(8)
    used = 0.0
    for _ in range(400):
        L, J, K = int(rng.integers(1, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        Z = int(rng.choice([1, 2, 3, 5, 10, 30, 150]))
        problem = random_problem(rng, L, J)
        best = brute_force(problem, K)
        assert len(best.groups) <= K and evaluate(problem, best.groups).backward_us == best.backward_us
        for polish in (False, True):
            result = co_optimise(problem, K, Z, polish=polish)
            assert len(result.groups) <= K
            assert result.bound_factor == 1 + (min(K, L) - 1) / Z
            assert best.backward_us * (1 - 1e-12) <= result.backward_us
            assert result.backward_us <= result.bound_factor * best.backward_us * (1 + 1e-12)
            if not polish:
                check_consistent(problem, result, Z)
                if result.bound_factor > 1:
                    used = max(used, (result.backward_us / best.backward_us - 1) / (result.bound_factor - 1))
            else:
                assert result.backward_us <= result.grid_us * (1 + REL)
    assert used < 1.0


def test_bound_needs_assumption_2():
    """Overlap 6x faster than exposed comm (p < q): waiting for a chunk edge costs more than w (Lemma 3
    fails) and the DP misses the optimum by more than (K-1)/Z. Found by random search; kept as a record."""
    params = ContentionParams(alpha1=1.0, alpha2=0.1 / 1024, gamma1=6208.63391907, gamma2=0.0, gamma3=0.1,
                              delta1=979.41828558, delta2=0.0, delta3=0.1)
    layers = tuple(Layer(f"l{k}", b, c) for k, (b, c) in enumerate(
        [(744.9049425833283, 908787), (1419.836122232265, 1961340), (1669.38402167329, 1375331),
         (700.9771893059968, 345393)]))
    problem = ThreadsProblem(layers, 8, 9.28017459013465, (1024,), params)
    assert any("Assumption 2" in v for v in assumption_violations(problem))
    best = brute_force(problem, 3)
    result = co_optimise(problem, 3, 5, polish=False)
    assert result.backward_us > result.bound_factor * best.backward_us


def test_lemma_4_needs_assumption_3():
    """Overlapped comm 3x slower than exposed at kappa = 0.5: overlapping takes longer than running in
    series, so the as-early-as-possible start is slower than the DP's chunk-edge plan (evaluate > grid_us)."""
    params = ContentionParams(alpha1=0.5, alpha2=0.0, gamma1=1000.0, gamma2=0.0, gamma3=0.1,
                              delta1=3000.0, delta2=0.0, delta3=0.1)
    problem = ThreadsProblem((Layer("a", 1.5, 4_000_000), Layer("b", 8.5, 1000)), 2, 0.0, (256,), params)
    assert any("Assumption 3" in v for v in assumption_violations(problem))
    result = threads_for_fusion(problem, [(0, 0), (1, 1)], 10)
    assert result.backward_us > result.grid_us + 1.0


# ---------------------------------------------------------------------------------- edge cases


def test_edge_cases_match_brute_force():
    cases = [
        problem_of([(100, 900), (0, 0), (100, 800)], threads=(500, 1000)),  # zero compute, zero bytes
        problem_of([(0, 900), (0, 800)], threads=(1000,)),  # no compute at all
        problem_of([(100, 900), (50, 300)], nodes=1),  # no communication
        problem_of([(10, 10**9)], threads=(500, 1000)),  # one layer
    ]
    for problem in cases:
        for K, Z in ((1, 1), (2, 4), (3, 150)):
            best = brute_force(problem, K)
            result = co_optimise(problem, K, Z, polish=False)
            factor = 1 + (min(K, len(problem.layers)) - 1) / Z
            assert best.backward_us <= result.backward_us <= factor * best.backward_us * (1 + 1e-12)
    solo = cases[2]
    assert co_optimise(solo, 2, 10).backward_us == pytest.approx(150.0)


def test_errors():
    problem = problem_of([(10, 100), (10, 100)])
    for K in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="K"):
            co_optimise(problem, K, 10)
        with pytest.raises(ValueError, match="K"):
            brute_force(problem, K)
    for Z in (0, -3, 2.0):
        with pytest.raises(ValueError, match="Z"):
            co_optimise(problem, 2, Z)
        with pytest.raises(ValueError, match="Z"):
            threads_for_fusion(problem, [(0, 1)], Z)
    with pytest.raises(ValueError, match="start at layer 1"):
        threads_for_fusion(problem, [(0, 0), (0, 1)], 10)
    big = problem_of([(1, 1)] * 30, threads=(1000, 500, 250))
    with pytest.raises(ValueError, match="brute force would evaluate"):
        brute_force(big, 10)


# ------------------------------------------------------------------------------------ baselines


def test_baseline_fusions_by_hand():
    mib = 2**20
    problem = problem_of([(10, 0), (10, mib // 2), (10, mib // 2), (10, 20 * mib), (10, 10 * mib),
                          (10, 30 * mib), (10, 0), (10, 0)], threads=(512,), params=nice_params())
    assert single_bucket(problem, 512) == [Group(0, 7, 512)]
    # DDP: the first bucket closes once it reaches 1 MiB, later ones at 25 MiB (the crossing layer stays);
    # trailing layers without gradients are no bucket's, so they cannot delay the last all-reduce
    assert [(g.first, g.last) for g in ddp_buckets(problem, 512)] == [(0, 2), (3, 4), (5, 5), (6, 7)]
    assert [(g.first, g.last) for g in horovod(problem, 512, threshold_bytes=32 * mib)] == \
        [(0, 4), (5, 5), (6, 7)]
    assert [(g.first, g.last) for g in horovod(problem, 512)] == [(0, 5), (6, 7)]
    assert all(g.threads == 512 for g in ddp_buckets(problem, 512) + horovod(problem, 512))
    with pytest.raises(ValueError, match="r=20000"):
        single_bucket(dataclasses.replace(problem, params=nice_params(alpha2=1e-4)), 20000)


def test_mg_wfbp_merge_rule():
    # ring N=2, a = 100 us; q = c / 20 B/us (flat fit): tiny gradients merge, a long compute gap splits
    problem = problem_of([(10, 100), (10, 100), (10, 100), (5000, 20000), (10, 100)], alpha_us=50.0)
    groups = mg_wfbp(problem, 1000)
    # layer 1 is ready (t=20) before layer 0's all-reduce (start 10, 105 us) ends and the wait (10) < a: merge;
    # likewise layer 2; layer 3 is ready only at 5030, long after: the group closes at layer 2
    assert [(g.first, g.last) for g in groups] == [(0, 2), (3, 4)]
    assert all(g.threads == 1000 for g in groups)
    # with no startup cost and fast links nothing is worth merging
    free = problem_of([(10, 100)] * 4, alpha_us=0.0, params=flat_params(overlapped=1e6, exposed=1e6))
    assert len(mg_wfbp(free, 1000)) == 4


def test_libra_m_keeps_mg_wfbp_fusion_and_optimises_threads():
    rng = np.random.default_rng(9)
    for _ in range(20):
        problem = random_problem(rng, int(rng.integers(2, 12)), 0, threads=R6)
        mg = mg_wfbp(problem, DEFAULT_THREADS)
        lm = libra_m(problem, 150)
        assert [(g.first, g.last) for g in lm] == [(g.first, g.last) for g in mg]
        factor = 1 + (len(mg) - 1) / 150  # MG-N's plan is one LIBRA-M's DP searches (512 is in R)
        assert evaluate(problem, lm).backward_us <= factor * evaluate(problem, mg).backward_us * (1 + 1e-12)


def test_co_optimise_never_worse_than_baselines():
    """Random small instances, K = L and 512 in R, so every baseline plan is one co_optimise searches.
    Guaranteed (Theorem 1): within (1 + (K-1)/Z) of each; observed with the polish: never worse."""
    rng = np.random.default_rng(10)
    for _ in range(120):
        L = int(rng.integers(1, 9))
        problem = random_problem(rng, L, 0, threads=R6)
        Z = 150
        mib = 2**20
        plans = {"SE": single_bucket(problem, 512),
                 "DDP": ddp_buckets(problem, 512, cap_bytes=int(rng.uniform(0.1, 30) * mib),
                                    first_cap_bytes=int(rng.uniform(0.1, 3) * mib)),
                 "Horovod": horovod(problem, 512, int(rng.uniform(0.1, 100) * mib)),
                 "MG-WFBP": mg_wfbp(problem, 512), "LIBRA-M": libra_m(problem, Z)}
        raw = co_optimise(problem, L, Z, polish=False)
        result = co_optimise(problem, L, Z)
        for name, groups in plans.items():
            baseline = evaluate(problem, groups).backward_us
            assert raw.backward_us <= raw.bound_factor * baseline * (1 + 1e-12), name
            assert result.backward_us <= baseline * (1 + 1e-12), name


# ------------------------------------------------------------------------------------ speed


def test_speed_l160_k10_z150_r6():
    rng = np.random.default_rng(0)
    layers = tuple(Layer(f"l{k}", float(rng.uniform(50, 2000)), int(rng.integers(0, 3_000_000))) for k in range(160))
    problem = ThreadsProblem(layers, 8, 10.0, R6, nice_params())
    start = time.perf_counter()
    result = co_optimise(problem, 10, 150)
    elapsed = time.perf_counter() - start
    print(f"co_optimise L=160 K=10 Z=150 |R|=6: {elapsed:.2f} s, {len(result.groups)} groups")
    assert elapsed < 30.0  # the target is 10 s on 2 cores; measured ~1.5 s
    assert evaluate(problem, result.groups).backward_us == result.backward_us
    assert result.backward_us <= result.grid_us * (1 + REL)
    assert len(result.groups) <= 10
    for groups in (ddp_buckets(problem, 512), horovod(problem, 512), mg_wfbp(problem, 512), libra_m(problem, 150)):
        assert result.backward_us <= evaluate(problem, groups).backward_us

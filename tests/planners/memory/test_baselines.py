"""Baseline memory schedules (mlopt.planners.memory.baselines): all replay, and they order as they should."""

from __future__ import annotations

import pytest

from mlopt.planners.memory import baselines
from mlopt.planners.memory.build import build_problem
from mlopt.planners.memory.replay import replay
from mlopt.planners.memory.schedule import Schedule
from tests.planners.memory.test_build import mlp_trace, tiny_resnet_trace
from tests.planners.memory.test_replay import RECOMPUTE_ALL, STORE_ALL, chain3


@pytest.fixture(scope="module")
def problem():
    return build_problem(tiny_resnet_trace())


@pytest.fixture(scope="module")
def reference(problem):
    return replay(problem, baselines.store_all(problem))


def stored(schedule: Schedule) -> set[int]:
    return {f.node for f in schedule.forward if f.store}


# --------------------------------------------------------------------------------------- hand-solved chain


def test_chain_store_all_is_the_hand_schedule():
    assert baselines.store_all(chain3()) == STORE_ALL


def test_chain_least_memory_recomputes_everything():
    problem = chain3()
    schedule = baselines.least_memory(problem)
    assert schedule == RECOMPUTE_ALL
    assert replay(problem, schedule).peak_bytes == 1300


def test_chain_greedy():
    problem = chain3()
    assert baselines.greedy(problem, 1350) == STORE_ALL  # fits as it is
    fitted = baselines.greedy(problem, 1340)
    assert replay(problem, fitted).peak_bytes <= 1340
    assert baselines.greedy(problem, 1299) is None  # below the least memory of any schedule


def test_chain_schedule_from_stored_keeps_recomputed_values_only_on_request():
    problem = chain3()
    # Store nothing: stage 2 recomputes x0 and x1; x0 is needed again by stage 1.
    kept = baselines.schedule_from_stored(problem, set())
    assert kept.backward[0].recompute == ((0, "d"), (1, "d")) and kept.backward[0].keep == (0,)
    assert kept.backward[1].recompute == ()
    lean = baselines.schedule_from_stored(problem, set(), keep_recomputed=False)
    assert lean == RECOMPUTE_ALL
    assert replay(problem, kept).compute_us == 135.0 and replay(problem, lean).compute_us == 145.0


# --------------------------------------------------------------------------------------- traced tiny ResNet


def test_store_all_replays_like_pytorch(problem, reference):
    schedule = baselines.store_all(problem)
    assert all(not b.recompute for b in schedule.backward)
    assert all(f.impl == problem.nodes[f.node].forward[0].name for f in schedule.forward)
    needed = {d for n in problem.nodes if n.backward for d in n.backward[0].deps}
    assert stored(schedule) == needed
    live_at_end = stored(schedule) | set(problem.final_outputs)
    assert reference.forward_end_bytes == sum(problem.nodes[i].out_bytes for i in live_at_end)
    assert reference.recompute_us == 0.0
    # Everything runs once except the relu masks, which nobody stores here.
    computed = [n for n in problem.nodes if n.name != "mlopt::relu_mask"]
    assert reference.forward_us == pytest.approx(sum(n.forward[0].compute_us for n in computed))
    assert reference.backward_us == pytest.approx(sum(n.backward[0].compute_us for n in problem.nodes if n.backward))
    assert reference.peak_bytes == max(e.bytes for e in reference.timeline) == reference.peak_event.bytes


@pytest.mark.parametrize("make", [baselines.sqrt_segments, baselines.least_memory,
                                  lambda p: baselines.sqrt_segments(p, 2)])
def test_baselines_replay_below_store_all(problem, reference, make):
    r = replay(problem, make(problem))
    assert r.peak_bytes <= reference.peak_bytes
    assert r.forward_end_bytes < reference.forward_end_bytes
    assert r.recompute_us > 0


def test_least_memory_is_the_leanest(problem, reference):
    least = replay(problem, baselines.least_memory(problem)).peak_bytes
    sqrt = replay(problem, baselines.sqrt_segments(problem)).peak_bytes
    assert least <= sqrt < reference.peak_bytes


def test_sqrt_segments_cut_where_little_crosses(problem):
    ends = baselines.segment_ends(problem)
    assert ends[-1] == problem.n - 1 and ends == sorted(set(ends))
    assert len(ends) == round(problem.n ** 0.5)
    schedule = baselines.sqrt_segments(problem)
    assert stored(schedule) <= set(range(problem.n)) - baselines.unstorable(problem)


def test_greedy_respects_its_budget(problem, reference):
    least = replay(problem, baselines.least_memory(problem)).peak_bytes
    previous_compute = None
    for fraction in (1.0, 0.97, 0.94, 0.9, 0.85, 0.8):
        budget = int(fraction * reference.peak_bytes)
        schedule = baselines.greedy(problem, budget)
        if schedule is None:
            assert budget < least * 1.05  # gives up only near the least feasible budget
            continue
        r = replay(problem, schedule)
        assert r.peak_bytes <= budget
        if previous_compute is not None:
            assert r.compute_us >= previous_compute - 1e-6  # less memory never comes cheaper here
        previous_compute = r.compute_us
    assert baselines.greedy(problem, problem.constant_bytes) is None


def test_intermediate_activated_relu_stores_masks(problem):
    relus = [n.index for n in problem.nodes if n.name == "aten::relu_"]
    impls = {"backward": {i: "intermediate-activated" for i in relus}}
    schedule = baselines.schedule_from_stored(problem, baselines.needed_values(problem, impls), impls)
    masks = {i + 1 for i in relus}
    assert masks <= stored(schedule)
    r = replay(problem, schedule)
    assert r.recompute_us == 0.0
    assert r.forward_us > replay(problem, baselines.store_all(problem)).forward_us  # masks cost a little


def test_out_of_place_relu_when_its_input_is_stored(problem):
    relu = next(n for n in problem.nodes if n.name == "aten::relu_")
    schedule = baselines.schedule_from_stored(problem, baselines.needed_values(problem) | {relu.inplace_input})
    assert schedule.forward[relu.index].impl == "outofplace"
    replay(problem, schedule)


def test_mlp_baselines_replay():
    problem = build_problem(mlp_trace())
    reference = replay(problem, baselines.store_all(problem))
    lean = baselines.lean_impls(problem)
    lean_schedule = baselines.schedule_from_stored(problem, baselines.needed_values(problem, lean), lean)
    for schedule in (baselines.sqrt_segments(problem), baselines.least_memory(problem), lean_schedule):
        assert replay(problem, schedule).peak_bytes <= reference.peak_bytes

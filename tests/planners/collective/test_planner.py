"""The collective planner on every collective: the winner is proven, never beats the bound, and the plan says so."""

from __future__ import annotations

import pytest

from mlopt.formats.plan import PlanStatus
from mlopt.formats.topology import from_spec
from mlopt.planners.collective.planner import CollectiveOptions, default_sketches, plan_collective
from mlopt.planners.options import PlannerOptions
from mlopt.sim.symbolic import check_program

CASES = [(t, c) for t in ("ring:4", "switch:4", "ndv2") for c in
         ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce")]


@pytest.mark.parametrize("topology, collective", CASES)
def test_auto_plan_is_proven_and_bounded(topology, collective):
    topo = from_spec(topology)
    result = plan_collective(topo, CollectiveOptions(collective, 64 * 1024, root=1), PlannerOptions(time_limit_s=10),
                             inputs={"topology": topology})
    plan, payload = result.plan, result.plan.payload
    report = check_program(result.program)
    assert report.ok, report.summary()
    assert plan.objective == payload["predicted_time_us"] >= plan.best_bound * (1 - 1e-9)
    assert plan.gap == pytest.approx((plan.objective - plan.best_bound) / plan.objective)
    assert plan.status is PlanStatus.OPTIMAL if plan.gap <= 1e-4 else plan.status is not PlanStatus.OPTIMAL
    ok = [c for c in payload["candidates"] if c["ok"]]
    assert min(c["time_us"] for c in ok) == payload["predicted_time_us"], "the fastest proven candidate wins"
    assert all(c["reason"] for c in payload["candidates"] if not c["ok"]), "every failure says why"


def test_relay_sketches_follow_the_nics():
    (sketch, _), = default_sketches(from_spec("dgx2x2"))
    assert sketch.internode_conn == {k: (k - 1,) for k in range(1, 16, 2)}
    assert sketch.gpus_to_sender_rev_map[3] == (2, 3) and sketch.symmetry_offsets == ((2, 16), (16, 32))
    (ndv2, _), = default_sketches(from_spec("ndv2x2"))
    assert ndv2.internode_conn == {0: (1,)} and ndv2.symmetry_offsets == ((8, 16),)
    assert default_sketches(from_spec("ndv2")) == []


def test_node_limit_reaches_the_taccl_stages_and_repeats_the_plan():
    """A node limit stops TACCL's MILP stages at the same point on every run: the same plan twice (a stage
    stopped by a wall-clock limit would record a bound that depends on the machine's load)."""
    topo = from_spec("ndv2")
    copts = CollectiveOptions("alltoall", 64 * 1024, algorithm="taccl")
    plans = [plan_collective(topo, copts, PlannerOptions(node_limit=1), inputs={"topology": "ndv2"}).plan
             for _ in range(2)]
    stages = plans[0].payload["synthesis"]["stages"]
    assert any(s["status"] != "optimal" for s in stages), "one node cannot prove this alltoall optimal"
    assert plans[0].to_dict() == plans[1].to_dict()


def test_a_program_declares_in_place_only_when_the_checker_proves_it():
    from mlopt.planners.collective.baselines import ring
    from mlopt.planners.collective.lowering import lower
    from mlopt.planners.collective.planner import declare_proven_modes
    from mlopt.sim.collectives import CollectiveSpec

    def lowered(collective: str, n: int):
        return lower(ring(from_spec(f"fully-connected:{n}"), CollectiveSpec(collective, n, 1), channels=1))

    allreduce = declare_proven_modes(lowered("allreduce", 4))
    assert (allreduce.inplace, allreduce.outofplace) == (True, True)
    assert check_program(allreduce, inplace=True).ok and check_program(allreduce, inplace=False).ok
    alltoall = lowered("alltoall", 4)  # the ring overwrites blocks it has yet to send: wrong in place
    assert not check_program(alltoall, inplace=True).ok
    assert declare_proven_modes(alltoall) == alltoall

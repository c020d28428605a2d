"""The memory replay (mlopt.planners.memory.replay): hand-solved peaks and compute, and every kind of
schedule it must reject, on tiny hand-made problems."""

from __future__ import annotations

import pytest

from mlopt.planners.memory.problem import BackwardImpl, ForwardImpl, MemoryProblem, Node
from mlopt.planners.memory.replay import MemoryEvent, ScheduleError, replay
from mlopt.planners.memory.schedule import BackwardStage, ForwardStep, Schedule

CONST = 1000


def chain3() -> MemoryProblem:
    """x0 = f0(batch) -> x1 = f1(x0) -> x2 = f2(x1) (the loss). backward_k reads its input x_{k-1}."""
    return MemoryProblem(
        name="chain3",
        nodes=(
            Node(0, 10, "f0", 100, (), (ForwardImpl("d", 10.0),), (BackwardImpl("d", 20.0, 0, ()),),
                 y_bytes=10, grad_live_bytes=7),
            Node(1, 11, "f1", 200, (0,), (ForwardImpl("d", 20.0),), (BackwardImpl("d", 40.0, 0, (0,)),),
                 y_bytes=20, grad_live_bytes=5),
            Node(2, 12, "f2", 50, (1,), (ForwardImpl("d", 5.0),), (BackwardImpl("d", 10.0, 0, (1,)),),
                 y_bytes=30, grad_live_bytes=0),
        ),
        constant_bytes=CONST,
        final_outputs=(2,),
    )


def schedule(stores, stages) -> Schedule:
    """stores: store flag per node (default impl "d"); stages: (k, recompute nodes, keep) in execution order."""
    return Schedule(
        tuple(ForwardStep(i, "d", s) for i, s in enumerate(stores)),
        tuple(BackwardStage(k, "d", tuple((i, "d") for i in rec), tuple(keep)) for k, rec, keep in stages),
    )


STORE_ALL = schedule([True, True, False], [(2, (), (0,)), (1, (), ()), (0, (), ())])
RECOMPUTE_ALL = schedule([False, False, False], [(2, (0, 1), ()), (1, (0,), ()), (0, (), ())])


def test_store_all_by_hand():
    r = replay(chain3(), STORE_ALL)
    # forward: 1000+100, 1000+100+200, 1000+300+50; stage 2: x2 freed on entry, 1000+0+30+(100+200);
    # stage 1: 1000+5+20+100; stage 0: 1000+7+10.
    assert [e.bytes for e in r.timeline] == [1100, 1300, 1350, 1330, 1125, 1017]
    assert r.peak_bytes == 1350
    assert r.peak_event == MemoryEvent("forward", None, 2, 1350)
    assert r.forward_end_bytes == 350
    assert (r.forward_us, r.recompute_us, r.backward_us, r.compute_us) == (35.0, 0.0, 70.0, 105.0)


def test_recompute_everything_by_hand():
    r = replay(chain3(), RECOMPUTE_ALL)
    # forward frees x0 after f1 and x1 after f2; stage 2 recomputes x0 (1100) and x1 (1000+100+200),
    # frees x0, runs backward (1000+30+200); stage 1 recomputes x0 (1000+5+100), backward 1000+5+20+100.
    assert [(e.phase, e.stage, e.node, e.bytes) for e in r.timeline] == [
        ("forward", None, 0, 1100), ("forward", None, 1, 1300), ("forward", None, 2, 1250),
        ("recompute", 2, 0, 1100), ("recompute", 2, 1, 1300), ("backward", 2, 2, 1230),
        ("recompute", 1, 0, 1105), ("backward", 1, 1, 1125), ("backward", 0, 0, 1017),
    ]
    assert r.peak_bytes == 1300 and r.peak_event.phase == "forward"  # first of the two 1300s
    assert r.forward_end_bytes == 50  # only the loss
    assert (r.recompute_us, r.compute_us) == (40.0, 145.0)


def test_recomputing_a_live_value_counts_one_copy():
    # x0 is kept into stage 1 and recomputed there anyway: the kept copy is dropped on entry.
    s = schedule([True, True, False], [(2, (), (0,)), (1, (0,), ()), (0, (), ())])
    r = replay(chain3(), s)
    assert [e.bytes for e in r.timeline if e.stage == 1] == [1105, 1125]
    assert r.recompute_us == 10.0


def test_unread_leaf_is_computed_only_when_stored():
    problem = chain3()
    leaf = Node(3, 13, "mlopt::relu_mask", 40, (2,), (ForwardImpl("d", 1.0),), intermediate_of=2)
    problem = MemoryProblem("p", problem.nodes + (leaf,), CONST, final_outputs=(2,))
    plain = Schedule(STORE_ALL.forward + (ForwardStep(3, "d", False),),
                     (BackwardStage(3, "", (), (0, 1)),) + STORE_ALL.backward)
    assert replay(problem, plain).forward_us == 35.0
    stored = Schedule(STORE_ALL.forward + (ForwardStep(3, "d", True),),
                      (BackwardStage(3, "", (), (0, 1)),) + STORE_ALL.backward)
    r = replay(problem, stored)
    assert r.forward_us == 36.0 and r.forward_end_bytes == 390
    assert MemoryEvent("forward", None, 3, 1390) in r.timeline


# --------------------------------------------------------------------------------------- rejections


def inplace_problem() -> MemoryProblem:
    """x0 -> relu (x1, may overwrite x0) -> x2; backward 1 reads x1 (output-activated), 2 reads x1."""
    return MemoryProblem(
        name="inplace",
        nodes=(
            Node(0, 1, "aten::convolution", 100, (), (ForwardImpl("d", 1.0),), (BackwardImpl("d", 1.0, 0, ()),)),
            Node(1, 2, "aten::relu_", 100, (0,), (ForwardImpl("inplace", 1.0, 0, True), ForwardImpl("outofplace", 1.0)),
                 (BackwardImpl("d", 1.0, 0, (1,)),), inplace_input=0),
            Node(2, 3, "aten::sum", 4, (1,), (ForwardImpl("d", 1.0),), (BackwardImpl("d", 1.0, 0, (1,)),)),
        ),
        constant_bytes=0,
        final_outputs=(2,),
    )


def inplace_schedule(store0=False, rec_impl="inplace", keep1=(1,), rec=()):
    return Schedule(
        (ForwardStep(0, "d", store0), ForwardStep(1, "inplace", True), ForwardStep(2, "d", False)),
        (BackwardStage(2, "d", rec, keep1), BackwardStage(1, "d", (), ()), BackwardStage(0, "d", (), ())),
    )


def test_inplace_saves_the_output_bytes():
    r = replay(inplace_problem(), inplace_schedule())
    assert [e.bytes for e in r.timeline[:2]] == [100, 100]  # relu_ adds nothing over x0


@pytest.mark.parametrize(
    ("problem", "bad", "message"),
    [
        (chain3(), schedule([True, False, False], [(2, (), (0,)), (1, (), ()), (0, (), ())]),
         r"backward stage 2 \(op 12 backward of f2, impl 'd'\): needs x_1 \(op 11 f1\) which is not live"),
        (chain3(), schedule([False, False, False], [(2, (1,), ()), (1, (0,), ()), (0, (), ())]),
         r"backward stage 2: recomputation of node 1 \(op 11 f1, impl 'd'\): needs x_0 \(op 10 f0\) which is not live"),
        (chain3(), schedule([True, True, False], [(2, (), (0,)), (1, (), (2,)), (0, (), ())]),
         r"backward stage 1 \(op 11 backward of f1\): keeps x_2 \(op 12 f2\) which is not live in the stage \(4\.7\)"),
        (chain3(), Schedule(STORE_ALL.forward[:2] + (ForwardStep(2, "fast", False),), STORE_ALL.backward),
         r"forward node 2 \(op 12 f2, impl 'fast'\): no such implementation \(known: 'd'\)"),
        (chain3(), Schedule(STORE_ALL.forward, (BackwardStage(2, "x", (), (0,)),) + STORE_ALL.backward[1:]),
         r"backward stage 2 .*impl 'x'.*no such implementation"),
        (chain3(), Schedule(STORE_ALL.forward, STORE_ALL.backward[::-1]),
         r"backward stage 0 \(in execution order\) is node 0, expected node 2"),
        (chain3(), Schedule(STORE_ALL.forward[:2], STORE_ALL.backward), r"2 forward steps, the problem has 3 nodes"),
        (chain3(), schedule([True, True, False], [(2, (1, 0), (0,)), (1, (), ()), (0, (), ())]),
         r"increasing order"),
        (inplace_problem(), inplace_schedule(store0=True),
         r"forward node 1 \(op 2 aten::relu_, impl 'inplace'\): cannot overwrite x_0 \(op 1 aten::convolution\) "
         r"in place: it is stored"),
        (inplace_problem(), inplace_schedule(rec=((0, "d"), (1, "inplace")), keep1=(0, 1)),
         r"recomputation of node 1 .*cannot overwrite x_0 .* in place: it is kept"),
    ],
)
def test_rejections(problem, bad, message):
    with pytest.raises(ScheduleError, match=message):
        replay(problem, bad)


def test_recomputed_inplace_is_fine_when_nothing_else_needs_it():
    r = replay(inplace_problem(), inplace_schedule(rec=((0, "d"), (1, "inplace"))))
    assert r.recompute_us == 2.0


def test_intermediate_needs_its_creator_in_the_stage():
    base = chain3()
    mask = Node(3, 13, "mlopt::relu_mask", 40, (2,), (ForwardImpl("d", 1.0),), intermediate_of=2)
    problem = MemoryProblem("p", base.nodes + (mask,), CONST, final_outputs=(2,))
    bad = Schedule(STORE_ALL.forward + (ForwardStep(3, "d", False),),
                   (BackwardStage(3, "", ((3, "d"),), (0, 1)),) + STORE_ALL.backward)
    with pytest.raises(ScheduleError, match=r"intermediate of x_2 \(op 12 f2\) is recomputed only together with it"):
        replay(problem, bad)


def test_stage_without_backward_takes_no_impl():
    base = chain3()
    leaf = Node(3, 13, "leaf", 40, (2,), (ForwardImpl("d", 1.0),))
    problem = MemoryProblem("p", base.nodes + (leaf,), CONST, final_outputs=(2,))
    bad = Schedule(STORE_ALL.forward + (ForwardStep(3, "d", False),),
                   (BackwardStage(3, "d", (), (0, 1)),) + STORE_ALL.backward)
    with pytest.raises(ScheduleError, match=r"has no backward work"):
        replay(problem, bad)


def test_error_is_a_value_error_with_location():
    with pytest.raises(ValueError) as error:
        replay(chain3(), schedule([True, False, False], [(2, (), (0,)), (1, (), ()), (0, (), ())]))
    assert (error.value.phase, error.value.stage, error.value.node) == ("backward", 2, 2)


def test_schedule_round_trips_through_dict():
    problem = chain3()
    again = Schedule.from_dict(RECOMPUTE_ALL.to_dict(problem))
    assert again == RECOMPUTE_ALL
    assert replay(problem, again) == replay(problem, RECOMPUTE_ALL)

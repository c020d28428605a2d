"""Collective-permute ("permute", XLA's collective-permute) in the Syndicate planner: motifs, verifier, timing."""

import pytest

from mlopt.formats.topology import from_spec
from mlopt.planners.schedule import motifs as M
from mlopt.planners.schedule.motifs import CommOp, Motif, implements
from mlopt.planners.schedule.optsched import optsched
from mlopt.planners.schedule.problem import motif_candidates
from mlopt.sim.collective_algorithms import transfer_time
from mlopt.sim.network import Message

RING8 = tuple((i, (i + 1) % 8) for i in range(8))  # 0->1->...->7->0: pairs 3->4 and 7->0 cross nodes of 4


@pytest.fixture(scope="module")
def ndv2x2():
    return from_spec("ndv2x2")


@pytest.fixture(scope="module")
def dgx2x2():
    return from_spec("dgx2x2")


def test_pairs_are_checked():
    with pytest.raises(ValueError, match="non-empty"):
        CommOp("permute", 8, (0, 1))
    with pytest.raises(ValueError, match="to itself"):
        CommOp("permute", 8, (0, 1), pairs=((0, 0),))
    with pytest.raises(ValueError, match="destination of pairs 0 and 1"):
        CommOp("permute", 8, (0, 1, 2), pairs=((0, 2), (1, 2)))
    with pytest.raises(ValueError, match="outside"):
        CommOp("permute", 8, (0, 1), pairs=((0, 5),))
    with pytest.raises(ValueError, match="only a permute has pairs"):
        CommOp("allreduce", 8, (0, 1), pairs=((0, 1),))


@pytest.mark.parametrize("build", [
    lambda op: [M.as_motif(op)],
    lambda op: M.segment(op, 4, 4),
    lambda op: M.spline(op, 4),
    lambda op: M.spline(op, 2),
    lambda op: M.segment_then_spline(op, 2, 4, align=4),
])
def test_decompositions_implement_the_permute(build):
    op = CommOp("permute", 64, tuple(range(8)), pairs=RING8)
    assert implements(op, build(op)) == []


def test_spline_separates_pairs_inside_and_across_groups():
    op = CommOp("permute", 64, tuple(range(8)), pairs=RING8)
    inside, across = M.spline(op, 4)
    assert set(inside.pattern) == set(RING8) - {(3, 4), (7, 0)}
    assert set(across.pattern) == {(3, 4), (7, 0)}
    assert inside.deps == () and across.deps == ()  # parallel


def test_verifier_catches_wrong_permutes():
    op = CommOp("permute", 64, tuple(range(8)), pairs=RING8)
    inside, _ = M.spline(op, 4)
    assert any("rank 4" in e for e in implements(op, [inside]))  # a missing part: rank 4 gets nothing
    wrong = Motif("permute", op.ranks, (((0, 64),),), pattern=tuple((d, s) for s, d in RING8))
    assert any("not the op's" in e for e in implements(op, [wrong]))
    half = Motif("permute", op.ranks, (((0, 32),),), pattern=RING8)
    assert implements(op, [half])  # the upper half of every destination is not moved
    assert any("pattern" in e for e in implements(op, [Motif("permute", op.ranks, (((0, 64),),))]))


def test_partial_permutation_leaves_non_destinations_undefined():
    op = CommOp("permute", 16, (0, 1, 2, 3), pairs=((0, 2), (1, 3)))
    assert implements(op, M.spline(op, 2)) == []  # ranks 0 and 1 receive nothing: any output is fine


def test_candidates_implement_and_time_the_permute(dgx2x2):
    op = CommOp("permute", 4 << 20, tuple(range(32)), pairs=tuple((i, (i + 1) % 32) for i in range(32)))
    cands = motif_candidates(op, dgx2x2)
    labels = [c.plan.label for c in cands]
    assert labels[0] == "default" and "spline16" in labels and "seg2" in labels
    for c in cands:
        assert implements(op, list(c.motifs)) == [], c.plan.label
    default = cands[0].plan.motifs[0]
    messages = [Message(s, d, float(op.nbytes)) for s, d in op.pairs]
    assert default.duration_us == pytest.approx(transfer_time(messages, dgx2x2, mode="aware"))
    assert default.channels == frozenset({"nvswitch", "ib"})
    spline = cands[labels.index("spline16")]
    assert [sorted(run.channels) for run in spline.plan.motifs] == [["nvswitch"], ["ib"]]
    assert spline.plan.motifs[0].duration_us < default.duration_us  # NVSwitch pairs alone beat waiting for IB


def test_a_pair_without_a_link_is_named(ndv2x2):
    from mlopt.errors import InputError

    op = CommOp("permute", 1024, tuple(range(16)), pairs=((3, 4), (4, 3)))  # NDv2's cube mesh lacks 3-4
    with pytest.raises(InputError, match="permute pair 3->4"):
        motif_candidates(op, ndv2x2)


def test_schedule_problem_builds_permute_tasks(ndv2x2):
    from mlopt.sim.workload import WorkItem, Workload

    pairs = tuple((i, (i + 8) % 16) for i in range(16))  # every rank to its peer on the other node
    items = (WorkItem(0, "stage fwd", "compute", duration_us=100.0),
             WorkItem(1, "send activations", "comm", collective="permute", nbytes=1 << 20, group=tuple(range(16)),
                      deps=(0,), pairs=pairs),
             WorkItem(2, "next stage", "compute", duration_us=100.0, deps=(1,)))
    from mlopt.planners.schedule.problem import schedule_problem

    p = schedule_problem(Workload("pp", 16, items), ndv2x2)
    assert p.ops[1].collective == "permute" and p.ops[1].pairs == pairs
    assert all(implements(p.ops[1], [m for run in parts for m in run]) == [] for parts in p.decompositions[1])
    assert optsched(p).makespan_us > 200.0

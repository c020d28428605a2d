"""Syndicate motifs (App. A.1): every decomposition implements its collective; broken ones are caught."""

from dataclasses import replace

import pytest

from mlopt.planners.schedule.motifs import (
    COLLECTIVES,
    ROOTED,
    CommOp,
    Motif,
    compose,
    group_spline_alltoall,
    hierarchical_allreduce,
    implements,
    ring_allreduce,
    ring_allreduce_motif,
    segment,
    segment_motif,
    segment_then_spline,
    spline,
    spline_motif,
    tree_allreduce,
)

CASES = [
    (c, size, n) for c in COLLECTIVES for size in range(2, 9) for n in range(1, size + 1) if size % n == 0
]


def make(collective, size, per_rank=12, root_pos=-1):
    ranks = tuple(range(100, 100 + 3 * size, 3))  # non-contiguous ids: positions, not ids, matter
    root = ranks[root_pos] if collective in ROOTED else None
    # permute: every position sends to the next one (a rotation, so splining has pairs inside and across groups)
    pairs = tuple((ranks[i], ranks[(i + 1) % size]) for i in range(size)) if collective == "permute" else None
    return CommOp(collective, per_rank * size, ranks, root, pairs=pairs)


@pytest.mark.parametrize("collective,size,n", CASES)
def test_spline_and_composition_implement_the_collective(collective, size, n):
    op = make(collective, size)
    assert implements(op, spline(op, n)) == []
    assert implements(op, segment_then_spline(op, 2, n)) == []
    if collective == "allreduce":
        assert implements(op, spline(op, n, recursive=True)) == []


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_segment_implements_the_collective(collective, d):
    for size in (2, 3, 4, 8):
        op = make(collective, size, per_rank=10)  # 10 bytes per block: d = 3 gives uneven pieces
        motifs = segment(op, d)
        assert len(motifs) == d
        assert all(m.collective == collective and m.ranks == op.ranks and not m.deps for m in motifs)
        assert implements(op, motifs) == []


@pytest.mark.parametrize("size", range(1, 9))
def test_ring_and_tree_allreduce(size):
    op = make("allreduce", size, per_rank=8)
    ring = ring_allreduce(op)
    assert [m.collective for m in ring] == ["reducescatter", "allgather"]
    assert ring[1].deps == (0,)
    assert implements(op, ring) == []
    for n in (x for x in range(1, size + 1) if size % x == 0):
        assert implements(op, tree_allreduce(op, n)) == []
        assert implements(op, tree_allreduce(op, n, recursive=False)) == []


def test_tree_allreduce_follows_appendix_form():
    op = CommOp("allreduce", 64, tuple(range(6)))
    motifs = tree_allreduce(op, 2, recursive=False)
    shape = [(m.stage, m.collective, m.ranks, m.root) for m in motifs]
    assert shape == [
        (0, "reduce", (0, 1), 0),
        (0, "reduce", (2, 3), 2),
        (0, "reduce", (4, 5), 4),
        (1, "allreduce", (0, 2, 4), None),
        (2, "broadcast", (0, 1), 0),
        (2, "broadcast", (2, 3), 2),
        (2, "broadcast", (4, 5), 4),
    ]
    deep = tree_allreduce(CommOp("allreduce", 64, tuple(range(8))), 2)
    assert [m.collective for m in deep if m.stage == 2] == ["allreduce"]
    assert deep[[m.collective for m in deep].index("allreduce")].ranks == (0, 4)


def test_splined_alltoall_windows():
    size, n = 8, 2
    op = CommOp("alltoall", 8 * size, tuple(range(size)))
    motifs = spline(op, n)
    assert len(motifs) == size // n and all(m.stage == 0 for m in motifs)
    for c, m in enumerate(motifs):
        assert set(m.pattern) == {(i, (i + c * n + t) % size) for i in range(size) for t in range(n)}
    pairs = [p for m in motifs for p in m.pattern]
    assert len(pairs) == len(set(pairs)) == size * size


def test_splined_broadcast_and_reduce_shapes():
    bc = spline(CommOp("broadcast", 16, (0, 1, 2, 3), root=2), 2)
    assert [(m.ranks, m.root) for m in bc] == [((0, 1, 2), 2), ((2, 3), 2)]
    re = spline(CommOp("reduce", 16, (0, 1, 2, 3, 4, 5), root=3), 3)
    assert [(m.stage, m.ranks, m.root) for m in re] == [(0, (0, 1, 2), 0), (0, (3, 4, 5), 3), (1, (0, 3), 3)]


def test_compose_ring_after_segment_keeps_outer_order():
    op = make("allreduce", 4, per_rank=8)
    motifs = compose(op, lambda m: segment_motif(m, 2), ring_allreduce_motif)
    assert [m.collective for m in motifs] == ["reducescatter", "allgather"] * 2
    assert [m.stage for m in motifs] == [0, 1, 0, 1]
    assert implements(op, motifs) == []
    steps = (lambda m: spline_motif(m, 2), lambda m: segment_motif(m, 2), lambda m: spline_motif(m, 1))
    twice = compose(op, *steps)
    assert implements(op, twice) == []


# ------------------------------------------------------------------------------ broken decompositions


def test_wrong_order_is_caught():
    op = make("allreduce", 4)
    rs, ag = ring_allreduce(op)
    assert implements(op, [replace(ag, deps=()), replace(rs, deps=(0,))])


def test_missing_stage_is_caught():
    op = make("allreduce", 4)
    motifs = tree_allreduce(op, 2, recursive=False)
    assert implements(op, [m for m in motifs if m.collective != "broadcast"])
    aa = make("alltoall", 4)
    assert implements(aa, spline(aa, 2)[:-1])
    ag = make("allgather", 4)
    assert implements(ag, spline(ag, 2)[:-1])


def test_wrong_slice_is_caught():
    op = make("allreduce", 4)
    pieces = segment(op, 2)
    (off, length), = pieces[1].regions[0]
    shifted = replace(pieces[1], regions=(((off - 1, length),),))
    assert implements(op, [pieces[0], shifted])
    aa = make("alltoall", 4)
    a, b = segment(aa, 2)
    assert implements(aa, [a, replace(b, regions=b.regions[1:] + b.regions[:1])])


def test_double_reduction_is_caught():
    op = make("allreduce", 4)
    motifs = tree_allreduce(op, 2, recursive=False)
    middle = next(i for i, m in enumerate(motifs) if m.collective == "allreduce")
    doubled = motifs[: middle + 1] + [replace(motifs[middle], deps=(middle,))]
    bcs = [replace(m, deps=(len(doubled) - 1,)) for m in motifs[middle + 1 :]]
    errors = implements(op, doubled + bcs)
    assert errors and "expected" in errors[0]


def test_race_cycle_and_foreign_ranks_are_caught():
    op = make("allreduce", 4)
    motifs = tree_allreduce(op, 2, recursive=False)
    assert any("race" in e for e in implements(op, [replace(m, deps=()) for m in motifs]))
    cyc = [replace(motifs[0], deps=(1,)), replace(motifs[1], deps=(0,))]
    assert implements(op, cyc) == ["motif deps are not an acyclic graph over the list"]
    alien = Motif("allreduce", op.ranks + (999,), (((0, op.nbytes),),))
    assert any("not in the op's ranks" in e for e in implements(op, [alien]))
    outside = Motif("allreduce", op.ranks, (((0, op.nbytes + 1),),))
    assert any("outside" in e for e in implements(op, [outside]))


# ------------------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: CommOp("gather", 8, (0, 1)), "unknown collective"),
        (lambda: CommOp("alltoall", 9, (0, 1)), "not divisible"),
        (lambda: CommOp("allreduce", 8, (0, 0)), "distinct"),
        (lambda: CommOp("allreduce", 0, (0, 1)), "positive"),
        (lambda: CommOp("broadcast", 8, (0, 1), root=5), "root 5"),
        (lambda: CommOp("allreduce", 8, (0, 1), root=0), "takes no root"),
        (lambda: spline(CommOp("allreduce", 8, (0, 1, 2)), 2), "does not divide"),
        (lambda: spline(CommOp("alltoall", 12, (0, 1, 2)), 0), "positive int"),
        (lambda: segment(CommOp("allreduce", 4, (0, 1)), 5), "non-empty pieces"),
        (lambda: segment(CommOp("allreduce", 4, (0, 1)), 0), "positive int"),
        (lambda: ring_allreduce(CommOp("allreduce", 10, (0, 1, 2))), "equal blocks"),
        (lambda: ring_allreduce_motif(segment(CommOp("alltoall", 8, (0, 1)), 1)[0]), "expected a allreduce"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("size,n", [(4, 2), (8, 2), (8, 4), (6, 3), (16, 8)])
def test_hierarchical_allreduce_and_group_spline_implement_the_op(size, n):
    op = make("allreduce", size, per_rank=n * 4)
    motifs = hierarchical_allreduce(op, n)
    assert implements(op, motifs) == []
    assert [m.collective for m in motifs] == (["reducescatter"] * (size // n) + ["allreduce"] * n
                                              + ["allgather"] * (size // n))
    assert implements(op, [m for m in motifs if m.collective != "allgather"])  # without the AG it is not one
    a2a = make("alltoall", size, per_rank=4)
    parts = group_spline_alltoall(a2a, n)
    assert implements(a2a, parts) == [] and len(parts) == size // n
    group = {r: i // n for i, r in enumerate(a2a.ranks)}
    assert all(group[a] == group[b] for a, b in parts[0].pattern)  # motif 0 stays inside the groups
    assert all(group[a] != group[b] for m in parts[1:] for a, b in m.pattern)
    assert implements(a2a, parts[1:])  # the inside-group pairs are missing then

import pytest

from mlopt.errors import InputError
from mlopt.formats.topology import Link, Node, Topology, from_spec
from mlopt.planners.schedule.motifs import CommOp, implements
from mlopt.planners.schedule.optsched import ScheduleProblem, Task, optsched
from mlopt.planners.schedule.problem import MAX_OPTIONS, channels_of, motif_candidates, motif_options, schedule_problem
from mlopt.planners.schedule.search import fifo_default, mcmc
from mlopt.sim.collective_algorithms import collective_time
from mlopt.sim.workload import parse_workload_spec


@pytest.fixture(scope="module")
def dgx():
    return from_spec("dgx2x2")


@pytest.fixture(scope="module")
def dp_problem(dgx):
    w = parse_workload_spec("dp:ranks=16,layers=4,bytes=64MiB,iterations=2")
    return schedule_problem(w, dgx)


@pytest.mark.parametrize("spec,classes", [("ndv2x2", {"nvlink", "ib"}), ("dgx2x2", {"nvswitch", "ib"})])
def test_channels_of_presets(spec, classes):
    topo = from_spec(spec)
    ch = channels_of(topo)
    assert set(ch) == classes
    assert sum(len(t.links) for t in ch.values()) == len(topo.links)
    for cls, sub in ch.items():
        assert {l.link_class for l in sub.links} == {cls}
        assert sub.nodes == topo.nodes
        sw = {s.name for s in sub.switches}
        nics = {n.name for n in sub.nics}
        for l in sub.links:
            assert l.switch is None or l.switch in sw
            assert l.src_nic is None or l.src_nic in nics
            assert l.dst_nic is None or l.dst_nic in nics
    # ib only joins different nodes in both presets
    node = topo.node_of()
    assert all(node[l.src] != node[l.dst] for l in ch["ib"].links)


@pytest.mark.parametrize("spec", ["ndv2x2", "dgx2x2"])
@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter", "broadcast"])
def test_candidates_implement_the_op(spec, collective):
    topo = from_spec(spec)
    n = topo.num_ranks
    op = CommOp(collective, 64 * n * 4, tuple(range(n)))
    cands = motif_candidates(op, topo)
    assert cands[0].plan.label == "default" and len(cands[0].plan.motifs) == 1
    assert 2 <= len(cands) <= MAX_OPTIONS
    labels = [c.plan.label for c in cands]
    assert len(set(labels)) == len(labels)
    for c in cands:
        assert len(c.parts) == len(c.plan.motifs)
        assert implements(op, list(c.motifs)) == [], c.plan.label
        first = [sum(len(p) for p in c.parts[:r]) for r in range(len(c.parts))]  # flat index of each run
        run_of = {first[r] + k: r for r, part in enumerate(c.parts) for k in range(len(part))}
        for r, (run, part) in enumerate(zip(c.plan.motifs, c.parts)):
            assert run.channels and run.duration_us >= 0
            assert set(run.deps) == {run_of[d] for m in part for d in m.deps}  # run deps = its motifs' deps
            ranks = [x for m in part for x in m.ranks]
            assert len(ranks) == len(set(ranks))  # a run's motifs are on disjoint ranks
    assert motif_options(op, topo) == tuple(c.plan for c in cands)  # deterministic


def test_default_is_ring_on_whole_topology(dgx):
    op = CommOp("allreduce", 64 << 20, tuple(range(32)))
    plans = motif_options(op, dgx)
    # NCCL's rings across nodes: 16 rings (one per GPU of a node), ring k each node's run rotated by k, each
    # carrying 1/16 of the payload at once; faster than one ring that crosses between nodes on one NIC pair
    single = collective_time("allreduce", "ring", op.ranks, op.nbytes, dgx).time_us
    rotated = [tuple(r for base in (0, 16) for r in [base + (k + i) % 16 for i in range(16)]) for k in range(16)]
    multi = max(collective_time("allreduce", "ring", ring, op.nbytes / 16, dgx).time_us for ring in rotated)
    assert multi < single
    assert plans[0].motifs[0].duration_us == pytest.approx(multi)
    assert plans[0].motifs[0].channels == frozenset({"nvswitch", "ib"})
    # an intra-node op holds only the intra-node channel
    intra = motif_options(CommOp("allreduce", 64 << 20, tuple(range(8))), dgx)
    assert intra[0].motifs[0].channels == frozenset({"nvswitch"})
    # the node-splined tree puts the leaders' all-reduce on ib alone and the rest on nvswitch
    # (the two per-node reduces run together, as do the two broadcasts)
    spl = next(p for p in plans if p.label == "spline16")
    assert [sorted(m.channels) for m in spl.motifs] == [["nvswitch"], ["ib"], ["nvswitch"]]
    # the 2-D all-reduce: RS in every node, 16 across-node all-reduces of 1/16 of the buffer on ib, AG
    hier = next(p for p in plans if p.label == "hierAR16")
    assert [sorted(m.channels) for m in hier.motifs] == [["nvswitch"], ["ib"], ["nvswitch"]]


def test_ndv2_default_falls_back_when_ring_lacks_links():
    topo = from_spec("ndv2x2")  # hybrid cube-mesh: no nvlink 3->4, so the ring 0..15 cannot run
    with pytest.raises(InputError):
        collective_time("allreduce", "ring", tuple(range(16)), 1 << 20, topo)
    plans = motif_options(CommOp("allreduce", 1 << 20, tuple(range(16))), topo)
    assert plans[0].motifs[0].duration_us > 0


def _two_class_topology():
    """1 node of 4 ranks (so NCCL-style rings per GPU pair across nodes do not apply); every ordered pair has
    BOTH an nvlink and an ib link. validate_topology rejects
    two links on one pair, so no preset has this: it is the only way two single channels can each carry
    a group alone (in the presets ib links only join different nodes and nvlink/nvswitch only the same node)."""
    nodes = (Node("n0", (0, 1, 2, 3)),)
    links = tuple(Link(a, b, 5.0, 1000.0 / bw, cls) for cls, bw in (("nvlink", 100.0), ("ib", 100.0))
                  for a in range(4) for b in range(4) if a != b)
    return Topology("twoclass", nodes, links)


def test_segments_over_two_channels_beat_default():
    topo = _two_class_topology()
    op = CommOp("allreduce", 256 << 20, (0, 1, 2, 3))
    cands = motif_candidates(op, topo)
    two = next(c for c in cands if c.plan.label == "seg2@ib+nvlink")
    assert implements(op, list(two.motifs)) == []
    assert [m.channels for m in two.plan.motifs] == [frozenset({"ib"}), frozenset({"nvlink"})]
    plans = tuple(c.plan for c in cands)
    k = plans.index(two.plan)
    prob = ScheduleProblem((Task(0, "comm", 0.0, ()),), {0: plans}, ("ib", "nvlink"))
    base = optsched(prob, {0: 0}).makespan_us
    split = optsched(prob, {0: k}).makespan_us
    assert split < 0.6 * base


def test_schedule_problem_dp_workload(dp_problem):
    p = dp_problem
    assert set(p.channels) == {"ib", "nvswitch"}
    comm = [t for t in p.tasks if t.kind == "comm"]
    assert comm and all(t.id in p.options and len(p.options[t.id]) >= 2 for t in comm)
    assert len({id(p.options[t.id]) for t in comm}) == 1  # memoised: one gradient size and group
    s = optsched(p)
    assert s.makespan_us > 0
    fifo = fifo_default(p)
    res = mcmc(p, budget_s=60, seed=0, max_steps=50, stop_on_stagnation=False)
    assert res.makespan_us <= fifo.makespan_us + 1e-6


def test_single_rank_group_is_zero_compute(dgx):
    from mlopt.sim.workload import WorkItem, Workload

    w = Workload("w", 1, (WorkItem(0, "c", "compute", duration_us=5.0),
                          WorkItem(1, "ar", "comm", collective="allreduce", nbytes=1024, group=(3,), deps=(0,))))
    p = schedule_problem(w, dgx)
    assert p.tasks[1].kind == "compute" and p.tasks[1].duration_us == 0.0 and not p.options


def test_group_beyond_topology_names_the_rank():
    w = parse_workload_spec("dp:ranks=16,layers=2,bytes=1MiB")
    with pytest.raises(InputError) as e:
        schedule_problem(w, from_spec("ndv2"), source="w.json")
    assert "rank 8" in str(e.value) and e.value.file == "w.json"

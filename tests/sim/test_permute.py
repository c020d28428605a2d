"""Collective-permute ("permute", XLA's collective-permute) in the trace, the workload and the simulator:
trace pairs (group positions) and their validation, from_trace's mapping to global ranks, permute timing
(all pairs' messages at once, fair sharing), the iteration simulator and schedule-plan motifs."""

from __future__ import annotations

import json

import pytest

from mlopt.errors import InputError
from mlopt.formats.topology import preset
from mlopt.formats.trace import CommSpec, Implementation, ModelTrace, Op, ProcessGroup, Tensor, load_trace, save_trace
from mlopt.sim.collective_algorithms import MODES, permute_messages, permute_time, transfer_time
from mlopt.planners.workload_plans import with_schedule_plan
from mlopt.sim.evaluate import EvaluateOptions, evaluate, make_timer
from mlopt.sim.network import Message
from mlopt.sim.workload import WorkItem, Workload, from_trace

MiB = 2**20
GROUP = (4, 5, 6, 7)  # ranks that are not 0..n-1, so positions and ranks differ
RING_POSITIONS = ((0, 1), (1, 2), (2, 3), (3, 0))  # a pipeline's shift by one stage


def permute_trace(pairs=RING_POSITIONS, nbytes: int = MiB) -> ModelTrace:
    """x -> stage compute -> y -> permute over group "pp" (ranks 4..7) -> z -> next stage's compute."""
    tensors = (Tensor(0, nbytes, "input"), Tensor(1, nbytes), Tensor(2, nbytes), Tensor(3, nbytes))
    ops = (
        Op(0, "aten::mm", "forward", (0,), (1,), (Implementation("default", 10.0),)),
        Op(1, "xla::collective_permute", "comm", (1,), (2,), comm=CommSpec("permute", nbytes, "pp", pairs)),
        Op(2, "aten::relu", "forward", (2,), (3,), (Implementation("default", 5.0),)),
    )
    return ModelTrace("pipe", ops, tensors, (ProcessGroup("pp", GROUP),), rank=4, world_size=8)


# ---------------------------------------------------------------------------------------------------------
# Trace


def test_trace_round_trip_keeps_the_pairs(tmp_path):
    trace = permute_trace()
    save_trace(trace, tmp_path / "t.json")
    again = load_trace(tmp_path / "t.json")
    assert again == trace and again.ops[1].comm.pairs == RING_POSITIONS
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["ops"][1]["comm"]["pairs"] == [list(p) for p in RING_POSITIONS]


def test_other_collectives_write_no_pairs():
    assert CommSpec("allreduce", 8, "0").to_dict() == {"collective": "allreduce", "bytes": 8, "group": "0"}


def _with_comm(**changes):
    d = permute_trace().to_dict()
    d["ops"][1]["comm"].update(changes)
    return d


def _without_pairs():
    d = permute_trace().to_dict()
    del d["ops"][1]["comm"]["pairs"]
    return d


@pytest.mark.parametrize(
    "doc, fragment",
    [
        (_without_pairs(), "a permute needs its (source, destination) pairs"),
        (_with_comm(collective="allreduce"), "only a permute has pairs, not a allreduce"),
        (_with_comm(pairs=[[0, 4]]), "position 4 outside the group (the group has 4 ranks: 0..3)"),
        (_with_comm(pairs=[[-1, 2]]), "position -1 outside the group"),
        (_with_comm(pairs=[[0, 1], [0, 2]]), "position 0 is the source of pairs 0 and 1"),
        (_with_comm(pairs=[[0, 2], [1, 2]]), "position 2 is the destination of pairs 0 and 1"),
        (_with_comm(pairs=[[1, 1]]), "sends position 1 to itself"),
        (_with_comm(pairs=[[0, 1, 2]]), "pair 0 is"),
        (_with_comm(pairs=[0, 1]), "pair 0 is 0"),
        (_with_comm(pairs=[["0", 1]]), "expected [source, destination]"),
        (_with_comm(pairs=[[True, 1]]), "expected [source, destination]"),
        (_with_comm(pairs=[[0.0, 1]]), "expected [source, destination]"),
        (_with_comm(pairs=5), "expected array"),
    ],
)
def test_bad_pairs_name_the_file_and_field(doc, fragment):
    with pytest.raises(InputError) as info:
        ModelTrace.from_dict(doc, "t.json")
    assert info.value.file == "t.json"
    assert info.value.field == "$.ops[1].comm.pairs", info.value
    assert fragment in info.value.message, info.value.message


def test_bad_pairs_in_a_file_exit_with_the_path(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with_comm(pairs=[[0, 9]])))
    with pytest.raises(InputError) as info:
        load_trace(path)
    assert info.value.exit_code == 2
    assert str(info.value).startswith(f"{path}: $.ops[1].comm.pairs: op 1 (xla::collective_permute)")


def test_positions_are_only_checked_for_sign_without_process_groups():
    d = _with_comm(pairs=[[0, 9]])
    d["process_groups"] = []
    assert ModelTrace.from_dict(d, "t.json").ops[1].comm.pairs == ((0, 9),)


# ---------------------------------------------------------------------------------------------------------
# Workload


def test_from_trace_maps_group_positions_to_global_ranks():
    w = from_trace(permute_trace(), source="t.json")
    item = w.items[1]
    assert (item.collective, item.nbytes, item.group) == ("permute", MiB, GROUP)
    assert item.pairs == ((4, 5), (5, 6), (6, 7), (7, 4))
    assert item.to_dict()["pairs"] == [[4, 5], [5, 6], [6, 7], [7, 4]]
    assert "pairs" not in w.items[0].to_dict()  # other items' dicts are unchanged
    assert w.items[2].deps == (1,)


def test_from_trace_checks_pairs_of_a_trace_built_in_memory():
    trace = permute_trace(pairs=((0, 1), (3, 5)))  # never validated: built, not loaded
    with pytest.raises(InputError) as info:
        from_trace(trace, source="t.json")
    assert info.value.field == "$.ops[1].comm.pairs" and "position 5 outside the group" in info.value.message


# ---------------------------------------------------------------------------------------------------------
# Timing


def test_permute_time_is_the_transfer_time_of_its_messages_and_grows_with_bytes():
    topo = preset("dgx-a100", 2)
    pairs = ((0, 8), (8, 1), (1, 9), (9, 0))
    messages = [Message(s, d, 4 * MiB) for s, d in pairs]
    want = transfer_time(messages, topo, mode="aware")
    for mode in MODES:  # fair sharing in every mode: the sends are simultaneous
        timing = permute_time(pairs, 4 * MiB, topo, mode=mode)
        assert timing.time_us == pytest.approx(want, rel=1e-12)
        assert (timing.algorithm, timing.messages, timing.bytes_sent) == ("direct", 4, 16.0 * MiB)
    assert permute_messages(pairs, 4 * MiB) == [Message(s, d, 4.0 * MiB, label="permute direct") for s, d in pairs]
    times = [permute_time(pairs, n, topo).time_us for n in (MiB, 4 * MiB, 16 * MiB)]
    assert 0 < times[0] < times[1] < times[2]
    assert permute_time((), MiB, topo).time_us == 0.0


def test_crossing_nodes_is_slower_than_staying_inside_one():
    topo = preset("dgx-a100", 2)  # ranks 0..7 on node0, 8..15 on node1; NVSwitch inside, IB across
    inside = permute_time(((0, 1), (1, 2), (2, 0)), 8 * MiB, topo).time_us
    across = permute_time(((0, 8), (8, 1), (1, 0)), 8 * MiB, topo).time_us
    assert 0 < inside < across


def test_sends_behind_one_nic_share_it():
    topo = preset("ndv2", 2)  # one NIC per node, shared by its 8 GPUs
    alone = permute_time(((0, 8),), 8 * MiB, topo, mode="unaware").time_us
    shared = permute_time(((0, 8), (1, 9)), 8 * MiB, topo, mode="unaware").time_us
    assert shared > 1.5 * alone


@pytest.mark.parametrize("pairs", [((0, 0),), ((0, 1), (0, 2)), ((0, 2), (1, 2)), ((-1, 2),)])
def test_permute_time_rejects_pairs_that_are_no_permutation(pairs):
    with pytest.raises(ValueError, match="permute pair"):
        permute_time(pairs, MiB, preset("dgx-a100"))


def test_collective_time_points_permutes_to_permute_time():
    from mlopt.sim.collective_algorithms import collective_time

    with pytest.raises(ValueError, match="permute_time"):
        collective_time("permute", "ring", range(4), MiB, preset("dgx-a100"))


# ---------------------------------------------------------------------------------------------------------
# Iteration simulator


def test_simulating_a_traced_permute_gives_its_time():
    topo = preset("dgx-a100")
    report = evaluate(from_trace(permute_trace(), source="t.json"), topo, EvaluateOptions(), source="t.json")
    comm = [t for t in report.items if t.kind == "comm"]
    want = permute_time(((4, 5), (5, 6), (6, 7), (7, 4)), MiB, topo).time_us
    assert len(comm) == 1 and comm[0].algorithm == "direct" and comm[0].collective == "permute"
    assert report.comm_us == pytest.approx(want, abs=1e-3) and report.comm_us > 0
    assert report.iteration_time_us == pytest.approx(15 + want, abs=1e-3)


def test_the_timer_tells_permutes_apart_by_their_pairs():
    """Same collective, bytes and group, different pairs: two timer calls, two times (the memo key has pairs)."""
    topo = preset("dgx-a100", 2)
    group = tuple(range(16))
    items = (
        WorkItem(0, "inside", "comm", collective="permute", nbytes=8 * MiB, group=group, pairs=((0, 1), (1, 0))),
        WorkItem(1, "across", "comm", collective="permute", nbytes=8 * MiB, group=group, pairs=((0, 8), (8, 0)),
                 deps=(0,)),
    )
    report = evaluate(Workload("two", 16, items, carry=()), topo, EvaluateOptions())
    inside, across = (t.duration_us for t in report.items)
    assert 0 < inside < across
    timer = make_timer(topo, EvaluateOptions())
    assert timer(items[1])[0] == pytest.approx(across, abs=1e-3)
    assert timer(WorkItem(2, "empty", "comm", collective="permute", nbytes=MiB, group=group)) == (0.0, "none")


def test_cli_simulate_runs_a_trace_with_a_permute(run_cli, tmp_path):
    path = tmp_path / "pipe.json"
    save_trace(permute_trace(), path)
    result = run_cli("simulate", "--model", path, "--topology", "dgx-a100", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    rows = report["collectives"]
    assert [(r["collective"], r["bytes"], r["group_size"], r["algorithm"]) for r in rows] == \
        [("permute", MiB, 4, "direct")]
    assert report["comm_us"] > 0


def test_schedule_plan_permute_motifs_become_permute_items():
    w = from_trace(permute_trace(), source="t.json")
    motif = {"collective": "permute", "ranks": list(GROUP), "regions": [[[0, MiB]]], "seq": 0}
    payload = {"options": {"iterations": 1}, "comm_ops": [{
        "id": 1, "name": "xla::collective_permute", "iteration": 0,
        "motifs": [{**motif, "name": "inside", "pattern": [[4, 5], [6, 7]]},
                   {**motif, "name": "wrap", "pattern": [[5, 6], [7, 4]], "seq": 1, "deps": [0]}],
    }]}
    planned, order = with_schedule_plan(w, payload, "plan.json")
    made = [it for it in planned.items if it.kind == "comm"]
    assert [(it.collective, it.nbytes, it.group, it.pairs) for it in made] == [
        ("permute", MiB, GROUP, ((4, 5), (6, 7))),
        ("permute", MiB, GROUP, ((5, 6), (7, 4))),
    ]
    assert made[1].deps == (made[0].id,) and order == (made[0].id, made[1].id)
    report = evaluate(planned, preset("dgx-a100"), EvaluateOptions(), order=order)
    assert all(t.duration_us > 0 for t in report.items if t.kind == "comm")

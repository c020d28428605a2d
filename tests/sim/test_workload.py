"""Workload layer of the training simulator: synthetic loops (item counts, deps, groups, loop-carried edges),
chaining, workload specs, and import of the 2-rank DDP example trace."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlopt.errors import InputError
from mlopt.formats.trace import CommSpec, Implementation, ModelTrace, ProcessGroup
from mlopt.sim.workload import (
    WorkItem,
    Workload,
    chain,
    data_parallel,
    from_trace,
    fsdp,
    hybrid_parallel,
    model_parallel,
    parse_workload_spec,
)
from tests.conftest import REPO


def by_name(w: Workload) -> dict[tuple[str, int], WorkItem]:
    return {(it.name, it.iteration): it for it in w.items}


def names(w: Workload, ids) -> set[str]:
    items = {it.id: it for it in w.items}
    return {items[i].name for i in ids}


def ancestors(w: Workload, item_id: int) -> set[int]:
    items = {it.id: it for it in w.items}
    seen, todo = set(), [item_id]
    while todo:
        for d in items[todo.pop()].deps:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


# ---------------------------------------------------------------------------------------------------------
# Synthetic loops


def test_data_parallel_items_deps_and_groups():
    w = data_parallel(3, 4, 10, 20, 1000)
    assert [it.name for it in w.items] == [
        "forward layer0", "forward layer1", "forward layer2",
        "backward layer2", "allreduce layer2", "backward layer1", "allreduce layer1",
        "backward layer0", "allreduce layer0"]
    assert [it.id for it in w.items] == list(range(9))
    items = by_name(w)
    for i in range(3):
        ar = items[(f"allreduce layer{i}", 0)]
        assert ar.kind == "comm" and ar.collective == "allreduce" and ar.nbytes == 1000
        assert ar.group == (0, 1, 2, 3) and ar.layer == f"layer{i}" and ar.phase == "comm"
        assert names(w, ar.deps) == {f"backward layer{i}"}  # only its backward: overlaps the rest
    assert names(w, items[("backward layer1", 0)].deps) == {"backward layer2"}  # not the allreduce
    assert names(w, items[("backward layer2", 0)].deps) == {"forward layer2"}
    assert items[("forward layer0", 0)].duration_us == 10 and items[("backward layer0", 0)].duration_us == 20
    assert {(w.items[a].name, w.items[b].name) for a, b in w.carry} == {
        (f"allreduce layer{i}", f"forward layer{i}") for i in range(3)}


def test_data_parallel_chained_next_forward_waits_for_its_layers_allreduce():
    w = data_parallel(3, 4, 10, 20, 1000, iterations=2)
    assert len(w.items) == 18 and w.iterations == 2 and [it.id for it in w.items] == list(range(18))
    items = by_name(w)
    assert names(w, items[("forward layer0", 1)].deps) == {"allreduce layer0"}
    assert {w.items[d].iteration for d in items[("forward layer0", 1)].deps} == {0}
    assert names(w, items[("forward layer2", 1)].deps) == {"forward layer1", "allreduce layer2"}
    assert items[("allreduce layer1", 1)].deps == (items[("backward layer1", 1)].id,)


def test_model_parallel_collectives_block_the_next_layer():
    w = model_parallel(2, 8, 10, 20, 4096)
    assert [it.name for it in w.items] == [
        "forward layer0", "allgather layer0", "forward layer1", "allgather layer1",
        "backward layer1", "reducescatter layer1", "backward layer0", "reducescatter layer0"]
    items = by_name(w)
    assert names(w, items[("forward layer1", 0)].deps) == {"allgather layer0"}
    assert names(w, items[("backward layer1", 0)].deps) == {"allgather layer1"}
    assert names(w, items[("backward layer0", 0)].deps) == {"reducescatter layer1", "backward layer1"}
    assert all(it.group == tuple(range(8)) and it.nbytes == 4096 for it in w.comm_items())


def test_model_parallel_weight_gradient_overlaps_the_reducescatter():
    w = model_parallel(2, 8, 10, 20, 4096, weight_grad_us=5)
    items = by_name(w)
    wg = items[("weight_grad layer1", 0)]
    assert wg.duration_us == 5 and wg.phase == "weight_grad" and names(w, wg.deps) == {"backward layer1"}
    assert names(w, items[("backward layer0", 0)].deps) == {"reducescatter layer1", "weight_grad layer1"}
    assert len(w.items) == 10


def test_hybrid_groups_are_consecutive_for_mp_and_strided_for_dp():
    w = hybrid_parallel(2, 8, 2, 4, 10, 20, 4096, 1 << 20)
    mp = [it for it in w.comm_items() if it.collective in ("allgather", "reducescatter")]
    dp = [it for it in w.comm_items() if it.collective == "allreduce"]
    assert len(mp) == 4 and len(dp) == 2 and len(w.items) == 2 + 2 + 2 + 2 + 2
    assert all(it.group == (0, 1, 2, 3) and it.nbytes == 4096 for it in mp)
    assert all(it.group == (0, 4) and it.nbytes == 1 << 20 for it in dp)
    items = by_name(w)
    assert names(w, items[("allreduce (dp) layer1", 0)].deps) == {"backward layer1"}
    assert names(w, items[("backward layer0", 0)].deps) == {"reducescatter (mp) layer1", "backward layer1"}
    with pytest.raises(ValueError, match="dp \\* mp == world"):
        hybrid_parallel(2, 8, 3, 2, 10, 20, 1, 1)


def test_hybrid_with_one_model_parallel_rank_has_only_data_parallel_allreduces():
    w = hybrid_parallel(2, 4, 4, 1, 10, 20, 4096, 1 << 20)
    assert [it.collective for it in w.comm_items()] == ["allreduce", "allreduce"]
    assert all(it.group == (0, 1, 2, 3) for it in w.comm_items())


def test_fsdp_prefetchable_allgathers_and_overlapping_reducescatters():
    w = fsdp(2, 4, 10, 20, 2048)
    assert [it.name for it in w.items] == [
        "allgather (fwd) layer0", "forward layer0", "allgather (fwd) layer1", "forward layer1",
        "allgather (bwd) layer1", "backward layer1", "reducescatter layer1",
        "allgather (bwd) layer0", "backward layer0", "reducescatter layer0"]
    items = by_name(w)
    assert items[("allgather (fwd) layer0", 0)].deps == ()
    assert names(w, items[("allgather (fwd) layer1", 0)].deps) == {"allgather (fwd) layer0"}
    assert names(w, items[("allgather (bwd) layer1", 0)].deps) == {"allgather (fwd) layer1"}
    assert names(w, items[("allgather (bwd) layer0", 0)].deps) == {"allgather (bwd) layer1"}
    assert names(w, items[("forward layer1", 0)].deps) == {"forward layer0", "allgather (fwd) layer1"}
    assert names(w, items[("reducescatter layer1", 0)].deps) == {"backward layer1"}
    assert {(w.items[a].name, w.items[b].name) for a, b in w.carry} == {
        ("reducescatter layer0", "allgather (fwd) layer0"), ("reducescatter layer1", "allgather (fwd) layer1")}


def test_single_rank_loops_have_no_collectives():
    for w in (data_parallel(3, 1, 1, 2, 8, iterations=2), model_parallel(3, 1, 1, 2, 8), fsdp(3, 1, 1, 2, 8)):
        assert not w.comm_items()
        assert all(it.kind == "compute" for it in w.items)


@pytest.mark.parametrize("call", [
    lambda: data_parallel(0, 4, 1, 1, 1), lambda: data_parallel(2, 0, 1, 1, 1),
    lambda: data_parallel(2, 4, -1, 1, 1), lambda: model_parallel(2, 4, 1, float("nan"), 1),
    lambda: fsdp(2, 4, 1, 1, 1, iterations=0),
])
def test_bad_loop_arguments(call):
    with pytest.raises(ValueError):
        call()


# ---------------------------------------------------------------------------------------------------------
# Chaining


def test_chain_without_carry_puts_a_barrier_between_iterations():
    items = (WorkItem(0, "a", "compute", 1.0), WorkItem(1, "c", "comm", collective="allreduce", nbytes=8,
                                                          group=(0, 1), deps=(0,)),
             WorkItem(2, "b", "compute", 1.0))
    w = chain(Workload("x", 2, items), 2)
    assert [it.id for it in w.items] == [0, 1, 2, 3, 4, 5]
    # roots of iteration 1 (a, b) wait for the sinks of iteration 0 (c, b)
    assert set(w.items[3].deps) == {1, 2} and set(w.items[5].deps) == {1, 2}
    assert w.items[4].deps == (3,)


def test_chain_with_empty_carry_links_only_through_the_compute_stream():
    items = (WorkItem(0, "a", "compute", 1.0), WorkItem(1, "b", "compute", 1.0, deps=(0,)))
    w = chain(Workload("x", 1, items, carry=()), 3)
    assert [it.deps for it in w.items] == [(), (0,), (), (2,), (), (4,)]
    assert [it.iteration for it in w.items] == [0, 0, 1, 1, 2, 2]


def test_chain_rejects_chained_workloads_and_bad_counts():
    w = data_parallel(2, 2, 1, 1, 8, iterations=2)
    with pytest.raises(ValueError, match="several iterations"):
        chain(w, 2)
    with pytest.raises(ValueError, match="positive integer"):
        chain(data_parallel(2, 2, 1, 1, 8), 0)
    assert chain(data_parallel(2, 2, 1, 1, 8), 1) == data_parallel(2, 2, 1, 1, 8)


# ---------------------------------------------------------------------------------------------------------
# Specs


def test_parse_workload_spec_builds_the_same_loops():
    assert parse_workload_spec("dp:ranks=1024,layers=50,fwd_us=100,bwd_us=200,bytes=4MiB,iterations=2") == \
        data_parallel(50, 1024, 100, 200, 4 << 20, 2)
    assert parse_workload_spec("mp:ranks=8,layers=3,fwd_us=1,bwd_us=2.5,bytes=1KiB,wg_us=1") == \
        model_parallel(3, 8, 1, 2.5, 1024, weight_grad_us=1)
    assert parse_workload_spec("hybrid:dp=2,mp=4,layers=2,fwd_us=1,bwd_us=2,bytes=1MiB,act_bytes=4096") == \
        hybrid_parallel(2, 8, 2, 4, 1, 2, 4096, 1 << 20)
    assert parse_workload_spec(" FSDP : ranks=4, layers=2, fwd_us=1, bwd_us=2, bytes=64 ") == fsdp(2, 4, 1, 2, 64)
    # compute times default to 100 us forward, twice that backward
    assert parse_workload_spec("dp:ranks=8,layers=2,bytes=1MiB") == data_parallel(2, 8, 100, 200, 1 << 20)
    assert parse_workload_spec("dp:ranks=8,layers=2,bytes=1MiB,fwd_us=7") == data_parallel(2, 8, 7, 14, 1 << 20)


@pytest.mark.parametrize("spec, message", [
    ("pp:ranks=2,layers=1,fwd_us=1,bwd_us=1,bytes=1", "KIND one of dp, mp, hybrid, fsdp"),
    ("dp ranks=2", "KIND one of"),
    ("dp:ranks=2,layers=1,fwd_us=1,bwd_us=1", "missing bytes="),
    ("dp:layers=1,bytes=1", "missing ranks="),
    ("dp:ranks=2,layers=1,fwd_us=1,bwd_us=1,bytes=4XB", "bytes: '4XB' is not a size"),
    ("dp:ranks=2,layers=1,fwd_us=1,bwd_us=1,bytes=4,wg_us=1", "unknown key 'wg_us' for dp"),
    ("dp:ranks=0,layers=1,fwd_us=1,bwd_us=1,bytes=4", "ranks='0' is not a positive integer"),
    ("dp:ranks=2,layers=1,fwd_us=-1,bwd_us=1,bytes=4", "fwd_us='-1' is not a time"),
    ("dp:ranks=2,ranks=3,layers=1,fwd_us=1,bwd_us=1,bytes=4", "'ranks' given twice"),
    ("dp:ranks=2,layers,fwd_us=1,bwd_us=1,bytes=4", "'layers' is not key=value"),
    ("hybrid:ranks=6,dp=2,mp=4,layers=1,fwd_us=1,bwd_us=1,bytes=4", "ranks=6 but dp \\* mp = 8"),
])
def test_parse_workload_spec_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_workload_spec(spec)


# ---------------------------------------------------------------------------------------------------------
# From the DDP example trace (2 ranks, gloo, 2 gradient buckets, 2 bucket-rebuild broadcasts)


@pytest.fixture(scope="module")
def ddp_trace() -> ModelTrace:
    from mlopt.trace_sources import make_trace

    ex = REPO / "examples" / "ddp_mlp"
    return make_trace(str(ex / "rank0.et.json.gz"), kineto=str(ex / "rank0.kineto.json.gz"))


def _op_item(w: Workload, op_id: int, iteration: int = 0) -> WorkItem:
    return next(it for it in w.items if it.source_op == op_id and it.iteration == iteration)


def test_from_trace_ddp_allreduces_and_compute(ddp_trace):
    w = from_trace(ddp_trace)
    assert w.world_size == 2 and len(w.items) == len(ddp_trace.ops)
    allreduces = [it for it in w.comm_items() if it.collective == "allreduce"]
    assert sorted(it.nbytes for it in allreduces) == [1_052_672, 4_460_800]
    assert all(it.group == (0, 1) for it in w.comm_items()) and len(w.comm_items()) == 4
    ops = {op.id: op for op in ddp_trace.ops}
    for it in w.items:
        if it.kind == "compute":
            assert it.duration_us == ops[it.source_op].compute_us and it.phase == ops[it.source_op].role
    # bucket 1's allreduce (op 294) waits for the AccumulateGrad that last wrote the bucket (op 279) ...
    ar = _op_item(w, 294)
    assert {w.items[d].source_op for d in ar.deps} == {279}
    # ... and the bucket's copy back into the gradients waits for the allreduce
    assert ar.id in _op_item(w, 367).deps
    # the next backward op does not wait for it (overlap)
    assert ar.id not in ancestors(w, _op_item(w, 296).id)


def test_from_trace_chained_next_forward_waits_for_optimizer_and_allreduces(ddp_trace):
    w = from_trace(ddp_trace, 2)
    assert len(w.items) == 2 * len(ddp_trace.ops)
    ar_small, ar_big = _op_item(w, 357, 0).id, _op_item(w, 294, 0).id  # buckets: first layer; the two others
    first_linear = _op_item(w, 54, 1)
    assert _op_item(w, 384, 0).id in first_linear.deps  # the SGD update of its weight ...
    before = ancestors(w, first_linear.id)
    assert ar_small in before and ar_big not in before  # ... which waits for its bucket's allreduce only
    assert ar_big in ancestors(w, _op_item(w, 76, 1).id)  # the second linear layer waits for the other bucket
    assert _op_item(w, 386, 0).id in _op_item(w, 76, 1).deps


def test_from_trace_without_compute_time_names_the_op(ddp_trace):
    i, op = next((i, op) for i, op in enumerate(ddp_trace.ops) if op.id == 54)
    ops = list(ddp_trace.ops)
    ops[i] = replace(op, implementations=(Implementation("default", None),))
    with pytest.raises(InputError) as err:
        from_trace(replace(ddp_trace, ops=tuple(ops)), source="t.json")
    assert err.value.file == "t.json" and err.value.field == f"$.ops[{i}].implementations[0].compute_us"
    assert "op 54 (aten::linear) has no measured compute_us" in err.value.message
    assert "mlopt profile operators" in err.value.message


def test_from_trace_unknown_group_names_op_and_group(ddp_trace):
    i, op = next((i, op) for i, op in enumerate(ddp_trace.ops) if op.id == 294)
    ops = list(ddp_trace.ops)
    ops[i] = replace(op, comm=CommSpec("allreduce", 4_460_800, "tp"))
    with pytest.raises(InputError) as err:
        from_trace(replace(ddp_trace, ops=tuple(ops)), source="t.json")
    assert err.value.field == f"$.ops[{i}].comm.group"
    assert "op 294 (c10d::allreduce_)" in err.value.message and "'tp'" in err.value.message


def test_from_trace_rejects_groups_outside_the_world_and_point_to_point(ddp_trace):
    with pytest.raises(InputError, match="outside 0..1"):
        from_trace(replace(ddp_trace, process_groups=(ProcessGroup("0", (0, 5)),)))
    i, op = next((i, op) for i, op in enumerate(ddp_trace.ops) if op.id == 294)
    ops = list(ddp_trace.ops)
    ops[i] = replace(op, comm=CommSpec("send", 8, "0"))
    with pytest.raises(InputError, match="point-to-point 'send'"):
        from_trace(replace(ddp_trace, ops=tuple(ops)))

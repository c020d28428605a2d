"""Training-iteration simulator: hand-solved timelines with constant collective timers, scheduling policies,
channels, chained iterations, accounting invariants, memoisation of the timer, reports and plots.

Notation in the comments: [s, e] the interval an item occupies, in us."""

from __future__ import annotations

import json

import pytest

from mlopt.formats.io import canonical_json
from mlopt.sim.training import SimOptions, constant_timer, simulate_iteration
from mlopt.sim.workload import (
    WorkItem,
    Workload,
    data_parallel,
    from_trace,
    fsdp,
    hybrid_parallel,
    model_parallel,
)
from tests.conftest import REPO


def timing(report, name: str, iteration: int = 0):
    return next(t for t in report.items if t.name == name and t.iteration == iteration)


def span(report, name: str, iteration: int = 0) -> tuple[float, float]:
    t = timing(report, name, iteration)
    return (t.start_us, t.end_us)


def check_invariants(r) -> None:
    assert r.compute_us + r.exposed_us + r.idle_us == pytest.approx(r.iteration_time_us)
    assert r.overlapped_us + r.exposed_us == pytest.approx(r.comm_us)
    assert sum(r.per_iteration_us) == pytest.approx(r.iteration_time_us)
    assert min(r.idle_us, r.exposed_us, r.overlapped_us) >= 0
    compute = sorted((t.start_us, t.end_us) for t in r.items if t.kind == "compute")
    assert all(a[1] <= b[0] + 1e-9 for a, b in zip(compute, compute[1:]))  # one compute lane
    for lane in {t.lane for t in r.items if t.kind == "comm"}:
        spans = sorted((t.start_us, t.end_us) for t in r.items if t.lane == lane)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))  # one collective per channel
    for t in r.items:
        assert t.start_us >= t.ready_us - 1e-9 and 0 <= t.exposed_us <= t.duration_us + 1e-9


# ---------------------------------------------------------------------------------------------------------
# Hand-solved timelines


def test_data_parallel_two_layers():
    # fwd0 [0,10] fwd1 [10,20] bwd1 [20,40] ar1 [40,55] bwd0 [40,60] ar0 [60,75]
    r = simulate_iteration(data_parallel(2, 4, 10, 20, 1 << 20), constant_timer(15))
    assert span(r, "allreduce layer1") == (40, 55) and span(r, "allreduce layer0") == (60, 75)
    assert (r.iteration_time_us, r.compute_us, r.comm_us) == (75, 60, 30)
    assert (r.overlapped_us, r.exposed_us, r.idle_us) == (15, 15, 0)
    assert timing(r, "allreduce layer1").exposed_us == 0 and timing(r, "allreduce layer0").exposed_us == 15
    assert r.per_iteration_us == (75,)
    check_invariants(r)


def test_fifo_and_lifo_differ_and_lifo_overlaps_the_next_forward():
    # iteration 0 (both): fwd 0..30, bwd2 [30,40], ar2 [40,65], bwd1 [40,50], bwd0 [50,60]; ar1, ar0 queue.
    # lifo: ar0 [65,90] then ar1 [90,115]; iteration 1's fwd0 needs only ar0: [90,100] beside ar1.
    # fifo: ar1 [65,90], ar0 [90,115], fwd0 of iteration 1 [115,125]: no overlap across iterations.
    w = data_parallel(3, 4, 10, 10, 1 << 20, iterations=2)
    lifo = simulate_iteration(w, constant_timer(25), SimOptions(policy="lifo"))
    fifo = simulate_iteration(w, constant_timer(25), SimOptions(policy="fifo"))
    assert span(lifo, "allreduce layer0") == (65, 90) and span(lifo, "allreduce layer1") == (90, 115)
    assert span(lifo, "forward layer0", 1) == (90, 100) and span(lifo, "forward layer1", 1) == (115, 125)
    assert span(fifo, "allreduce layer1") == (65, 90) and span(fifo, "allreduce layer0") == (90, 115)
    assert span(fifo, "forward layer0", 1) == (115, 125)
    # iteration 1 lifo: fwd [90,100] [115,125] [125,135], bwd2 [135,145], ar2 [145,170], bwd1, bwd0 -> 165;
    # ar0 [170,195], ar1 [195,220]
    assert lifo.iteration_time_us == 220 and lifo.per_iteration_us == (115, 105)
    assert (lifo.compute_us, lifo.comm_us, lifo.overlapped_us, lifo.exposed_us) == (120, 150, 50, 100)
    assert fifo.iteration_time_us == 230 and fifo.per_iteration_us == (115, 115)
    assert timing(lifo, "allreduce layer1").exposed_us == 15  # [90,100] hidden behind iteration 1's fwd0
    check_invariants(lifo)
    check_invariants(fifo)


def test_explicit_order_is_issued_in_order_even_when_a_later_item_is_ready():
    w = data_parallel(3, 4, 10, 10, 1 << 20)
    ar = {it.layer: it.id for it in w.comm_items()}
    # ar0 first: the channel idles until ar0 is ready at 60 although ar2 is ready at 40
    order = (ar["layer0"], ar["layer2"], ar["layer1"])
    r = simulate_iteration(w, constant_timer(25), SimOptions(policy="explicit", order=order))
    assert span(r, "allreduce layer0") == (60, 85) and span(r, "allreduce layer2") == (85, 110)
    assert span(r, "allreduce layer1") == (110, 135) and r.iteration_time_us == 135
    assert r.exposed_us == 75 and r.overlapped_us == 0
    check_invariants(r)
    same_as_lifo = simulate_iteration(
        w, constant_timer(25), SimOptions(policy="explicit", order=(ar["layer2"], ar["layer0"], ar["layer1"])))
    lifo = simulate_iteration(w, constant_timer(25), SimOptions(policy="lifo"))
    assert [(t.start_us, t.end_us) for t in same_as_lifo.items] == [(t.start_us, t.end_us) for t in lifo.items]


def test_explicit_order_errors():
    w = data_parallel(3, 4, 10, 10, 1 << 20)
    ar = [it.id for it in w.comm_items()]
    with pytest.raises(ValueError, match=r"leaves out comm items 6 \(allreduce layer1\), 8 \(allreduce layer0\)"):
        simulate_iteration(w, constant_timer(1), SimOptions(policy="explicit", order=(ar[0],)))
    with pytest.raises(ValueError, match=r"not comm items: \[0, 99\]"):
        simulate_iteration(w, constant_timer(1), SimOptions(policy="explicit", order=(0, 99, *ar)))
    with pytest.raises(ValueError, match="more than once"):
        simulate_iteration(w, constant_timer(1), SimOptions(policy="explicit", order=(*ar, ar[0])))


def test_explicit_order_against_the_dependencies_deadlocks():
    # ar1 waits for ar0 (an artificial dep), but the explicit order issues ar1 first
    items = (WorkItem(0, "c", "compute", 5.0),
             WorkItem(1, "ar0", "comm", collective="allreduce", nbytes=8, group=(0, 1), deps=(0,)),
             WorkItem(2, "ar1", "comm", collective="allreduce", nbytes=8, group=(0, 1), deps=(1,)))
    with pytest.raises(ValueError, match="deadlock: 2 items never ran"):
        simulate_iteration(Workload("x", 2, items), constant_timer(1), SimOptions(policy="explicit", order=(2, 1)))


def test_two_channels_let_collectives_overlap():
    # ar2 [40,65] on channel 0, ar1 [50,75] on channel 1, ar0 ready at 60 takes channel 0 at 65: [65,90]
    w = data_parallel(3, 4, 10, 10, 1 << 20)
    r = simulate_iteration(w, constant_timer(25), SimOptions(channels=2))
    assert span(r, "allreduce layer2") == (40, 65) and timing(r, "allreduce layer2").lane == "channel 0"
    assert span(r, "allreduce layer1") == (50, 75) and timing(r, "allreduce layer1").lane == "channel 1"
    assert span(r, "allreduce layer0") == (65, 90) and timing(r, "allreduce layer0").lane == "channel 0"
    assert r.iteration_time_us == 90 and r.comm_us == 50 and r.overlapped_us == 20 and r.exposed_us == 30
    assert r.lanes() == ["compute", "channel 0", "channel 1"]
    check_invariants(r)
    one = simulate_iteration(w, constant_timer(25))
    assert one.iteration_time_us == 115


def test_model_parallel_blocking_collectives_are_all_exposed():
    # fwd0 [0,10] ag0 [10,15] fwd1 [15,25] ag1 [25,30] bwd1 [30,50] rs1 [50,55] bwd0 [55,75] rs0 [75,80]
    r = simulate_iteration(model_parallel(2, 8, 10, 20, 4096), constant_timer(5))
    assert r.iteration_time_us == 80 and r.compute_us == 60 and r.exposed_us == 20 and r.overlapped_us == 0
    assert span(r, "reducescatter layer1") == (50, 55) and span(r, "backward layer0") == (55, 75)
    # a weight gradient of 5 us hides each reducescatter: bwd1 [30,50] rs1 [50,55] wg1 [50,55] bwd0 [55,75]
    # rs0 [75,80] wg0 [75,80]; only the allgathers stay exposed
    r = simulate_iteration(model_parallel(2, 8, 10, 20, 4096, weight_grad_us=5), constant_timer(5))
    assert (r.iteration_time_us, r.compute_us, r.exposed_us, r.overlapped_us) == (80, 70, 10, 10)
    assert span(r, "weight_grad layer1") == (50, 55) and span(r, "backward layer0") == (55, 75)
    check_invariants(r)


def test_fsdp_prefetches_allgathers():
    # ag(f)0 [0,5] fwd0 [5,15]; ag(f)1 [5,10]; ag(b)1 [10,15]; ag(b)0 [15,20]; fwd1 [15,25] bwd1 [25,45]
    # rs1 [45,50]; bwd0 [45,65]; rs0 [65,70]
    r = simulate_iteration(fsdp(2, 4, 10, 20, 2048), constant_timer(5))
    assert span(r, "allgather (bwd) layer0") == (15, 20) and span(r, "forward layer1") == (15, 25)
    assert span(r, "reducescatter layer1") == (45, 50) and span(r, "backward layer0") == (45, 65)
    assert (r.iteration_time_us, r.compute_us, r.comm_us, r.overlapped_us, r.exposed_us) == (70, 60, 30, 20, 10)
    check_invariants(r)


def test_zero_duration_items_and_compute_only_workloads():
    r = simulate_iteration(data_parallel(3, 1, 0, 2, 8, iterations=2), constant_timer(1))
    assert r.iteration_time_us == 12 and r.comm_us == 0 and r.per_iteration_us == (6, 6)
    check_invariants(r)
    r = simulate_iteration(data_parallel(2, 4, 10, 20, 8), constant_timer(0))
    assert r.iteration_time_us == 60 and r.comm_us == 0 and r.exposed_us == 0


def test_in_order_compute_stream_blocked_by_a_later_item_deadlocks():
    items = (WorkItem(0, "a", "compute", 1.0, deps=(1,)), WorkItem(1, "b", "compute", 1.0))
    with pytest.raises(ValueError, match=r"item 0 \(a\), waits for \[1\]"):
        simulate_iteration(Workload("x", 1, items), constant_timer(1))


@pytest.mark.parametrize("options, message", [
    (SimOptions(policy="random"), "unknown policy"), (SimOptions(channels=0), "channels must be"),
])
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        simulate_iteration(data_parallel(2, 2, 1, 1, 8), constant_timer(1), options)


def test_bad_workloads_and_timers():
    with pytest.raises(ValueError, match="duplicate item id 0"):
        simulate_iteration(Workload("x", 1, (WorkItem(0, "a", "compute"), WorkItem(0, "b", "compute"))),
                           constant_timer(1))
    with pytest.raises(ValueError, match="depends on unknown"):
        simulate_iteration(Workload("x", 1, (WorkItem(0, "a", "compute", deps=(7,)),)), constant_timer(1))
    with pytest.raises(ValueError, match="timer gave -1.0 us"):
        simulate_iteration(data_parallel(2, 2, 1, 1, 8), constant_timer(-1))


# ---------------------------------------------------------------------------------------------------------
# Memoisation, invariants, reports


def test_timer_called_once_per_distinct_collective():
    calls = []

    def timer(item):
        calls.append((item.collective, item.nbytes, item.group))
        return 100.0, "ring"

    simulate_iteration(data_parallel(50, 1024, 100, 200, 4 << 20, iterations=2), timer)
    assert calls == [("allreduce", 4 << 20, tuple(range(1024)))]
    calls.clear()
    r = simulate_iteration(hybrid_parallel(4, 8, 2, 4, 10, 20, 4096, 1 << 20, iterations=3), timer)
    assert sorted(c[0] for c in calls) == ["allgather", "allreduce", "reducescatter"]
    assert {t.algorithm for t in r.items if t.kind == "comm"} == {"ring"}


def _by_size(item):
    return 1.0 + item.nbytes / 1000.0, f"size-{item.collective}"


@pytest.mark.parametrize("workload", [
    data_parallel(5, 16, 10, 20, 30_000, iterations=3),
    model_parallel(4, 8, 10, 20, 4096, iterations=2, weight_grad_us=3),
    hybrid_parallel(4, 8, 2, 4, 10, 20, 4096, 50_000, iterations=2, weight_grad_us=4),
    fsdp(4, 8, 10, 20, 12_000, iterations=2),
], ids=["dp", "mp", "hybrid", "fsdp"])
@pytest.mark.parametrize("options", [SimOptions(), SimOptions(policy="lifo"), SimOptions(channels=3)],
                         ids=["fifo", "lifo", "3ch"])
def test_invariants_hold(workload, options):
    r = simulate_iteration(workload, _by_size, options)
    check_invariants(r)
    assert len(r.per_iteration_us) == workload.iterations
    by_id = {it.id: it for it in workload.items}
    ends = {t.id: t.end_us for t in r.items}
    for t in r.items:
        assert all(ends[d] <= t.start_us + 1e-9 for d in by_id[t.id].deps)


@pytest.fixture(scope="module")
def ddp_trace():
    from mlopt.trace_sources import make_trace

    ex = REPO / "examples" / "ddp_mlp"
    return make_trace(str(ex / "rank0.et.json.gz"), kineto=str(ex / "rank0.kineto.json.gz"))


def test_ddp_trace_iterations_chain_through_the_allreduces(ddp_trace):
    r = simulate_iteration(from_trace(ddp_trace, 2), _by_size)
    check_invariants(r)
    ar = [t for t in r.items if t.collective == "allreduce" and t.iteration == 0]
    assert sorted(t.nbytes for t in ar) == [1_052_672, 4_460_800] and all(t.group_size == 2 for t in ar)
    first_linear = next(t for t in r.items if t.source_op == 54 and t.iteration == 1)
    assert first_linear.start_us >= max(t.end_us for t in ar)
    assert len(r.per_iteration_us) == 2 and r.per_iteration_us[0] == pytest.approx(r.per_iteration_us[1])
    # the big bucket's allreduce hides behind the first layer's backward
    big = next(t for t in ar if t.nbytes == 4_460_800)
    assert big.exposed_us == 0 and big.duration_us == pytest.approx(1.0 + 4460.8)


def test_report_dict_is_canonical_json_and_collective_rows():
    r = simulate_iteration(data_parallel(2, 4, 10, 20, 1 << 20), constant_timer(15, "ring"))
    d = json.loads(canonical_json(r.to_dict()))
    assert d["iteration_time_us"] == 75 and d["exposed_us"] == 15 and d["exposed_share"] == 0.2
    assert d["workload"] == "dp-4x2" and d["policy"] == "fifo" and len(d["items"]) == 6
    comm = [i for i in d["items"] if i["kind"] == "comm"]
    assert comm[0]["algorithm"] == "ring" and comm[0]["group_size"] == 4 and comm[0]["lane"] == "channel 0"
    assert "collective" not in next(i for i in d["items"] if i["kind"] == "compute")
    rows = r.collective_rows()
    assert [(row["name"], row["start_us"], row["duration_us"], row["exposed_us"], row["exposed_share"])
            for row in rows] == [("allreduce layer1", 40, 15, 0, 0), ("allreduce layer0", 60, 15, 15, 1)]
    assert rows[0]["bytes"] == 1 << 20 and rows[0]["group_size"] == 4 and rows[0]["algorithm"] == "ring"
    assert r.exposed_intervals() == [(60, 75)]


# ---------------------------------------------------------------------------------------------------------
# Plots


def test_plots_write_pngs(tmp_path):
    from mlopt.sim.training_plots import plot_exposed, plot_gantt

    r = simulate_iteration(hybrid_parallel(3, 8, 2, 4, 10, 20, 4096, 50_000, iterations=2), _by_size,
                           SimOptions(channels=2))
    for plot, name in ((plot_gantt, "gantt.png"), (plot_exposed, "exposed.png")):
        path = plot(r, tmp_path / name, title="hybrid")
        assert path == tmp_path / name and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5000
    quiet = simulate_iteration(data_parallel(2, 1, 10, 20, 8), constant_timer(1))
    assert plot_exposed(quiet, tmp_path / "none.png").stat().st_size > 1000
    assert plot_gantt(quiet, tmp_path / "g.png").stat().st_size > 1000

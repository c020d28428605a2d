"""`mlopt simulate PLAN --gantt-systems g.png` (Syndicate Fig. 15): every compared system of a schedule plan replayed
by optSched and drawn, one panel each and one PNG each; reproducible bytes; plans that do not fit exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.synthetic_trace import TraceBuilder

SYSTEMS = ("fifo", "bs+", "hand", "s-exec", "s-sched", "syndicate")
FILES = ("fifo", "bs-plus", "hand", "s-exec", "s-sched", "syndicate")


def _dp_trace(path: Path, layers: int = 6, world: int = 16) -> Path:
    """A synthetic data-parallel step: forward, backward with one collective per layer's gradient, optimizer."""
    b = TraceBuilder()
    weights = [b.tensor((1 << 20) * (1 + i % 4), "parameter") for i in range(layers)]
    acts = [b.tensor(1 << 16, "input")]
    for i in range(layers):
        acts.append(b.tensor(1 << 16))
        b.op(f"fwd{i}", "forward", 300 + 40 * (i % 3), [acts[i], weights[i]], [acts[-1]])
    grad, grads = b.tensor(1 << 16), {}
    for i in reversed(range(layers)):
        grads[i], nxt = b.tensor((1 << 20) * (1 + i % 4), "gradient"), b.tensor(1 << 16)
        b.op(f"bwd{i}", "backward", 600 + 80 * (i % 3), [grad, acts[i], weights[i]], [grads[i], nxt])
        grad = nxt
        collective = "allreduce" if i % 3 else "allgather"
        b.op(f"{collective}{i}", "comm", 10.0, [grads[i]], [grads[i]],
             {"bytes": b.tensors[grads[i]]["bytes"] * 6, "collective": collective, "group": "0"})
    for i in range(layers):
        b.op(f"sgd{i}", "optimizer", 50, [grads[i], weights[i]], [weights[i]])
    return b.write(path, "dp", world)


@pytest.fixture(scope="module")
def cases(ddp_example_trace, tmp_path_factory) -> dict[str, tuple[Path, str, Path, tuple[str, ...]]]:
    """name -> (trace, topology, schedule plan, extra simulate options): the DDP example on one channel, and a
    synthetic 16-rank trace on ndv2x2 (two channels, nvlink and ib; systems that differ)."""
    from mlopt.cli import main

    folder = tmp_path_factory.mktemp("gantt-plans")
    traces = {"ddp": (ddp_example_trace, "fully-connected:2", ()),
              "dp16": (_dp_trace(folder / "dp16.json"), "ndv2x2", ("--algorithm", "halving-doubling"))}
    out = {}
    for name, (trace, topology, extra) in traces.items():
        plan = folder / f"{name}.s.json"
        code = main(["-q", "plan", "schedule", "--model", str(trace), "--topology", topology, "--max-steps", "50",
                     "-o", str(plan)])
        assert code == 0
        out[name] = (trace, topology, plan, extra)
    return out


def _simulate(run_cli, case, png: Path, plan: Path | None = None):
    trace, topology, default_plan, extra = case
    return run_cli("simulate", plan or default_plan, "--model", trace, "--topology", topology, "--iterations", "2",
                   *extra, "--gantt-systems", png, "--json")


@pytest.mark.parametrize("name", ["ddp", "dp16"])
def test_the_replay_reproduces_every_systems_times(cases, name):
    from mlopt.formats.loaders import load_trace_any, resolve_topology
    from mlopt.planners.schedule.gantt import iteration_ends, motif_collective, problem_from_plan, system_schedules
    from mlopt.sim.training_plots import COLLECTIVE_COLORS

    trace, topology, plan, _ = cases[name]
    payload = json.loads(plan.read_text())["payload"]
    problem = problem_from_plan(payload, load_trace_any(str(trace)), resolve_topology(topology), str(trace))
    schedules = system_schedules(problem, payload)
    assert tuple(schedules) == SYSTEMS  # the paper's order
    for system, schedule in schedules.items():
        recorded = payload["system_plans"][system]
        assert schedule.makespan_us == pytest.approx(recorded["makespan_us"], rel=1e-12)
        assert schedule.makespan_us / 2 == pytest.approx(recorded["iteration_us"], rel=1e-12)
        assert schedule.compute_idle_pct == pytest.approx(recorded["compute_idle_pct"], rel=1e-9, abs=1e-9)
        ends = iteration_ends(problem, schedule)  # two unrolled iterations: one boundary inside the makespan
        assert len(ends) == 1 and 0 < ends[0] < schedule.makespan_us
        for m in schedule.motifs:  # every motif gets its collective's colour (not the fallback)
            assert motif_collective(problem, schedule, m.task_id, m.motif_index) in COLLECTIVE_COLORS
    if name == "dp16":  # the searches and orders differ here: the figure is not five copies of one schedule
        assert len({round(s.makespan_us, 6) for s in schedules.values()}) > 1


@pytest.mark.parametrize("name", ["ddp", "dp16"])
def test_simulate_writes_the_combined_and_per_system_pngs(run_cli, cases, tmp_path, name):
    png = tmp_path / "out" / "g.png"
    result = _simulate(run_cli, cases[name], png)
    assert result.code == 0, result.err
    assert json.loads(result.out)["policy"] == "explicit"  # the simulation itself still runs and reports
    written = [png] + [tmp_path / "out" / f"g.{f}.png" for f in FILES]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, path
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in written)  # no temp files


def test_two_runs_give_the_same_bytes(run_cli, cases, tmp_path):
    for run in ("a", "b"):
        assert _simulate(run_cli, cases["dp16"], tmp_path / run / "g.png").code == 0
    for name in ["g.png"] + [f"g.{f}.png" for f in FILES]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_tampered_plan_exits_2_naming_the_file_and_field(run_cli, cases, tmp_path):
    doc = json.loads(cases["dp16"][2].read_text())
    doc["payload"]["system_plans"]["bs+"]["options"].pop()  # one comm-op fewer than the trace has
    tampered = tmp_path / "tampered.s.json"
    tampered.write_text(json.dumps(doc))
    result = _simulate(run_cli, cases["dp16"], tmp_path / "g.png", plan=tampered)
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1
    assert str(tampered) in result.err and "$.payload.system_plans.bs+.options" in result.err
    assert "comm-ops" in result.err
    assert not list(tmp_path.glob("g*.png"))


def test_a_plan_whose_times_do_not_replay_exits_2(run_cli, cases, tmp_path):
    doc = json.loads(cases["ddp"][2].read_text())
    doc["payload"]["system_plans"]["syndicate"]["makespan_us"] *= 0.5
    tampered = tmp_path / "tampered.s.json"
    tampered.write_text(json.dumps(doc))
    result = _simulate(run_cli, cases["ddp"], tmp_path / "g.png", plan=tampered)
    assert result.code == 2 and "$.payload.system_plans.syndicate.makespan_us" in result.err


def test_gantt_systems_needs_a_schedule_plan_and_a_trace(run_cli, cases, tmp_path):
    trace, topology, plan, _ = cases["ddp"]
    png = tmp_path / "g.png"
    no_plan = run_cli("simulate", "--model", trace, "--topology", topology, "--gantt-systems", png)
    assert no_plan.code == 2 and "schedule plan" in no_plan.err
    no_trace = run_cli("simulate", plan, "--topology", topology, "--gantt-systems", png)
    assert no_trace.code == 2 and "--model" in no_trace.err
    workload = run_cli("simulate", "--workload", "dp:ranks=2,layers=2,bytes=1MiB", "--topology", topology,
                       "--gantt-systems", png)
    assert workload.code == 2 and "--model" in workload.err
    assert not png.exists()


def test_system_file_names():
    from mlopt.planners.schedule.gantt import system_file

    assert system_file("out/g.png", "bs+") == Path("out/g.bs-plus.png")
    assert system_file("out/g.png", "s-exec") == Path("out/g.s-exec.png")
    assert system_file("g", "syndicate") == Path("g.syndicate.png")

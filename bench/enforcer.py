"""The enforcer running a real training iteration on this machine: FIFO vs the Syndicate plan, wall clock.

    python bench/enforcer.py                          # DLRM-like, 16 in-process ranks; docs/enforcer-benchmark.md
    python bench/enforcer.py --bytes-scale 0.0005 --iterations 5

The DLRM-like example (examples/schedule/models.py) with every communicated size scaled by --bytes-scale (the
full sizes would need GBs per rank) is planned by `mlopt plan schedule` on dgx-a100x2, then run by
`mlopt.native.enforcer.run_iteration_harness`: one application thread per rank walks the trace's second
unrolled iteration (compute = sleep of the traced time x --compute-scale; comm = submit to the enforcer, wait
before the compute that consumes it), and every comm-op runs through the CPU interpreter, as motifs of the
plan in its sequence order ("planned") or as one motif per op in submission order ("fifo", PyTorch's default).
"planned (steady state)" runs the plan's steady-state period instead (`MotifTable.steady_state`): the first
unrolled iteration's comm-ops plus the next iteration's ones the plan prefetches (its data-prep all-to-all),
submitted at the start of each period with the next batch and issued at their seq, after a prologue that
runs the first batch's data-prep once (not timed). Every output is checked against numpy. The plan's execution
plans target NVLink/InfiniBand channels that this CPU does not have: the ratio measures the enforcer and
interpreter on 2 cores, not the planner's prediction.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlopt.formats.loaders import load_trace_any  # noqa: E402
from mlopt.native.enforcer import Item, MotifTable, period_items, run_iteration_harness  # noqa: E402
from mlopt.sim import workload as wl  # noqa: E402

CACHE = REPO / "bench" / ".cache" / "enforcer"
RESULTS = REPO / "bench" / "results" / "enforcer.jsonl"
TOPOLOGY = "dgx-a100x2"


def scaled_trace(bytes_scale: float) -> Path:
    spec = importlib.util.spec_from_file_location("schedule_models", REPO / "examples" / "schedule" / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    from mlopt.formats.io import write_json

    path = CACHE / f"dlrm_x{bytes_scale:g}.trace.json"
    write_json(path, models.dlrm_like(bytes_scale).to_dict())
    return path


def harness_items(trace_path: Path, payload: dict, compute_scale: float, iteration: int = 1) -> list[Item]:
    """Iteration `iteration` of the unrolled workload as application items: comm items by their table index
    (the plan's comm-ops of that iteration in list order), compute items waiting for the comm-ops they need."""
    workload = wl.chain(wl.from_trace(load_trace_any(str(trace_path))), payload["options"]["iterations"])
    ops = [op["id"] for op in payload["comm_ops"] if op["iteration"] == iteration]
    index = {item_id: k for k, item_id in enumerate(ops)}
    items = []
    for item in workload.items:
        if item.iteration != iteration:
            continue
        if item.kind == "comm":
            items.append(Item("comm", item.name, op=index[item.id]))
        else:
            waits = tuple(index[d] for d in item.deps if d in index)
            items.append(Item("compute", item.name, item.duration_us * compute_scale, waits=waits))
    return items


STEADY = "planned (steady state)"
TABLES = ("fifo", "planned", STEADY)  # report order


@dataclass(frozen=True)
class Setup:
    """What one harness run of a table needs: the table, the application's items for it, its prologue."""

    table: MotifTable
    items: list[Item]
    prologue: MotifTable | None = None


def setups(payload: dict, items: list[Item]) -> dict[str, Setup]:
    """The compared tables; `items` is one iteration's program by comm-op position (`harness_items`)."""
    period, prologue = MotifTable.steady_state(payload)
    return {"planned": Setup(MotifTable.from_plan(payload), items), "fifo": Setup(MotifTable.fifo(payload), items),
            STEADY: Setup(period, period_items(period, items), prologue)}


def run(bytes_scale: float, compute_scale: float, iterations: int, repeats: int) -> dict:
    trace = scaled_trace(bytes_scale)
    plan = CACHE / f"dlrm_x{bytes_scale:g}.plan.json"
    subprocess.run([sys.executable, "-m", "mlopt.cli", "plan", "schedule", "--model", str(trace), "--topology",
                    TOPOLOGY, "-o", str(plan)], check=True, cwd=REPO, capture_output=True)
    payload = json.loads(plan.read_text())["payload"]
    items = harness_items(trace, payload, compute_scale)
    tables = setups(payload, items)
    from rich.progress import track

    times: dict[str, list[float]] = {name: [] for name in tables}
    details: dict[str, dict] = {}
    for _ in track(range(repeats), description="running iterations"):
        for name, setup in tables.items():  # alternate, so drift on the machine hits all alike
            result = measure(setup, iterations)
            if result.mismatches:
                raise SystemExit(f"{name}: wrong results: {result.mismatches[:3]}")
            table = setup.table
            same = all(common(table, result.logs, 0, r) == common(table, result.logs, r, 0)
                       for r in range(1, table.nranks))
            times[name].extend(result.iteration_us[1:])  # the first iteration warms the pools up
            details[name] = {"motifs": sum(len(op.motifs) for op in table.ops),
                             "prefetched": [op.name for op in table.ops if op.offset],
                             "wait_us_rank0": result.stats[0].wait_us,
                             "replan_suggested": any(s.replan_suggested for s in result.stats),
                             "identical_order_on_shared_motifs": same}
    median = {name: statistics.median(v) for name, v in times.items()}
    return {"model": "dlrm_like", "bytes_scale": bytes_scale, "compute_scale": compute_scale,
            "ranks": tables["planned"].table.nranks, "ops": len(tables["planned"].table.ops),
            "iterations": iterations, "repeats": repeats, "median_iteration_us": median, "all_iteration_us": times,
            "details": details, "compute_us": sum(i.duration_us for i in items if i.kind == "compute"),
            "fifo_over_planned": median["fifo"] / median["planned"],
            "fifo_over_steady_state": median["fifo"] / median[STEADY],
            "predicted_iteration_us": {k: payload["system_plans"][k]["last_iteration_us"]
                                       for k in ("fifo", "syndicate")}}


def measure(setup: Setup, iterations: int):
    """One harness run of a table (its prologue first, untimed), outputs checked."""
    return run_iteration_harness(setup.table, setup.items, iterations, watchdog_ms=60000, prologue=setup.prologue)


def common(table: MotifTable, logs, a: int, b: int) -> list[tuple[int, int, int]]:
    """Rank a's issue log restricted to the motifs that involve rank b too (both must issue those alike)."""
    def both(op: int, index: int) -> bool:
        ranks = table.ops[op].motifs[index].motif.ranks
        return a in ranks and b in ranks
    return [(e.op, e.index, e.iteration) for e in logs[a] if both(e.op, e.index)]


def report(row: dict, command: str) -> str:
    med, det = row["median_iteration_us"], row["details"]
    return "\n".join([
        "# Enforcer benchmark (a real iteration on this machine)", "",
        f"Made by `{command}` (bench/enforcer.py): the DLRM-like example with communicated sizes x "
        f"{row['bytes_scale']:g}, {row['ranks']} in-process ranks, {row['ops']} comm-ops per iteration, compute "
        f"as sleeps of the traced times x {row['compute_scale']:g} ({row['compute_us']:.0f} us per iteration), "
        "every comm-op through the CPU interpreter; every output checked against numpy. Median over "
        f"{row['repeats']} runs x {row['iterations'] - 1} iterations (the first of each run left out).", "",
        "| table | motifs | median iteration us | wait us (rank 0, last run) | replan suggested |",
        "|---|---|---|---|---|",
        *(f"| {name} | {det[name]['motifs']} | {med[name]:.0f} | {det[name]['wait_us_rank0']:.0f} | "
          f"{det[name]['replan_suggested']} |" for name in TABLES if name in det), "",
        f"FIFO / planned wall-clock ratio: **{row['fifo_over_planned']:.3f}** "
        f"(> 1: the plan is faster); FIFO / planned (steady state): **{row['fifo_over_steady_state']:.3f}** "
        f"(the plan's period: {', '.join(det[STEADY]['prefetched']) or 'nothing'} prefetched with the next batch "
        "at the start of each period, issued at its seq; its prologue, the first batch's, runs once untimed). "
        "Identical issue order on every rank: "
        f"{all(det[n]['identical_order_on_shared_motifs'] for n in det)} (every pair of ranks issues the motifs "
        "they share in the same order); no deadlock.", "",
        "What it measures: the plan's execution options target dgx-a100x2's NVSwitch and InfiniBand channels, "
        "which this 2-core CPU does not have; here every motif is an interpreter run competing for the same two "
        "cores. The planner's prediction for this scaled trace on dgx-a100x2 is "
        f"{row['predicted_iteration_us']['fifo'] / row['predicted_iteration_us']['syndicate']:.3f} "
        "(fifo / syndicate, steady state: at these sizes communication is negligible there; the full-size "
        "model is in docs/schedule-benchmark.md).", ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes-scale", type=float, default=1 / 2048)
    parser.add_argument("--compute-scale", type=float, default=1.0)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    row = run(args.bytes_scale, args.compute_scale, args.iterations, args.repeats)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
    command = "python bench/enforcer.py" + "".join(" " + a for a in (sys.argv[1:] if argv is None else argv))
    text = report(row, command)
    print(text)
    if not args.no_docs:
        (REPO / "docs" / "enforcer-benchmark.md").write_text(text)


if __name__ == "__main__":
    main()

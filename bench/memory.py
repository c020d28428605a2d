"""Memory planner benchmark: MONeT (joint ILP) vs checkpoint-only ILP and the baselines, on torchvision models.

    python bench/memory.py                                    # resnet50, vgg16, mobilenet_v2, googlenet, batch 32
    python bench/memory.py --models resnet18 --batch 8 --ratios 0.4,0.6 --time-limit 60
    python bench/memory.py --models resnet50 --profiled      # costs measured by `mlopt profile operators`
    python bench/memory.py --models resnet50 --channels-last # traced in torch.channels_last

Each model is traced on this machine's CPU (one training step with SGD; traces cached in bench/.cache),
built into a MONeT problem, and planned at every budget ratio (fraction of the store-all peak) with each
algorithm. Every plan is replayed by the validator; the figures are the replay's. Writes
bench/results/memory.json, docs/memory-benchmark.md and docs/memory-<model>.png (trade-off curves).
Solve times are wall times on this machine with the options printed in the report.

--profiled plans on each trace as `mlopt profile operators --quick --device cpu` measures it (cached in
bench/.cache): measured times for every op it rebuilds, convolution alternatives (channels-last, oneDNN
off) and the catalog's factors measured on the model's own shapes. It writes
bench/results/memory-profiled.json, docs/memory-benchmark-profiled.md and docs/memory-profiled-<model>.png.
Besides the overhead against store-all (PyTorch's default implementations), every row has the overhead
against every operator once at its fastest implementation (`compute_overhead_vs_least`), which no
schedule beats: the price of the memory saving alone.

--channels-last traces each model with its parameters and inputs in torch.channels_last (`mlopt trace
--channels-last`; on CPU, oneDNN's NHWC convolutions), so store-all is the step a channels-last training
job runs and every plan is one `mlopt.pytorch.memory` applies to that job as it is. It writes
bench/results/memory-channels-last.json, docs/memory-benchmark-channels-last.md and
docs/memory-channels-last-<model>.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.progress import Progress

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlopt.errors import InfeasibleError  # noqa: E402
from mlopt.formats.io import write_json  # noqa: E402
from mlopt.formats.trace import load_trace, save_trace  # noqa: E402
from mlopt.planners.memory.build import build_problem  # noqa: E402
from mlopt.planners.memory.planner import DEFAULT_SEARCH_SHARE, MemoryOptions, plan_memory  # noqa: E402
from mlopt.planners.memory.plots import plot_tradeoff  # noqa: E402
from mlopt.planners.options import PlannerOptions  # noqa: E402

CACHE = REPO / "bench" / ".cache"
RESULTS = REPO / "bench" / "results" / "memory.json"
DOC = REPO / "docs" / "memory-benchmark.md"
PROFILED_RESULTS = REPO / "bench" / "results" / "memory-profiled.json"
PROFILED_DOC = REPO / "docs" / "memory-benchmark-profiled.md"
# mode -> (results JSON, markdown table, plot prefix)
MODES = {"traced": (RESULTS, DOC, "memory"),
         "profiled": (PROFILED_RESULTS, PROFILED_DOC, "memory-profiled"),
         "channels-last": (REPO / "bench" / "results" / "memory-channels-last.json",
                           REPO / "docs" / "memory-benchmark-channels-last.md", "memory-channels-last")}
BASELINES = ("sqrt", "greedy")


def traced(model: str, batch: int, memory_format: str = "contiguous"):
    """The model's trace at this batch (and memory format), traced once and cached."""
    from mlopt.pytorch.trace import trace_model_spec

    layout = "" if memory_format == "contiguous" else f"-{memory_format}"
    path = CACHE / f"{model}-b{batch}{layout}.trace.json"
    if path.exists():
        return load_trace(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    trace = trace_model_spec(f"torchvision:{model}", batch=batch, memory_format=memory_format)
    save_trace(trace, path)
    return trace


def profiled(model: str, batch: int):
    """The model's trace with the operator costs `mlopt profile operators --quick --device cpu` measures,
    profiled once and cached."""
    from mlopt.profilers.operators import ProfileOptions, profile_operators

    path = CACHE / f"{model}-b{batch}.cpu-profiled.json"
    if path.exists():
        return load_trace(path)
    result = profile_operators(traced(model, batch), ProfileOptions(device="cpu", quick=True),
                               source=str(CACHE / f"{model}-b{batch}.trace.json"))
    save_trace(result.trace, path)
    return result.trace


def row_of(model: str, algorithm: str, ratio: float | None, result, error, wall_s: float) -> dict:
    row = {"model": model, "algorithm": algorithm, "budget_ratio": ratio, "wall_s": round(wall_s, 2)}
    if result is None:
        return {**row, "status": "infeasible", "message": str(error)}
    predicted = result.plan.payload["predicted"]
    return {**row, "status": result.plan.status.value, "peak_bytes": predicted["peak_bytes"],
            "memory_ratio": predicted["memory_ratio"], "compute_overhead": predicted["compute_overhead"],
            "compute_overhead_vs_least": predicted.get("compute_overhead_vs_least"),
            "gap": result.plan.gap, "ilp": result.plan.payload.get("ilp")}


def ratios_for(problem, requested: list[float], reference_peak: int) -> list[float]:
    """The requested ratios, plus three above the least feasible ratio when some requested ones are below it
    (e.g. VGG-16 at batch 32, whose parameters, gradients and momentum alone are half the store-all peak)."""
    from mlopt.planners.memory.planner import least_feasible_bytes

    least = least_feasible_bytes(problem) / reference_peak
    extra = [math.ceil(100 * (least + (1 - least) * f)) / 100 for f in (0.1, 0.4, 0.7)] if min(requested) < least else []
    return sorted(set(requested) | set(extra))


def run_one(problem, model: str, algorithm: str, ratio: float, options: PlannerOptions,
            search_share: float = DEFAULT_SEARCH_SHARE) -> dict:
    return run_job(problem, model, (algorithm,), ratio, options, search_share)[0]


def run_job(problem, model: str, algorithms: tuple[str, ...], ratio: float, options: PlannerOptions,
            search_share: float = DEFAULT_SEARCH_SHARE) -> list[dict]:
    """Rows for `algorithms` at one ratio. ("monet", "checkpoint-only") is one monet run: its first solve is
    the checkpoint-only plan (the same call as --algorithm checkpoint-only), reported as that row with its
    own wall time; the monet row's wall time includes it."""
    algorithm = "monet" if "monet" in algorithms else algorithms[0]
    started = time.perf_counter()
    try:
        result = plan_memory(problem, MemoryOptions(algorithm, budget_ratio=ratio, search_share=search_share), options,
                             {"model": model})
    except InfeasibleError as exc:
        return [row_of(model, a, ratio, None, exc, time.perf_counter() - started) for a in algorithms]
    rows = {algorithm: row_of(model, algorithm, ratio, result, None, time.perf_counter() - started)}
    if "checkpoint-only" in algorithms and algorithm == "monet":
        first = result.checkpoint_only
        rows["checkpoint-only"] = (row_of(model, "checkpoint-only", ratio, first, None, first.plan.wall_time_s)
                                   if first is not None else
                                   {"model": model, "algorithm": "checkpoint-only", "budget_ratio": ratio,
                                    "wall_s": None, "status": "infeasible", "message": "no plan in monet's first solve"})
    return [rows[a] for a in algorithms]


def job_groups(algorithms: list[str]) -> list[tuple[str, ...]]:
    """One job per algorithm and baseline, but monet and checkpoint-only together (see run_job)."""
    pair = ("monet", "checkpoint-only")
    together = [pair] if all(a in algorithms for a in pair) else []
    return together + [(a,) for a in (*algorithms, *BASELINES) if not (together and a in pair)]


def fmt_pct(value) -> str:
    return "" if value is None else f"{value * 100:.1f}%"


COSTS = {
    "traced": "compute = sum of measured CPU operator times of the schedule (forward, backward, recomputation), "
              "as the trace recorded them, with the catalog's CPU constants (catalog.CPU_FACTORS) for the "
              "alternatives it models",
    "channels-last": "model and inputs in torch.channels_last (`mlopt trace --channels-last`); compute = sum of "
                     "measured CPU operator times of the schedule, as the trace recorded them, with the catalog's "
                     "CPU constants for the alternatives it models",
    "profiled": "compute = sum of the operator times `mlopt profile operators --quick --device cpu` measured on "
                "this machine (convolutions also channels-last and oneDNN off; the catalog's factors measured on "
                "the model's shapes), other ops as traced",
}


def markdown(rows: list[dict], problems: dict, runs: list[str], plots_from_doc: str = ".",
             costs: str = "traced", plot_prefix: str = "memory") -> str:
    titles = {"profiled": " (profiled operator costs)", "channels-last": " (channels-last traces)"}
    lines = [
        "# Memory planner benchmark" + titles.get(costs, ""),
        "",
        "Generated by " + " then ".join(f"`{c}`" for c in runs) + " "
        "on the 2-core CI machine (HiGHS, 1 thread). Models traced on CPU (one SGD training step, 224x224 "
        "inputs); memory = replayed peak of tensors + workspace including parameters, gradients and optimizer "
        f"state; {COSTS[costs]}. "
        "Ratios are against the store-all schedule (PyTorch's default) of the same trace; \"vs fastest\" is "
        "the overhead against every operator once at its fastest implementation, which no schedule beats.",
        "",
        "| model | nodes | store-all peak | algorithm | budget ratio | status | memory ratio | compute overhead | "
        "vs fastest | gap | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        info = problems[r["model"]]
        if r["status"] == "infeasible":
            lines.append(f"| {r['model']} | {info['nodes']} | {info['store_all_peak'] / 2**30:.2f} GiB | {r['algorithm']} | "
                         f"{r['budget_ratio']} | infeasible | | | | | {r['wall_s']} |")
            continue
        lines.append(f"| {r['model']} | {info['nodes']} | {info['store_all_peak'] / 2**30:.2f} GiB | {r['algorithm']} | "
                     f"{r['budget_ratio'] if r['budget_ratio'] is not None else ''} | {r['status']} | "
                     f"{r['memory_ratio']:.3f} | {fmt_pct(r['compute_overhead'])} | "
                     f"{fmt_pct(r.get('compute_overhead_vs_least'))} | {fmt_pct(r['gap'])} | {r['wall_s']} |")
    lines += ["", *targets(rows), "",
              "Plots: " + ", ".join(f"[{m}]({plots_from_doc}/{plot_prefix}-{m}.png)" for m in problems), ""]
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    """The issue's acceptance figures, computed from the rows."""
    solved = [r for r in rows if r["status"] != "infeasible"]
    ilp = [r for r in solved if r["algorithm"] in ("monet", "checkpoint-only")]
    by_key = {(r["model"], r["budget_ratio"], r["algorithm"]): r for r in solved}
    pairs = [(r, by_key.get((r["model"], r["budget_ratio"], "checkpoint-only")))
             for r in solved if r["algorithm"] == "monet"]
    pairs = [(m, c) for m, c in pairs if c is not None]
    worse = [f"{m['model']} {m['budget_ratio']} ({fmt_pct(m['compute_overhead'])} vs {fmt_pct(c['compute_overhead'])})"
             for m, c in pairs if m["compute_overhead"] > c["compute_overhead"] + 1e-9]
    r50 = [r for r in solved if r["model"] == "resnet50" and r["algorithm"] == "monet" and r["memory_ratio"] <= 0.40]
    best = min(r50, key=lambda r: r["compute_overhead"], default=None)
    gaps = [r["gap"] for r in ilp if r["gap"] is not None]
    lines = ["## Targets", ""]
    if best is not None:
        lines.append(f"- ResNet-50 at <= 0.40x of store-all memory: least compute overhead {fmt_pct(best['compute_overhead'])} "
                     f"(memory ratio {best['memory_ratio']:.3f}; target <= 10%).")
    strict = min((r for r in r50 if r.get("compute_overhead_vs_least") is not None),
                 key=lambda r: r["compute_overhead_vs_least"], default=None)
    if strict is not None:
        lines.append(f"- ResNet-50 at <= 0.40x against every operator at its fastest implementation: "
                     f"{fmt_pct(strict['compute_overhead_vs_least'])} (memory ratio {strict['memory_ratio']:.3f}).")
    lines.append(f"- Joint (monet) vs checkpoint-only at the same budget and time limit: joint worse in {len(worse)} of "
                 f"{len(pairs)} pairs" + (": " + ", ".join(worse) if worse else "") + ".")
    if ilp:
        lines.append(f"- ILP plans: largest reported gap {fmt_pct(max(gaps, default=0.0))} (target <= 5%), longest wall "
                     f"time {max(r['wall_s'] for r in ilp):.0f} s (target <= 600 s); "
                     f"{sum(1 for g in gaps if g > 0.05)} of {len(ilp)} plans above a 5% gap.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=lambda s: s.split(","), default=["resnet50", "vgg16", "mobilenet_v2", "googlenet"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ratios", type=lambda s: [float(x) for x in s.split(",")], default=[0.33, 0.4, 0.5, 0.6, 0.7])
    parser.add_argument("--algorithms", type=lambda s: s.split(","), default=["monet", "checkpoint-only"])
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per ILP solve")
    parser.add_argument("--mip-gap", type=float, default=1e-4, help="relative gap at which a solve stops")
    parser.add_argument("--jobs", type=int, default=1, help="plans solved at once (one solver thread each)")
    parser.add_argument("--search-share", type=float, default=DEFAULT_SEARCH_SHARE,
                        help="share of each ILP's time limit spent on neighbourhood search (mlopt's --search-share)")
    parser.add_argument("--profiled", action="store_true",
                        help="plan on traces profiled by `mlopt profile operators --quick --device cpu` (see above)")
    parser.add_argument("--channels-last", action="store_true",
                        help="trace the models in torch.channels_last (`mlopt trace --channels-last`; see above)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: by --profiled / --channels-last)")
    parser.add_argument("--append", action="store_true", help="replace only these models' rows in --out")
    parser.add_argument("--doc", type=Path, default=None, help="markdown table to write (default: by --profiled / --channels-last)")
    parser.add_argument("--report-only", action="store_true", help="rewrite --doc from --out without planning")
    parser.add_argument("--plots", type=Path, default=REPO / "docs", help="folder for memory-<model>.png")
    args = parser.parse_args()
    if args.profiled and args.channels_last:
        parser.error("--profiled and --channels-last are exclusive (channels-last traces are not profiled yet)")
    costs = "profiled" if args.profiled else "channels-last" if args.channels_last else "traced"
    default_out, default_doc, prefix = MODES[costs]
    args.out, args.doc = args.out or default_out, args.doc or default_doc
    options = PlannerOptions(time_limit_s=args.time_limit, mip_gap=args.mip_gap)
    if args.report_only:
        previous = json.loads(args.out.read_text())
        args.doc.write_text(markdown(previous["rows"], previous["problems"], previous["runs"],
                                     os.path.relpath(args.plots, args.doc.parent), costs, prefix))
        return
    rows, problems, runs = [], {}, []
    command = (f"python bench/memory.py --models {','.join(args.models)} --batch {args.batch} "
               f"--ratios {','.join(map(str, args.ratios))} --algorithms {','.join(args.algorithms)} "
               f"--time-limit {args.time_limit:g} --mip-gap {args.mip_gap:g} --jobs {args.jobs}"
               + (f" --search-share {args.search_share:g}" if args.search_share != DEFAULT_SEARCH_SHARE else "")
               + (" --profiled" if args.profiled else "") + (" --channels-last" if args.channels_last else "")
               + (" --append" if args.append else "")
               + (f" --out {args.out.resolve().relative_to(REPO)}" if args.out.resolve() != default_out else "")
               + (f" --doc {args.doc.resolve().relative_to(REPO)}" if args.doc.resolve() != default_doc else "")
               + (f" --plots {args.plots.resolve().relative_to(REPO)}" if args.plots.resolve() != REPO / "docs" else ""))
    if args.append and args.out.exists():  # rerun some models, keep the others' rows
        previous = json.loads(args.out.read_text())
        rows = [r for r in previous["rows"] if r["model"] not in args.models]
        problems = {m: v for m, v in previous["problems"].items() if m not in args.models}
        runs = previous.get("runs", [])
    runs.append(command)
    with Progress() as progress:
        task = progress.add_task("memory bench", total=None)
        for model in args.models:
            progress.update(task, description=f"{model}: tracing" + (" and profiling" if args.profiled else ""))
            problem = build_problem(profiled(model, args.batch) if args.profiled else
                                    traced(model, args.batch, "channels-last" if args.channels_last else "contiguous"))
            reference = run_one(problem, model, "store-all", 1.0, options)
            problems[model] = {"nodes": problem.n, "store_all_peak": reference["peak_bytes"],
                               "metadata": problem.metadata}
            jobs = [(group, ratio) for ratio in ratios_for(problem, args.ratios, reference["peak_bytes"])
                    for group in job_groups(args.algorithms)]
            progress.update(task, description=f"{model}: {len(jobs)} jobs, {args.jobs} at once",
                            total=(progress.tasks[0].total or 0) + len(jobs))
            with ProcessPoolExecutor(max_workers=args.jobs) as pool:
                futures = [pool.submit(run_job, problem, model, group, ratio, options, args.search_share)
                           for group, ratio in jobs]
                for future in futures:  # rows in job order, whatever order they finish in
                    rows.extend(future.result())
                    progress.advance(task)
            series = {a: [r for r in rows if r["model"] == model and r["algorithm"] == a and r["status"] != "infeasible"]
                      for a in (*args.algorithms, *BASELINES)}
            plot_tradeoff(series, args.plots / f"{prefix}-{model}.png",
                          title=f"{model} batch {args.batch}" + {"profiled": " (profiled costs)",
                                                                 "channels-last": " (channels-last)"}.get(costs, ""))
            write_json(args.out, {"runs": runs, "problems": problems, "rows": rows})
    args.doc.write_text(markdown(rows, problems, runs, os.path.relpath(args.plots, args.doc.parent), costs, prefix))
    print(f"wrote {args.out}, {args.doc}")


if __name__ == "__main__":
    main()

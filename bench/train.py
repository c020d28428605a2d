"""The example's DDP training step with mlopt's plans against gloo with DDP's defaults, in the same job.

    python bench/train.py                                  # mlp and cnn, 2 and 4 processes; docs/train-benchmark.md
    python bench/train.py --ranks 2 --models mlp --repeats 1 --quick-doc     # a smoke run (bench/.cache only)

Per number of processes, `examples/train_ddp/make_plans.sh` traces both example models and plans them for a
fully connected topology of that many ranks (memory, collective, threads, schedule). Then per (model, ranks,
configuration) `torchrun --standalone` runs `examples/train_ddp/train.py --compare-gloo`, with every plan, with
the communication plans only (`--skip memory`: a memory plan buys memory with recomputation, and its executor
runs in Python per aten op, so it costs time by design) and with the thread and collective plans only (`--skip
memory,schedule`): the job's default process group is
the "mlopt" backend loaded with the model's plan index, the model goes through `mlopt.pytorch.apply_plans`
and trains --steps SGD steps on synthetic data; a copy of the same initial model then trains on the same
batches with DDP's defaults over a second, gloo, process group. Each job reports per-step times (the slowest
rank's), which plans applied, and the largest absolute parameter difference after the last step.

Figures: a job's step time is the mean over steps 2..N (DDP builds and rebuilds its buckets in step 1; the
schedule plan's enforcer starts with the first step whose buckets are rebuilt); a cell's figure is the median
over --repeats jobs; ratio = mlopt + plans / gloo (< 1: mlopt faster). The parameters must equal gloo's within
--tolerance (float rounding: the two backends add the ranks' gradients in different orders); a cell that does
not fails the bench after writing the results. `--backend gloo` runs the plans over gloo instead (what applies
without the mlopt backend), e.g. where the backend is not built.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp"
RESULTS = REPO / "bench" / "results" / "train.json"
DOC = REPO / "docs" / "train-benchmark.md"
PLOT = REPO / "docs" / "train-benchmark.png"
CACHE = REPO / "bench" / ".cache" / "train"
JOB_TIMEOUT_S = 300
# name -> plan kinds left out (train.py --skip): every plan; the communication plans (the memory plan trades
# compute for memory: its recomputations and its per-op executor cost time by design); those without the schedule.
CONFIGS = {"all plans": "", "communication plans": "memory", "threads + collective": "memory,schedule"}


def make_plans(ranks: int, models: list[str]) -> Path:
    out = CACHE / f"plans-{ranks}"
    log = CACHE / f"plans-{ranks}.log"
    with log.open("w") as handle:
        subprocess.run(["bash", str(EXAMPLE / "make_plans.sh"), str(out), str(ranks), " ".join(models)], cwd=REPO,
                       check=True, stdout=handle, stderr=subprocess.STDOUT)
    return out


def run_job(model: str, ranks: int, plans: Path, skip: str, args: argparse.Namespace, tmp: Path) -> dict:
    """One torchrun job of train.py --compare-gloo; its --json figures."""
    out = tmp / f"{model}-{ranks}-{time.monotonic_ns()}.json"
    command = ["torchrun", "--standalone", "--nproc-per-node", str(ranks), str(EXAMPLE / "train.py"), "--model", model,
               "--plans", str(plans), "--steps", str(args.steps), "--backend", args.backend, "--skip", skip,
               "--compare-gloo", "--json", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    if done.returncode != 0 or not out.is_file():
        log = CACHE / f"failed-{model}-{ranks}-{skip.replace(',', '+') or 'all'}.log"
        log.write_text(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}")
        errors = [line for line in (done.stdout + done.stderr).splitlines() if "Error" in line or "error:" in line]
        raise SystemExit(f"{model} on {ranks} processes (--skip {skip!r}) failed (exit {done.returncode}); "
                         f"log: {log}\n" + "\n".join(errors[:20]))
    return json.loads(out.read_text())


def mean_after_first(times: list[float]) -> float:
    rest = times[1:] or times
    return sum(rest) / len(rest)


def cell(model: str, ranks: int, config: str, jobs: list[dict], tolerance: float) -> dict:
    planned = [mean_after_first(j["step_s"]) for j in jobs]
    gloo = [mean_after_first(j["gloo_step_s"]) for j in jobs]
    diff = max(j["max_abs_diff"] for j in jobs)
    return {"model": model, "ranks": ranks, "config": config, "skip": jobs[0]["skip"], "backend": jobs[0]["backend"],
            "steps": jobs[0]["steps"],
            "planned_step_ms": statistics.median(planned) * 1e3, "gloo_step_ms": statistics.median(gloo) * 1e3,
            "ratio": statistics.median(planned) / statistics.median(gloo), "max_abs_diff": diff,
            "equal_within_tolerance": diff <= tolerance, "report": jobs[0]["report"],
            "enforced_iterations": jobs[0].get("enforced_iterations", 0),
            "jobs": [{"step_s": j["step_s"], "gloo_step_s": j["gloo_step_s"], "max_abs_diff": j["max_abs_diff"]}
                     for j in jobs]}


def memory_plan_figures(index: Path) -> dict:
    """The memory plan's own prediction (what it buys for its recomputations)."""
    payload = json.loads((index / "memory.plan.json").read_text())["payload"]
    predicted = payload["predicted"]
    return {"memory_ratio": predicted.get("memory_ratio"), "compute_overhead": predicted.get("compute_overhead"),
            "recomputations": sum(len(b["recompute"]) for b in payload["schedule"]["backward"])}


def applied_kinds(report: list[str]) -> str:
    """'threads, memory, ...' of the report lines that say applied (one entry per kind)."""
    kinds = []
    for line in report:
        name = line.split(":", 1)[0].rsplit("/", 1)[-1]
        kind = name.split(".", 1)[0].split("-", 1)[0]
        if ": applied:" in line and kind not in kinds:
            kinds.append(kind)
    return ", ".join(kinds) or "none"


def runtime_library() -> str:
    """The runtime library the jobs load (MLOPT_RUNTIME_LIB or the bundled one) and its version."""
    sys.path.insert(0, str(REPO))
    from mlopt.native import binding as native

    lib = native.library()
    path = Path(lib._name).resolve()
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{shown} {'.'.join(map(str, native.version()))}"


def write_doc(rows: list[dict], meta: dict, command: str) -> None:
    lines = ["# DDP training with mlopt's plans vs gloo", "",
             f"Made by `{command}` (bench/train.py; {meta['machine']}, {meta['date']}; runtime library "
             f"{meta['runtime']}).", "",
             f"Each cell: `torchrun --standalone --nproc-per-node RANKS examples/train_ddp/train.py --model MODEL "
             f"--plans PLANS --steps {meta['steps']} --backend {meta['backend']} --compare-gloo`, {meta['repeats']} "
             f"job(s); a job's step time is the mean of steps 2..{meta['steps']} (the slowest rank's), the cell's the "
             f"median over jobs; ratio < 1: the planned run is faster. Plans from `examples/train_ddp/make_plans.sh` "
             f"for fully-connected:RANKS. Parameters after {meta['steps']} steps compared with gloo + DDP defaults "
             f"trained on the same batches from the same initial parameters (tolerance {meta['tolerance']:g}).", "",
             "| model | ranks | configuration | planned ms/step | gloo ms/step | ratio | max abs param diff | equal | "
             "applied | enforced iterations |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['ranks']} | {r['config']} | {r['planned_step_ms']:.2f} | "
                     f"{r['gloo_step_ms']:.2f} | {r['ratio']:.3f} | {r['max_abs_diff']:.3g} | "
                     f"{r['equal_within_tolerance']} | {applied_kinds(r['report'])} | {r['enforced_iterations']} |")
    lines += ["", "Memory plans (their own prediction: peak against store-all, compute overhead, recomputations):", ""]
    seen = set()
    for r in rows:
        if (r["model"], r["ranks"]) not in seen:
            seen.add((r["model"], r["ranks"]))
            m = r["memory_plan"]
            lines.append(f"- {r['model']}, {r['ranks']} ranks: peak {m['memory_ratio']:.2f}x store-all, compute "
                         f"{m['compute_overhead'] * 100:+.1f}%, {m['recomputations']} recomputations")
    lines += ["", "Reading it:", "", *reading(rows)]
    lines += ["", "What applied, per plan file (rank 0's `AppliedPlans.report()`, first job of each cell):", ""]
    for r in rows:
        lines.append(f"- {r['model']}, {r['ranks']} ranks, {r['config']}:")
        lines += [f"  - `{line.split(str(CACHE) + '/', 1)[-1]}`" for line in r["report"]]
    lines += ["", f"![step times]({PLOT.name})", ""]
    DOC.write_text("\n".join(lines))


def reading(rows: list[dict]) -> list[str]:
    """What the table says, from its own figures."""
    ratios = {config: [r["ratio"] for r in rows if r["config"] == config] for config in CONFIGS}
    span = {c: f"{min(v):.2f}-{max(v):.2f}" for c, v in ratios.items() if v}
    diff = max(r["max_abs_diff"] for r in rows)
    lines = [f"- Ratios (planned / gloo step time) per configuration over the cells: "
             + "; ".join(f"{c} {s}" for c, s in span.items()) + ".",
             f"- Parameters after the last step differ from gloo's by at most {diff:.3g} (float rounding: the "
             f"backends add the ranks' gradients in different orders)."]
    if "all plans" in span:
        lines.append("- `all plans` includes the memory plan: its executor matches every aten op of the forward "
                     "pass in a Python dispatch mode and runs the plan's recomputations in the backward pass, so "
                     "it buys memory with time (the plans' own predictions are listed above); the communication "
                     "plans are timed without it.")
    lines.append("- 2 cores: with 4 processes (each with its backend's and the enforcer's threads) the cores are "
                 "oversubscribed, and step times vary by tens of percent between jobs; the figures are medians.")
    return lines


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = len({r["config"] for r in rows})
    fig, axes = plt.subplots(-(-len(rows) // columns), columns, figsize=(4 * columns, 3.2 * -(-len(rows) // columns)),
                             squeeze=False)
    for ax, r in zip(axes.flat, rows):
        job = r["jobs"][0]
        steps = range(1, len(job["step_s"]) + 1)
        ax.plot(steps, [s * 1e3 for s in job["step_s"]], marker="o", label=f"{r['backend']} + plans")
        ax.plot(steps, [s * 1e3 for s in job["gloo_step_s"]], marker="s", label="gloo + DDP defaults")
        ax.set_title(f"{r['model']}, {r['ranks']} processes,\n{r['config']}", fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylabel("ms (slowest rank)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated of: {', '.join(CONFIGS)}")
    parser.add_argument("--backend", choices=("mlopt", "gloo"), default="mlopt")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--quick-doc", action="store_true", help="write results and doc under bench/.cache only")
    parser.add_argument("--from-results", action="store_true", help="rewrite the doc and plot from the results")
    args = parser.parse_args(argv)
    global RESULTS, DOC, PLOT
    if args.quick_doc:
        RESULTS, DOC, PLOT = CACHE / "train.json", CACHE / "train-benchmark.md", CACHE / "train-benchmark.png"
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.from_results:
        saved = json.loads(RESULTS.read_text())
        write_doc(saved["rows"], saved["meta"], saved["meta"]["command"])
        plot(saved["rows"])
        return 0
    models = args.models.split(",")
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlopt-bench-train-") as tmp:
        for ranks in (int(x) for x in args.ranks.split(",")):
            plans = make_plans(ranks, models)
            for model in models:
                for config in configs:
                    print(f"{model} on {ranks} processes, {config} ...", file=sys.stderr, flush=True)
                    jobs = [run_job(model, ranks, plans, CONFIGS[config], args, Path(tmp)) for _ in range(args.repeats)]
                    rows.append({**cell(model, ranks, config, jobs, args.tolerance),
                                 "memory_plan": memory_plan_figures(plans / model / "plans")})
    command = "python bench/train.py" + "".join(" " + a for a in (sys.argv[1:] if argv is None else argv))
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
            "runtime": runtime_library(),
            "steps": args.steps, "repeats": args.repeats, "backend": args.backend, "tolerance": args.tolerance,
            "command": command}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, sort_keys=True) + "\n")
    write_doc(rows, meta, command)
    plot(rows)
    for r in rows:
        print(f"{r['model']} x{r['ranks']} {r['config']}: planned {r['planned_step_ms']:.2f} ms, "
              f"gloo {r['gloo_step_ms']:.2f} ms, "
              f"ratio {r['ratio']:.3f}, max diff {r['max_abs_diff']:.3g}")
    bad = [f"{r['model']} x{r['ranks']} {r['config']}" for r in rows if not r["equal_within_tolerance"]]
    if bad:
        print(f"parameters differ from gloo's beyond {args.tolerance:g}: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

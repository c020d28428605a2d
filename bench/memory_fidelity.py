"""Memory-plan fidelity: does a planned step stay within its budget when it really runs?

    python bench/memory_fidelity.py --tag before                 # resnet18 batch 16 (the issue's case)
    python bench/memory_fidelity.py --tag after --models resnet18:16,mobilenet_v2:4 --ratios 1.0,0.7,least
    python bench/memory_fidelity.py --tag cl --models resnet18:16:cl  # channels-last
    python bench/memory_fidelity.py --tag transformer --models bench/models/bert_like.py:bert_small:4:128,256
    python bench/memory_fidelity.py --doc-only                   # rewrite the doc from the results

For each model (torchvision NAME:BATCH, or a bench/models file spec FILE:CALLABLE:BATCH:SHAPE, the SHAPE's
commas kept; `:cl` appended traces with `mlopt trace --channels-last` and runs the model and inputs in
torch.channels_last) and budget ratio (a fraction of the store-all replayed peak, or `least`: the
least-memory schedule's replayed peak, the least feasible budget the planner reports), it traces the model
once (`mlopt trace`, SGD, cached in bench/.cache), plans (`mlopt plan memory --budget-ratio R`, or
`--budget BYTES` for `least`) and, in a fresh Python process per point, loads the plan with
`mlopt.pytorch.load_memory_plan`, runs one warm-up step with an SGD update (so the momentum buffers exist,
as in training) and then one measured step under the plan (`measure_step`: the allocator's high-water mark
above the level before the step) and reads the process's peak RSS. Measured allocator peak = the problem's
constant bytes (parameters, buffers, momentum, inputs: what is allocated before the step) + that high-water
mark, the figure the plan's predicted peak and budget are in. One intra-op thread (the machine is shared;
kernels then allocate as they do single-threaded).

Writes bench/results/memory_fidelity.json (one run per --tag, kept across tags) and
docs/memory-fidelity-benchmark.md (a table per tag).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlopt.formats.io import write_json  # noqa: E402
from mlopt.formats.plan import load_plan  # noqa: E402
from mlopt.formats.trace import load_trace  # noqa: E402
from mlopt.planners.memory.build import build_problem  # noqa: E402
from mlopt.planners.memory.planner import least_feasible_bytes  # noqa: E402

CACHE = REPO / "bench" / ".cache" / "memory_fidelity"
RESULTS = REPO / "bench" / "results" / "memory_fidelity.json"
DOC = REPO / "docs" / "memory-fidelity-benchmark.md"
DEFAULT_MODELS = "resnet18:16"
DEFAULT_RATIOS = "1.0,0.8,0.7,0.64,least"
TOLERANCE = 0.05  # the target: measured within 5% of predicted
FINDINGS = "## Findings"  # the doc's hand-written part starts here; reruns keep it
CHANNELS_LAST_SUFFIX = "cl"  # a model entry ending in :cl runs channels-last


def model_spec(entry: str) -> dict:
    """`resnet18:16` (torchvision) or `bench/models/bert_like.py:bert_base:4:128,768`; a trailing `:cl` traces
    and runs the model in torch.channels_last (`mlopt trace --channels-last`)."""
    parts = entry.split(":")
    channels_last = parts[-1] == CHANNELS_LAST_SUFFIX
    if channels_last:
        parts = parts[:-1]
    layout_label, layout_key = (" channels-last", "-cl") if channels_last else ("", "")
    if len(parts) == 2:
        return {"label": f"{parts[0]} b{parts[1]}{layout_label}", "spec": f"torchvision:{parts[0]}",
                "batch": int(parts[1]), "shape": None, "key": f"{parts[0]}-b{parts[1]}{layout_key}",
                "channels_last": channels_last}
    path, callable_name, batch, shape = parts
    name = Path(path).stem + "." + callable_name
    return {"label": f"{name} b{batch}{layout_label}", "spec": f"{path}:{callable_name}", "batch": int(batch),
            "shape": shape, "key": f"{name}-b{batch}-{shape.replace(',', 'x')}{layout_key}",
            "channels_last": channels_last}


def model_entries(models: str) -> list[str]:
    """The --models list split at commas, except those inside a file spec's SHAPE (`...:4:3,32,32:cl`): a piece
    that starts with a number continues the previous entry's shape (a model name never does)."""
    entries: list[str] = []
    for piece in models.split(","):
        if entries and piece.split(":")[0].isdigit():
            entries[-1] += "," + piece
        else:
            entries.append(piece)
    return entries


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlopt.cli", *args], cwd=REPO, capture_output=True, text=True)


def traced(model: dict) -> Path:
    path = CACHE / f"{model['key']}.trace.json"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        shape = ("--input-shape", model["shape"]) if model["shape"] else ()
        layout = ("--channels-last",) if model.get("channels_last") else ()
        done = cli("trace", model["spec"], "--batch", str(model["batch"]), *shape, *layout, "--optimizer", "sgd",
                   "-o", str(path))
        if done.returncode != 0:
            raise SystemExit(f"mlopt trace {model['spec']} failed: {done.stderr.strip()}")
    return path


def planned(trace_path: Path, ratio: str, folder: Path, time_limit_s: float) -> tuple[Path | None, str]:
    """(plan path, "") or (None, why) when the planner finds no plan."""
    plan_path = folder / f"memory-{ratio}.plan.json"
    if ratio == "least":
        least = least_feasible_bytes(build_problem(load_trace(trace_path)))
        budget = ("--budget", str(least))
    else:
        budget = ("--budget-ratio", ratio)
    done = cli("plan", "memory", "--model", str(trace_path), *budget, "--time-limit", str(time_limit_s),
               "-o", str(plan_path))
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    return plan_path, ""


# ------------------------------------------------------------------------------------ measuring process


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_point(plan_path: str, trace_path: str, model: dict) -> dict:
    """One planned step of a fresh model in this (fresh) process; the figures as a dict."""
    import torch  # optional dependency: only the measuring process needs it

    from mlopt.pytorch.memory import load_memory_plan, measure_step
    from mlopt.pytorch.models import resolve_model
    from mlopt.pytorch.trace import SGD_SETTINGS, loss_outputs, make_targets, tensor_leaves, training_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net, default_shape, context = resolve_model(model["spec"])
    shape = [int(s) for s in model["shape"].split(",")] if model["shape"] else list(default_shape)
    net.train()
    inputs = torch.randn(model["batch"], *shape)
    if model.get("channels_last"):  # as `mlopt trace --channels-last` converted them when tracing
        net.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():  # the targets need only the outputs' shapes (loss_outputs would see no grads here)
        targets = make_targets([t for t in tensor_leaves(net(inputs)) if t.is_floating_point()], model["batch"], 0)
    optimizer = torch.optim.SGD(net.parameters(), **SGD_SETTINGS)
    executor = load_memory_plan(plan_path, net, trace=trace_path)

    def loss_fn(output, _):
        return training_loss(loss_outputs(output), targets)

    with executor:  # warm-up step with an update: momentum buffers allocated, as in training
        loss = loss_fn(net(inputs), None)
    loss.backward()
    optimizer.step()
    del loss
    net.zero_grad(set_to_none=True)
    rss_before = rss_bytes()
    measure = measure_step(net, inputs, None, loss_fn, executor)
    payload = load_plan(plan_path).payload
    constant = executor.problem.constant_bytes
    del context
    return {
        "budget_bytes": payload["budget_bytes"], "predicted_peak_bytes": payload["predicted"]["peak_bytes"],
        "constant_bytes": constant, "measured_above_constant_bytes": measure.peak_bytes,
        "measured_peak_bytes": constant + measure.peak_bytes,
        "predicted_forward_end_bytes": payload["predicted"].get("forward_end_bytes"),
        "measured_forward_end_bytes": measure.forward_end_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_before_step_bytes": rss_before,
        "recomputed": measure.recomputed, "fallbacks": measure.fallbacks,
    }


# ------------------------------------------------------------------------------------ driver


def run_point(plan_path: Path, trace_path: Path, model: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--measure", json.dumps([str(plan_path), str(trace_path), model])],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(models: list[dict], ratios: list[str], time_limit_s: float) -> list[dict]:
    rows = []
    for model in models:
        trace_path = traced(model)
        folder = CACHE / model["key"]
        folder.mkdir(parents=True, exist_ok=True)
        for ratio in ratios:
            started = time.perf_counter()
            plan_path, why = planned(trace_path, ratio, folder, time_limit_s)
            row = {"model": model["label"], "ratio": ratio}
            row.update(run_point(plan_path, trace_path, model) if plan_path else {"error": why})
            row["wall_s"] = round(time.perf_counter() - started, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _mb(value: int) -> str:
    return f"{value / 1e6:.1f}"


def _excess(row: dict) -> str:
    """How far the measured peak is over the budget: in bytes when under 0.05%, else in percent."""
    over = row["measured_peak_bytes"] - row["budget_bytes"]
    return f"+{over} B" if over < 0.0005 * row["budget_bytes"] else f"{over / row['budget_bytes'] * 100:+.1f}%"


def table(rows: list[dict]) -> list[str]:
    lines = ["| model | ratio | budget (MB) | predicted peak (MB) | measured allocator peak (MB) | measured / predicted "
             "| measured <= budget | peak RSS (MB) | recomputed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['ratio']} | | | | | | | {r['error']} |")
            continue
        ratio = r["measured_peak_bytes"] / r["predicted_peak_bytes"] - 1.0
        fits = "yes" if r["measured_peak_bytes"] <= r["budget_bytes"] else f"no ({_excess(r)})"
        lines.append(f"| {r['model']} | {r['ratio']} | {_mb(r['budget_bytes'])} | {_mb(r['predicted_peak_bytes'])} | "
                     f"{_mb(r['measured_peak_bytes'])} | {ratio * 100:+.1f}% | {fits} | {_mb(r['peak_rss_bytes'])} | "
                     f"{r['recomputed']} |")
    return lines


def write_doc(runs: dict[str, dict]) -> None:
    lines = ["# Memory-plan fidelity benchmark", "",
             "Made by `python bench/memory_fidelity.py` (module docstring: method). Each point is one real training",
             "step (forward, loss, backward) of the plan applied with `mlopt.pytorch.load_memory_plan`, in a fresh",
             "process, CPU, one intra-op thread. Predicted = the plan's replayed peak (what `mlopt validate` checks",
             "against the budget); measured allocator peak = constant bytes (parameters, buffers, SGD momentum, inputs)",
             "+ the allocator's high-water mark during the step (torch.profiler memory events). Peak RSS is the whole",
             "process's (Python, torch and the warm-up step included), for scale only. Target (issue 26): measured <=",
             f"budget at every point and within {TOLERANCE * 100:.0f}% of predicted.", ""]
    for tag, run_ in sorted(runs.items(), key=lambda item: (item[0] != "before", item[0])):  # before first
        lines += [f"## {tag}", "", run_.get("note", ""), "", f"Models: {run_['models']}; ratios: {run_['ratios']}; "
                  f"{run_['time_limit_s']:g} s per plan.", "", *table(run_["rows"]), ""]
    DOC.write_text("\n".join(lines) + _kept_findings())


def _kept_findings() -> str:
    """The hand-written analysis below FINDINGS in the current doc, kept across reruns."""
    if not DOC.exists() or FINDINGS not in DOC.read_text():
        return ""
    return "\n" + FINDINGS + DOC.read_text().split(FINDINGS, 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--ratios", default=DEFAULT_RATIOS)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per plan (mlopt's --time-limit)")
    parser.add_argument("--tag", default="run", help="name of this run in the results and the doc (e.g. before)")
    parser.add_argument("--note", default="", help="a line under the run's heading")
    parser.add_argument("--doc-only", action="store_true", help="rewrite the doc from the results file, run nothing")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.doc_only:
        write_doc(json.loads(RESULTS.read_text())["runs"])
        return
    if args.measure:
        plan_path, trace_path, model = json.loads(args.measure)
        print(json.dumps(measure_point(plan_path, trace_path, model)))
        return
    models = [model_spec(m) for m in model_entries(args.models)]
    rows = run(models, args.ratios.split(","), args.time_limit)
    runs = json.loads(RESULTS.read_text())["runs"] if RESULTS.exists() else {}
    runs[args.tag] = {"note": args.note, "models": args.models, "ratios": args.ratios,
                      "time_limit_s": args.time_limit, "rows": rows}
    write_json(RESULTS, {"benchmark": "memory_fidelity", "runs": runs})
    write_doc(runs)


if __name__ == "__main__":
    main()

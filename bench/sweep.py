"""`mlopt sweep` benchmark: collective grids through the local pool and a 2-worker local cluster, then re-run
from the plan cache and with --resume.

    python bench/sweep.py   # allgather/allreduce/alltoall x 1KiB..1GiB x ndv2x2, dgx2x2 (ring); auto on ndv2x2
    python bench/sweep.py --collectives allgather --sizes 1KiB..16KiB --topologies ring:4 --auto-topologies ''

Two grids: the full one with the ring baseline, and the planner's `auto` on the ndv2x2 half (on dgx2x2 it
takes minutes per cell). Every run is the real command (`python -m mlopt.cli sweep SPEC -o DIR ...` in a
fresh process), timed end to end: start-up, pool or cluster start, the cells, the summary and plots. Per
grid, in this order, each into a fresh folder: the local pool (--workers W, filling an empty cache), the
cluster executor (dask, or ray if asked; its own local cluster of W workers on 127.0.0.1, no cache), the
local pool again from the cache (every cell a hit), and --resume over the first folder (every cell kept).
The plan files of the first three folders are compared byte for byte. Writes bench/results/sweep.json and
docs/sweep-benchmark.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def spec_text(collectives: list[str], sizes: str, topologies: list[str], algorithm: str) -> str:
    return "\n".join([
        "planner: collective",
        "options:",
        f"  algorithm: {algorithm}",
        "grid:",
        f"  collective: [{', '.join(collectives)}]",
        f"  size: {sizes}",
        f"  topology: [{', '.join(topologies)}]",
        "",
    ])


def sweep(spec: Path, out: Path, *args: str) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mlopt.cli", "-q", "sweep", str(spec), "-o", str(out), *args],
                          cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"mlopt sweep {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return wall, done.returncode


def rows_of(out: Path) -> list[dict]:
    with open(out / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def plan_bytes(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.suffix in (".xml", ".json")}


def json_diff(a: bytes | None, b: bytes | None) -> list[str]:
    """Paths of the JSON fields that differ (field names only, list indices kept); ['$'] for non-JSON."""
    try:
        x, y = json.loads(a), json.loads(b)
    except (TypeError, ValueError):
        return ["$ (not JSON)"]
    out: list[str] = []

    def walk(u, v, path):
        if isinstance(u, dict) and isinstance(v, dict):
            for k in sorted(set(u) | set(v)):
                walk(u.get(k), v.get(k), f"{path}.{k}")
        elif isinstance(u, list) and isinstance(v, list) and len(u) == len(v):
            for i, (p, q) in enumerate(zip(u, v)):
                walk(p, q, f"{path}[{i}]")
        elif u != v:
            out.append(path)

    walk(x, y, "$")
    return out


def markdown(results: list[dict], command: str) -> str:
    first = results[0]
    lines = [
        "# Sweep benchmark",
        "",
        f"Made by `{command}` on a {first['cpus']}-core machine that other jobs were sharing (times carry some",
        "noise). Every time is a whole `mlopt sweep` command in a fresh process, from start-up to the summary and",
        f"plots, with {first['workers']} workers. Per grid, four runs: the local pool filling an empty cache, a local",
        f"{first['workers']}-worker {first['cluster']} cluster (no cache), the local pool again (every cell a cache",
        "hit) and `--resume` over the first run's folder (every cell kept).",
        "",
    ]
    for r in results:
        runs = r["runs"]
        lines += [
            f"## {r['title']}",
            "",
            "```yaml",
            r["spec"].rstrip(),
            "```",
            "",
            f"{r['cells']} cells ({r['plans']} with plans, {r['failed']} failed). Sum of the cells' own wall times "
            f"(each cell's `mlopt plan` inside its worker, from the cluster run): {r['cell_seconds']:.1f} s; the "
            f"slowest cell {r['slowest_cell_s']:.1f} s ({r['slowest_cell']}).",
            "",
            "| run | command options | wall s | vs local pool |",
            "|---|---|---|---|",
        ]
        base = runs[0]["wall_s"]
        for run in runs:
            lines.append(f"| {run['name']} | `{run['options']}` | {run['wall_s']:.1f} | "
                         f"{run['wall_s'] / base:.2f}x |")
        same = "yes" if r["identical"] else f"no: {len(r['differing'])} differ"
        lines += [
            "",
            f"Plan files byte-identical across the local, cluster and cache-hit folders: {same} ({r['files']} files "
            "each).",
        ]
        for name, fields in sorted(r["differing"].items()):
            lines.append(f"- `{name}`: {', '.join(f'`{f}`' for f in fields)}")
        lines += [
            "",
            "Cells' summed wall time (s) per topology and collective:",
            "",
            "| topology | " + " | ".join(r["collectives"]) + " |",
            "|---|" + "---|" * len(r["collectives"]),
        ]
        for topo in r["topologies"]:
            cells = [f"{r['per_group'].get(f'{topo}/{c}', 0.0):.1f}" for c in r["collectives"]]
            lines.append(f"| {topo} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Notes", "", *NOTES, ""]
    return "\n".join(lines)


NOTES = [
    "- The full grid (3 collectives x 11 sizes x 2 topologies) runs `--algorithm ring`, the baseline: the",
    "  planner's default `auto` (every family, TACCL synthesis included) takes 20-60 s per dgx2x2 cell",
    "  (docs/collective-benchmark.md): about 25 minutes of cell time for that grid, some 12 minutes per run on two",
    "  workers and two such runs, over this benchmark's 10-minute budget. `auto` runs on the ndv2x2 half of the",
    "  grid instead, where cells take 1-12 s.",
    "- Cluster runs include starting the scheduler and worker processes (127.0.0.1 only); local pool runs include",
    "  spawning the workers. Each worker imports mlopt once (about 1 s, in its first cell's wall time).",
    "- Cells differ a lot in cost (dgx2x2 alltoall dominates the ring grid), so two workers cannot halve the",
    "  summed cell time exactly; the pool and the cluster both hand out cells as workers free up.",
    "- `auto` stops each MILP stage after 500 branch-and-bound nodes (`AUTO_STAGE_NODE_LIMIT` in",
    "  mlopt/planners/collective/planner.py; 60 s of wall clock only as a safety net), a limit that stops at the",
    "  same point on every run. Plans are byte-identical when the planner is deterministic: no wall-clock limit",
    "  reached (`--time-limit`, `auto`'s safety net, schedule's `--budget-s`) and no `--record-wall-time`. A cache",
    "  hit always repeats the bytes of the solve that filled the cache.",
    "- Cache-hit and `--resume` runs start no workers: their time is start-up, hashing the cells' inputs and",
    "  mlopt's sources, copying or checking the files, and the summary and plots.",
]


def scenario(title: str, collectives: list[str], sizes: str, topologies: list[str], algorithm: str, workers: int,
             cluster: str) -> dict:
    text = spec_text(collectives, sizes, topologies, algorithm)
    w = str(workers)
    with tempfile.TemporaryDirectory(prefix="mlopt-bench-sweep-") as tmp:
        tmp = Path(tmp)
        spec = tmp / "collectives.yaml"
        spec.write_text(text)
        cache = tmp / "cache"
        plan = [
            ("local pool, cold cache", tmp / "local", ["--workers", w, "--cache", str(cache)]),
            (f"{cluster}: local {w}-worker cluster", tmp / "cluster",
             ["--executor", cluster, "--workers", w, "--no-cache"]),
            ("local pool, every cell a cache hit", tmp / "hit", ["--workers", w, "--cache", str(cache)]),
            ("--resume over the first folder", tmp / "local", ["--workers", w, "--resume", "--no-cache"]),
        ]
        runs = []
        for name, out, options in plan:
            wall, code = sweep(spec, out, *options)
            states = {row["cache"] for row in rows_of(out)}
            shown = " ".join("CACHE" if o == str(cache) else o for o in options)
            runs.append({"name": name, "options": shown, "wall_s": wall, "exit_code": code, "cache": sorted(states)})
            print(f"{title}: {name}: {wall:.1f} s (exit {code}, cache {sorted(states)})", file=sys.stderr)
        first = rows_of(tmp / "local")
        folders = [plan_bytes(tmp / d) for d in ("local", "cluster", "hit")]
        identical = all(f == folders[0] for f in folders[1:])
        differing = {}  # file -> JSON fields that differ, between the first folder and another
        for other in folders[1:]:
            for name in sorted(set(folders[0]) | set(other)):
                if folders[0].get(name) != other.get(name):
                    differing.setdefault(name, sorted(set(json_diff(folders[0].get(name), other.get(name)))))
        cold = rows_of(tmp / "cluster")  # every cell solved there (no cache)
    cell_s = [(float(r["wall_s"]), r["cell"]) for r in cold if r["wall_s"]]
    per_group: dict[str, float] = {}
    for r in cold:
        if r["wall_s"]:
            key = f"{r['topology']}/{r['collective']}"
            per_group[key] = per_group.get(key, 0.0) + float(r["wall_s"])
    slowest = max(cell_s)
    return {"title": title, "spec": text, "cells": len(first), "plans": sum(r["exit_code"] == "0" for r in first),
            "failed": sum(r["exit_code"] != "0" for r in first), "cell_seconds": sum(s for s, _ in cell_s),
            "slowest_cell_s": slowest[0], "slowest_cell": slowest[1], "runs": runs, "identical": identical,
            "differing": differing,
            "files": len(folders[0]), "per_group": per_group, "collectives": collectives, "topologies": topologies,
            "workers": workers, "cpus": os.cpu_count(), "cluster": cluster}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", default="allgather,allreduce,alltoall")
    parser.add_argument("--sizes", default="1KiB..1GiB")
    parser.add_argument("--topologies", default="ndv2x2,dgx2x2")
    parser.add_argument("--algorithm", default="ring", help="of the full grid (ring: the baseline, seconds per cell)")
    parser.add_argument("--auto-topologies", default="ndv2x2",
                        help="a second grid with --algorithm auto on these topologies ('' to skip)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cluster", choices=["dask", "ray"], default="dask")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "sweep.json"))
    parser.add_argument("--docs", default=str(REPO / "docs" / "sweep-benchmark.md"))
    args = parser.parse_args()
    collectives = args.collectives.split(",")
    results = [scenario(f"{', '.join(collectives)} x {args.sizes} x {args.topologies.replace(',', ', ')}, "
                        f"{args.algorithm}", collectives, args.sizes, args.topologies.split(","), args.algorithm,
                        args.workers, args.cluster)]
    if args.auto_topologies:
        results.append(scenario(f"{', '.join(collectives)} x {args.sizes} x "
                                f"{args.auto_topologies.replace(',', ', ')}, auto", collectives, args.sizes,
                                args.auto_topologies.split(","), "auto", args.workers, args.cluster))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    command = "python bench/sweep.py " + " ".join(sys.argv[1:])
    Path(args.docs).write_text(markdown(results, command.strip()))
    for r in results:
        print(r["title"], json.dumps({run["name"]: round(run["wall_s"], 1) for run in r["runs"]}), r["identical"],
              json.dumps(r["differing"]))


if __name__ == "__main__":
    main()

"""Collectives between processes: the mlopt torch.distributed backend against gloo, in the same run.

    python bench/collectives_mp.py                    # 2 and 4 processes, 64KiB..256MiB; docs/collectives-mp-benchmark.md
    python bench/collectives_mp.py --ranks 2 --sizes 1MiB,16MiB --repeats 3 --quick-doc   # a smoke run

One job per (processes, system), each one process per rank on this machine (spawned like torchrun: RANK,
WORLD_SIZE, a FileStore): `gloo` (PyTorch's CPU backend, defaults), `mlopt-ring` (the mlopt backend with an
index of ring programs only) and `mlopt-best` (the mlopt backend with the planner's plans: `mlopt plan
collective` on the topology that `mlopt profile hardware --transport processes` measures on these ranks, one plan
per collective and planned size; a call takes the plan of the nearest planned size). Every job runs allreduce,
allgather, reduce_scatter, all_to_all and broadcast of every size on float32 CPU tensors: warm-up calls, then
--repeats timed calls each after a barrier; a call's time is the slowest rank's, the figure the median over the
repeats. Sizes follow nccl-tests: the buffer (allreduce, broadcast), the output per rank (allgather,
all_to_all), the input per rank (reduce_scatter). Bus bandwidth is nccl-tests' too (algbw times 2(n-1)/n for
allreduce, (n-1)/n for allgather, reduce_scatter and all_to_all, 1 for broadcast), and the physical limit is a
single thread's memcpy of the same bytes measured in the parent (numpy.copyto, median of 5).

Targets (issue 23): mlopt >= 1.5x gloo from 1 MiB up, and bus bandwidth >= 0.5 of memcpy at >= 16 MiB.
Every output of every timed call is checked against the expected values (a wrong result fails the bench).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ranks import spawn_ranks  # bench/ranks.py (this script's folder is on sys.path)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlopt.formats.sizes import format_size, parse_size  # noqa: E402
from mlopt.planners.umbrella import write_plan_index  # noqa: E402

RESULTS = REPO / "bench" / "results" / "collectives_mp.json"
DOC = REPO / "docs" / "collectives-mp-benchmark.md"
PLOT = REPO / "docs" / "collectives-mp.png"
CACHE = REPO / "bench" / ".cache" / "collectives_mp"

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
PLANNED_SIZES = ("64KiB", "1MiB", "16MiB", "256MiB")  # the planner's plans; calls take the nearest
DEFAULT_SIZES = "64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB"
SYSTEMS = ("gloo", "mlopt-ring", "mlopt-best")
JOB_TIMEOUT_S = 1800


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective == "broadcast":
        return 1.0
    return (n - 1) / n


# ------------------------------------------------------------------------------------------------ plans


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO)


def _index(folder: Path, sidecars: list[Path]) -> Path:
    """An mlopt.plan-index over collective sidecars (what `mlopt plan --model` writes, collectives only)."""
    plans = []
    for sidecar in sidecars:
        prov = json.loads(sidecar.read_text())["provenance"]
        plans.append({"kind": "collective", "file": sidecar.name, "status": prov["status"],
                      "objective": prov["objective"], "gap": prov["gap"]})
    write_plan_index(folder, plans, [], {})
    return folder / "index.json"


def make_indexes(n: int, folder: Path) -> dict[str, Path]:
    """Profile the ranks, plan every collective at PLANNED_SIZES twice (ring only, and the planner's best)."""
    folder.mkdir(parents=True, exist_ok=True)
    topology = folder / "topology.json"
    _run(["mlopt", "profile", "hardware", "--transport", "processes", "--ranks", str(n), "-o", str(topology),
          "--no-plot"])
    indexes = {}
    for system, algorithm in (("mlopt-ring", "ring"), ("mlopt-best", "auto")):
        sub = folder / system
        sub.mkdir(exist_ok=True)
        sidecars = []
        for collective in COLLECTIVES:
            for size in PLANNED_SIZES:
                xml = sub / f"{collective}-{size}.xml"
                _run(["mlopt", "plan", "collective", "--topology", str(topology), "--collective", collective,
                      "--size", size, "--algorithm", algorithm, "-o", str(xml)])
                sidecars.append(xml.with_suffix(".json"))
        indexes[system] = _index(sub, sidecars)
    return indexes


# ------------------------------------------------------------------------------------------------ worker


def _expected(collective: str, n: int, rank: int, elems: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, expected output) of rank `rank`: input element i of rank r is r + 1 + (i mod 7)."""
    def inp(r: int, count: int) -> np.ndarray:
        return (r + 1 + (np.arange(count) % 7)).astype(np.float32)

    if collective == "allreduce":
        return inp(rank, elems), sum(inp(r, elems) for r in range(n))
    if collective == "broadcast":
        return inp(rank, elems), inp(0, elems)
    if collective == "allgather":
        per = elems // n
        return inp(rank, per), np.concatenate([inp(r, per) for r in range(n)])
    if collective == "reducescatter":
        per = elems // n
        total = sum(inp(r, elems) for r in range(n))
        return inp(rank, elems), total[rank * per:(rank + 1) * per]
    per = elems // n  # alltoall: block j of rank r's input goes to block r of rank j's output
    return inp(rank, elems), np.concatenate([inp(r, elems)[rank * per:(rank + 1) * per] for r in range(n)])


def _call(dist, torch, collective: str, tensor, out):
    if collective == "allreduce":
        dist.all_reduce(tensor)
        return tensor
    if collective == "broadcast":
        dist.broadcast(tensor, src=0)
        return tensor
    if collective == "allgather":
        dist.all_gather_into_tensor(out, tensor)
    elif collective == "reducescatter":
        dist.reduce_scatter_tensor(out, tensor)
    else:
        dist.all_to_all_single(out, tensor)
    return out


def _measure(dist, torch, collective: str, n: int, rank: int, nbytes: int, warmup: int, repeats: int) -> list[float]:
    elems = nbytes // 4
    source, expected = _expected(collective, n, rank, elems)
    out_elems = {"allgather": elems, "reducescatter": elems // n, "alltoall": elems}.get(collective, 0)
    out = torch.empty(out_elems, dtype=torch.float32) if out_elems else None
    times = []
    for i in range(warmup + repeats):
        tensor = torch.from_numpy(source.copy())
        dist.barrier()
        start = time.perf_counter()
        result = _call(dist, torch, collective, tensor, out)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed * 1e6)
        if i == 0 or i == warmup + repeats - 1:
            if not np.array_equal(result.numpy(), expected):
                raise SystemExit(f"rank {rank}: {collective} of {nbytes} bytes gave a wrong result")
    return times


def worker(args) -> None:
    """One rank of one job: every collective and size; writes this rank's times as JSON."""
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.system != "gloo":
        import mlopt.pytorch

        mlopt.pytorch.register()
    store = dist.FileStore(args.store, n)
    dist.init_process_group("gloo" if args.system == "gloo" else "mlopt", store=store, rank=rank, world_size=n)
    times = {}
    for collective in COLLECTIVES:
        for size in args.sizes.split(","):
            nbytes = parse_size(size)
            times[f"{collective}/{nbytes}"] = _measure(dist, torch, collective, n, rank, nbytes, args.warmup,
                                                       args.repeats)
    dist.barrier()
    dist.destroy_process_group()
    Path(args.out).with_suffix(f".rank{rank}.json").write_text(json.dumps(times))


def run_job(system: str, n: int, index: Path | None, args, folder: Path) -> dict[str, list[float]]:
    """Spawns the n ranks of one job, waits (bounded), and returns per call the slowest rank's times."""
    store = folder / f"{system}-{n}.store"
    store.unlink(missing_ok=True)
    out = folder / f"{system}-{n}"
    env = {"MLOPT_PLAN_INDEX": str(index)} if index is not None else {}
    spawn_ranks(n, lambda rank: [sys.executable, __file__, "--worker", "--system", system, "--store", str(store),
                                 "--out", str(out), "--sizes", args.sizes, "--repeats", str(args.repeats),
                                 "--warmup", str(args.warmup)],
                env, JOB_TIMEOUT_S, REPO, f"{system} with {n} processes")
    per_rank = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(n)]
    return {key: [max(rank_times[key][i] for rank_times in per_rank) for i in range(len(per_rank[0][key]))]
            for key in per_rank[0]}


# ------------------------------------------------------------------------------------------------ report


def memcpy_us(nbytes: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def rows_for(n: int, jobs: dict[str, dict[str, list[float]]], memcpy: dict[int, float]) -> list[dict]:
    rows = []
    for key in jobs["gloo"]:
        collective, nbytes = key.split("/")
        nbytes = int(nbytes)
        row = {"ranks": n, "collective": collective, "bytes": nbytes, "memcpy_us": memcpy[nbytes]}
        for system, times in jobs.items():
            us = statistics.median(times[key])
            row[f"{system}_us"] = us
            row[f"{system}_busbw_GBps"] = nbytes * bus_factor(collective, n) / us / 1e3
        memcpy_GBps = nbytes / memcpy[nbytes] / 1e3
        row["memcpy_GBps"] = memcpy_GBps
        best = min(row["mlopt-ring_us"], row["mlopt-best_us"])
        row["speedup_vs_gloo"] = row["gloo_us"] / best
        row["busbw_over_memcpy"] = nbytes * bus_factor(collective, n) / best / 1e3 / memcpy_GBps
        rows.append(row)
    return rows


def verdicts(rows: list[dict]) -> dict[str, str]:
    big = [r for r in rows if r["bytes"] >= 1 << 20]
    huge = [r for r in rows if r["bytes"] >= 16 << 20]
    speed_ok = sum(r["speedup_vs_gloo"] >= 1.5 for r in big)
    bw_ok = sum(r["busbw_over_memcpy"] >= 0.5 for r in huge)
    return {"speedup": f"{speed_ok} of {len(big)} cells >= 1 MiB reach 1.5x gloo",
            "bandwidth": f"{bw_ok} of {len(huge)} cells >= 16 MiB reach 0.5x memcpy bus bandwidth"}


def write_doc(rows: list[dict], meta: dict, command: str) -> None:
    lines = ["# Collectives between processes: mlopt backend vs gloo", "",
             f"Made by `{command}` (bench/collectives_mp.py; {meta['machine']}, {meta['date']}).", "",
             "Times are the median over the repeats of the slowest rank's call; `best` is the faster of the mlopt "
             "ring index and the planner's index; bus bandwidth as nccl-tests; memcpy is one thread's numpy copy "
             "of the same bytes.", "",
             f"- {meta['verdicts']['speedup']}", f"- {meta['verdicts']['bandwidth']}", "",
             "| ranks | collective | size | gloo us | mlopt ring us | mlopt best us | best / gloo speed-up "
             "| best busbw GB/s | memcpy GB/s | busbw / memcpy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best_bw = max(r["mlopt-ring_busbw_GBps"], r["mlopt-best_busbw_GBps"])
        lines.append(f"| {r['ranks']} | {r['collective']} | {format_size(r['bytes'])} | {r['gloo_us']:.0f} | "
                     f"{r['mlopt-ring_us']:.0f} | {r['mlopt-best_us']:.0f} | {r['speedup_vs_gloo']:.2f}x | "
                     f"{best_bw:.2f} | {r['memcpy_GBps']:.2f} | {r['busbw_over_memcpy']:.2f} |")
    lines += ["", f"![bus bandwidth per collective]({PLOT.name})", ""]
    DOC.write_text("\n".join(lines))


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(len(ranks), len(COLLECTIVES), figsize=(4 * len(COLLECTIVES), 3.2 * len(ranks)),
                             squeeze=False)
    for i, n in enumerate(ranks):
        for j, collective in enumerate(COLLECTIVES):
            ax = axes[i][j]
            cells = sorted((r for r in rows if r["ranks"] == n and r["collective"] == collective),
                           key=lambda r: r["bytes"])
            x = [r["bytes"] for r in cells]
            for system in SYSTEMS:
                ax.plot(x, [r[f"{system}_busbw_GBps"] for r in cells], marker="o", label=system)
            ax.plot(x, [r["memcpy_GBps"] for r in cells], linestyle="--", color="grey", label="memcpy")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{collective}, {n} processes", fontsize=9)
            ax.set_xlabel("bytes")
            ax.set_ylabel("bus GB/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick-doc", action="store_true", help="write results and doc under bench/.cache only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    global RESULTS, DOC, PLOT
    if args.quick_doc:
        RESULTS, DOC, PLOT = (CACHE / "collectives_mp.json", CACHE / "collectives-mp-benchmark.md",
                              CACHE / "collectives-mp.png")
    CACHE.mkdir(parents=True, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    memcpy = {s: memcpy_us(s) for s in sizes}
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlopt-bench-") as tmp:
        for n in (int(x) for x in args.ranks.split(",")):
            indexes = make_indexes(n, CACHE / f"plans-{n}")
            jobs = {}
            for system in SYSTEMS:
                print(f"{n} processes: {system} ...", file=sys.stderr, flush=True)
                jobs[system] = run_job(system, n, indexes.get(system), args, Path(tmp))
            rows += rows_for(n, jobs, memcpy)
    meta = {"machine": f"{os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d"), "verdicts": verdicts(rows)}
    command = "python bench/collectives_mp.py " + " ".join(sys.argv[1:])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "command": command.strip(), "rows": rows}, indent=1) + "\n")
    write_doc(rows, meta, command.strip())
    plot(rows)
    print("\n".join(meta["verdicts"].values()))


if __name__ == "__main__":
    main()

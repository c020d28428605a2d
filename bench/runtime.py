"""CPU runtime benchmark: the interpreter running planned MSCCL-EF XMLs vs torch.distributed (gloo) and memcpy.

    python bench/runtime.py                                   # allreduce + allgather, 2/4/8 ranks, 1MiB..256MiB
    python bench/runtime.py --ranks 4 --sizes 16MiB,64MiB --collectives allreduce
    python bench/runtime.py --quick --output /tmp/rt.md       # seconds: tiny sizes, 2 ranks (smoke test)

For every collective and rank count N two XMLs are planned (written to bench/.cache/runtime/): the ring
(`--topology ring:N --algorithm ring`) and the planner's best (`--topology fully-connected:N --algorithm
auto`: ranks on one shared-memory machine can all reach each other directly). Each is run by the runtime's
CPU interpreter through mlopt.native.run_collective (ranks are threads of this process; every run's output
is checked against numpy, a mismatch stops the bench), and the same collectives are timed in the same run
with torch.distributed's gloo backend (N processes on this machine, one process group per N). The physical
limit is a single-threaded numpy copy of the same number of bytes. At a tiny size the time per executed
step gives the interpreter's per-step overhead.

Conventions (nccl-tests): float32, op sum; size = the larger buffer per rank (allgather: the output);
algorithm bandwidth = size / time. Every timing is the median over its timed iterations, chosen so that a
point takes about --seconds-per-point (at least --min-iterations, at most --max-iterations) after a warm-up.
Writes docs/runtime-benchmark.md (--output), one PNG per collective beside it (runtime-<collective>.png)
and the raw rows to bench/.cache/runtime/results.json (--cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlopt.formats.sizes import format_size, parse_size  # noqa: E402

DOC = REPO / "docs" / "runtime-benchmark.md"
CACHE = REPO / "bench" / ".cache" / "runtime"
COLLECTIVES = ("allreduce", "allgather")
VARIANTS = ("ring", "best")
TARGET_RATIO = 0.8
TARGET_MIN_SIZE = 16 << 20
ELEMENT_BYTES = 4  # float32


@dataclass(frozen=True)
class BenchConfig:
    collectives: tuple[str, ...] = COLLECTIVES
    ranks: tuple[int, ...] = (2, 4, 8)
    sizes: tuple[int, ...] = (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20)
    plan_size: int = 64 << 20  # size the XMLs are planned for (--size of `mlopt plan collective`)
    seconds_per_point: float = 1.0
    min_iterations: int = 3
    max_iterations: int = 50
    threads: int = 0  # interpreter worker threads (0: one per hardware thread)
    overhead_size: int = 4 << 10
    overhead_iterations: int = 50
    gloo: bool = True


QUICK = BenchConfig(ranks=(2,), sizes=(64 << 10, 256 << 10), plan_size=256 << 10, seconds_per_point=0.05,
                    min_iterations=2, max_iterations=5, overhead_iterations=3)


# ------------------------------------------------------------------------------------------------ pure helpers


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1MiB,4MiB' -> (1048576, 4194304), ascending and without duplicates."""
    return tuple(sorted({parse_size(s.strip(), "--sizes") for s in text.split(",") if s.strip()}))


def parse_ints(text: str) -> tuple[int, ...]:
    values = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive integers")
    return values


def parse_collectives(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"collectives must be among {', '.join(COLLECTIVES)}, not {text!r}")
    return names


def fit_size(size: int, step: int) -> int:
    """`size` rounded up to a multiple of `step` (a program's chunks must hold whole elements)."""
    return max(step, -(-size // step) * step)


def iterations_for(estimate_s: float | None, seconds: float, lo: int, hi: int) -> int:
    """Timed iterations for a point whose single run takes about `estimate_s`: about `seconds` in all."""
    if estimate_s is None or estimate_s <= 0:
        return hi
    return max(lo, min(hi, int(seconds / estimate_s)))


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def gbps(nbytes: float, time_us: float) -> float | None:
    """GB/s (1e9 bytes per second) of `nbytes` in `time_us`; None when the time is not positive."""
    return nbytes / time_us / 1e3 if time_us and time_us > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def table_rows(results: dict) -> list[dict]:
    """One row per (collective, ranks, size): interpreter (ring, best), gloo and memcpy GB/s and the ratios."""
    interp = {(r["collective"], r["ranks"], r["variant"], r["size_bytes"]): r for r in results["interpreter"]}
    gloo = {(r["collective"], r["ranks"], r["size_bytes"]): r for r in results["gloo"]}
    memcpy = {r["size_bytes"]: r for r in results["memcpy"]}
    keys = sorted({(r["collective"], r["ranks"], r["size_bytes"]) for r in results["interpreter"]}
                  | set(gloo), key=lambda k: (COLLECTIVES.index(k[0]) if k[0] in COLLECTIVES else 99, k[1], k[2]))
    rows = []
    for coll, n, size in keys:
        ring, best = interp.get((coll, n, "ring", size)), interp.get((coll, n, "best", size))
        ref = gloo.get((coll, n, size))
        g = ref["algbw_GBps"] if ref else None
        rows.append({
            "collective": coll, "ranks": n, "size_bytes": size,
            "ring_GBps": ring["algbw_GBps"] if ring else None,
            "best_GBps": best["algbw_GBps"] if best else None,
            "best_algorithm": best["algorithm"] if best else None,
            "gloo_GBps": g,
            "ring_vs_gloo": ratio(ring["algbw_GBps"] if ring else None, g),
            "best_vs_gloo": ratio(best["algbw_GBps"] if best else None, g),
            "memcpy_GBps": memcpy[size]["GBps"] if size in memcpy else None,
            "ring_moved_GBps": ring["moved_GBps"] if ring else None,
            "best_moved_GBps": best["moved_GBps"] if best else None,
        })
    return rows


def targets(rows: list[dict], threshold: float = TARGET_RATIO, min_size: int = TARGET_MIN_SIZE) -> list[dict]:
    """The issue's target per (collective, ranks, size >= min_size): max(ring, best) / gloo >= threshold."""
    out = []
    for r in rows:
        if r["size_bytes"] < min_size:
            continue
        ours = max((v for v in (r["ring_GBps"], r["best_GBps"]) if v is not None), default=None)
        value = ratio(ours, r["gloo_GBps"])
        out.append({"collective": r["collective"], "ranks": r["ranks"], "size_bytes": r["size_bytes"],
                    "ratio": value, "met": None if value is None else value >= threshold})
    return out


def collective_table(rows: list[dict]) -> list[str]:
    lines = ["| ranks | size | ring GB/s | best GB/s | best algorithm | gloo GB/s | ring/gloo | best/gloo | "
             "memcpy GB/s | ring copies GB/s | best copies GB/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {format_size(r['size_bytes'])} | {fmt(r['ring_GBps'])} | "
                     f"{fmt(r['best_GBps'])} | {r['best_algorithm'] or '-'} | {fmt(r['gloo_GBps'])} | "
                     f"{fmt(r['ring_vs_gloo'], suffix='x')} | {fmt(r['best_vs_gloo'], suffix='x')} | "
                     f"{fmt(r['memcpy_GBps'])} | {fmt(r['ring_moved_GBps'])} | {fmt(r['best_moved_GBps'])} |")
    return lines


def targets_section(found: list[dict], threshold: float = TARGET_RATIO, min_size: int = TARGET_MIN_SIZE) -> list[str]:
    lines = ["## Targets", "",
             f"Target: max(ring, best) / gloo >= {threshold}x at every size >= {format_size(min_size)}."]
    if not found:
        return lines + ["", f"No point at >= {format_size(min_size)} was measured."]
    measured = [t for t in found if t["met"] is not None]
    failed = [t for t in measured if not t["met"]]
    lines += ["", f"- Met at {len(measured) - len(failed)} of {len(measured)} measured points"
              + (f" ({len(found) - len(measured)} without a gloo figure)." if len(measured) < len(found) else ".")]
    groups: dict[tuple[str, int], list[dict]] = {}
    for t in found:
        groups.setdefault((t["collective"], t["ranks"]), []).append(t)
    for (coll, n), items in groups.items():
        ratios = [t["ratio"] for t in items if t["ratio"] is not None]
        bad = [f"{format_size(t['size_bytes'])} ({t['ratio']:.2f}x)" for t in items if t["met"] is False]
        verdict = "no gloo figure" if not ratios else ("met" if not bad else "NOT met at " + ", ".join(bad))
        lowest = f"; lowest ratio {min(ratios):.2f}x" if ratios else ""
        lines.append(f"- {coll}, {n} ranks: {verdict}{lowest}.")
    if failed:
        lines += ["", "Failures: " + ", ".join(f"{t['collective']} {t['ranks']} ranks {format_size(t['size_bytes'])} "
                                               f"({t['ratio']:.2f}x)" for t in failed) + "."]
    return lines


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of y = a + b x; None without two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mx, my = statistics.fmean(x for x, _ in points), statistics.fmean(y for _, y in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def overhead_fit_lines(rows: list[dict]) -> list[str]:
    """The fixed cost per run and the marginal cost per step, fitted over the XMLs' step counts."""
    groups = [(c, [r for r in rows if r["collective"] == c]) for c in dict.fromkeys(r["collective"] for r in rows)]
    lines = []
    for name, items in [*groups, ("all XMLs", rows)] if len(groups) > 1 else groups:
        fit = fit_line([(r["steps"], r["median_us"]) for r in items])
        if fit is not None:
            lines.append(f"- {name}: median us ~ {fit[0]:.1f} + {fit[1]:.3f} x steps ({len(items)} XMLs, "
                         f"{min(r['steps'] for r in items)} to {max(r['steps'] for r in items)} steps).")
    return lines


def overhead_table(rows: list[dict]) -> list[str]:
    lines = ["| collective | ranks | XML | algorithm | size | steps | messages | median us | us per step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['collective']} | {r['ranks']} | {r['variant']} | {r['algorithm']} | "
                     f"{format_size(r['size_bytes'])} | {r['steps']} | {r['messages']} | {r['median_us']:.1f} | "
                     f"{r['per_step_us']:.2f} |")
    return lines


def xml_lines(xmls: list[dict]) -> list[str]:
    lines = []
    for x in xmls:
        what = (f"`{x['file']}` ({x['algorithm']}, {x['steps']} steps)" if x.get("error") is None
                else f"not produced: {x['error']}")
        lines.append(f"- {x['collective']}, {x['ranks']} ranks, {x['variant']} (`--topology {x['topology']} "
                     f"--algorithm {x['requested']}`): {what}")
    return lines


def markdown(results: dict) -> str:
    """The report: machine, command, method, one table per collective, targets, per-step overhead, XMLs."""
    meta, config = results["meta"], results["config"]
    rows = table_rows(results)
    threads = config["threads"] or meta["cpu_count"]
    lines = [
        "# CPU runtime benchmark",
        "",
        f"Made by `{meta['command']}` on {meta['date']} (wall time {meta['wall_s']:.0f} s).",
        "",
        f"Machine: {meta['cpu_count']} logical CPU(s), {meta['cpu_model']}, {meta['memory']}; Linux "
        f"{meta['kernel']}; Python {meta['python']}, numpy {meta['numpy']}, torch {meta['torch']}; runtime "
        f"library {meta['library_version']}; mlopt commit {meta['commit']}.",
        "",
        "## Method",
        "",
        "- **ring**: `mlopt plan collective --topology ring:N --algorithm ring`; **best**: the planner's choice "
        "with `--topology fully-connected:N --algorithm auto` (every rank of one shared-memory machine can reach "
        f"every other directly), both planned at `--size {format_size(config['plan_size'])}`. Run by the "
        f"runtime's CPU interpreter in this process (ranks are threads, {threads} worker thread(s)) through "
        "`mlopt.native.run_collective`: random float32 data, op sum, output buffers reused across runs, "
        "every run's outputs checked against numpy; time = the library's own wall time of one collective.",
        "- **gloo**: `torch.distributed` with the gloo backend, N processes on this machine (`OMP_NUM_THREADS=1`, "
        "one process group "
        f"per N; with both, up to {max(config['ranks'])} ranks share {meta['cpu_count']} CPU(s)), "
        f"`all_reduce` of the size per rank and `{results.get('gloo_allgather_api') or 'all_gather_single'}` "
        "with size/N in and size out per rank; each timed iteration starts after a barrier and counts the "
        "slowest rank." + (f" **Not measured in this run: {results['gloo_problem']}.**"
                           if results.get("gloo_problem") else ""),
        "- **memcpy**: one thread copying the size with `np.copyto` between two pre-faulted buffers: the "
        "physical limit of one copy stream (bytes copied / time; sizes that fit in the CPU caches copy at cache "
        "rather than DRAM speed). **copies GB/s**: bytes the interpreter "
        "wrote (sends, receives, copies and reductions over all ranks, `bytes_moved`) / time: what it asked "
        "of the memory system, to hold against memcpy.",
        f"- GB/s = 1e9 bytes/s of algorithm bandwidth (nccl-tests): size per rank (allgather: the output) / "
        f"time. Every figure is the median of its timed iterations (at least {config['min_iterations']}, at "
        f"most {config['max_iterations']}, about {config['seconds_per_point']:g} s per point, after a warm-up).",
        "",
    ]
    for coll in config["collectives"]:
        lines += [f"## {coll}", "", *collective_table([r for r in rows if r["collective"] == coll]), "",
                  f"![{coll}](runtime-{coll}.png)", ""]
    lines += [*targets_section(targets(rows)), "",
              "## Per-step overhead", "",
              f"Each XML at {format_size(config['overhead_size'])} (rounded up to whole elements per chunk), "
              f"median of {config['overhead_iterations']} runs: time / steps executed per run is an upper "
              "bound on the interpreter's cost per step (steps are counted over all ranks; the time includes "
              "starting the worker threads and waiting for peers). A line fitted through the XMLs' (steps, "
              "time) separates the fixed cost of a run from the marginal cost of one more step:", "",
              *overhead_table(results["overhead"]), "", *overhead_fit_lines(results["overhead"]), "",
              "## XMLs", "", *xml_lines(results["xmls"]), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plans


def plan_xml(collective: str, ranks: int, variant: str, plan_size: int, folder: Path) -> dict:
    """Plans the ring or the planner's best XML for (collective, ranks); the error instead when it fails."""
    from mlopt.errors import MloptError
    from mlopt.formats.topology import from_spec
    from mlopt.planners.collective.output import write_collective_plan
    from mlopt.planners.collective.planner import CollectiveOptions, plan_collective
    from mlopt.planners.options import PlannerOptions

    topology, requested = (f"ring:{ranks}", "ring") if variant == "ring" else (f"fully-connected:{ranks}", "auto")
    record = {"collective": collective, "ranks": ranks, "variant": variant, "topology": topology,
              "requested": requested, "algorithm": None, "file": None, "steps": None, "error": None}
    copts = CollectiveOptions(collective, plan_size, requested)
    try:
        result = plan_collective(from_spec(topology), copts, PlannerOptions(), inputs={"topology": topology})
        folder.mkdir(parents=True, exist_ok=True)
        xml, _ = write_collective_plan(result, str(folder / f"{collective}-{variant}-{ranks}.xml"), copts,
                                       PlannerOptions())
    except MloptError as exc:
        return {**record, "error": f"{type(exc).__name__}: {exc}"}
    from mlopt.native import binding as native

    with native.Plan.load(str(xml)) as plan:
        info = plan.program_info
    return {**record, "algorithm": result.plan.payload["algorithm"], "file": str(xml), "steps": info["steps"],
            "step_bytes": ELEMENT_BYTES * max(info["i_chunks"], info["o_chunks"])}


def display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return path


# ------------------------------------------------------------------------------------------------ measuring


def run_checked(xml: dict, size: int, iterations: int, threads: int):
    """run_collective on the XML; RuntimeError when any rank's output is wrong."""
    from mlopt.native.run_collective import RunCollectiveOptions, raise_for_mismatch, run_collective

    report = run_collective(xml["file"], RunCollectiveOptions(size_bytes=fit_size(size, xml["step_bytes"]),
                                                              iterations=iterations, threads=threads,
                                                              watchdog_ms=120000))
    raise_for_mismatch(report)
    return report


def measure_interpreter(xml: dict, config: BenchConfig, advance: Callable[[str], None]) -> list[dict]:
    """One row per size (ascending); the iteration count comes from the previous size's time, scaled."""
    rows, per_byte_s = [], None
    for size in config.sizes:
        advance(f"{xml['collective']} {xml['variant']} {xml['ranks']} ranks {format_size(size)}")
        estimate = None if per_byte_s is None else per_byte_s * size
        if estimate is None:  # first size: one probe run (warm-up + 1) gives the estimate
            probe = run_checked(xml, size, 1, config.threads)
            estimate = probe.time_us / 1e6
        report = run_checked(xml, size, iterations_for(estimate, config.seconds_per_point, config.min_iterations,
                                                       config.max_iterations), config.threads)
        mid = median(report.times_us)
        per_byte_s = mid / 1e6 / size
        rows.append({"collective": xml["collective"], "ranks": xml["ranks"], "variant": xml["variant"],
                     "algorithm": xml["algorithm"], "size_bytes": size, "run_bytes": report.size_bytes,
                     "iterations": report.iterations, "median_us": mid, "mean_us": report.time_us,
                     "algbw_GBps": gbps(report.size_bytes, mid), "moved_GBps": gbps(report.bytes_moved, mid),
                     "steps": report.steps_executed})
    return rows


def measure_overhead(xml: dict, config: BenchConfig) -> dict:
    report = run_checked(xml, config.overhead_size, config.overhead_iterations, config.threads)
    mid = median(report.times_us)
    return {"collective": xml["collective"], "ranks": xml["ranks"], "variant": xml["variant"],
            "algorithm": xml["algorithm"], "size_bytes": report.size_bytes, "steps": report.steps_executed,
            "messages": report.messages, "median_us": mid, "per_step_us": mid / max(1, report.steps_executed)}


def measure_memcpy(size: int, config: BenchConfig) -> dict:
    """Single-threaded np.copyto of `size` bytes between pre-faulted buffers."""
    src = np.empty(size // ELEMENT_BYTES, np.float32)
    src.fill(1.0)
    dst = np.empty_like(src)
    dst.fill(0.0)
    started = time.perf_counter()
    np.copyto(dst, src)  # warm-up
    iterations = iterations_for(time.perf_counter() - started, config.seconds_per_point, config.min_iterations,
                                max(config.max_iterations, 200))
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        np.copyto(dst, src)
        times.append((time.perf_counter() - started) * 1e6)
    mid = median(times)
    return {"size_bytes": size, "iterations": iterations, "median_us": mid, "GBps": gbps(src.nbytes, mid)}


def gloo_problem() -> str | None:
    """Why gloo cannot be measured here, or None when it can."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with the gloo backend is not available in this torch build"
    return None


def gloo_allgather(dist) -> tuple[str, Callable]:
    """(name, fn(output, input)) of the single-tensor allgather this torch has, else the list one."""
    for name in ("all_gather_single", "all_gather_into_tensor"):
        fn = getattr(dist, name, None)
        if fn is not None:
            return name, fn
    return "all_gather", lambda out, inp: dist.all_gather(list(out.chunk(dist.get_world_size())), inp)


def gloo_op(coll: str, size: int, rank: int, world: int, allgather: Callable) -> tuple[Callable[[], None], int]:
    """The timed call for one point and its size per rank in bytes (whole float32 elements per rank share).
    Data is zeros (allgather inputs: the rank number), so repeated sums never turn denormal or infinite."""
    import torch
    import torch.distributed as dist

    count = size // ELEMENT_BYTES // world * world
    if coll == "allreduce":
        buf = torch.empty(count).fill_(0.0)  # fill_ faults the pages in before the warm-up
        return (lambda: dist.all_reduce(buf)), count * ELEMENT_BYTES
    out, inp = torch.empty(count).fill_(0.0), torch.empty(count // world).fill_(float(rank))
    return (lambda: allgather(out, inp)), count * ELEMENT_BYTES


def gloo_worker(spec: dict) -> None:
    """One rank of the gloo measurement (a subprocess); rank 0 prints one JSON line per point."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    rank, world = spec["rank"], spec["world"]
    dist.init_process_group("gloo", init_method=spec["init"], rank=rank, world_size=world,
                            timeout=timedelta(seconds=spec["timeout_s"]))
    api, allgather = gloo_allgather(dist)
    for coll in spec["collectives"]:
        for size in spec["sizes"]:
            op, run_bytes = gloo_op(coll, size, rank, world, allgather)
            op()  # warm-up
            dist.barrier()
            started = time.perf_counter()
            op()
            estimate = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
            dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
            iterations = iterations_for(float(estimate[0]), spec["seconds"], spec["lo"], spec["hi"])
            times = []
            for _ in range(iterations):
                dist.barrier()
                started = time.perf_counter()
                op()
                times.append((time.perf_counter() - started) * 1e6)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                mid = median(slowest.tolist())
                print(json.dumps({"collective": coll, "ranks": world, "size_bytes": size,
                                  "run_bytes": run_bytes, "api": "all_reduce" if coll == "allreduce" else api,
                                  "iterations": iterations, "median_us": mid, "algbw_GBps": gbps(run_bytes, mid)}),
                      flush=True)
    dist.barrier()
    dist.destroy_process_group()


def measure_gloo(ranks: int, config: BenchConfig, advance: Callable[[str], None]) -> list[dict]:
    """Every collective and size on `ranks` gloo processes (subprocesses of this script, one process group)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlopt-gloo-") as tmp:
        spec = {"world": ranks, "init": f"file://{tmp}/store", "collectives": list(config.collectives),
                "sizes": list(config.sizes), "seconds": config.seconds_per_point, "lo": config.min_iterations,
                "hi": config.max_iterations, "timeout_s": 600}
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        logs = [Path(tmp) / f"rank{r}.log" for r in range(ranks)]
        procs = []
        for r in range(ranks):
            with open(logs[r], "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--gloo-worker", json.dumps({**spec, "rank": r})],
                    stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, stderr=log, text=True, env=env))
        advance(f"gloo {ranks} ranks: starting")
        for line in procs[0].stdout:
            row = json.loads(line)
            rows.append(row)
            advance(f"gloo {row['collective']} {ranks} ranks {format_size(row['size_bytes'])}")
        codes = [p.wait() for p in procs]
        if any(codes):
            tails = "\n".join(f"rank {r} (exit {c}): {logs[r].read_text()[-2000:]}"
                              for r, c in enumerate(codes) if c)
            raise RuntimeError(f"gloo on {ranks} ranks failed:\n{tails}")
    return rows


# ------------------------------------------------------------------------------------------------ report


def machine() -> dict:
    def cpuinfo(key: str) -> str:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "unknown CPU"

    def memory() -> str:
        try:
            kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
            return f"{kib / 2**20:.0f} GiB RAM"
        except (OSError, IndexError, ValueError):
            return "unknown RAM"

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    from mlopt.native import binding as native

    dirty = git("status", "--porcelain", "--", "runtime", "mlopt/native")
    commit = (git("rev-parse", "--short", "HEAD") or "unknown") + (
        " (runtime/ or mlopt/native/ with uncommitted changes)" if dirty else "")
    return {"cpu_count": os.cpu_count(), "cpu_model": cpuinfo("model name"), "memory": memory(),
            "kernel": platform.release(), "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch_version, "library_version": ".".join(map(str, native.version())), "commit": commit}


def plot(results: dict, collective: str, path: Path) -> None:
    """GB/s vs size (log x), one subplot per rank count: ring, best, gloo and memcpy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in table_rows(results) if r["collective"] == collective]
    ranks = sorted({r["ranks"] for r in rows})
    if not ranks:
        return
    fig = Figure(figsize=(4.5 * len(ranks), 4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(ranks), sharey=True, squeeze=False)[0]
    series = (("ring_GBps", "interpreter, ring XML", "o"), ("best_GBps", "interpreter, best XML", "s"),
              ("gloo_GBps", "torch.distributed gloo", "^"), ("memcpy_GBps", "memcpy (1 thread)", "x"))
    for ax, n in zip(axes, ranks):
        mine = [r for r in rows if r["ranks"] == n]
        for key, label, marker in series:
            points = [(r["size_bytes"], r[key]) for r in mine if r[key] is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=label,
                        linestyle="--" if key == "memcpy_GBps" else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({r["size_bytes"] for r in mine})
        ax.set_xticks(sizes, [format_size(s) for s in sizes])
        ax.set_title(f"{collective}, {n} ranks")
        ax.set_xlabel("size per rank")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("algorithm bandwidth, GB/s")
    axes[0].legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})


def run_bench(config: BenchConfig, cache: Path, advance: Callable[[str], None],
              add_total: Callable[[int], None]) -> dict:
    """Plans the XMLs, then measures the interpreter, gloo, memcpy and the per-step overhead."""
    xmls = [plan_xml(c, n, v, config.plan_size, cache) for c in config.collectives for n in config.ranks
            for v in VARIANTS]
    runnable = [x for x in xmls if x["error"] is None]
    problem = gloo_problem() if config.gloo else "disabled with --no-gloo"
    add_total(len(runnable) * (len(config.sizes) + 1) + len(config.sizes)
              + (0 if problem else len(config.ranks) * (len(config.collectives) * len(config.sizes) + 1)))
    results: dict[str, Any] = {"xmls": xmls, "interpreter": [], "gloo": [], "memcpy": [], "overhead": [],
                               "gloo_problem": problem}
    for x in runnable:
        results["interpreter"] += measure_interpreter(x, config, advance)
    for n in () if problem else config.ranks:
        results["gloo"] += measure_gloo(n, config, advance)
    results["gloo_allgather_api"] = next((r["api"] for r in results["gloo"] if r["collective"] == "allgather"), None)
    for size in config.sizes:
        advance(f"memcpy {format_size(size)}")
        results["memcpy"].append(measure_memcpy(size, config))
    for x in runnable:
        advance(f"per-step overhead {x['collective']} {x['variant']} {x['ranks']} ranks")
        results["overhead"].append(measure_overhead(x, config))
    for x in xmls:
        x["file"] = display_path(x["file"]) if x["file"] else None
    return results


def config_from(args: argparse.Namespace) -> BenchConfig:
    base = QUICK if args.quick else BenchConfig()
    given = {k: getattr(args, k) for k in ("collectives", "ranks", "sizes", "plan_size", "seconds_per_point",
                                           "min_iterations", "max_iterations", "threads", "overhead_size",
                                           "overhead_iterations") if getattr(args, k) is not None}
    return BenchConfig(**{**asdict(base), **given, "gloo": not args.no_gloo})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collectives", type=parse_collectives, help="default: allreduce,allgather")
    p.add_argument("--ranks", type=parse_ints, help="default: 2,4,8")
    p.add_argument("--sizes", type=parse_sizes, help="size per rank, nccl-tests' convention "
                   "(default: 1MiB,4MiB,16MiB,64MiB,256MiB)")
    p.add_argument("--plan-size", type=lambda s: parse_size(s, "--plan-size"), help="--size the XMLs are planned "
                   "for (default: 64MiB)")
    p.add_argument("--seconds-per-point", type=float, help="timed seconds per point (default: 1)")
    p.add_argument("--min-iterations", type=int, help="default: 3")
    p.add_argument("--max-iterations", type=int, help="default: 50")
    p.add_argument("--threads", type=int, help="interpreter worker threads (default: 0 = one per hardware thread)")
    p.add_argument("--overhead-size", type=lambda s: parse_size(s, "--overhead-size"), help="default: 4KiB")
    p.add_argument("--overhead-iterations", type=int, help="default: 50")
    p.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed gloo baseline")
    p.add_argument("--quick", action="store_true", help="smoke test: 64KiB and 256KiB, 2 ranks, few iterations")
    p.add_argument("--output", type=Path, default=DOC, help="markdown report; PNGs are written beside it")
    p.add_argument("--cache", type=Path, default=CACHE, help="folder for the XMLs and results.json")
    p.add_argument("--gloo-worker", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if args.gloo_worker:
        gloo_worker(json.loads(args.gloo_worker))
        return None
    from rich.progress import Progress

    config = config_from(args)
    started = time.perf_counter()
    with Progress() as progress:
        task = progress.add_task("runtime bench", total=0)
        def advance(text: str) -> None:
            progress.update(task, description=text)
            progress.advance(task)
        def add_total(n: int) -> None:
            progress.update(task, total=(progress.tasks[0].total or 0) + n)
        results = run_bench(config, args.cache, advance, add_total)
    results["config"] = asdict(config)
    results["meta"] = {**machine(), "command": " ".join(["python bench/runtime.py", *map(shlex.quote, argv)]),
                       "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "wall_s": time.perf_counter() - started}
    args.cache.mkdir(parents=True, exist_ok=True)
    (args.cache / "results.json").write_text(json.dumps(results, indent=1))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for coll in config.collectives:
        plot(results, coll, args.output.parent / f"runtime-{coll}.png")
    args.output.write_text(markdown(results))
    print(f"wrote {args.output} and {args.cache / 'results.json'} in {results['meta']['wall_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()

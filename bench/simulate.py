"""Training-iteration simulator: scaling table, closed forms, and ASTRA-sim's qualitative findings.

    python bench/simulate.py                     # 16, 64, 256, 1024 ranks; writes docs/simulate-benchmark.md
    python bench/simulate.py --ranks 16,64       # a quicker subset

Scaling: a data-parallel iteration of 50 layers with a 4 MiB all-reduce per layer (issue 6's speed case;
ASTRA-sim's analytical backend took 284 s on one core for 1024 ranks), simulated end to end by the same code
as `mlopt simulate --workload dp:...`: on ring:N with the ring algorithm, and on a 2D torus with the
hierarchical (per-dimension ring) algorithm, congestion-unaware; wall time is this machine's, measured in
this run. Findings: the slides' comparisons, each computed here from the system and network layers.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlopt.formats.topology import GENERATOR_BETA_US_PER_MB, from_spec  # noqa: E402
from mlopt.sim.collective_algorithms import collective_time  # noqa: E402
from mlopt.sim.evaluate import EvaluateOptions, evaluate  # noqa: E402
from mlopt.sim.workload import parse_workload_spec  # noqa: E402

LAYERS = 50
ALLREDUCE = "4MiB"
FWD_US, BWD_US = 100, 200
SPEED_TARGET_S = 30.0


def torus_dims(n: int) -> tuple[int, int]:
    side = int(math.isqrt(n))
    while n % side:
        side -= 1
    return side, n // side


def scaling_row(n: int, topology_spec: str, algorithm: str, dims: tuple[int, ...] | None, mode: str) -> dict:
    started = time.perf_counter()
    workload = parse_workload_spec(f"dp:ranks={n},layers={LAYERS},fwd_us={FWD_US},bwd_us={BWD_US},bytes={ALLREDUCE}")
    topology = from_spec(topology_spec)
    built = time.perf_counter()
    report = evaluate(workload, topology, EvaluateOptions(algorithm=algorithm, dims=dims, mode=mode), source="bench")
    done = time.perf_counter()
    return {"ranks": n, "topology": topology_spec, "algorithm": algorithm, "mode": mode,
            "iteration_us": report.iteration_time_us,
            "exposed_us": report.exposed_us, "comm_us": report.comm_us, "build_s": built - started,
            "simulate_s": done - built, "wall_s": done - started}


def _time(collective: str, algorithm: str, p: int, size: int, topology: str, **kw) -> str:
    timing = collective_time(collective, algorithm, tuple(range(p)), size, from_spec(topology), mode="aware", **kw)
    return timing.time_us, f"{timing.time_us:.0f} us: {algorithm} on {topology}"


def findings() -> list[tuple[str, str, str, bool]]:
    """(finding, measurement A, measurement B, holds) for the slides' comparisons, each between topologies
    with a stated bandwidth budget (B = the generators' link bandwidth)."""
    out = []
    b = 1e3 / GENERATOR_BETA_US_PER_MB  # GB/s of a generated link
    # All-to-all, equal injection bandwidth per rank: 15 links of B against 2 of 15B/2.
    fc, fc_text = _time("alltoall", "direct", 16, 64 << 20, "fully-connected:16")
    torus, torus_text = _time("alltoall", "ring", 16, 64 << 20, f"torus:16@{15 * b / 2:.6g}")
    out.append(("all-to-all, 64 MiB, equal injection bandwidth: the all-to-all topology faster than a 1D torus",
                fc_text, torus_text, fc < torus))
    # Large all-reduce, the slides' link counts (a torus node: 2 links of 4 units; all-to-all: 7 links of 1).
    for size, label, want_torus in ((256 << 20, "256 MiB", True), (64 << 10, "64 KiB", False)):
        t, t_text = _time("allreduce", "bidirectional-ring", 8, size, f"torus:8@{4 * b:.6g}")
        f, f_text = _time("allreduce", "direct", 8, size, "fully-connected:8")
        out.append((f"all-reduce, {label}, the slides' link counts: the torus "
                    f"{'faster' if want_torus else 'slower (latency-bound)'}", t_text, f_text,
                    (t < f) == want_torus))
    fast, fast_text = _time("allreduce", "hierarchical", 16, 64 << 20, "torus:4x4@400,50", dims=(4, 4))
    slow, slow_text = _time("allreduce", "hierarchical", 16, 64 << 20, "torus:4x4@50,50", dims=(4, 4))
    out.append(("hierarchical all-reduce, 64 MiB: faster intra-package links (400 vs 50 GB/s in dim 0) help",
                fast_text, slow_text, fast < slow))
    return out


def markdown(rows: list[dict], found: list, command: str, elapsed_s: float) -> str:
    cpu = platform.processor() or platform.machine()
    lines = [
        "# Training-iteration simulator benchmark",
        "",
        f"Made by `{command}` ({elapsed_s:.0f} s; {os.cpu_count()} CPUs, {cpu}, Python {platform.python_version()}).",
        "",
        f"## Scaling: data-parallel, {LAYERS} layers, one {ALLREDUCE} all-reduce per layer",
        "",
        f"Forward {FWD_US} us and backward {BWD_US} us per layer; each layer's all-reduce overlaps the backward",
        "pass of the layers before it. Congestion-unaware mode, and congestion-aware up to 64 ranks (its",
        "exact event simulation builds every message). Wall time = workload and topology construction +",
        f"simulation, in this run. Target: 1024 ranks within {SPEED_TARGET_S:.0f} s on 2 cores (ASTRA-sim's analytical",
        "backend: 284 s on one core).",
        "",
        "| ranks | topology | algorithm | mode | iteration us | exposed comm us | build s | simulate s | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['topology']} | {r['algorithm']} | {r['mode']} | {r['iteration_us']:.0f} | "
                     f"{r['exposed_us']:.0f} | {r['build_s']:.2f} | {r['simulate_s']:.2f} | {r['wall_s']:.2f} |")
    worst = max((r["wall_s"] for r in rows if r["ranks"] == 1024 and r["mode"] == "unaware"), default=None)
    if worst is not None:
        verdict = "met" if worst <= SPEED_TARGET_S else "NOT met"
        lines += ["", f"Speed target: {verdict} (slowest 1024-rank case {worst:.1f} s)."]
    lines += ["", "## ASTRA-sim's qualitative findings (congestion-aware mode)", "",
              "| finding | first | second | holds |", "|---|---|---|---|"]
    for finding, a, b, holds in found:
        lines.append(f"| {finding} | {a} | {b} | {'yes' if holds else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="16,64,256,1024")
    parser.add_argument("--output", default=str(REPO / "docs" / "simulate-benchmark.md"))
    args = parser.parse_args(argv)
    from rich.progress import Progress

    started = time.perf_counter()
    ranks = [int(x) for x in args.ranks.split(",")]
    cases = []
    for n in ranks:
        a, b = torus_dims(n)
        for mode in ("unaware", "aware") if n <= 64 else ("unaware",):
            cases.append((n, f"ring:{n}", "ring", None, mode))
            cases.append((n, f"torus:{a}x{b}", "hierarchical", (a, b), mode))
    rows = []
    with Progress() as progress:
        task = progress.add_task("simulating", total=len(cases) + 1)
        for n, spec, algorithm, dims, mode in cases:
            progress.update(task, description=f"{n} ranks, {spec}, {algorithm}, {mode}")
            rows.append(scaling_row(n, spec, algorithm, dims, mode))
            progress.advance(task)
        progress.update(task, description="findings")
        found = findings()
        progress.advance(task)
    command = "python bench/simulate.py" + (f" --ranks {args.ranks}" if args.ranks != "16,64,256,1024" else "")
    text = markdown(rows, found, command, time.perf_counter() - started)
    Path(args.output).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

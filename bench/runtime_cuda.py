"""CUDA backend of the C++ runtime: correctness against the CPU backend and GB/s on one GPU.

Three steps, because the machine with the GPU need not have mlopt's planners installed:

    python bench/runtime_cuda.py xmls .gpu/xml          # here: the collective planner writes the XMLs
    python bench/runtime_cuda.py run --xml-dir .gpu/xml --out results.jsonl   # on the GPU machine
    python bench/runtime_cuda.py report results.jsonl   # anywhere: docs/runtime-cuda-benchmark.md + PNG

`run` needs only Python's standard library, cmake, a C++17 compiler and nvcc: it builds runtime/ with
-DMLOPT_CUDA=ON, runs ctest (test_cuda_backend runs every XML of runtime/tests/data and of --xml-dir on both
backends and compares every byte), then times each benchmark XML with `test_cuda_backend bench`, which
reports the kernel's time by CUDA events and cudaMemcpy's device-to-device time on the same bytes. All
ranks live on the one GPU, so a collective's "links" are that GPU's memory: cudaMemcpy is the physical
limit of one copy stream, and the kernel is bounded by the threadblocks it gets (one CUDA block each).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (topology, collective, algorithm, root): what tests/native/test_binding.py runs on the CPU backend, so both
# backends see every algorithm family the planner has (2 to 32 ranks).
CORRECTNESS_CASES = [
    ("ring:2", "allgather", "ring", 0),
    ("ring:4", "allgather", "taccl", 0),
    ("fully-connected:8", "allgather", "direct", 0),
    ("ring:4", "allreduce", "ring", 0),
    ("fully-connected:4", "allreduce", "tree", 0),
    ("fully-connected:4", "allreduce", "trees", 0),
    ("fully-connected:2", "allreduce", "direct", 0),
    ("ring:8", "reducescatter", "ring", 0),
    ("fully-connected:4", "alltoall", "direct", 0),
    ("fully-connected:8", "alltoall", "direct", 0),
    ("fully-connected:4", "broadcast", "trees", 1),
    ("fully-connected:4", "reduce", "trees", 2),
    ("ndv2x2", "allgather", "hierarchical", 0),
    ("ring:16", "allreduce", "ring", 0),
    ("ring:32", "allgather", "ring", 0),
]
BENCH_COLLECTIVES = ("allreduce", "allgather")
BENCH_RANKS = (2, 4, 8)
BENCH_SIZES = (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20)
BENCH_CHUNK_BYTES = 1 << 20  # the executor's slice: pipelines the steps of consecutive ranks
BENCH_INSTANCES = (1, 8)  # --instances: copies of the program on their own channels, i.e. more CUDA blocks


def case_name(topology: str, collective: str, algorithm: str, root: int, instances: int = 1) -> str:
    name = f"{collective}-{algorithm}-{topology.replace(':', '').replace('-', '')}"
    name += f"-root{root}" if root else ""
    return name + (f"-x{instances}" if instances > 1 else "")


def write_plan(folder: Path, topology: str, collective: str, algorithm: str, root: int = 0,
               instances: int = 1) -> Path:
    from mlopt.formats.topology import from_spec
    from mlopt.planners.collective.output import write_collective_plan
    from mlopt.planners.collective.planner import CollectiveOptions, plan_collective
    from mlopt.planners.options import PlannerOptions

    copts = CollectiveOptions(collective, 64 << 20, algorithm, root=root, instances=instances)
    result = plan_collective(from_spec(topology), copts, PlannerOptions(), inputs={"topology": topology})
    path = folder / f"{case_name(topology, collective, algorithm, root, instances)}.xml"
    xml, _ = write_collective_plan(result, str(path), copts, PlannerOptions())
    return Path(xml)


def make_xmls(folder: Path) -> None:
    """Correctness XMLs in folder/, benchmark XMLs (ring and the planner's best) in folder/bench/."""
    sys.path.insert(0, str(REPO))
    (folder / "bench").mkdir(parents=True, exist_ok=True)
    for case in CORRECTNESS_CASES:
        print(write_plan(folder, *case))
    for collective in BENCH_COLLECTIVES:
        for ranks in BENCH_RANKS:
            for instances in BENCH_INSTANCES:
                print(write_plan(folder / "bench", f"ring:{ranks}", collective, "ring", instances=instances))
                print(write_plan(folder / "bench", f"fully-connected:{ranks}", collective, "auto",
                                 instances=instances))


def build(build_dir: Path, jobs: int) -> Path:
    cmake = shutil.which("cmake") or "cmake"
    subprocess.run([cmake, "-S", str(REPO / "runtime"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    "-DMLOPT_CUDA=ON", "-DMLOPT_BUILD_TESTS=ON"], check=True)
    subprocess.run([cmake, "--build", str(build_dir), "--parallel", str(jobs)], check=True)
    return build_dir


def run_ctest(build_dir: Path, xml_dir: Path, log: Path) -> bool:
    ctest = Path(shutil.which("cmake") or "cmake").with_name("ctest")
    env = {**os.environ, "MLOPT_CUDA_XML_DIR": str(xml_dir.resolve())}
    done = subprocess.run([str(ctest if ctest.exists() else "ctest"), "--test-dir", str(build_dir),
                           "--output-on-failure", "--verbose"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    log.write_text(done.stdout)
    print(done.stdout[-4000:])
    return done.returncode == 0


def run_python_tests(build_dir: Path, log: Path) -> bool | None:
    """tests/runtime/test_cuda.py against the library just built (None: torch or pytest missing here)."""
    try:
        import pytest  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return None
    env = {**os.environ, "MLOPT_RUNTIME_LIB": str((build_dir / "libmlopt_runtime.so").resolve()),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(REPO / "tests" / "runtime" / "test_cuda.py")], env=env, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write_text(done.stdout)
    print(done.stdout[-2000:])
    return done.returncode == 0


def run_memcheck(build_dir: Path, xml_dir: Path, log: Path, timeout_s: int) -> bool | None:
    """test_cuda_backend under compute-sanitizer's memcheck (None: the tool is not installed, or it ran out of
    time: every spinning load is instrumented there)."""
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        return None
    env = {**os.environ, "MLOPT_CUDA_XML_DIR": str(xml_dir.resolve()), "MLOPT_REPO": str(REPO)}
    try:
        done = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "9",
                               str(build_dir / "test_cuda_backend")], env=env, cwd=REPO / "runtime" / "tests",
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        log.write_text(f"timed out after {timeout_s} s\n" + (exc.stdout or b"").decode("utf-8", "replace")[-4000:])
        return None
    log.write_text(done.stdout)
    print(done.stdout[-2000:])
    return done.returncode == 0


def bench_xmls(build_dir: Path, xml_dir: Path, sizes: list[int], out: Path, block_threads: int) -> None:
    binary = build_dir / "test_cuda_backend"
    files = sorted((xml_dir / "bench").glob("*.xml"))
    with open(out, "a") as handle:
        for index, path in enumerate(files):
            for size in sizes:
                done = subprocess.run([str(binary), "bench", str(path), str(size), str(BENCH_CHUNK_BYTES),
                                       str(block_threads), "10"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
                line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
                if done.returncode != 0 or not line.startswith("{"):
                    record = {"file": path.name, "bytes": size, "error": done.stdout.strip()[-500:]}
                else:
                    record = json.loads(line)
                record["size"] = size
                handle.write(json.dumps(record) + "\n")
                handle.flush()
            print(f"[{index + 1}/{len(files)}] {path.name}", flush=True)


def step_overhead(build_dir: Path, xml_dir: Path, out: Path, block_threads: int) -> None:
    """Per-step cost: the benchmark XMLs at 4 KiB per rank, where moving data costs next to nothing."""
    binary = build_dir / "test_cuda_backend"
    with open(out, "a") as handle:
        for path in sorted((xml_dir / "bench").glob("*.xml")):
            done = subprocess.run([str(binary), "bench", str(path), "4096", "0", str(block_threads), "50"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            if done.returncode == 0 and line.startswith("{"):
                record = json.loads(line)
                record["overhead"] = True
                handle.write(json.dumps(record) + "\n")


def command_run(args) -> int:
    build_dir = Path(args.build).resolve()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    build(build_dir, args.jobs)
    out.write_text("")
    ok = run_ctest(build_dir, Path(args.xml_dir), out.with_suffix(".ctest.log"))
    python_ok = run_python_tests(build_dir, out.with_suffix(".pytest.log"))
    if not args.skip_bench:
        step_overhead(build_dir, Path(args.xml_dir), out, args.block_threads)
        bench_xmls(build_dir, Path(args.xml_dir), [int(s) for s in args.sizes.split(",")], out, args.block_threads)
    memcheck_ok = None if args.skip_memcheck else run_memcheck(build_dir, Path(args.xml_dir),
                                                                out.with_suffix(".memcheck.log"), args.memcheck_timeout)
    with open(out, "a") as handle:
        handle.write(json.dumps({"meta": True, "ctest_passed": ok, "python_tests_passed": python_ok,
                                 "memcheck_passed": memcheck_ok, "host": platform.node(),
                                 "command": " ".join(sys.argv)}) + "\n")
    print(f"done in {time.time() - started:.0f} s; ctest {'passed' if ok else 'FAILED'}, python tests "
          f"{python_ok}, memcheck {memcheck_ok}")
    return 0 if ok and python_ok is not False and memcheck_ok is not False else 1


def load_records(paths: list[Path]) -> tuple[dict, list[dict]]:
    """Timings of every file, and their verdicts merged (a later file's verdict fills one an earlier did not
    reach, e.g. a run with --skip-bench that only ran memcheck)."""
    meta: dict = {}
    records: list[dict] = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if not record.get("meta"):
                records.append(record)
                continue
            for key, value in record.items():
                if value is not None and (meta.get(key) is None or key != "command"):
                    meta[key] = value if key != "command" or "command" not in meta else meta[key] + "` and `" + value
    return meta, records


def family(name: str) -> tuple[str, str, int, int]:
    """(collective, algorithm label, ranks, instances) of a benchmark XML's file name."""
    stem = name.removesuffix(".xml")
    instances = 1
    if "-x" in stem:
        stem, _, count = stem.rpartition("-x")
        instances = int(count)
    collective, algorithm, topology = stem.split("-", 2)
    ranks = int("".join(ch for ch in topology if ch.isdigit()))
    label = "ring" if algorithm == "ring" else "best (auto, fully-connected)"
    return collective, label, ranks, instances


def mib(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def verdict(value: bool | None) -> str:
    return {True: "passed", False: "FAILED"}.get(value, "not run")


def render(meta: dict, records: list[dict], command: str) -> str:
    timed = [r for r in records if "error" not in r and not r.get("overhead")]
    failed = [r for r in records if "error" in r]
    gpu = next((r["gpu"] for r in timed), "?")
    lines = [
        "# CUDA backend benchmark",
        "",
        f"GPU: {gpu}. All ranks run on this one GPU: one kernel launch per collective, one CUDA block per",
        "threadblock of every rank, FIFOs in device memory. GB/s is nccl-tests' algorithm bandwidth (the larger",
        "buffer per rank / time) over the kernel's time by CUDA events (median of 10 runs after 3 warm-ups);",
        "memcpy is cudaMemcpy device-to-device of the same bytes, one copy stream (the physical limit of one",
        f"copy; a collective moves several). Slices of {BENCH_CHUNK_BYTES >> 20} MiB per chunk (`chunk_bytes`), "
        "float32, sum.",
        f"On that machine, ctest (test_cuda_backend: every XML on both backends, every byte compared): "
        f"{verdict(meta.get('ctest_passed'))}; tests/runtime/test_cuda.py (torch CUDA tensors): "
        f"{verdict(meta.get('python_tests_passed'))}; test_cuda_backend under compute-sanitizer memcheck: "
        f"{verdict(meta.get('memcheck_passed'))}.",
        "",
        f"Command: `{meta.get('command', '?')}`, then `{command}`.",
        "",
    ]
    for collective in BENCH_COLLECTIVES:
        lines += [f"## {collective}", "",
                  "| ranks | size | algorithm | instances | CUDA blocks | kernel us | GB/s | memcpy GB/s | / memcpy |",
                  "|---|---|---|---|---|---|---|---|---|"]
        rows = []
        for r in timed:
            coll, label, ranks, instances = family(r["file"])
            if coll == collective:
                rows.append((ranks, r["size"], label, instances, r))
        for ranks, size, label, instances, r in sorted(rows, key=lambda t: t[:4]):
            lines.append(f"| {ranks} | {mib(size)} | {label} | {instances} | {r['threadblocks']} | "
                         f"{r['device_us']:.1f} | {r['algbw_GBps']:.1f} | {r['memcpy_GBps']:.1f} | "
                         f"{r['algbw_GBps'] / r['memcpy_GBps']:.2f} |")
        lines.append("")
    overhead = [r for r in records if r.get("overhead")]
    if overhead:
        lines += ["## Per-step overhead", "",
                  "4 KiB per rank, whole chunks: the kernel's time is the steps' synchronisation, not data.",
                  "Per step = kernel time / the steps of an average threadblock (one CUDA block runs its steps in",
                  "order; the ranks' blocks run side by side, but a ring's steps also wait for each other).",
                  "",
                  "| XML | CUDA blocks | steps (all blocks) | kernel us | us per step of a block |",
                  "|---|---|---|---|---|"]
        for r in sorted(overhead, key=lambda r: r["file"]):
            per_block = r["steps"] / max(1, r["threadblocks"])
            lines.append(f"| {r['file']} | {r['threadblocks']} | {r['steps']} | {r['device_us']:.1f} | "
                         f"{r['device_us'] / max(per_block, 1):.2f} |")
        lines.append("")
    if failed:
        refused = sorted({(r["file"], r["error"].split(": ", 1)[-1]) for r in failed})
        lines += ["## Runs the library refused", "",
                  "Every threadblock must be resident at once (they wait on each other), so a program with more",
                  "threadblocks than the GPU holds is refused with MLOPT_ERR_UNSUPPORTED before it starts:", ""]
        lines += [f"- {name}: {error}" for name, error in refused] + [""]
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in records if "error" not in r and not r.get("overhead")]
    fig, axes = plt.subplots(len(BENCH_COLLECTIVES), len(BENCH_RANKS), figsize=(12, 7), sharey=True)
    for row, collective in enumerate(BENCH_COLLECTIVES):
        for col, ranks in enumerate(BENCH_RANKS):
            ax = axes[row][col]
            series: dict[str, list[tuple[int, float]]] = {}
            memcpy: dict[int, float] = {}
            for r in timed:
                coll, label, n, instances = family(r["file"])
                if coll != collective or n != ranks:
                    continue
                series.setdefault(f"{label.split(' ')[0]} x{instances}", []).append((r["size"], r["algbw_GBps"]))
                memcpy[r["size"]] = r["memcpy_GBps"]
            for label, points in sorted(series.items()):
                points.sort()
                ax.plot([p[0] >> 20 for p in points], [p[1] for p in points], marker="o", label=label)
            if memcpy:
                sizes = sorted(memcpy)
                ax.plot([s >> 20 for s in sizes], [memcpy[s] for s in sizes], "k--", label="cudaMemcpy")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{collective}, {ranks} ranks")
            ax.set_xlabel("MiB per rank")
            if col == 0:
                ax.set_ylabel("GB/s")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def command_report(args) -> int:
    meta, records = load_records([Path(p) for p in args.results])
    output = Path(args.output)
    output.write_text(render(meta, records, " ".join(["python", "bench/runtime_cuda.py", *sys.argv[1:]])) + "\n")
    plot(records, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    xmls = sub.add_parser("xmls", help="write the planner's XMLs (needs mlopt and its solver)")
    xmls.add_argument("folder")
    run = sub.add_parser("run", help="build with CUDA, run ctest and time the XMLs (needs a GPU)")
    run.add_argument("--xml-dir", required=True)
    run.add_argument("--build", default="runtime/build-cuda")
    run.add_argument("--out", default="bench/results/runtime-cuda.jsonl")
    run.add_argument("--sizes", default=",".join(str(s) for s in BENCH_SIZES))
    run.add_argument("--block-threads", type=int, default=512)
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    run.add_argument("--skip-bench", action="store_true")
    run.add_argument("--skip-memcheck", action="store_true", help="skip compute-sanitizer (slow)")
    run.add_argument("--memcheck-timeout", type=int, default=180, help="seconds for the memcheck run")
    report = sub.add_parser("report", help="markdown table + PNG from a run's results")
    report.add_argument("results", nargs="+", help="results of one or more runs")
    report.add_argument("-o", "--output", default="docs/runtime-cuda-benchmark.md")
    args = parser.parse_args(argv)
    if args.command == "xmls":
        make_xmls(Path(args.folder))
        return 0
    if args.command == "run":
        return command_run(args)
    return command_report(args)


if __name__ == "__main__":
    sys.exit(main())

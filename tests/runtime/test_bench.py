"""bench/runtime.py: its pure helpers, and a --quick run (tiny sizes, 2 ranks) writing its report to tmp_path."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_runtime", REPO / "bench" / "runtime.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_sizes_parse_sorted_and_fit_whole_chunks(bench):
    assert bench.parse_sizes("4MiB, 1MiB,4MiB") == (1 << 20, 4 << 20)
    assert bench.parse_ints("8,2,4") == (2, 4, 8)
    assert bench.parse_collectives("allgather") == ("allgather",)
    with pytest.raises(Exception):
        bench.parse_collectives("alltoall")
    assert bench.fit_size(4096, 96) == 4128 and bench.fit_size(4096, 64) == 4096 and bench.fit_size(1, 32) == 32


def test_iterations_follow_the_estimate_within_bounds(bench):
    assert bench.iterations_for(0.1, 1.0, 3, 50) == 10
    assert bench.iterations_for(2.0, 1.0, 3, 50) == 3
    assert bench.iterations_for(1e-6, 1.0, 3, 50) == 50
    assert bench.iterations_for(None, 1.0, 3, 50) == 50
    assert bench.gbps(2e9, 1e6) == 2.0 and bench.gbps(1, 0) is None
    assert bench.ratio(1.0, None) is None and bench.ratio(None, 2.0) is None and bench.ratio(1.0, 4.0) == 0.25


def test_overhead_fit_separates_fixed_and_per_step_cost(bench):
    assert bench.fit_line([(0, 1.0), (2, 5.0)]) == (1.0, 2.0)
    assert bench.fit_line([(3, 1.0), (3, 2.0)]) is None
    rows = [{"collective": "allreduce", "steps": s, "median_us": 100 + 0.5 * s} for s in (10, 50)]
    expected = "- allreduce: median us ~ 100.0 + 0.500 x steps (2 XMLs, 10 to 50 steps)."
    assert bench.overhead_fit_lines(rows) == [expected]


def _results(bench, gloo_GBps: float | None) -> dict:
    def interp(variant, size, value):
        return {"collective": "allreduce", "ranks": 4, "variant": variant, "algorithm": variant if variant == "ring"
                else "direct", "size_bytes": size, "algbw_GBps": value, "moved_GBps": 3 * value}

    sizes = (1 << 20, 16 << 20, 64 << 20)
    return {"interpreter": [interp("ring", s, 1.0) for s in sizes] + [interp("best", s, 0.5) for s in sizes],
            "gloo": [] if gloo_GBps is None else [{"collective": "allreduce", "ranks": 4, "size_bytes": s,
                                                   "algbw_GBps": gloo_GBps * (2 if s == 64 << 20 else 1)}
                                                  for s in sizes],
            "memcpy": [{"size_bytes": s, "GBps": 10.0} for s in sizes]}


def test_rows_ratios_and_targets(bench):
    rows = bench.table_rows(_results(bench, 1.0))
    assert [r["size_bytes"] for r in rows] == [1 << 20, 16 << 20, 64 << 20]
    assert rows[0]["ring_vs_gloo"] == 1.0 and rows[0]["best_vs_gloo"] == 0.5 and rows[0]["best_algorithm"] == "direct"
    found = bench.targets(rows)
    assert [(t["size_bytes"], t["ratio"], t["met"]) for t in found] == [(16 << 20, 1.0, True), (64 << 20, 0.5, False)]
    text = "\n".join(bench.targets_section(found))
    assert "Met at 1 of 2" in text and "allreduce, 4 ranks: NOT met at 64MiB (0.50x)" in text
    table = bench.collective_table(rows)
    assert table[2] == "| 4 | 1MiB | 1.00 | 0.50 | direct | 1.00 | 1.00x | 0.50x | 10.00 | 3.00 | 1.50 |"


def test_missing_gloo_figures_are_not_counted_as_met(bench):
    rows = bench.table_rows(_results(bench, None))
    assert rows[0]["gloo_GBps"] is None and rows[0]["ring_vs_gloo"] is None
    found = bench.targets(rows)
    assert all(t["met"] is None for t in found)
    assert "no gloo figure" in "\n".join(bench.targets_section(found))
    assert "| - | - | - |" in bench.collective_table(rows)[2]


def test_quick_run_writes_report_plots_and_results(bench, tmp_path):
    from mlopt.native import binding as native

    try:
        native.library()
    except native.RuntimeLibraryNotFound as exc:
        pytest.skip(f"mlopt runtime library unavailable: {exc}")
    args = ["--quick", "--collectives", "allreduce,allgather", "--output", str(tmp_path / "docs" / "rt.md"),
            "--cache", str(tmp_path / "cache")]
    if bench.gloo_problem() is not None:
        args.append("--no-gloo")
    results = bench.main(args)
    report = (tmp_path / "docs" / "rt.md").read_text()
    assert "python bench/runtime.py --quick" in report and "## allreduce" in report and "## allgather" in report
    assert "## Per-step overhead" in report and "## Targets" in report
    for coll in ("allreduce", "allgather"):
        assert (tmp_path / "docs" / f"runtime-{coll}.png").stat().st_size > 0
    saved = json.loads((tmp_path / "cache" / "results.json").read_text())
    assert len(saved["interpreter"]) == 2 * 2 * 2  # collectives x variants x sizes
    assert all(r["algbw_GBps"] > 0 and r["iterations"] >= 2 for r in saved["interpreter"])
    assert all(r["per_step_us"] > 0 for r in saved["overhead"]) and len(saved["memcpy"]) == 2
    assert len(saved["gloo"]) == (0 if "--no-gloo" in args else 4)
    assert all(x["error"] is None for x in results["xmls"])

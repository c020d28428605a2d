"""`mlopt profile contention`: LIBRA's contention samples measured on this CPU (and on GPUs where there are two),
the shared assembly and fit checked with synthetic measurements, the document `mlopt plan threads` reads, and
bad options. Measurements on a shared machine are noisy: nothing here asserts a speed or a fit quality."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlopt.errors import InputError
from mlopt.planners.threads import contention as ct
from mlopt.profilers import contention as pc

# A CPU-like parameter set over r = 1..8 workers (compute 2x slower at 8, rates saturating by ~4 workers).
CPU_LIKE = {"alpha1": 1.0, "alpha2": 0.06, "gamma1": 2000.0, "gamma2": 1500.0, "gamma3": 0.8, "gamma4": 0.6,
            "q_gamma1": 2600.0, "q_gamma2": 2000.0, "q_gamma3": 0.9, "q_gamma4": 0.6}
CUDA_R = (128, 256, 512, 1024, 2048, 4096)


def _result(points, threads, ranks=4, device="cpu") -> pc.ProfileResult:
    samples, rows = pc.assemble(points, ranks)
    config = pc.make_config(device, threads=threads, ranks=ranks)
    return pc.fit_result(pc.ProfileResult(config, samples, rows, {}, 0.0), "synthetic")


# ------------------------------------------------------------------------------------------------ shared logic


@pytest.mark.parametrize("params, threads, device", [(CPU_LIKE, (1, 2, 4, 8), "cpu"),
                                                     (dict(ct.DEFAULT_PARAMETERS), CUDA_R, "cuda")])
def test_synthetic_measurements_are_fitted_back(params, threads, device):
    exact = pc.synthetic_points(params, threads, (1 << 20, 8 << 20), ranks=4, startup_us=40.0)
    result = _result(exact, threads, device=device)
    assert result.fit is not None, result.fit_error
    for name in ct.PARAMETER_NAMES:
        assert result.fit.parameters[name] == pytest.approx(params[name], rel=1e-4), name
    assert all(v == pytest.approx(1.0) for v in result.r2.values()) and result.problems == []
    # 3% noise on every run, medians over 5 rounds x 5 runs: the fitted model predicts the true times closely
    noisy = pc.synthetic_points(params, threads, (1 << 20, 8 << 20), ranks=4, repeats=5, comm_runs=5,
                                startup_us=40.0, noise=0.03, seed=3)
    result = _result(noisy, threads, device=device)
    assert result.fit is not None, result.fit_error
    c_hat = pc.c_hat_bytes(8 << 20, 4)
    for kind, base in (("compute", 50_000.0), ("overlapped_comm", c_hat), ("exposed_comm", c_hat)):
        true = ct.predict_us(params, kind, base, np.array(threads))
        fitted = ct.predict_us(result.fit.parameters, kind, base, np.array(threads))
        assert np.max(np.abs(fitted / true - 1)) < 0.05, kind
        assert result.fit.rms_rel_error[kind] < 0.05


def test_assembly_takes_medians_subtracts_the_startup_and_keeps_the_spread():
    p = pc.Point(2, 1 << 20, b_us=[100.0, 90.0, 110.0], compute_us=[150.0, 120.0, 400.0],
                 overlapped_us=[50.0, 60.0, 70.0, 80.0], exposed_us=[30.0, 31.0, 29.0], startup_us=[5.0, 7.0])
    q = pc.Point(2, 4 << 20, b_us=[100.0], compute_us=[130.0], overlapped_us=[200.0], exposed_us=[100.0],
                 startup_us=[6.0, 600.0, 6.0])
    r = pc.Point(1, 1 << 20, b_us=[100.0], compute_us=[101.0], overlapped_us=[20.0], exposed_us=[10.0],
                 startup_us=[15.0])
    samples, rows = pc.assemble([q, p, r], ranks=4)
    assert [s.kind for s in samples] == ["compute"] * 3 + ["overlapped_comm"] * 3 + ["exposed_comm"] * 3
    assert [(s.threads, row["size_bytes"]) for s, row in zip(samples, rows)][:3] == [(1, 1 << 20), (2, 1 << 20),
                                                                                     (2, 4 << 20)]
    assert [row["sample"] for row in rows] == list(range(9))
    compute = samples[1]
    assert (compute.base, compute.measured_us) == (100.0, 150.0)  # medians of b and of the measured time
    assert rows[1]["min_us"] == 120.0 and rows[1]["max_us"] == 400.0 and rows[1]["n"] == 3
    assert rows[1]["b"]["median_us"] == 100.0 and rows[1]["slowdown"] == 1.5
    over = samples[4]  # r = 2, 1 MiB: median 65, startup = the fastest of r=2's tiny runs (5, 7, 6, 600, 6)
    assert over.base == pytest.approx(1.5 * (1 << 20)) and over.measured_us == 65.0 and over.startup_us == 5.0
    assert rows[4]["rel_iqr"] == pytest.approx((72.5 - 57.5) / 65.0)
    assert rows[4]["rate_MBps"] == pytest.approx(1.5 * (1 << 20) / 60.0)
    exposed_r1 = samples[6]  # r = 1: startup 15 is not below the median 10: not subtracted, noted
    assert exposed_r1.startup_us == 0.0 and "not subtracted" in rows[6]["note"]
    doc = pc.ProfileResult(pc.make_config(threads=(1, 2, 4)), samples, rows, {}, 0.0).document()
    assert len(ct.parse_samples(json.loads(json.dumps(doc)), "doc")) == 9
    with pytest.raises(pc.ProfileError, match="no overlapped_us"):
        pc.assemble([pc.Point(1, 1024, [1.0], [1.0], [], [1.0])], ranks=2)


def test_nccl_threads_become_nthreads_times_channels():
    assert pc.nccl_threads(128) == (128, 1) and pc.nccl_threads(4096) == (512, 8)
    assert pc.nccl_threads(640) == (128, 5) and pc.nccl_threads(64) == (64, 1)
    with pytest.raises(ValueError):
        pc.nccl_threads(100)
    with pytest.raises(ValueError):
        pc.nccl_threads(512 * 33 * 2)
    env = pc.nccl_env(2048)
    assert env["NCCL_NTHREADS"] == "512" and env["NCCL_MIN_NCHANNELS"] == env["NCCL_MAX_NCHANNELS"] == "4"
    with pytest.raises(InputError, match="--threads"):
        pc.make_config("cuda", threads=(100, 200, 300))


def test_a_failed_fit_is_reported_not_raised():
    flat = [pc.Point(r, 1 << 20, [100.0], [100.0], [10.0], [10.0]) for r in (1, 2)]  # 2 thread counts: too few
    result = _result(flat + [pc.Point(4, 1 << 20, [100.0], [100.0], [10.0], [10.0])], (1, 2, 4))
    assert result.fit is None and "too few" in result.fit_error
    assert result.document()["meta"]["fit"] == {"error": result.fit_error}
    assert any("fit failed" in line for line in pc.summary_lines(result))


def test_plot_is_written_and_reproducible(tmp_path):
    result = _result(pc.synthetic_points(CPU_LIKE, (1, 2, 4, 8), (1 << 20, 8 << 20), 4, noise=0.02, seed=1),
                     (1, 2, 4, 8))
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    pc.plot(result, a)
    pc.plot(result, b)
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and a.read_bytes() == b.read_bytes()


def test_progress_bar_counts_rounds():
    with pc.progress_bar(True, "test") as (advance, set_total):
        set_total(2)
        advance("one")
        advance("two")
    with pc.progress_bar(False, "test") as (advance, set_total):
        set_total(1)
        advance("silent")


# ------------------------------------------------------------------------------------------------ the CLI on this CPU


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    """One `--quick` CPU run (seconds), shared by the tests below."""
    pytest.importorskip("mlopt.native.binding")
    from mlopt.cli import main
    from mlopt.native import binding as native

    try:
        native.library()
    except native.RuntimeLibraryNotFound as exc:
        pytest.skip(str(exc))
    folder = tmp_path_factory.mktemp("contention")
    out, png = folder / "samples.json", folder / "samples.png"
    import contextlib
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["profile", "contention", "-o", str(out), "--quick", "--plot", str(png), "--json"])
    return {"code": code, "out": out, "png": png, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def test_quick_cpu_run_writes_samples_that_load(quick_profile):
    run = quick_profile
    assert run["code"] in (0, 1), run["stderr"]  # 1: samples written but the fit failed (noisy machine)
    samples = ct.load_samples(str(run["out"]))
    doc = json.loads(run["out"].read_text())
    meta = doc["meta"]
    threads, sizes = meta["config"]["threads"], meta["config"]["sizes"]
    assert threads == [1, 2, 4] and len(sizes) == 2 and meta["device"] == "cpu"
    for kind in ct.KINDS:
        group = [s for s in samples if s.kind == kind]
        assert sorted({s.threads for s in group}) == threads and len(group) == len(threads) * len(sizes)
        assert all(s.measured_us > 0 and s.base > 0 and s.model_us > 0 for s in group)
    rows = meta["measurements"]
    assert len(rows) == len(samples)
    for s, row in zip(samples, rows):
        assert (row["kind"], row["threads"]) == (s.kind, s.threads)
        assert row["n"] == meta["config"]["repeats"] * (1 if s.kind == "compute" else meta["config"]["comm_runs"])
        assert row["min_us"] <= row["median_us"] <= row["max_us"]
    summary = json.loads(run["stdout"])
    assert summary["file"] == str(run["out"]) and summary["samples"] == len(samples)
    if run["code"] == 0:
        assert set(summary["fit"]["parameters"]) == set(ct.PARAMETER_NAMES)
        assert set(summary["fit"]["r2"]) == set(ct.KINDS)
        assert meta["fit"]["parameters"] == summary["fit"]["parameters"]
    else:
        assert "fit failed" in run["stderr"] and "error" in meta["fit"]
    assert run["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_threads_accepts_the_profile(quick_profile, run_cli, ddp_example_trace, tmp_path):
    plan = tmp_path / "threads.plan.json"
    args = ["plan", "threads", "--model", ddp_example_trace, "--nodes", "4", "--contention", quick_profile["out"],
            "--threads", "1,2,4", "--default-threads", "2", "-o", plan]
    result = run_cli(*args)
    if quick_profile["code"] == 0:
        assert result.code == 0, result.err
        provenance = json.loads(plan.read_text())["payload"]["contention"]
        assert provenance["source"] == str(quick_profile["out"])
    else:  # the same samples, the same failing fit: refused (exit 2 naming the file; 1 where the fit's
        # exp() overflows, an internal error of the planner's fit: docs/profile-contention.md, "Not done")
        assert result.code in (1, 2) and not plan.exists()


def test_plan_threads_accepts_a_profile_document_of_synthetic_measurements(run_cli, ddp_example_trace, tmp_path):
    result = _result(pc.synthetic_points(CPU_LIKE, (1, 2, 4, 8), (1 << 20, 8 << 20), 4, noise=0.02, seed=2),
                     (1, 2, 4, 8))
    samples = tmp_path / "samples.json"
    pc.write(result, samples)
    plan = tmp_path / "threads.plan.json"
    run = run_cli("plan", "threads", "--model", ddp_example_trace, "--nodes", "4", "--contention", samples,
                  "--threads", "1,2,4,8", "--default-threads", "4", "-o", plan)
    assert run.code == 0, run.err
    fitted = json.loads(plan.read_text())["payload"]["contention"]["parameters"]
    assert fitted == pytest.approx(result.fit.parameters, rel=1e-6)


@pytest.mark.parametrize("args, option", [
    (["--threads", "1,2"], "--threads"),
    (["--threads", "0,1,2"], "--threads"),
    (["--threads", "a,b,c"], "--threads"),
    (["--threads", ""], "--threads"),
    (["--sizes", "1XB"], "--sizes"),
    (["--sizes", "1MiB", "--threads", "1,2,4"], "--sizes"),
    (["--repeats", "0"], "--repeats"),
    (["--comm-runs", "0"], "--comm-runs"),
    (["--ranks", "1"], "--ranks"),
    (["--compute-ms", "0"], "--compute-ms"),
    (["--compute-workers", "-1"], "--compute-workers"),
    (["--plot", "x.gif"], "--plot"),
    (["--device", "cuda", "--threads", "100,200,300"], "--threads"),
])
def test_bad_options_exit_2_naming_the_option(run_cli, tmp_path, args, option):
    out = tmp_path / "samples.json"
    result = run_cli("profile", "contention", "-o", out, *args)
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0], result.err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ GPUs


def test_cuda_without_two_gpus_exits_2_with_the_reason(run_cli, tmp_path):
    if pc.cuda_problem() is None:
        pytest.skip("this machine can run the CUDA experiment")
    result = run_cli("profile", "contention", "-o", tmp_path / "s.json", "--device", "cuda", "--quick")
    assert result.code == 2 and "--device" in result.err and "cuda:" in result.err
    assert not (tmp_path / "s.json").exists()


def test_cuda_quick_run(run_cli, tmp_path):
    problem = pc.cuda_problem()
    if problem:
        pytest.skip(f"no CUDA experiment here: {problem}")
    out = tmp_path / "s.json"
    result = run_cli("profile", "contention", "-o", out, "--device", "cuda", "--quick")
    assert result.code in (0, 1), result.err
    samples = ct.load_samples(str(out))
    assert {s.kind for s in samples} == set(ct.KINDS) and all(s.measured_us > 0 for s in samples)
    assert {s.threads for s in samples} == set(pc.DEFAULTS[("cuda", True)].threads)

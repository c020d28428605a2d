"""`mlopt profile hardware`: alpha-beta fits, classes, the nvidia-smi parser, the GPU path on a simulated
machine, the CPU transports and the command end to end (plan collective and run-collective on the result).

Nothing here asserts how fast this machine is: measured values are only checked for being physical.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from mlopt.errors import InputError
from mlopt.formats.topology import Topology
from mlopt.profilers.hardware import (HOST, ProfileOptions, default_plot_path, plot_fit, profile_cpu, profile_gpus,
                                      transfer_program)
from mlopt.profilers.linkfit import Sample, experiments, fit_alpha_beta, group_links, predict
from mlopt.profilers.nvsmi import parse_cell, parse_topo_matrix

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
KiB, MiB = 1 << 10, 1 << 20


def synthetic(alpha: float, beta: float, chunks=(1, 2, 4, 8), sizes=(4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB),
              noise: float = 0.0, repeats: int = 1, seed: int = 0, overhead: float = 0.0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for kind, n, s in experiments(chunks, sizes):
        m = n if kind == "seq" else 1
        t = predict(alpha, beta, m, n * s, overhead)
        out.append(Sample(kind, n, s, tuple(t * math.exp(rng.gauss(0, noise)) for _ in range(repeats))))
    return out


# ------------------------------------------------------------------------------------------------ fitting


def test_experiments_are_tacclls_seq_and_one_with_n1_once():
    exps = experiments([1, 4], [1000])
    assert exps == [("one", 1, 1000), ("one", 4, 1000), ("seq", 4, 1000)]
    seq, one = Sample("seq", 4, 1000, (1.0,)), Sample("one", 4, 1000, (1.0,))
    assert (seq.messages, seq.nbytes, one.messages, one.nbytes) == (4, 4000, 1, 4000)


@pytest.mark.parametrize("alpha, beta", [(1.7, 106.0), (0.7, 46.0), (0.0, 8.0), (25.0, 1000.0)])
def test_exact_recovery_on_noiseless_data(alpha, beta):
    fit = fit_alpha_beta(synthetic(alpha, beta))
    assert fit.alpha_us == pytest.approx(alpha, abs=1e-9)
    assert fit.beta_us_per_MB == pytest.approx(beta, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.ok and not fit.warnings
    assert max(abs(r) for r in fit.residuals_us) < 1e-6
    assert fit.bandwidth_GBps == pytest.approx(1000.0 / beta)


def test_exact_recovery_with_a_per_run_overhead():
    fit = fit_alpha_beta(synthetic(3.0, 80.0, overhead=90.0), overhead=True)
    assert (fit.alpha_us, fit.beta_us_per_MB, fit.overhead_us) == (pytest.approx(3.0, abs=1e-8),
                                                                   pytest.approx(80.0, rel=1e-9),
                                                                   pytest.approx(90.0, abs=1e-8))
    assert fit.model == "taccl+overhead" and fit.r2 == pytest.approx(1.0)
    plain = fit_alpha_beta(synthetic(3.0, 80.0, overhead=90.0))  # TACCL's model cannot absorb it
    assert plain.r2 < fit.r2


def test_noise_is_tolerated():
    fit = fit_alpha_beta(synthetic(5.0, 100.0, noise=0.03, repeats=7, seed=1))
    assert fit.beta_us_per_MB == pytest.approx(100.0, rel=0.03)
    assert fit.alpha_us == pytest.approx(5.0, abs=1.0)
    assert fit.r2 > 0.99 and fit.ok
    spread = fit.samples[0].spread()
    assert spread["q1_us"] <= spread["median_us"] <= spread["q3_us"] and spread["repeats"] == 7


def test_r2_falls_as_noise_grows():
    r2 = [fit_alpha_beta(synthetic(5.0, 100.0, noise=noise, seed=3)).r2 for noise in (0.0, 0.05, 0.3, 1.0)]
    assert r2[0] == pytest.approx(1.0)
    assert r2 == sorted(r2, reverse=True)
    assert r2[-1] < 0.9


def test_negative_alpha_is_clamped_and_said():
    samples = synthetic(-3.0, 100.0, sizes=(64 * KiB, 1 * MiB, 16 * MiB))  # every time still positive
    assert min(s.median_us for s in samples) > 0
    fit = fit_alpha_beta(samples)
    assert fit.alpha_us == 0.0 and fit.beta_us_per_MB > 0
    assert any("negative alpha" in w for w in fit.warnings)


def test_non_physical_beta_is_flagged_with_a_fallback():
    # Times that fall as transfers grow: no positive beta explains them.
    samples = [Sample("one", 1, s, (1000.0 / (1 + s / 1e5),)) for s in (1000, 10_000, 100_000, 1_000_000)]
    fit = fit_alpha_beta(samples)
    assert not fit.ok
    assert fit.beta_us_per_MB > 0 and math.isfinite(fit.beta_us_per_MB)
    assert any("do not grow" in w for w in fit.warnings)
    d = fit.to_dict()
    json.dumps(d, allow_nan=False)  # the report is valid JSON even for a flagged fit


def test_non_finite_measurements_are_left_out():
    samples = synthetic(2.0, 50.0)
    samples[0] = Sample(samples[0].kind, samples[0].chunks, samples[0].chunk_bytes, (math.nan,))
    fit = fit_alpha_beta(samples)
    assert fit.beta_us_per_MB == pytest.approx(50.0) and len(fit.samples) == len(samples) - 1
    assert any("not finite" in w for w in fit.warnings)
    mixed = Sample("one", 1, 1000, (1.0, math.inf, 3.0))
    assert fit_alpha_beta([mixed, *synthetic(2.0, 50.0)[1:]]).samples[0].times_us == (1.0, 3.0)
    assert not fit_alpha_beta([]).ok


def _fits(spec: dict[tuple[int, int], tuple[float, float]], noise=0.02) -> dict:
    return {pair: fit_alpha_beta(synthetic(a, b, noise=noise, repeats=3, seed=k))
            for k, (pair, (a, b)) in enumerate(spec.items())}


def test_grouping_by_beta_and_names_from_hints():
    spec = {(0, 1): (0.7, 23.0), (1, 0): (0.7, 23.5), (0, 2): (0.7, 46.0), (2, 0): (0.7, 45.0),
            (1, 2): (8.0, 150.0), (2, 1): (8.0, 155.0)}
    fits = _fits(spec)
    hints = {(0, 1): "nvlink", (1, 0): "nvlink", (0, 2): "nvlink", (2, 0): "nvlink", (1, 2): "pcie", (2, 1): "pcie"}
    classes = group_links(fits, hints)
    assert [c.name for c in classes] == ["nvlink", "nvlink-2", "pcie"]  # fastest first; repeats get -2
    assert [set(c.links) for c in classes] == [{(0, 1), (1, 0)}, {(0, 2), (2, 0)}, {(1, 2), (2, 1)}]
    assert classes[0].fit.beta_us_per_MB == pytest.approx(23.25, rel=0.05)  # pooled over the class's links
    unnamed = group_links(fits)
    assert [c.name for c in unnamed] == ["class0", "class1", "class2"]


def test_grouping_tolerance():
    near = _fits({(0, 1): (1.0, 100.0), (1, 0): (1.0, 120.0)}, noise=0.0)
    far = _fits({(0, 1): (1.0, 100.0), (1, 0): (1.0, 130.0)}, noise=0.0)
    assert len(group_links(near, beta_tol=0.25)) == 1
    assert len(group_links(far, beta_tol=0.25)) == 2
    assert len(group_links(far, beta_tol=0.5)) == 1
    # Same beta, clearly different alpha: two classes.
    alphas = _fits({(0, 1): (1.0, 100.0), (1, 0): (40.0, 100.0)}, noise=0.0)
    assert len(group_links(alphas)) == 2
    # Different hints never share a class.
    same = _fits({(0, 1): (1.0, 100.0), (1, 0): (1.0, 100.0)}, noise=0.0)
    assert len(group_links(same, {(0, 1): "a", (1, 0): "b"})) == 2


# ------------------------------------------------------------------------------------------------ nvidia-smi


FIXTURE_FACTS = {
    # file: (GPUs, NVSwitch, {(i, j): NV count}, {NIC device: GPUs on its PCIe switch}, PCIe switch groups)
    "dgx1.txt": (8, False, {(0, 1): 1, (0, 3): 2, (0, 4): 2, (0, 5): 0, (6, 7): 2},
                 {"mlx5_0": [0, 1], "mlx5_1": [2, 3], "mlx5_2": [4, 5], "mlx5_3": [6, 7]},
                 [[0, 1], [2, 3], [4, 5], [6, 7]]),
    "v100-sxm2-8gpu.txt": (8, False, {(0, 1): 1, (0, 3): 2, (1, 5): 2, (2, 7): 0}, {"mlx5_0": [2, 3]}, [[2, 3]]),
    "dgx2.txt": (16, True, {(0, 1): 6, (0, 15): 6, (7, 8): 6}, {"mlx5_0": [0, 1, 2, 3], "mlx5_7": [12, 13, 14, 15]},
                 [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
    "dgx-a100.txt": (8, True, {(0, 1): 12, (3, 7): 12}, {"mlx5_0": [0, 1], "mlx5_6": [6, 7], "mlx5_8": []},
                     [[0, 1], [2, 3], [4, 5], [6, 7]]),
    "dgx-h100.txt": (8, True, {(0, 1): 18, (2, 6): 18}, {"NIC0": [0], "NIC5": [3], "NIC9": [7], "NIC3": []}, []),
    "pcie-8gpu.txt": (8, False, {(0, 1): 0}, {"mlx5_0": []}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    "pcie-rtx4090-8gpu.txt": (8, False, {(0, 7): 0}, {"NIC0": [], "NIC1": []}, []),
    "h100-1gpu.txt": (1, False, {}, {}, []),
}


def test_every_fixture_is_listed_with_its_origin():
    readme = (FIXTURES / "README.md").read_text()
    files = sorted(p.name for p in FIXTURES.glob("*.txt"))
    assert sorted(FIXTURE_FACTS) == files
    for name in files:
        assert f"`{name}`" in readme, f"{name} has no origin in README.md"


@pytest.mark.parametrize("name", sorted(FIXTURE_FACTS))
def test_fixture_parses(name):
    gpus, nvswitch, nv, nic_switch, groups = FIXTURE_FACTS[name]
    layout = parse_topo_matrix((FIXTURES / name).read_text(), name)
    assert layout.num_gpus == gpus and layout.gpus == list(range(gpus))
    assert layout.nvswitch is nvswitch
    for (i, j), count in nv.items():
        assert layout.nvlinks(i, j) == count == layout.nvlinks(j, i)
        assert layout.gpu_link(i, j).is_nvlink == (count > 0)
    for nic, near in nic_switch.items():
        column = next(n for n in layout.nics if layout.nic_device(n) == nic or n == nic)
        assert layout.nic_switch_gpus(column) == near
    assert layout.pcie_switch_groups() == groups
    json.dumps(layout.to_dict())


def test_fixture_details():
    a100 = parse_topo_matrix((FIXTURES / "dgx-a100.txt").read_text())
    assert a100.nic_device("NIC3") == "mlx5_3" and len(a100.nics) == 10
    assert a100.cpu_affinity[4] == "112-127,240-255" and a100.numa_affinity[4] == "7"
    assert a100.link_hint(0, 1) == "nvswitch"
    dgx1 = parse_topo_matrix((FIXTURES / "dgx1.txt").read_text())
    assert dgx1.cpu_affinity[0] == "0-19,40-59" and dgx1.cpu_affinity[7] == "20-39,60-79"
    assert dgx1.connection("GPU0", "mlx5_1").kind == "PHB" and dgx1.nic_gpus("mlx5_1") == [2, 3]
    assert (dgx1.link_hint(0, 3), dgx1.link_hint(0, 1), dgx1.link_hint(0, 5)) == ("nvlink-x2", "nvlink-x1", "pcie")
    h100 = parse_topo_matrix((FIXTURES / "dgx-h100.txt").read_text())  # a copy cut short after NIC2's row
    assert h100.missing_rows == [f"NIC{k}" for k in range(3, 10)]
    assert h100.connection("NIC9", "GPU7").kind == "PIX"  # filled from GPU7's row
    assert h100.numa_affinity[5] == "1"
    one = parse_topo_matrix((FIXTURES / "h100-1gpu.txt").read_text())  # header underlined by terminal escapes
    assert "\x1b[4m" in (FIXTURES / "h100-1gpu.txt").read_text()
    assert one.devices == ["GPU0"] and one.cpu_affinity[0] == "0-15" and one.numa_affinity[0] == "0"
    pcie = parse_topo_matrix((FIXTURES / "pcie-8gpu.txt").read_text())
    assert pcie.gpu_link(0, 1).kind == "PIX" and pcie.gpu_link(0, 2).kind == "PXB" and pcie.gpu_link(0, 4).kind == "SYS"
    assert pcie.nic_gpus("mlx5_0") == [4, 5, 6, 7]  # on its host bridge (PHB), no switch shared
    assert parse_cell("SOC").kind == "SYS" and parse_cell("NV12").nvlinks == 12


@pytest.mark.parametrize("text, where", [
    ("nothing to see here\n", "line 1"),
    ("\tGPU0\tGPU1\nGPU0\t X \tQQQ\nGPU1\tQQQ\t X \n", "line 2"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n", "line 2"),
])
def test_parser_rejects_what_is_not_a_matrix(text, where):
    with pytest.raises(InputError) as exc:
        parse_topo_matrix(text, "topo.txt")
    assert str(exc.value).startswith(f"topo.txt: {where}: ")


# ------------------------------------------------------------------------------------------------ GPU path (simulated)


class FakeMachine:
    """A CopyTimer for a machine described by an nvidia-smi layout: NVLink pairs at `nv_lane` per lane,
    other pairs over PCIe through the host, host copies at `host`; copies to host from GPUs of one PCIe
    switch group (the layout's) share its upstream link. Multiplicative log-normal noise, seeded."""

    def __init__(self, layout, nv_lane=(0.7, 46.0), pcie=(10.0, 150.0), host=(5.0, 80.0), noise=0.02, seed=0):
        self.layout, self.nv_lane, self.pcie, self.host, self.noise = layout, nv_lane, pcie, host, noise
        self.group = {g: tuple(grp) for grp in layout.pcie_switch_groups() for g in grp}
        self.rng = random.Random(seed)
        self.calls = 0

    def __call__(self, copies, chunk_bytes, chunks):
        self.calls += 1
        times = []
        for src, dst in copies:
            if dst == HOST:
                alpha, beta = self.host
                mine = self.group.get(src, (src,))
                beta *= sum(1 for s, d in copies if d == HOST and self.group.get(s, (s,)) == mine)
            else:
                nv = self.layout.nvlinks(src, dst)
                alpha, beta = (self.nv_lane[0], self.nv_lane[1] / nv) if nv else self.pcie
            times.append(chunks * (alpha + beta * chunk_bytes / 1e6) * math.exp(self.rng.gauss(0, self.noise)))
        return max(times)


GPU_OPTIONS = ProfileOptions(sizes=(64 * KiB, 1 * MiB, 16 * MiB), chunks=(1, 2, 4, 8), repeats=3)


def test_gpu_path_recovers_a_dgx1():
    layout = parse_topo_matrix((FIXTURES / "dgx1.txt").read_text())
    machine = FakeMachine(layout)
    profile = profile_gpus(layout.gpus, machine, GPU_OPTIONS, layout, name="fake-dgx1")
    topo = profile.topology
    by_class = {c.name: c for c in profile.classes}
    assert set(by_class) == {"nvlink-x2", "nvlink-x1", "pcie"}
    expect = {"nvlink-x2": (0.7, 23.0), "nvlink-x1": (0.7, 46.0), "pcie": (10.0, 150.0)}
    for name, (alpha, beta) in expect.items():
        fit = by_class[name].fit
        assert fit.beta_us_per_MB == pytest.approx(beta, rel=0.03), name
        assert fit.alpha_us == pytest.approx(alpha, abs=max(0.3, 0.1 * alpha)), name
        assert fit.r2 > 0.99
    links = topo.link_map()
    assert (links[(0, 3)].link_class, links[(0, 3)].lanes) == ("nvlink-x2", 2)
    assert (links[(0, 1)].link_class, links[(0, 1)].lanes) == ("nvlink-x1", 1)
    assert links[(0, 5)].link_class == "pcie" and len(topo.links) == 56
    # PCIe-switch sharing from contention: the PLX pairs of the DGX-1.
    assert profile.sharing["groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    pcie = [s for s in topo.switches if s.kind == "pcie"]
    assert [list(s.ranks) for s in pcie] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pcie[0].port_beta_us_per_MB == pytest.approx(80.0, rel=0.05)
    assert {n.name: list(n.ranks) for n in topo.nics}["node0/mlx5_1"] == [2, 3]
    # The file round-trips through the format's validation and carries the fit report.
    again = Topology.from_dict(json.loads(json.dumps(topo.to_dict())), "fake.json")
    assert again.source["fit"]["classes"][0]["name"] == "nvlink-x2"
    assert again.source["pcie_sharing"]["pairs"]["0-1"]["shared"] is True
    assert again.source["pcie_sharing"]["pairs"]["0-2"]["shared"] is False
    sample = again.source["fit"]["links"]["0->3"]["samples"][0]
    assert {"median_us", "iqr_us", "min_us", "max_us", "fitted_us", "residual_us"} <= set(sample)


def test_gpu_path_on_nvswitch_machines_uses_one_switch():
    layout = parse_topo_matrix((FIXTURES / "dgx-a100.txt").read_text())
    profile = profile_gpus(layout.gpus, FakeMachine(layout, nv_lane=(0.7, 40.0)), GPU_OPTIONS, layout)
    assert [c.name for c in profile.classes] == ["nvswitch"]
    assert profile.classes[0].fit.beta_us_per_MB == pytest.approx(40.0 / 12, rel=0.03)
    topo = profile.topology
    assert all(l.switch == "node0/nvswitch" and l.lanes == 12 for l in topo.links)
    assert [s.name for s in topo.switches][0] == "node0/nvswitch"
    assert profile.sharing["groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_gpu_path_without_nvidia_smi_names_classes_by_order():
    layout = parse_topo_matrix((FIXTURES / "pcie-8gpu.txt").read_text())
    profile = profile_gpus([0, 1, 2], FakeMachine(layout, noise=0.0), ProfileOptions(quick=True), layout=None)
    assert [c.name for c in profile.classes] == ["class0"]
    assert profile.sharing["groups"] == [[0, 1, 2]]  # 0-1 PIX and 0/1-2 PXB: one switch tree
    assert profile.topology.num_ranks == 3 and not profile.topology.nics


def test_gpu_path_maps_cuda_devices_to_nvidia_smi_indices():
    from mlopt.profilers.hardware import _bus_key

    layout = parse_topo_matrix((FIXTURES / "dgx1.txt").read_text())
    machine = FakeMachine(layout)
    smi = {0: 4, 1: 5, 2: 6}  # CUDA_VISIBLE_DEVICES=4,5,6

    def timer(copies, chunk_bytes, chunks):
        return machine([(smi.get(a, a), smi.get(b, b)) for a, b in copies], chunk_bytes, chunks)

    profile = profile_gpus([0, 1, 2], timer, GPU_OPTIONS, layout, smi_index=smi)
    links = profile.topology.link_map()
    assert (links[(0, 1)].link_class, links[(0, 1)].lanes) == ("nvlink-x1", 1)  # GPU4-GPU5: NV1
    assert (links[(1, 2)].link_class, links[(1, 2)].lanes) == ("nvlink-x2", 2)  # GPU5-GPU6: NV2
    assert {n.name: list(n.ranks) for n in profile.topology.nics} == {"node0/mlx5_2": [0, 1], "node0/mlx5_3": [2]}
    assert profile.sharing["groups"] == [[0, 1]]
    assert _bus_key("00000000:07:00.0") == (7, 0, 0) and _bus_key("no bus") is None


def test_real_gpus():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 or more CUDA GPUs (this machine: "
                    f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})")
    from mlopt.profilers.hardware import profile_hardware

    profile = profile_hardware(ProfileOptions(transport="cuda", ranks=2, quick=True))
    assert profile.transport == "cuda" and all(l.beta_us_per_MB > 0 for l in profile.topology.links)


# ------------------------------------------------------------------------------------------------ CPU path


def test_transfer_program_moves_the_chunks(runtime_library):
    import numpy as np

    from mlopt.native.binding import LocalComm, Plan

    for seq in (True, False):
        plan = Plan.from_bytes(transfer_program(3, 2, 0, 4, seq), "t.xml")
        assert plan.program_info["steps"] == (8 if seq else 2)
        inputs = [np.full(64, r + 1.0, dtype=np.float32) for r in range(3)]
        with LocalComm(3) as comm:
            outputs, stats = comm.run(plan, inputs)
        assert (outputs[0] == 3.0).all() and stats.messages == (4 if seq else 1)


@pytest.mark.parametrize("transport", ["threads", "processes", "tcp", "runtime"])
def test_cpu_transports_give_physical_topologies(transport, runtime_library):
    options = ProfileOptions(transport=transport, ranks=2, sizes=(16 * KiB, 64 * KiB), chunks=(1, 2), repeats=2)
    profile = profile_cpu(options)
    topo = profile.topology
    assert topo.num_ranks == 2 and {(l.src, l.dst) for l in topo.links} == {(0, 1), (1, 0)}
    assert all(l.beta_us_per_MB > 0 and l.alpha_us >= 0 for l in topo.links)
    assert all(l.link_class.startswith(transport) for l in topo.links)
    assert topo.source["transport"] == transport and topo.source["model"] == "taccl+overhead"
    # the runtime's per-run cost is every collective call's; the Python harnesses' own is not the job's
    fitted = statistics.median(max(0.0, c["overhead_us"]) for c in topo.source["fit"]["classes"])
    assert topo.call_overhead_us == pytest.approx(fitted if transport in ("threads", "runtime") else 0.0)
    probe = topo.source.get("reduce_probe")  # receiving with a reduction costs more than receiving alone
    if transport in ("threads", "runtime"):
        assert probe["receive_and_reduce_us"] > 0 and probe["receive_us"] > 0
        assert topo.reduce_GBps == probe["reduce_GBps"] and (topo.reduce_GBps is None or topo.reduce_GBps > 0)
    else:
        assert probe is None and topo.reduce_GBps is None
    for report in topo.source["fit"]["links"].values():
        assert len(report["samples"]) == 6 and all(s["repeats"] == 2 for s in report["samples"])


def test_plot_is_reproducible(runtime_library, tmp_path):
    profile = profile_cpu(ProfileOptions(transport="threads", quick=True))
    a, b = plot_fit(profile, tmp_path / "a.png"), plot_fit(profile, tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes() and a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))
    assert default_plot_path("out/topo.json") == Path("out/topo.fit.png")


# ------------------------------------------------------------------------------------------------ CLI


def test_quick_profile_plans_and_runs_an_allgather(run_cli, runtime_library, tmp_path):
    from mlopt.formats.loaders import resolve_topology

    topo_path = tmp_path / "topo.json"
    r = run_cli("-q", "profile", "hardware", "-o", topo_path, "--quick", "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["transport"] == "threads" and summary["ranks"] == 2 and summary["classes"]
    assert Path(summary["plot"]) == tmp_path / "topo.fit.png" and (tmp_path / "topo.fit.png").exists()
    topo = resolve_topology(str(topo_path))
    assert topo.num_ranks == 2 and topo.source["profiler"] == "mlopt profile hardware"
    xml = tmp_path / "ag.xml"
    r = run_cli("-q", "plan", "collective", "--topology", topo_path, "--collective", "allgather", "--size", "1MB",
                "-o", xml)
    assert r.code == 0, r.err
    r = run_cli("run-collective", xml, "--size", "1MB", "--iterations", "1")
    assert r.code == 0, r.err
    assert "outputs match" in r.out


def test_human_summary_lines(run_cli, runtime_library, tmp_path):
    r = run_cli("profile", "hardware", "-o", tmp_path / "t.json", "--ranks", "2", "--sizes", "16KiB,64KiB",
                "--chunks", "1,2", "--repeats", "2", "--no-plot")
    assert r.code == 0, r.err
    assert "class threads" in r.err and "GB/s" in r.err and "R^2" in r.err and "wrote" in r.err
    assert not (tmp_path / "t.fit.png").exists()


@pytest.mark.parametrize("args, option", [
    (["--ranks", "1"], "--ranks"),
    (["--ranks", "two"], "--ranks"),
    (["--sizes", "12x"], "--sizes"),
    (["--sizes", "6"], "--sizes"),
    (["--chunks", "0,2"], "--chunks"),
    (["--repeats", "0"], "--repeats"),
    (["--beta-tol", "-1"], "--beta-tol"),
    (["--beta-tol", "wide"], "--beta-tol"),
])
def test_bad_input_exits_2_naming_the_option(run_cli, tmp_path, args, option):
    out = tmp_path / "t.json"
    r = run_cli("profile", "hardware", "-o", out, *args)
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mlopt: error: {option}: ")
    assert not out.exists()


def test_show_summarises_a_profiled_topology(run_cli, runtime_library, tmp_path):
    out = tmp_path / "topo.json"
    assert run_cli("profile", "hardware", "-o", out, "--quick", "--no-plot").code == 0
    shown = run_cli("show", out)
    assert shown.code == 0 and "fit={classes, links}" in shown.out and "'residual_us'" not in shown.out

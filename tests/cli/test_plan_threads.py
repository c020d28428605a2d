"""`mlopt plan threads` end to end on the DDP example: the plan, its artifacts (DDP bucket caps, NCCL tuner CSV,
NCCL_NTHREADS), validation without a solver, the umbrella command, the C++ loader, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def trace(ddp_example_trace) -> Path:
    return ddp_example_trace


def _plan(run_cli, trace, tmp_path, *extra) -> dict:
    out = tmp_path / "threads.plan.json"
    result = run_cli("plan", "threads", "--model", trace, "--nodes", "8", "-o", out, *extra)
    assert result.code == 0, result.err
    return json.loads(out.read_text())


def test_libra_plan_carries_groups_bound_and_artifacts(run_cli, trace, tmp_path):
    plan = _plan(run_cli, trace, tmp_path)
    payload, provenance = plan["payload"], plan["provenance"]
    assert plan["kind"] == "threads" and payload["algorithm"] == "libra"
    # Theorem 1 with the default model (its assumptions hold): feasible, bound = backward / (1 + (K-1)/Z).
    assert provenance["status"] == "feasible" and provenance["solver"]["name"] == "libra-dp"
    factor = 1 + (min(10, len(payload["layers"])) - 1) / 150  # K is at most the layer count
    assert payload["guarantee"]["factor"] == pytest.approx(factor)
    assert provenance["best_bound"] == pytest.approx(provenance["objective"] / factor)
    # Groups cover the layers in backward order; the gradient bytes are the model's parameters.
    groups = payload["groups"]
    assert groups[0]["first"] == 0 and groups[-1]["last"] == len(payload["layers"]) - 1
    assert all(a["last"] + 1 == b["first"] for a, b in zip(groups, groups[1:]))
    assert sum(g["bytes"] for g in groups) == 5513472  # 4,460,800 + 1,052,672: DDP's two buckets
    assert all(g["threads"] in payload["options"]["thread_set"] for g in groups)
    # LIBRA is never worse than the baselines it is compared with under the same model.
    assert payload["predicted"]["backward_us"] <= min(payload["baselines"].values()) * (1 + 1e-9)
    artifacts = payload["artifacts"]
    sizes = [g["bytes"] for g in groups if g["bytes"] > 0]
    assert artifacts["ddp_bucket_bytes_list"] == sizes
    assert artifacts["ddp_bucket_cap_mb_list"] == pytest.approx([s / 2**20 for s in sizes])
    assert artifacts["env"]["NCCL_NTHREADS"] == str(artifacts["nccl_nthreads"])
    assert artifacts["env"]["NCCL_TUNER_CONFIG_FILE"] == "threads.plan.nccl-tuner.csv"


TUNED = ("allreduce", "broadcast", "allgather", "reducescatter", "reduce")


@pytest.mark.parametrize("gpus_per_node, communicators", [(None, [(-1, -1), (1, 8), (8, 64)]),
                                                          ("8", [(8, 64)])])
def test_the_tuner_csv_parses_as_nccls_example_tuner_reads_it(run_cli, trace, tmp_path, gpus_per_node,
                                                               communicators):
    """Without --gpus-per-node the lines hold for any communicator (-1); with it, for nodes x GPUs ranks. Every
    collective a DDP job issues gets the planned channels for its bucket sizes (NCCL's example plugin's rules)."""
    from mlopt.planners.threads.artifacts import parse_nccl_tuner_csv, selected_channels

    extra = ("--gpus-per-node", gpus_per_node) if gpus_per_node else ()
    plan = _plan(run_cli, trace, tmp_path, *extra)
    rows = parse_nccl_tuner_csv((tmp_path / "threads.plan.nccl-tuner.csv").read_text())
    assert {r["collective"] for r in rows} == set(TUNED)
    if gpus_per_node:
        assert {(r["nNodes"], r["nRanks"]) for r in rows} == {(8, 64)}
    else:
        assert {(r["nNodes"], r["nRanks"]) for r in rows} == {(-1, -1)}
    for group in plan["payload"]["groups"]:
        if group["bytes"]:
            for collective in TUNED:
                for nodes, ranks in communicators:
                    got = selected_channels(rows, collective, group["bytes"], nodes, ranks)
                    assert got == group["channels"], (collective, nodes, ranks)


def test_same_inputs_same_plan(run_cli, trace, tmp_path):
    first = tmp_path / "a" / "threads.plan.json"
    second = tmp_path / "b" / "threads.plan.json"
    for out in (first, second):
        assert run_cli("plan", "threads", "--model", trace, "--nodes", "8", "-o", out).code == 0
    assert first.read_bytes() == second.read_bytes()
    csv = "threads.plan.nccl-tuner.csv"
    assert (first.parent / csv).read_bytes() == (second.parent / csv).read_bytes()


@pytest.mark.parametrize("algorithm", ["libra-m", "ddp", "horovod", "mg-wfbp", "single"])
def test_baselines_are_heuristic_plans_that_validate(run_cli, trace, tmp_path, algorithm):
    plan = _plan(run_cli, trace, tmp_path, "--algorithm", algorithm)
    assert plan["provenance"]["status"] == "heuristic" and plan["provenance"]["gap"] is None
    assert plan["payload"]["predicted"]["backward_us"] == pytest.approx(plan["payload"]["baselines"][algorithm])
    checked = run_cli("validate", tmp_path / "threads.plan.json", "--model", trace)
    assert checked.code == 0, checked.err


def test_validate_replays_the_plan_and_catches_tampering(run_cli, trace, tmp_path):
    _plan(run_cli, trace, tmp_path)
    path = tmp_path / "threads.plan.json"
    ok = run_cli("validate", path, "--model", trace)
    assert ok.code == 0 and "re-evaluated" in ok.out + ok.err
    doc = json.loads(path.read_text())
    doc["payload"]["predicted"]["backward_us"] *= 0.9
    path.write_text(json.dumps(doc))
    bad = run_cli("validate", path)
    assert bad.code == 2 and "$.payload.predicted.backward_us" in bad.err


def test_the_umbrella_command_writes_a_thread_plan(run_cli, trace, tmp_path):
    out = tmp_path / "plans"
    assert run_cli("plan", "--model", trace, "--topology", "fully-connected:2", "-o", out).code == 0
    index = json.loads((out / "index.json").read_text())
    assert any(p["kind"] == "threads" and p["file"] == "threads.plan.json" for p in index["plans"])
    assert (out / "threads.plan.nccl-tuner.csv").exists()
    # The iteration simulator applies the plan's fusion: its groups replace DDP's two buckets.
    simulated = run_cli("simulate", out / "threads.plan.json", "--model", trace, "--topology", "fully-connected:2",
                        "--json")
    assert simulated.code == 0, simulated.err
    plan = json.loads((out / "threads.plan.json").read_text())
    allreduces = [r for r in json.loads(simulated.out)["collectives"] if r["collective"] == "allreduce"]
    assert [r["bytes"] for r in allreduces] == [g["bytes"] for g in plan["payload"]["groups"] if g["bytes"]]
    assert all(r["name"].startswith("allreduce group") for r in allreduces)


def test_the_runtime_library_loads_the_thread_plan(run_cli, trace, tmp_path):
    from mlopt.native import binding as native

    _plan(run_cli, trace, tmp_path)
    try:
        plan = native.Plan.load(tmp_path / "threads.plan.json")
    except native.RuntimeLibraryNotFound as exc:
        pytest.skip(str(exc))
    assert plan.kind == "json" and plan.planner == "threads" and plan.format == "mlopt.plan"


def test_bad_input_exits_2_with_the_reason(run_cli, trace, tmp_path):
    empty = run_cli("plan", "threads", "--model", trace, "--nodes", "8", "--threads", "", "-o", tmp_path / "x.json")
    assert empty.code == 2 and "thread set is empty" in empty.err
    from mlopt.planners.threads.contention import samples_document, Sample
    from mlopt.formats.io import write_json

    few = tmp_path / "few.json"
    write_json(few, samples_document([Sample("compute", 128, 100.0, 101.0), Sample("compute", 256, 100.0, 102.0)]))
    fit = run_cli("plan", "threads", "--model", trace, "--nodes", "8", "--contention", few, "-o", tmp_path / "y.json")
    assert fit.code == 2 and "few.json" in fit.err and "too few" in fit.err
    assert not (tmp_path / "y.json").exists()
    from mlopt.formats.io import write_json as write

    no_backward = tmp_path / "forward-only.json"
    doc = json.loads(Path(trace).read_text())
    doc["ops"] = [op for op in doc["ops"] if op["role"] != "backward"]
    for op in doc["ops"]:
        op["deps"] = [d for d in op.get("deps", []) if any(o["id"] == d for o in doc["ops"])]
        op["forward_op"] = None
    write(no_backward, doc)
    result = run_cli("plan", "threads", "--model", no_backward, "--nodes", "8", "-o", tmp_path / "z.json")
    assert result.code == 2 and "no backward ops" in result.err

"""The schedule examples (examples/schedule/models.py): every trace loads, plans on its 2 x 8-GPU topology,
validates with the optSched replay, and Syndicate is never worse than its own scheduling-only half."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[3] / "examples" / "schedule" / "models.py"


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("schedule_models", MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_all(tmp_path_factory.mktemp("schedule-examples"))


@pytest.mark.parametrize("model", ["dlrm", "fsdp", "cnn"])
def test_example_plans_and_validates(run_cli, traces, tmp_path, model):
    out = tmp_path / f"{model}.plan.json"
    result = run_cli("plan", "schedule", "--model", traces[model], "--topology", "dgx-a100x2", "--max-steps", "60",
                     "-o", out)
    assert result.code == 0, result.err
    payload = json.loads(out.read_text())["payload"]
    collectives = {op["collective"] for op in payload["comm_ops"]}
    assert collectives == {"dlrm": {"alltoall", "allreduce"}, "fsdp": {"allgather", "reducescatter"},
                           "cnn": {"allreduce"}}[model]
    systems = payload["systems"]
    assert systems["syndicate"] <= systems["s-sched"] * (1 + 1e-12)  # it starts from the better of default/greedy
    assert all(m["seq"] >= 0 for op in payload["comm_ops"] for m in op["motifs"])
    checked = run_cli("validate", out, "--model", traces[model], "--topology", "dgx-a100x2")
    assert checked.code == 0, checked.err


def test_example_traces_are_deterministic(traces, tmp_path):
    spec = importlib.util.spec_from_file_location("schedule_models_again", MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    again = module.write_all(tmp_path)
    assert all(again[name].read_bytes() == path.read_bytes() for name, path in traces.items())


def test_dlrm_at_another_scale_keeps_its_per_rank_sizes(tmp_path):
    # bench/schedule.py --nodes N: the same per-rank sizes and compute on 8N ranks (the paper's weak scaling)
    spec = importlib.util.spec_from_file_location("schedule_models_scaled", MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base, wide = module.dlrm_like(), module.dlrm_like(world=32)
    assert (base.world_size, wide.world_size) == (16, 32) and wide.process_groups[0].ranks == tuple(range(32))
    assert wide.name == "dlrm_like_32ranks"
    sizes = [(op.name, op.comm.bytes if op.comm else op.implementations[0].compute_us) for op in base.ops]
    assert [(op.name, op.comm.bytes if op.comm else op.implementations[0].compute_us) for op in wide.ops] == sizes
    paths = module.write_all(tmp_path, world=32)
    assert json.loads(paths["fsdp"].read_text())["world_size"] == 32

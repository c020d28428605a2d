"""The CUDA backend from Python: torch CUDA tensors through `LocalComm.run(..., backend="cuda")` give the CPU
backend's result (bit for bit: both reduce in the same order with the same encoders) and the collective's
reference. Runs only where the library was built with -DMLOPT_CUDA=ON and a GPU is there (bench/runtime_cuda.py
runs it on such a machine); skipped elsewhere. The C++ side is runtime/tests/test_cuda_backend.cpp."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlopt.native import binding as native
from mlopt.native.run_collective import check_outputs, expected_outputs, random_inputs

torch = pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[2] / "runtime" / "tests" / "data"


@pytest.fixture(scope="module", autouse=True)
def cuda_backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    try:
        available, why = native.backend_available("cuda")
    except native.RuntimeLibraryNotFound as exc:
        pytest.skip(str(exc))
    if not available:
        pytest.skip(f"the library cannot run the CUDA backend: {why}")


def _as_torch(arrays, dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        return [torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16) for a in arrays]
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


@pytest.mark.parametrize("name", ["ring4_allreduce.xml", "ring4_allgather.xml", "ndv2_allreduce_tree.xml",
                                  "msccl-scheduler_ncv4_ag_hier_4_LL.xml"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_tensors_match_the_cpu_backend_and_the_reference(name, dtype):
    plan = native.Plan.load(DATA / name)
    info = plan.program_info
    count = 1000 * info["i_chunks"]
    inputs = random_inputs(info["ngpus"], count, dtype, "sum", 7)
    host = _as_torch(inputs, dtype)
    device = [t.cuda() for t in host]
    with native.LocalComm(info["ngpus"]) as comm:
        cpu_out, _ = comm.run(plan, host, chunk_bytes=1024)
        gpu_out, stats = comm.run(plan, device, chunk_bytes=1024, backend="cuda")
    assert stats.backend == "cuda" and stats.device_us > 0
    assert all(o.is_cuda for o in gpu_out)
    for rank, (c, g) in enumerate(zip(cpu_out, gpu_out)):
        assert torch.equal(c.view(torch.int16 if c.element_size() == 2 else torch.int32),
                           g.cpu().view(torch.int16 if g.element_size() == 2 else torch.int32)), f"rank {rank}"
    out_count = plan.output_count(count)
    outputs = [o.cpu().view(torch.int16).numpy().view("uint16") if dtype == "bfloat16" else o.cpu().numpy()
               for o in gpu_out]
    mismatches = check_outputs(outputs, expected_outputs(info["coll"], inputs, dtype, "sum", out_count, 0), dtype, 0)
    assert not mismatches, mismatches[0].describe()


def test_in_place_on_the_gpu():
    plan = native.Plan.load(DATA / "ring4_allgather.xml")
    info = plan.program_info
    if not info["inplace"]:
        pytest.skip("the fixture is out of place only")
    count = 256 * info["i_chunks"]
    inputs = random_inputs(info["ngpus"], count, "float32", "sum", 3)
    device = [t.cuda() for t in _as_torch(inputs, "float32")]
    with native.LocalComm(info["ngpus"]) as comm:
        outputs, _ = comm.run(plan, device, in_place=True, backend="cuda")
    got = [o.cpu().numpy() for o in outputs]
    mismatches = check_outputs(got, expected_outputs("allgather", inputs, "float32", "sum", plan.output_count(count), 0),
                               "float32", 0)
    assert not mismatches, mismatches[0].describe()


def test_cpu_tensors_are_refused_by_the_cuda_backend():
    plan = native.Plan.load(DATA / "ring4_allreduce.xml")
    with native.LocalComm(4) as comm:
        with pytest.raises(ValueError, match="CUDA backend needs CUDA tensors"):
            comm.run(plan, [torch.zeros(64) for _ in range(4)], backend="cuda")

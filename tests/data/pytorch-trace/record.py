"""Record the 2-rank gloo DDP fixtures of this folder: an Execution Trace + Kineto pair per rank and model.

    python tests/data/pytorch-trace/record.py [--out tests/data/pytorch-trace] [--timeout-s 120]

Each rank runs one small model (an MLP and a CNN, CPU, gloo, localhost) under DistributedDataParallel with
small buckets (several allreduces per step) and records three training steps with
`torch.profiler.schedule(wait=1, warmup=1, active=1)`, the documented way to record one step: the Execution
Trace observer and Kineto both keep only the active step (`ProfilerStep#2`). Files written, per model and
rank: `ddp_gloo_{model}.{rank}.et.json.gz` and `ddp_gloo_{model}.{rank}.kineto.json.gz`; per model,
`ddp_gloo_{model}.job.json`: what the job issued (DDP's bucket sizes, from DDP's logging data).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

# torch is an optional dependency of mlopt; this script only runs where it is installed.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

WORLD_SIZE = 2
BATCH = 4
BUCKET_CAP_MB = 0.001  # ~1 KB buckets: each model's gradients span several allreduces
SEED = 0


def make_model(kind: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(model, input batch, target batch); tiny so that every fixture stays small."""
    if kind == "mlp":
        model = nn.Sequential(
            nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4),
        )
        return model, torch.randn(BATCH, 16), torch.randn(BATCH, 4)
    if kind == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4),
        )
        return model, torch.randn(BATCH, 3, 8, 8), torch.randn(BATCH, 4)
    raise ValueError(f"unknown model {kind!r}")


def gzip_to(src: Path, dst: Path) -> None:
    # mtime=0: the same recording gives the same bytes
    with open(src, "rb") as fin, open(dst, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fout:
        shutil.copyfileobj(fin, fout)


def run_rank(rank: int, kind: str, port: int, out: str, scratch: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(SEED + rank)
    torch.set_num_threads(1)
    model, inputs, targets = make_model(kind)
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    et_raw = Path(scratch) / f"{kind}.{rank}.et.json"
    kineto_raw = Path(scratch) / f"{kind}.{rank}.kineto.json"
    observer = ExecutionTraceObserver().register_callback(str(et_raw))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(kineto_raw)),
        execution_trace_observer=observer,
    ) as prof:
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(ddp(inputs), targets)
            loss.backward()
            optimizer.step()
            prof.step()
    observer.unregister_callback()
    issued = issued_allreduces(ddp, optimizer, inputs, targets)
    if rank == 0:
        write_job(Path(out) / f"ddp_gloo_{kind}.job.json", kind, issued, ddp._get_ddp_logging_data())
    dist.barrier()
    dist.destroy_process_group()
    gzip_to(et_raw, Path(out) / f"ddp_gloo_{kind}.{rank}.et.json.gz")
    gzip_to(kineto_raw, Path(out) / f"ddp_gloo_{kind}.{rank}.kineto.json.gz")


def issued_allreduces(ddp: DistributedDataParallel, optimizer, inputs, targets) -> list[int]:
    """Bytes of each allreduce DDP issues in a step, in launch order, seen by a comm hook in one more step
    after the recorded ones (the buckets are fixed from the second iteration on; a hook during the recorded
    step would change the trace)."""
    sizes_bytes: list[int] = []

    def logging_allreduce(state, bucket):
        buffer = bucket.buffer()
        sizes_bytes.append(buffer.numel() * buffer.element_size())
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, logging_allreduce)
    optimizer.zero_grad(set_to_none=True)
    nn.functional.mse_loss(ddp(inputs), targets).backward()
    return sizes_bytes


def write_job(path: Path, kind: str, issued_bytes: list[int], logging_data: dict) -> None:
    """What the job issued, from DDP itself (not from the traces): the tests compare the imports with it."""
    job = {
        "model": kind,
        "torch": torch.__version__,
        "world_size": WORLD_SIZE,
        "backend": "gloo",
        "profiler_schedule": {"wait": 1, "warmup": 1, "active": 1},
        "recorded_step": "ProfilerStep#2",
        "bucket_cap_bytes": logging_data["bucket_cap_bytes"],
        "allreduce_bytes": issued_bytes,  # in launch order
        "total_parameter_size_bytes": logging_data["total_parameter_size_bytes"],
        "initial_broadcast_recorded": False,  # DDP's constructor broadcast runs before the profiler starts
    }
    path.write_text(json.dumps(job, indent=1) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(kind: str, out: Path, timeout_s: float) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        context = mp.start_processes(
            run_rank, args=(kind, free_port(), str(out), scratch), nprocs=WORLD_SIZE, join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        # join returns as soon as one rank exits (True once all have); it raises if a rank failed
        while not context.join(timeout=max(deadline - time.monotonic(), 0.0)):
            if time.monotonic() < deadline:
                continue
            for process in context.processes:  # bounded in time: a hung rendezvous must not hang the caller
                process.terminate()
            raise TimeoutError(f"{kind}: ranks still running after {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in args.models:
        record(kind, args.out, args.timeout_s)
        for path in sorted(args.out.glob(f"ddp_gloo_{kind}.*json*")):
            print(f"{path}  {path.stat().st_size} bytes  torch {torch.__version__}")
    print(json.dumps({"torch": torch.__version__, "world_size": WORLD_SIZE, "bucket_cap_mb": BUCKET_CAP_MB}))


if __name__ == "__main__":
    main()

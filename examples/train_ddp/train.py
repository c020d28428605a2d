"""DDP training of the example MLP or CNN on CPU with mlopt's plans, optionally against gloo in the same job.

    bash examples/train_ddp/make_plans.sh out/train_ddp/plans 4
    torchrun --nproc-per-node 4 examples/train_ddp/train.py --model mlp --plans out/train_ddp/plans --steps 10
    torchrun --nproc-per-node 4 examples/train_ddp/train.py --model cnn --plans out/train_ddp/plans --compare-gloo
    torchrun --nproc-per-node 4 examples/train_ddp/train.py --model mlp --backend gloo --steps 10    # the reference

Synthetic data with a fixed seed (rank r draws its batches from seed * 1000 + r), SGD (lr 0.01, momentum 0.9,
what `mlopt trace` traced), cross-entropy loss. With `--backend mlopt` (default) the job's process group is
mlopt.pytorch's "mlopt" backend loaded with the plan index (MLOPT_PLAN_INDEX) and the model goes through
`mlopt.pytorch.apply_plans` (DDP buckets from the thread plan, the memory plan's executor, the schedule plan's
enforcer); rank 0 prints what applied and what did not (`--skip memory` leaves the memory plan out, e.g. to
time the communication plans alone). `--compare-gloo` then trains a copy of the initial
model on the same batches with DDP's defaults over a second process group (gloo) and prints the largest
absolute parameter difference over all ranks. Per-step times are each step's slowest rank (forward, loss,
backward, optimizer step). `--json PATH` writes the figures (rank 0).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BATCH, CLASSES, INPUT_SHAPES, MODELS  # noqa: E402

LR, MOMENTUM = 0.01, 0.9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--plans", type=Path, help="make_plans.sh's output folder (PLANS/MODEL/plans/index.json)")
    parser.add_argument("--trace", type=Path,
                        help="the trace the plans were made from (default PLANS/MODEL/ddp.trace.json)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backend", choices=("mlopt", "gloo"), default="mlopt")
    parser.add_argument("--skip", default="", help="plan kinds not to apply, e.g. memory or memory,schedule")
    parser.add_argument("--compare-gloo", action="store_true", help="also train with gloo and DDP defaults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the figures here (rank 0)")
    args = parser.parse_args(argv)
    if args.backend == "mlopt" and args.plans is None:
        parser.error("--backend mlopt needs --plans (bash examples/train_ddp/make_plans.sh makes them)")
    return args


def index_folder(args: argparse.Namespace) -> Path | None:
    return None if args.plans is None else args.plans / args.model / "plans"


def init_distributed(backend: str, index: Path | None) -> None:
    """The job's default process group (torchrun's env:// rendezvous)."""
    if backend == "mlopt":
        os.environ["MLOPT_PLAN_INDEX"] = str(index / "index.json")
        import mlopt.pytorch  # lazy: only mlopt jobs need the backend (it loads the runtime library)

        mlopt.pytorch.register()
    dist.init_process_group(backend)


def batches(model: str, steps: int, seed: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    shape = INPUT_SHAPES[model]
    return [(torch.randn(BATCH, *shape, generator=generator), torch.randint(0, CLASSES, (BATCH,), generator=generator))
            for _ in range(steps)]


def train(model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], params: list[nn.Parameter],
          forward: Callable[[], Any], group: Any, windows: list[tuple[float, float]] | None = None) -> list[float]:
    """Per-step times (seconds, the slowest rank's) of SGD on `data`; `windows` gets this rank's
    (start, end) perf_counter seconds of every step."""
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    times = []
    for inputs, targets in data:
        start = time.perf_counter()
        with forward():
            loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        times.append(end - start)
        if windows is not None:
            windows.append((start, end))
    return slowest(times, group)


def communication_us(windows: list[tuple[float, float]], group: Any) -> list[float]:
    """Per step, the runtime's time in the default group's collectives (the mlopt backend's per-call timings
    that started inside the step), the largest over ranks."""
    import mlopt.pytorch  # lazy: only mlopt jobs have the backend

    timings = mlopt.pytorch.backend_of().timings
    per_step = [sum(t.wall_us for t in timings if start <= t.started_s <= end) for start, end in windows]
    return slowest(per_step, group)


def slowest(times: list[float], group: Any) -> list[float]:
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def max_difference(a: nn.Module, b: nn.Module, group: Any) -> float:
    local = max((x.detach() - y.detach()).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))
    t = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def planned_run(args: argparse.Namespace, model: nn.Module, data: list, group: Any) -> dict[str, Any]:
    """The job's own run: with the plans when given, else DDP's defaults."""
    index = index_folder(args)
    if index is None:
        ddp = DistributedDataParallel(model)
        return {"step_s": train(ddp, data, list(model.parameters()), nullcontext, group), "report": []}
    from mlopt.pytorch.apply import apply_plans

    trace = args.trace or args.plans / args.model / "ddp.trace.json"
    applied = apply_plans(index, model, trace=trace, skip=[k for k in args.skip.split(",") if k])
    try:
        windows: list[tuple[float, float]] = []
        times = train(applied.model, data, list(model.parameters()), applied.forward, group, windows)
        hook = applied.schedule_hook
        comm = communication_us(windows, group) if args.backend == "mlopt" else []
        return {"step_s": times, "report": applied.report(), "comm_us": comm,
                "enforced_iterations": hook.enforced_iterations if hook else 0}
    finally:
        applied.close()


def summary(times: list[float]) -> float:
    """Mean step time without the first step (DDP's first iteration builds and rebuilds its buckets)."""
    rest = times[1:] or times
    return sum(rest) / len(rest)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several ranks share this machine's cores
    init_distributed(args.backend, index_folder(args))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")  # timings, differences and the reference run
    torch.manual_seed(args.seed)
    model = MODELS[args.model]()
    reference = copy.deepcopy(model)  # the same initial parameters
    data = batches(args.model, args.steps, args.seed, rank)
    result = {"model": args.model, "ranks": world, "backend": args.backend, "steps": args.steps, "seed": args.seed,
              "skip": args.skip,
              **planned_run(args, model, data, gloo)}
    if args.compare_gloo:
        result["gloo_step_s"] = train_reference(reference, data, gloo)
        result["max_abs_diff"] = max_difference(model, reference, gloo)
    if rank == 0:
        print_result(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    shut_down(gloo)
    return 0


def train_reference(model: nn.Module, data: list, gloo: Any) -> list[float]:
    """gloo + DDP's defaults; the DDP wrapper (and its reducer's reference to the gloo group) ends here, while the
    group is still registered, so its destruction cannot be the group's (see shut_down)."""
    ddp = DistributedDataParallel(model, process_group=gloo)
    return train(ddp, data, list(model.parameters()), nullcontext, gloo)


def shut_down(gloo: Any) -> None:
    """Destroys the process groups once gloo's threads are idle. ProcessGroupGloo's destructor joins its worker
    threads while holding the GIL, and a worker that is still releasing the last work's tensors waits for the
    GIL to drop their Python objects: a deadlock at exit, seen with 4 ranks. A barrier, then a pause that
    releases the GIL, lets the workers finish first."""
    dist.barrier(group=gloo)
    gc.collect()
    time.sleep(0.2)
    dist.destroy_process_group()


def print_result(result: dict[str, Any]) -> None:
    for line in result["report"]:
        print(f"plan {line}")
    for step, seconds in enumerate(result["step_s"], start=1):
        gloo = f", gloo {result['gloo_step_s'][step - 1] * 1e3:.2f} ms" if "gloo_step_s" in result else ""
        print(f"step {step}: {result['backend']} {seconds * 1e3:.2f} ms{gloo}")
    mean = summary(result["step_s"])
    line = f"{result['model']} on {result['ranks']} ranks: {result['backend']} {mean * 1e3:.2f} ms/step (steps 2..)"
    if "gloo_step_s" in result:
        gloo = summary(result["gloo_step_s"])
        line += (f", gloo + DDP defaults {gloo * 1e3:.2f} ms/step, ratio {mean / gloo:.3f}; "
                 f"max |parameter difference| {result['max_abs_diff']:.3g}")
    print(line)


if __name__ == "__main__":
    sys.exit(main())

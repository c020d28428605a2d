"""Give a CPU model trace (`mlopt trace MODULE:CALLABLE`) the gradient all-reduces of a DDP job.

`mlopt trace MODULE:CALLABLE` traces one process's forward, loss, backward and optimizer step: it has no
communication, so `mlopt plan --model` skips the collective and schedule planners ("the trace has no
comm-ops"). A DDP job all-reduces its gradients in buckets; this script inserts one all-reduce comm-op per
bucket into the trace, over a process group of `--world-size` ranks, and writes a new trace:

    python examples/train_ddp/ddp_trace.py mlp.trace.json --buckets threads.plan.json --world-size 4 \
        -o mlp.ddp.trace.json

Buckets: the fusion groups of a thread plan made from this very trace (`mlopt plan threads`): DDP builds
exactly these buckets from the plan's `ddp_bucket_cap_mb_list` once it has rebuilt them after its first
iteration (mlopt.pytorch.apply_plans checks it in the running job). DDP's default buckets are not offered:
its 1 MiB / 25 MiB caps cut inside layers, where the bucket a gradient lands in depends on the order autograd
accumulates a layer's weight and bias gradients (bias first on torch 2.13), which the trace does not
record (it orders the kernels that compute them, weight first).

Where a bucket's all-reduce goes: right after the backward op that writes the last gradient of the bucket
(DDP launches it from that gradient's AccumulateGrad hook). It reads and writes the bucket's gradient tensors
(in place, as DDP's copy back to `.grad` does), so the optimizer waits for it. Its compute time is 0: the
planners price collectives on the topology. A parameter's gradient is found through the optimizer: the
gradient tensors read by the optimizer ops that update the parameter, directly or through optimizer state
(SGD momentum, Adam moments). Parameters go into buckets as the thread planner counts them
(`mlopt.planners.threads.build.layer_end_ops`: a layer's parameters are the parameters its forward op reads).

The proper home of this is a tracer option (`mlopt trace --ddp-buckets ...`); until then it is this script.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Sequence

from mlopt.errors import InputError
from mlopt.formats.io import sha256_file
from mlopt.formats.plan import load_plan
from mlopt.formats.trace import (CommSpec, Implementation, ModelTrace, Op, ProcessGroup, load_trace, save_trace,
                                 validate_trace)
from mlopt.planners.threads.build import layer_end_ops, layers_from_trace

GROUP = "0"  # name of the all-ranks process group in the written trace


def parameter_gradients(trace: ModelTrace) -> dict[int, tuple[int, ...]]:
    """Parameter tensor id -> the gradient tensor ids its optimizer update reads (directly or via state)."""
    kinds = {t.id: t.kind for t in trace.tensors}
    optimizer = [op for op in trace.ops if op.role == "optimizer"]
    writers: dict[int, list[Op]] = defaultdict(list)
    for op in optimizer:
        for t in op.outputs:
            writers[t].append(op)
    found: dict[int, tuple[int, ...]] = {}
    for param in (t for t, kind in kinds.items() if kind == "parameter" and t in writers):
        grads, seen, todo = [], {param}, [param]
        while todo:
            for op in writers.get(todo.pop(), ()):
                for t in op.inputs:
                    if kinds[t] == "gradient" and t not in grads:
                        grads.append(t)
                    elif kinds[t] == "optimizer_state" and t not in seen:
                        seen.add(t)
                        todo.append(t)
        if grads:
            found[param] = tuple(grads)
    return found


def layer_parameters(trace: ModelTrace, source: str) -> list[list[int]]:
    """Per layer of `layers_from_trace` (backward order), the parameter ids counted in it."""
    ops = {op.id: op for op in trace.ops}
    kinds = {t.id: t.kind for t in trace.tensors}
    counted: set[int] = set()
    layers = []
    for end in layer_end_ops(trace, source):
        if end is None:  # the compute after the last gradient
            layers.append([])
            continue
        forward = ops[ops[end].forward_op]
        params = [t for t in dict.fromkeys(forward.inputs) if kinds.get(t) == "parameter" and t not in counted]
        counted.update(params)
        layers.append(params)
    return layers


def groups_from_thread_plan(path: str, trace: ModelTrace, trace_path: str) -> list[tuple[int, int, int]]:
    """(first layer, last layer, bytes) of each fusion group of a thread plan made from this trace."""
    plan = load_plan(path)
    if plan.kind != "threads":
        raise InputError(path, "$.kind", f"expected a thread plan, found {plan.kind!r}")
    made_for = plan.provenance.get("inputs", {}).get("model")
    if made_for != sha256_file(trace_path):
        raise InputError(path, "$.provenance.inputs.model", f"the plan was made from another trace than {trace_path}")
    names = [name for name, _, _ in layers_from_trace(trace, trace_path)]
    planned = [layer.get("name") for layer in plan.payload.get("layers", [])]
    if planned != names:
        raise InputError(path, "$.payload.layers",
                         f"{len(planned)} layers, the trace gives {len(names)} (made for another trace?)")
    try:
        return [(int(g["first"]), int(g["last"]), int(g["bytes"])) for g in plan.payload["groups"]]
    except (KeyError, TypeError, ValueError):
        raise InputError(path, "$.payload.groups", "expected groups with integer first, last and bytes") from None


def last_writer(trace: ModelTrace) -> dict[int, int]:
    """Tensor id -> position (in trace.ops) of the last backward op writing it."""
    out = {}
    for position, op in enumerate(trace.ops):
        if op.role == "backward":
            for t in op.outputs:
                out[t] = position
    return out


def comm_op(op_id: int, grads: Sequence[int], nbytes: int) -> Op:
    return Op(op_id, "ddp::allreduce_bucket", "comm", tuple(grads), tuple(grads),
              (Implementation("default", 0.0),), comm=CommSpec("allreduce", nbytes, GROUP))


def with_buckets(trace: ModelTrace, buckets: list[list[int]], grads: dict[int, tuple[int, ...]], world_size: int,
                 source: str) -> ModelTrace:
    """The trace with one all-reduce per bucket after the backward op writing its last gradient."""
    sizes = {t.id: t.bytes for t in trace.tensors}
    writer = last_writer(trace)
    after: dict[int, list[Op]] = defaultdict(list)
    next_id = max(op.id for op in trace.ops) + 1
    for index, bucket in enumerate(buckets):
        bucket_grads = [g for p in bucket for g in grads[p]]
        nbytes = sum(sizes[p] for p in bucket)
        position = max(writer[g] for g in bucket_grads)
        after[position].append(comm_op(next_id + index, bucket_grads, nbytes))
    ops = []
    for position, op in enumerate(trace.ops):
        ops.append(op)
        ops.extend(after.get(position, ()))
    out = ModelTrace(trace.name, tuple(ops), trace.tensors, (ProcessGroup(GROUP, tuple(range(world_size))),),
                     trace.rank, world_size,
                     {**trace.source, "ddp_buckets": {"bytes": [sum(sizes[p] for p in b) for b in buckets],
                                                      "world_size": world_size}})
    validate_trace(out, source)
    return out


def bucket_parameters(trace: ModelTrace, trace_path: str, threads_plan: str,
                      grads: dict[int, tuple[int, ...]]) -> list[list[int]]:
    layers = layer_parameters(trace, trace_path)
    params = [p for layer in layers for p in layer]
    missing = [p for p in params if p not in grads]
    if missing:
        raise InputError(trace_path, "$.ops", f"no optimizer update reads a gradient of parameter tensor(s) {missing}")
    sizes = {t.id: t.bytes for t in trace.tensors}
    buckets = []
    for index, (first, last, nbytes) in enumerate(groups_from_thread_plan(threads_plan, trace, trace_path)):
        bucket = [p for layer in layers[first:last + 1] for p in layer]
        if sum(sizes[p] for p in bucket) != nbytes:
            raise InputError(threads_plan, f"$.payload.groups[{index}].bytes",
                             f"{nbytes}, the trace's parameters of layers {first}..{last} hold "
                             f"{sum(sizes[p] for p in bucket)} bytes")
        if bucket:  # a group of only the compute after the last gradient has no bytes: no bucket
            buckets.append(bucket)
    return buckets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="mlopt trace of one process (mlopt trace MODULE:CALLABLE)")
    parser.add_argument("--buckets", required=True, help="a thread plan made from TRACE (its fusion groups)")
    parser.add_argument("--world-size", type=int, required=True, help="data-parallel ranks")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    try:
        if args.world_size < 2:
            raise InputError("--world-size", "world_size", f"needs at least 2 ranks, got {args.world_size}")
        trace = load_trace(args.trace)
        if any(op.role == "comm" for op in trace.ops):
            raise InputError(args.trace, "$.ops", "the trace already has comm-ops")
        grads = parameter_gradients(trace)
        buckets = bucket_parameters(trace, args.trace, args.buckets, grads)
        out = with_buckets(trace, buckets, grads, args.world_size, args.trace)
    except InputError as error:
        print(f"ddp_trace: error: {error}", file=sys.stderr)
        return 2
    save_trace(out, args.output)
    print(f"wrote {args.output}: {len(buckets)} all-reduce bucket(s) of {out.source['ddp_buckets']['bytes']} bytes "
          f"over {args.world_size} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())

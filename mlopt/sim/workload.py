"""The workload layer of the training simulator (ASTRA-SIM's training loop): what each rank computes and
communicates in a training iteration, and in which order.

SPMD model. Every rank runs the same item stream (`Workload.items`, in the order one rank's program issues
them). Compute items run on one in-order compute stream; comm items are collectives over `group`, the ranks
of the issuing rank's process group as the representative rank 0 sees it (workload ranks 0..world-1). In the
synthetic generators every other rank's group of the same kind is congruent (same size, same shape shifted),
so rank 0's timing stands for all; whether congruent groups contend for links is the collective timer's
business. The generators leave out collectives over a single rank (they move nothing). A permute (XLA's
collective-permute) also carries its (source, destination) `pairs` in workload ranks, members of `group`:
each source sends its whole `nbytes` buffer to its destination.

Dependencies. `deps` lists the items that must finish before an item may start. Iterations are chained by
`chain`, which repeats one iteration's items and links iteration k+1 to iteration k:
  - compute needs no link: the compute stream is in order, so iteration k+1's compute follows k's;
  - loop-carried edges `Workload.carry` = ((a, b), ...) say "item b of iteration k+1 waits for item a of
    iteration k". The synthetic generators carry "layer i's first use of its parameters in iteration k+1
    waits for layer i's gradient communication in iteration k" (ASTRA-SIM: the forward pass blocks on the
    previous backward pass's collective of that layer). `from_trace` derives them from the trace's tensors,
    exactly as for edges inside an iteration (see `_hazard_deps`): for a DDP trace the optimizer step reads
    the gradients that the bucket copies wrote after each bucket's allreduce, and the next forward reads the
    parameters the optimizer wrote, so the next forward waits for every allreduce that feeds it and no more.
  - `carry=None` (unknown) falls back to an iteration barrier: every item of iteration k+1 without deps
    inside its iteration waits for every item of iteration k that nothing in iteration k waits for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.sizes import parse_size
from mlopt.formats.trace import ModelTrace, Op, pairs_problem

COMPUTE, COMM = "compute", "comm"
WORKLOAD_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "barrier",
                        "permute")
WORKLOAD_KINDS = ("dp", "mp", "hybrid", "fsdp")


@dataclass(frozen=True)
class WorkItem:
    id: int
    name: str
    kind: str  # "compute" | "comm"
    duration_us: float = 0.0  # compute
    collective: str = ""  # comm: one of WORKLOAD_COLLECTIVES
    # comm: nccl-tests' convention (allreduce: the buffer; allgather/reducescatter: the total; permute: the bytes
    # each source sends)
    nbytes: int = 0
    group: tuple[int, ...] = ()  # comm: ranks of the process group (workload ranks 0..world-1)
    deps: tuple[int, ...] = ()  # items that must finish first
    iteration: int = 0
    phase: str = ""  # "forward" | "backward" | "weight_grad" | "optimizer" | "other" | "comm"
    layer: str = ""  # layer/op name for reports
    source_op: int | None = None  # trace op id it came from
    # permute: (source, destination) workload ranks, members of `group` (last field: positional callers keep working)
    pairs: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "name": self.name, "kind": self.kind, "duration_us": self.duration_us,
            "collective": self.collective, "nbytes": self.nbytes, "group": list(self.group),
            "deps": list(self.deps), "iteration": self.iteration, "phase": self.phase, "layer": self.layer,
            "source_op": self.source_op,
        }
        if self.pairs:  # only then, so every other item's dict stays as it was
            d["pairs"] = [list(p) for p in self.pairs]
        return d


@dataclass(frozen=True)
class Workload:
    name: str
    world_size: int
    items: tuple[WorkItem, ...]  # in issue order (the order one rank's program issues them: SPMD)
    # Loop-carried edges of a one-iteration workload, (a, b): item b of iteration k+1 waits for item a of
    # iteration k. None: unknown, `chain` puts a barrier between iterations. () : none beyond the stream.
    carry: tuple[tuple[int, int], ...] | None = None

    @property
    def iterations(self) -> int:
        return 1 + max((it.iteration for it in self.items), default=0)

    def comm_items(self) -> list[WorkItem]:
        return [it for it in self.items if it.kind == COMM]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "world_size": self.world_size, "iterations": self.iterations,
            "items": [it.to_dict() for it in self.items],
            "carry": None if self.carry is None else [list(e) for e in self.carry],
        }


# ---------------------------------------------------------------------------------------------------------
# Chaining iterations


def _barrier_carry(items: tuple[WorkItem, ...]) -> tuple[tuple[int, int], ...]:
    waited = {d for it in items for d in it.deps}
    sinks = [it.id for it in items if it.id not in waited]
    roots = [it.id for it in items if not it.deps]
    return tuple((a, b) for b in roots for a in sinks)


def chain(workload: Workload, iterations: int) -> Workload:
    """`iterations` copies of a one-iteration workload, linked by its loop-carried edges (module docstring).

    Item ids of iteration k are k * stride + id (stride: the largest id + 1), so a dense 0..n-1 iteration
    stays dense."""
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, not {iterations!r}")
    if any(it.iteration != 0 for it in workload.items):
        raise ValueError(f"workload {workload.name!r} already spans several iterations; chain a single one")
    if iterations == 1:
        return workload
    ids = {it.id for it in workload.items}
    if any(i < 0 for i in ids):
        raise ValueError(f"workload {workload.name!r}: item ids must be >= 0 to be chained")
    carry = _barrier_carry(workload.items) if workload.carry is None else workload.carry
    unknown = sorted({x for edge in carry for x in edge} - ids)
    if unknown:
        raise ValueError(f"workload {workload.name!r}: loop-carried edges name unknown items {unknown}")
    stride = 1 + max(ids, default=-1)
    carried: dict[int, list[int]] = {}
    for a, b in carry:
        carried.setdefault(b, []).append(a)
    items = []
    for k in range(iterations):
        off = k * stride
        for it in workload.items:
            prev = [a + off - stride for a in carried.get(it.id, ())] if k else []
            deps = tuple(d + off for d in it.deps) + tuple(prev)
            items.append(replace(it, id=it.id + off, deps=_unique(deps), iteration=k))
    return Workload(workload.name, workload.world_size, tuple(items), carry=None)


def _unique(values: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(values))


# ---------------------------------------------------------------------------------------------------------
# From a model trace


def _hazard_deps(ops: tuple[Op, ...] | list[Op]) -> list[list[int]]:
    """Predecessor positions of each op in `ops` (one rank's stream) from the tensors it reads and writes.

    A read waits for the tensor's last writer (read after write). A write waits for the last writer and for
    every reader since (write after write, write after read): an in-place update must not overtake a
    collective still reading the buffer. Earlier writers are covered transitively, so the edge count stays
    linear in the number of tensor uses. A tensor no op has written yet (external, or preloaded like a
    parameter, which the optimizer later updates in place) gives no edge.
    """
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    deps: list[list[int]] = []
    for pos, op in enumerate(ops):
        mine: list[int] = []
        outputs = set(op.outputs)
        for t in op.inputs:
            if t in last_writer:
                mine.append(last_writer[t])
        for t in op.outputs:
            if t in last_writer:
                mine.append(last_writer[t])
            mine.extend(readers.get(t, ()))
        for t in op.inputs:
            if t not in outputs:
                readers.setdefault(t, []).append(pos)
        for t in op.outputs:
            last_writer[t] = pos
            readers[t] = []
        deps.append([d for d in dict.fromkeys(mine) if d != pos])
    return deps


def _compute_item(op: Op, index: int, source: str) -> WorkItem:
    us = op.compute_us
    if us is None:
        raise InputError(
            source, f"$.ops[{index}].implementations[0].compute_us",
            f"op {op.id} ({op.name}) has no measured compute_us; run `mlopt profile operators` or import Kineto",
        )
    if not math.isfinite(us) or us < 0:
        raise InputError(source, f"$.ops[{index}].implementations[0].compute_us",
                         f"op {op.id} ({op.name}) has compute_us {us}, expected a finite time >= 0")
    return WorkItem(index, op.name, COMPUTE, duration_us=float(us), phase=op.role, layer=op.name, source_op=op.id)


def _comm_item(op: Op, index: int, groups: dict[str, tuple[int, ...]], world: int, source: str) -> WorkItem:
    comm = op.comm
    where = f"$.ops[{index}].comm"
    if comm is None:
        raise InputError(source, where, f"comm op {op.id} ({op.name}) has no collective")
    if comm.collective not in WORKLOAD_COLLECTIVES:
        raise InputError(source, f"{where}.collective", f"op {op.id} ({op.name}): point-to-point "
                         f"{comm.collective!r} has no place in the SPMD workload model (collectives only)")
    if comm.group not in groups:
        known = ", ".join(repr(g) for g in groups) or "none"
        raise InputError(source, f"{where}.group",
                         f"op {op.id} ({op.name}) uses unknown process group {comm.group!r} (known: {known})")
    ranks = groups[comm.group]
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise InputError(source, f"{where}.group", f"op {op.id} ({op.name}): process group {comm.group!r} "
                         f"names ranks {bad} outside 0..{world - 1}")
    return WorkItem(index, op.name, COMM, collective=comm.collective, nbytes=int(comm.bytes), group=ranks,
                    phase=COMM, layer=op.name, source_op=op.id, pairs=_global_pairs(op, index, ranks, source))


def _global_pairs(op: Op, index: int, ranks: tuple[int, ...], source: str) -> tuple[tuple[int, int], ...]:
    """A permute's pairs as workload ranks: the trace gives group positions, the workload (and the timer, which
    sends messages between topology ranks) needs the ranks at those positions. () for other collectives.

    Checked again here (validate_trace already did on load) because a trace built in memory skips the loader."""
    comm = op.comm
    problem = pairs_problem(comm.collective, comm.pairs, len(ranks))
    if problem:
        raise InputError(source, f"$.ops[{index}].comm.pairs", f"op {op.id} ({op.name}): {problem}")
    return tuple((ranks[s], ranks[d]) for s, d in comm.pairs or ())


def from_trace(trace: ModelTrace, iterations: int = 1, *, source: str = "trace.json") -> Workload:
    """One rank's traced step as a workload: ops in trace order, item ids 0..n-1 (source_op: the op id).

    Comm ops become comm items over their process group (their measured host time is ignored: the collective
    timer prices them; a permute's pairs go from group positions to the ranks at them); every other op
    (forward, backward, optimizer, other) becomes a compute item of its default implementation's compute_us,
    phase = its role. Deps: tensor hazards (`_hazard_deps`) plus the trace's `deps` edges; loop-carried edges
    come from the same hazards across the iteration boundary."""
    groups = {g.name: tuple(g.ranks) for g in trace.process_groups}
    world = max(1, trace.world_size)
    items = []
    for pos, op in enumerate(trace.ops):
        if op.role == "comm" or op.comm is not None:
            items.append(_comm_item(op, pos, groups, world, source))
        else:
            items.append(_compute_item(op, pos, source))
    position = {op.id: pos for pos, op in enumerate(trace.ops)}
    hazards = _hazard_deps(trace.ops)
    for pos, op in enumerate(trace.ops):
        for j, dep in enumerate(op.deps):
            if dep not in position:
                raise InputError(source, f"$.ops[{pos}].deps[{j}]", f"op {op.id} depends on unknown op {dep}")
        deps = sorted(set(hazards[pos]) | {position[d] for d in op.deps} - {pos})
        items[pos] = replace(items[pos], deps=tuple(deps))
    n = len(trace.ops)
    twice = _hazard_deps(tuple(trace.ops) * 2)
    carry = tuple((a, b - n) for b in range(n, 2 * n) for a in twice[b] if a < n)
    return chain(Workload(trace.name, world, tuple(items), carry=carry), iterations)


# ---------------------------------------------------------------------------------------------------------
# Synthetic training loops (ASTRA-SIM's workload types)


def _check_loop(layers: int, world: int, **times: float) -> None:
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a positive integer, not {layers!r}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive integer, not {world!r}")
    for key, value in times.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{key} must be a finite number >= 0, not {value!r}")


class _Stream:
    """Item ids in issue order while a generator builds one iteration (local to one call)."""

    def __init__(self) -> None:
        self.items: list[WorkItem] = []

    def compute(self, phase: str, layer: int, us: float, deps: list[int | None]) -> int:
        return self._add(WorkItem(0, f"{phase} layer{layer}", COMPUTE, duration_us=float(us), phase=phase,
                                  layer=f"layer{layer}", deps=_ids(deps)))

    def comm(self, collective: str, layer: int, nbytes: int, group: tuple[int, ...], deps: list[int | None],
             tag: str = "") -> int | None:
        if len(group) < 2:
            return None
        name = f"{collective}{tag} layer{layer}"
        return self._add(WorkItem(0, name, COMM, collective=collective, nbytes=int(nbytes), group=group,
                                  phase=COMM, layer=f"layer{layer}", deps=_ids(deps)))

    def _add(self, item: WorkItem) -> int:
        self.items.append(replace(item, id=len(self.items)))
        return len(self.items) - 1


def _ids(deps: list[int | None]) -> tuple[int, ...]:
    return _unique([d for d in deps if d is not None])


def _carried(pairs: list[tuple[int | None, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((a, b) for a, b in pairs if a is not None)


def data_parallel(layers: int, world: int, fwd_us: float, bwd_us: float, grad_bytes: int,
                  iterations: int = 1) -> Workload:
    """Data parallel: forward layers 0..L-1, then backward L-1..0; after each backward layer an allreduce of
    its weight gradients (grad_bytes) over all ranks that depends only on that backward item, so it overlaps
    the remaining backward compute. Next iteration's forward of layer i waits for that allreduce."""
    _check_loop(layers, world, fwd_us=fwd_us, bwd_us=bwd_us, grad_bytes=grad_bytes)
    s, everyone = _Stream(), tuple(range(world))
    fwd: list[int] = []
    for i in range(layers):
        fwd.append(s.compute("forward", i, fwd_us, [fwd[-1] if fwd else None]))
    prev, ar = fwd[-1], {}
    for i in reversed(range(layers)):
        prev = s.compute("backward", i, bwd_us, [prev])
        ar[i] = s.comm("allreduce", i, grad_bytes, everyone, [prev])
    carry = _carried([(ar[i], fwd[i]) for i in range(layers)])
    return chain(Workload(f"dp-{world}x{layers}", world, tuple(s.items), carry=carry), iterations)


def _mp_forward(s: _Stream, layers: int, fwd_us: float, nbytes: int, group: tuple[int, ...],
                tag: str = "") -> tuple[list[int], int]:
    """Model-parallel forward: each layer, then the allgather of its output that the next layer waits for.
    Returns (forward items, the item the backward pass starts after)."""
    fwd: list[int] = []
    last: int | None = None
    for i in range(layers):
        fwd.append(s.compute("forward", i, fwd_us, [last]))
        last = s.comm("allgather", i, nbytes, group, [fwd[-1]], tag=tag)
        last = fwd[-1] if last is None else last
    return fwd, last


def _mp_backward(s: _Stream, i: int, bwd_us: float, weight_grad_us: float, nbytes: int,
                 group: tuple[int, ...], prev: list[int | None], tag: str = "") -> tuple[int | None, int]:
    """One model-parallel backward layer: input gradient, its reducescatter, weight gradient (when split off).
    Returns (reducescatter or None, the weight-gradient item, or the input-gradient one when not split)."""
    ig = s.compute("backward", i, bwd_us, prev)
    rs = s.comm("reducescatter", i, nbytes, group, [ig], tag=tag)
    wg = s.compute("weight_grad", i, weight_grad_us, [ig]) if weight_grad_us > 0 else ig
    return rs, wg


def model_parallel(layers: int, world: int, fwd_us: float, bwd_us: float, activation_bytes: int,
                   iterations: int = 1, *, weight_grad_us: float = 0.0) -> Workload:
    """Model (tensor) parallel, Megatron-style: every layer is split over all ranks. After each forward layer an
    allgather of its activations (activation_bytes, the full tensor) that the next forward layer waits for;
    after each backward layer a reducescatter of the input gradient that the next backward layer waits for.
    With weight_grad_us > 0 the backward of a layer is split as in ASTRA-SIM: input gradient (bwd_us), issue
    its reducescatter, weight gradient (weight_grad_us) overlapping it, then wait. Next iteration's forward of
    layer i waits for layer i's reducescatter."""
    _check_loop(layers, world, fwd_us=fwd_us, bwd_us=bwd_us, activation_bytes=activation_bytes,
                weight_grad_us=weight_grad_us)
    s, everyone = _Stream(), tuple(range(world))
    fwd, last = _mp_forward(s, layers, fwd_us, activation_bytes, everyone)
    rs: dict[int, int | None] = {}
    prev: list[int | None] = [last]
    for i in reversed(range(layers)):
        rs[i], wg = _mp_backward(s, i, bwd_us, weight_grad_us, activation_bytes, everyone, prev)
        prev = [rs[i], wg]
    carry = _carried([(rs[i], fwd[i]) for i in range(layers)])
    return chain(Workload(f"mp-{world}x{layers}", world, tuple(s.items), carry=carry), iterations)


def hybrid_parallel(layers: int, world: int, dp: int, mp: int, fwd_us: float, bwd_us: float,
                    activation_bytes: int, grad_bytes: int, iterations: int = 1, *,
                    weight_grad_us: float = 0.0) -> Workload:
    """Model parallel inside groups of mp consecutive ranks, data parallel across the dp groups of strided
    ranks (rank r, r + mp, r + 2 mp, ...). The model-parallel allgather/reducescatter (activation_bytes) block
    as in `model_parallel`; each layer's weight gradients (grad_bytes) are allreduced over its data-parallel
    group after its weight gradient is computed, overlapping later compute. Next iteration's forward of layer
    i waits for layer i's data-parallel allreduce and reducescatter."""
    _check_loop(layers, world, fwd_us=fwd_us, bwd_us=bwd_us, activation_bytes=activation_bytes,
                grad_bytes=grad_bytes, weight_grad_us=weight_grad_us)
    if not (isinstance(dp, int) and isinstance(mp, int) and dp >= 1 and mp >= 1) or dp * mp != world:
        raise ValueError(f"hybrid parallelism needs positive integers dp * mp == world, not {dp} * {mp} != {world}")
    s = _Stream()
    mp_group, dp_group = tuple(range(mp)), tuple(range(0, world, mp))
    fwd, last = _mp_forward(s, layers, fwd_us, activation_bytes, mp_group, tag=" (mp)")
    rs: dict[int, int | None] = {}
    ar: dict[int, int | None] = {}
    prev: list[int | None] = [last]
    for i in reversed(range(layers)):
        rs[i], wg = _mp_backward(s, i, bwd_us, weight_grad_us, activation_bytes, mp_group, prev, tag=" (mp)")
        ar[i] = s.comm("allreduce", i, grad_bytes, dp_group, [wg], tag=" (dp)")
        prev = [rs[i], wg]
    carry = _carried([(ar[i], fwd[i]) for i in range(layers)] + [(rs[i], fwd[i]) for i in range(layers)])
    return chain(Workload(f"hybrid-{dp}x{mp}x{layers}", world, tuple(s.items), carry=carry), iterations)


def fsdp(layers: int, world: int, fwd_us: float, bwd_us: float, param_bytes: int, iterations: int = 1) -> Workload:
    """Fully sharded data parallel (ZeRO-3): before each forward and each backward layer an allgather of its
    parameters (param_bytes, the full layer) that depends only on the previous allgather, so it can be
    prefetched while earlier layers compute; after each backward layer a reducescatter of its gradients that
    overlaps later compute. Next iteration's allgather of layer i waits for layer i's reducescatter (the
    optimizer updates the shard it produces)."""
    _check_loop(layers, world, fwd_us=fwd_us, bwd_us=bwd_us, param_bytes=param_bytes)
    s, everyone = _Stream(), tuple(range(world))
    gather: list[int | None] = []
    fwd: list[int] = []
    for i in range(layers):
        gather.append(s.comm("allgather", i, param_bytes, everyone, [gather[-1] if gather else None], tag=" (fwd)"))
        fwd.append(s.compute("forward", i, fwd_us, [fwd[-1] if fwd else None, gather[-1]]))
    prev_gather, prev, rs = gather[-1], fwd[-1], {}
    for i in reversed(range(layers)):
        prev_gather = s.comm("allgather", i, param_bytes, everyone, [prev_gather], tag=" (bwd)")
        prev = s.compute("backward", i, bwd_us, [prev, prev_gather])
        rs[i] = s.comm("reducescatter", i, param_bytes, everyone, [prev])
    carry = _carried([(rs[i], gather[i] if gather[i] is not None else fwd[i]) for i in range(layers)])
    return chain(Workload(f"fsdp-{world}x{layers}", world, tuple(s.items), carry=carry), iterations)


# ---------------------------------------------------------------------------------------------------------
# Workload specs: "dp:ranks=1024,layers=50,fwd_us=100,bwd_us=200,bytes=4MiB,iterations=2"

_COMMON_KEYS = ("ranks", "layers", "fwd_us", "bwd_us", "bytes", "iterations")
_SPEC_KEYS = {
    "dp": _COMMON_KEYS,
    "mp": _COMMON_KEYS + ("wg_us",),
    "fsdp": _COMMON_KEYS,
    "hybrid": _COMMON_KEYS + ("dp", "mp", "act_bytes", "wg_us"),
}
DEFAULT_FWD_US = 100.0  # a spec's forward time per layer when it gives none
_SPEC_HELP = "like dp:ranks=1024,layers=50,fwd_us=100,bwd_us=200,bytes=4MiB,iterations=2"


def _spec_fields(spec: str) -> tuple[str, dict[str, str]]:
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in WORKLOAD_KINDS:
        raise ValueError(f"workload spec {spec!r}: expected KIND:key=value,... with KIND one of "
                         f"{', '.join(WORKLOAD_KINDS)} ({_SPEC_HELP})")
    fields: dict[str, str] = {}
    for part in (p.strip() for p in rest.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise ValueError(f"workload spec {spec!r}: {part!r} is not key=value")
        if key not in _SPEC_KEYS[kind]:
            raise ValueError(f"workload spec {spec!r}: unknown key {key!r} for {kind} "
                             f"(known: {', '.join(_SPEC_KEYS[kind])})")
        if key in fields:
            raise ValueError(f"workload spec {spec!r}: {key!r} given twice")
        fields[key] = value.strip()
    return kind, fields


def _spec_int(spec: str, fields: dict[str, str], key: str, default: int | None = None) -> int:
    if key not in fields:
        if default is None:
            raise ValueError(f"workload spec {spec!r}: missing {key}=")
        return default
    text = fields[key]
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"workload spec {spec!r}: {key}={text!r} is not a positive integer")
    return int(text)


def _spec_float(spec: str, fields: dict[str, str], key: str, default: float | None = None) -> float:
    if key not in fields:
        if default is None:
            raise ValueError(f"workload spec {spec!r}: missing {key}=")
        return default
    try:
        value = float(fields[key])
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"workload spec {spec!r}: {key}={fields[key]!r} is not a time in us >= 0")
    return value


def _spec_size(spec: str, fields: dict[str, str], key: str, default: int | None = None) -> int:
    if key not in fields:
        if default is None:
            raise ValueError(f"workload spec {spec!r}: missing {key}=")
        return default
    try:
        return parse_size(fields[key], key)
    except InputError as exc:
        raise ValueError(f"workload spec {spec!r}: {key}: {exc.message}") from None


def parse_workload_spec(spec: str) -> Workload:
    """A synthetic workload from `KIND:key=value,...`.

    Keys: ranks (world size; hybrid: defaults to dp * mp), layers, fwd_us (default 100), bwd_us (default
    2 * fwd_us, the usual backward-to-forward ratio), bytes (dp: gradient bytes
    per layer; mp: activation bytes; fsdp: parameter bytes; hybrid: the data-parallel gradient bytes),
    iterations (default 1); mp and hybrid: wg_us (weight-gradient compute split off the backward, default 0);
    hybrid: dp, mp, act_bytes (model-parallel activation bytes, default: bytes). Sizes as in 4MiB, 32KB, 4096.
    Raises ValueError naming the spec and the bad key."""
    kind, f = _spec_fields(spec)
    layers, iterations = _spec_int(spec, f, "layers"), _spec_int(spec, f, "iterations", 1)
    fwd_us = _spec_float(spec, f, "fwd_us", DEFAULT_FWD_US)
    bwd_us = _spec_float(spec, f, "bwd_us", 2.0 * fwd_us)
    nbytes = _spec_size(spec, f, "bytes")
    if kind == "hybrid":
        dp, mp = _spec_int(spec, f, "dp"), _spec_int(spec, f, "mp")
        ranks = _spec_int(spec, f, "ranks", dp * mp)
        if ranks != dp * mp:
            raise ValueError(f"workload spec {spec!r}: ranks={ranks} but dp * mp = {dp * mp}")
        return hybrid_parallel(layers, ranks, dp, mp, fwd_us, bwd_us, _spec_size(spec, f, "act_bytes", nbytes),
                               nbytes, iterations, weight_grad_us=_spec_float(spec, f, "wg_us", 0.0))
    ranks = _spec_int(spec, f, "ranks")
    if kind == "dp":
        return data_parallel(layers, ranks, fwd_us, bwd_us, nbytes, iterations)
    if kind == "mp":
        return model_parallel(layers, ranks, fwd_us, bwd_us, nbytes, iterations,
                              weight_grad_us=_spec_float(spec, f, "wg_us", 0.0))
    return fsdp(layers, ranks, fwd_us, bwd_us, nbytes, iterations)

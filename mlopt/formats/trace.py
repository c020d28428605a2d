"""The model trace: the planners' input.

A trace is one training step of one rank: ops in execution order, each with a role, the tensors it reads
and writes, its implementations (compute time and workspace each; the first is the default the trace was
measured with) and, for communication ops, the collective, its bytes and process group (a permute, XLA's
collective-permute, also its (source, destination) pairs). Backward ops point at the forward op they
differentiate (`forward_op`), which is how planners pair them.

A tensor written by no op is external. Tensors of a preloaded kind (inputs, parameters, buffers, optimizer
state) hold a value before the step, so they may be read before they are written (the optimizer updates
parameters in place); any other tensor that some op writes must be written before it is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mlopt.errors import InputError
from mlopt.formats import document
from mlopt.formats.io import read_document, write_json

ROLES = ("forward", "backward", "optimizer", "comm", "other")
TENSOR_KINDS = ("input", "activation", "parameter", "gradient", "optimizer_state", "buffer", "other")
# Tensors that hold a value before the step starts, so ops may read them before any op writes them
# (e.g. parameters read in forward and updated in place by the optimizer).
PRELOADED_KINDS = ("input", "parameter", "optimizer_state", "buffer")
COLLECTIVES = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "reduce",
    "barrier",
    "permute",  # XLA's collective-permute: each source position sends its whole buffer to one destination
    "send",
    "recv",
)


@dataclass(frozen=True)
class Tensor:
    id: int
    bytes: int
    kind: str = "activation"  # one of TENSOR_KINDS
    shape: tuple[int, ...] = ()
    dtype: str = ""  # e.g. "float32"; empty when unknown

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "bytes": self.bytes, "kind": self.kind, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Tensor":
        return Tensor(
            id=d["id"], bytes=d["bytes"], kind=d.get("kind", "activation"),
            shape=tuple(d.get("shape", ())), dtype=d.get("dtype", ""),
        )


@dataclass(frozen=True)
class Implementation:
    name: str
    compute_us: float | None  # None: not measured (ET without Kineto); planners fall back to profiles
    workspace_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "compute_us": self.compute_us, "workspace_bytes": self.workspace_bytes}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Implementation":
        return Implementation(d["name"], d.get("compute_us"), d.get("workspace_bytes", 0))


@dataclass(frozen=True)
class CommSpec:
    collective: str  # one of COLLECTIVES
    bytes: int  # payload per rank as nccl-tests counts it (the buffer for allreduce; permute: what each source sends)
    group: str  # process group name
    # permute only (required there, forbidden elsewhere): (source, destination) POSITIONS in the process group
    # (0..len(group)-1, like torch.distributed group ranks), each source and each destination at most once
    pairs: tuple[tuple[int, int], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"collective": self.collective, "bytes": self.bytes, "group": self.group}
        if self.pairs is not None:  # only then, so every other collective's dict stays as it was
            d["pairs"] = [list(p) for p in self.pairs]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "CommSpec":
        raw = d.get("pairs")
        # Malformed pairs are kept as they are (not coerced) so validate_trace can name them in its error.
        pairs = None if raw is None else tuple(tuple(p) if isinstance(p, list) else p for p in raw)
        return CommSpec(d["collective"], d["bytes"], d["group"], pairs)


def _is_position(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def pairs_problem(collective: str, pairs: Any, group_size: int | None) -> str | None:
    """What is wrong with a comm op's `pairs`, or None when they are fine.

    A permute needs pairs (an empty list is a permute that moves nothing); no other collective may have them.
    Each pair is [source, destination], two distinct group positions in 0..group_size-1 (only >= 0 when the
    group's size is unknown); a position is a source at most once and a destination at most once.
    """
    if collective != "permute":
        return None if pairs is None else f"only a permute has pairs, not a {collective}"
    if pairs is None:
        return "a permute needs its (source, destination) pairs"
    if not isinstance(pairs, (list, tuple)):
        return f"expected a list of [source, destination] pairs, found {pairs!r:.60}"
    sources: dict[int, int] = {}
    destinations: dict[int, int] = {}
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(_is_position, pair))):
            return f"pair {k} is {pair!r:.60}, expected [source, destination]: two integer group positions"
        s, d = pair
        for x in (s, d):
            if x < 0 or (group_size is not None and x >= group_size):
                span = "" if group_size is None else f" (the group has {group_size} ranks: 0..{group_size - 1})"
                return f"pair {k} [{s}, {d}] names position {x} outside the group{span}"
        if s == d:
            return f"pair {k} [{s}, {d}] sends position {s} to itself"
        if s in sources:
            return f"position {s} is the source of pairs {sources[s]} and {k}"
        if d in destinations:
            return f"position {d} is the destination of pairs {destinations[d]} and {k}"
        sources[s], destinations[d] = k, k
    return None


@dataclass(frozen=True)
class Op:
    id: int
    name: str  # operator name, e.g. "aten::convolution"
    role: str  # one of ROLES
    inputs: tuple[int, ...] = ()  # tensor ids read
    outputs: tuple[int, ...] = ()  # tensor ids written
    implementations: tuple[Implementation, ...] = (Implementation("default", None),)
    forward_op: int | None = None  # for backward ops: the forward op they differentiate
    comm: CommSpec | None = None  # for comm ops
    deps: tuple[int, ...] = ()  # extra ordering edges: ops that must finish first

    @property
    def compute_us(self) -> float | None:
        return self.implementations[0].compute_us

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "implementations": [impl.to_dict() for impl in self.implementations],
            "forward_op": self.forward_op,
            "comm": self.comm.to_dict() if self.comm else None,
            "deps": list(self.deps),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Op":
        impls = d.get("implementations") or [{"name": "default", "compute_us": None}]
        return Op(
            id=d["id"],
            name=d["name"],
            role=d["role"],
            inputs=tuple(d.get("inputs", ())),
            outputs=tuple(d.get("outputs", ())),
            implementations=tuple(Implementation.from_dict(i) for i in impls),
            forward_op=d.get("forward_op"),
            comm=CommSpec.from_dict(d["comm"]) if d.get("comm") else None,
            deps=tuple(d.get("deps", ())),
        )


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ranks": list(self.ranks)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ProcessGroup":
        return ProcessGroup(d["name"], tuple(d["ranks"]))


@dataclass(frozen=True)
class ModelTrace:
    name: str
    ops: tuple[Op, ...]
    tensors: tuple[Tensor, ...]
    process_groups: tuple[ProcessGroup, ...] = ()
    rank: int = 0
    world_size: int = 1
    source: dict[str, Any] = field(default_factory=dict)  # importer name and its input files' hashes

    def tensor_map(self) -> dict[int, Tensor]:
        return {t.id: t for t in self.tensors}

    def ops_by_role(self, role: str) -> list[Op]:
        return [op for op in self.ops if op.role == role]

    def to_dict(self) -> dict[str, Any]:
        return {
            **document.header(document.TRACE),
            "name": self.name,
            "rank": self.rank,
            "world_size": self.world_size,
            "source": self.source,
            "process_groups": [g.to_dict() for g in self.process_groups],
            "tensors": [t.to_dict() for t in self.tensors],
            "ops": [op.to_dict() for op in self.ops],
        }

    @staticmethod
    def from_dict(d: dict[str, Any], source: str = "<trace>") -> "ModelTrace":
        document.check_document(d, document.TRACE, source)
        trace = ModelTrace(
            name=d["name"],
            ops=tuple(Op.from_dict(o) for o in d["ops"]),
            tensors=tuple(Tensor.from_dict(t) for t in d["tensors"]),
            process_groups=tuple(ProcessGroup.from_dict(g) for g in d.get("process_groups", ())),
            rank=d.get("rank", 0),
            world_size=d.get("world_size", 1),
            source=d.get("source", {}),
        )
        validate_trace(trace, source)
        return trace


def _find_cycle(ops: tuple[Op, ...], edges: dict[int, set[int]]) -> list[int] | None:
    """A cycle in the op graph (list of op ids), or None. Iterative DFS so deep traces don't recurse."""
    state: dict[int, int] = {}  # 1 = on stack, 2 = done
    for root in (op.id for op in ops):
        if state.get(root):
            continue
        stack: list[tuple[int, list[int]]] = [(root, sorted(edges.get(root, ())))]
        path = [root]
        state[root] = 1
        while stack:
            node, succ = stack[-1]
            if not succ:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            nxt = succ.pop()
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(edges.get(nxt, ()))))
    return None


# Byte counts beyond 2**53 cannot be represented exactly as floats (the planners' arithmetic) and exceed any
# machine's memory by orders of magnitude: such a count is a corrupted or mistyped field, not a tensor.
MAX_BYTES = 2**53


def _check_sizes(trace: ModelTrace, source: str) -> None:
    for i, t in enumerate(trace.tensors):
        if t.bytes > MAX_BYTES:
            raise InputError(source, f"$.tensors[{i}].bytes", f"{t.bytes} bytes is beyond 2**53 (8 PiB)")
    for i, op in enumerate(trace.ops):
        names: set[str] = set()
        for j, impl in enumerate(op.implementations):
            if impl.name in names:
                raise InputError(source, f"$.ops[{i}].implementations[{j}].name",
                                 f"op {op.id} has two implementations named {impl.name!r}")
            names.add(impl.name)
            if impl.workspace_bytes > MAX_BYTES:
                raise InputError(source, f"$.ops[{i}].implementations[{j}].workspace_bytes",
                                 f"{impl.workspace_bytes} bytes is beyond 2**53 (8 PiB)")
        if op.comm is not None and isinstance(op.comm.bytes, int) and op.comm.bytes > MAX_BYTES:
            raise InputError(source, f"$.ops[{i}].comm.bytes", f"{op.comm.bytes} bytes is beyond 2**53 (8 PiB)")


def _check_ranks(trace: ModelTrace, source: str) -> None:
    """The trace's rank and every process group's ranks lie in 0..world_size-1; group names are unique."""
    if not 0 <= trace.rank < trace.world_size:
        raise InputError(source, "$.rank", f"rank {trace.rank} is outside the world of {trace.world_size} "
                                           f"rank(s) (0..{trace.world_size - 1})")
    names: dict[str, int] = {}
    for i, group in enumerate(trace.process_groups):
        if group.name in names:
            raise InputError(source, f"$.process_groups[{i}].name",
                             f"process group {group.name!r} is also $.process_groups[{names[group.name]}]")
        names[group.name] = i
        for j, r in enumerate(group.ranks):
            if r >= trace.world_size:
                raise InputError(source, f"$.process_groups[{i}].ranks[{j}]",
                                 f"rank {r} of group {group.name!r} is outside the world of {trace.world_size} "
                                 f"rank(s) (0..{trace.world_size - 1})")


def validate_trace(trace: ModelTrace, source: str = "<trace>") -> None:
    """Semantic checks the schema cannot express: references, ordering, acyclicity, a permute's pairs, ranks
    inside the world, sizes a machine can hold."""
    if not trace.ops:
        raise InputError(source, "$.ops", "the trace has no ops: a training step runs at least one")
    _check_ranks(trace, source)
    _check_sizes(trace, source)
    tensors: dict[int, Tensor] = {}
    for i, t in enumerate(trace.tensors):
        if t.id in tensors:
            raise InputError(source, f"$.tensors[{i}].id", f"duplicate tensor id {t.id}")
        tensors[t.id] = t
    op_index: dict[int, int] = {}
    for i, op in enumerate(trace.ops):
        if op.id in op_index:
            raise InputError(source, f"$.ops[{i}].id", f"duplicate op id {op.id}")
        op_index[op.id] = i
    groups = {g.name for g in trace.process_groups}
    group_size = {g.name: len(g.ranks) for g in trace.process_groups}

    writers: dict[int, list[int]] = {}
    for op in trace.ops:
        for t in op.outputs:
            writers.setdefault(t, []).append(op.id)

    edges: dict[int, set[int]] = {}
    for i, op in enumerate(trace.ops):
        where = f"$.ops[{i}]"
        for key, ids in (("inputs", op.inputs), ("outputs", op.outputs)):
            for j, t in enumerate(ids):
                if t not in tensors:
                    raise InputError(source, f"{where}.{key}[{j}]", f"op {op.id} ({op.name}) names unknown tensor {t}")
        for t in op.inputs:
            for w in writers.get(t, ()):
                if w != op.id and op_index[w] < i:
                    edges.setdefault(w, set()).add(op.id)
        for j, dep in enumerate(op.deps):
            if dep not in op_index:
                raise InputError(source, f"{where}.deps[{j}]", f"op {op.id} depends on unknown op {dep}")
            edges.setdefault(dep, set()).add(op.id)
        if op.forward_op is not None and op.forward_op not in op_index:
            raise InputError(source, f"{where}.forward_op", f"op {op.id} pairs with unknown op {op.forward_op}")
        if op.forward_op is not None and trace.ops[op_index[op.forward_op]].role != "forward":
            paired = trace.ops[op_index[op.forward_op]]
            raise InputError(source, f"{where}.forward_op", f"op {op.id} pairs with op {paired.id} "
                                                            f"({paired.name}), a {paired.role} op, not a forward op")
        if op.role == "comm" and op.comm is None:
            raise InputError(source, f"{where}.comm", f"comm op {op.id} ({op.name}) has no collective")
        if op.comm is not None and groups and op.comm.group not in groups:
            raise InputError(source, f"{where}.comm.group", f"unknown process group {op.comm.group!r}")
        if op.comm is not None:
            problem = pairs_problem(op.comm.collective, op.comm.pairs, group_size.get(op.comm.group))
            if problem:
                raise InputError(source, f"{where}.comm.pairs", f"op {op.id} ({op.name}): {problem}")

    # A read of a tensor whose every writer runs later is either a cycle or a use before production.
    for i, op in enumerate(trace.ops):
        for j, t in enumerate(op.inputs):
            ws = [w for w in writers.get(t, ()) if w != op.id]
            if tensors[t].kind in PRELOADED_KINDS:
                continue
            if ws and all(op_index[w] > i for w in ws):
                for w in ws:
                    edges.setdefault(w, set()).add(op.id)
                cycle = _find_cycle(trace.ops, edges)
                if cycle:
                    chain = " -> ".join(map(str, cycle))
                    raise InputError(source, f"$.ops[{i}].inputs[{j}]", f"cyclic trace: ops {chain}")
                raise InputError(
                    source,
                    f"$.ops[{i}].inputs[{j}]",
                    f"op {op.id} ({op.name}) uses tensor {t} before it is produced (by op {ws[0]})",
                )
    cycle = _find_cycle(trace.ops, edges)
    if cycle:
        raise InputError(source, "$.ops", f"cyclic trace: ops {' -> '.join(map(str, cycle))}")


def load_trace(path: str | os.PathLike) -> ModelTrace:
    return ModelTrace.from_dict(read_document(path), str(path))


def save_trace(trace: ModelTrace, path: str | os.PathLike) -> None:
    write_json(path, trace.to_dict())

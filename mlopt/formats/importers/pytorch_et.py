"""Import a PyTorch Execution Trace (ET), optionally joined with its Kineto trace, as a `ModelTrace`.

What the ET files look like (checked on the torch 2.15 CPU traces in shared/reference/pytorch-trace, schema
"1.1.1-chakra.0.0.4", and against the observer, torch/csrc/profiler/standalone/execution_trace_observer.cpp):

- `nodes` is a flat list. A node is written when its op *exits*, so children precede parents in the file,
  but its `id` is taken from a global counter when the op *enters* (the same counter also numbers tensors
  and storages, hence the gaps). Parents therefore have smaller ids than their children, and id order is
  the order in which ops started: execution order. `rf_id` (the RecordFunction handle, the Kineto join key)
  increases in the same order in every sample file, but it is missing on older ETs and is 0 on the
  process/thread nodes, so **ops are ordered by node id**.
- The tree: `[pytorch|profiler|execution_trace|process]` (id 1, its own parent) -> one
  `[pytorch|profiler|execution_trace|thread]` node per thread (attr `tid`) -> ops. `ctrl_deps` is the parent:
  the op on top of that thread's stack when the op started.
- The step scope is a `record_function` annotation (scope 7 = USER_SCOPE): `## train_step ##` in
  resnet18_b2_cpu_et, `ProfilerStep#1` in the DDP traces (which have no `## ... ##` scope apart from
  `## process_group:init ##`), none at all in resnet18_b2_et_with_profiler (ops hang off the thread node).
- Forward ops are direct children of the step scope, or of user-scope wrappers inside it
  (`DistributedDataParallel.forward`); wrappers are expanded so each aten op stays one op. Every node of a
  forward op that recorded an autograd node carries `seq_id` (several top-level ops may show the same
  seq_id: `seq_id` is the *next* sequence number, so e.g. BatchNorm's `add_` on num_batches_tracked shows the
  seq of the following `batch_norm`; the op that created autograd node N is the *last* one showing N).
- Backward: on these CPU traces the autograd engine runs on the calling thread (tid 1), so each
  `autograd::engine::evaluate_function: XBackward0` is a direct child of the step scope, in the order the
  engine ran them, with the autograd node itself (scope 1 = BACKWARD_FUNCTION, attr `seq_id` = the forward
  seq, `fw_parent` = the evaluate_function node) inside. On GPU the engine uses a device thread: its
  evaluate_function nodes sit under another thread node. Top-level ops of other threads that started
  while the step scope was open (ids between the step scope and the next node of its thread) are taken too.
- Optimizer: `Optimizer.step#SGD.step` (user scope) holding one `aten::add_(param, grad)` per parameter
  (62 in resnet18), and `Optimizer.zero_grad#SGD.zero_grad` (empty with set_to_none).
- Collectives on CPU/gloo: `c10d::allreduce_` / `c10d::broadcast_` (tensor list in argument 0, no
  `record_param_comms`, no process group name: the ProcessGroup argument is "<Object>") with a
  `gloo:all_reduce` child; the gloo work finishes on a worker thread. DDP's gradient allreduce is launched
  from the AccumulateGrad hook, inside `evaluate_function: AccumulateGrad`.
- Nesting is not trustworthy around asynchronous collectives: the `gloo:*` marker opens on the calling
  thread and closes on the worker thread when the collective finishes, popping whatever the calling thread
  has open then, so ops started meanwhile get the wrong parent. In the torch 2.15 DDP traces every
  evaluate_function that ran *after* the first allreduce is recorded as a child of the AccumulateGrad that
  launched it (Kineto timestamps show they ran after it finished), and the second `gloo:broadcast` is a
  sibling of its `c10d::broadcast_`. In the torch 2.13 recordings of tests/data/pytorch-trace (profiler
  schedule, several buckets) later allreduces, DDP's `mul_out` and `copy_bucket_to_grad` also hang under an
  earlier evaluate_function, allreduce, marker or finished op, differently on each run and rank. Nodes are
  written when they end, so when the file is in that order each thread's nesting is rebuilt from start
  (id) and end (file position), markers aside (`_renest_by_exit_order`). Then, or for a file in another
  order, inside an op evaluate_function nodes, collectives and optimizer scopes are hoisted out and become
  ops of their own, as is what started after the collective an evaluate_function launched or after a
  collective's own marker; a stray `gloo:*`/`nccl:*` marker joins the collective before it whose buffers
  it names.
- A step recorded with `torch.profiler.schedule(wait=1, warmup=1, active=1)` is `ProfilerStep#2` alone (no
  warm-up ops in either file), and DDP's buckets were allocated in an earlier step: they are external
  tensors, first touched by AccumulateGrad's `mul(out=bucket view)` (see `_drop_early_accesses`).
- `## process_group:init ##` (recorded at start and again at the end) has one String input: a JSON list of
  {pg_name, pg_desc, backend_config, ranks, group_size, group_count}; empty `ranks` means all ranks. The ET
  records no rank: it comes from Kineto's `distributedInfo` (or the `rank` argument).
- A tensor value is `[tensor_id, storage_id, offset, numel, itemsize, device]`; ids come from maps keyed by
  TensorImpl / data pointer that are never cleared, so both are reused when memory is (resnet18: 27 of 353
  (tensor_id, storage_id) keys name two different tensors). Tensors are therefore versioned (see
  `_Tracker`) and views (same storage as an input of the op that made them) are folded into their base,
  so a parameter's `.grad` (a `detach` of the gradient) is the gradient tensor, not a copy.
- The ET has no durations; compute times come from Kineto (see kineto.py).

How the ET becomes a ModelTrace:

- ops: the top-level nodes described above, id order; an op's subtree is collapsed into it. Its inputs are
  the tensors its subtree reads that existed before it; its outputs the tensors it writes that existed
  before it (in-place updates) or that anything outside it uses (temporaries are dropped).
- roles: comm (c10d::*, _c10d_functional::*, record_param_comms, gloo:/nccl: markers); backward
  (evaluate_function / autograd nodes, and what runs between them, e.g. DDP's copy_bucket_to_grad);
  optimizer (inside `Optimizer.*` scopes; failing those, ops after the backward pass that update in place a
  tensor the forward pass read); forward (from the first op that recorded an autograd node up to the
  backward pass); other (data preparation before the forward pass, the gradient seed `ones_like` between
  loss and backward, anything after the optimizer step).
- tensor kinds, for tensors no op of the trace creates (external): parameter (updated by the optimizer,
  or passed as a `weight`/`bias` argument of a forward op), optimizer_state (touched only by the
  optimizer), buffer (updated by forward ops, e.g. BN running stats and num_batches_tracked), gradient
  (updated by backward or comm ops, e.g. pre-existing .grad or DDP buckets), input (read by forward ops;
  0-dim constants are other), other. For created tensors, by the creating op's role: forward -> activation
  (gradient if backward ops later write it: DDP's buckets), backward -> gradient, optimizer ->
  optimizer_state, other -> input when the forward pass reads it, else other.
- `validate_trace` lets tensors of a preloaded kind (parameter, buffer, optimizer_state, input) be read
  before they are written, so the optimizer's in-place parameter updates stay writes. Any other written
  tensor must be written before it is first read: for other external tensors whose first reader precedes
  their first writer the writes are dropped (the writer keeps the tensor as an input), and reads of a
  created tensor that precede its creation (only possible when collapsing reorders things) are dropped.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from mlopt.errors import InputError
from mlopt.formats.importers.kineto import KinetoTrace, read_kineto
from mlopt.formats.io import read_document, sha256_file
from mlopt.formats.trace import (
    PRELOADED_KINDS,
    CommSpec,
    Implementation,
    ModelTrace,
    Op,
    ProcessGroup,
    Tensor,
    validate_trace,
)

IMPORTER = "pytorch-et"
PROCESS_NODE = "[pytorch|profiler|execution_trace|process]"
THREAD_NODE = "[pytorch|profiler|execution_trace|thread]"
PG_INIT = "## process_group:init ##"
EVALUATE_PREFIX = "autograd::engine::evaluate_function:"
SCOPE_BACKWARD_FUNCTION = 1  # at::RecordScope
SCOPE_USER = 7
_ANNOTATION = re.compile(r"^##.*##$")
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")

# C++ scalar type names as the ET prints them ("Tensor(float)") and as c10 prints them in NCCL metadata.
_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "long": "int64", "int64_t": "int64", "int": "int32", "short int": "int16",
    "short": "int16", "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "c10::complex<c10::Half>": "complex32", "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2", "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
}
_COMM_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complexfloat": 8,
    "complexdouble": 16,
}
_PARAM_ARGS = frozenset({"weight", "bias"})
_BUFFER_ARGS = frozenset({"running_mean", "running_var"})


# ----------------------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True)
class _TRef:
    """One tensor value of a node."""

    tid: int
    sid: int
    offset: int
    numel: int
    itemsize: int
    arg: int  # position of the node argument (or output) it came from
    shape: tuple[int, ...] = ()
    dtype: str = ""
    device: str = ""  # "cpu", "cuda:0"; "" when the value names none (older schemas)

    @property
    def key(self) -> tuple[int, int]:
        return (self.tid, self.sid)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def extent(self) -> int:
        """Bytes of storage the value spans from the storage start."""
        return (self.offset + self.numel) * self.itemsize


@dataclass
class _Node:
    index: int  # position in the file's `nodes` list (for error paths)
    id: int
    name: str
    parent: int | None
    attrs: dict[str, Any]
    inputs: list[_TRef]
    outputs: list[_TRef]
    input_values: list[Any]
    args: list[tuple[str, bool]]  # (name, mutable) per argument, from op_schema; [] when unknown
    children: list[int] = field(default_factory=list)

    def attr_int(self, name: str, default: int = -1) -> int:
        value = self.attrs.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    @property
    def rf_id(self) -> int:
        return self.attr_int("rf_id", 0)

    @property
    def seq_id(self) -> int:
        return self.attr_int("seq_id", -1)

    @property
    def scope(self) -> int:
        return self.attr_int("scope", -1)

    @property
    def tid(self) -> int:
        return self.attr_int("tid", 0)

    def arg_name(self, arg: int) -> str:
        return self.args[arg][0] if 0 <= arg < len(self.args) else ""

    def arg_mutable(self, arg: int) -> bool:
        return 0 <= arg < len(self.args) and self.args[arg][1]


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets and parentheses."""
    parts: list[str] = []
    depth = start = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail or parts:
        parts.append(tail)
    return parts


def _split_type(text: str) -> tuple[str, list[str] | None]:
    """'GenericList[Tensor(float),Int]' -> ('GenericList', ['Tensor(float)', 'Int']); 'Int' -> ('Int', None)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "[" and depth == 0:
            if not text.endswith("]"):
                return text, None
            return text[:i], _split_top(text[i + 1 : -1])
    return text, None


def _schema_args(schema: Any) -> list[tuple[str, bool]]:
    """Argument names and whether each is mutated ('Tensor(a!)'), from an ATen schema string."""
    if not isinstance(schema, str) or "(" not in schema:
        return []
    start = schema.index("(")
    depth = 0
    end = None
    for i in range(start, len(schema)):
        if schema[i] == "(":
            depth += 1
        elif schema[i] == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end is None:
        return []
    args = []
    for part in _split_top(schema[start + 1 : end]):
        if not part or part == "*":
            continue
        pieces = part.split("=", 1)[0].strip().rsplit(None, 1)
        args.append((pieces[1], "!" in pieces[0]) if len(pieces) == 2 else ("", False))
    return args


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tensor_value(value: Any, ctype: str, shape: Any, arg: int, src: str, path: str) -> _TRef | None:
    if (
        not isinstance(value, list)
        or not 5 <= len(value) <= 6
        or not all(_is_int(v) and v >= 0 for v in value[:5])
        or (len(value) == 6 and not isinstance(value[5], str))
    ):
        raise InputError(
            src, path,
            f"malformed tensor value {_short(value)}: "
            "expected [tensor_id, storage_id, offset, numel, itemsize, device]",
        )
    tid, sid, offset, numel, itemsize = value[:5]
    if sid == 0 or numel == 0 or itemsize == 0:
        return None  # undefined, storage-less or empty tensor: no bytes to track
    dims = tuple(shape) if isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape) else ()
    device = value[5] if len(value) == 6 else ""
    return _TRef(tid, sid, offset, numel, itemsize, arg, dims, _DTYPES.get(ctype, ctype), device)


def _tensor_refs(value: Any, type_str: Any, shape: Any, arg: int, src: str, path: str) -> Iterator[_TRef]:
    """Tensor values in one argument, descending into GenericList / TensorList / Tuple values."""
    if not isinstance(type_str, str):
        return
    base, inner = _split_type(type_str)
    if base == "Tensor" or base.startswith("Tensor("):
        ctype = base[len("Tensor(") : -1] if base.startswith("Tensor(") else ""
        if "nullptr" in ctype or "uninitialized" in ctype:
            return  # an undefined tensor (e.g. bias=None passed down as Tensor())
        ref = _tensor_value(value, ctype, shape, arg, src, path)
        if ref is not None:
            yield ref
        return
    if inner is None or not isinstance(value, list):
        return
    shapes = shape if isinstance(shape, list) and len(shape) == len(value) else [None] * len(value)
    for k, (item, item_type) in enumerate(zip(value, inner)):
        yield from _tensor_refs(item, item_type, shapes[k], arg, src, f"{path}[{k}]")


def _section(raw: dict[str, Any], key: str, src: str, where: str) -> tuple[list[Any], list[Any], list[Any]]:
    """(values, types, shapes) of a node's inputs or outputs (also the pre-1.0.3 flat layout)."""
    section = raw.get(key, [])
    if isinstance(section, dict):
        parts = [(f"{where}.{key}.{name}", section.get(name, [])) for name in ("values", "types", "shapes")]
    else:  # old schema: "inputs": [...], "input_types": [...], "input_shapes": [...]
        singular = key[:-1]
        parts = [
            (f"{where}.{key}", section),
            (f"{where}.{singular}_types", raw.get(f"{singular}_types", [])),
            (f"{where}.{singular}_shapes", raw.get(f"{singular}_shapes", [])),
        ]
    for path, part in parts:
        if not isinstance(part, list):
            raise InputError(src, path, f"expected a list, found {type(part).__name__}")
    values, types, shapes = (part for _, part in parts)
    return values, types, shapes


def _parse_node(raw: Any, index: int, src: str) -> _Node:
    where = f"$.nodes[{index}]"
    if not isinstance(raw, dict):
        raise InputError(src, where, f"expected an object, found {type(raw).__name__}")
    node_id = raw.get("id")
    if not _is_int(node_id):
        raise InputError(src, f"{where}.id", "missing or not an integer")
    name = raw.get("name")
    if not isinstance(name, str):
        raise InputError(src, f"{where}.name", "missing or not a string")
    parent = raw.get("ctrl_deps", raw.get("parent"))
    if parent is not None and not _is_int(parent):
        raise InputError(src, f"{where}.ctrl_deps", "not an integer node id")
    attrs: dict[str, Any] = {}
    raw_attrs = raw.get("attrs", [])
    if not isinstance(raw_attrs, list):
        raise InputError(src, f"{where}.attrs", "expected a list of {name, type, value}")
    for j, attr in enumerate(raw_attrs):
        if not isinstance(attr, dict) or not isinstance(attr.get("name"), str):
            raise InputError(src, f"{where}.attrs[{j}]", "expected an object with a string `name`")
        attrs[attr["name"]] = attr.get("value")
    for key in ("rf_id", "seq_id", "scope", "tid", "fw_tid", "fw_parent", "op_schema"):  # older schemas
        if key in raw and key not in attrs:
            attrs[key] = raw[key]
    refs: dict[str, list[_TRef]] = {}
    input_values: list[Any] = []
    for key in ("inputs", "outputs"):
        values, types, shapes = _section(raw, key, src, where)
        prefix = f"{where}.{key}.values" if isinstance(raw.get(key, []), dict) else f"{where}.{key}"
        found: list[_TRef] = []
        for j, (value, type_str) in enumerate(zip(values, types)):
            shape = shapes[j] if j < len(shapes) else None
            found.extend(_tensor_refs(value, type_str, shape, j, src, f"{prefix}[{j}]"))
        refs[key] = found
        if key == "inputs":
            input_values = values
    return _Node(
        index, node_id, name, None if parent is None or parent == node_id else parent, attrs,
        refs["inputs"], refs["outputs"], input_values, _schema_args(attrs.get("op_schema")),
    )


# ----------------------------------------------------------------------------------------------------------
# Classifying nodes


def _comm_collective(name: str) -> str | None:
    """The mlopt collective a c10d/functional/gloo/nccl op name or record_param_comms collective name means."""
    text = name.lower()
    for sep in ("::", ":"):
        if sep in text:
            text = text.split(sep, 1)[1]
    text = text.strip("_")
    for noise in ("_base", "_coalesced", "_into_tensor", "_tensor", "_single", "_any_source"):
        text = text.replace(noise, "")
    text = text.replace("_", "")
    if text.startswith("allreduce"):
        return "allreduce"
    if text.startswith("allgather"):
        return "allgather"
    if text.startswith("reducescatter"):
        return "reducescatter"
    if text.startswith("alltoall"):
        return "alltoall"
    if text.startswith("broadcast"):
        return "broadcast"
    if text in ("barrier", "monitoredbarrier"):
        return "barrier"
    if text == "reduce":
        return "reduce"
    if text == "send":
        return "send"
    if text == "recv":
        return "recv"
    return None


def _is_comm_root(node: _Node) -> bool:
    """A node that is a collective call (not the backend marker inside one)."""
    prefixes = ("c10d::", "_c10d_functional::", "c10d_functional::")
    return node.name.startswith(prefixes) or node.name == "record_param_comms"


def _is_comm_marker(node: _Node) -> bool:
    return node.name.startswith(("gloo:", "nccl:"))


def _is_backward_root(node: _Node) -> bool:
    return node.name.startswith(EVALUATE_PREFIX) or node.scope == SCOPE_BACKWARD_FUNCTION


def _is_container(node: _Node) -> bool:
    """User-scope annotations that wrap ops (ProfilerStep#N, DDP.forward, Optimizer.step#...): expanded."""
    if not node.children or node.name == PG_INIT or _is_comm_marker(node) or _is_comm_root(node):
        return False
    return node.scope == SCOPE_USER or node.name.startswith("nn.Module:")


# ----------------------------------------------------------------------------------------------------------
# Building ops out of the tree


@dataclass
class _OpNode:
    top: _Node
    members: list[int]  # node ids collapsed into this op (top first)
    hint: str | None  # name of the enclosing Optimizer.* scope, if any
    breakouts: list[int] = field(default_factory=list)  # tops hoisted out of this op's subtree
    role: str = "other"
    comm: CommSpec | None = None


def _thread_of(by_id: dict[int, _Node]) -> dict[int, int | None]:
    """The thread node each node hangs under, following the recorded parents (None: under none)."""
    thread: dict[int, int | None] = {}
    for start in by_id:
        chain, nid = [], start
        while nid not in thread and nid in by_id and nid not in chain:
            chain.append(nid)
            node = by_id[nid]
            if node.name == THREAD_NODE:
                break
            nid = node.parent if node.parent is not None else -1
        found = nid if nid in by_id and by_id[nid].name == THREAD_NODE else thread.get(nid)
        for c in chain:
            thread[c] = found
    return thread


def _renest_by_exit_order(by_id: dict[int, _Node]) -> None:
    """Rebuild each thread's nesting from when ops started (node id) and ended (file position).

    The observer takes an op's parent from its thread's stack, which a gloo/nccl marker corrupts: the marker
    opens on the calling thread and closes on a worker thread when the collective finishes, popping
    whatever the calling thread has open then. Ops started meanwhile hang under the collective call, the
    marker, or an op that had already ended (how deep depends on timing: evaluate_functions, DDP's
    mul_out and copy_bucket_to_grad all end up there). Nodes are written when they end, so on one thread
    the op that contains another is the latest one started before it that ended after it. Markers keep
    their recorded parent (they do end out of order). Skipped when the file is not in end order (most
    children would follow their parents), e.g. a rewritten file.
    """
    ops = [n for n in by_id.values() if n.name not in (PROCESS_NODE, THREAD_NODE)]
    linked = [n for n in ops if n.parent in by_id and by_id[n.parent].name not in (PROCESS_NODE, THREAD_NODE)]
    if 2 * sum(n.index < by_id[n.parent].index for n in linked) <= len(linked):
        return
    thread = _thread_of(by_id)
    open_ops: dict[int | None, list[_Node]] = defaultdict(list)
    for node in sorted(ops, key=lambda n: n.id):
        if _is_comm_marker(node) or thread[node.id] is None:
            continue
        stack = open_ops[thread[node.id]]
        while stack and stack[-1].index < node.index:
            stack.pop()
        node.parent = stack[-1].id if stack else thread[node.id]
        stack.append(node)


class _Forest:
    def __init__(self, nodes: list[_Node], src: str):
        self.src = src
        self.by_id: dict[int, _Node] = {}
        for node in nodes:
            if node.id in self.by_id:
                raise InputError(src, f"$.nodes[{node.index}].id", f"duplicate node id {node.id}")
            self.by_id[node.id] = node
        _renest_by_exit_order(self.by_id)
        self.roots: list[int] = []
        for node in sorted(nodes, key=lambda n: n.id):
            if node.parent is None or node.parent not in self.by_id:
                self.roots.append(node.id)
            else:
                self.by_id[node.parent].children.append(node.id)
        self.size: dict[int, int] = {}  # descendants, excluding the node
        self.max_id: dict[int, int] = {}  # largest id in the subtree
        self.depth: dict[int, int] = {}
        self.thread: dict[int, int | None] = {}  # the thread node a node hangs under
        for root in self.roots:
            self._measure(root)
        if len(self.depth) != len(self.by_id):  # nodes whose parent chain never reaches a root
            stray = min((n for n in nodes if n.id not in self.depth), key=lambda n: n.index)
            raise InputError(src, f"$.nodes[{stray.index}].ctrl_deps", f"node {stray.id} is part of a parent cycle")

    def _measure(self, root: int) -> None:
        stack: list[tuple[int, int, int | None, bool]] = [(root, 0, None, False)]
        while stack:
            nid, depth, thread, done = stack.pop()
            node = self.by_id[nid]
            if not done:
                thread = nid if node.name == THREAD_NODE else thread
                self.depth[nid] = depth
                self.thread[nid] = thread
                stack.append((nid, depth, thread, True))
                stack.extend((c, depth + 1, thread, False) for c in reversed(node.children))
            else:
                self.size[nid] = sum(self.size[c] + 1 for c in node.children)
                self.max_id[nid] = max([nid] + [self.max_id[c] for c in node.children])


def _choose_step_scope(forest: _Forest, step_scope: str | None) -> _Node:
    nodes = sorted(forest.by_id.values(), key=lambda n: n.id)

    def biggest(candidates: list[_Node]) -> _Node:
        # most descendants; the last one on ties (later iterations are past warm-up)
        return max(candidates, key=lambda n: (forest.size[n.id], n.id))

    if step_scope is not None:
        want = step_scope.strip().strip("#").strip()
        found = [n for n in nodes if n.name == step_scope or n.name.strip().strip("#").strip() == want]
        if not found:
            scopes = sorted({n.name for n in nodes if _ANNOTATION.match(n.name) or _PROFILER_STEP.match(n.name)})
            present = f"step scopes present: {scopes or 'none'}"
            raise InputError(forest.src, "$.nodes", f"no node named {step_scope!r} ({present})")
        return biggest(found)
    annotated = [n for n in nodes if _ANNOTATION.match(n.name.strip()) and n.name != PG_INIT]
    if annotated:
        return biggest(annotated)
    steps = [n for n in nodes if _PROFILER_STEP.match(n.name)]
    if steps:
        return biggest(steps)
    threads = [n for n in nodes if n.name == THREAD_NODE]
    if threads:
        return biggest(threads)
    roots = [forest.by_id[r] for r in forest.roots]
    if not roots:
        raise InputError(forest.src, "$.nodes", "the execution trace has no nodes")
    return biggest(roots)


def _after_comm_launch(forest: _Forest, node: _Node) -> set[int]:
    """Children that only look nested because an asynchronous collective kept a record open: those of an
    evaluate_function that started after a collective it launched (DDP's hook launches the allreduce last;
    later evaluate_functions and the reducer's copy_bucket_to_grad at the end of backward follow), and those
    of a collective call that started after its backend marker (which ends the call's own work)."""
    if node.name.startswith(EVALUATE_PREFIX):
        launched = _is_comm_root
    elif _is_comm_root(node):
        launched = _is_comm_marker
    else:
        return set()
    launch = min((c for c in node.children if launched(forest.by_id[c])), default=None)
    if launch is None:
        return set()
    return {c for c in node.children if c > launch and not _is_comm_marker(forest.by_id[c])}


def _collect_ops(forest: _Forest, scope: _Node) -> list[_OpNode]:
    ops: list[_OpNode] = []

    def visit(nid: int, hint: str | None) -> None:
        node = forest.by_id[nid]
        if node.name == PG_INIT:
            return
        if _is_container(node):
            inner = node.name if node.name.startswith("Optimizer.") else hint
            for child in node.children:
                visit(child, inner)
            return
        make_op(node, hint)

    def make_op(top: _Node, hint: str | None) -> None:
        if top.name.startswith("Optimizer."):
            hint = top.name
        op = _OpNode(top, [], hint)
        ops.append(op)
        comm = _is_comm_root(top) or _is_comm_marker(top)
        stack = [top.id]
        while stack:
            node = forest.by_id[stack.pop()]
            op.members.append(node.id)
            after_launch = _after_comm_launch(forest, node)
            for child_id in reversed(node.children):
                child = forest.by_id[child_id]
                hoist = (
                    _is_comm_marker(node)  # a backend marker has no children of its own (see above)
                    or child_id in after_launch
                    or (comm and _is_comm_marker(child) and not _marks(child, top))
                    or child.name.startswith(EVALUATE_PREFIX)
                    or (not comm and (_is_comm_root(child) or _is_comm_marker(child)))
                    or (child.name.startswith("Optimizer.") and child.scope == SCOPE_USER)
                )
                if hoist:
                    op.breakouts.append(child_id)
                    visit(child_id, hint)
                else:
                    stack.append(child_id)

    for child in scope.children:
        visit(child, None)
    # Other threads (the autograd engine's device threads on GPU): their top-level ops that started while
    # the step scope was open.
    scope_thread = forest.thread[scope.id]
    if scope.name == THREAD_NODE:
        lo, hi = -1, float("inf")
    else:
        lo = scope.id
        later = [
            n.id for n in forest.by_id.values()
            if n.id > forest.max_id[scope.id] and n.name != THREAD_NODE and forest.thread[n.id] == scope_thread
        ]
        hi = min(later, default=float("inf"))
    for root in forest.roots:
        for thread_id in [root] + forest.by_id[root].children:
            thread = forest.by_id[thread_id]
            if thread.name != THREAD_NODE or thread_id == scope_thread:
                continue
            for child in thread.children:
                if lo < child < hi:
                    visit(child, None)
    ops.sort(key=lambda o: o.top.id)
    return ops


def _marks(marker: _Node, call: _Node) -> bool:
    """Whether a backend marker can be the one of this collective call: it names none of the call's buffers
    only when it belongs to another call (gloo markers of back-to-back allreduces nest into each other)."""
    marker_storages = {r.sid for r in marker.inputs}
    return not marker_storages or bool(marker_storages & {r.sid for r in call.inputs})


def _merge_markers(ops: list[_OpNode]) -> list[_OpNode]:
    """A top-level gloo:/nccl: marker belongs to the collective call just before it (mis-nested, see above),
    or, when that call's buffers are not the marker's, to the latest earlier call whose buffers are.
    What was recorded under a marker is hoisted already, as ops of their own (its breakouts)."""
    merged: list[_OpNode] = []
    for op in ops:
        if _is_comm_marker(op.top):
            calls = [m for m in reversed(merged) if _is_comm_root(m.top)]
            owner = next((m for m in calls if _marks(op.top, m.top)), calls[0] if calls else None)
            if owner is not None and _comm_collective(owner.top.name) == _comm_collective(op.top.name):
                owner.members.extend(op.members)
                continue
        merged.append(op)
    return merged


def _subtree_seqs(forest: _Forest, op: _OpNode) -> list[int]:
    return [forest.by_id[m].seq_id for m in op.members if forest.by_id[m].seq_id >= 0]


def _assign_roles(forest: _Forest, ops: list[_OpNode]) -> None:
    phase = "preamble"
    for op in ops:
        top = op.top
        if _is_comm_root(top) or _is_comm_marker(top):
            op.role = "comm"
        elif _is_backward_root(top):
            op.role = phase = "backward"
        elif op.hint is not None:
            op.role = "optimizer"
            if op.hint.startswith("Optimizer.step"):
                phase = "optimizer"
        elif _subtree_seqs(forest, op):
            op.role = phase = "forward"
        elif phase == "forward":
            op.role = "forward"
        elif phase == "backward":
            op.role = "backward"
        else:
            op.role = "other"
    # Seq-less ops between the last forward op that recorded autograd and the backward pass (the loss
    # gradient seed, aten::ones_like) are not part of the forward computation.
    for i, op in enumerate(ops):
        if op.role != "backward" or (i > 0 and ops[i - 1].role == "backward"):
            continue
        j = i - 1
        while j >= 0 and ops[j].role in ("forward", "optimizer", "comm", "other"):
            if ops[j].role == "forward":
                if _subtree_seqs(forest, ops[j]):
                    break
                ops[j].role = "other"
            j -= 1


# ----------------------------------------------------------------------------------------------------------
# Tensors


@dataclass
class _Version:
    """One tensor: an allocation, with the (tensor_id, storage_id) keys that named it while it lived."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class _Event:
    node: int
    version: int
    kind: str  # "r" read, "w" write (in place), "c" create
    arg: str  # argument name from the schema ("" if unknown)


class _Tracker:
    """Maps tensor values to versions while replaying the trace in execution order.

    A value read under a (tensor_id, storage_id) key that is current maps to that key's version. A value an
    op outputs that it did not get as an input is new: a view when it shares a storage with one of the op's
    inputs (aten::t, view, detach, expand, as_strided: no new memory, same version as the input), otherwise
    a new allocation (new version), unless an op inside it already produced it. A value first seen as the
    input of an op nested in an op that outputs it was allocated by that outer op without a record
    (structured kernels allocate `out` directly: aten::sum -> fill_). A value first seen under a new key
    on a storage already seen is a view made without a record (autograd unpacking a saved tensor). Anything
    else first seen as an input existed before the trace (parameters, buffers, data).
    """

    def __init__(self) -> None:
        self.versions: list[_Version] = []
        self.events: list[_Event] = []
        self.key_version: dict[tuple[int, int], int] = {}
        self.key_defined: dict[tuple[int, int], tuple[int, str]] = {}  # key -> (position, "c" | "a" | "r")
        self.base_key: dict[int, tuple[int, int]] = {}  # version -> the key it was created or first seen under
        self.storage_version: dict[int, int] = {}  # storage id -> version that owns the storage now

    def _new(self, ref: _TRef) -> int:
        self.versions.append(_Version(ref.extent, ref.shape, ref.dtype))
        version = len(self.versions) - 1
        self.base_key[version] = ref.key
        self.storage_version[ref.sid] = version
        return version

    def _grow(self, version: int, ref: _TRef) -> None:
        # Only the base key resizes the allocation (resize_); views (expand has stride 0) say nothing of it.
        if self.base_key[version] == ref.key:
            v = self.versions[version]
            v.nbytes = max(v.nbytes, ref.extent)

    def read(self, node: _Node, ref: _TRef, pos: int, open_outputs: dict[tuple[int, int], int]) -> None:
        version = self.key_version.get(ref.key)
        if version is None:
            creator = open_outputs.get(ref.key)
            if creator is not None:
                version = self._new(ref)
                self.key_defined[ref.key] = (pos, "c")
                self.events.append(_Event(creator, version, "c", ""))
            elif ref.sid in self.storage_version:
                version = self.storage_version[ref.sid]
                self.key_defined[ref.key] = (pos, "a")
            else:
                version = self._new(ref)
                self.key_defined[ref.key] = (pos, "r")
            self.key_version[ref.key] = version
        self._grow(version, ref)
        self.events.append(_Event(node.id, version, "r", node.arg_name(ref.arg)))

    def write_inputs(self, node: _Node, in_place: set[tuple[int, int]]) -> None:
        for ref in node.inputs:
            if node.arg_mutable(ref.arg) or ref.key in in_place:
                self.events.append(_Event(node.id, self.key_version[ref.key], "w", node.arg_name(ref.arg)))

    def write_output(self, node: _Node, ref: _TRef, enter_pos: int, pos: int, in_sids: dict[int, int]) -> None:
        defined = self.key_defined.get(ref.key)
        if defined is not None and defined[0] >= enter_pos:
            version = self.key_version[ref.key]  # produced inside this op
            if defined[1] == "c":
                self.events.append(_Event(node.id, version, "w", ""))
        elif ref.sid in in_sids:  # a view of an input (or the input itself, returned)
            version = in_sids[ref.sid]
            self.key_version[ref.key] = version
            self.key_defined[ref.key] = (pos, "a")
        else:
            version = self._new(ref)
            self.key_version[ref.key] = version
            self.key_defined[ref.key] = (pos, "c")
            self.events.append(_Event(node.id, version, "c", ""))
        self._grow(version, ref)


def _in_place_keys(node: _Node, collective: str | None) -> set[tuple[int, int]]:
    """Keys of input values the node writes without the schema saying so."""
    in_keys = {r.key for r in node.inputs}
    if collective is not None and node.name.startswith("c10d::"):
        # c10d schemas do not mark their buffers mutable. Argument 0 is written except by send and barrier.
        # (_c10d_functional ops are functional; their schemas are right.)
        if collective in ("send", "barrier"):
            return set()
        return {r.key for r in node.inputs if r.arg == 0}
    if node.args:  # the schema says which arguments are mutated (Tensor(a!)); returning self is no write
        return set()
    short = node.name.rsplit("::", 1)[-1]
    # No schema: in-place by naming convention; record_param_comms lists the buffers it writes as outputs.
    if short.endswith("_") or short.endswith("_out") or node.name == "record_param_comms":
        return {r.key for r in node.outputs if r.key in in_keys}
    return set()


def _replay(forest: _Forest) -> _Tracker:
    """Replay every node's reads (at entry) and writes (at exit) in execution order, over all threads."""
    # An op enters at its id and exits just after the last id in its subtree (2*id and 2*max_id + 1 keep
    # integers exact); exits at the same time go deepest first.
    events: list[tuple[int, int, int, int]] = []  # (time, is_enter, -depth, node id)
    for node in forest.by_id.values():
        events.append((2 * node.id, 1, 0, node.id))
        events.append((2 * forest.max_id[node.id] + 1, 0, -forest.depth[node.id], node.id))
    events.sort()
    tracker = _Tracker()
    enter_pos: dict[int, int] = {}
    open_outputs: dict[tuple[int, int], int] = {}  # output keys of ops in progress -> node id (innermost)
    shadowed: dict[int, list[tuple[tuple[int, int], int | None]]] = {}
    for pos, (_, is_enter, _, nid) in enumerate(events):
        node = forest.by_id[nid]
        if is_enter:
            enter_pos[nid] = pos
            for ref in node.inputs:
                tracker.read(node, ref, pos, open_outputs)
            saved = []
            for ref in node.outputs:
                saved.append((ref.key, open_outputs.get(ref.key)))
                open_outputs[ref.key] = nid
            shadowed[nid] = saved
            continue
        for key, previous in reversed(shadowed.pop(nid, [])):
            if previous is None:
                open_outputs.pop(key, None)
            else:
                open_outputs[key] = previous
        collective = _comm_collective(node.name) if _is_comm_root(node) else None
        tracker.write_inputs(node, _in_place_keys(node, collective))
        in_sids = {r.sid: tracker.key_version[r.key] for r in node.inputs}
        for ref in node.outputs:
            tracker.write_output(node, ref, enter_pos[nid], pos, in_sids)
    return tracker


# ----------------------------------------------------------------------------------------------------------
# Collectives and process groups


def _process_groups(forest: _Forest) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for node in sorted(forest.by_id.values(), key=lambda n: n.id):
        if node.name != PG_INIT:
            continue
        where = f"$.nodes[{node.index}].inputs.values[0]"
        value = node.input_values[0] if node.input_values else "[]"
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InputError(forest.src, where, f"process group description is not JSON: {exc.msg}") from None
        if not isinstance(value, list):
            raise InputError(forest.src, where, "expected a list of process groups")
        for k, pg in enumerate(value):
            if not isinstance(pg, dict) or not isinstance(pg.get("pg_name"), (str, int)):
                raise InputError(forest.src, f"{where}[{k}]", "process group without a `pg_name`")
            ranks = pg.get("ranks") or []
            size = pg.get("group_size")
            if not isinstance(ranks, list) or not all(_is_int(r) and r >= 0 for r in ranks):
                raise InputError(forest.src, f"{where}[{k}].ranks", "expected a list of non-negative integers")
            if not ranks:
                if not _is_int(size) or size < 1:
                    raise InputError(forest.src, f"{where}[{k}].group_size", "no ranks and no positive group_size")
                ranks = list(range(size))
            name = str(pg["pg_name"])
            groups.setdefault(name, {"name": name, "ranks": ranks, "desc": pg.get("pg_desc")})
    return list(groups.values())


def _comm_spec(forest: _Forest, op: _OpNode, default_group: str) -> CommSpec | None:
    members = [forest.by_id[m] for m in op.members]
    meta = next((n for n in members if n.name == "record_param_comms"), None)
    collective = None
    if meta is not None and isinstance(meta.attrs.get("collective_name"), str):
        collective = _comm_collective(meta.attrs["collective_name"])
    if collective is None:
        collective = _comm_collective(op.top.name)
    if collective is None:
        return None
    group = default_group
    nbytes = None
    if meta is not None:
        if meta.attrs.get("pg_name") not in (None, ""):
            group = str(meta.attrs["pg_name"])
        size = _COMM_DTYPE_BYTES.get(str(meta.attrs.get("dtype", "")).lower().replace("c10::", ""))
        key = "out_msg_nelems" if collective == "allgather" else "in_msg_nelems"
        nelems = meta.attrs.get(key)
        if collective in ("send", "recv") and not nelems:
            nelems = meta.attrs.get("out_msg_nelems")
        if size is not None and _is_int(nelems):
            nbytes = nelems * size
    caller = next((n for n in members if _is_comm_root(n) and n.name != "record_param_comms"), None)
    values: dict[str, Any] = {}
    if caller is not None:
        values = dict(zip((name for name, _ in caller.args), caller.input_values))
        if isinstance(values.get("group_name"), str) and values["group_name"]:
            group = values["group_name"]
    if nbytes is None:
        source = caller or op.top
        arg = 1 if collective in ("reducescatter", "alltoall") and any(r.arg == 1 for r in source.inputs) else 0
        nbytes = 0 if collective == "barrier" else sum(r.nbytes for r in source.inputs if r.arg == arg)
        if caller is not None and caller.name.startswith("_c10d_functional") and collective == "allgather":
            group_size = values.get("group_size")
            nbytes *= group_size if _is_int(group_size) and group_size > 0 else 1  # output = input x group
    return CommSpec(collective, nbytes, group)


# ----------------------------------------------------------------------------------------------------------
# Kineto


def _compute_us(forest: _Forest, op: _OpNode, kineto: KinetoTrace) -> float | None:
    device = sum(kineto.device_time(forest.by_id[m].rf_id) for m in op.members)
    if device > 0:
        return device
    event = kineto.events.get(op.top.rf_id) if op.top.rf_id else None
    if event is None:
        return None
    nested = 0.0
    for b in op.breakouts:  # hoisted ops that really ran inside this one (e.g. DDP's allreduce launch)
        inner = kineto.events.get(forest.by_id[b].rf_id)
        if inner is not None and event.contains(inner):
            nested += inner.dur
    return max(event.dur - nested, 0.0)


def _check_kineto_matches(ops: list[_OpNode], kineto: KinetoTrace, kineto_src: str, et_src: str) -> None:
    joined = [(op.top, kineto.events[op.top.rf_id]) for op in ops if op.top.rf_id and op.top.rf_id in kineto.events]
    with_rf = [op for op in ops if op.top.rf_id]
    if with_rf and not joined:
        message = f"no event's \"Record function id\" matches an op of {Path(et_src).name}"
        raise InputError(kineto_src, "$.traceEvents", message)
    wrong = [(node, ev) for node, ev in joined if node.name != ev.name]
    if wrong and len(wrong) > max(2, len(joined) // 10):
        node, ev = wrong[0]
        raise InputError(
            kineto_src, "$.traceEvents",
            f"does not match {Path(et_src).name}: record function {node.rf_id} is {ev.name!r} here but "
            f"{node.name!r} in the execution trace ({len(wrong)} of {len(joined)} ops differ)",
        )


# ----------------------------------------------------------------------------------------------------------
# The importer


def _default_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".et"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or path.name


def _kind(
    external: bool,
    creator_role: str | None,
    readers: set[str],
    writers: set[str],
    args: set[str],
    shape: tuple[int, ...],
) -> str:
    if external:
        if "optimizer" in writers and readers & {"forward", "backward"}:
            return "parameter"
        if args & _PARAM_ARGS and "forward" in readers:
            return "parameter"
        if (readers | writers) == {"optimizer"}:
            return "optimizer_state"
        if args & _BUFFER_ARGS or "forward" in writers or ("comm" in writers and "forward" in readers):
            return "buffer"  # running stats, num_batches_tracked; buffers DDP broadcasts before forward
        if writers & {"backward", "comm"}:
            return "gradient"
        if "forward" in readers and shape != ():
            return "input"
        return "other"  # e.g. 0-dim constants such as the 1 in num_batches_tracked.add_(1)
    if creator_role == "forward":
        return "gradient" if "backward" in writers else "activation"  # DDP's buckets are gradients
    if creator_role == "backward":
        return "gradient"
    if creator_role == "optimizer":
        return "optimizer_state"
    if creator_role == "other" and "forward" in readers:
        return "input"
    return "other"


@dataclass
class _Flow:
    """Per op (list index = op position): the versions it reads and writes across its boundary."""

    inputs: list[list[int]]
    outputs: list[list[int]]
    creator: dict[int, int | None]  # version -> op that created it (None: created outside the step)
    arg_names: dict[int, set[str]]  # version -> schema argument names it was passed as in forward ops
    tracker: _Tracker

    def external(self, version: int) -> bool:
        return self.creator.get(version) is None


def _tensor_flow(tracker: _Tracker, ops: list[_OpNode]) -> _Flow:
    """Collapse each op's subtree: inputs are versions it reads that it did not create; outputs are versions
    it writes that existed before it, that another op uses, or that its top node itself returns."""
    owner = {m: i for i, op in enumerate(ops) for m in op.members}
    reads: list[dict[int, None]] = [{} for _ in ops]  # ordered sets
    writes: list[dict[int, None]] = [{} for _ in ops]
    top_writes: list[set[int]] = [set() for _ in ops]
    creator: dict[int, int | None] = {}
    users: dict[int, set[int]] = defaultdict(set)
    arg_names: dict[int, set[str]] = defaultdict(set)
    for ev in tracker.events:
        i = owner.get(ev.node)
        if ev.kind == "c" and ev.version not in creator:
            creator[ev.version] = i
        if i is None:
            continue
        users[ev.version].add(i)
        if ev.kind == "r":
            if creator.get(ev.version) != i:
                reads[i].setdefault(ev.version)
            if ev.arg and ops[i].role == "forward":
                arg_names[ev.version].add(ev.arg)
        else:
            writes[i].setdefault(ev.version)
            if ev.node == ops[i].top.id:
                top_writes[i].add(ev.version)
    outputs = [
        [v for v in w if creator.get(v) != i or len(users[v]) > 1 or v in top_writes[i]]
        for i, w in enumerate(writes)
    ]
    return _Flow([list(r) for r in reads], outputs, creator, arg_names, tracker)


def _fallback_optimizer_roles(ops: list[_OpNode], flow: _Flow) -> None:
    """Without an Optimizer.* scope: ops after the backward pass that update what the forward pass read."""
    if any(op.role == "optimizer" for op in ops):
        return
    last_bwd = max((i for i, op in enumerate(ops) if _is_backward_root(op.top)), default=None)
    if last_bwd is None:
        return
    forward_read = {
        v for i, op in enumerate(ops) if op.role == "forward" for v in flow.inputs[i] if flow.external(v)
    }
    for i in range(last_bwd + 1, len(ops)):
        if ops[i].role in ("backward", "other") and any(v in forward_read for v in flow.outputs[i]):
            ops[i].role = "optimizer"


def _trace_device(nodes: Any) -> str:
    """The device the step computes on, as `mlopt trace` records it (`source.device`, which picks the
    memory planner's catalog constants): the accelerator holding the most tensor bytes, else "cpu" ("" when
    no tensor value names a device)."""
    bytes_on: dict[str, int] = defaultdict(int)
    for node in nodes:
        for ref in (*node.inputs, *node.outputs):
            if ref.device:
                bytes_on[ref.device] += ref.numel * ref.itemsize
    accelerators = {d: b for d, b in bytes_on.items() if d.split(":", 1)[0] != "cpu"}
    if accelerators:
        return max(sorted(accelerators), key=lambda d: accelerators[d])
    return "cpu" if bytes_on else ""


def _tensors(ops: list[_OpNode], flow: _Flow) -> dict[int, Tensor]:
    """A Tensor per version any op reads or writes, numbered in order of first use."""
    readers: dict[int, set[str]] = defaultdict(set)
    writers: dict[int, set[str]] = defaultdict(set)
    order: dict[int, None] = {}
    for i, op in enumerate(ops):
        for v in flow.inputs[i]:
            readers[v].add(op.role)
            order.setdefault(v)
        for v in flow.outputs[i]:
            order.setdefault(v)
            if flow.creator.get(v) != i:
                writers[v].add(op.role)
    tensors = {}
    for number, v in enumerate(order):
        ver = flow.tracker.versions[v]
        c = flow.creator.get(v)
        role = ops[c].role if c is not None else None
        kind = _kind(c is None, role, readers[v], writers[v], flow.arg_names[v], ver.shape)
        tensors[v] = Tensor(number, ver.nbytes, kind, ver.shape, ver.dtype)
    return tensors


def _drop_early_accesses(flow: _Flow, preloaded: set[int]) -> None:
    """validate_trace wants a tensor that some op writes written before anything reads it, unless it is
    of a preloaded kind (`preloaded`: parameters updated by the optimizer and the like).

    For other external tensors read before their first write the writes are dropped (the writer keeps the
    tensor as an input). Reads of a created tensor before its first write can only come from collapsing
    reordering something; those reads are dropped.

    An external tensor that the op first touching it reads and updates, and that later ops write too, is
    storage left over from an earlier step that this step fills anew: DDP allocates its buckets in the first
    iteration, so a step recorded with a profiler schedule finds them existing, and each bucket's first
    access is the `mul(grad, 1/world, out=bucket view)` of AccumulateGrad's hook, a partial write that the
    trace reads too (the rest of the bucket survives). Its stale contents feed nothing: the first writer
    produces it, so that op's read is dropped (kept, every later writer would have to precede the op).
    """
    first_read: dict[int, int] = {}
    first_write: dict[int, int] = {}
    write_count: dict[int, int] = defaultdict(int)
    for i, (ins, outs) in enumerate(zip(flow.inputs, flow.outputs)):
        for v in ins:
            first_read.setdefault(v, i)
        for v in outs:
            first_write.setdefault(v, i)
            write_count[v] += 1
    for v, w in first_write.items():
        r = first_read.get(v)
        if r is None or r > w or v in preloaded:
            continue
        if r == w:
            if flow.external(v) and write_count[v] > 1:
                flow.inputs[w].remove(v)
            continue
        if flow.external(v):
            for ins, outs in zip(flow.inputs, flow.outputs):
                if v in outs:
                    outs.remove(v)
                    if v not in ins:
                        ins.append(v)
        else:
            for ins in flow.inputs[:w]:
                if v in ins:
                    ins.remove(v)


def _pair_backward(forest: _Forest, ops: list[_OpNode]) -> dict[int, int]:
    """Backward op id -> the forward op that recorded its autograd node: the last forward op whose subtree
    shows the autograd node's seq_id (see the module docstring)."""
    forward_of_seq: dict[int, int] = {}
    for op in ops:
        if op.role == "forward":
            for s in _subtree_seqs(forest, op):
                forward_of_seq[s] = op.top.id
    pairs = {}
    for op in ops:
        if op.role != "backward":
            continue
        members = [forest.by_id[m] for m in op.members]
        seq = next((n.seq_id for n in members if n.seq_id >= 0 and n.scope == SCOPE_BACKWARD_FUNCTION), None)
        if seq is None:
            seq = next((n.seq_id for n in members if n.seq_id >= 0), None)
        if seq is not None and seq in forward_of_seq:
            pairs[op.top.id] = forward_of_seq[seq]
    return pairs


def import_pytorch_et(
    et_path: str | os.PathLike,
    kineto_path: str | os.PathLike | None = None,
    name: str | None = None,
    step_scope: str | None = None,
    rank: int | None = None,
) -> ModelTrace:
    """Import one rank's PyTorch Execution Trace (plain or gzipped JSON) as a `ModelTrace`.

    kineto_path: the Kineto trace taken together with the ET (same run, e.g. ET observer registered with
    torch.profiler); gives each op's compute_us (device-kernel time when the trace has kernels, else the
    host op's duration) and the rank. step_scope: name of the node whose subtree is the training step
    (default: the largest `## ... ##` annotation other than `## process_group:init ##`, then the largest
    `ProfilerStep#N`, then the whole thread). rank: overrides the rank found in the files.
    Bad input raises InputError naming the file and the JSON path.
    """
    et_path = Path(et_path)
    src = str(et_path)
    doc = read_document(et_path)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise InputError(src, "$.nodes", "not a PyTorch Execution Trace: no `nodes` list")
    nodes = [_parse_node(raw, i, src) for i, raw in enumerate(doc["nodes"])]
    forest = _Forest(nodes, src)
    kineto = read_kineto(kineto_path) if kineto_path is not None else None

    scope = _choose_step_scope(forest, step_scope)
    ops = _merge_markers(_collect_ops(forest, scope))
    if not ops:
        raise InputError(src, "$.nodes", f"step scope {scope.name!r} (node {scope.id}) contains no ops")
    if kineto is not None:
        _check_kineto_matches(ops, kineto, str(kineto_path), src)
    _assign_roles(forest, ops)

    pgs = _process_groups(forest)
    default_pg = next((g for g in pgs if g["desc"] == "default_pg"), None) or next(
        (g for g in pgs if g["name"] == "0"), None
    ) or (pgs[0] if pgs else None)
    default_group = default_pg["name"] if default_pg else "0"
    for op in ops:
        if op.role == "comm":
            op.comm = _comm_spec(forest, op, default_group)
            if op.comm is None:  # gather, scatter, wait...: no mlopt collective
                op.role = "other"

    flow = _tensor_flow(_replay(forest), ops)
    _fallback_optimizer_roles(ops, flow)
    tensors = _tensors(ops, flow)  # kinds use the writes _drop_early_accesses removes: compute them first
    _drop_early_accesses(flow, {v for v, t in tensors.items() if t.kind in PRELOADED_KINDS})
    ids = {v: t.id for v, t in tensors.items()}
    used = {v for i in range(len(ops)) for v in flow.inputs[i] + flow.outputs[i]}
    pairs = _pair_backward(forest, ops)
    result_ops = [
        Op(
            id=op.top.id,
            name=op.top.name,
            role=op.role,
            inputs=tuple(ids[v] for v in flow.inputs[i]),
            outputs=tuple(ids[v] for v in flow.outputs[i]),
            implementations=(Implementation("default", _compute_us(forest, op, kineto) if kineto else None),),
            forward_op=pairs.get(op.top.id),
            comm=op.comm if op.role == "comm" else None,
        )
        for i, op in enumerate(ops)
    ]

    groups = tuple(ProcessGroup(g["name"], tuple(g["ranks"])) for g in pgs)
    world = doc.get("world_size") if _is_int(doc.get("world_size")) else None
    if world is None and default_pg is not None:
        world = len(default_pg["ranks"])
    if world is None and kineto is not None:
        world = kineto.world_size
    the_rank = rank
    if the_rank is None and _is_int(doc.get("rank")):
        the_rank = doc["rank"]
    if the_rank is None and kineto is not None:
        the_rank = kineto.rank
    inputs_hashes = {et_path.name: sha256_file(et_path)}
    if kineto_path is not None:
        inputs_hashes[Path(kineto_path).name] = sha256_file(kineto_path)
    trace = ModelTrace(
        name=name or _default_name(et_path),
        ops=tuple(result_ops),
        tensors=tuple(t for v, t in tensors.items() if v in used),
        process_groups=groups,
        rank=the_rank or 0,
        world_size=max(world or 1, 1),
        source={
            "importer": IMPORTER,
            "schema": str(doc.get("schema", "")),
            "inputs": inputs_hashes,
            "step_scope": scope.name,
            **({"device": device} if (device := _trace_device(forest.by_id.values())) else {}),
        },
    )
    validate_trace(trace, src)
    return trace

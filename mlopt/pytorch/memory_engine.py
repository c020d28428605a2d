"""Internals of `mlopt.pytorch.memory.apply_memory_plan`: executing a MONeT memory schedule in eager PyTorch.

How one planned training step runs (problem.py gives the schedule's semantics, build.py the nodes):

* Forward (and loss) under `_ForwardMode`, a TorchDispatchMode seeing every aten op below autograd with
  the tracer's filter (`mlopt.pytorch.trace.IGNORED_NAMESPACES`). Ops are matched one by one to the trace's
  forward ops (without the trace: the ops writing nonzero activation bytes to the problem's main nodes,
  by name), checking names and bytes, so each op is known as its node the moment it runs. A node's
  value is one tensor, as build.py defines it: the overwritten tensor of an in-place op, else its first
  activation output; further outputs (batch norm's saved mean/invstd, max pool's indices) are the side
  nodes "<op>.outN". The call is recorded for recomputation: the aten overload and its arguments, with
  activations replaced by references (node, view geometry), everything else (parameters, buffers, the
  batch, targets) held as is. The tracer's run dispatches an `aten::detach` whenever autograd saves an
  output; with a saved-tensor hook set autograd does not, so those trace ops are skipped when matching.
  A traced out-of-place op that the plan runs in place (MONeT's in-place ReLU) is dispatched as its
  in-place overload on the same arguments: its input's buffer becomes the node's value, as for an op
  traced in place; autograd, above the mode, still recorded the out-of-place call, and what it saves is
  served by the saved-tensor hooks below.
* Saved tensors: `torch.autograd.graph.saved_tensors_hooks`. Packing a tensor whose storage holds a
  node's value returns a `_Handle` (node, size/stride/offset), never the tensor, so autograd keeps no
  activation alive. The executor holds the values the plan stores (s_i^N = 1) in `live` (node ->
  tensor): S^N. A stored "mlopt::relu_mask" is computed right after its ReLU as `result > 0` (bool,
  1 byte per element). A stored value that the model then overwrites in place (the plan asked for
  the out-of-place implementation) is kept by a copy made just before, which is what out of place costs.
* Backward: a pre-hook on each node's autograd Node enters stage k: stages above k not done yet run
  their recomputations r^s and drop to their keep sets S^{s-1}; then stage k's recomputations run, with
  the replay's greedy freeing (values no later recomputation of the stage reads, not kept and not in
  D_k go as soon as possible). Unpacking a handle serves the value from `live` as a view with the saved
  geometry; at a ReLU stage whose implementation is "intermediate-activated" the saved result is served
  by the bool mask, which threshold_backward(grad, mask, 0) reads to the same gradient; at a batch-norm
  stage whose implementation is "output-activated" the saved input is served rebuilt from the output,
  x = mean + (y - beta) / (gamma * invstd) (catalog.py; equal to the input up to float rounding; a
  channel with gamma = 0 cannot be rebuilt: the input is then recomputed and a note says so). A post-hook
  applies the keep set S^{k-1}. Autograd runs nodes in decreasing sequence number, i.e. reverse forward
  order: the plan's stage order. A value needed but not live (a plan or a problem that does not match
  what autograd reads) is recomputed on demand and said in `notes`.

Recomputation: the recorded op is dispatched again under no_grad on live values. In-place ops (relu_,
add_) run in place when the plan's implementation is in place and the replay's rule allows it (the
overwritten value needed by nothing later in the stage), else out of place: their functional overload,
or the op on a copy. native_batch_norm in training gets fresh clones of running_mean/running_var (its
output ignores them, and the real buffers must be updated once); other constants the forward overwrites
after an op read them are snapshotted for it. Random ops (tagged nondeterministic_seeded: bernoulli_,
native_dropout, ...) that the plan recomputes and that draw numbers in the call (not with a dropout
probability of 0, as attention without dropout) keep the CPU (and CUDA) RNG state taken just before they
ran and are recomputed under it, then the RNG is put back (torch.utils.checkpoint's preserve_rng_state):
identical dropout masks, for 5056 bytes of retained state per such op on CPU.
* A batch norm recomputed with "reuse-stats" (`reuses_intermediates`) is not dispatched again: y =
  x * scale + shift per channel, scale = gamma * invstd, shift = beta - mean * scale, from its live input
  and its live saved mean/invstd (read, not produced: the stage keeps them until it has run), no running
  statistics updated; the CPU training kernel's fused multiply-adds, so the same output bits. Statistics
  not live (a plan that does not match the problem): the recorded op runs, and a note says so.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from mlopt.errors import InputError
from mlopt.planners.memory.problem import BackwardImpl, ForwardImpl, MemoryProblem, Node
from mlopt.planners.memory.replay import ScheduleError, replay
from mlopt.planners.memory.schedule import Schedule
from mlopt.pytorch.trace import IGNORED_NAMESPACES, op_name, tensor_leaves, written_tensors

RELU_MASK = "mlopt::relu_mask"
DETACH = "aten::detach"  # autograd saving an output dispatches a detach, but only when no saved-tensor hook is set
# Ops whose training-mode output does not read the running statistics they update.
BATCH_NORM_OPS = frozenset({"aten::native_batch_norm", "aten::_native_batch_norm_legit",
                            "aten::_batch_norm_with_update", "aten::cudnn_batch_norm", "aten::miopen_batch_norm"})


# Autograd nodes whose only use of the saved ReLU result is threshold_backward(grad, result, 0), which
# takes the bool mask as is (result > 0 <=> mask): no float copy of the mask is made for them.
MASK_READERS = frozenset({"ReluBackward0", "ReluBackward1"})


class PlanMismatchError(InputError):
    """The model/batch being run is not the one the problem was built from."""


# ----------------------------------------------------------------------------------------------------
# Small helpers


def _storage_key(tensor: torch.Tensor) -> tuple[int, StorageWeakRef] | None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    ref = StorageWeakRef(storage)
    return ref.cdata, ref


@dataclass(frozen=True)
class _Geometry:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    @staticmethod
    def of(tensor: torch.Tensor) -> "_Geometry":
        return _Geometry(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor.dtype)


def _view(value: torch.Tensor, recorded: _Geometry, wanted: _Geometry) -> torch.Tensor:
    """`wanted` (a view of the storage that held `recorded`) rebuilt on top of `value`, the same output
    recomputed or kept (possibly in another storage, at another offset)."""
    if wanted == recorded:
        return value
    if wanted.dtype != value.dtype:  # a reinterpreting view: go through the storage
        raise RuntimeError(f"cannot rebuild a {wanted.dtype} view of a {value.dtype} value")
    offset = value.storage_offset() + (wanted.offset - recorded.offset)
    return value.as_strided(wanted.size, wanted.stride, offset)


@dataclass
class _ValueRef:
    """An argument that is (a view of) the value of node `node`."""

    node: int
    geometry: _Geometry


@dataclass
class _ConstRef:
    """An argument that is not an activation: held as is (or a snapshot taken before the forward overwrote it)."""

    tensor: torch.Tensor
    fresh_clone: bool = False  # the op overwrites it: a recompute gets a clone (real buffers updated once)


@dataclass
class _Handle:
    """What autograd keeps for a saved activation: whose value it is and the view, not the value."""

    node: int
    geometry: _Geometry


@dataclass
class _StorageEntry:
    ref: StorageWeakRef  # keeps the address from being reused by another storage during the step
    node: int | None  # the node whose value the storage holds now (None: an activation of no node)


@dataclass
class _Record:
    """One main node's forward call, enough to run it again."""

    node: int
    op_index: int  # position among the forward ops run under the mode
    func: Any
    spec: Any  # pytree spec of (args, kwargs)
    leaves: list[Any]  # flattened (args, kwargs): _ValueRef, _ConstRef or plain Python values
    values: dict[int, tuple[int, _Geometry]]  # value node (main and side outputs) -> (result leaf, geometry)
    written_values: list[int]  # positions in `leaves` of activation arguments the op overwrites (in place)
    rng_state: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None  # (cpu, {cuda device: state})
    whole: dict[int, int] = field(default_factory=dict)  # value node -> written position: an in-place op on
    # part of a value (x[:, :3].relu_()); the node's value is the whole tensor the overwritten node held


@dataclass
class _Output:
    key: int
    ref: StorageWeakRef
    tensor: torch.Tensor
    leaf: int | None  # index among the result's tensors
    overwritten: bool  # an existing activation the op reads and writes (in place)


# ----------------------------------------------------------------------------------------------------
# Node matching: the n-th op run under the mode -> trace op -> node


class _TraceMatcher:
    """Matches the ops run under the mode to the trace's forward ops, in order.

    With a saved-tensor hook set, autograd does not dispatch the `aten::detach` it dispatches when it
    saves an output without one (the tracer's run), so trace detaches without a counterpart are skipped.
    """

    def __init__(self, problem: MemoryProblem, trace: Any, label: str):
        self.label = label
        self.trace_ops = [op for op in trace.ops if op.role == "forward"]
        self.tensors = {t.id: t for t in trace.tensors}
        self.node_of_op = {n.op_id: n.index for n in problem.nodes if n.intermediate_of is None}
        self.position = 0

    def peek(self, name: str) -> int | None:
        """The node the next op matches if it is `name`, without consuming it."""
        ops, position = self.trace_ops, self.position
        while position < len(ops) and ops[position].name != name and ops[position].name == DETACH:
            position += 1
        return self.node_of_op.get(ops[position].id) if position < len(ops) and ops[position].name == name else None

    def match(self, n: int, name: str, output_bytes: list[int]) -> int | None:
        ops = self.trace_ops
        while self.position < len(ops) and ops[self.position].name != name and ops[self.position].name == DETACH:
            self.position += 1
        if self.position >= len(ops):
            raise PlanMismatchError(self.label, "model", f"forward op {n} ({name}) runs past the end of the trace's "
                                    f"{len(ops)} forward ops: another model, or a model that does more?")
        op = ops[self.position]
        self.position += 1
        if op.name != name:
            raise PlanMismatchError(self.label, "model", f"forward op {n} is {name} here, {op.name} (op {op.id}) in "
                                    "the trace the plan was made for: another model?")
        traced = sorted(self.tensors[t].bytes for t in op.outputs if self.tensors[t].kind == "activation")
        if sorted(output_bytes) != traced:
            raise PlanMismatchError(self.label, "model", f"forward op {n} ({name}) writes activations of "
                                    f"{sorted(output_bytes)} bytes here, {traced} in the trace (op {op.id}): another "
                                    "batch size or input shape?")
        return self.node_of_op.get(op.id)

    def finish(self, n: int) -> None:
        rest = [op for op in self.trace_ops[self.position:] if op.name != DETACH]
        if rest:
            raise PlanMismatchError(self.label, "model", f"the forward ran {n} ops and stopped before the trace's "
                                    f"op {rest[0].id} ({rest[0].name}): another model, or the loss was not "
                                    "computed inside the plan's context?")


class _NodeMatcher:
    """Without the trace: ops writing activations of nonzero bytes are matched to the problem's main
    nodes by name, in order (the builder's rule: one node per such op)."""

    def __init__(self, problem: MemoryProblem, label: str):
        self.label = label
        self.nodes = sorted((n for n in problem.nodes if n.intermediate_of is None), key=lambda n: n.op_id)
        self.position = 0

    def peek(self, name: str) -> int | None:
        """The node the next op matches if it is `name` and writes an activation, without consuming it."""
        node = self.nodes[self.position] if self.position < len(self.nodes) else None
        return node.index if node is not None and node.name == name else None

    def match(self, n: int, name: str, output_bytes: list[int]) -> int | None:
        if not any(output_bytes):
            return None
        if self.position < len(self.nodes) and self.nodes[self.position].name == name:
            self.position += 1
            return self.nodes[self.position - 1].index
        expected = (f"node {self.nodes[self.position].index} ({self.nodes[self.position].name})"
                    if self.position < len(self.nodes) else "no more nodes")
        raise PlanMismatchError(self.label, "model", f"forward op {n} ({name}) writes an activation where the plan "
                                f"expects {expected}: another model?")

    def finish(self, n: int) -> None:
        if self.position < len(self.nodes):
            node = self.nodes[self.position]
            raise PlanMismatchError(self.label, "model", f"the forward ran {n} ops and stopped before node "
                                    f"{node.index} ({node.name}): another model, or the loss was not computed "
                                    "inside the plan's context?")


# ----------------------------------------------------------------------------------------------------
# The executor


class _ForwardMode(TorchDispatchMode):
    def __init__(self, executor: "PlanExecutor"):
        super().__init__()
        self.executor = executor

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace in IGNORED_NAMESPACES:  # the tracer's filter: same op numbering
            return func(*args, **kwargs)
        return self.executor._forward_op(func, args, kwargs)


@dataclass
class _Step:
    """Per-step state; a new one for every `with executor:`."""

    matcher: Any
    storages: dict[int, _StorageEntry] = field(default_factory=dict)  # activation storages by cdata
    constants: dict[int, StorageWeakRef] = field(default_factory=dict)  # parameters and buffers by cdata
    const_refs: dict[int, list[_ConstRef]] = field(default_factory=dict)  # constant storage -> records' refs
    records: dict[int, _Record] = field(default_factory=dict)  # main node -> its forward call
    creator: dict[int, int] = field(default_factory=dict)  # value node -> main node whose op makes it
    live: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> value held by the executor
    pending: list[tuple[int, list[Any]]] = field(default_factory=list)  # (main node, weakrefs of results)
    stage_of_sequence: dict[int, int] = field(default_factory=dict)  # autograd sequence number -> node
    hook_handles: list[Any] = field(default_factory=list)
    op_count: int = 0
    forward_done: bool = False
    cursor: int = -1  # highest stage not finished
    entered: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    produced: set[int] = field(default_factory=set)  # values recomputed in the current stage
    callback_queued: bool = False
    released: bool = False


class PlanExecutor:
    """Runs training steps of `model` under a memory schedule; a context manager around the forward
    pass and the loss (not the backward):

        executor = apply_memory_plan(model, problem, schedule, trace=trace)
        with executor:
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        print(executor.fallbacks)

    Each `with` is one step; enter it again for the next step.
    """

    def __init__(self, model: nn.Module, problem: MemoryProblem, schedule: Schedule, trace: Any = None,
                 label: str | None = None):
        self.model = model
        self.problem = problem
        self.schedule = schedule
        self.trace = trace
        self.label = label or problem.name or type(model).__name__
        self.nodes = problem.nodes
        self._check_schedule()
        self.forward_step = {f.node: f for f in schedule.forward}
        self.stage = {b.node: b for b in schedule.backward}
        self.stored = {f.node for f in schedule.forward if f.store}
        self.recomputable = {i for b in schedule.backward for i, _ in b.recompute}  # random ops keep RNG state
        self.finals = set(problem.final_outputs)
        self.sides: dict[int, list[int]] = {}  # main node -> its side-output nodes, in output order
        self.mask_of: dict[int, int] = {}  # relu node -> its sign-mask node
        for node in self.nodes:
            if node.intermediate_of is None:
                continue
            if node.name == RELU_MASK:
                self.mask_of[node.intermediate_of] = node.index
            else:
                self.sides.setdefault(node.intermediate_of, []).append(node.index)
        self.fallbacks: list[str] = []  # plan choices this runtime cannot apply per operator, run as default
        self.notes: list[str] = []  # where the run differs from the plan's letter but not its memory
        self._said: set[str] = set()
        self.recomputed: list[tuple[int, int]] = []  # (stage, node) in the order they ran, last step
        self._step: _Step | None = None
        self._mode: _ForwardMode | None = None
        self._hooks: Any = None
        self._entry_before: dict[int, tuple[int, _Geometry]] = {}
        self.mask_unpacks = 0  # saved ReLU results served from a sign mask, last step
        self.rebuilt_inputs = 0  # saved batch-norm inputs served rebuilt from the output, last step
        self.reused_statistics = 0  # batch norms recomputed from their saved mean/invstd, last step
        self._static_fallbacks()
        self._layout_note()

    # -------------------------------------------------------------------------------------- checks

    def _layout_note(self) -> None:
        """Say so when the model's 4-D weights are not in the layout the trace timed: memory and gradients are
        the plan's either way, its compute times are not."""
        source = getattr(self.trace, "source", None)
        traced = source.get("memory_format", "contiguous") if isinstance(source, dict) else None
        weights = [p for p in self.model.parameters() if p.dim() == 4]
        if traced is None or not weights:
            return
        layout = torch.channels_last if traced == "channels-last" else torch.contiguous_format
        if not all(p.is_contiguous(memory_format=layout) for p in weights):
            model = "not channels-last" if layout is torch.channels_last else "not contiguous"
            self._say("note", f"the plan's times are from a {traced} trace but the model's convolution weights are "
                              f"{model}: memory and gradients are as planned, compute times are not")

    def _check_schedule(self) -> None:
        """The replay is the ground truth of what a schedule may do; the executor runs only what it accepts."""
        try:
            replay(self.problem, self.schedule)
        except ScheduleError as error:
            raise InputError(self.label, "schedule", f"the schedule does not replay: {error}") from None

    def _say(self, kind: str, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            (self.fallbacks if kind == "fallback" else self.notes).append(message)

    def _forward_impl(self, node: Node, name: str) -> ForwardImpl | None:
        return next((impl for impl in node.forward if impl.name == name), None)

    def _backward_impl(self, k: int) -> BackwardImpl | None:
        name = self.stage[k].impl
        return next((impl for impl in self.nodes[k].backward if impl.name == name), None)

    def _mask_dep(self, k: int, impl: BackwardImpl | None) -> int | None:
        if impl is None or impl.kind != "intermediate-activated":
            return None
        m = self.mask_of.get(k)
        return m if m is not None and m in impl.deps else None

    def _rebuilds_input(self, k: int, impl: BackwardImpl | None) -> int | None:
        """The input node an output-activated batch-norm backward at stage k rebuilds from its output."""
        node = self.nodes[k]
        if (impl is None or impl.kind != "output-activated" or node.name not in BATCH_NORM_OPS
                or not node.inputs or node.inputs[0] in impl.deps or k not in impl.deps):
            return None
        return node.inputs[0]

    def _rebuilt_input(self, k: int) -> torch.Tensor | None:
        """x = mean + (y - beta) / (gamma * invstd), per channel (dim 1), from the live output y of batch
        norm k and its saved statistics; None when a channel's gamma * invstd is 0 (not invertible)."""
        step = self._step
        record = step.records[k]
        args, _ = tree_unflatten(list(record.leaves), record.spec)
        weight, bias = (a.tensor if isinstance(a, _ConstRef) else a for a in (args[1], args[2]))
        mean, invstd = (self._value(s, k) for s in self.sides[k][:2])
        y = self._value(k, k)
        scale = invstd if weight is None else weight * invstd
        if bool((scale == 0).any()):
            return None
        shape = [1, -1] + [1] * (y.dim() - 2)
        shift = mean if bias is None else mean - bias / scale
        with torch.no_grad():
            return torch.addcmul(shift.view(shape).to(y.dtype), y, (1.0 / scale).view(shape).to(y.dtype))

    def _static_fallbacks(self) -> None:
        """Implementation choices eager PyTorch cannot honour on this device, known before running."""
        for node in self.nodes:
            if node.intermediate_of is not None or not node.forward:
                continue
            default = node.forward[0]
            chosen = self._forward_impl(node, self.forward_step[node.index].impl)
            if chosen is not None and chosen.name != default.name:
                if chosen.inplace and not default.inplace:
                    if not _has_inplace_variant(node.name):
                        self._say("fallback", f"node {node.index} ({node.name}): forward '{chosen.name}' (in place) "
                                  "asked, PyTorch has no in-place variant: runs out of place as the model's code does")
                elif not chosen.inplace and default.inplace:
                    self._say("note", f"node {node.index} ({node.name}): forward '{chosen.name}' asked; the model runs "
                              "it in place, so its input's stored value is kept by a copy (same memory)")
                else:
                    self._say("fallback", f"node {node.index} ({node.name}): forward '{chosen.name}' has no PyTorch "
                              f"counterpart this runtime applies per operator; ran '{default.name}'")
            impl = self._backward_impl(node.index)
            if impl is not None and node.backward and impl.name != node.backward[0].name:
                if self._mask_dep(node.index, impl) is None and self._rebuilds_input(node.index, impl) is None:
                    self._say("fallback", f"node {node.index} ({node.name}): backward '{impl.name}' has no PyTorch "
                              f"counterpart this runtime applies per operator; autograd ran '{node.backward[0].name}'")

    # -------------------------------------------------------------------------------------- context

    def __enter__(self) -> "PlanExecutor":
        if self._mode is not None:
            raise RuntimeError("this plan executor is already running a forward pass")
        self._release()
        matcher = (_TraceMatcher(self.problem, self.trace, self.label) if self.trace is not None
                   else _NodeMatcher(self.problem, self.label))
        step = _Step(matcher)
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            key = _storage_key(tensor)
            if key is not None:
                step.constants[key[0]] = key[1]
        self._step = step
        self.recomputed = []
        self.mask_unpacks = 0
        self.rebuilt_inputs = 0
        self.reused_statistics = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        self._mode = _ForwardMode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        mode, self._mode = self._mode, None
        try:
            if mode is not None:
                mode.__exit__(exc_type, exc, tb)
        finally:
            self._hooks.__exit__(exc_type, exc, tb)
        step = self._step
        if exc_type is not None:
            self._release()
            return
        self._resolve_pending()
        try:
            step.matcher.finish(step.op_count)
        except PlanMismatchError:
            self._release()
            raise
        step.forward_done = True
        step.cursor = self.problem.n - 1
        step.storages.clear()  # addresses may be reused from now on; handles know their nodes
        step.const_refs.clear()

    def _release(self) -> None:
        """Drop everything the step holds (values, records, hooks)."""
        step = self._step
        if step is None:
            return
        step.released = True
        for handle in step.hook_handles:
            handle.remove()
        step.hook_handles.clear()
        step.live.clear()
        step.records.clear()
        step.storages.clear()
        step.const_refs.clear()
        step.pending.clear()

    def live_nodes(self) -> list[int]:
        return sorted(self._step.live) if self._step is not None else []

    # -------------------------------------------------------------------------------------- forward

    def _activation(self, key: int | None) -> _StorageEntry | None:
        if key is None:
            return None
        entry = self._step.storages.get(key)
        return entry if entry is not None and not entry.ref.expired() else None

    def _is_constant(self, key: int) -> bool:
        ref = self._step.constants.get(key)
        return ref is not None and not ref.expired()

    def _resolve_pending(self) -> None:
        """Autograd attaches grad_fn after the dispatch returned: hook each node's autograd Node now."""
        step = self._step
        for node, refs in step.pending:
            for ref in refs:
                tensor = ref()
                grad_fn = tensor.grad_fn if tensor is not None else None
                if grad_fn is None or grad_fn._sequence_nr() in step.stage_of_sequence:
                    continue
                step.stage_of_sequence[grad_fn._sequence_nr()] = node
                step.hook_handles.append(grad_fn.register_prehook(self._make_prehook(node)))
                step.hook_handles.append(grad_fn.register_hook(self._make_posthook(node)))
        step.pending.clear()

    def _forward_op(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        step = self._step
        self._resolve_pending()
        n = step.op_count
        step.op_count += 1
        name = op_name(func)  # as traced: what the matcher compares
        func = self._as_planned(func, step.matcher.peek(name))
        written = written_tensors(func, args, kwargs)
        written_keys = [k[0] for k in map(_storage_key, written) if k is not None]
        flat, spec = tree_flatten((tuple(args), dict(kwargs)))
        read_keys = {k[0] for k in map(_storage_key, tensor_leaves(flat)) if k is not None}
        # Arguments, recorded before the op can overwrite anything.
        leaves: list[Any] = []
        written_values: list[int] = []
        for position, leaf in enumerate(flat):
            if not isinstance(leaf, torch.Tensor):
                leaves.append(leaf)
                continue
            key = _storage_key(leaf)
            entry = self._activation(key[0] if key else None)
            if entry is not None and entry.node is not None:
                leaves.append(_ValueRef(entry.node, _Geometry.of(leaf)))
                if key[0] in written_keys:
                    written_values.append(position)
            else:
                ref = _ConstRef(leaf, fresh_clone=key is not None and key[0] in written_keys)
                if key is not None:
                    step.const_refs.setdefault(key[0], []).append(ref)
                leaves.append(ref)
        self._protect_before_write(name, written, leaves, func, args, kwargs)
        # A random op's RNG state must be taken before it runs (its node is known only after).
        rng = self._rng_state(func, flat) if self.recomputable and self._draws_random(func, args, kwargs) else None
        result = func(*args, **kwargs)
        results = tensor_leaves(result)
        outputs = self._outputs(written, results, read_keys)
        node = step.matcher.match(n, name, [o.tensor.untyped_storage().nbytes() for o in outputs])
        nonzero = [o for o in outputs if o.tensor.untyped_storage().nbytes() > 0]
        values: dict[int, _Output] = {}
        if node is not None:
            primary = next((o for o in nonzero if o.overwritten), nonzero[0] if nonzero else None)
            sides = self.sides.get(node, [])
            others = [o for o in nonzero if o is not primary]
            if primary is None or len(others) != len(sides) or any(o.leaf is None for o in nonzero):
                raise PlanMismatchError(self.label, "model", f"forward op {n} ({name}) writes {len(nonzero)} "
                                        f"activations, node {node} of the plan has {1 + len(sides)}")
            values = {node: primary, **dict(zip(sides, others))}
        self._entry_before = {}
        for o in outputs:
            entry = self._activation(o.key)
            if entry is not None and entry.node is not None and entry.node in step.creator:
                self._entry_before[o.key] = (entry.node, self._recorded(entry.node))
        value_of = {id(o): v for v, o in values.items()}
        for o in outputs:
            step.storages[o.key] = _StorageEntry(o.ref, value_of.get(id(o)))
        if node is None:
            return result
        geometries: dict[int, _Geometry] = {}
        tensors: dict[int, torch.Tensor] = {}
        whole: dict[int, int] = {}
        for v, o in values.items():
            geometries[v], tensors[v] = _Geometry.of(o.tensor), o.tensor
            if o.overwritten:
                before = self._entry_before.get(o.key)
                if before is not None and before[1] != geometries[v]:  # part of the value was overwritten
                    geometries[v] = before[1]
                    tensors[v] = _view(o.tensor, _Geometry.of(o.tensor), before[1])
                    whole[v] = next(p for p in written_values if _storage_key(flat[p])[0] == o.key)
            nbytes = o.tensor.untyped_storage().nbytes()
            if self.nodes[v].out_bytes != nbytes:
                raise PlanMismatchError(self.label, "model", f"forward op {n} ({name}) writes {nbytes} bytes for "
                                        f"node {v}, the plan's node has {self.nodes[v].out_bytes}: another batch "
                                        "size or input shape?")
        if node not in self.recomputable:
            rng = None  # never recomputed by the plan: no RNG state kept (5 KB each on CPU)
        step.records[node] = _Record(node, n, func, spec, leaves,
                                     {v: (o.leaf, geometries[v]) for v, o in values.items()},
                                     written_values, rng, whole)
        for v in values:
            step.creator[v] = node
            if v in self.stored:
                step.live[v] = tensors[v]
        mask = self.mask_of.get(node)
        if mask is not None and mask in self.stored:
            step.live[mask] = tensors[node] > 0  # bool: 1 byte per element; relu(x) > 0 <=> x > 0
        step.pending.append((node, [weakref.ref(t) for t in results]))
        return result

    def _as_planned(self, func: Any, node: int | None) -> Any:
        """The op to run for a traced out-of-place op whose node the plan runs in place (MONeT's in-place
        implementation, e.g. ReLU): its in-place overload, on the input the node's `inplace_input` is. Under
        autograd the model still called the out-of-place op; the saved-tensor hooks see only node values, so
        what autograd saves is served as the plan says. Anything else runs as called."""
        if node is None:
            return func
        impl = self._forward_impl(self.nodes[node], self.forward_step[node].impl)
        if impl is None or not impl.inplace or self.nodes[node].forward[0].inplace:
            return func
        inplace = _inplace_variant(func)
        if inplace is None:
            self._say("fallback", f"node {node} ({self.nodes[node].name}): forward '{impl.name}' (in place) asked, "
                      f"{func} has no in-place overload with its arguments: ran out of place")
            return func
        return inplace

    def _outputs(self, written: list[torch.Tensor], results: list[torch.Tensor], read_keys: set[int]) -> list[_Output]:
        """The activations an op writes, in the tracer's order: overwritten arguments, then new results."""
        outputs: list[_Output] = []
        seen: set[int] = set()
        result_keys = [_storage_key(t) for t in results]
        for tensor in written:
            key = _storage_key(tensor)
            if key is None or key[0] in seen or self._activation(key[0]) is None:
                continue
            leaf = next((i for i, k in enumerate(result_keys) if k is not None and k[0] == key[0]), None)
            seen.add(key[0])
            outputs.append(_Output(key[0], key[1], results[leaf] if leaf is not None else tensor, leaf,
                                   key[0] in read_keys))
        for leaf, (tensor, key) in enumerate(zip(results, result_keys)):
            if key is None or key[0] in seen or key[0] in read_keys or self._is_constant(key[0]):
                continue
            if self._activation(key[0]) is not None:
                continue
            seen.add(key[0])
            outputs.append(_Output(key[0], key[1], tensor, leaf, False))
        return outputs

    def _protect_before_write(self, name: str, written: list[torch.Tensor], leaves: list[Any], func: Any,
                              args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        step = self._step
        training = bool(self._argument(func, args, kwargs, "training", True))
        for tensor in written:
            key = _storage_key(tensor)
            if key is None:
                continue
            entry = self._activation(key[0])
            if entry is None:
                # A constant overwritten (BN running stats, num_batches_tracked): earlier readers keep what
                # they read; BN's own output in training does not read its stats, so it needs no copy.
                for ref in step.const_refs.pop(key[0], []):
                    if not (name in BATCH_NORM_OPS and training and any(ref is leaf for leaf in leaves)):
                        ref.tensor = ref.tensor.clone()
                continue
            # A stored value overwritten in place: the plan has this op out of place; keep a copy.
            v = entry.node
            if v is not None and v in step.live:
                kept = step.live[v]
                kept_key = _storage_key(kept)
                if kept_key is not None and kept_key[0] == key[0]:
                    step.live[v] = kept.clone()

    @staticmethod
    def _argument(func: Any, args: Sequence[Any], kwargs: dict[str, Any], name: str, default: Any) -> Any:
        for position, argument in enumerate(func._schema.arguments):
            if argument.name == name:
                return args[position] if position < len(args) else kwargs.get(name, default)
        return default

    @classmethod
    def _draws_random(cls, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """A random op that draws numbers in this call: tagged nondeterministic_seeded and, for the ops that
        take a dropout probability (attention, native_dropout), not called with 0 or outside training."""
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return False
        defaults = {a.name: a.default_value if a.has_default_value() else None for a in func._schema.arguments}
        for name in ("dropout_p", "p"):
            value = cls._argument(func, args, kwargs, name, defaults[name]) if name in defaults else None
            if isinstance(value, (int, float)) and value == 0:  # (bernoulli_'s p may be a tensor)
                return False
        return not ("train" in defaults and cls._argument(func, args, kwargs, "train", True) is False)

    @staticmethod
    def _rng_state(func: Any, flat: list[Any]) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        cuda: dict[int, torch.Tensor] = {}
        for leaf in flat:
            if isinstance(leaf, torch.Tensor) and leaf.is_cuda and leaf.device.index not in cuda:
                cuda[leaf.device.index] = torch.cuda.get_rng_state(leaf.device)
        return torch.get_rng_state(), cuda

    # -------------------------------------------------------------------------------------- saved tensors

    def _pack(self, tensor: torch.Tensor) -> Any:
        step = self._step
        if step is None or step.forward_done:
            return tensor
        key = _storage_key(tensor)
        entry = self._activation(key[0] if key else None)
        if entry is None or entry.node is None:
            return tensor  # parameter, buffer, batch, target: constant for the step
        return _Handle(entry.node, _Geometry.of(tensor))

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Handle):
            return packed
        step = self._step
        if step is None or not step.forward_done or step.released or packed.node not in step.creator:
            raise RuntimeError("a saved activation of a planned step was unpacked after its step was released "
                               "(backward twice, or retain_graph=True, is not supported under a memory plan)")
        current = torch._C._current_autograd_node()
        k = step.stage_of_sequence.get(current._sequence_nr()) if current is not None else None
        if k is None:
            k = max(step.cursor, 0)
        self._enter(k)
        mask = self._mask_dep(k, self._backward_impl(k)) if packed.node == k else None
        if mask is not None:  # intermediate-activated ReLU backward: the sign mask stands for the result
            self.mask_unpacks += 1
            value = self._value(mask, k)
            if current is None or current.name() not in MASK_READERS:
                value = value.to(packed.geometry.dtype)  # a transient copy in the result's dtype
            recorded = self._recorded(k)
            return _view(value, dataclasses.replace(recorded, dtype=value.dtype),
                         dataclasses.replace(packed.geometry, dtype=value.dtype))
        impl = self._backward_impl(k)
        if packed.node == self._rebuilds_input(k, impl) and packed.node not in step.live:
            rebuilt = self._rebuilt_input(k)
            if rebuilt is not None:
                self.rebuilt_inputs += 1
                return _view(rebuilt, self._recorded(packed.node), packed.geometry)
            self._say("note", f"node {k} ({self.nodes[k].name}): a channel has gamma = 0, so its input cannot be "
                      "rebuilt from its output; recomputed instead")
        return _view(self._value(packed.node, k), self._recorded(packed.node), packed.geometry)

    def _recorded(self, v: int) -> _Geometry:
        step = self._step
        return step.records[step.creator[v]].values[v][1]

    # -------------------------------------------------------------------------------------- backward

    def _make_prehook(self, node: int) -> Callable[..., None]:
        def prehook(grad_outputs: Any) -> None:
            step = self._step
            if step is None or not step.forward_done:
                return
            if not step.callback_queued:
                step.callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._enter(node)
        return prehook

    def _make_posthook(self, node: int) -> Callable[..., None]:
        def posthook(grad_inputs: Any, grad_outputs: Any) -> None:
            step = self._step
            if step is not None and step.forward_done:
                self._finish(node)
        return posthook

    def _enter(self, k: int) -> None:
        """Make stage k current: finish every stage above it (recomputations, then keep), then run k's."""
        step = self._step
        if k > step.cursor:
            self._say("note", f"autograd ran stage {k} after a lower stage: served from what was live")
            return
        for s in range(step.cursor, k, -1):
            self._recompute_stage(s)
            self._finish(s)
        step.cursor = k
        self._recompute_stage(k)

    def _recompute_stage(self, k: int) -> None:
        """Stage k's recomputations with the replay's greedy freeing: on entry, values needed for nothing
        in the stage (and old copies of the values it recomputes) go; after each recomputation, values no
        later recomputation reads that are neither kept nor needed by the stage's backward go."""
        step = self._step
        if k in step.entered:
            return
        step.entered.add(k)
        step.produced = set()
        stage = self.stage[k]
        impl = self._backward_impl(k)
        deps = set(impl.deps) if impl is not None else set()
        keep = set(stage.keep)
        recomputed = {i for i, _ in stage.recompute}
        last_read: dict[int, int] = {}
        for position, (i, name) in enumerate(stage.recompute):
            for j in self._recompute_reads(i, name):
                last_read[j] = position

        def retain(position: int) -> None:
            for v in [v for v in step.live if not (last_read.get(v, -1) > position or v in keep or v in deps)]:
                del step.live[v]

        for v in [v for v in step.live if v in recomputed]:
            del step.live[v]
        retain(-1)
        for position, (i, name) in enumerate(stage.recompute):
            self._recompute(i, name, k)
            retain(position)

    def _recompute_reads(self, i: int, name: str) -> tuple[int, ...]:
        """What recomputing node i with implementation `name` reads (replay.py's rule): its inputs, and its
        intermediates (batch norm's saved mean/invstd) when the implementation reuses them."""
        impl = self._forward_impl(self.nodes[i], name)
        if impl is None or not impl.reuses_intermediates:
            return self.nodes[i].inputs
        return (*self.nodes[i].inputs, *self.problem.intermediates_of(i))

    def _finish(self, k: int) -> None:
        step = self._step
        if k in step.finished or k > step.cursor:
            return
        self._recompute_stage(k)
        step.finished.add(k)
        keep = set(self.stage[k].keep)
        for v in [v for v in step.live if v not in keep]:
            del step.live[v]
        step.cursor = k - 1

    def _backward_done(self) -> None:
        self._release()

    def _value(self, v: int, k: int) -> torch.Tensor:
        step = self._step
        if v not in step.live:
            self._say("note", f"node {v} ({self.nodes[v].name}) was not live when stage {k} needed it: recomputed "
                      "on demand")
            self._recompute(v, None, k, on_demand=True)
        return step.live[v]

    def _recompute(self, i: int, impl_name: str | None, k: int, on_demand: bool = False) -> None:
        step = self._step
        node = self.nodes[i]
        if i in step.produced and not on_demand:
            return  # a side output, made by its creator's recomputation in this stage
        self.recomputed.append((k, i))
        if node.name == RELU_MASK:
            step.live[i] = self._value(node.intermediate_of, k) > 0
            step.produced.add(i)
            return
        creator = step.creator.get(i)
        if creator is None:
            raise RuntimeError(f"node {i} ({node.name}) did not run in the forward pass; cannot recompute it")
        if creator != i:  # a side output asked for without its creator in the stage
            if not on_demand:
                self._say("note", f"node {i} ({node.name}) recomputed without its creator {creator}: ran the "
                          "creator's op for it")
            values = self._run(creator, None, k, inplace=False)
            step.live[i] = values[i]
            step.produced.add(i)
            return
        impl = self._forward_impl(node, impl_name) if impl_name is not None else None
        if impl is not None and impl.reuses_intermediates and node.name in BATCH_NORM_OPS:
            if self._reuse_statistics(i, k):
                return
            impl = None  # the statistics are not live: the recorded op (a note says so)
        default = node.forward[0]
        if impl is not None and impl.name != default.name and impl.inplace == default.inplace:
            self._say("fallback", f"node {i} ({node.name}): recompute '{impl.name}' has no counterpart this runtime "
                      f"applies per operator; ran '{default.name}'")
        wanted = {j for j, _ in self.stage[k].recompute}
        values = self._run(i, impl, k, inplace=impl is not None and impl.inplace and not on_demand)
        step.live[i] = values[i]
        step.produced.add(i)
        for s in self.sides.get(i, []):
            if s in wanted:
                step.live[s] = values[s]
                step.produced.add(s)

    def _reuse_statistics(self, i: int, k: int) -> bool:
        """Recompute batch norm i ("reuse-stats") as y = x * scale + shift per channel (dim 1), scale =
        gamma * invstd, shift = beta - mean * scale, from its live input and its live saved mean/invstd,
        which it reads and does not produce; no running statistics updated. False when they are not live."""
        step = self._step
        stats = self.sides.get(i, [])[:2]
        missing = [s for s in stats if s not in step.live]
        if len(stats) < 2 or missing:
            self._say("note", f"node {i} ({self.nodes[i].name}): recompute 'reuse-stats' found its saved statistics "
                      f"(nodes {stats}) not live; ran the recorded op")
            return False
        record = step.records[i]
        args, _ = tree_unflatten(list(record.leaves), record.spec)
        x, weight, bias = (self._argument_value(a, k) for a in args[:3])
        mean, invstd = (step.live[s] for s in stats)
        shape = [1, -1] + [1] * (x.dim() - 2)
        with torch.no_grad():
            scale = invstd if weight is None else invstd * weight
            # One rounding for beta - mean * scale, as the CPU kernel's contracted arithmetic: the same bits.
            shift = -mean * scale if bias is None else torch.addcmul(bias, mean, scale, value=-1)
            y = torch.addcmul(shift.view(shape).to(x.dtype), x, scale.view(shape).to(x.dtype))
        geometry = record.values[i][1]
        if tuple(y.shape) != geometry.size or y.dtype != geometry.dtype:
            raise RuntimeError(f"recomputing node {i} ({self.nodes[i].name}) from its statistics gave "
                               f"{tuple(y.shape)} {y.dtype}, the forward gave {geometry.size} {geometry.dtype}")
        step.live[i] = y
        step.produced.add(i)
        self.reused_statistics += 1
        return True

    def _argument_value(self, leaf: Any, k: int) -> Any:
        """A recorded argument made concrete: a live value (with the recorded view geometry), a constant
        (a fresh clone where the op overwrites it), or the plain Python value."""
        if isinstance(leaf, _ValueRef):
            return _view(self._value(leaf.node, k), self._recorded(leaf.node), leaf.geometry)
        if isinstance(leaf, _ConstRef):
            return leaf.tensor.clone() if leaf.fresh_clone else leaf.tensor
        return leaf

    def _run(self, i: int, impl: ForwardImpl | None, k: int, inplace: bool) -> dict[int, torch.Tensor]:
        """Run main node i's recorded op again on live values; its values by node."""
        step = self._step
        record = step.records[i]
        node = self.nodes[i]
        func = record.func
        leaves = [self._argument_value(leaf, k) for leaf in record.leaves]
        consumed: int | None = None
        whole: dict[int, torch.Tensor] = {}  # value node -> the whole tensor a partial in-place op wrote into
        if record.written_values:  # the model's op is in place
            target = node.inplace_input
            if inplace and target is not None and self._may_overwrite(target, i, k) and all(
                    record.leaves[p].node == target for p in record.written_values):
                consumed = target
                whole = {v: self._value(target, k) for v in record.whole}
            else:
                if inplace:
                    self._say("fallback", f"node {i} ({node.name}): in-place recompute would overwrite a value still "
                              "needed; ran out of place")
                functional = _functional_variant(func) if not record.whole else None
                if functional is not None:
                    func = functional
                else:  # in place on a copy of the overwritten value
                    copies: dict[int, torch.Tensor] = {}
                    for p in record.written_values:
                        ref = record.leaves[p]
                        if ref.node not in copies:
                            copies[ref.node] = self._value(ref.node, k).clone()
                        leaves[p] = _view(copies[ref.node], self._recorded(ref.node), ref.geometry)
                    whole = {v: copies[record.leaves[p].node] for v, p in record.whole.items()}
        elif inplace:
            variant = _inplace_variant(func)
            target = node.inplace_input
            position = next((p for p, leaf in enumerate(record.leaves)
                             if isinstance(leaf, _ValueRef) and leaf.node == target), None)
            if variant is not None and position == 0 and self._may_overwrite(target, i, k):
                func, consumed = variant, target
            else:
                self._say("fallback", f"node {i} ({node.name}): in-place recompute has no PyTorch counterpart here; "
                          "ran out of place")
        if record.rng_state is None and self._draws_random(func, *tree_unflatten(list(record.leaves), record.spec)):
            raise RuntimeError(f"node {i} ({node.name}) is random and the plan does not recompute it, so its RNG "
                               "state was not kept; it cannot be recomputed on demand")
        args, kwargs = tree_unflatten(leaves, record.spec)
        with torch.no_grad(), _RngRestored(record.rng_state):
            result = func(*args, **kwargs)
        results = tensor_leaves(result)
        values: dict[int, torch.Tensor] = {}
        for v, (leaf, geometry) in record.values.items():
            value = whole[v] if v in whole else results[leaf]
            if tuple(value.shape) != geometry.size or value.dtype != geometry.dtype:
                raise RuntimeError(f"recomputing node {i} ({node.name}) gave {tuple(value.shape)} {value.dtype} for "
                                   f"node {v}, the forward gave {geometry.size} {geometry.dtype}")
            values[v] = value
        if consumed is not None:
            step.live.pop(consumed, None)
        return values

    def _may_overwrite(self, j: int, i: int, k: int) -> bool:
        """The replay's rule for an in-place recomputation of i over x_j: x_j live and needed by nothing
        after it in the stage (no later recomputation reads it, not kept, not a dependency of the
        stage's backward); and not a final output, which the caller holds."""
        step = self._step
        stage = self.stage[k]
        impl = self._backward_impl(k)
        return (j in step.live and j not in stage.keep and j not in self.finals
                and (impl is None or j not in impl.deps)
                and not any(j in self._recompute_reads(r, name) for r, name in stage.recompute if r > i))


def _functional_variant(func: Any) -> Any:
    """relu_.default -> relu.default, add_.Tensor -> add.Tensor: same arguments, returns a new tensor."""
    namespace, name = func._schema.name.split("::")
    if not name.endswith("_") or name.endswith("__"):
        return None
    return _same_arguments(func, namespace, name[:-1])


def _has_inplace_variant(op_name: str) -> bool:
    """Whether "ns::name" has an in-place packet "ns::name_" (its overloads are matched when the op runs)."""
    namespace, _, name = op_name.partition("::")
    return getattr(getattr(torch.ops, namespace, None), name + "_", None) is not None


def _inplace_variant(func: Any) -> Any:
    namespace, name = func._schema.name.split("::")
    return _same_arguments(func, namespace, name + "_")


def _same_arguments(func: Any, namespace: str, name: str) -> Any:
    packet = getattr(getattr(torch.ops, namespace), name, None)
    overload = getattr(packet, func._overloadname, None) if packet is not None else None
    if overload is None:
        return None
    same = [a.name for a in overload._schema.arguments] == [a.name for a in func._schema.arguments]
    return overload if same else None


class _RngRestored:
    """Run under the RNG state recorded before the forward op ran, then put the current state back."""

    def __init__(self, state: tuple[torch.Tensor, dict[int, torch.Tensor]] | None):
        self.state = state
        self.saved: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None

    def __enter__(self) -> None:
        if self.state is None:
            return
        cpu, cuda = self.state
        self.saved = (torch.get_rng_state(), {d: torch.cuda.get_rng_state(d) for d in cuda})
        torch.set_rng_state(cpu)
        for device, state in cuda.items():
            torch.cuda.set_rng_state(state, device)

    def __exit__(self, *exc: Any) -> None:
        if self.saved is None:
            return
        cpu, cuda = self.saved
        torch.set_rng_state(cpu)
        for device, state in cuda.items():
            torch.cuda.set_rng_state(state, device)

"""Trace one training step of a PyTorch model on CPU into a `ModelTrace` (aten-level ops with shapes).

Design: a `TorchDispatchMode` records every aten op as eager PyTorch runs it: forward, loss,
`loss.backward()` and `optimizer.step()`. The alternative, AOTAutograd's joint graph through `make_fx`,
would give a functionalized graph: no in-place ops, no views of real storages, no optimizer step, and
no measured per-op times without a second, separate run. The dispatch mode sees exactly what the eager
step does (in-place `relu_`, views, the AccumulateGrad handoff, the optimizer's in-place updates), times
each kernel where it runs, and gets backward pairing from autograd itself:

* roles: the phase that is running (forward and loss -> "forward", `loss.backward()` -> "backward",
  `optimizer.step()` -> "optimizer");
* pairing: autograd creates the node of a forward op before the kernel runs and attaches it to the
  outputs after the dispatch returns, so the outputs' `grad_fn` is read (through weak references) at the
  next dispatched op, before a later in-place op can rebase it. In backward,
  `torch._C._current_autograd_node()` is the node being run; equal `_sequence_nr()` pairs the two;
* tensors: one trace tensor per storage, so views alias their base and cost no bytes, and in-place ops
  (arguments the schema marks `Tensor(a!)`) list the tensor as input and output. Storages are held by
  weak reference for one iteration, so a storage freed mid-step cannot hand its address to a new one.

Only compact records survive an iteration (names, ids, nanoseconds); tensors are never kept alive.

Format constraint: a trace tensor of a preloaded kind (parameter, buffer, input, optimizer state) may be
read before it is written, so the optimizer's in-place updates of parameters and momentum buffers are
recorded as writes. Any other tensor must be written before it is read; a write to such a tensor that
was read but never written earlier in the step is recorded as a read only, and counted in
`source["external_writes_as_reads"]`.
"""

from __future__ import annotations

import statistics
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mlopt.errors import InputError
from mlopt.formats.trace import PRELOADED_KINDS, Implementation, ModelTrace, Op, Tensor, validate_trace
from mlopt.pytorch.models import resolve_model

IMPORTER = "torch-dispatch"
OPTIMIZERS = ("sgd", "adam", "none")
# Ops of these namespaces are instrumentation (the optimizer's record_function markers), not compute.
IGNORED_NAMESPACES = frozenset({"profiler"})
# Mutations missing from the schema: native_batch_norm updates its running stats when training.
UNANNOTATED_WRITES = {"aten::native_batch_norm": ("running_mean", "running_var")}
ROLE_OF_NEW_TENSOR = {"forward": "activation", "backward": "gradient", "optimizer": "other"}
SGD_SETTINGS = {"lr": 0.01, "momentum": 0.9}
ADAM_SETTINGS = {"lr": 1e-3}


# ----------------------------------------------------------------------------------------------------
# Small pure helpers


def op_name(func: Any) -> str:
    """"aten::convolution", "aten::add_": the schema name without overload, as profilers and ETs name ops."""
    return func._schema.name


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def unique(ids: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(ids))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def argument_value(position: int, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    return args[position] if position < len(args) else kwargs.get(name)


def read_tensors(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Tensor arguments the op reads: all but `out=` buffers, which it only writes."""
    return [
        t
        for position, argument in enumerate(func._schema.arguments)
        if not argument.is_out
        for t in tensor_leaves(argument_value(position, argument.name, args, kwargs))
    ]


def written_tensors(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Arguments the op writes: `Tensor(a!)` in its schema (in-place self, out=), plus known omissions."""
    written: list[torch.Tensor] = []
    extra = UNANNOTATED_WRITES.get(op_name(func), ())
    training = True
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "training":
            training = bool(argument_value(position, argument.name, args, kwargs))
    for position, argument in enumerate(func._schema.arguments):
        annotated = argument.alias_info is not None and argument.alias_info.is_write
        if annotated or (training and argument.name in extra):
            written.extend(tensor_leaves(argument_value(position, argument.name, args, kwargs)))
    return written


def median_us(samples_ns: Sequence[int]) -> float:
    return round(statistics.median(samples_ns) / 1000.0, 3)


# ----------------------------------------------------------------------------------------------------
# Per-iteration recording


@dataclass
class _TensorEntry:
    ref: StorageWeakRef  # keeps the storage's address from being reused while the iteration runs
    id: int | None  # None: declared, not yet seen by an op
    kind: str
    bytes: int
    shape: tuple[int, ...]
    dtype: str


class _TensorTable:
    """Trace tensor ids by storage, numbered in order of first appearance in an op."""

    def __init__(self) -> None:
        self._entries: dict[int, _TensorEntry] = {}  # by storage address (StorageWeakRef.cdata)
        self._declared: dict[int, _TensorEntry] = {}  # same keys, in declaration order
        self._retired: list[_TensorEntry] = []  # entries whose storage died and whose address came back
        self._by_id: dict[int, _TensorEntry] = {}
        self._next_id = 0

    def _entry(self, tensor: torch.Tensor, kind: str) -> _TensorEntry | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested and other storage-less tensors
            return None
        ref = StorageWeakRef(storage)
        entry = self._entries.get(ref.cdata)
        if entry is not None and not entry.ref.expired():
            return entry
        if entry is not None:
            self._retired.append(entry)
        # New storage, or an expired one whose address was recycled: a new tensor.
        entry = _TensorEntry(ref, None, kind, storage.nbytes(), tuple(tensor.shape), dtype_name(tensor.dtype))
        self._entries[ref.cdata] = entry
        return entry

    def declare(self, tensor: torch.Tensor, kind: str) -> None:
        """Fix the kind of a tensor known before the step (parameter, buffer, input, optimizer state)."""
        entry = self._entry(tensor, kind)
        if entry is not None:
            entry.kind = kind
            self._declared.setdefault(entry.ref.cdata, entry)

    def id_of(self, tensor: torch.Tensor, kind_if_new: str) -> int | None:
        entry = self._entry(tensor, kind_if_new)
        if entry is None:
            return None
        if entry.id is None:
            entry.id = self._next_id
            self._by_id[entry.id] = entry
            self._next_id += 1
        return entry.id

    def kind_of(self, tensor_id: int) -> str:
        return self._by_id[tensor_id].kind

    def finish(self) -> list[Tensor]:
        """The trace tensors; declared ones no op touched (unused parameters) get the last ids.
        Drops the storage references, so the iteration's storages can be freed and their addresses reused."""
        for entry in self._declared.values():
            if entry.id is None:
                entry.id = self._next_id
                self._next_id += 1
        seen = [e for e in [*self._retired, *self._entries.values()] if e.id is not None]
        tensors = sorted((Tensor(e.id, e.bytes, e.kind, e.shape, e.dtype) for e in seen), key=lambda t: t.id)
        self._entries.clear()
        self._declared.clear()
        self._retired.clear()
        self._by_id.clear()
        return tensors


class _OpRecord(NamedTuple):
    name: str
    role: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    autograd_node: int | None  # sequence number of the backward node running the op
    elapsed_ns: int


@dataclass
class _IterationLog:
    """What one traced training step did: op records and the tensor table."""

    table: _TensorTable = field(default_factory=_TensorTable)
    ops: list[_OpRecord] = field(default_factory=list)
    forward_op_of_node: dict[int, int] = field(default_factory=dict)  # autograd sequence nr -> op index
    pending_outputs: list[tuple[int, list[weakref.ref]]] = field(default_factory=list)
    written: set[int] = field(default_factory=set)
    read: set[int] = field(default_factory=set)
    external_writes_as_reads: int = 0
    tensors: list[Tensor] = field(default_factory=list)  # filled by finish()

    def resolve_pending_outputs(self) -> None:
        # Autograd attaches grad_fn after the dispatch returned; by the next op (or the phase's end) it is
        # there, and not yet rebased by a later in-place op.
        for index, refs in self.pending_outputs:
            for ref in refs:
                tensor = ref()
                node = tensor.grad_fn if tensor is not None else None
                if node is not None:
                    self.forward_op_of_node.setdefault(node._sequence_nr(), index)
        self.pending_outputs.clear()

    def _ids(self, tensors: Iterable[torch.Tensor], kind_if_new: str) -> list[int]:
        return [i for i in (self.table.id_of(t, kind_if_new) for t in tensors) if i is not None]

    def record(self, func: Any, role: str, args: Sequence[Any], kwargs: dict[str, Any], result: Any,
               node: Any, elapsed_ns: int) -> None:
        new_kind = ROLE_OF_NEW_TENSOR[role]
        inputs = unique(self._ids(read_tensors(func, args, kwargs), "other"))  # first seen as a read: external
        written = self._ids(written_tensors(func, args, kwargs), new_kind)  # new here only for out= buffers
        results = tensor_leaves(result)
        returned = self._ids(results, new_kind)
        candidates = unique(written + [i for i in returned if i not in inputs])  # returned aliases are views
        outputs = []
        for tensor_id in candidates:
            preloaded = self.table.kind_of(tensor_id) in PRELOADED_KINDS
            if tensor_id not in self.written and tensor_id in self.read and not preloaded:
                self.external_writes_as_reads += 1  # see the module docstring
                continue
            outputs.append(tensor_id)
        self.written.update(outputs)
        self.read.update(inputs)
        sequence_nr = node._sequence_nr() if node is not None else None
        self.ops.append(_OpRecord(op_name(func), role, tuple(inputs), tuple(outputs), sequence_nr, elapsed_ns))
        if role == "forward" and results:
            self.pending_outputs.append((len(self.ops) - 1, [weakref.ref(t) for t in results]))

    def finish(self) -> None:
        self.resolve_pending_outputs()
        self.tensors = self.table.finish()

    def forward_op(self, record: _OpRecord) -> int | None:
        if record.role != "backward" or record.autograd_node is None:
            return None
        return self.forward_op_of_node.get(record.autograd_node)  # AccumulateGrad & co. pair with nothing

    def structure(self) -> "_Structure":
        """Everything but the times: what must be identical across repeats."""
        ops = tuple((r.name, r.role, r.inputs, r.outputs, self.forward_op(r)) for r in self.ops)
        return ops, tuple(self.tensors)


class _Recorder(TorchDispatchMode):
    """Times and records every op dispatched while active, under one role."""

    def __init__(self, log: _IterationLog, role: str):
        super().__init__()
        self.log = log
        self.role = role

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace in IGNORED_NAMESPACES:
            return func(*args, **kwargs)
        self.log.resolve_pending_outputs()
        node = torch._C._current_autograd_node()
        start = time.perf_counter_ns()
        result = func(*args, **kwargs)  # the mode is off inside: nested ops are part of this one
        elapsed = time.perf_counter_ns() - start
        self.log.record(func, self.role, args, kwargs, result, node, elapsed)
        return result


@contextmanager
def _recording(log: _IterationLog | None, role: str) -> Iterator[None]:
    if log is None:  # warmup: run untraced
        yield
        return
    with _Recorder(log, role):
        yield
    log.resolve_pending_outputs()


# ----------------------------------------------------------------------------------------------------
# The training step


def make_optimizer(name: str, parameters: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    if name == "sgd":
        return torch.optim.SGD(parameters, **SGD_SETTINGS)
    if name == "adam":
        return torch.optim.Adam(parameters, **ADAM_SETTINGS)
    return None


def loss_outputs(output: Any) -> list[torch.Tensor]:
    """The model's floating outputs that need gradients (all heads of tuple/dict outputs)."""
    return [t for t in tensor_leaves(output) if t.is_floating_point() and t.requires_grad]


def is_classification_output(output: torch.Tensor, batch: int) -> bool:
    return output.dim() == 2 and output.shape[0] == batch and output.shape[1] > 0


def make_targets(outputs: list[torch.Tensor], batch: int, seed: int) -> list[torch.Tensor | None]:
    """Random class targets for [batch, classes] outputs (None for others), from their own generator so
    they do not depend on how much randomness the forward pass consumed."""
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, o.shape[1], (batch,), generator=generator) if is_classification_output(o, batch) else None
        for o in outputs
    ]


def training_loss(outputs: list[torch.Tensor], targets: list[torch.Tensor | None]) -> torch.Tensor:
    terms = [
        nn.functional.cross_entropy(o, t) if t is not None else o.float().mean() for o, t in zip(outputs, targets)
    ]
    loss = terms[0]
    for term in terms[1:]:
        loss = loss + term
    return loss


class _TrainingStep:
    """One forward + loss + backward (+ optimizer step), optionally recorded."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, optimizer: torch.optim.Optimizer | None,
                 seed: int, label: str):
        self.model = model
        self.inputs = inputs
        self.optimizer = optimizer
        self.seed = seed
        self.label = label
        self.targets: list[torch.Tensor | None] | None = None  # made on the first step, then reused

    def _declare_known_tensors(self, log: _IterationLog) -> None:
        for parameter in self.model.parameters():
            log.table.declare(parameter, "parameter")
        for buffer in self.model.buffers():
            log.table.declare(buffer, "buffer")
        log.table.declare(self.inputs, "input")
        for target in self.targets or ():
            if target is not None:
                log.table.declare(target, "input")
        self._declare_optimizer_state(log)

    def _declare_optimizer_state(self, log: _IterationLog) -> None:
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for tensor in tensor_leaves(state):
                    log.table.declare(tensor, "optimizer_state")

    def _forward(self, log: _IterationLog | None) -> torch.Tensor:
        with _recording(log, "forward"):
            outputs = loss_outputs(self.model(self.inputs))
        if not outputs:
            raise InputError(self.label, "model", "the model's output has no floating tensor that requires grad")
        if self.targets is None:  # outside recording: target generation is not part of the step
            self.targets = make_targets(outputs, self.inputs.shape[0], self.seed)
        if log is not None:
            for target in self.targets:
                if target is not None:
                    log.table.declare(target, "input")
        with _recording(log, "forward"):
            return training_loss(outputs, self.targets)

    def run(self, log: _IterationLog | None) -> None:
        self.model.zero_grad(set_to_none=True)  # gradients are written fresh by backward, as in training
        if log is not None:
            self._declare_known_tensors(log)
        try:
            loss = self._forward(log)
            with _recording(log, "backward"):
                loss.backward()
        except InputError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's model failed on this input
            shape = list(self.inputs.shape)
            raise InputError(
                self.label, "model", f"training step failed on input {shape}: {type(error).__name__}: {error}"
            ) from error
        del loss  # frees the graph's last reference before the optimizer allocates state
        if self.optimizer is not None:
            with _recording(log, "optimizer"):
                self.optimizer.step()
            if log is not None:
                self._declare_optimizer_state(log)  # state created by this step (no warmup)
        if log is not None:
            log.finish()


# ----------------------------------------------------------------------------------------------------
# Assembling the trace


_Structure = tuple[tuple[Any, ...], tuple[Tensor, ...]]  # (op signatures, tensors)


def first_difference(a: _Structure, b: _Structure) -> str:
    ops_a, tensors_a = a
    ops_b, tensors_b = b
    for index, (x, y) in enumerate(zip(ops_a, ops_b)):
        if x != y:
            return f"op {index} is {x[0]} ({x[1]}) in one and {y[0]} ({y[1]}) in the other"
    if len(ops_a) != len(ops_b):
        return f"{len(ops_a)} ops in one, {len(ops_b)} in the other"
    for x, y in zip(tensors_a, tensors_b):
        if x != y:
            return f"tensor {x.id} differs: {x} vs {y}"
    return f"{len(tensors_a)} tensors in one, {len(tensors_b)} in the other"


def check_same_structure(logs: list[_IterationLog], label: str) -> None:
    reference = logs[0].structure()
    for repeat, log in enumerate(logs[1:], start=2):
        other = log.structure()
        if other != reference:
            raise InputError(
                label,
                "model",
                f"the traced steps differ (repeat 1 vs {repeat}: {first_difference(reference, other)}); the step "
                "is not repeatable: data-dependent control flow, or state created lazily on the first step "
                "(use warmup >= 1), or trace with repeats=1",
            )


def assemble_trace(logs: list[_IterationLog], name: str, source: dict[str, Any]) -> ModelTrace:
    """The first traced iteration's structure with each op's median time over all of them."""
    first = logs[0]
    ops = tuple(
        Op(
            id=index,
            name=record.name,
            role=record.role,
            inputs=record.inputs,
            outputs=record.outputs,
            implementations=(
                Implementation("default", median_us([log.ops[index].elapsed_ns for log in logs]), 0),
            ),
            forward_op=first.forward_op(record),
        )
        for index, record in enumerate(first.ops)
    )
    source = {**source, "external_writes_as_reads": first.external_writes_as_reads}
    return ModelTrace(name=name, ops=ops, tensors=tuple(first.tensors), source=source)


def _check_arguments(label: str, input_shape: Sequence[int], batch: int, optimizer: str, repeats: int,
                     warmup: int) -> tuple[int, ...]:
    shape = tuple(input_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise InputError(label, "input_shape", f"expected positive integers, got {list(shape)}")
    if not isinstance(batch, int) or batch < 1:
        raise InputError(label, "batch", f"expected a positive integer, got {batch!r}")
    if optimizer not in OPTIMIZERS:
        raise InputError(label, "optimizer", f"expected one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(label, "repeats", f"expected a positive integer, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise InputError(label, "warmup", f"expected a non-negative integer, got {warmup!r}")
    return shape


MEMORY_FORMATS = ("contiguous", "channels-last")


def _memory_format(label: str, memory_format: str, shape: tuple[int, ...]) -> torch.memory_format | None:
    """torch's format for `memory_format` (None: leave tensors as they are); InputError when it does not apply."""
    if memory_format not in MEMORY_FORMATS:
        raise InputError(label, "memory_format", f"expected one of {', '.join(MEMORY_FORMATS)}, got {memory_format!r}")
    if memory_format == "contiguous":
        return None
    if len(shape) != 3:
        raise InputError(label, "memory_format", f"channels-last needs (C, H, W) inputs, got input shape {list(shape)}")
    return torch.channels_last


def trace_model(
    model: nn.Module,
    input_shape: Sequence[int],
    batch: int,
    *,
    optimizer: str = "sgd",
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    name: str | None = None,
    spec: str | None = None,
    memory_format: str = "contiguous",
    progress: Callable[[str], None] | None = None,
) -> ModelTrace:
    """Trace one training step of `model` on CPU: forward, loss, backward and (unless "none") an
    optimizer step (SGD lr 0.01 momentum 0.9, or Adam lr 1e-3).

    `memory_format` "channels-last" converts the model's 4-D parameters and the (C, H, W) inputs to
    torch.channels_last before tracing, so the trace times what a channels-last training job runs (on
    CPU, oneDNN's NHWC convolutions) and its source says `"memory_format": "channels-last"`; the model
    stays converted. A plan made from it is applied to a model and inputs converted the same way.

    `input_shape` excludes the batch dimension. The step runs `warmup` times untraced, then `repeats`
    times traced; each op's compute_us is the median of its traced times, and the traced op sequences
    must be identical (InputError if not). `spec` only goes into the trace's source. The model is moved
    to CPU, put in training mode and trained by the steps (its weights change).
    """
    label = spec or name or type(model).__name__
    shape = _check_arguments(label, input_shape, batch, optimizer, repeats, warmup)
    layout = _memory_format(label, memory_format, shape)
    torch.manual_seed(seed)
    model.to("cpu").train()
    if layout is not None:
        model.to(memory_format=layout)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if optimizer != "none" and not trainable:
        raise InputError(label, "optimizer", "the model has no trainable parameters; use optimizer 'none'")
    inputs = torch.randn(batch, *shape)
    if layout is not None:
        inputs = inputs.contiguous(memory_format=layout)
    step = _TrainingStep(model, inputs, make_optimizer(optimizer, trainable), seed, label)
    report = progress or (lambda message: None)
    with torch.enable_grad():
        for i in range(warmup):
            report(f"warm-up step {i + 1}/{warmup}")
            step.run(None)
        logs = []
        for i in range(repeats):
            report(f"traced step {i + 1}/{repeats}")
            log = _IterationLog()
            step.run(log)
            logs.append(log)
    check_same_structure(logs, label)
    source = {
        "importer": IMPORTER,
        "model": spec or f"{type(model).__module__}.{type(model).__qualname__}",
        "batch": batch,
        "input_shape": list(shape),
        "torch": torch.__version__,
        "optimizer": optimizer,
        "device": "cpu",
        **({"memory_format": memory_format} if layout is not None else {}),
        "repeats": repeats,
        "warmup": warmup,
        "seed": seed,
    }
    trace = assemble_trace(logs, name or type(model).__name__, source)
    validate_trace(trace, label)
    return trace


def trace_model_spec(
    spec: str,
    *,
    batch: int,
    input_shape: Sequence[int] | None = None,
    optimizer: str = "sgd",
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    name: str | None = None,
    model_kwargs: dict[str, Any] | None = None,
    memory_format: str = "contiguous",
    progress: Callable[[str], None] | None = None,
) -> ModelTrace:
    """Resolve `spec` (see mlopt.pytorch.models) and trace it; what the CLI calls.

    `input_shape` (without batch) defaults to the model's own default (torchvision classification:
    3x224x224); InputError(spec, "input_shape", ...) when it has none. The trace is named after the
    callable unless `name` is given.
    """
    # Check what can be checked before building a possibly large model.
    _check_arguments(spec, input_shape or (1,), batch, optimizer, repeats, warmup)
    torch.manual_seed(seed)  # the model's initial weights, too, follow the seed
    model, default_shape, context = resolve_model(spec, **(model_kwargs or {}))
    shape = input_shape if input_shape is not None else default_shape
    if shape is None:
        raise InputError(
            spec, "input_shape", "this model has no default input shape; give one (without the batch), e.g. 3,224,224"
        )
    trace = trace_model(
        model, shape, batch, optimizer=optimizer, repeats=repeats, warmup=warmup, seed=seed,
        name=name or context.callable_name.rsplit(".", 1)[-1], spec=spec, memory_format=memory_format,
        progress=progress,
    )
    del context  # the torchvision shim, if any, was needed until here
    return trace

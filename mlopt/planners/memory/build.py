"""Build a MemoryProblem (problem.py) from a ModelTrace: nodes, dependencies, costs and gradient memory.

Nodes. One node per forward op that writes at least one activation tensor of nonzero bytes (views,
detach, 0-byte `empty`, buffer-only updates make none). Tensor versions are tracked: a forward op
reading tensor t reads the version written by the latest earlier node that wrote t, so N_i are
those producers; tensors no forward op writes (parameters, inputs, buffers) are constant memory.
A node's value is ONE tensor, its primary output: the tensor it overwrites if it is in place (relu_,
add_), else its first activation output. Every further activation output (batch norm's saved mean
and invstd, max pool's indices, nll_loss's total weight) becomes an intermediate node right after it
(`intermediate_of` = the op's node, inputs = (that node,), time 0, named "<op>.out<n>"), because
backward ops read them separately and in-place successors overwrite only the primary (relu_ after
batch norm would otherwise destroy the statistics its backward needs). Those side outputs are
allocated by the op's own kernel, so their bytes are added to the op's workspace: the op's peak
counts them whether or not they are kept. ReLUs also get a "mlopt::relu_mask" node (catalog.py).
Forward ops that make no node fold their time into the next node (the last one for trailing ops),
so the forward time is the trace's.

Backward. Backward ops are grouped by `forward_op` into the stage of that op's node; ops with no
forward_op, or whose forward op made no node (views), join the stage of the next paired op in trace
order (the last paired op's stage when none follows), so the backward time is the trace's. D_k of
the default implementation = the producers, as of the end of the forward pass, of the activation
tensors the stage's ops read. Its time is the sum of its ops' times, its workspace their maximum. A
backward op's workspace is what its kernel allocates beyond what it returns (batch norm's input-sized
temporary, oneDNN convolution's operand copies): measured where `mlopt profile operators` profiled the op,
else the catalog's constants for the trace's device (catalog.backward_transient_bytes), whichever the
trace's own figure does not exceed; the stage's peak counts it (c_hat_k in the ILP and the replay).

Gradients (decision-independent constants). Backward ops run in stage order (k = N-1..0, trace order
inside a stage), each allocating the gradient tensors it writes first and freeing those it reads last.
grad_live_bytes(k) = what is live entering stage k; y_bytes(k) = how far the stage's ops rise above that
at their highest (a stage's view, select and clone backwards free what they read as they go, so this is
their running peak, not the sum of all they write). Parameter gradients persist to the end (read by the
optimizer, or handed to .grad by AccumulateGrad's detach); activation gradients die after their last
backward reader. What the training loop holds through
`loss.backward()` counts from the seed's stage to the end: the loss tensor (the caller's variable) and
the seed gradient `ones_like(loss)` (torch.autograd.backward's own argument until it returns); measured
steps peak on those bytes too (8 on a float loss).

Every tensor counts as its device's allocator counts it (catalog.allocated_bytes: on CUDA, 512-byte blocks).

constant_bytes = input, parameter, buffer and optimizer-state tensors, plus 'other' tensors that no
forward or backward op writes. final_outputs = the loss (the last forward op's node) and whatever
backward ops with no forward_op (the loss seed) or non-training ops read.

Ops with no measured compute_us (an ET without Kineto) get DEFAULT_US_OVERHEAD + bytes touched /
DEFAULT_BYTES_PER_US and a warning; the problem's cost_source says which times were defaulted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.trace import ModelTrace, Op, Tensor
from mlopt.planners.memory import catalog
from mlopt.planners.memory.problem import BackwardImpl, ForwardImpl, MemoryProblem, Node

CONSTANT_KINDS = ("input", "parameter", "buffer", "optimizer_state")
# Default cost of an unmeasured op: roughly a memory-bound CPU kernel (10 GB/s) plus launch overhead.
DEFAULT_BYTES_PER_US = 10_000.0
DEFAULT_US_OVERHEAD = 1.0
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


@dataclass(frozen=True)
class _Draft:
    """A node before its implementation catalog is applied."""

    index: int
    op: Op
    name: str
    out_bytes: int
    inputs: tuple[int, ...]
    role: str  # main | side | mask
    time_us: float  # default forward time (main: the op's measured time + folded ops)
    workspace_bytes: int = 0
    inplace_input: int | None = None
    intermediate_of: int | None = None


@dataclass(frozen=True)
class _Forward:
    drafts: tuple[_Draft, ...]
    producer_at_end: dict[int, int]  # activation tensor -> node holding its last forward version
    node_of_op: dict[int, int]  # forward op id -> its main node
    mask_of: dict[int, int]  # relu node -> its mask node
    skipped_ops: int
    folded_us: float


@dataclass(frozen=True)
class _Stage:
    ops: tuple[Op, ...]
    deps: tuple[int, ...]


# --------------------------------------------------------------------------------------- costs


def _op_times(trace: ModelTrace, tensors: dict[int, Tensor]) -> tuple[dict[int, list[float]], int]:
    """Per op, each implementation's time (defaulted where unmeasured), and how many ops were defaulted."""
    times: dict[int, list[float]] = {}
    defaulted = 0
    for op in trace.ops:
        touched = sum(tensors[t].bytes for t in set(op.inputs) | set(op.outputs))
        estimate = DEFAULT_US_OVERHEAD + touched / DEFAULT_BYTES_PER_US
        row = [impl.compute_us if impl.compute_us is not None else estimate for impl in op.implementations]
        if op.role in ("forward", "backward") and op.implementations[0].compute_us is None:
            defaulted += 1
        times[op.id] = row
    return times, defaulted


def _numel(tensor: Tensor) -> int:
    if tensor.dtype in ITEMSIZE:
        return tensor.bytes // ITEMSIZE[tensor.dtype]
    if tensor.shape:
        count = 1
        for d in tensor.shape:
            count *= d
        return count
    return tensor.bytes // 4


# --------------------------------------------------------------------------------------- forward


def _activation_outputs(op: Op, tensors: dict[int, Tensor]) -> list[int]:
    return [t for t in dict.fromkeys(op.outputs) if tensors[t].kind == "activation" and tensors[t].bytes > 0]


def _forward_drafts(trace: ModelTrace, tensors: dict[int, Tensor], times: dict[int, list[float]],
                    factors: catalog.CatalogFactors) -> _Forward:
    drafts: list[_Draft] = []
    producer: dict[int, int] = {}
    node_of_op: dict[int, int] = {}
    mask_of: dict[int, int] = {}
    pending_us = folded_us = 0.0
    skipped = 0
    for op in trace.ops_by_role("forward"):
        outputs = _activation_outputs(op, tensors)
        if not outputs:
            pending_us += times[op.id][0]
            folded_us += times[op.id][0]
            skipped += 1
            continue
        overwritten = [t for t in outputs if t in op.inputs and t in producer]
        primary = overwritten[0] if overwritten else outputs[0]
        sides = [t for t in outputs if t != primary]
        main = len(drafts)
        drafts.append(_Draft(
            index=main, op=op, name=op.name, out_bytes=tensors[primary].bytes,
            inputs=tuple(sorted({producer[t] for t in op.inputs if t in producer})), role="main",
            time_us=times[op.id][0] + pending_us,
            workspace_bytes=op.implementations[0].workspace_bytes + sum(tensors[t].bytes for t in sides),
            inplace_input=producer[primary] if overwritten else None,
        ))
        pending_us = 0.0
        node_of_op[op.id] = main
        producer[primary] = main
        for position, t in enumerate(sides, start=1):
            producer[t] = len(drafts)
            drafts.append(_Draft(index=len(drafts), op=op, name=f"{op.name}.out{position}",
                                 out_bytes=tensors[t].bytes, inputs=(main,), role="side", time_us=0.0,
                                 intermediate_of=main))
        if catalog.makes_mask(op.name):
            mask_of[main] = len(drafts)
            drafts.append(_Draft(index=len(drafts), op=op, name=catalog.MASK_NODE_NAME,
                                 out_bytes=catalog.allocated_bytes(catalog.mask_bytes(_numel(tensors[primary])),
                                                                   _source_field(trace, "device")), inputs=(main,),
                                 role="mask", time_us=catalog.mask_impl(times[op.id][0], factors).compute_us,
                                 intermediate_of=main))
    if pending_us and drafts:  # trailing node-less ops (e.g. detach of the loss) join the last main node
        last = max(d.index for d in drafts if d.role == "main")
        drafts[last] = replace(drafts[last], time_us=drafts[last].time_us + pending_us)
    return _Forward(tuple(drafts), producer, node_of_op, mask_of, skipped, folded_us)


def _forward_users(drafts: tuple[_Draft, ...]) -> list[list[int]]:
    users: list[list[int]] = [[] for _ in drafts]
    for d in drafts:
        for j in d.inputs:
            users[j].append(d.index)
    return users


# --------------------------------------------------------------------------------------- backward


def _stage_of_ops(backward_ops: list[Op], node_of_op: dict[int, int]) -> tuple[dict[int, int], int]:
    """Backward op id -> stage (node); unpaired ops join the next paired op's stage (or the last one)."""
    stage: dict[int, int] = {}
    waiting: list[Op] = []
    last: int | None = None
    for op in backward_ops:
        k = node_of_op.get(op.forward_op) if op.forward_op is not None else None
        if k is None:
            waiting.append(op)
            continue
        for w in waiting:
            stage[w.id] = k
        waiting = []
        stage[op.id] = k
        last = k
    for w in waiting:
        if last is not None:
            stage[w.id] = last
    unpaired = sum(1 for op in backward_ops if op.forward_op is None or op.forward_op not in node_of_op)
    return stage, unpaired


def _stages(backward_ops: list[Op], stage_of: dict[int, int], producer: dict[int, int]) -> dict[int, _Stage]:
    grouped: dict[int, list[Op]] = {}
    for op in backward_ops:
        if op.id in stage_of:
            grouped.setdefault(stage_of[op.id], []).append(op)
    return {k: _Stage(tuple(ops), tuple(sorted({producer[t] for op in ops for t in op.inputs if t in producer})))
            for k, ops in grouped.items()}


def _profiled_op_ids(trace: ModelTrace) -> set[int]:
    """The ops whose implementations `mlopt profile operators` measured (their workspace is measured)."""
    profiled = _source_field(trace, "operator_profile")
    measurements = profiled.get("measurements") if isinstance(profiled, dict) else None
    return {op_id for m in measurements or () if isinstance(m, dict) for op_id in m.get("op_ids") or ()}


def _catalog_transient(op: Op, tensors: dict[int, Tensor], device: Any, memory_format: Any = None) -> int:
    """The catalog's transient bytes of a backward op whose first two inputs are (dy, x); the rules that need
    more (a weight's shape, attention's logsumexp, the trace's `source.memory_format`) get every input."""
    if len(op.inputs) < 2:
        return 0
    operands = tuple(tensors[t] for t in op.inputs)
    grad_output, forward_input = operands[0], operands[1]
    computes_grad_input = any(tensors[t].bytes == forward_input.bytes and tensors[t].shape == forward_input.shape
                              for t in op.outputs)
    return catalog.backward_transient_bytes(op.name, device, grad_output_bytes=grad_output.bytes,
                                            input_bytes=forward_input.bytes, computes_grad_input=computes_grad_input,
                                            operands=operands, memory_format=memory_format)


def _with_backward_transients(trace: ModelTrace, tensors: dict[int, Tensor],
                              backward_ops: list[Op]) -> tuple[list[Op], dict[str, Any]]:
    """The backward ops with each unprofiled op's default workspace raised to the catalog's transient bytes
    (module docstring), and a summary for the problem's metadata."""
    measured = _profiled_op_ids(trace)
    device, memory_format = _source_field(trace, "device"), _source_field(trace, "memory_format")
    out, raised, largest = [], 0, 0
    for op in backward_ops:
        default = op.implementations[0]
        transient = 0 if op.id in measured else _catalog_transient(op, tensors, device, memory_format)
        if transient > (default.workspace_bytes or 0):
            op = replace(op, implementations=(replace(default, workspace_bytes=transient),) + op.implementations[1:])
            raised += 1
            largest = max(largest, transient)
        out.append(op)
    return out, {"catalog_ops": raised, "catalog_max_bytes": largest, "measured_ops": len(measured)}


def _traced_backward(k: int, stage: _Stage, times: dict[int, list[float]], inputs: tuple[int, ...],
                     intermediates: set[int]) -> tuple[BackwardImpl, ...]:
    """The measured stage, plus one alternative per extra trace implementation of one of its ops."""
    deps = stage.deps
    if any(d in inputs for d in deps):
        kind = "input-activated"
    elif k in deps:
        kind = "output-activated"
    elif any(d in intermediates for d in deps):
        kind = "intermediate-activated"
    else:
        kind = "none" if not deps else "input-activated"
    total = sum(times[op.id][0] for op in stage.ops)
    workspace = max((op.implementations[0].workspace_bytes for op in stage.ops), default=0)
    impls = [BackwardImpl("default", total, workspace, deps, kind)]
    names = {"default"}
    for op in stage.ops:
        others = max((o.implementations[0].workspace_bytes for o in stage.ops if o is not op), default=0)
        for n, impl in enumerate(op.implementations[1:], start=1):
            name = impl.name if impl.name not in names else f"{op.name}:{impl.name}"
            names.add(name)
            impls.append(BackwardImpl(name, total - times[op.id][0] + times[op.id][n],
                                      max(others, impl.workspace_bytes), deps, kind))
    return tuple(impls)


def _is_loss_seed(op: Op, tensors: dict[int, Tensor]) -> bool:
    """backward()'s seed: an unpaired backward op that writes a gradient from no gradient (ones_like(loss))."""
    return (op.forward_op is None and any(tensors[t].kind == "gradient" for t in op.outputs)
            and not any(tensors[t].kind == "gradient" for t in op.inputs))


@dataclass(frozen=True)
class _GradientLives:
    """When each gradient is allocated and freed, by op index in stage order (`_gradient_lives`)."""

    early: frozenset[int]  # read before the stage order writes them: live from the start of the backward pass
    allocated_at: dict[int, int]  # op -> bytes it adds: gradients it writes first (the seed op: also the loss)
    freed_at: dict[int, int]  # op -> bytes of the gradients it reads last (none the step keeps)


def _gradient_lives(trace: ModelTrace, ordered: list[Op], tensors: dict[int, Tensor]) -> _GradientLives:
    first_writer: dict[int, int] = {}
    last_reader: dict[int, int] = {}
    kept: set[int] = set()  # live to the end of the backward pass
    early: set[int] = set()
    allocated_at: dict[int, int] = defaultdict(int)
    for i, op in enumerate(ordered):
        # AccumulateGrad's handoff (an unpaired op that writes nothing) is not a use: .grad persists.
        handoff = op.forward_op is None and not op.outputs
        if _is_loss_seed(op, tensors):
            # The training loop holds the loss through loss.backward(), and torch.autograd.backward the seed
            # gradient ones_like(loss) until it returns: both count from here to the end.
            allocated_at[i] += sum(tensors[t].bytes for t in op.inputs if tensors[t].kind != "gradient")
            kept.update(op.outputs)
        for t in op.inputs:
            if tensors[t].kind != "gradient":
                continue
            if t not in first_writer:
                early.add(t)
            if handoff:  # handed to .grad: lives past the step even when a view (t) read it first
                kept.add(t)
            else:
                last_reader[t] = i
        for t in op.outputs:
            if tensors[t].kind == "gradient" and t not in early and t not in first_writer:
                first_writer[t] = i
                allocated_at[i] += tensors[t].bytes
    for op in trace.ops:
        if op.role != "backward":  # read by the optimizer
            kept.update(t for t in op.inputs if tensors[t].kind == "gradient")
    freed_at: dict[int, int] = defaultdict(int)
    for t, i in last_reader.items():
        if t not in kept:
            freed_at[i] += tensors[t].bytes
    return _GradientLives(frozenset(early), dict(allocated_at), dict(freed_at))


def _gradient_memory(trace: ModelTrace, tensors: dict[int, Tensor], stage_of: dict[int, int],
                     n: int) -> tuple[list[int], list[int], int]:
    """(y_bytes, grad_live_bytes) per node, and how many gradients are read before the stage order writes
    them (counted live from the start of the backward pass). The backward ops run in stage order, each
    allocating the gradients it writes first and then freeing those it reads last; grad_live_bytes(k) is
    what is live entering stage k, y_bytes(k) how far the stage's ops rise above that at their highest."""
    position = {op.id: n - 1 - stage_of[op.id] for op in trace.ops if op.id in stage_of}
    ordered = sorted((op for op in trace.ops if op.id in position), key=lambda op: position[op.id])
    lives = _gradient_lives(trace, ordered, tensors)
    ops_at: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(ordered):
        ops_at[position[op.id]].append(i)
    y, live = [0] * n, [0] * n
    running = sum(tensors[t].bytes for t in lives.early)
    for p in range(n):
        entering = highest = running
        for i in ops_at.get(p, ()):
            running += lives.allocated_at.get(i, 0)
            highest = max(highest, running)
            running -= lives.freed_at.get(i, 0)
        live[n - 1 - p], y[n - 1 - p] = entering, highest - entering
    return y, live, len(lives.early)


# --------------------------------------------------------------------------------------- assembly


def _constant_bytes(trace: ModelTrace) -> int:
    written = {t for op in trace.ops if op.role in ("forward", "backward") for t in op.outputs}
    return sum(t.bytes for t in trace.tensors
               if t.kind in CONSTANT_KINDS or (t.kind == "other" and t.id not in written))


def _final_outputs(trace: ModelTrace, fwd: _Forward, tensors: dict[int, Tensor]) -> tuple[int, ...]:
    finals: set[int] = set()
    mains = [d.index for d in fwd.drafts if d.role == "main"]
    if mains:
        finals.add(mains[-1])  # the loss
    for op in trace.ops:
        unpaired_backward = op.role == "backward" and op.forward_op is None
        if unpaired_backward or op.role not in ("forward", "backward"):
            finals.update(fwd.producer_at_end[t] for t in op.inputs
                          if tensors[t].kind == "activation" and t in fwd.producer_at_end)
    return tuple(sorted(finals))


def _inplace_legal(d: _Draft, users: list[list[int]], finals: tuple[int, ...]) -> bool:
    """May an out-of-place relu overwrite its input? Only if nothing after it reads that input."""
    if len(d.inputs) != 1:
        return False
    j = d.inputs[0]
    return all(u <= d.index for u in users[j]) and j not in finals


def catalog_factors(trace: ModelTrace) -> catalog.CatalogFactors:
    """The catalog's time factors: the constants of the trace's device, with the measured ones in their place
    where `mlopt profile operators` profiled this trace."""
    profiled = _source_field(trace, "operator_profile")
    checks = profiled.get("catalog_checks") if isinstance(profiled, dict) else None
    return catalog.CatalogFactors.for_device(_source_field(trace, "device")).with_checks(checks)


def _source_field(trace: ModelTrace, name: str) -> Any:
    """`trace.source[name]` ("device": "cpu", "cuda:0"; "memory_format"; "operator_profile"), None if absent."""
    return trace.source.get(name) if isinstance(trace.source, dict) else None


def _as_allocated(trace: ModelTrace) -> ModelTrace:
    """The trace with each tensor's bytes as its device's allocator counts them (catalog.allocated_bytes)."""
    device = _source_field(trace, "device")
    rounded = tuple(replace(t, bytes=catalog.allocated_bytes(t.bytes, device)) for t in trace.tensors)
    return trace if rounded == trace.tensors else replace(trace, tensors=rounded)


def build_problem(trace: ModelTrace, profile: dict | None = None, source: str = "<trace>", *,
                  profile_source: str | None = None) -> MemoryProblem:
    """The MONeT problem of one traced training step; `profile` is a parsed `--ops` document (catalog.py),
    checked here: InputError naming `profile_source` (default: `source`) and the field's JSON path."""
    profile_source = profile_source or source
    ops_profile = catalog.parse_profile(profile, profile_source) if profile is not None else {}
    trace = _as_allocated(trace)
    tensors = trace.tensor_map()
    times, defaulted = _op_times(trace, tensors)
    factors = catalog_factors(trace)
    fwd = _forward_drafts(trace, tensors, times, factors)
    drafts = fwd.drafts
    n = len(drafts)
    if n == 0:  # nothing to checkpoint; every figure of the plan would divide by zero
        raise InputError(source, "$.ops", "the trace has no forward ops to plan memory for")
    users = _forward_users(drafts)
    finals = _final_outputs(trace, fwd, tensors)
    backward_ops, transients = _with_backward_transients(trace, tensors, trace.ops_by_role("backward"))
    stage_of, unpaired = _stage_of_ops(backward_ops, fwd.node_of_op)
    stages = _stages(backward_ops, stage_of, fwd.producer_at_end)
    y_bytes, grad_live, early_grads = _gradient_memory(trace, tensors, stage_of, n)
    intermediates = {d.index for d in drafts if d.intermediate_of is not None}
    with_sides = {d.intermediate_of for d in drafts if d.role == "side"}

    unknown: dict[str, int] = {}
    dominated = 0
    nodes: list[Node] = []
    for d in drafts:
        if d.role == "main":
            if not catalog.is_known(d.name):
                unknown[d.name] = unknown.get(d.name, 0) + 1
            forward, backward, inplace_input = _main_impls(d, times, users, finals, ops_profile, with_sides,
                                                           factors, stages, intermediates, fwd.mask_of)
        else:
            forward = (catalog.mask_impl(times[d.op.id][0], factors) if d.role == "mask"
                       else ForwardImpl("default", 0.0),)
            inplace_input = None
            backward = ()
        forward, dropped_f = catalog.drop_dominated_forward(forward)
        backward, dropped_b = catalog.drop_dominated_backward(backward)
        dominated += dropped_f + dropped_b
        nodes.append(Node(index=d.index, op_id=d.op.id, name=d.name, out_bytes=d.out_bytes, inputs=d.inputs,
                          forward=forward, backward=backward, inplace_input=inplace_input,
                          intermediate_of=d.intermediate_of, y_bytes=y_bytes[d.index],
                          grad_live_bytes=grad_live[d.index]))

    warnings = _problem_warnings(trace, unknown, defaulted, early_grads, backward_ops, stage_of)
    cost_source, metadata = _cost_source_and_metadata(trace, profile, profile_source, source, defaulted, fwd,
                                                      nodes, intermediates, unpaired, dominated, unknown, factors)
    metadata["backward_transients"] = transients
    return MemoryProblem(name=trace.name, nodes=tuple(nodes), constant_bytes=_constant_bytes(trace),
                         final_outputs=finals, warnings=tuple(warnings), cost_source=cost_source,
                         metadata=metadata)


def _cost_source_and_metadata(trace: ModelTrace, profile, profile_source, source: str, defaulted: int, fwd,
                              nodes: list[Node], intermediates, unpaired: int, dominated: int,
                              unknown: dict[str, int], factors) -> tuple[str, dict[str, Any]]:
    """Where the problem's costs come from (trace, defaults, profile, catalog factors) and its metadata
    (node counts, reductions, totals)."""
    drafts = fwd.drafts
    n = len(drafts)
    measured = sum(1 for op in trace.ops if op.role in ("forward", "backward"))
    cost_source = "defaults" if measured and defaulted == measured else "trace+defaults" if defaulted else "trace"
    if profile is not None:
        cost_source += f"+profile {profile_source}"
    metadata: dict[str, Any] = {
        "source": source,
        "nodes": n,
        "main_nodes": sum(1 for d in drafts if d.role == "main"),
        "intermediate_nodes": len(intermediates),
        "relu_mask_nodes": len(fwd.mask_of),
        "side_output_nodes": sum(1 for d in drafts if d.role == "side"),
        "inplace_nodes": sum(1 for node in nodes if node.inplace_input is not None),
        "stages_with_backward": sum(1 for node in nodes if node.backward),
        "stages_with_deps": sum(1 for node in nodes if node.backward and node.backward[0].deps),
        "forward_ops_skipped": fwd.skipped_ops,
        "forward_us_folded": round(fwd.folded_us, 3),
        "backward_ops_unpaired": unpaired,
        "dominated_dropped": dominated,
        "unknown_ops": dict(sorted(unknown.items())),
        "forward_us": round(sum(node.forward[0].compute_us for node in nodes if node.intermediate_of is None), 3),
        "backward_us": round(sum(node.backward[0].compute_us for node in nodes if node.backward), 3),
        "gradient_peak_bytes": max((node.grad_live_bytes + node.y_bytes for node in nodes), default=0),
        "catalog_factors": factors.described(),
    }
    if factors.measured:
        cost_source += "+measured catalog factors"
        metadata["measured_catalog_factors"] = {name: getattr(factors, name) for name in sorted(factors.measured)}
    elif factors.constants != "generic":
        cost_source += f"+{factors.constants} catalog constants"
    return cost_source, metadata


def _main_impls(d, times, users, finals, ops_profile, with_sides, factors, stages, intermediates, mask_of):
    """(forward implementations, backward implementations, in-place input) of a main node: the traced ones
    (with folded time and side-output workspace) extended by the implementation catalog."""
    folded = d.time_us - times[d.op.id][0]
    side_bytes = d.workspace_bytes - d.op.implementations[0].workspace_bytes
    traced = tuple(ForwardImpl(impl.name, times[d.op.id][n_impl] + folded, impl.workspace_bytes + side_bytes,
                               d.inplace_input is not None)
                   for n_impl, impl in enumerate(d.op.implementations))
    legal = d.inplace_input is None and _inplace_legal(d, users, finals)
    forward = catalog.forward_impls(d.name, traced, inplace_legal=legal, out_bytes=d.out_bytes,
                                    profile=ops_profile.get(d.name),
                                    has_intermediates=d.index in with_sides, factors=factors)
    inplace_input = d.inplace_input
    if inplace_input is None and any(f.inplace for f in forward):
        inplace_input = d.inputs[0]
    backward: tuple[BackwardImpl, ...] = ()
    if d.index in stages:
        traced_b = _traced_backward(d.index, stages[d.index], times, d.inputs, intermediates)
        backward = catalog.backward_impls(d.name, traced_b, node=d.index, mask=mask_of.get(d.index),
                                          out_bytes=d.out_bytes, profile=ops_profile.get(d.name),
                                          input_node=d.inputs[0] if d.inputs else None, factors=factors)
    return forward, backward, inplace_input


def _problem_warnings(trace: ModelTrace, unknown: dict[str, int], defaulted: int, early_grads: int, backward_ops,
                      stage_of) -> list[str]:
    """What the problem leaves out or guesses: unknown op types, default costs, early gradients, backward ops
    without a stage, communication."""
    warnings: list[str] = []
    if unknown:
        listed = ", ".join(f"{name} ({count})" for name, count in sorted(unknown.items()))
        warnings.append(f"op types not in the implementation catalog, traced behaviour only: {listed}")
    if defaulted:
        warnings.append(f"{defaulted} forward/backward ops have no measured compute_us; used the default "
                        f"{DEFAULT_US_OVERHEAD} us + bytes touched / {DEFAULT_BYTES_PER_US:.0f} bytes per us")
    if early_grads:
        warnings.append(f"{early_grads} gradient tensors are read before the stage order writes them; "
                        f"counted live for the whole backward pass")
    orphans = [op.id for op in backward_ops if op.id not in stage_of]
    if orphans:
        warnings.append(f"{len(orphans)} backward ops could not be given a stage (no paired backward op) "
                        f"and are not modelled")
    for op in trace.ops:
        if op.role == "comm":
            warnings.append("communication ops are not modelled by the memory planner")
            break
    return warnings

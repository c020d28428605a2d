"""The ground-truth evaluator: execute a Schedule on a MemoryProblem, op by op, with greedy freeing.

This is Alg. 3 (forward) and Alg. 4 (backward) of the MONeT chapter exactly as the docstring of
`problem.py` states them; every other part (ILP, baselines, `mlopt validate`) is judged by it.
Decisions the docstring leaves open, made here and relied on elsewhere:

* A node is computed in the forward pass iff some forward node reads it, it is a final output, or it
  is stored; its time counts only then. "Later forward reader" means any later node listing it in its
  inputs, computed or not (a reader that is skipped only delays the free by one position).
* Greedy freeing runs after every node (computed or not): x_j stays live while a later forward node
  reads it, it is a final output, or it is stored. In a backward stage, a value stays live while a later
  recomputation of the stage reads it, it is kept (S^{k-1}), or the chosen backward implementation
  needs it (D_k^l); values of S^k needed for none of these are freed on entering the stage.
* Recomputing a value that is already live is allowed: readers of x_i have larger indices, so they run
  after its recomputation and nothing can read the old copy in the stage; the old copy is freed on entry
  and only the new one counts.
* An intermediate node (`intermediate_of = c`) may be recomputed only in a stage that also recomputes
  its creator c ("recomputed only with it"); the forward pass computes it iff it is stored.
* In-place (forward and recomputation): the overwritten value x_j must be live and read by nothing
  later (forward: no later forward reader, not stored, not a final output; recomputation: no later
  recomputation of the stage reads it, not kept, not in D_k^l). The op's extra memory is
  max(0, |x_i| - |x_j|) (0 for the builder's same-size in-place ops, as the docstring says).
* A stage whose node has no backward implementations must name impl "" and runs no backward op (no
  memory event); its recomputations and keep set still run and are checked.
* An implementation that reuses intermediates (recomputation only; a forward step naming one is an
  error) reads the node's intermediate nodes as inputs: they must be live when it runs, so they are not
  freed before it, and none of them may be recomputed in the same stage.
* compute_us = forward (computed nodes) + recompute + backward implementation times.
* forward_end_bytes = bytes of the values live after the forward pass (S^N: stored values and final
  outputs), constant_bytes excluded.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlopt.planners.memory.problem import BackwardImpl, ForwardImpl, MemoryProblem, Node
from mlopt.planners.memory.schedule import BackwardStage, Schedule


class ScheduleError(ValueError):
    """A schedule that cannot execute; the message names the stage, node, trace op id and op name."""

    def __init__(self, message: str, *, phase: str | None = None, stage: int | None = None,
                 node: int | None = None):
        super().__init__(message)
        self.phase = phase
        self.stage = stage
        self.node = node


@dataclass(frozen=True)
class MemoryEvent:
    phase: str  # forward | recompute | backward
    stage: int | None  # backward stage k (None in the forward pass)
    node: int  # the node whose op ran
    bytes: int  # memory at that op's peak


@dataclass(frozen=True)
class ReplayResult:
    peak_bytes: int
    compute_us: float
    forward_us: float
    backward_us: float
    recompute_us: float
    forward_end_bytes: int  # live value bytes after the forward pass, constant_bytes excluded
    peak_event: MemoryEvent
    timeline: tuple[MemoryEvent, ...]


@dataclass(frozen=True)
class DetailedReplay:
    """Replay plus what the heuristics need to steer: the values live at the peak."""

    result: ReplayResult
    peak_live: frozenset[int]


# --------------------------------------------------------------------------------------- messages


def value_name(problem: MemoryProblem, i: int) -> str:
    node = problem.nodes[i]
    return f"x_{i} (op {node.op_id} {node.name})"


def _where(problem: MemoryProblem, phase: str, node: int, stage: int | None, impl: str) -> str:
    n = problem.nodes[node]
    if phase == "forward":
        return f"forward node {node} (op {n.op_id} {n.name}, impl {impl!r})"
    if phase == "recompute":
        return f"backward stage {stage}: recomputation of node {node} (op {n.op_id} {n.name}, impl {impl!r})"
    return f"backward stage {stage} (op {n.op_id} backward of {n.name}, impl {impl!r})"


# --------------------------------------------------------------------------------------- structure


def _check_structure(problem: MemoryProblem, schedule: Schedule) -> None:
    """Every node once, forward in increasing and backward in decreasing order."""
    n = problem.n
    if len(schedule.forward) != n:
        raise ScheduleError(f"schedule has {len(schedule.forward)} forward steps, the problem has {n} nodes",
                            phase="forward")
    for position, step in enumerate(schedule.forward):
        if step.node != position:
            raise ScheduleError(f"forward step {position} is node {step.node}, expected node {position}",
                                phase="forward", node=step.node)
    if len(schedule.backward) != n:
        raise ScheduleError(f"schedule has {len(schedule.backward)} backward stages, the problem has {n} nodes",
                            phase="backward")
    for position, stage in enumerate(schedule.backward):
        expected = n - 1 - position
        if stage.node != expected:
            raise ScheduleError(f"backward stage {position} (in execution order) is node {stage.node}, "
                                f"expected node {expected}", phase="backward", stage=stage.node)
    for i in problem.final_outputs:
        if not 0 <= i < n:
            raise ScheduleError(f"final output {i} is not a node", phase="forward")


def _forward_impl(problem: MemoryProblem, node: Node, name: str, phase: str, stage: int | None) -> ForwardImpl:
    for impl in node.forward:
        if impl.name == name:
            return impl
    known = ", ".join(repr(f.name) for f in node.forward)
    raise ScheduleError(f"{_where(problem, phase, node.index, stage, name)}: no such implementation "
                        f"(known: {known})", phase=phase, stage=stage, node=node.index)


def _backward_impl(problem: MemoryProblem, node: Node, name: str) -> BackwardImpl | None:
    if not node.backward:
        if name:
            raise ScheduleError(f"{_where(problem, 'backward', node.index, node.index, name)}: the node has no "
                                f"backward work, its stage's impl must be \"\"", phase="backward",
                                stage=node.index, node=node.index)
        return None
    for impl in node.backward:
        if impl.name == name:
            return impl
    known = ", ".join(repr(b.name) for b in node.backward)
    raise ScheduleError(f"{_where(problem, 'backward', node.index, node.index, name)}: no such implementation "
                        f"(known: {known})", phase="backward", stage=node.index, node=node.index)


# --------------------------------------------------------------------------------------- the run


class _Memory:
    """Live values and the running peak; the one mutable thing, local to one replay."""

    def __init__(self, constant_bytes: int):
        self.constant_bytes = constant_bytes
        self.live: dict[int, int] = {}  # node -> bytes of x_node
        self.live_bytes = 0
        self.events: list[MemoryEvent] = []
        self.peak: MemoryEvent | None = None
        self.peak_live: frozenset[int] = frozenset()

    def add(self, i: int, nbytes: int) -> None:
        self.live[i] = nbytes
        self.live_bytes += nbytes

    def drop(self, i: int) -> None:
        self.live_bytes -= self.live.pop(i)

    def retain(self, wanted) -> None:
        for v in [v for v in self.live if not wanted(v)]:
            self.drop(v)

    def event(self, phase: str, stage: int | None, node: int, extra_bytes: int) -> None:
        ev = MemoryEvent(phase, stage, node, self.constant_bytes + self.live_bytes + extra_bytes)
        self.events.append(ev)
        if self.peak is None or ev.bytes > self.peak.bytes:
            self.peak = ev
            self.peak_live = frozenset(self.live)


def _run_forward(problem: MemoryProblem, schedule: Schedule, mem: _Memory) -> float:
    users = problem.forward_users()
    last_reader = [max(u) if u else -1 for u in users]
    finals = set(problem.final_outputs)
    stored = [step.store for step in schedule.forward]
    total_us = 0.0
    for node, step in zip(problem.nodes, schedule.forward):
        i = node.index
        impl = _forward_impl(problem, node, step.impl, "forward", None)
        if impl.reuses_intermediates:
            raise ScheduleError(f"{_where(problem, 'forward', i, None, impl.name)}: reuses intermediates that "
                                f"only the forward pass produces: an implementation for recomputation only",
                                phase="forward", node=i)
        if users[i] or i in finals or step.store:
            for j in node.inputs:
                if j not in mem.live:
                    raise ScheduleError(f"{_where(problem, 'forward', i, None, impl.name)}: needs "
                                        f"{value_name(problem, j)} which is not live", phase="forward", node=i)
            extra = node.out_bytes
            if impl.inplace:
                j = _inplace_target(problem, node, impl, "forward", None, mem)
                why = ("it is read by a later forward node" if last_reader[j] > i else
                       "it is stored" if stored[j] else "it is a final output" if j in finals else "")
                if why:
                    raise ScheduleError(f"{_where(problem, 'forward', i, None, impl.name)}: cannot overwrite "
                                        f"{value_name(problem, j)} in place: {why}", phase="forward", node=i)
                extra = max(0, node.out_bytes - mem.live[j])
            mem.event("forward", None, i, extra + impl.workspace_bytes)
            total_us += impl.compute_us
            if impl.inplace:
                mem.drop(node.inplace_input)
            mem.add(i, node.out_bytes)
        mem.retain(lambda v: last_reader[v] > i or v in finals or stored[v])
    return total_us


def _inplace_target(problem: MemoryProblem, node: Node, impl: ForwardImpl, phase: str, stage: int | None,
                    mem: _Memory) -> int:
    j = node.inplace_input
    if j is None:
        raise ScheduleError(f"{_where(problem, phase, node.index, stage, impl.name)}: in-place implementation "
                            f"on a node with no inplace_input", phase=phase, stage=stage, node=node.index)
    if j not in mem.live:
        raise ScheduleError(f"{_where(problem, phase, node.index, stage, impl.name)}: overwrites "
                            f"{value_name(problem, j)} which is not live", phase=phase, stage=stage, node=node.index)
    return j


def _check_stage_lists(problem: MemoryProblem, stage: BackwardStage) -> None:
    k = stage.node
    previous = -1
    for i, _ in stage.recompute:
        if not isinstance(i, int) or not 0 <= i < problem.n or i <= previous:
            raise ScheduleError(f"backward stage {k}: recomputations must be distinct node indices in increasing "
                                f"order, found {i} after {previous}", phase="recompute", stage=k)
        previous = i
    previous = -1
    for v in stage.keep:
        if not isinstance(v, int) or not 0 <= v < problem.n or v <= previous:
            raise ScheduleError(f"backward stage {k}: keep must list distinct node indices in increasing order, "
                                f"found {v} after {previous}", phase="backward", stage=k)
        previous = v


def _recompute_reads(problem: MemoryProblem, node: Node, impl: ForwardImpl) -> tuple[int, ...]:
    """The values a recomputation of `node` with `impl` reads: its inputs, and its intermediates when the
    implementation reuses them."""
    if not impl.reuses_intermediates:
        return node.inputs
    return (*node.inputs, *problem.intermediates_of(node.index))


def _run_stage(problem: MemoryProblem, stage: BackwardStage, mem: _Memory) -> tuple[float, float]:
    """One backward stage; returns (recompute_us, backward_us)."""
    k = stage.node
    node = problem.nodes[k]
    _check_stage_lists(problem, stage)
    bimpl = _backward_impl(problem, node, stage.impl)
    deps = set(bimpl.deps) if bimpl else set()
    keep = set(stage.keep)
    recs = [(problem.nodes[i], _forward_impl(problem, problem.nodes[i], name, "recompute", k))
            for i, name in stage.recompute]
    recomputed = {n.index for n, _ in recs}
    reads = [_recompute_reads(problem, n, impl) for n, impl in recs]
    last_read: dict[int, int] = {}  # value -> last position in this stage's recomputations that reads it
    for position, read in enumerate(reads):
        for j in read:
            last_read[j] = position

    def needed_after(v: int, position: int) -> bool:
        return last_read.get(v, -1) > position or v in keep or v in deps

    # Old copies of recomputed values and values needed for nothing in this stage go first.
    mem.retain(lambda v: v not in recomputed and needed_after(v, -1))
    grad_bytes = node.grad_live_bytes
    recompute_us = 0.0
    for position, (n, impl) in enumerate(recs):
        i = n.index
        if n.intermediate_of is not None and n.intermediate_of not in recomputed:
            raise ScheduleError(f"{_where(problem, 'recompute', i, k, impl.name)}: an intermediate of "
                                f"{value_name(problem, n.intermediate_of)} is recomputed only together with it",
                                phase="recompute", stage=k, node=i)
        if impl.reuses_intermediates:
            again = [m for m in reads[position] if m not in n.inputs and m in recomputed]
            if again:
                raise ScheduleError(f"{_where(problem, 'recompute', i, k, impl.name)}: reuses "
                                    f"{value_name(problem, again[0])}, which the stage also recomputes",
                                    phase="recompute", stage=k, node=i)
        for j in reads[position]:
            if j not in mem.live:
                raise ScheduleError(f"{_where(problem, 'recompute', i, k, impl.name)}: needs "
                                    f"{value_name(problem, j)} which is not live", phase="recompute", stage=k, node=i)
        extra = n.out_bytes
        if impl.inplace:
            j = _inplace_target(problem, n, impl, "recompute", k, mem)
            if needed_after(j, position):
                why = ("it is kept" if j in keep else "the backward op needs it" if j in deps else
                       "a later recomputation reads it")
                raise ScheduleError(f"{_where(problem, 'recompute', i, k, impl.name)}: cannot overwrite "
                                    f"{value_name(problem, j)} in place: {why}", phase="recompute", stage=k, node=i)
            extra = max(0, n.out_bytes - mem.live[j])
        mem.event("recompute", k, i, grad_bytes + extra + impl.workspace_bytes)
        recompute_us += impl.compute_us
        if impl.inplace:
            mem.drop(n.inplace_input)
        mem.add(i, n.out_bytes)
        mem.retain(lambda v, p=position: needed_after(v, p))
    for v in stage.keep:
        if v not in mem.live:
            raise ScheduleError(f"backward stage {k} (op {node.op_id} backward of {node.name}): keeps "
                                f"{value_name(problem, v)} which is not live in the stage (4.7)",
                                phase="backward", stage=k, node=k)
    backward_us = 0.0
    if bimpl is not None:
        for d in bimpl.deps:
            if d not in mem.live:
                raise ScheduleError(f"{_where(problem, 'backward', k, k, bimpl.name)}: needs "
                                    f"{value_name(problem, d)} which is not live", phase="backward", stage=k, node=k)
        mem.event("backward", k, k, grad_bytes + node.y_bytes + bimpl.workspace_bytes)
        backward_us = bimpl.compute_us
    mem.retain(lambda v: v in keep)
    return recompute_us, backward_us


def replay_detailed(problem: MemoryProblem, schedule: Schedule) -> DetailedReplay:
    _check_structure(problem, schedule)
    mem = _Memory(problem.constant_bytes)
    forward_us = _run_forward(problem, schedule, mem)
    forward_end_bytes = mem.live_bytes
    recompute_us = backward_us = 0.0
    for stage in schedule.backward:
        r_us, b_us = _run_stage(problem, stage, mem)
        recompute_us += r_us
        backward_us += b_us
    peak = mem.peak or MemoryEvent("forward", None, 0, problem.constant_bytes)
    result = ReplayResult(
        peak_bytes=peak.bytes,
        compute_us=forward_us + recompute_us + backward_us,
        forward_us=forward_us,
        backward_us=backward_us,
        recompute_us=recompute_us,
        forward_end_bytes=forward_end_bytes,
        peak_event=peak,
        timeline=tuple(mem.events),
    )
    return DetailedReplay(result, mem.peak_live)


def replay(problem: MemoryProblem, schedule: Schedule) -> ReplayResult:
    """Execute `schedule`; ScheduleError (a ValueError) names the first op that cannot run."""
    return replay_detailed(problem, schedule).result

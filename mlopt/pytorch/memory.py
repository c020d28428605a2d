"""Run a memory plan in eager PyTorch, and measure what a training step really allocates.

    from mlopt.pytorch.memory import apply_memory_plan, measure_step

    executor = apply_memory_plan(model, problem, schedule, trace=trace)
    with executor:                      # forward AND loss: the trace's forward includes the loss
        loss = loss_fn(model(inputs), targets)
    loss.backward()                     # recomputations happen here, stage by stage
    print(executor.fallbacks)           # plan choices this runtime cannot apply per operator, run as default

The executor works at the aten level for any nn.Module whose step `mlopt.pytorch.trace` traced
(same model, batch shape and loss, model in the same train/eval mode; targets made outside the
context). It is a context manager rather than a wrapping module because the traced forward pass
includes the loss, so the loss must run under the plan too. How it works: mlopt.pytorch.memory_engine.

Applied: s^N (what autograd's saved tensors keep after the forward pass: only the plan's stored
values, everything else is dropped and recomputed); r^k with its implementations, in the plan's order,
in place where the plan says so (relu_, add_) and out of place otherwise; the keep sets S^{k-1} (with
the replay's greedy freeing inside a stage); ReLU backward "intermediate-activated" from a 1-byte bool
sign mask. Random ops the plan recomputes (dropout's bernoulli_) run again under the RNG state they
first ran with: identical masks (5056 bytes of RNG state kept per such op on CPU, which the plan does not
count; ops called with a dropout probability of 0 draw nothing and keep none).

Falls back to the default, and says so in `executor.fallbacks`: operator implementations from a profile
or an --ops document (convolution algorithms, memory formats such as CPU channels-last, workspace
variants), which this runtime does not switch per operator (PyTorch offers some of them only as global
switches or as the model's own memory format), and an in-place forward of an op PyTorch has no in-place
overload for. An in-place forward of an op the model's code calls out of place (nn.ReLU(), F.relu) runs as
its in-place overload (relu_) below autograd. The reverse (the plan wants the out-of-place forward of an
op the model runs in place, because its input is stored) is honoured by copying the stored input first,
which costs what out of place costs; it is listed in `executor.notes`.

`measure_step` runs one training step (optionally under an executor) under torch.profiler with
profile_memory=True and adds up the allocator's [memory] events in time order: `forward_end_bytes` is
what is still allocated when the loss has been computed, relative to just before the forward pass
(the activation memory kept for backward, comparable to ReplayResult.forward_end_bytes), `peak_bytes`
the step's high-water mark above that level (comparable to ReplayResult.peak_bytes - constant_bytes;
CPU backward kernels' temporaries, e.g. native_batch_norm_backward's input-sized one, are not in traces:
the problem charges them as their stage's workspace, measured by `mlopt profile operators` or from the
catalog, catalog.backward_transient_bytes).

`load_memory_plan(path, model, trace=TRACE)` does what `mlopt validate` does with a plan file and its trace
(rebuild the problem, check the plan is the trace's, replay it) and returns `apply_memory_plan`'s executor.
"""

from __future__ import annotations

import gc
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from mlopt.errors import InputError
from mlopt.formats.io import sha256_file
from mlopt.formats.loaders import load_trace_any
from mlopt.formats.plan import load_plan
from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.memory.schedule import Schedule
from mlopt.planners.memory.validate import replay_plan
from mlopt.pytorch.memory_engine import PlanExecutor, PlanMismatchError

__all__ = ["PlanExecutor", "PlanMismatchError", "StepMeasure", "apply_memory_plan", "load_memory_plan",
           "measure_step", "memory_timeline"]

_MARKERS = ("mlopt::step_begin", "mlopt::forward_end", "mlopt::step_end")


def apply_memory_plan(model: nn.Module, problem: MemoryProblem, schedule: Schedule, *, trace: Any = None,
                      label: str | None = None) -> PlanExecutor:
    """An executor of `schedule` for `model`; enter it around each step's forward pass and loss.

    `trace` (the ModelTrace the problem was built from) is optional but recommended: with it every
    forward op is checked against the trace (name and output bytes, so another batch size is caught too);
    without it, the ops that write activations are matched to the problem's nodes by name. Raises
    PlanMismatchError (an InputError) during the forward pass when the model does not run the plan's ops.
    """
    return PlanExecutor(model, problem, schedule, trace=trace, label=label)


def load_memory_plan(path: str | os.PathLike, model: nn.Module, *, trace: str | os.PathLike) -> PlanExecutor:
    """The executor of the memory plan file `path` (from `mlopt plan memory`) for `model`.

    `trace` is the trace file the plan was made from: the problem and schedule are rebuilt from it exactly
    as `mlopt validate PLAN --model TRACE` does (same operator profile, same checks, the schedule replayed),
    so a plan that validates is the plan that runs. Raises InputError (one line, naming `path`) for a file
    that is not a memory plan, a plan made from another trace (its recorded trace hash differs), or a
    schedule that does not replay on this trace.
    """
    source = str(path)
    plan = load_plan(path)
    if plan.kind != "memory":
        raise InputError(source, "$.kind", f"is {plan.kind!r}, load_memory_plan reads memory plans")
    made_for = plan.provenance.get("inputs", {}).get("model")
    if made_for is not None and made_for != sha256_file(trace):
        raise InputError(source, "$.provenance.inputs.model", f"the plan was made from another trace than {trace}")
    problem, schedule, _ = replay_plan(plan, source, str(trace))
    return apply_memory_plan(model, problem, schedule, trace=load_trace_any(str(trace)), label=source)


@dataclass
class StepMeasure:
    grads: dict[str, torch.Tensor]  # parameter name -> gradient (a copy)
    loss: float
    forward_end_bytes: int  # allocated at the end of the forward pass (after the loss) minus before it
    peak_bytes: int  # the step's allocator peak minus the level before it
    fallbacks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recomputed: int = 0  # node recomputations during the backward pass
    end_bytes: int = 0  # allocated after the backward pass (the gradients, mostly) minus before the step


def memory_timeline(prof: Any) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """([(time_ns, bytes delta)] of the profile's allocator events in time order, {marker: time_ns})."""
    events = prof.profiler.kineto_results.events()
    deltas = sorted(((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"), key=lambda x: x[0])
    markers = {e.name(): e.start_ns() for e in events if e.name() in _MARKERS}
    return deltas, markers


def _level(deltas: list[tuple[int, int]], until_ns: int) -> int:
    return sum(b for t, b in deltas if t < until_ns)


def measure_step(model: nn.Module, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                 plan: PlanExecutor | None = None) -> StepMeasure:
    """One forward + loss + backward (no optimizer step), gradients set to None first, under the profiler.

    `plan`: an executor from `apply_memory_plan`, or None for plain PyTorch."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function(_MARKERS[0]):
            pass
        with plan if plan is not None else nullcontext():
            loss = loss_fn(model(inputs), targets)
        with record_function(_MARKERS[1]):
            pass
        loss.backward()
        loss_value = float(loss.detach())
        del loss
        with record_function(_MARKERS[2]):
            pass
    deltas, markers = memory_timeline(prof)
    if set(markers) != set(_MARKERS):
        raise RuntimeError(f"profiler markers missing: {sorted(set(_MARKERS) - set(markers))}")
    begin = _level(deltas, markers[_MARKERS[0]])
    level, peak = 0, 0
    for t, b in deltas:
        if markers[_MARKERS[0]] <= t < markers[_MARKERS[2]]:
            level += b
            peak = max(peak, level)
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return StepMeasure(
        grads=grads,
        loss=loss_value,
        forward_end_bytes=_level(deltas, markers[_MARKERS[1]]) - begin,
        peak_bytes=peak,
        fallbacks=list(plan.fallbacks) if plan is not None else [],
        notes=list(plan.notes) if plan is not None else [],
        recomputed=len(plan.recomputed) if plan is not None else 0,
        end_bytes=_level(deltas, markers[_MARKERS[2]]) - begin,
    )

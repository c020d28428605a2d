"""LIBRA's layers from a trace: compute time b_i and gradient bytes c_i per layer, in backward order.

A layer ends where a gradient becomes ready: at a backward op whose forward op read parameters (the
gradient of those parameters is its output). Its compute b_i is that op's time plus every backward op since
the previous layer ended (activation gradients, element-wise backward ops), since they run before this
gradient can exist. Backward ops after the last gradient form a last layer with no gradient bytes (compute the
final stage still has to wait for). Each parameter is counted once, at the first backward op (in backward
order) whose forward op read it: a weight read by a transpose and then used elsewhere is one gradient.
"""

from __future__ import annotations

from mlopt.errors import InputError
from mlopt.formats.trace import ModelTrace


def layers_from_trace(trace: ModelTrace, source: str) -> list[tuple[str, float, int]]:
    """(name, compute_us, grad_bytes) per layer in backward order; InputError for an op without a time or a
    trace without backward ops or parameter gradients."""
    return [layer[:3] for layer in _layers(trace, source)]


def layer_end_ops(trace: ModelTrace, source: str) -> list[int | None]:
    """Per layer (as layers_from_trace), the id of the backward op after which its gradient exists (None for
    the last layer without gradient bytes)."""
    return [layer[3] for layer in _layers(trace, source)]


def _layers(trace: ModelTrace, source: str) -> list[tuple[str, float, int, int | None]]:
    tensors = {t.id: t for t in trace.tensors}
    ops = {op.id: op for op in trace.ops}
    counted: set[int] = set()  # parameter tensor ids whose gradient is already in a layer
    layers: list[tuple[str, float, int, int | None]] = []
    pending_us = 0.0
    for index, op in enumerate(trace.ops):
        if op.role != "backward":
            continue
        if op.compute_us is None:
            raise InputError(source, f"$.ops[{index}].implementations[0].compute_us",
                             f"backward op {op.id} ({op.name}) has no measured compute time")
        pending_us += op.compute_us
        forward = ops.get(op.forward_op) if op.forward_op is not None else None
        if forward is None:
            continue
        params = [t for t in dict.fromkeys(forward.inputs)
                  if t in tensors and tensors[t].kind == "parameter" and t not in counted]
        grad_bytes = sum(tensors[t].bytes for t in params)
        if grad_bytes <= 0:
            continue
        counted.update(params)
        layers.append((f"{forward.name}#{forward.id}", pending_us, grad_bytes, op.id))
        pending_us = 0.0
    if not layers:
        what = "backward ops" if not any(op.role == "backward" for op in trace.ops) else "parameter gradients"
        raise InputError(source, "$.ops", f"the trace has no {what}: nothing to all-reduce")
    if pending_us > 0:
        layers.append(("after the last gradient", pending_us, 0, None))
    return layers

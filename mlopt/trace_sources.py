"""Where a model trace comes from: an Execution Trace file to import, or a PyTorch model to trace.

An application-layer helper of `mlopt trace` (tests/test_layers.py): it reaches both the formats' importers and
the PyTorch tracer (mlopt.pytorch.trace), which the formats layer must not import."""

from __future__ import annotations

import os
from typing import Callable

from mlopt.errors import InputError
from mlopt.formats.importers.pytorch_et import import_pytorch_et
from mlopt.formats.trace import ModelTrace


def parse_shape(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError("--input-shape", "$", f"expected positive integers like 3,224,224, found {text!r}")
    return tuple(int(p) for p in parts)


def make_trace(source: str, *, kineto: str | None = None, rank: int | None = None, step_scope: str | None = None, batch: int = 32,
               input_shape: str | None = None, optimizer: str = "sgd", repeats: int = 3, seed: int = 0,
               name: str | None = None, memory_format: str = "contiguous",
               progress: Callable[[str], None] | None = None) -> ModelTrace:
    """Import `source` if it is a file, else trace it as a `module:callable` model spec."""
    if os.path.exists(source):
        if memory_format != "contiguous":
            raise InputError(source, "memory_format",
                             "--channels-last applies to model tracing, not to Execution Trace files")

        return import_pytorch_et(source, kineto, name=name, step_scope=step_scope, rank=rank)
    if kineto or rank is not None:
        raise InputError(source, "$", "no such file (--kineto and --rank apply to Execution Trace files)")
    if ":" not in source:
        raise InputError(source, "$", "no such file, and not a model spec like torchvision:resnet50")
    try:
        # lazy: mlopt.pytorch needs torch, an optional dependency (the torch extra)
        from mlopt.pytorch.trace import trace_model_spec
    except ImportError as exc:
        raise InputError(source, "model", f"tracing a model needs PyTorch: pip install 'mlopt[torch]' ({exc})") from None
    shape = parse_shape(input_shape) if input_shape else None
    return trace_model_spec(source, batch=batch, input_shape=shape, optimizer=optimizer, repeats=repeats,
                            seed=seed, name=name, memory_format=memory_format, progress=progress)

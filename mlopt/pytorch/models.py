"""Resolving model specs (`module:callable`, `path/to/file.py:callable`) to `torch.nn.Module`s.

Spec forms:

* `torchvision:NAME` is shorthand for `torchvision.models:NAME` (e.g. `torchvision:resnet18`);
* `package.module:callable` for any importable module (`mypkg.models:build`, `torchvision.models:vgg11`);
* `path/to/file.py:callable` loads that file (relative paths are taken from the working directory).

The callable may be a dotted attribute path (`mymod:Zoo.small`) and gets the keyword arguments given to
`resolve_model`; it must return an `nn.Module` (an `nn.Module` instance named directly is used as is).
torchvision classification models default to input shape (3, 224, 224); other models need one given.

torchvision shim: the pinned torchvision wheel may be built for another torch (e.g. a CUDA wheel next to
the CPU torch). Its compiled ops then fail to load, and `import torchvision` dies in
`torchvision/_meta_registrations.py`, which registers fake kernels for `torchvision::nms`/`qnms` without
checking that the ops exist ("operator torchvision::nms does not exist"). Only when the plain import fails
with that error do we declare those two op schemas in a `torch.library.Library` fragment and import again:
the pure-Python model zoo then works, nms itself has no kernel. The Library unregisters its definitions
when garbage-collected, so its handle lives in the returned `ModelContext`, which callers keep alive
while they use the model. `prepare_torchvision` is the public form for a training script: it keeps the
handle for the life of the process (the one module-level state here), so that a later plain
`import torchvision` works.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from mlopt.errors import InputError

TORCHVISION_IMAGE_SHAPE = (3, 224, 224)
# Schemas of the ops torchvision's meta registrations expect to exist (torchvision/csrc/ops/nms.cpp).
_TORCHVISION_SHIM_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


@dataclass
class ModelContext:
    """What must stay alive while a resolved model is used."""

    spec: str
    module_name: str  # the module the callable came from, as imported
    callable_name: str
    torchvision_shim: Any = None  # torch.library.Library declaring torchvision::nms/qnms, when needed
    notes: list[str] = field(default_factory=list)


def split_spec(spec: str) -> tuple[str, str]:
    """`module:callable` -> (module, callable); the last colon splits, so `C:\\x.py:f` works too."""
    module_part, sep, callable_part = spec.rpartition(":")
    if not sep or not module_part or not callable_part:
        raise InputError(spec, "model", "expected 'module:callable' or 'path/to/file.py:callable'")
    if module_part == "torchvision":
        module_part = "torchvision.models"
    return module_part, callable_part


def is_file_spec(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def _is_missing_torchvision_op(error: BaseException) -> bool:
    text = str(error)
    return "torchvision::" in text and "does not exist" in text


def _torchvision_op_declared(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def _declare_torchvision_ops() -> Any:
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _TORCHVISION_SHIM_SCHEMAS:
        library.define(schema)
    return library


def import_torchvision() -> tuple[ModuleType, Any]:
    """Import torchvision, with the nms/qnms shim only if the plain import needs it.

    Returns (torchvision module, shim handle or None); keep the handle alive while torchvision is used.
    Raises ImportError/RuntimeError when torchvision cannot be imported even with the shim.
    """
    imported = sys.modules.get("torchvision")
    if imported is not None:
        # Imported earlier through a shim whose handle has since been collected: declare the ops again
        # for this caller, so the model zoo is never used with torchvision's registrations dangling.
        if imported.extension._has_ops() or _torchvision_op_declared("nms"):
            return imported, None
        return imported, _declare_torchvision_ops()
    try:
        return importlib.import_module("torchvision"), None
    except RuntimeError as error:
        if not _is_missing_torchvision_op(error):
            raise
        first_error = error
    # The wheel's compiled ops do not match this torch; see the module docstring.
    shim = _declare_torchvision_ops()
    # Python already dropped the half-imported modules that raised, so this re-runs them with the ops declared.
    module = importlib.import_module("torchvision")
    warnings.warn(
        f"torchvision's compiled ops do not load with torch {torch.__version__} ({first_error}); declared "
        "the torchvision::nms/qnms schemas so its pure-Python model zoo imports (nms itself will not run)",
        RuntimeWarning,
        stacklevel=2,
    )
    return module, shim


# Shims `prepare_torchvision` made: torchvision's registrations must outlive every use in the process.
_PROCESS_SHIMS: list[Any] = []


def prepare_torchvision() -> ModuleType:
    """Make torchvision importable in this process and return it; call it before `import torchvision`.

        import mlopt.pytorch
        torchvision = mlopt.pytorch.prepare_torchvision()   # or: prepare_torchvision(); import torchvision
        model = torchvision.models.resnet18()

    Needed where the installed torchvision wheel was built for another torch (pip gives the CPU torch of
    mlopt's `torch` extra a CUDA torchvision): its compiled ops do not load and a plain `import torchvision`
    fails with "operator torchvision::nms does not exist". The model zoo, transforms and datasets are pure
    Python and work; `torchvision.ops.nms` has no kernel then. Where the wheel matches torch, this is a plain
    import. Raises the import's error when torchvision cannot be imported even so.
    """
    module, shim = import_torchvision()
    if shim is not None:
        _PROCESS_SHIMS.append(shim)
    return module


def _import_named_module(spec: str, module_name: str, context: ModelContext) -> ModuleType:
    if module_name == "torchvision" or module_name.startswith("torchvision."):
        try:
            _, context.torchvision_shim = import_torchvision()
        except Exception as error:  # noqa: BLE001 - any import failure is reported as bad input
            raise InputError(spec, "model", f"cannot import torchvision: {type(error).__name__}: {error}") from error
        if context.torchvision_shim is not None:
            context.notes.append("torchvision imported with the nms/qnms schema shim")
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise InputError(spec, "model", f"cannot import module '{module_name}': {error}") from error
    except Exception as error:  # noqa: BLE001 - the user's module failed while importing
        raise InputError(spec, "model", f"importing '{module_name}' failed: {type(error).__name__}: {error}") from error


def _load_file_module(spec: str, path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise InputError(spec, "model", f"no such model file '{path}'")
    absolute = os.path.abspath(path)
    # A private, path-derived module name: two files with the same stem must not replace each other.
    digest = hashlib.sha1(absolute.encode()).hexdigest()[:10]
    name = f"_mlopt_model_{os.path.splitext(os.path.basename(absolute))[0]}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, absolute)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(spec, "model", f"cannot load '{path}' as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and pickling look classes up by module name
    try:
        loader_spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - the user's file failed while importing
        del sys.modules[name]
        raise InputError(spec, "model", f"loading '{path}' failed: {type(error).__name__}: {error}") from error
    return module


def _lookup_attribute(spec: str, module: ModuleType, label: str, dotted: str) -> Any:
    value: Any = module
    for part in dotted.split("."):
        if not hasattr(value, part):
            raise InputError(spec, "model", f"{label} has no callable '{dotted}'")
        value = getattr(value, part)
    return value


def _build_module(spec: str, target: Any, callable_name: str, kwargs: dict[str, Any]) -> nn.Module:
    if isinstance(target, nn.Module):
        if kwargs:
            raise InputError(spec, "model", f"'{callable_name}' is a module instance; it takes no arguments")
        return target
    if not callable(target):
        raise InputError(spec, "model", f"'{callable_name}' is a {type(target).__name__}, not a callable")
    try:
        model = target(**kwargs)
    except Exception as error:  # noqa: BLE001 - the user's builder failed (bad kwargs, missing weights...)
        raise InputError(spec, "model", f"calling '{callable_name}' failed: {type(error).__name__}: {error}") from error
    if not isinstance(model, nn.Module):
        raise InputError(
            spec, "model", f"'{callable_name}' returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def default_input_shape(module_name: str, callable_name: str) -> tuple[int, ...] | None:
    """(3, 224, 224) for torchvision's classification builders (the top-level `torchvision.models`
    namespace); None for everything else (detection, video, user models), which need an explicit shape."""
    if module_name != "torchvision.models":
        return None
    models = sys.modules.get("torchvision.models")
    if models is None:
        return None
    return TORCHVISION_IMAGE_SHAPE if callable_name in models.list_models(module=models) else None


def resolve_model(spec: str, **kwargs: Any) -> tuple[nn.Module, tuple[int, ...] | None, ModelContext]:
    """Build the model a spec names.

    Returns (model, default input shape without the batch dimension or None, context); keep the context
    alive while the model is used (it may hold the torchvision shim). Raises InputError(spec, "model", ...)
    for unknown modules/callables and callables that do not return an nn.Module.
    """
    module_part, callable_name = split_spec(spec)
    context = ModelContext(spec, module_part, callable_name)
    if is_file_spec(module_part):
        module = _load_file_module(spec, module_part)
        label = f"'{module_part}'"
    else:
        module = _import_named_module(spec, module_part, context)
        label = "torchvision" if spec.split(":", 1)[0] == "torchvision" else f"module '{module_part}'"
    target = _lookup_attribute(spec, module, label, callable_name)
    model = _build_module(spec, target, callable_name, kwargs)
    shape = None if is_file_spec(module_part) else default_input_shape(module_part, callable_name)
    return model, shape, context

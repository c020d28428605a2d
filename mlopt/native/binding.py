"""ctypes binding of the mlopt runtime library (runtime/include/mlopt/mlopt.h, libmlopt_runtime.so).

Where the library comes from, first match wins:

1. the environment variable MLOPT_RUNTIME_LIB (a path to the .so: a cmake build of runtime/, a sanitizer build);
2. mlopt/native/_lib/libmlopt_runtime.so, which `pip install -e .` / `pip install .` build with cmake.

Without either, every entry point raises RuntimeLibraryNotFound saying how to build it. The library is
checked once per path: its major version must equal the one this binding was written for.

    plan = Plan.load("ring.xml")                    # RuntimeLibraryError(status, message, line, ...) on bad files
    with LocalComm(plan.program_info["ngpus"]) as comm:
        outputs, stats = comm.run(plan, inputs)     # inputs: one numpy array / CPU torch tensor per rank

Buffers follow the executor's layout (mlopt/sim/symbolic.py, "Chunks per rank" and "In place"): every rank's
input has `count` elements, every output `plan.output_count(count)`; `in_place=True` gives each rank one buffer
holding both, the input copied into its window before the run and the outputs returned as views of theirs.

One process per rank (0.4): `ProcessComm(rank, nranks, store=...)` (a torch.distributed Store or anything with its
set/get/wait) or `ProcessComm(rank, nranks, address="host:port")` (the library's own TCP rendezvous), then
`comm.run(plan, input)` in every process, the same runs in the same order:

    with ProcessComm(rank, world, store=store) as comm:
        output, stats = comm.run(plan, my_input)
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from mlopt.errors import MloptError

LIBRARY_ENV = "MLOPT_RUNTIME_LIB"
LIBRARY_NAME = "libmlopt_runtime.so"
BUNDLED_LIBRARY = Path(__file__).resolve().parent / "_lib" / LIBRARY_NAME
BUILD_ERROR_NOTE = BUNDLED_LIBRARY.parent / "build-error.txt"  # written by setup.py when cmake failed

# The C ABI version this binding declares (MLOPT_VERSION_MAJOR/MINOR in mlopt.h): a library of another major
# version may have other struct layouts or signatures, so calling it could corrupt memory. Before 1.0 a minor
# version may change layouts too (0.2 put struct_size first in mlopt_program_info and mlopt_run_stats), so
# major 0 must match the minor as well (0.3 added the enforcer, 0.4 multi-process communicators).
EXPECTED_VERSION_MAJOR = 0
EXPECTED_VERSION_MINOR = 4

STATUS_NAMES = {
    0: "MLOPT_OK",
    1: "MLOPT_ERR_INVALID_ARGUMENT",
    2: "MLOPT_ERR_IO",
    3: "MLOPT_ERR_PARSE",
    4: "MLOPT_ERR_SCHEMA",
    5: "MLOPT_ERR_SEMANTIC",
    6: "MLOPT_ERR_MISMATCH",
    7: "MLOPT_ERR_DEADLOCK",
    8: "MLOPT_ERR_UNSUPPORTED",
    9: "MLOPT_ERR_NO_MEMORY",
    10: "MLOPT_ERR_INTERNAL",
}
# Statuses caused by what the user handed in (a file, a size, a dtype): the CLI's exit code 2. A deadlock,
# running out of memory or an internal error is a failure of the run itself: exit code 1.
INPUT_STATUSES = frozenset({"MLOPT_ERR_INVALID_ARGUMENT", "MLOPT_ERR_IO", "MLOPT_ERR_PARSE", "MLOPT_ERR_SCHEMA",
                            "MLOPT_ERR_SEMANTIC", "MLOPT_ERR_MISMATCH", "MLOPT_ERR_UNSUPPORTED"})

PLAN_KINDS = {1: "msccl-xml", 2: "json"}
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
BACKEND_CPU = 0
BACKEND_CUDA = 1
BACKENDS = {"cpu": BACKEND_CPU, "cuda": BACKEND_CUDA}
TRANSPORTS = {"auto": 0, "shm": 1, "tcp": 2}  # mlopt_transport

_log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ errors


class RuntimeLibraryError(MloptError):
    """A failure reported by the library through an mlopt_error: its status and one-line message (naming the
    file and the field), and where in the input when the library knows (line/column 1-based, 0 = unknown;
    offset in bytes, -1 = unknown)."""

    def __init__(self, status: int, message: str, line: int = 0, column: int = 0, offset: int = -1,
                 status_text: str = ""):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"MLOPT_STATUS_{status}")
        self.status_text = status_text
        self.message = message
        self.line = line
        self.column = column
        self.offset = offset
        self.exit_code = 2 if self.status_name in INPUT_STATUSES else 1
        super().__init__(message)


class RuntimeLibraryNotFound(MloptError):
    """No libmlopt_runtime.so to load, or one this binding cannot use (wrong version, missing symbols)."""

    exit_code = 1


# ------------------------------------------------------------------------------------------------ structs


class _ProgramInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("coll", ctypes.c_char_p), ("proto", ctypes.c_char_p),
        ("ngpus", ctypes.c_int32), ("nchannels", ctypes.c_int32), ("nchunksperloop", ctypes.c_int32),
        ("inplace", ctypes.c_int32), ("outofplace", ctypes.c_int32),
        ("min_bytes", ctypes.c_int64), ("max_bytes", ctypes.c_int64),
        ("threadblocks", ctypes.c_int32), ("steps", ctypes.c_int64),
        ("i_chunks", ctypes.c_int32), ("o_chunks", ctypes.c_int32), ("s_chunks", ctypes.c_int32),
        ("root", ctypes.c_int32),
    ]


class _RunOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("backend", ctypes.c_int), ("watchdog_ms", ctypes.c_int32),
        ("fifo_slots", ctypes.c_int32), ("chunk_bytes", ctypes.c_int64), ("threads", ctypes.c_int32),
        ("cuda_stream", ctypes.c_void_p), ("cuda_block_threads", ctypes.c_int32),
    ]


class _RunStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("steps_executed", ctypes.c_int64), ("messages", ctypes.c_int64),
        ("bytes_moved", ctypes.c_int64), ("loop_iterations", ctypes.c_int64), ("wall_us", ctypes.c_double),
        ("device_us", ctypes.c_double), ("backend", ctypes.c_int32),
    ]


class _CommOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("transport", ctypes.c_int), ("init_timeout_ms", ctypes.c_int32),
        ("shm_fifo_bytes", ctypes.c_int64), ("spin_us", ctypes.c_int32), ("host_id", ctypes.c_char_p),
        ("tcp_address", ctypes.c_char_p), ("key_prefix", ctypes.c_char_p),
    ]


# mlopt_bootstrap's callbacks: set(ctx, key, value, size) and get(ctx, key, value, capacity, *size, timeout_ms).
_BOOTSTRAP_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_BOOTSTRAP_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.POINTER(ctypes.c_size_t), ctypes.c_int32)


class _Bootstrap(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ctx", ctypes.c_void_p), ("set", _BOOTSTRAP_SET),
                ("get", _BOOTSTRAP_GET)]


class _EnforcerOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("watchdog_ms", ctypes.c_int32), ("replan_threshold", ctypes.c_double),
        ("threads", ctypes.c_int32), ("enforce_order", ctypes.c_int32), ("executors", ctypes.c_int32),
    ]


class _ByteRange(ctypes.Structure):
    _fields_ = [("op_offset", ctypes.c_uint64), ("staging_offset", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class _MotifPosition(ctypes.Structure):
    _fields_ = [
        ("gather", ctypes.POINTER(_ByteRange)), ("gather_count", ctypes.c_size_t),
        ("scatter", ctypes.POINTER(_ByteRange)), ("scatter_count", ctypes.c_size_t),
    ]


class _MotifDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("op", ctypes.c_int32),
        ("index", ctypes.c_int32), ("seq", ctypes.c_int32), ("program", ctypes.c_void_p),
        ("nranks", ctypes.c_int32), ("ranks", ctypes.POINTER(ctypes.c_int32)),
        ("deps", ctypes.POINTER(ctypes.c_int32)), ("deps_count", ctypes.c_size_t),
        ("channel_mask", ctypes.c_uint64), ("dtype", ctypes.c_int), ("redop", ctypes.c_int),
        ("count", ctypes.c_size_t), ("op_bytes", ctypes.c_uint64), ("source", ctypes.c_int),
        ("positions", ctypes.POINTER(_MotifPosition)),
    ]


class _EnforcerStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t), ("iterations", ctypes.c_int64), ("motifs_issued", ctypes.c_int64),
        ("motifs_completed", ctypes.c_int64), ("wait_us", ctypes.c_double), ("last_wait_us", ctypes.c_double),
        ("last_wall_us", ctypes.c_double), ("replan_suggested", ctypes.c_int32),
    ]


_handle = ctypes.c_void_p
_status = ctypes.c_int  # C enums are ints
_out_handle = ctypes.POINTER(ctypes.c_void_p)

# name -> (restype, argtypes): every function of mlopt.h.
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "mlopt_status_string": (ctypes.c_char_p, [_status]),
    "mlopt_version": (None, [ctypes.POINTER(ctypes.c_int)] * 3),
    "mlopt_error_status": (_status, [_handle]),
    "mlopt_error_message": (ctypes.c_char_p, [_handle]),
    "mlopt_error_line": (ctypes.c_int64, [_handle]),
    "mlopt_error_column": (ctypes.c_int64, [_handle]),
    "mlopt_error_offset": (ctypes.c_int64, [_handle]),
    "mlopt_error_free": (None, [_handle]),
    "mlopt_plan_load": (_status, [ctypes.c_char_p, _out_handle, _out_handle]),
    "mlopt_plan_load_memory": (_status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, _out_handle, _out_handle]),
    "mlopt_plan_free": (None, [_handle]),
    "mlopt_plan_get_kind": (ctypes.c_int, [_handle]),
    "mlopt_plan_format": (ctypes.c_char_p, [_handle]),
    "mlopt_plan_schema_version": (ctypes.c_char_p, [_handle]),
    "mlopt_plan_planner": (ctypes.c_char_p, [_handle]),
    "mlopt_plan_program_info": (_status, [_handle, ctypes.POINTER(_ProgramInfo), _out_handle]),
    "mlopt_comm_create_local": (_status, [ctypes.c_int32, _out_handle, _out_handle]),
    "mlopt_comm_free": (None, [_handle]),
    "mlopt_comm_size": (ctypes.c_int32, [_handle]),
    "mlopt_run_options_init": (None, [ctypes.POINTER(_RunOptions)]),
    "mlopt_output_count": (_status, [_handle, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), _out_handle]),
    "mlopt_comm_run": (_status, [_handle, _handle, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_RunOptions),
                                 _out_handle]),
    "mlopt_comm_last_stats": (_status, [_handle, ctypes.POINTER(_RunStats)]),
    # multi-process communicators (0.4)
    "mlopt_comm_options_init": (None, [ctypes.POINTER(_CommOptions)]),
    "mlopt_comm_create": (_status, [ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(_Bootstrap),
                                    ctypes.POINTER(_CommOptions), _out_handle, _out_handle]),
    "mlopt_comm_create_tcp": (_status, [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(_CommOptions),
                                        _out_handle, _out_handle]),
    "mlopt_comm_rank": (ctypes.c_int32, [_handle]),
    "mlopt_comm_peer_transport": (ctypes.c_char_p, [_handle, ctypes.c_int32]),
    "mlopt_comm_run_rank": (_status, [_handle, _handle, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.POINTER(_RunOptions), _out_handle]),
    "mlopt_backend_available": (_status, [ctypes.c_int, _out_handle]),
    # the enforcer (used by mlopt.native.enforcer)
    "mlopt_enforcer_options_init": (None, [ctypes.POINTER(_EnforcerOptions)]),
    "mlopt_enforcer_create": (_status, [ctypes.c_int32, ctypes.POINTER(_EnforcerOptions), _out_handle, _out_handle]),
    "mlopt_enforcer_create_comm": (_status, [_handle, ctypes.POINTER(_EnforcerOptions), _out_handle, _out_handle]),
    "mlopt_enforcer_free": (None, [_handle]),
    "mlopt_enforcer_add_motif": (_status, [_handle, ctypes.POINTER(_MotifDesc), _out_handle]),
    "mlopt_enforcer_start": (_status, [_handle, _out_handle]),
    "mlopt_enforcer_submit": (_status, [_handle, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                        _out_handle]),
    "mlopt_enforcer_wait": (_status, [_handle, ctypes.c_int32, ctypes.c_int32, _out_handle]),
    "mlopt_enforcer_drain": (_status, [_handle, _out_handle]),
    "mlopt_enforcer_get_stats": (_status, [_handle, ctypes.c_int32, ctypes.POINTER(_EnforcerStats), _out_handle]),
    "mlopt_enforcer_issue_log": (_status, [_handle, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                           ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32),
                                           ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), _out_handle]),
}

# The multi-process part of 0.4. A library built without it (its C++ landed after the header) still loads for
# in-process use; ProcessComm and Enforcer.over_comm then raise RuntimeLibraryNotFound naming what it lacks.
MULTI_PROCESS_FUNCTIONS = frozenset({
    "mlopt_comm_options_init", "mlopt_comm_create", "mlopt_comm_create_tcp", "mlopt_comm_rank",
    "mlopt_comm_peer_transport", "mlopt_comm_run_rank", "mlopt_enforcer_create_comm"})


# ------------------------------------------------------------------------------------------------ loading


def library_path() -> Path:
    """The library to load (see the module docstring); RuntimeLibraryNotFound saying how to build one."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise RuntimeLibraryNotFound(f"{LIBRARY_ENV}={override}: no such file")
        return path
    if BUNDLED_LIBRARY.is_file():
        return BUNDLED_LIBRARY
    why = ""
    if BUILD_ERROR_NOTE.is_file():
        summary = (BUILD_ERROR_NOTE.read_text().strip().splitlines() or ["unknown reason"])[0]
        why = f" (the last build failed: {summary}; details in {BUILD_ERROR_NOTE})"
    raise RuntimeLibraryNotFound(
        f"the mlopt runtime library is not built{why}: run `pip install -e .` in the mlopt checkout (needs cmake "
        f"and a C++17 compiler), or `cmake -S runtime -B runtime/build && cmake --build runtime/build` and "
        f"set {LIBRARY_ENV}=runtime/build/{LIBRARY_NAME}")


def library():
    """The loaded, version-checked library (ctypes.CDLL with every prototype of mlopt.h declared)."""
    return _open_library(str(library_path()))


# Cached per path on purpose: declaring the prototypes and checking the version once per library file is
# enough (dlopen would hand back the same handle anyway), and keying on the path still honours a changed
# MLOPT_RUNTIME_LIB. The cache is the only process-wide state of this module, and it only ever grows.
@functools.lru_cache(maxsize=None)
def _open_library(path: str):
    try:
        lib = ctypes.CDLL(path)  # CDLL, not PyDLL: the GIL is released while a collective runs
    except OSError as exc:
        raise RuntimeLibraryNotFound(f"{path}: cannot be loaded: {exc}") from None
    missing = [name for name in _PROTOTYPES if not hasattr(lib, name) and name not in MULTI_PROCESS_FUNCTIONS]
    if missing:
        raise RuntimeLibraryNotFound(f"{path}: not an mlopt runtime library of this version (missing "
                                     f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}); rebuild it")
    for name, (restype, argtypes) in _PROTOTYPES.items():
        if not hasattr(lib, name):
            continue  # an optional multi-process function (see multi_process_problem)
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    problem = version_problem(_version_of(lib), EXPECTED_VERSION_MAJOR)
    if problem:
        raise RuntimeLibraryNotFound(f"{path}: {problem}")
    return lib


def _version_of(lib) -> tuple[int, int, int]:
    major, minor, patch = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(-1)
    lib.mlopt_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return major.value, minor.value, patch.value


def version_problem(found: tuple[int, int, int], expected_major: int,
                    expected_minor: int = EXPECTED_VERSION_MINOR) -> str | None:
    """Why a library of version `found` cannot be used by this binding, or None when it can."""
    if found[0] != expected_major or (expected_major == 0 and found[1] != expected_minor):
        wanted = f"{expected_major}.{expected_minor}" if expected_major == 0 else f"major version {expected_major}"
        return (f"library version {'.'.join(map(str, found))} does not match the binding ({wanted}); rebuild "
                f"the library from this checkout (`pip install -e .`)")
    return None


def multi_process_problem(lib=None) -> str | None:
    """Why the library cannot run multi-process communicators (the functions it lacks), or None when it can."""
    lib = lib if lib is not None else library()
    missing = sorted(name for name in MULTI_PROCESS_FUNCTIONS if not hasattr(lib, name))
    if not missing:
        return None
    return (f"{lib._name}: this runtime library has no multi-process communicators (missing {', '.join(missing)}); "
            f"rebuild it from this checkout")


def _require_multi_process(lib) -> None:
    problem = multi_process_problem(lib)
    if problem:
        raise RuntimeLibraryNotFound(problem)


def version() -> tuple[int, int, int]:
    """(major, minor, patch) of the loaded library."""
    return _version_of(library())


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value is not None else ""


def _raise_for(lib, status: int, err: ctypes.c_void_p) -> None:
    """Turns a failed call's status and mlopt_error into RuntimeLibraryError, freeing the error."""
    if status == 0:
        return
    status_text = _text(lib.mlopt_status_string(status))
    if not err.value:  # the library could not even allocate the error: the status alone says what happened
        raise RuntimeLibraryError(status, status_text, status_text=status_text)
    try:
        exc = RuntimeLibraryError(
            lib.mlopt_error_status(err), _text(lib.mlopt_error_message(err)), lib.mlopt_error_line(err),
            lib.mlopt_error_column(err), lib.mlopt_error_offset(err), status_text)
    finally:
        lib.mlopt_error_free(err)
    raise exc


# ------------------------------------------------------------------------------------------------ handles


class _Owned:
    """A C handle freed by `free` on close(), on leaving a `with`, or when the Python object goes."""

    _what = "handle"

    def __init__(self, lib, handle: ctypes.c_void_p, free):
        self._lib = lib
        self._handle = handle
        self._finalizer = weakref.finalize(self, free, handle)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def handle(self) -> ctypes.c_void_p:
        if not self._finalizer.alive:
            raise ValueError(f"{self._what} is closed")
        return self._handle


# ------------------------------------------------------------------------------------------------ plans


class Plan(_Owned):
    """A loaded and validated plan file: an MSCCL-EF XML program (runnable) or an mlopt JSON plan envelope."""

    def __init__(self, lib, handle: int, source: str):
        super().__init__(lib, ctypes.c_void_p(handle), lib.mlopt_plan_free)
        self.source = source
        self._what = f"plan {source}"

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        lib = library()
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        _raise_for(lib, lib.mlopt_plan_load(os.fsencode(path), ctypes.byref(handle), ctypes.byref(err)), err)
        return cls(lib, handle.value, str(path))

    @classmethod
    def from_bytes(cls, data: bytes | str, name: str | None = None) -> "Plan":
        lib = library()
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        status = lib.mlopt_plan_load_memory(raw, len(raw), name.encode("utf-8") if name else None,
                                            ctypes.byref(handle), ctypes.byref(err))
        _raise_for(lib, status, err)
        return cls(lib, handle.value, name or "<memory>")


    @property
    def kind(self) -> str:
        """"msccl-xml" (runnable) or "json"."""
        code = self._lib.mlopt_plan_get_kind(self.handle)
        return PLAN_KINDS.get(code, f"unknown({code})")

    @property
    def format(self) -> str:
        return _text(self._lib.mlopt_plan_format(self.handle))

    @property
    def schema_version(self) -> str:
        return _text(self._lib.mlopt_plan_schema_version(self.handle))

    @property
    def planner(self) -> str:
        return _text(self._lib.mlopt_plan_planner(self.handle))

    @property
    def program_info(self) -> dict[str, Any]:
        """The MSCCL-EF program's summary (mlopt_program_info as a dict); RuntimeLibraryError for JSON plans."""
        info, err = _ProgramInfo(), ctypes.c_void_p()
        info.struct_size = ctypes.sizeof(_ProgramInfo)
        status = self._lib.mlopt_plan_program_info(self.handle, ctypes.byref(info), ctypes.byref(err))
        _raise_for(self._lib, status, err)
        out = {name: getattr(info, name) for name, _ in _ProgramInfo._fields_ if name != "struct_size"}
        for name in ("name", "coll", "proto"):
            out[name] = _text(out[name])
        for name in ("inplace", "outofplace"):
            out[name] = bool(out[name])
        return out

    def output_count(self, count: int) -> int:
        """Elements of each rank's output buffer for `count` input elements per rank."""
        out, err = ctypes.c_size_t(), ctypes.c_void_p()
        status = self._lib.mlopt_output_count(self.handle, count, ctypes.byref(out), ctypes.byref(err))
        _raise_for(self._lib, status, err)
        return out.value

    def __repr__(self) -> str:
        state = f"kind={self.kind!r}" if self._finalizer.alive else "closed"
        return f"Plan({self.source!r}, {state})"


# ------------------------------------------------------------------------------------------------ buffers


@dataclass(frozen=True)
class RunStats:
    """Counters of one run (mlopt_run_stats)."""

    steps_executed: int  # over all ranks, threadblocks and loop iterations
    messages: int
    bytes_moved: int
    loop_iterations: int
    wall_us: float  # the run, start to finish (CUDA: launch to completion)
    device_us: float = 0.0  # CUDA: the kernel alone (CUDA events); 0 on the CPU backend
    backend: str = "cpu"

    @property
    def per_step_us(self) -> float:
        return self.wall_us / self.steps_executed if self.steps_executed else 0.0


class RunResult(NamedTuple):
    outputs: list  # one array/tensor per rank, of the type the inputs were
    stats: RunStats


@dataclass(frozen=True)
class _Buffer:
    """What the library needs of one array: its address and element count; dtype as mlopt names it."""

    address: int
    numel: int
    dtype: str | None  # None: raw 16-bit numpy (bfloat16 bits), needs an explicit dtype
    writable: bool
    is_torch: bool


_NUMPY_DTYPES = {"float32": "float32", "float16": "float16", "int32": "int32"}
_TORCH_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                 "torch.int32": "int32"}


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def _describe(value: Any, what: str, backend: str = "cpu") -> _Buffer:
    """Address, size and dtype of a numpy array or CPU torch tensor (CUDA torch tensors for the CUDA
    backend); ValueError for anything else."""
    if _is_torch(value):
        if backend == "cuda" and value.device.type != "cuda":
            raise ValueError(f"{what}: tensor on {value.device}; the CUDA backend needs CUDA tensors")
        if backend == "cpu" and value.device.type != "cpu":
            raise ValueError(f"{what}: tensor on {value.device}; the CPU backend needs CPU tensors")
        if not value.is_contiguous():
            raise ValueError(f"{what}: tensor is not contiguous (call .contiguous())")
        dtype = _TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise ValueError(f"{what}: dtype {value.dtype} is not one of {', '.join(DTYPES)}")
        return _Buffer(value.data_ptr(), value.numel(), dtype, True, True)

    if backend == "cuda":
        raise ValueError(f"{what}: the CUDA backend needs CUDA torch tensors, got {type(value).__name__}")
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{what}: expected a numpy array or a CPU torch tensor, got {type(value).__name__}")
    if not value.flags.c_contiguous:
        raise ValueError(f"{what}: array is not C-contiguous (use numpy.ascontiguousarray)")
    if not value.dtype.isnative:
        raise ValueError(f"{what}: byte-swapped arrays are not supported (convert with .astype(dtype.newbyteorder('=')))")
    dtype = _NUMPY_DTYPES.get(value.dtype.name)
    if dtype is None and value.dtype != np.uint16:
        raise ValueError(f"{what}: dtype {value.dtype} is not float32, float16 or int32 (bfloat16: a torch "
                         f"tensor, or numpy uint16 bits with dtype='bfloat16')")
    return _Buffer(value.ctypes.data, value.size, dtype, value.flags.writeable, False)


def _resolve_dtype(buffers: Sequence[_Buffer], requested: str | None) -> str:
    """The one dtype of every buffer, checked against the requested one."""
    if requested is not None and requested not in DTYPES:
        raise ValueError(f"dtype {requested!r} is not one of {', '.join(DTYPES)}")
    found = {b.dtype for b in buffers}
    if found == {None}:  # only raw uint16 numpy arrays
        if requested != "bfloat16":
            raise ValueError("uint16 arrays are only accepted as bfloat16 bits: pass dtype='bfloat16'")
        return requested
    if len(found) != 1:
        raise ValueError(f"buffers of different dtypes: {', '.join(sorted(map(str, found)))}")
    (dtype,) = found
    if requested is not None and requested != dtype:
        raise ValueError(f"dtype={requested!r} but the buffers are {dtype}")
    return dtype


def _empty_like(template: Any, numel: int) -> Any:
    """A new contiguous 1-D buffer of `numel` elements of the template's type, dtype and device."""
    if _is_torch(template):
        import torch  # lazy: torch is an optional dependency (the torch extra)

        return torch.empty(numel, dtype=template.dtype, device=template.device)

    return np.empty(numel, dtype=template.dtype)


def _flat(value: Any) -> Any:
    return value.reshape(-1)


def in_place_windows(coll: str, rank: int, count: int, out_count: int) -> tuple[int, int, int]:
    """(buffer elements, input offset, output offset) of one rank's single buffer when running in place
    (mlopt/sim/symbolic.py, "In place"): allgather's input is the output's window [r count, (r+1) count),
    reducescatter's output is the input's window [r out_count, (r+1) out_count), the others share it all."""
    if coll == "allgather":
        return out_count, rank * count, 0
    if coll == "reducescatter":
        return count, 0, rank * out_count
    return max(count, out_count), 0, 0


def backend_available(backend: str) -> tuple[bool, str]:
    """(True, "") when the library can run `backend` ("cpu" or "cuda") here, else (False, why)."""
    lib = library()
    err = ctypes.c_void_p()
    status = lib.mlopt_backend_available(BACKENDS[backend], ctypes.byref(err))
    if status == 0:
        return True, ""
    message = _text(lib.mlopt_error_message(err)) if err.value else ""
    if err.value:
        lib.mlopt_error_free(err)
    return False, message


# ------------------------------------------------------------------------------------------------ communicator


def _run_options(lib, *, backend: str = "cpu", watchdog_ms: int = 0, fifo_slots: int = 0, chunk_bytes: int = 0,
                 threads: int = 0, cuda_block_threads: int = 0) -> _RunOptions:
    """mlopt_run_options: the library's default for every 0."""
    options = _RunOptions()
    lib.mlopt_run_options_init(ctypes.byref(options))
    options.struct_size = ctypes.sizeof(_RunOptions)
    options.backend = BACKENDS[backend]
    options.watchdog_ms, options.fifo_slots = int(watchdog_ms), int(fifo_slots)
    options.chunk_bytes, options.threads = int(chunk_bytes), int(threads)
    options.cuda_block_threads = int(cuda_block_threads)
    return options


def _output_buffer(output: Any, kind: str, out_count: int, what: str, backend: str) -> Any:
    """A caller's out-of-place output, checked: the library cannot see buffer sizes, so a short output would
    be written past its end."""
    described = _describe(output, what, backend)
    if _resolve_dtype([described], kind) != kind:
        raise ValueError(f"{what} and the input differ in dtype")
    if described.numel != out_count:
        raise ValueError(f"{what} has {described.numel} elements; the program writes {out_count}")
    if not described.writable:
        raise ValueError(f"{what} is read-only")
    return output


def _in_place_buffer(plan: Plan, rank: int, source: Any, output: Any | None, kind: str, count: int, out_count: int,
                     backend: str) -> tuple[Any, int, int, Any]:
    """One rank's single in-place buffer (`output` checked, or a new one) with `source` copied into its input
    window: (buffer, input address, output address, view of the output window)."""
    info = plan.program_info
    if not info["inplace"]:
        raise ValueError(f"{plan.source}: the program does not declare inplace=\"1\"; run it out of place")
    total, input_at, output_at = in_place_windows(info["coll"], rank, count, out_count)
    if output is None:
        buffer = _empty_like(source, total)
    else:
        buffer = output
        described = _describe(buffer, f"outputs[{rank}]", backend)
        same_dtype = described.dtype == kind or (described.dtype is None and kind == "bfloat16")
        if described.numel != total or not same_dtype or not described.writable:
            raise ValueError(f"outputs[{rank}]: in place, each rank's buffer is {total} writable {kind} "
                             f"elements (got {described.numel} {described.dtype})")
    flat = _flat(buffer)
    window = flat[input_at:input_at + count]
    if _describe(window, "", backend).address != _describe(source, "", backend).address:
        window[...] = _flat(source)
    elem = DTYPE_BYTES[kind]
    base = _describe(buffer, "", backend).address
    return buffer, base + input_at * elem, base + output_at * elem, flat[output_at:output_at + out_count]


class _Comm(_Owned):
    """What every communicator has: its size and the last run's counters."""

    _what = "communicator"

    @property
    def size(self) -> int:
        return self._lib.mlopt_comm_size(self.handle)

    def last_stats(self) -> RunStats:
        stats = _RunStats()
        stats.struct_size = ctypes.sizeof(_RunStats)
        status = self._lib.mlopt_comm_last_stats(self.handle, ctypes.byref(stats))
        if status != 0:
            raise RuntimeLibraryError(status, f"mlopt_comm_last_stats: {_text(self._lib.mlopt_status_string(status))}")
        backend = next((name for name, value in BACKENDS.items() if value == stats.backend), str(stats.backend))
        return RunStats(stats.steps_executed, stats.messages, stats.bytes_moved, stats.loop_iterations, stats.wall_us,
                        stats.device_us, backend)


class LocalComm(_Comm):
    """An in-process communicator of `nranks` ranks (threads of this process sharing memory)."""

    def __init__(self, nranks: int):
        lib = library()
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        _raise_for(lib, lib.mlopt_comm_create_local(int(nranks), ctypes.byref(handle), ctypes.byref(err)), err)
        super().__init__(lib, handle, lib.mlopt_comm_free)

    def run(self, plan: Plan, inputs: Sequence[Any], outputs: Sequence[Any] | None = None, dtype: str | None = None,
            op: str = "sum", in_place: bool = False, chunk_bytes: int = 0, fifo_slots: int = 0,
            watchdog_ms: int = 0, threads: int = 0, backend: str = "cpu", cuda_block_threads: int = 0) -> RunResult:
        """Runs `plan` on every rank: inputs[r] is rank r's input (count elements each, any shape, contiguous).

        Out of place, outputs[r] (plan.output_count(count) elements each) are allocated when not given. In
        place, each rank has one buffer (outputs[r] when given, allocated otherwise) of
        in_place_windows(...)[0] elements: inputs[r] is copied into its input window before the run (skipped
        when it already is that memory) and the returned outputs are views of the output windows.
        chunk_bytes, fifo_slots, watchdog_ms, threads: mlopt_run_options (0 = the library's default).
        backend="cuda": CUDA torch tensors on the current device, run as one kernel on torch's current stream
        (the call returns when it has finished); cuda_block_threads: threads per CUDA block (0: 512).
        """
        if op not in OPS:
            raise ValueError(f"op {op!r} is not one of {', '.join(OPS)}")
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
        nranks = self.size
        if len(inputs) != nranks:
            raise ValueError(f"{len(inputs)} input buffers for a communicator of {nranks} ranks")
        if outputs is not None and len(outputs) != nranks:
            raise ValueError(f"{len(outputs)} output buffers for a communicator of {nranks} ranks")
        in_buffers = [_describe(x, f"inputs[{r}]", backend) for r, x in enumerate(inputs)]
        kind = _resolve_dtype(in_buffers, dtype)
        count = in_buffers[0].numel
        if any(b.numel != count for b in in_buffers):
            raise ValueError(f"input buffers differ in size: {[b.numel for b in in_buffers]} elements")
        out_count = plan.output_count(count)  # also checks count against the program's chunks
        if in_place:
            prepared = [_in_place_buffer(plan, r, inputs[r], None if outputs is None else outputs[r], kind, count,
                                         out_count, backend) for r in range(nranks)]
            buffers = [p[0] for p in prepared]
            input_addresses, output_addresses = [p[1] for p in prepared], [p[2] for p in prepared]
            results = [p[3] for p in prepared]
        else:
            if outputs is None:
                buffers = [_empty_like(inputs[r], out_count) for r in range(nranks)]
            else:
                buffers = [_output_buffer(x, kind, out_count, f"outputs[{r}]", backend) for r, x in enumerate(outputs)]
            input_addresses = [b.address for b in in_buffers]
            output_addresses = [_describe(x, "", backend).address for x in buffers]
            results = list(buffers)
        options = _run_options(self._lib, backend=backend, watchdog_ms=watchdog_ms, fifo_slots=fifo_slots,
                               chunk_bytes=chunk_bytes, threads=threads, cuda_block_threads=cuda_block_threads)
        if backend == "cuda":
            import torch  # lazy: torch is an optional dependency (the torch extra)

            options.cuda_stream = torch.cuda.current_stream().cuda_stream  # after the work that made the inputs
        input_array = (ctypes.c_void_p * nranks)(*input_addresses)
        output_array = (ctypes.c_void_p * nranks)(*output_addresses)
        err = ctypes.c_void_p()
        status = self._lib.mlopt_comm_run(self.handle, plan.handle, input_array, output_array, count, DTYPES[kind],
                                          OPS[op], ctypes.byref(options), ctypes.byref(err))
        _raise_for(self._lib, status, err)
        del buffers  # kept alive until the library returned; the results hold what the caller needs
        return RunResult(results, self.last_stats())


# ------------------------------------------------------------------------------------------------ multi-process


class RankResult(NamedTuple):
    output: Any  # this rank's output, of the type its input was
    stats: RunStats


def _is_timeout(exc: BaseException) -> bool:
    """Whether a store's wait failed because the key did not come in time (torch raises RuntimeError('Wait
    timeout') or DistStoreError; other stores TimeoutError)."""
    if isinstance(exc, TimeoutError):
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return "timeout" in text or "timed out" in text


class StoreBootstrap:
    """mlopt_bootstrap over a key-value store with torch.distributed.Store's `set(key, bytes)`, `get(key)`,
    `wait([keys], timedelta)` (and `check([keys])` when it has one, for the library's zero-timeout looks).

    The callbacks run on the library's threads during mlopt_comm_create. No Python exception leaves them (ctypes
    would print it and return 0, which the library would take for success): a missing key is 1 (timed out),
    any other failure 2, and the failure is kept in `errors` for the message that follows."""

    def __init__(self, store: Any):
        for method in ("set", "get", "wait"):
            if not callable(getattr(store, method, None)):
                raise TypeError(f"store: {type(store).__name__} has no {method}() (a torch.distributed Store has)")
        self.store = store
        self.errors: list[str] = []
        self._set = _BOOTSTRAP_SET(self._set_callback)  # kept on self: the library calls them later
        self._get = _BOOTSTRAP_GET(self._get_callback)
        self.struct = _Bootstrap(ctypes.sizeof(_Bootstrap), None, self._set, self._get)

    def _set_callback(self, ctx, key, value, size) -> int:
        try:
            self.store.set(key.decode("utf-8"), ctypes.string_at(value, size) if size else b"")
            return 0
        except BaseException as exc:  # noqa: BLE001 - nothing may propagate into C (see the class docstring)
            return self._failed("set", key, exc)

    def _get_callback(self, ctx, key, value, capacity, size, timeout_ms) -> int:
        try:
            data = self._fetch(key.decode("utf-8"), timeout_ms)
            if data is None:
                return 1
            if capacity and value:
                ctypes.memmove(value, data, min(capacity, len(data)))
            size[0] = len(data)
            return 0
        except BaseException as exc:  # noqa: BLE001 - nothing may propagate into C (see the class docstring)
            return self._failed("get", key, exc)

    def _fetch(self, key: str, timeout_ms: int) -> bytes | None:
        """The key's value, or None when it is not set within timeout_ms (<= 0: now). torch stores read a zero
        timeout as "wait forever", so a look without waiting uses check() where the store has it."""
        if timeout_ms <= 0:
            if callable(getattr(self.store, "check", None)):
                return bytes(self.store.get(key)) if self.store.check([key]) else None
            timeout_ms = 1
        try:
            self.store.wait([key], datetime.timedelta(milliseconds=timeout_ms))
        except Exception as exc:  # noqa: BLE001 - classified: a timeout is an answer, anything else is re-raised
            if _is_timeout(exc):
                return None
            raise
        return bytes(self.store.get(key))

    def _failed(self, what: str, key: bytes | None, exc: BaseException) -> int:
        message = f"store.{what}({_text(key)!r}) raised {type(exc).__name__}: {exc}"
        self.errors.append(message)
        _log.warning("mlopt bootstrap: %s", message)
        return 2


def _comm_options(lib, transport: str, init_timeout_ms: int, key_prefix: str | None, host_id: str | None,
                  tcp_address: str | None, shm_fifo_bytes: int, spin_us: int) -> _CommOptions:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    options = _CommOptions()
    lib.mlopt_comm_options_init(ctypes.byref(options))
    options.struct_size = ctypes.sizeof(_CommOptions)
    options.transport = TRANSPORTS[transport]
    options.init_timeout_ms, options.spin_us = int(init_timeout_ms), int(spin_us)
    options.shm_fifo_bytes = int(shm_fifo_bytes)
    options.host_id = host_id.encode("utf-8") if host_id else None
    options.tcp_address = tcp_address.encode("utf-8") if tcp_address else None
    options.key_prefix = key_prefix.encode("utf-8") if key_prefix else None
    return options


class ProcessComm(_Comm):
    """This process's rank of a multi-process communicator (mlopt.h, "multi-process"): one process per rank.

    Rendezvous through `store` (torch.distributed's TCPStore/FileStore/PrefixStore, or any object with their
    set/get/wait) or, without one, `address` ("host:port": rank 0 listens there, mlopt_comm_create_tcp). A
    collective call: every rank constructs it. transport "auto" (shared memory on one host, TCP between hosts),
    "shm" or "tcp"; 0 for init_timeout_ms, shm_fifo_bytes or spin_us is the library's default; key_prefix keeps
    several communicators apart on one store (None: "mlopt"); host_id: ranks with equal ids share memory.

    Every rank must make the same runs in the same order. After a failed run the communicator is broken (every
    later run raises the first failure): close it.
    """

    def __init__(self, rank: int, nranks: int, *, store: Any = None, address: str | None = None,
                 transport: str = "auto", init_timeout_ms: int = 0, key_prefix: str | None = None,
                 host_id: str | None = None, tcp_address: str | None = None, shm_fifo_bytes: int = 0,
                 spin_us: int = 0):
        if (store is None) == (address is None):
            raise ValueError("ProcessComm needs exactly one of store= (a key-value store) and address= ('host:port')")
        lib = library()
        _require_multi_process(lib)
        options = _comm_options(lib, transport, init_timeout_ms, key_prefix, host_id, tcp_address, shm_fifo_bytes,
                                spin_us)
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        self._bootstrap = StoreBootstrap(store) if store is not None else None
        if self._bootstrap is not None:
            status = lib.mlopt_comm_create(int(rank), int(nranks), ctypes.byref(self._bootstrap.struct),
                                           ctypes.byref(options), ctypes.byref(handle), ctypes.byref(err))
        else:
            status = lib.mlopt_comm_create_tcp(address.encode("utf-8"), int(rank), int(nranks), ctypes.byref(options),
                                               ctypes.byref(handle), ctypes.byref(err))
        try:
            _raise_for(lib, status, err)
        except RuntimeLibraryError as exc:
            if self._bootstrap is not None and self._bootstrap.errors:
                exc.message = f"{exc.message} (the store: {self._bootstrap.errors[-1]})"
                exc.args = (exc.message,)
            raise
        super().__init__(lib, handle, lib.mlopt_comm_free)
        self._run_lock = threading.Lock()  # one collective at a time (mlopt.h); also keeps close() out of a run
        self._dependents: weakref.WeakSet = weakref.WeakSet()  # enforcers over this comm, closed before it

    @property
    def rank(self) -> int:
        return self._lib.mlopt_comm_rank(self.handle)

    def peer_transport(self, peer: int) -> str:
        """How this rank reaches `peer`: "shm", "tcp" or "self"."""
        name = self._lib.mlopt_comm_peer_transport(self.handle, int(peer))
        if name is None:
            raise ValueError(f"peer {peer} is not a rank of this communicator of {self.size} ranks")
        return _text(name)

    def attach(self, dependent: _Owned) -> None:
        """Registers a handle built over this communicator (an enforcer) to be closed before it; while it is
        open, run() refuses (the library hands the communicator to the enforcer)."""
        self._dependents.add(dependent)

    def close(self) -> None:
        for dependent in list(self._dependents):
            dependent.close()
        with self._run_lock:
            super().close()

    def run(self, plan: Plan, input: Any, output: Any | None = None, *, dtype: str | None = None, op: str = "sum",
            in_place: bool = False, watchdog_ms: int | None = None, chunk_bytes: int | None = None) -> RankResult:
        """Runs this rank's part of `plan` (mlopt_comm_run_rank): `input` is this rank's input (count elements,
        any shape, contiguous numpy array or CPU torch tensor), `output` its output (plan.output_count(count)
        elements; allocated when None), or, in place, its one buffer as LocalComm.run lays it out. watchdog_ms
        and chunk_bytes: mlopt_run_options (None: the library's default). Blocks until this rank's part is done."""
        if op not in OPS:
            raise ValueError(f"op {op!r} is not one of {', '.join(OPS)}")
        if any(d._finalizer.alive for d in list(self._dependents)):
            raise ValueError("this communicator belongs to an enforcer (Enforcer.over_comm) until it is closed")
        described = _describe(input, "input")
        kind = _resolve_dtype([described], dtype)
        count = described.numel
        out_count = plan.output_count(count)  # also checks count against the program's chunks
        if in_place:
            buffer, input_address, output_address, result = _in_place_buffer(plan, self.rank, input, output, kind,
                                                                              count, out_count, "cpu")
        else:
            buffer = _empty_like(input, out_count) if output is None else _output_buffer(output, kind, out_count,
                                                                                          "output", "cpu")
            input_address, output_address, result = described.address, _describe(buffer, "").address, buffer
        options = _run_options(self._lib, watchdog_ms=watchdog_ms or 0, chunk_bytes=chunk_bytes or 0)
        err = ctypes.c_void_p()
        with self._run_lock:
            status = self._lib.mlopt_comm_run_rank(self.handle, plan.handle, input_address, output_address, count,
                                                   DTYPES[kind], OPS[op], ctypes.byref(options), ctypes.byref(err))
            _raise_for(self._lib, status, err)
            stats = self.last_stats()
        del buffer  # kept alive until the library returned; the result holds what the caller needs
        return RankResult(result, stats)

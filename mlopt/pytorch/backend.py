"""The "mlopt" torch.distributed backend: collectives of CPU tensors run by the mlopt runtime, one process per rank.

torch 2.13 lets Python implement a backend as a subclass of `torch.distributed.ProcessGroup` returned by the
function given to `Backend.register_backend` (torch then uses the object as the process group itself, as its
own `multi_threaded_pg` does); C++ callers such as DDP's reducer reach its methods through pybind11's
trampoline (`PyProcessGroup`). Each call returns a `torch.distributed.Work` subclass (`_Work`): torch's
`_create_work_from_future` would do, except that its wait() never raises (it waits for the future and ignores
its error, and a Python `Future.set_exception` is a value to C++), so a failed run would look like a success;
`_Work.wait()` raises the run's error, and its `get_future()` is a `then` of the completion future, whose
callback re-raises the error so that C++ sees a failed future (DDP's backward then raises it).

Each process group (the world and every `new_group` this rank belongs to) has its own `ProcessComm`, created
from the store torch hands the backend (already prefixed with the group's name, so groups never share keys),
and one worker thread that runs the group's calls in submission order and completes a future per call
(ctypes releases the GIL during a run, so DDP's backward overlaps its gradient all-reduces).

Collectives: allreduce, allgather (list; `all_gather_into_tensor`), reduce_scatter (list;
`reduce_scatter_tensor`), alltoall (list; `all_to_all_single` with equal splits), broadcast, reduce, barrier.
Reductions take contiguous CPU float32/float16/bfloat16/int32 tensors and SUM, PRODUCT, MAX, MIN, AVG (a sum
divided by the group size; float dtypes); broadcast, allgather and alltoall move bytes, so any dtype works.
Each call runs out of place through staging buffers when its size does not split into the program's chunks
(padding that is never copied back). Which program runs a call: `mlopt.pytorch.plans`.

Configuration (`BackendOptions`), first match wins: `pg_options=BackendOptions(...)` of `init_process_group` /
`new_group`; for a `new_group` without pg_options, the default group's options without its explicit `plans`
(those name programs for one group size); else the last `configure(...)` call, else the defaults. The plan
index is then, when still unset, the environment variable MLOPT_PLAN_INDEX (index.json or its folder). At init
every rank publishes the sha256 of its plan files through the store and checks the others': different plans
fail the init on every rank, naming the files. Timeouts default to the process group's `timeout`:
`watchdog_ms` bounds how long a run may see no progress (a dead peer is noticed sooner: within one futex sleep,
at most 25 ms, on shared memory; when its connection closes on TCP), `init_timeout_ms` how long ranks may take
to join.

Limits: one tensor per process and call (no multi-tensor lists); uneven `all_to_all_single` splits, gather,
scatter, send/recv and coalesced calls are not implemented (NotImplementedError saying so).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import math
import os
import queue
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from mlopt.errors import InputError
from mlopt.pytorch.plans import COLLECTIVES, Choice, PlanBook, load_index
from mlopt.native import binding as native
from mlopt.native.enforcer import Enforcer, MotifTable, ProgramCache

BACKEND_NAME = "mlopt"
INDEX_ENV = "MLOPT_PLAN_INDEX"
REDUCTION_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                    torch.int32: "int32"}
_REDUCE_OPS = ((ReduceOp.SUM, "sum"), (ReduceOp.PRODUCT, "prod"), (ReduceOp.MAX, "max"), (ReduceOp.MIN, "min"))
_MAX_MS = 2**31 - 1  # the library's timeouts are int32 milliseconds
_DEFAULT_INIT_TIMEOUT_MS = 30000  # mlopt_comm_options.init_timeout_ms <= 0
_WORD = 4  # bytes of the int32 elements byte-moving collectives run as
STAGING_KEPT = 16  # staging buffers kept for reuse per process group (by role, dtype and size)


# ------------------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class BackendOptions:
    """How the mlopt backend runs a process group (`pg_options=`, or `configure(...)` for every group)."""

    index: str | None = None  # plan index (index.json or its folder); None: $MLOPT_PLAN_INDEX, else none
    plans: Mapping[str, str] | None = None  # collective -> MSCCL-EF XML, for exactly this group size
    transport: str = "auto"  # auto | shm | tcp (native.ProcessComm)
    watchdog_ms: int | None = None  # a run without progress this long fails; None: the group's timeout
    init_timeout_ms: int | None = None  # every rank joins within this; None: the group's timeout
    chunk_bytes: int | None = None  # the runtime's slice per loop iteration; None: its default


_configured = BackendOptions()


def configure(**options: Any) -> BackendOptions:
    """Sets the options of every mlopt process group created afterwards without pg_options (fields of
    BackendOptions); returns them."""
    global _configured
    _configured = BackendOptions(**options)
    return _configured


def resolve_options(pg_options: Any = None, inherited: BackendOptions | None = None) -> BackendOptions:
    """pg_options, else `inherited` (the default group's) without its explicit plans, else configure()'s; the
    index from $MLOPT_PLAN_INDEX when none names one."""
    if pg_options is None:
        options = replace(inherited, plans=None) if inherited is not None else _configured
    elif isinstance(pg_options, BackendOptions):
        options = pg_options
    else:
        raise TypeError(f"pg_options for the mlopt backend must be mlopt.pytorch.BackendOptions, got "
                        f"{type(pg_options).__name__}")
    if options.index is None and os.environ.get(INDEX_ENV):
        options = replace(options, index=os.environ[INDEX_ENV])
    return options


def register() -> None:
    """Registers the "mlopt" backend with torch.distributed (idempotent)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu"])


def _create_process_group(common: Any, pg_options: Any) -> "MloptProcessGroup":
    """torch's creator function (extended API): c10d's DistributedBackendOptions and the group's pg_options."""
    default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    inherited = default.options if isinstance(default, MloptProcessGroup) else None
    return MloptProcessGroup(common.store, common.group_rank, common.group_size, common.timeout,
                             group_name=str(common.group_id), options=resolve_options(pg_options, inherited))


def backend_of(group: Any = None) -> "MloptProcessGroup":
    """The mlopt process group object of `group` (None: the default group); ValueError for another backend."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(group, MloptProcessGroup):
        raise ValueError(f"the process group's backend is {dist.get_backend(group)!r}, not {BACKEND_NAME!r}")
    return group


def _milliseconds(value: int | None, timeout: datetime.timedelta | None) -> int:
    if value is not None:
        return int(value)
    return min(_MAX_MS, int(timeout.total_seconds() * 1000)) if timeout is not None else 0


# ------------------------------------------------------------------------------------------------ plans across ranks


def _load_plans(size: int, options: BackendOptions) -> PlanBook:
    index = load_index(options.index) if options.index else None
    return PlanBook(size, index, options.plans)


def _fingerprint(book: PlanBook) -> dict[str, Any]:
    return {"index": book.index.path if book.index else None, "files": dict(book.files)}


def _short(sha: str | None) -> str:
    return f"sha256 {sha[:12]}" if sha else "absent"


def _check_same_plans(mine: dict[str, Any], theirs: dict[str, Any], rank: int, other: int) -> None:
    """InputError naming this rank's index and the files that differ from rank `other`'s."""
    if "error" in theirs:
        raise RuntimeError(f"mlopt backend: rank {other} could not load its plans: {theirs['error']}")
    here, there = mine["files"], theirs["files"]
    differing = sorted(name for name in here.keys() | there.keys() if here.get(name) != there.get(name))
    if not differing:
        return
    details = "; ".join(f"{name}: {_short(here.get(name))} here, {_short(there.get(name))} on rank {other}"
                        for name in differing)
    raise InputError(mine["index"] or f"(no plan index: {INDEX_ENV} unset)", "plans",
                     f"rank {rank}'s plans differ from rank {other}'s ({theirs['index'] or 'no plan index'}): "
                     f"{details}; every rank must load the same plans")


def _key_space(store: Any, size: int) -> str:
    """A key prefix of this creation of the group: torch restarts group names when the world is destroyed, so a
    group created again on the same store would otherwise read its predecessor's keys. Every rank counts its
    creations on the store; the size-th creation of all ranks together starts the next generation."""
    return f"mlopt-{(int(store.add('mlopt-creations', 1)) - 1) // size}"


def _exchange_plans(store: Any, rank: int, size: int, options: BackendOptions, timeout_ms: int,
                    keys_at: str) -> PlanBook:
    """This rank's plans, checked to be every rank's (a collective call over the group's store)."""
    try:
        book = _load_plans(size, options)
    except Exception as exc:
        store.set(f"{keys_at}/plans/{rank}", json.dumps({"error": str(exc)}))  # the others fail now, not at timeout
        raise
    mine = _fingerprint(book)
    store.set(f"{keys_at}/plans/{rank}", json.dumps(mine))
    keys = [f"{keys_at}/plans/{r}" for r in range(size) if r != rank]
    try:
        store.wait(keys, datetime.timedelta(milliseconds=timeout_ms if timeout_ms > 0 else _DEFAULT_INIT_TIMEOUT_MS))
    except Exception as exc:  # noqa: BLE001 - the store's own timeout error; which ranks are late is what matters
        late = [k.rsplit("/", 1)[1] for k in keys if not store.check([k])]
        raise RuntimeError(f"mlopt backend: rank(s) {', '.join(late) or '?'} did not publish their plans within "
                           f"{timeout_ms} ms ({exc})") from None
    for key in keys:
        _check_same_plans(mine, json.loads(store.get(key)), rank, int(key.rsplit("/", 1)[1]))
    return book


# ------------------------------------------------------------------------------------------------ calls


def _reduce_op(op: Any) -> tuple[str, bool]:
    """(runtime op, divide by the group size afterwards) of a torch ReduceOp."""
    for torch_op, name in _REDUCE_OPS:
        if op == torch_op:
            return name, False
    if op == ReduceOp.AVG:
        return "sum", True
    raise ValueError(f"mlopt backend: reduce op {getattr(op, 'op', op)} is not supported (SUM, PRODUCT, MAX, MIN, AVG)")


def _flat(tensor: Any, what: str, collective: str, moves_bytes: bool) -> torch.Tensor:
    """A checked tensor as a 1-D view: of its own dtype (reductions) or of its bytes."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"mlopt backend: {collective}: {what} is a {type(tensor).__name__}, not a tensor")
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"mlopt backend: {collective}: {what} must be a contiguous CPU tensor "
                         f"(device {tensor.device}, contiguous={tensor.is_contiguous()})")
    if moves_bytes:
        return tensor.reshape(-1).view(torch.uint8)
    if tensor.dtype not in REDUCTION_DTYPES:
        raise ValueError(f"mlopt backend: {collective}: {what} is {tensor.dtype}; reductions run on "
                         f"{', '.join(map(str, REDUCTION_DTYPES))}")
    return tensor.reshape(-1)


def _unsupported(name: str) -> None:
    raise NotImplementedError(f"mlopt backend: {name} is not implemented (allreduce, allgather, reduce_scatter, "
                              f"alltoall with equal splits, broadcast, reduce and barrier are)")


def _one(tensors: Sequence[Any], what: str, collective: str) -> Any:
    if len(tensors) != 1:
        raise ValueError(f"mlopt backend: {collective}: {len(tensors)} {what}; one per process")
    return tensors[0]


@dataclass
class _Call:
    """One collective as this rank runs it: the program, its input/output buffers (1-D, the run's dtype) and the
    copies around the run (destination, source)."""

    choice: Choice
    program: native.Plan | None  # None: nothing to move (empty tensors)
    input: torch.Tensor | None
    output: torch.Tensor | None
    op: str
    copy_in: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    copy_out: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    zero: list[torch.Tensor] = field(default_factory=list)  # staging padding cleared before the copies in
    divide: list[torch.Tensor] = field(default_factory=list)  # AVG: divided by the group size afterwards
    in_place: bool = False  # output is the program's one buffer and input its input window (ProcessComm.run)
    value: Any = None  # the future's result
    nbytes: int = 0  # the call's size as the plan choice saw it


@dataclass(frozen=True)
class CallTiming:
    """One run of a collective on this rank: when it started (time.perf_counter seconds) and how long the
    runtime took (the copies around it excluded)."""

    collective: str
    nbytes: int
    source: str  # the plan file, or the fallback that ran it
    started_s: float
    wall_us: float


@dataclass
class _Blocks:
    """A call's data as equal blocks: input blocks (1 or n) and output blocks (1 or n) of `units` elements each
    (bytes when `moves_bytes`), with the whole buffers when they are single contiguous tensors (then used as
    the program's buffers directly when no padding is needed)."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    input_base: torch.Tensor | None
    output_base: torch.Tensor | None
    moves_bytes: bool

    @property
    def units(self) -> int:
        return self.inputs[0].numel()


def _padded(units: int, blocks: int, i_chunks: int, moves_bytes: bool) -> int:
    """Block size (units) whose `blocks` blocks split into the program's i_chunks chunks of whole elements
    (int32 words when the units are bytes)."""
    quantum = i_chunks // math.gcd(blocks, i_chunks) * (_WORD if moves_bytes else 1)
    return -(-units // quantum) * quantum


def _copy_bytes(destination: torch.Tensor, source: torch.Tensor) -> None:
    """destination[:] = source for contiguous CPU tensors of one dtype and size, as one single-threaded
    memmove with the GIL released: Tensor.copy_ would use torch's intra-op thread pool, whose spinning
    threads stall for milliseconds when the job's ranks already fill the cores (seen: 1 MiB in 7 ms)."""
    assert destination.dtype == source.dtype and destination.numel() == source.numel()
    ctypes.memmove(destination.data_ptr(), source.data_ptr(), source.numel() * source.element_size())


def _fill_zero(tensor: torch.Tensor) -> None:
    """tensor[:] = 0 (contiguous CPU), single-threaded like _copy_bytes."""
    ctypes.memset(tensor.data_ptr(), 0, tensor.numel() * tensor.element_size())


def _run_view(buffer: torch.Tensor, moves_bytes: bool) -> torch.Tensor:
    return buffer.view(torch.int32) if moves_bytes else buffer


def _direct(base: torch.Tensor | None, moves_bytes: bool) -> bool:
    return base is not None and (not moves_bytes or base.data_ptr() % _WORD == 0)


def _result(done: torch.futures.Future) -> Any:
    return done.wait()  # raises the call's error: the `then` future holding this fails in C++ as well


class _Work(dist.Work):
    """The Work of one call, completed by `done` (see the module docstring for why not torch's own)."""

    def __init__(self, done: torch.futures.Future):
        super().__init__()
        self._done = done
        self._finished = threading.Event()
        done.add_done_callback(lambda _: self._finished.set())
        self._future = done.then(_result)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0
        if seconds > 0 and not self._finished.wait(seconds):
            raise RuntimeError(f"mlopt backend: the collective did not finish within {timeout}")
        self._done.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._done.done()


# ------------------------------------------------------------------------------------------------ process group


class MloptProcessGroup(dist.ProcessGroup):
    """This rank's part of a process group whose collectives the mlopt runtime runs (see the module docstring).

    For code building on the backend: `comm` (the group's ProcessComm, used by the worker thread only),
    `plans` (its PlanBook: `plans.fallbacks` lists every fallback once), `index_path`, `sources` (calls per
    (collective, program source)), `submit(fn)` (a callable on the worker thread, in order with the
    collectives), `new_comm(name)` and `create_enforcer(table)` (a communicator of its own for the enforcer).
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta | None = None, *,
                 group_name: str = "", options: BackendOptions = BackendOptions()):
        super().__init__(rank, size)
        self.options = options
        self._name = group_name
        self._store = store
        self.watchdog_ms = _milliseconds(options.watchdog_ms, timeout)
        self.init_timeout_ms = _milliseconds(options.init_timeout_ms, timeout)
        self._keys_at = _key_space(store, size)
        self.plans = _exchange_plans(store, rank, size, options, self.init_timeout_ms, self._keys_at)
        self.index_path = self.plans.index.path if self.plans.index else None
        self.comm = self._make_comm(self._keys_at)
        self.sources: Counter[tuple[str, str]] = Counter()
        self.timings: list[CallTiming] = []  # every run, in order: what the fidelity bench compares
        self._programs: dict[str, native.Plan] = {}
        self._fallbacks = ProgramCache()
        self._extra: dict[str, native.ProcessComm] = {}  # new_comm()'s, closed at shutdown
        self._lock = threading.Lock()  # plan choice, program loading and staging, should several threads submit
        self._staging_buffers: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._failure: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name=f"mlopt-pg-{group_name}", daemon=True)
        self._worker.start()

    # -- identity (torch asks through the C++ trampoline)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend(self, device: Any = None) -> "MloptProcessGroup":
        """This process group is its own (only) backend, for every device it runs (CPU)."""
        return self

    def __repr__(self) -> str:
        return f"MloptProcessGroup(group={self._name!r}, rank={self.rank()}, size={self.size()})"

    @property
    def fallbacks(self) -> list[str]:
        return self.plans.fallbacks

    # -- lifecycle

    def _make_comm(self, key_prefix: str) -> native.ProcessComm:
        return native.ProcessComm(self.rank(), self.size(), store=self._store, transport=self.options.transport,
                                  init_timeout_ms=self.init_timeout_ms, key_prefix=key_prefix)

    def shutdown(self) -> None:
        """Runs what was submitted, stops the worker and frees the communicators (idempotent)."""
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()
        for comm in self._extra.values():
            comm.close()
        self.comm.close()
        self._fallbacks.close()
        for program in self._programs.values():
            program.close()
        self._programs.clear()

    def abort(self) -> None:
        self._failure = self._failure or RuntimeError("mlopt backend: the process group was aborted")
        self.shutdown()

    # -- hooks for code building on the backend

    def submit(self, fn: Callable[[], Any]) -> torch.futures.Future:
        """Runs fn() on this group's worker thread after every call submitted before; its result (or its
        exception) completes the returned future."""
        future: torch.futures.Future = torch.futures.Future()
        self._put(fn, future, False)
        return future

    def new_comm(self, name: str) -> native.ProcessComm:
        """Another communicator of this group's ranks over its store (a collective call: every rank, the same
        name), closed with the group; e.g. for an enforcer, which owns its communicator."""
        if not name or name in self._extra:
            raise ValueError(f"mlopt backend: communicator name {name!r} is empty or taken")
        self._extra[name] = self._make_comm(f"{self._keys_at}/{name}")
        return self._extra[name]

    def create_enforcer(self, table: MotifTable | None = None, *, name: str = "enforcer", dtype: str = "float32",
                        redop: str = "sum", **options: Any) -> Enforcer:
        """This rank's enforcer (Enforcer.over_comm) over a new communicator `name`; with `table`, loaded and
        started. options: the Enforcer's (watchdog_ms defaults to the group's).

        A motif that is a whole collective over all ranks of this group, in rank order, runs the program the
        group would run for that collective, size and root (`plans.choose`: an explicit or index plan) when it
        is usable as a motif program, else the schedule plan's program for the motif (`table.programs`, proven
        when planned), else mlopt's own made now; `enforcer.motif_programs` says which ran what."""
        options.setdefault("watchdog_ms", self.watchdog_ms)
        enforcer = Enforcer.over_comm(self.new_comm(name), **options)
        if table is not None:
            programs = ProgramCache(planned=self._motif_plan)
            try:
                enforcer.load(table, dtype, redop, programs)
            finally:
                programs.close()  # the library copied the programs
            enforcer.start()
        return enforcer

    def _motif_plan(self, collective: str, ranks: tuple[int, ...], root: int, nbytes: int) -> str | None:
        """The plan file of an enforcer motif (ProgramCache's chooser): this group's choice for the collective
        when the motif spans all its ranks in order (positions are then ranks), else None."""
        if tuple(ranks) != tuple(range(self.size())) or collective not in COLLECTIVES:
            return None
        with self._lock:
            choice = self.plans.choose(collective, nbytes, root)
        return choice.plan.path if choice.plan is not None else None

    # -- the worker

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            task, future, is_collective = item
            if is_collective and self._failure is not None:
                future.set_exception(self._failure)
                continue
            try:
                value = task()
            except Exception as exc:  # noqa: BLE001 - reported through the future, as every backend does
                if is_collective:  # the communicator is broken: every later call fails with this error
                    self._failure = exc
                future.set_exception(exc)
            else:
                future.set_result(value)

    def _enqueue(self, call: _Call) -> _Work:
        future: torch.futures.Future = torch.futures.Future()
        work = _Work(future)
        self._put(lambda: self._execute(call), future, True)
        return work

    def _put(self, task: Callable[[], Any], future: torch.futures.Future, is_collective: bool) -> None:
        if not self._worker.is_alive():
            raise RuntimeError(f"mlopt backend: process group {self._name!r} is shut down")
        self._queue.put((task, future, is_collective))

    def _execute(self, call: _Call) -> Any:
        if call.program is None:
            return call.value
        for padding in call.zero:
            _fill_zero(padding)
        for destination, source in call.copy_in:
            _copy_bytes(destination, source)
        try:
            started_s = time.perf_counter()
            self.comm.run(call.program, call.input, call.output, op=call.op, in_place=call.in_place,
                          watchdog_ms=self.watchdog_ms, chunk_bytes=self.options.chunk_bytes)
            ended_s = time.perf_counter()
            self.timings.append(CallTiming(call.choice.collective, call.nbytes, call.choice.source,
                                           started_s, (ended_s - started_s) * 1e6))
        except native.RuntimeLibraryError as exc:
            raise RuntimeError(f"mlopt backend (group {self._name}, rank {self.rank()}): "
                               f"{call.choice.collective} with {call.choice.source}: {exc}") from exc
        for destination, source in call.copy_out:
            _copy_bytes(destination, source)
        for tensor in call.divide:
            tensor.div_(self.size())
        return call.value

    # -- programs and buffers

    def _program(self, choice: Choice) -> native.Plan:
        if choice.plan is None:
            return self._fallbacks.get(choice.collective, self.size(), max(choice.root, 0))[0]
        path = choice.plan.path
        if path not in self._programs:
            self._programs[path] = native.Plan.load(path)
        return self._programs[path]

    def _call(self, collective: str, blocks: _Blocks, nbytes: int, *, root: int = 0, op: str = "sum",
              copy_back: bool = True, value: Any = None, same_tensor: bool = False) -> _Call:
        """Chooses the program and lays the blocks out in its buffers (padding each block when needed).

        same_tensor: the call's one tensor is its input and its output (torch's all_reduce and broadcast); a
        program declaring inplace="1" then runs on the tensor itself when no padding is needed, else on one
        staging buffer in its in-place layout, as every call of a program that runs only in place
        (outofplace="0") does."""
        with self._lock:
            choice = self.plans.choose(collective, nbytes, root)
            self.sources[(collective, choice.source)] += 1
            if blocks.units == 0:
                return _Call(choice, None, None, None, op, value=value)
            program = self._program(choice)
        units = _padded(blocks.units, len(blocks.inputs), program.program_info["i_chunks"], blocks.moves_bytes)
        call = _Call(choice, program, None, None, op, value=value, nbytes=nbytes)
        info = program.program_info
        if same_tensor and info["inplace"] and units == blocks.units and _direct(blocks.input_base, blocks.moves_bytes):
            call.input = call.output = _run_view(blocks.input_base, blocks.moves_bytes)
            call.in_place = True
            return call
        if not info["outofplace"] or (same_tensor and info["inplace"]):  # one staging buffer instead of two
            with self._lock:
                self._stage_in_place(call, blocks, units, info["coll"], copy_back)
            return call
        with self._lock:
            call.input = self._stage_input(call, blocks, units)
            call.output = self._stage_output(call, blocks, units, copy_back)
        expected = program.output_count(call.input.numel())
        if expected != call.output.numel():
            raise ValueError(f"{choice.source}: the program's output is {expected} elements for an input of "
                             f"{call.input.numel()}; a {collective} over {self.size()} ranks has {call.output.numel()}")
        return call

    def _staging(self, role: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A staging buffer reused by every call of this role, dtype and size (the last STAGING_KEPT kept), so
        that repeated calls (DDP's buckets every step) do not fault fresh pages in. Reuse is safe: only the
        worker thread touches staging memory (copies in, the run, copies out), one call at a time."""
        key = (role, dtype, numel)
        buffer = self._staging_buffers.pop(key, None)
        if buffer is None:
            buffer = torch.empty(numel, dtype=dtype)
        self._staging_buffers[key] = buffer  # most recently used last
        while len(self._staging_buffers) > STAGING_KEPT:
            self._staging_buffers.pop(next(iter(self._staging_buffers)))
        return buffer

    def _stage_in_place(self, call: _Call, blocks: _Blocks, units: int, coll: str, copy_back: bool) -> None:
        """One staging buffer in the program's in-place layout (native.in_place_windows): the input blocks
        copied into its input window, the output blocks copied back from its output window."""
        word = _WORD if blocks.moves_bytes else 1  # units per run element
        count = units * len(blocks.inputs) // word
        out_count = call.program.output_count(count)
        total, input_at, output_at = native.in_place_windows(coll, self.rank(), count, out_count)
        staging = self._staging("in-place", blocks.inputs[0].dtype, total * word)
        base_in, base_out = input_at * word, output_at * word
        for b, block in enumerate(blocks.inputs):
            start = base_in + b * units
            call.copy_in.append((staging[start:start + blocks.units], block))
            if units > blocks.units:
                call.zero.append(staging[start + blocks.units:start + units])
        if copy_back:
            for b, block in enumerate(blocks.outputs):
                start = base_out + b * units
                call.copy_out.append((block, staging[start:start + blocks.units]))
        call.input = _run_view(staging[base_in:base_in + count * word], blocks.moves_bytes)
        call.output = _run_view(staging, blocks.moves_bytes)
        call.in_place = True

    def _stage_input(self, call: _Call, blocks: _Blocks, units: int) -> torch.Tensor:
        if units == blocks.units and _direct(blocks.input_base, blocks.moves_bytes):
            return _run_view(blocks.input_base, blocks.moves_bytes)
        staging = self._staging("input", blocks.inputs[0].dtype, units * len(blocks.inputs))
        for b, block in enumerate(blocks.inputs):
            call.copy_in.append((staging[b * units:b * units + blocks.units], block))
            if units > blocks.units:  # padding: zero, as a fresh buffer would be (cleared by the worker)
                call.zero.append(staging[b * units + blocks.units:(b + 1) * units])
        return _run_view(staging, blocks.moves_bytes)

    def _stage_output(self, call: _Call, blocks: _Blocks, units: int, copy_back: bool) -> torch.Tensor:
        if units == blocks.units and _direct(blocks.output_base, blocks.moves_bytes):
            return _run_view(blocks.output_base, blocks.moves_bytes)
        count = max(1, len(blocks.outputs))
        staging = self._staging("output", blocks.inputs[0].dtype, units * count)
        if copy_back:
            for b, block in enumerate(blocks.outputs):
                call.copy_out.append((block, staging[b * units:b * units + blocks.units]))
        return _run_view(staging, blocks.moves_bytes)

    def _equal_blocks(self, tensors: Sequence[Any], what: str, collective: str,
                      moves_bytes: bool) -> list[torch.Tensor]:
        if len(tensors) != self.size():
            raise ValueError(f"mlopt backend: {collective}: {len(tensors)} {what}; the group has {self.size()} ranks")
        flat = [_flat(t, f"{what}[{i}]", collective, moves_bytes) for i, t in enumerate(tensors)]
        if len({f.numel() for f in flat}) > 1 or len({t.dtype for t in tensors}) > 1:
            raise ValueError(f"mlopt backend: {collective}: {what} differ in size or dtype; they must be equal")
        return flat

    # -- torch's collectives (names as torch 2.13's ProcessGroup and its trampoline call them)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        tensor = _one(tensors, "tensors", "allreduce")
        op, average = _reduce_op(opts.reduceOp)
        flat = _flat(tensor, "tensor", "allreduce", False)
        self._check_average(average, tensor, "allreduce")
        call = self._call("allreduce", _Blocks([flat], [flat], flat, None, False), tensor.nbytes, op=op,
                          value=list(tensors), same_tensor=True)
        call.divide = [tensor] if average else []
        return self._enqueue(call)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BroadcastOptions()
        tensor = _one(tensors, "tensors", "broadcast")
        flat = _flat(tensor, "tensor", "broadcast", True)
        root = int(opts.rootRank)
        call = self._call("broadcast", _Blocks([flat], [flat], flat, None, True), tensor.nbytes, root=root,
                          copy_back=self.rank() != root, value=list(tensors), same_tensor=True)
        return self._enqueue(call)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceOptions()
        tensor = _one(tensors, "tensors", "reduce")
        op, average = _reduce_op(opts.reduceOp)
        flat = _flat(tensor, "tensor", "reduce", False)
        self._check_average(average, tensor, "reduce")
        root = int(opts.rootRank)
        is_root = self.rank() == root
        call = self._call("reduce", _Blocks([flat], [flat], flat, None, False), tensor.nbytes, root=root, op=op,
                          copy_back=is_root, value=list(tensors))
        call.divide = [tensor] if average and is_root else []
        return self._enqueue(call)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Any:
        tensor = _one(input_tensors, "input tensors", "allgather")
        outputs = _one(output_tensors, "output lists", "allgather")
        flat = _flat(tensor, "input", "allgather", True)
        blocks = self._equal_blocks(outputs, "outputs", "allgather", True)
        if blocks[0].numel() != flat.numel():
            raise ValueError(f"mlopt backend: allgather: outputs of {blocks[0].numel()} bytes for an input of "
                             f"{flat.numel()}")
        call = self._call("allgather", _Blocks([flat], blocks, flat, None, True), tensor.nbytes * self.size(),
                          value=output_tensors)
        return self._enqueue(call)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        flat_in = _flat(input, "input", "allgather", True)
        flat_out = _flat(output, "output", "allgather", True)
        if flat_out.numel() != flat_in.numel() * self.size():
            raise ValueError(f"mlopt backend: allgather: output of {flat_out.numel()} bytes; {self.size()} ranks "
                             f"x {flat_in.numel()} input bytes needed")
        call = self._call("allgather", _Blocks([flat_in], list(flat_out.chunk(self.size())) if flat_in.numel() else [],
                                               flat_in, flat_out, True),
                          output.nbytes, value=[output])
        return self._enqueue(call)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        tensor = _one(output_tensors, "output tensors", "reducescatter")
        inputs = _one(input_tensors, "input lists", "reducescatter")
        op, average = _reduce_op(opts.reduceOp)
        flat = _flat(tensor, "output", "reducescatter", False)
        blocks = self._equal_blocks(inputs, "inputs", "reducescatter", False)
        self._check_average(average, tensor, "reducescatter")
        if blocks[0].numel() != flat.numel() or inputs[0].dtype != tensor.dtype:
            raise ValueError("mlopt backend: reducescatter: every input must have the output's size and dtype")
        call = self._call("reducescatter", _Blocks(blocks, [flat], None, flat, False),
                          tensor.nbytes * self.size(), op=op, value=list(output_tensors))
        call.divide = [tensor] if average else []
        return self._enqueue(call)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op, average = _reduce_op(opts.reduceOp)
        flat_in = _flat(input, "input", "reducescatter", False)
        flat_out = _flat(output, "output", "reducescatter", False)
        self._check_average(average, output, "reducescatter")
        if flat_in.numel() != flat_out.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(f"mlopt backend: reducescatter: input of {flat_in.numel()} {input.dtype}; {self.size()} "
                             f"ranks x {flat_out.numel()} output elements of {output.dtype} needed")
        blocks = list(flat_in.chunk(self.size())) if flat_out.numel() else [flat_out] * self.size()
        call = self._call("reducescatter", _Blocks(blocks, [flat_out], flat_in, flat_out, False), input.nbytes,
                          op=op, value=[output])
        call.divide = [output] if average else []
        return self._enqueue(call)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Any:
        inputs = self._equal_blocks(input_tensors, "inputs", "alltoall", True)
        outputs = self._equal_blocks(output_tensors, "outputs", "alltoall", True)
        if inputs[0].numel() != outputs[0].numel():
            raise ValueError("mlopt backend: alltoall: inputs and outputs differ in size")
        call = self._call("alltoall", _Blocks(inputs, outputs, None, None, True),
                          inputs[0].numel() * self.size(), value=list(output_tensors))
        return self._enqueue(call)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> Any:
        n = self.size()
        flat_in = _flat(input, "input", "alltoall", True)
        flat_out = _flat(output, "output", "alltoall", True)
        rows = input.shape[0] if input.dim() else 0
        for name, splits in (("input_split_sizes", input_split_sizes), ("output_split_sizes", output_split_sizes)):
            if splits and any(int(s) * n != rows for s in splits):
                raise ValueError(f"mlopt backend: alltoall: {name}={list(splits)}; only equal splits are supported")
        if flat_in.numel() != flat_out.numel() or flat_in.numel() % n:
            raise ValueError(f"mlopt backend: alltoall: input and output of {flat_in.numel()} and {flat_out.numel()} "
                             f"bytes; equal sizes that split into {n} blocks needed")
        call = self._call("alltoall", _Blocks(list(flat_in.chunk(n)) if flat_in.numel() else [flat_in] * n,
                                              list(flat_out.chunk(n)) if flat_out.numel() else [flat_out] * n,
                                              flat_in, flat_out, True),
                          output.nbytes, value=[output])
        return self._enqueue(call)

    def barrier(self, opts: Any = None) -> Any:
        """An allreduce of one int32 through the runtime: returns once every rank has entered it."""
        token = torch.zeros(1, dtype=torch.int32)
        call = self._call("allreduce", _Blocks([token], [token], token, None, False), token.nbytes, value=[])
        return self._enqueue(call)

    # older names of the same collectives
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single

    # what the backend does not run: a clear error instead of torch's "No backend type associated with device"
    def gather(self, *args: Any, **kwargs: Any) -> Any:
        _unsupported("gather")

    def scatter(self, *args: Any, **kwargs: Any) -> Any:
        _unsupported("scatter")

    def send(self, *args: Any, **kwargs: Any) -> Any:
        _unsupported("send")

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        _unsupported("recv")

    def allreduce_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        _unsupported("allreduce_coalesced")

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        _unsupported("allgather_coalesced")

    def _check_average(self, average: bool, tensor: torch.Tensor, collective: str) -> None:
        if average and not tensor.is_floating_point():
            raise ValueError(f"mlopt backend: {collective}: AVG needs a floating-point tensor, got {tensor.dtype}")

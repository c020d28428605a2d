"""Apply a whole plan index (`mlopt plan --model ... -o DIR`) to a PyTorch DDP training job.

    applied = apply_plans("out/plans", model, trace="out/model.trace.json")   # wraps the model in DDP
    for inputs, targets in batches:
        with applied.forward():                  # the memory plan's executor (forward AND loss), or nothing
            loss = loss_fn(applied.model(inputs), targets)
        loss.backward()                          # buckets as the thread plan says, ordered by the schedule plan
        optimizer.step(); optimizer.zero_grad()
    print("\\n".join(applied.report()))          # per plan: applied or not, and why

What each kind of plan does in the job (one `PlanOutcome` per plan file; nothing is dropped silently):

* threads: DDP's `bucket_cap_mb_list` = the plan's fusion groups (`payload.artifacts.ddp_bucket_bytes_list`
  / 2**20, exact; mlopt.planners.threads.artifacts says why exact). DDP builds these buckets when it rebuilds
  them after its first iteration (the first iteration's provisional buckets walk the parameters in definition
  order). Once DDP has rebuilt them, a forward pre-hook of the model reads the sizes of the reducer's
  buckets and the outcome says whether they are the plan's groups. The plan's thread counts (NCCL_NTHREADS, the NCCL
  tuner CSV) concern NCCL jobs and are not applied here.
* memory: the plan and the trace it was made from are rebuilt into the problem and schedule exactly as
  `mlopt validate` does (`mlopt.planners.memory.validate.replay_plan`, which also replays the plan), and
  `mlopt.pytorch.memory.apply_memory_plan` makes the executor `forward()` returns. Needs `trace=`.
* collective: run by the process group's backend. They apply when it is the "mlopt" backend of
  `mlopt.pytorch` with this very index; a gloo (or other) group gets a "not applied" line. With the schedule
  plan applied, DDP's rebuilt buckets go through the enforcer, and a motif that is a whole collective over all
  ranks runs the program the backend would choose for it (`MloptProcessGroup.create_enforcer`) when that is
  usable as a motif program, else mlopt's ring program. A collective plan is then applied when the enforcer's
  motifs run it (the report names them) or, failing that, when the backend ran DDP's first-iteration buckets
  with it (known once DDP has rebuilt its buckets); not applied when nothing of DDP's runs it, with why.
* schedule: a DDP communication hook submits bucket i of an iteration as the plan's comm-op i (submission
  order) to the runtime's enforcer over a multi-process communicator of its own, which issues the motifs in
  the plan's order on every rank; the hook's future completes when the enforcer's wait returns. Checked
  before use: the plan's comm-ops of one iteration must be all-reduces over the whole group whose count and
  byte sizes are the job's buckets (the thread plan's groups when one is applied), and again in the job once
  DDP has rebuilt its buckets. Iterations whose buckets are not the plan's (the first) go through the process
  group as DDP's default hook would (divide by the world size, all-reduce).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mlopt.errors import InputError
from mlopt.formats.io import sha256_file
from mlopt.formats.loaders import load_trace_any
from mlopt.formats.plan import PlanFile, load_plan
from mlopt.planners.memory.validate import replay_plan
from mlopt.planners.threads.artifacts import MIB
from mlopt.pytorch.backend import BACKEND_NAME, MloptProcessGroup
from mlopt.pytorch.plans import INDEX_FILE, load_index
from mlopt.native import binding as native
from mlopt.native.enforcer import Enforcer, MotifTable, ProgramUse
from mlopt.pytorch.memory import PlanExecutor, apply_memory_plan

__all__ = ["AppliedPlans", "PlanOutcome", "apply_plans"]

APPLY_ORDER = ("threads", "memory", "collective", "schedule")  # the schedule check needs the thread plan's buckets


@dataclass
class PlanOutcome:
    """What happened to one plan of the index."""

    file: str  # as the index names it, or the kind for planners the index says were skipped
    kind: str
    applied: bool
    detail: str  # what was applied, or why not (one line)

    def line(self) -> str:
        return f"{self.file}: {'applied' if self.applied else 'not applied'}: {self.detail}"


# ------------------------------------------------------------------------------------------------ index


def _ordered_entries(doc: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(position in the index, entry) in APPLY_ORDER."""
    rank = {kind: i for i, kind in enumerate(APPLY_ORDER)}
    return sorted(enumerate(doc["plans"]), key=lambda item: rank.get(item[1]["kind"], len(rank)))


def _load_entry(folder: Path, position: int, entry: dict[str, Any], index_path: str) -> tuple[str, PlanFile]:
    path = folder / entry["file"]
    if not path.is_file():
        raise InputError(index_path, f"$.plans[{position}].file", f"{entry['file']} is listed but not in {folder}")
    plan = load_plan(path)
    if plan.kind != entry["kind"]:
        raise InputError(str(path), "$.kind", f"is {plan.kind!r}, the index says {entry['kind']!r}")
    return str(path), plan


# ------------------------------------------------------------------------------------------------ threads


def _int_list(value: Any, source: str, field: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise InputError(source, field, "expected a non-empty list of byte counts")
    for i, b in enumerate(value):
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise InputError(source, f"{field}[{i}]", f"expected a positive integer, found {b!r}")
    return list(value)


def thread_plan_buckets(plan: PlanFile, source: str) -> list[int]:
    """The bucket bytes of a thread plan, in backward order, cross-checked with its caps and groups."""
    artifacts = plan.payload.get("artifacts")
    if not isinstance(artifacts, dict):
        raise InputError(source, "$.payload.artifacts", "missing required field")
    field = "$.payload.artifacts.ddp_bucket_bytes_list"
    buckets = _int_list(artifacts.get("ddp_bucket_bytes_list"), source, field)
    caps = artifacts.get("ddp_bucket_cap_mb_list")
    if not isinstance(caps, list) or len(caps) != len(buckets):
        raise InputError(source, "$.payload.artifacts.ddp_bucket_cap_mb_list", f"expected {len(buckets)} caps")
    for i, (cap, nbytes) in enumerate(zip(caps, buckets)):
        if not isinstance(cap, (int, float)) or int(cap * MIB) not in (nbytes, nbytes - 1):
            raise InputError(source, f"$.payload.artifacts.ddp_bucket_cap_mb_list[{i}]",
                             f"{cap!r} MiB is not the {nbytes} bytes of ddp_bucket_bytes_list[{i}]")
    groups = [g.get("bytes") for g in plan.payload.get("groups", []) if isinstance(g, dict) and g.get("bytes")]
    if groups != buckets:
        raise InputError(source, "$.payload.groups", f"group bytes {groups} are not the DDP buckets {buckets}")
    return buckets


def ddp_bucket_sizes(ddp: DistributedDataParallel) -> list[int]:
    """The bytes of DDP's current buckets in reduction order (its reducer's own buckets; DDP's logging data
    has them as `rebuilt_bucket_sizes` only from the iteration after the rebuild)."""
    return [b.buffer().numel() * b.buffer().element_size() for b in ddp.reducer._get_zeros_like_grad_buckets()]


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------------------------ memory


def memory_executor(plan: PlanFile, source: str, model: nn.Module, trace_path: str | None) -> PlanExecutor:
    """The executor of a memory plan for `model`, rebuilt from its trace as `mlopt validate` does."""
    if trace_path is None:
        raise InputError(source, "$.payload.schedule", "a memory plan is rebuilt from its trace: pass trace=PATH")
    made_for = plan.provenance.get("inputs", {}).get("model")
    if made_for != sha256_file(trace_path):
        raise InputError(source, "$.provenance.inputs.model", f"the plan was made from another trace than {trace_path}")
    problem, schedule, _ = replay_plan(plan, source, trace_path)
    return apply_memory_plan(model, problem, schedule, trace=load_trace_any(trace_path), label=source)


def _memory_detail(executor: PlanExecutor) -> str:
    schedule = executor.schedule
    stored = sum(1 for f in schedule.forward if f.store)
    recomputed = sum(len(b.recompute) for b in schedule.backward)
    return (f"executor for {len(schedule.forward)} forward nodes ({stored} stored, {recomputed} recomputations); "
            f"enter applied.forward() around forward + loss")


# ------------------------------------------------------------------------------------------------ collective


def mlopt_group(group: Any) -> Any | None:
    """The group's mlopt backend object (mlopt.pytorch.backend.MloptProcessGroup), or None for another backend."""
    return group if isinstance(group, MloptProcessGroup) else None


def collective_identity(plan: PlanFile, source: str) -> tuple[str, str, Path]:
    """(collective, "COLLECTIVE of SIZE bytes", its MSCCL-EF XML resolved) of a collective plan."""
    collective = plan.payload.get("collective")
    xml = Path(source).with_suffix(".xml").resolve()
    return collective, f"{collective} of {plan.payload.get('size_bytes')} bytes", xml


def collective_outcome(plan: PlanFile, source: str, group: Any, buckets: Sequence[int] | None,
                       index_folder: Path) -> tuple[bool, str]:
    """(applied, detail) of a collective plan: the mlopt backend runs it, for the calls it chooses it for."""
    payload = plan.payload
    collective, what, xml = collective_identity(plan, source)
    backend = mlopt_group(group)
    if backend is None:
        return False, (f"{what}: the process group's backend is {dist.get_backend(group)!r}; collective plans run "
                       f"in the {BACKEND_NAME!r} backend (mlopt.pytorch) only")
    if backend.index_path is None or Path(backend.index_path).resolve() != (index_folder / INDEX_FILE).resolve():
        return False, f"{what}: the mlopt backend was given another plan index ({backend.index_path})"
    if not any(Path(p).resolve() == xml for p in backend.plans.index.collectives):
        return False, f"{what}: the mlopt backend does not list {xml.name} among its plans"
    if payload.get("ngpus") != dist.get_world_size(group):
        return False, f"{what}: planned for {payload.get('ngpus')} ranks, the group has {dist.get_world_size(group)}"
    return True, f"{what}: run by the mlopt backend{_buckets_choosing(backend, collective, xml, buckets)}"


def _buckets_choosing(backend: Any, collective: str, xml: Path, buckets: Sequence[int] | None) -> str:
    """Which of the job's DDP buckets the backend runs with this plan (its nearest-size rule)."""
    if buckets is None or collective != "allreduce":
        return " for the calls whose nearest planned size it is"
    hits = sizes_choosing(backend, collective, xml, buckets)
    return f" for DDP bucket(s) {hits} (of {len(buckets)})" if hits else " for no DDP bucket (other sizes are nearer)"


def sizes_choosing(backend: Any, collective: str, xml: Path, sizes: Sequence[int]) -> list[int]:
    """Indices of the calls of these sizes (bytes) the backend runs with `xml` (PlanBook.choose)."""
    return [i for i, nbytes in enumerate(sizes)
            if (choice := backend.plans.choose(collective, nbytes)).plan is not None
            and Path(choice.plan.path).resolve() == xml]


MotifPrograms = Mapping[tuple[int, int], ProgramUse]  # Enforcer.motif_programs: (op, motif index) -> program


def motifs_running(programs: MotifPrograms, xml: Path) -> list[tuple[int, int]]:
    """(op, motif index) of the enforcer's motifs that run `xml`."""
    return sorted(key for key, use in programs.items() if use.planned and Path(use.source).resolve() == xml)


def _motif_name(key: tuple[int, int], use: ProgramUse) -> str:
    return f"motif {key[1]} of bucket {key[0]} ({use.collective} of {use.nbytes} bytes)"


def _why_no_motif(collective: str, programs: MotifPrograms | None) -> str:
    """Why no motif runs a collective plan of `collective` (the programs its motifs of that collective run)."""
    if programs is None:
        return "the enforcer from enforcer_factory does not say which programs its motifs run"
    same = {k: u for k, u in programs.items() if u.collective == collective}
    if not same:
        return f"none of its motifs is a {collective}"
    return f"its {collective} motifs run {motif_programs_summary(same)}"


def motif_programs_summary(programs: MotifPrograms) -> str:
    """Which program the enforcer's motifs run, one clause per program and collective: how many motifs, of
    which buckets, rank groups and sizes, and why not a planned program [in brackets]. (Listing every motif
    made one report line several kB long on a 4-rank MLP; Enforcer.motif_programs has them one by one.)"""
    groups: dict[tuple[str, str, str], list[tuple[tuple[int, int], ProgramUse]]] = {}
    for key, use in sorted(programs.items()):
        name = Path(use.source).name if use.planned else use.source
        groups.setdefault((name, use.collective, _reason_kind(use)), []).append((key, use))
    return "; ".join(_motif_group(name, collective, reason, members)
                     for (name, collective, reason), members in groups.items()) or "nothing (no motifs)"


def _reason_kind(use: ProgramUse) -> str:
    """The reason without the motif's own ranks and size, so that motifs missing a plan for the same reason
    share one clause."""
    if use.reason.startswith(f"no planned {use.collective} program for ranks"):
        return f"no planned {use.collective} program for those ranks and sizes"
    return use.reason


def _motif_group(name: str, collective: str, reason: str, members: list[tuple[tuple[int, int], ProgramUse]]) -> str:
    if len(members) == 1:
        key, use = members[0]
        return f"{name} for {_motif_name(key, use)}" + (f" [{use.reason}]" if use.reason else "")
    buckets = sorted({key[0] for key, _ in members})
    groups = sorted({use.ranks for _, use in members})
    sizes = sorted({use.nbytes for _, use in members})
    size_text = f"{sizes[0]} bytes" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} bytes"
    bucket_text = f"bucket {buckets[0]}" if len(buckets) == 1 else f"buckets {buckets[0]}-{buckets[-1]}"
    group_text = ", ".join(str(list(g)) for g in groups[:4]) + (f" and {len(groups) - 4} more" if len(groups) > 4 else "")
    return (f"{name} for {len(members)} {collective} motifs ({bucket_text}; ranks {group_text}; {size_text})"
            + (f" [{reason}]" if reason else ""))


# ------------------------------------------------------------------------------------------------ schedule


def schedule_table(plan: PlanFile, source: str) -> MotifTable:
    """The plan's comm-ops of one steady iteration (unrolled iteration 1) as an enforcer table."""
    try:
        return MotifTable.from_plan(plan.payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(source, "$.payload.comm_ops",
                         f"not an enforceable schedule ({type(exc).__name__}: {exc})") from None


def schedule_mismatch(table: MotifTable, world_size: int, buckets: Sequence[int] | None) -> str | None:
    """Why the plan's comm-ops cannot be DDP's bucket all-reduces of this job (None: they can)."""
    everyone = tuple(range(world_size))
    for op in table.ops:
        if op.collective != "allreduce" or tuple(sorted(op.ranks)) != everyone:
            return (f"comm-op {op.index} ({op.name}) is an {op.collective} over ranks {list(op.ranks)}; DDP "
                    f"all-reduces its buckets over all {world_size} ranks")
    if buckets is None:
        return None
    planned = [op.nbytes for op in table.ops]
    if planned != list(buckets):
        return (f"the plan orders {len(planned)} comm-op(s) of {planned} bytes; the job's DDP buckets are "
                f"{len(buckets)} of {list(buckets)} bytes")
    return None


class EnforcedAllreduce:
    """A DDP communication hook (`communicate`): bucket i of an iteration is comm-op i of the enforcer's table.

    `enforcer` has `submit(rank, op, tensor)` and `wait(rank, op)` (mlopt.native.enforcer.Enforcer's
    interface). Until `activate()` (the job's buckets were checked against the table), buckets go through
    `group` as DDP's default hook does (divide by the world size, all-reduce). Bucket i is submitted as op i
    (DDP reduces buckets in index order, so that is the submission order); one waiter thread completes the
    futures in submission order when the enforcer's wait returns.
    """

    def __init__(self, enforcer: Any, table: MotifTable, rank: int, group: Any):
        self.enforcer = enforcer
        self.sizes = [op.nbytes for op in table.ops]
        self.rank = rank
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.active = False
        self.enforced_iterations = 0
        self.fallback_buckets = 0
        self.fallback_sizes: Counter[int] = Counter()  # bytes -> buckets that went through the process group
        self._next_op = 0
        self._pending: queue.Queue = queue.Queue()
        self._waiter = threading.Thread(target=self._wait_loop, name="mlopt-enforcer-wait", daemon=True)
        self._waiter.start()

    def activate(self) -> None:
        self.active = True

    def communicate(self, state, bucket):  # no annotations: DDP rejects any but dist.GradBucket / Future objects
        """The hook DDP calls (`ddp.register_comm_hook(None, hook.communicate)`)."""
        tensor = bucket.buffer()
        tensor.div_(self.world_size)
        if not self.active:
            self.fallback_buckets += 1
            self.fallback_sizes[tensor.numel() * tensor.element_size()] += 1
            return dist.all_reduce(tensor, group=self.group, async_op=True).get_future().then(lambda f: f.value()[0])
        op = bucket.index()
        if op != self._next_op or tensor.numel() * tensor.element_size() != self.sizes[op]:
            raise RuntimeError(f"DDP bucket {op} of {tensor.numel() * tensor.element_size()} bytes, expected comm-op "
                               f"{self._next_op} of {self.sizes[self._next_op]} bytes")
        future: torch.futures.Future = torch.futures.Future()
        self.enforcer.submit(self.rank, op, tensor)
        self._pending.put((op, tensor, future))
        self._next_op = (op + 1) % len(self.sizes)
        self.enforced_iterations += self._next_op == 0
        return future

    def _wait_loop(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            op, tensor, future = item
            try:
                self.enforcer.wait(self.rank, op)
                future.set_result(tensor)
            except Exception as exc:  # noqa: BLE001 - handed to DDP through the future
                future.set_exception(exc)

    def close(self) -> None:
        """Stops the waiter and frees the enforcer (and a communicator made for it alone)."""
        self._pending.put(None)
        self._waiter.join(timeout=10)
        comm = getattr(self.enforcer, "comm", None)
        if comm is not None and mlopt_group(self.group) is None:
            comm.close()  # ours (multi_process_enforcer): closes the enforcer first
        elif callable(getattr(self.enforcer, "close", None)):
            self.enforcer.close()  # the mlopt backend closes its communicators at shutdown


EnforcerFactory = Callable[[MotifTable, Any], Any]  # (table, process group) -> started enforcer of this rank
_enforcers_made = 0  # names communicators apart; every rank creates enforcers in the same order


def multi_process_enforcer(table: MotifTable, group: Any) -> Enforcer:
    """This rank's started enforcer of `table` over a communicator of its own: the mlopt backend's
    (`create_enforcer`), or, for another backend, one made over the default store (a collective call)."""
    global _enforcers_made
    _enforcers_made += 1
    name = f"apply-enforcer-{_enforcers_made}"
    backend = mlopt_group(group)
    if backend is not None:
        return backend.create_enforcer(table, name=name)
    store = dist.PrefixStore(f"mlopt/{name}", dist.distributed_c10d._get_default_store())
    comm = native.ProcessComm(dist.get_rank(group), dist.get_world_size(group), store=store)
    enforcer = Enforcer.over_comm(comm)
    enforcer.load(table)
    enforcer.start()
    return enforcer


def enforcer_problem() -> str | None:
    """Why this process cannot make a multi-process enforcer (None: it can)."""
    try:
        return native.multi_process_problem()
    except native.RuntimeLibraryNotFound as exc:
        return str(exc)


# ------------------------------------------------------------------------------------------------ applied


@dataclass
class _Schedule:
    file: str
    table: MotifTable
    hook: EnforcedAllreduce | None = None

    @property
    def name(self) -> str:
        return Path(self.file).name


@dataclass
class _BackendCollective:
    """A collective plan the mlopt backend runs, with its outcome's detail as without the schedule plan."""

    outcome: PlanOutcome
    collective: str
    what: str  # "allreduce of N bytes"
    xml: Path  # resolved
    detail: str  # applied, as without the schedule plan
    no_motif: str = ""  # with the schedule plan and no motif running it: why not (the motifs of its collective)


class AppliedPlans:
    """The result of `apply_plans`: the DDP model, the memory executor, and what became of every plan."""

    def __init__(self, model: nn.Module, group: Any):
        self.module = model
        self.group = group
        self.model: nn.Module = model  # the DDP wrapper once attached
        self.ddp: DistributedDataParallel | None = None
        self.ddp_kwargs: dict[str, Any] = {}
        self.buckets: list[int] | None = None  # the thread plan's, when applied
        self.executor: PlanExecutor | None = None
        self.outcomes: list[PlanOutcome] = []
        self.observed_buckets: list[int] | None = None  # DDP's rebuilt bucket sizes, once known
        self._threads_outcome: PlanOutcome | None = None
        self._schedule: _Schedule | None = None
        self._schedule_outcome: PlanOutcome | None = None
        self._collectives: list[_BackendCollective] = []  # collective plans the mlopt backend runs
        self._handle: Any = None

    # -- use in the training loop

    def forward(self) -> AbstractContextManager:
        """Enter around each step's forward pass and loss: the memory plan's executor, or nothing. The
        executor starts when the wrapped module's forward starts, so what DDP runs before it (its bucket
        rebuild allocates) is not taken for the model's ops."""
        return _PlannedForward(self.executor, self.module) if self.executor is not None else nullcontext()

    def report(self) -> list[str]:
        return [o.line() for o in self.outcomes]

    @property
    def schedule_hook(self) -> EnforcedAllreduce | None:
        return self._schedule.hook if self._schedule is not None else None

    def record(self, outcome: PlanOutcome) -> None:
        """Adds a plan's outcome; the applied thread and schedule plans' are checked again in the job."""
        self.outcomes.append(outcome)
        if outcome.kind == "threads" and outcome.applied:
            self._threads_outcome = outcome
        if outcome.kind == "schedule" and outcome.applied:
            self._schedule_outcome = outcome

    # -- DDP

    def attach(self, ddp: DistributedDataParallel, enforcer_factory: EnforcerFactory | None = None) -> None:
        """Use `ddp` (built with `ddp_kwargs`): registers the schedule plan's hook and the bucket check.
        `enforcer_factory` (default: `multi_process_enforcer`) makes this rank's started enforcer."""
        self.ddp, self.model = ddp, ddp
        if self._schedule is not None:
            self._attach_schedule(ddp, enforcer_factory)
        # On the wrapped module: after DDP's _pre_forward (which rebuilds the buckets), before the memory
        # executor starts (its hook is registered later, per step), so the check's ops are not the model's.
        self._handle = self.module.register_forward_pre_hook(_observe_hook(weakref.ref(self)))

    def _attach_schedule(self, ddp: DistributedDataParallel, factory: EnforcerFactory | None) -> None:
        assert self._schedule is not None and self._schedule_outcome is not None
        problem = enforcer_problem() if factory is None else None
        if problem is not None:
            self._schedule_failed(f"no multi-process enforcer: {problem}")
            return
        enforcer = (factory or multi_process_enforcer)(self._schedule.table, self.group)
        hook = EnforcedAllreduce(enforcer, self._schedule.table, dist.get_rank(self.group), self.group)
        ddp.register_comm_hook(None, hook.communicate)
        self._schedule.hook = hook
        self._report_motif_programs(getattr(enforcer, "motif_programs", None))
        note = getattr(enforcer, "program_note", "")  # a plan without motif programs: made at run time
        if note:
            self._schedule_outcome.detail += f"; {note}"

    def observe(self) -> None:
        """Once DDP has rebuilt its buckets: compare them with the thread and schedule plans (once)."""
        if self.observed_buckets is not None or self.ddp is None or not self.ddp._has_rebuilt_buckets:
            return
        self.observed_buckets = ddp_bucket_sizes(self.ddp)
        self._check_threads()
        self._check_schedule()

    def _check_threads(self) -> None:
        outcome = self._threads_outcome
        if outcome is None or not outcome.applied:
            return
        if self.observed_buckets == self.buckets:
            outcome.detail += f"; DDP's rebuilt buckets are the plan's: {self.observed_buckets} bytes"
        else:
            self._not_applied(outcome, f"caps set, but DDP rebuilt buckets of {self.observed_buckets} bytes, "
                              f"the plan's groups are {self.buckets}")

    def _check_schedule(self) -> None:
        hook, outcome = self.schedule_hook, self._schedule_outcome
        if hook is None or outcome is None or not outcome.applied:
            return
        why = schedule_mismatch(self._schedule.table, hook.world_size, self.observed_buckets)
        if why is None:
            hook.activate()
            outcome.detail += f"; DDP's rebuilt buckets {self.observed_buckets} bytes match, enforced from now on"
            self._report_first_iteration(hook)
        else:
            self._schedule_failed(f"in the job: {why}")

    def defer_collectives(self) -> None:
        """With the schedule plan applied, DDP's rebuilt buckets run as its motifs: which motifs run each collective
        plan is said once the enforcer is made (`attach`, `_report_motif_programs`)."""
        assert self._schedule is not None
        for c in self._collectives:
            c.outcome.detail = (f"{c.detail}; once DDP has rebuilt its buckets they go through {self._schedule.name}'s "
                                f"enforcer instead: attaching DDP says which of its motifs run this plan")

    def _report_motif_programs(self, programs: MotifPrograms | None) -> None:
        """The enforcer is made: what its motifs run (schedule outcome) and each collective plan's share."""
        assert self._schedule is not None and self._schedule_outcome is not None
        schedule = self._schedule.name
        self._schedule_outcome.detail += (
            f"; its motifs run {motif_programs_summary(programs)}" if programs is not None
            else "; which programs its motifs run is not known (an enforcer from enforcer_factory)")
        for c in self._collectives:
            keys = motifs_running(programs or {}, c.xml)
            if keys:
                motifs = ", ".join(_motif_name(k, programs[k]) for k in keys)
                c.outcome.applied, c.outcome.detail = True, (
                    f"{c.what}: runs as the program of {schedule}'s {motifs} through the enforcer, from the first "
                    f"iteration with rebuilt buckets; the mlopt backend runs it for the process-group calls it is the "
                    f"nearest size of")
                continue
            c.no_motif = _why_no_motif(c.collective, programs)
            self._not_applied(c.outcome, f"{c.what}: no motif of {schedule} runs it ({c.no_motif}); the mlopt backend "
                              f"runs it only for process-group calls it is the nearest size of, DDP's first-iteration "
                              f"buckets at most (said once DDP has rebuilt its buckets)")

    def _report_first_iteration(self, hook: EnforcedAllreduce) -> None:
        """Once the enforcer runs DDP's buckets: whether the backend ran a collective plan that no motif runs for
        DDP's first-iteration buckets (which went through the process group)."""
        backend, schedule = mlopt_group(self.group), self._schedule.name
        sizes = sorted(hook.fallback_sizes)
        for c in self._collectives:
            if c.outcome.applied or backend is None or c.collective != "allreduce":
                continue
            hits = [sizes[i] for i in sizes_choosing(backend, c.collective, c.xml, sizes)]
            if hits:
                c.outcome.applied, c.outcome.detail = True, (
                    f"{c.what}: the mlopt backend ran DDP's first-iteration bucket(s) of {hits} bytes with it; no "
                    f"motif of {schedule} runs it ({c.no_motif}), so the enforced iterations do not")
            else:
                c.outcome.detail = (f"{c.what}: nothing of DDP's runs it: no motif of {schedule} ({c.no_motif}), and "
                                    f"no first-iteration bucket ({sizes} bytes) is nearest to it; the mlopt backend "
                                    f"keeps it for other process-group calls of its nearest size")

    def _schedule_failed(self, why: str) -> None:
        """The schedule plan is not applied after all: the collective plans' outcomes are as without it."""
        assert self._schedule_outcome is not None
        self._not_applied(self._schedule_outcome, why)
        for c in self._collectives:
            c.outcome.applied, c.outcome.detail, c.no_motif = True, c.detail, ""

    @staticmethod
    def _not_applied(outcome: PlanOutcome, why: str) -> None:
        outcome.applied, outcome.detail = False, why

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        if self.schedule_hook is not None:
            self.schedule_hook.close()


class _PlannedForward:
    """Enters `executor` at the start of `module`'s next forward call and leaves it on exit (after the loss)."""

    def __init__(self, executor: PlanExecutor, module: nn.Module):
        self.executor = executor
        self.module = module
        self._entered = False
        self._handle: Any = None

    def _start(self, module: nn.Module, args: Any) -> None:
        if not self._entered:
            self.executor.__enter__()
            self._entered = True

    def __enter__(self) -> "_PlannedForward":
        self._handle = self.module.register_forward_pre_hook(self._start)
        return self

    def __exit__(self, *exc: Any) -> Any:
        self._handle.remove()
        if self._entered:
            self._entered = False
            return self.executor.__exit__(*exc)
        return None


def _observe_hook(ref: "weakref.ref[AppliedPlans]") -> Callable[..., None]:
    def hook(module: nn.Module, inputs: Any) -> None:
        applied = ref()
        if applied is not None:
            applied.observe()
    return hook


# ------------------------------------------------------------------------------------------------ apply


def _apply_threads(applied: AppliedPlans, plan: PlanFile, source: str, nranks: int) -> PlanOutcome:
    if applied.buckets is not None:
        return PlanOutcome(source, "threads", False, "another thread plan of the index already set DDP's buckets")
    buckets = thread_plan_buckets(plan, source)
    model_bytes = gradient_bytes(applied.module)
    if sum(buckets) != model_bytes:
        return PlanOutcome(source, "threads", False, f"its groups hold {sum(buckets)} gradient bytes, the model's "
                           f"trainable parameters {model_bytes}: planned for another model")
    applied.buckets = buckets
    applied.ddp_kwargs["bucket_cap_mb_list"] = [b / MIB for b in buckets]
    planned_for = plan.payload.get("options", {}).get("nodes")
    ranks = "" if planned_for == nranks else f" (planned for {planned_for} ranks, the job has {nranks})"
    return PlanOutcome(source, "threads", True, f"DDP bucket_cap_mb_list for {len(buckets)} bucket(s) of {buckets} "
                       f"bytes, used once DDP rebuilds its buckets after iteration 1{ranks}; thread counts are for "
                       f"NCCL, not applied")


def _apply_memory(applied: AppliedPlans, plan: PlanFile, source: str, trace: str | None) -> PlanOutcome:
    applied.executor = memory_executor(plan, source, applied.module, trace)
    return PlanOutcome(source, "memory", True, _memory_detail(applied.executor))


def _apply_schedule(applied: AppliedPlans, plan: PlanFile, source: str, nranks: int) -> PlanOutcome:
    if applied._schedule is not None:
        return PlanOutcome(source, "schedule", False, f"{applied._schedule.file} already orders DDP's buckets")
    table = schedule_table(plan, source)
    why = schedule_mismatch(table, nranks, applied.buckets)
    if why is None and applied.buckets is None:
        why = "DDP's default buckets are not known before the job runs; apply a thread plan made with this plan"
    if why is None and any(p.dtype != torch.float32 for p in applied.module.parameters() if p.requires_grad):
        why = "the enforcer's motifs reduce float32 buckets; the model has other gradient dtypes"
    if why is not None:
        return PlanOutcome(source, "schedule", False, why)
    applied._schedule = _Schedule(source, table)
    motifs = sum(len(op.motifs) for op in table.ops)
    return PlanOutcome(source, "schedule", True, f"{len(table.ops)} bucket all-reduce(s) as {motifs} motif(s) in the "
                       f"plan's order through the enforcer (a DDP comm hook), from the first iteration with rebuilt "
                       f"buckets")


def _apply_one(applied: AppliedPlans, kind: str, plan: PlanFile, source: str, *, trace: str | None, nranks: int,
               folder: Path) -> PlanOutcome:
    if kind == "threads":
        return _apply_threads(applied, plan, source, nranks)
    if kind == "memory":
        return _apply_memory(applied, plan, source, trace)
    if kind == "collective":
        ok, detail = collective_outcome(plan, source, applied.group, applied.buckets, folder)
        outcome = PlanOutcome(source, kind, ok, detail)
        if ok:
            collective, what, xml = collective_identity(plan, source)
            applied._collectives.append(_BackendCollective(outcome, collective, what, xml, detail))
        return outcome
    if kind == "schedule":
        return _apply_schedule(applied, plan, source, nranks)
    return PlanOutcome(source, kind, False, f"no applier for plan kind {kind!r} in mlopt.pytorch")


def _outcome(applied: AppliedPlans, folder: Path, position: int, entry: dict[str, Any], index_path: str, *,
             trace: str | None, nranks: int, strict: bool) -> PlanOutcome:
    try:
        source, plan = _load_entry(folder, position, entry, index_path)
        return _apply_one(applied, entry["kind"], plan, source, trace=trace, nranks=nranks, folder=folder)
    except InputError as exc:
        if strict:
            raise
        return PlanOutcome(entry["file"], entry["kind"], False, str(exc))


def apply_plans(index: str | Path, model: nn.Module, *, process_group: Any = None, trace: str | Path | None = None,
                wrap: bool = True, ddp_options: dict[str, Any] | None = None, strict: bool = False,
                skip: Sequence[str] = (), enforcer_factory: EnforcerFactory | None = None) -> AppliedPlans:
    """Apply every plan of `index` (index.json or its folder) to `model` in a torch.distributed job.

    `trace`: the trace the plans were made from (the memory plan is rebuilt from it). `wrap`: build
    DistributedDataParallel(model, process_group, bucket_cap_mb_list=..., **ddp_options) and attach to it;
    with wrap=False build it yourself with `applied.ddp_kwargs` and call `applied.attach(ddp)`. `strict`:
    raise the first InputError (file and field) instead of reporting the plan as not applied. `skip`: plan
    kinds to leave out (reported as such), e.g. ("memory",) to time the communication plans alone.
    """
    unknown = sorted(set(skip) - set(APPLY_ORDER))
    if unknown:
        raise ValueError(f"skip: unknown plan kind(s) {unknown}; the kinds are {', '.join(APPLY_ORDER)}")
    group = process_group if process_group is not None else _default_group()
    loaded = load_index(index)
    folder, doc, index_path = loaded.folder, loaded.document, loaded.path
    trace_path = None if trace is None else str(trace)
    if trace_path is not None and not Path(trace_path).is_file():
        raise InputError(trace_path, "$", "no such trace file")
    if trace_path is not None and doc["inputs"].get("model") not in (None, sha256_file(trace_path)):
        raise InputError(index_path, "$.inputs.model", f"the plans were made from another trace than {trace_path}")
    applied = AppliedPlans(model, group)
    nranks = dist.get_world_size(group)
    for position, entry in _ordered_entries(doc):
        if entry["kind"] in skip:
            applied.outcomes.append(PlanOutcome(entry["file"], entry["kind"], False, "skipped by the caller"))
            continue
        applied.record(_outcome(applied, folder, position, entry, index_path, trace=trace_path, nranks=nranks,
                                strict=strict))
    if applied._schedule_outcome is not None:
        applied.defer_collectives()
    applied.outcomes.extend(PlanOutcome(s["kind"], s["kind"], False, f"not planned: {s['reason']}")
                            for s in doc["skipped"])
    if wrap:
        ddp = DistributedDataParallel(model, process_group=group, **{**(ddp_options or {}), **applied.ddp_kwargs})
        applied.attach(ddp, enforcer_factory)
    return applied


def _default_group() -> Any:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first or pass process_group")
    return dist.group.WORLD

"""`mlopt simulate --model trace.json --topology T [PLANS...]`: one training iteration (or several, chained)
simulated through the three layers, optionally under plans.

* Workload: the trace (`mlopt.sim.workload.from_trace`) or a synthetic spec (`--workload dp:ranks=1024,...`).
* System: every collective of the workload timed by `mlopt.sim.collective_algorithms.collective_time` with
  the chosen algorithm (or an MSCCL-EF XML plan whose collective and rank count match), memoised per distinct
  (collective, bytes, group, pairs). A permute has no algorithm to choose: `permute_time` sends all its pairs'
  messages at once, sharing links and NICs fairly whatever --mode (a permute's sends are simultaneous).
* Network: `mlopt.sim.network`'s alpha-beta model, congestion-unaware (every message alone on its link) or
  congestion-aware (messages of one collective share links, ports and NICs fairly).

Plans: an MSCCL-EF XML (collective plan) replaces the algorithm of the collectives it implements; a memory
plan adds its recomputations as compute before the backward op that needs them (the replay's own per-stage
times). Workload rank r runs on topology rank r.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from mlopt.errors import InputError


@dataclass(frozen=True)
class EvaluateOptions:
    """One field per CLI option of the iteration mode of `mlopt simulate` (mlopt/cli.py), same names."""

    algorithm: str = "ring"  # --algorithm: collective algorithm of every collective no plan covers
    mode: str = "unaware"  # --mode: unaware (messages alone on their links) | aware (fair sharing within a collective)
    policy: str = "fifo"  # --policy: fifo | lifo (order of ready collectives on a free channel)
    channels: int = 1  # --channels: collectives in flight at once
    splits: int = 1  # --splits: each collective cut into this many chunks that pipeline
    iterations: int = 1  # --iterations: training iterations chained (cross-iteration overlap shows)
    dims: tuple[int, ...] | None = None  # --dims: dimensions of the hierarchical algorithm (default: the torus's)


@dataclass(frozen=True)
class XmlPlan:
    """A collective plan: the algorithm for collectives of `coll` over `ngpus` ranks, synthesised for
    `size_bytes` (from its JSON sidecar; None when there is none)."""

    path: str
    coll: str
    ngpus: int
    size_bytes: int | None = None


def check_fits(world_size: int, topology, source: str) -> None:
    """Workload rank r runs on topology rank r: the topology needs world_size ranks."""
    if world_size > topology.num_ranks:
        field = "ranks" if source.startswith("--") else "$.world_size"  # a --workload spec, or a trace file
        raise InputError(source, field, f"the workload has {world_size} ranks but topology {topology.name!r} has "
                                        f"{topology.num_ranks}: rank {topology.num_ranks} has no place")


def _sidecar_size(xml_path: str) -> int | None:
    """The size the collective planner synthesised the XML for, from the JSON plan beside it."""
    sidecar = Path(xml_path).with_suffix(".json")
    if not sidecar.exists():
        return None
    from mlopt.formats.plan import load_plan

    size = load_plan(str(sidecar)).payload.get("size_bytes")
    return int(size) if isinstance(size, (int, float)) else None


def xml_plans(paths: Sequence[str]) -> list[XmlPlan]:
    from mlopt.formats.io import read_bytes
    from mlopt.formats.msccl_xml import parse_program

    out = []
    for path in paths:
        program = parse_program(read_bytes(path), path)
        out.append(XmlPlan(path, program.coll, program.ngpus, _sidecar_size(path)))
    return out


def plan_for(plans: Sequence[XmlPlan], collective: str, ngpus: int, nbytes: int) -> XmlPlan | None:
    """The collective plan for a collective: of its kind and rank count, synthesised for its size or, failing
    that, for the nearest size (ratio), then the first given."""
    fitting = [p for p in plans if p.coll == collective and p.ngpus == ngpus]
    if not fitting:
        return None

    def distance(p: XmlPlan) -> float:
        if p.size_bytes is None or p.size_bytes <= 0 or nbytes <= 0:
            return math.inf
        return abs(math.log(p.size_bytes / nbytes))

    return min(fitting, key=lambda p: (distance(p), fitting.index(p)))


def check_plans_cover_workload(plans: Sequence[XmlPlan], workload) -> None:
    """A collective plan must implement some collective of the workload (else it names one that is absent)."""
    present = {(item.collective, len(item.group)) for item in workload.items if item.kind == "comm"}
    for plan in plans:
        if (plan.coll, plan.ngpus) not in present:
            listed = ", ".join(f"{c} over {n}" for c, n in sorted(present)) or "none"
            raise InputError(plan.path, "coll", f"{plan.coll} over {plan.ngpus} ranks is not a collective of the "
                                                f"workload (it has: {listed})")


def make_timer(topology, options: EvaluateOptions, plans: Sequence[XmlPlan] = ()) -> Callable:
    """The system layer as the iteration simulator calls it: item -> (duration_us, algorithm label).

    A permute ignores --algorithm, --splits, --dims and collective plans (MSCCL-EF has no permute): its pairs'
    messages all go at once (`permute_time`)."""
    from mlopt.sim.collective_algorithms import collective_time, permute_time

    def timer(item) -> tuple[float, str]:
        if len(item.group) <= 1 or item.nbytes <= 0:
            return 0.0, "none"
        if item.collective == "permute":
            if not item.pairs:
                return 0.0, "none"  # a permute without pairs moves nothing
            try:
                timing = permute_time(item.pairs, item.nbytes, topology, mode=options.mode)
            except ValueError as exc:
                raise InputError(item.name or f"item {item.id}", "pairs", str(exc)) from None
            return timing.time_us, timing.algorithm
        algorithm = options.algorithm
        plan = plan_for(plans, item.collective, len(item.group), item.nbytes)
        if plan is not None:
            algorithm = f"xml:{plan.path}"
        try:
            timing = collective_time(item.collective, algorithm, tuple(item.group), item.nbytes, topology,
                                     mode=options.mode, dims=options.dims, splits=options.splits)
        except ValueError as exc:
            raise InputError(item.name or f"item {item.id}", "algorithm", str(exc)) from None
        return timing.time_us, timing.algorithm

    return timer


def stage_recompute_us(problem, schedule) -> dict[int, float]:
    """Recomputation time of each backward stage of a memory schedule, keyed by the trace op id of the
    forward op whose backward the stage runs (the replay charges each recomputed op its implementation's
    compute_us, mlopt/planners/memory/replay.py)."""
    out: dict[int, float] = {}
    for stage in schedule.backward:
        total = 0.0
        for i, name in stage.recompute:
            impls = {impl.name: impl for impl in problem.nodes[i].forward}
            total += impls[name].compute_us if name in impls else problem.nodes[i].forward[0].compute_us
        if total > 0:
            op_id = problem.nodes[stage.node].op_id
            out[op_id] = out.get(op_id, 0.0) + total
    return out


def with_recomputation(workload, recompute_by_forward_op: dict[int, float], trace, source: str):
    """The workload with a compute item of each stage's recomputation before the first backward item of that
    forward op (items keep their ids; the new ones get fresh ids and the backward item depends on them)."""
    from mlopt.sim.workload import Workload, WorkItem

    backward_of = {op.id: op.forward_op for op in trace.ops if op.forward_op is not None}
    pending = dict(recompute_by_forward_op)
    next_id = 1 + max((item.id for item in workload.items), default=-1)
    items: list = []
    for item in workload.items:
        forward = backward_of.get(item.source_op) if item.kind == "compute" else None
        if forward is not None and forward in pending:
            extra = WorkItem(next_id, f"recompute for {item.name}", "compute", duration_us=pending.pop(forward),
                             deps=tuple(d for d in item.deps), iteration=item.iteration, phase="recompute",
                             layer=item.layer)
            items.append(extra)
            item = replace(item, deps=tuple(item.deps) + (next_id,))
            next_id += 1
        items.append(item)
    if pending:
        op = min(pending)
        raise InputError(source, "$.payload.schedule", f"recomputes for the backward of op {op}, which has no "
                                                       f"backward op in the trace")
    return Workload(workload.name, workload.world_size, tuple(items), carry=workload.carry)


def _gradient_allreduces(workload, world: tuple[int, ...]) -> set[int]:
    """Ids of the workload's all-reduces over every rank: the data-parallel gradient buckets a thread plan's
    fusion groups replace."""
    return {item.id for item in workload.items
            if item.kind == "comm" and item.collective == "allreduce" and tuple(item.group) == world}


def with_thread_plan(workload, payload: dict, trace, source: str):
    """The thread plan's fusion: its groups replace the trace's gradient all-reduces (DDP's buckets), one
    all-reduce of the group's bytes issued when the backward op completing its last layer has run; whatever
    waited for a replaced all-reduce (the optimizer) waits for all of the new ones. The thread counts are not
    modelled: the network has no per-thread bandwidth and no compute contention (docs/simulate.md)."""
    from mlopt.planners.threads.build import layer_end_ops
    from mlopt.sim.workload import Workload, WorkItem

    world = tuple(range(workload.world_size))
    replaced = _gradient_allreduces(workload, world)
    if not replaced:
        raise InputError(source, "$.payload.groups", "the workload has no all-reduce over every rank for the thread "
                                                     "plan's groups to replace")
    ends = layer_end_ops(trace, source)
    if len(ends) != len(payload["layers"]):
        raise InputError(source, "$.payload.layers", f"{len(payload['layers'])} layers but the trace has {len(ends)}")
    group_end = {}  # backward op id -> (group index, bytes)
    for index, group in enumerate(payload["groups"]):
        if group["bytes"] > 0:
            group_end[ends[group["last"]]] = (index, group["bytes"])
    next_id = 1 + max(item.id for item in workload.items)
    items, new_ids = [], {}
    for item in workload.items:
        if item.id in replaced:
            continue
        items.append(item)
        hit = group_end.get(item.source_op) if item.kind == "compute" else None
        if hit is not None:
            index, nbytes = hit
            items.append(WorkItem(next_id, f"allreduce group {index}", "comm", collective="allreduce",
                                  nbytes=nbytes, group=world, deps=(item.id,), iteration=item.iteration,
                                  phase="comm", layer=f"group {index}"))
            new_ids.setdefault(item.iteration, []).append(next_id)
            next_id += 1
    out = []
    for item in items:
        if any(d in replaced for d in item.deps):
            kept = tuple(d for d in item.deps if d not in replaced)
            item = replace(item, deps=kept + tuple(new_ids.get(item.iteration, ())))
        out.append(item)
    carry = None if workload.carry is None else tuple((a, b) for a, b in workload.carry
                                                       if a not in replaced and b not in replaced)
    return Workload(workload.name, workload.world_size, tuple(out), carry=carry)


def memory_recomputation(plan_path: str, model_path: str) -> dict[int, float]:
    from mlopt.formats.plan import load_plan
    from mlopt.planners.memory.validate import replay_plan

    problem, schedule, _ = replay_plan(load_plan(plan_path), plan_path, model_path)
    return stage_recompute_us(problem, schedule)


def _index_entries(index_path: str, index) -> list[str]:
    """The plan files a plan index (`mlopt plan --model -o DIR`'s index.json) lists, beside it."""
    folder = Path(index_path).parent
    entries = index.plans if hasattr(index, "plans") else index.get("plans", [])
    return [str(folder / (e.file if hasattr(e, "file") else e["file"])) for e in entries]


APPLIED_KINDS = ("collective", "memory", "threads", "schedule")


@dataclass(frozen=True)
class PlanFiles:
    """The plans of a simulation, by kind."""

    xmls: tuple[str, ...] = ()
    memory: tuple[str, ...] = ()
    threads: tuple[str, ...] = ()
    schedules: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()  # plans of an index the simulator cannot apply yet


def classify_plans(paths: Sequence[str]) -> PlanFiles:
    """The plans by kind; a plan index stands for the plans it lists, of which those the simulator cannot
    apply yet are left out (named). A plan named on the command line that it cannot apply is an InputError."""
    from mlopt.formats.loaders import load_any

    xmls, memory, threads, schedules, left_out = [], [], [], [], []
    pending = [(p, False) for p in paths]
    while pending:
        path, from_index = pending.pop(0)
        loaded = load_any(path, payload=False)  # sorted by kind here; payloads are checked where they are used
        if loaded.kind == "msccl":
            xmls.append(path)
            continue
        if loaded.kind == "plan-index":
            pending = [(p, True) for p in _index_entries(path, loaded.value)] + pending
            continue
        kind = loaded.value.kind if loaded.kind == "plan" else loaded.kind
        if from_index and kind not in APPLIED_KINDS:
            left_out.append(f"{path} ({kind})")
            continue
        if kind == "memory":
            memory.append(path)
        elif kind == "threads":
            threads.append(path)
        elif kind == "schedule":
            schedules.append(path)
        elif kind == "collective":
            xml = Path(path).with_suffix(".xml")
            if not xml.exists():
                raise InputError(path, "kind", f"a collective plan's algorithm is its XML; {xml} is missing")
            xmls.append(str(xml))
        else:
            raise InputError(path, "kind", f"the iteration simulator applies collective and memory plans; {kind!r} "
                                           f"plans are not supported yet")
    return PlanFiles(tuple(xmls), tuple(memory), tuple(threads), tuple(schedules), tuple(left_out))


def _motif_nbytes(m: dict) -> int:
    """A motif's size in nccl-tests' convention (per-peer collectives: all its blocks), an all-to-all part
    scaled by the share of (source, destination) pairs its pattern moves. A permute motif's one region is what
    each of its pairs sends (its pattern says which pairs, as the item's `pairs`, not by scaling the bytes)."""
    from mlopt.planners.schedule.motifs import BLOCKED

    n = len(m["ranks"])
    length = sum(int(r[1]) for r in m["regions"][0])
    nbytes = length * n if m["collective"] in BLOCKED else length
    if m["collective"] == "alltoall" and m.get("pattern") is not None:
        moved = sum(1 for a, b in m["pattern"] if a != b)
        nbytes = max(1, round(nbytes * moved / max(1, n * (n - 1))))
    return nbytes


def _motif_pairs(m: dict) -> tuple[tuple[int, int], ...]:
    """A permute motif's (source, destination) ranks, its `pattern`; () for any other motif (an all-to-all's
    pattern only scales its bytes, `_motif_nbytes`)."""
    if m["collective"] != "permute":
        return ()
    return tuple((int(a), int(b)) for a, b in m.get("pattern") or ())


def with_schedule_plan(workload, payload: dict, source: str):
    """(workload, order): every comm item the schedule plan covers replaced by its motifs, each a comm item of
    its own (its collective over its ranks, a rooted one's root first; deps: the op's deps and the motifs it
    follows; a permute motif's pairs: its pattern), whatever waited for the op waiting for all of them; order:
    the motifs by sequence number (ties: plan order), then the comm items the plan does not cover, in issue
    order. A plan unrolled over more iterations than simulated contributes its first ones (same item ids). The
    simulator's collective lanes (--channels) are generic: a motif is not pinned to the link class the plan
    gave it."""
    from mlopt.sim.workload import Workload, WorkItem

    planned = payload["options"]["iterations"]
    if workload.iterations > planned:
        raise InputError(source, "$.payload.options.iterations",
                         f"the plan covers {planned} iterations: simulate with --iterations {planned} or fewer")
    by_id = {item.id: item for item in workload.items}
    rows = [op for op in payload["comm_ops"] if op.get("iteration", 0) < workload.iterations]
    for k, op in enumerate(rows):
        item = by_id.get(op["id"])
        if item is None or item.kind != "comm":
            raise InputError(source, f"$.payload.comm_ops[{k}]", f"comm-op {op['id']} ({op['name']}) is not a "
                                                                 "collective of the workload")
        if any(not m.get("ranks") or not m.get("regions") for m in op["motifs"]):
            raise InputError(source, f"$.payload.comm_ops[{k}].motifs", "the motifs do not say what they do "
                                                                        "(replan with this version)")
    next_id = 1 + max(item.id for item in workload.items)
    motif_ids: dict[int, list[int]] = {}
    for op in rows:
        motif_ids[op["id"]] = list(range(next_id, next_id + len(op["motifs"])))
        next_id += len(op["motifs"])

    def mapped(deps: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(x for d in deps for x in motif_ids.get(d, [d]))

    new_items: dict[int, list] = {}
    keyed = []
    for pos, op in enumerate(rows):
        item, ids = by_id[op["id"]], motif_ids[op["id"]]
        made = []
        for j, m in enumerate(op["motifs"]):
            ranks = tuple(m["ranks"])
            if m.get("root") is not None and m["root"] in ranks:
                k = ranks.index(m["root"])
                ranks = ranks[k:] + ranks[:k]
            deps = tuple(ids[d] for d in m.get("deps", ())) or mapped(item.deps)
            made.append(WorkItem(ids[j], f"{item.name}/{m['name']}", "comm", collective=m["collective"],
                                 nbytes=_motif_nbytes(m), group=ranks, deps=deps, iteration=item.iteration,
                                 phase="comm", layer=item.layer, source_op=item.source_op, pairs=_motif_pairs(m)))
            keyed.append(((m["seq"], pos, j), ids[j]))
        new_items[item.id] = made
    items = []
    for item in workload.items:
        if item.id in new_items:
            items.extend(new_items[item.id])
            continue
        if any(d in motif_ids for d in item.deps):
            item = replace(item, deps=mapped(item.deps))
        items.append(item)
    covered = [i for _, i in sorted(keyed)]
    planned_ids = set(covered)
    rest = [item.id for item in items if item.kind == "comm" and item.id not in planned_ids]
    carry = None if workload.carry is None else tuple(
        (a, b) for a, b in workload.carry if a not in motif_ids and b not in motif_ids)
    return Workload(workload.name, workload.world_size, tuple(items), carry=carry), tuple(covered + rest)


def evaluate(workload, topology, options: EvaluateOptions, plans: Sequence[XmlPlan] = (), *, source: str = "workload",
             order: tuple[int, ...] = ()):
    """Simulate `workload` (already chained and with its plans applied) on `topology`; `order` (from a schedule
    plan) issues the collectives in that order instead of `options.policy`."""
    from mlopt.sim.training import SimOptions, simulate_iteration

    check_fits(workload.world_size, topology, source)
    check_plans_cover_workload(plans, workload)
    timer = make_timer(topology, options, plans)
    policy = "explicit" if order else options.policy
    return simulate_iteration(workload, timer, SimOptions(policy=policy, channels=options.channels, order=order,
                                                          iterations=options.iterations))


def summary(report, topology, options: EvaluateOptions, workload) -> dict[str, Any]:
    """What `--json` prints: the report and what produced it."""
    return {"workload": workload.name, "world_size": workload.world_size, "topology": topology.name,
            "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.__dict__.items()},
            **report.to_dict(), "collectives": report.collective_rows()}

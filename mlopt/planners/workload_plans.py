"""How `mlopt simulate` applies thread, memory and schedule plans to a simulated workload (mlopt.sim.workload).

The simulator (mlopt.sim, a lower layer) knows workloads, not plans: each planner kind's entry
(mlopt/planners/<kind>/kind.py) applies its plans with the functions here before the workload is simulated.
"""

from __future__ import annotations

from dataclasses import replace

from mlopt.errors import InputError
from mlopt.formats.plan import load_plan
from mlopt.planners.memory.validate import replay_plan
from mlopt.planners.protocol import SimulatedIteration
from mlopt.planners.schedule.motifs import BLOCKED
from mlopt.planners.threads.build import layer_end_ops
from mlopt.sim.workload import WorkItem, Workload


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
    problem, schedule, _ = replay_plan(load_plan(plan_path), plan_path, model_path)
    return stage_recompute_us(problem, schedule)



def _motif_nbytes(m: dict) -> int:
    """A motif's size in nccl-tests' convention (per-peer collectives: all its blocks), an all-to-all part
    scaled by the share of (source, destination) pairs its pattern moves. A permute motif's one region is what
    each of its pairs sends (its pattern says which pairs, as the item's `pairs`, not by scaling the bytes)."""
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


# ---------------------------------------------------------------------------------------------------------
# the kinds' SimulationFacts.apply


def apply_memory_plan(iteration: SimulatedIteration, path: str) -> SimulatedIteration:
    """Recomputation as compute before the backward ops that need it (the replay's own per-stage times)."""
    recompute = memory_recomputation(path, iteration.model_path)
    return replace(iteration, workload=with_recomputation(iteration.workload, recompute, iteration.trace, path))


def apply_thread_plan(iteration: SimulatedIteration, path: str) -> SimulatedIteration:
    """The plan's fusion groups in place of the trace's gradient all-reduces."""
    workload = with_thread_plan(iteration.workload, load_plan(path).payload, iteration.trace, path)
    return replace(iteration, workload=workload)


def apply_schedule_plan(iteration: SimulatedIteration, path: str) -> SimulatedIteration:
    """The plan's motifs in place of its comm-ops, issued in the plan's order."""
    workload, order = with_schedule_plan(iteration.workload, load_plan(path).payload, path)
    return replace(iteration, workload=workload, order=order)

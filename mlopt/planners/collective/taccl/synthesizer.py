"""TACCL's three-stage synthesizer: routing MILP, heuristic ordering, contiguity and exact scheduling MILP.

    result = synthesize(topology, sketch, CollectiveSpec("allgather", 16, 1), buffer_bytes=16e6)
    result.algorithm      # an Algorithm that passes check_algorithm
    result.predicted_time_us, result.status, result.best_bound_us, result.stages, result.notes

Status and bound (what they promise):

- `best_bound_us` is stage 1's proven lower bound on `time` (the gamma term removed). Stage 1 relaxes
  stage 3: per-link, per-switch-port and per-path costs of stage 3 bound time from below, also with merged
  sends (eq. 5.6 charges alpha / max_group per chunk on mergeable links). So it is a lower bound on the
  predicted (alpha-beta, contention-respecting) time of EVERY algorithm in the family the synthesizer searches:
  routes on the sketch's logical topology within the shortest-path restriction (hop_slack,
  path_restriction), with the sketch's symmetry, each rank receiving each chunk at most once, any link order,
  any merging of up to max_group consecutive chunks. It says nothing about routes outside that family.
- `status` is "optimal" only when stage 1 and stage 3 were both proven optimal and the predicted time meets
  that bound within mip_gap: then no algorithm of the family is faster (the heuristic ordering of stage 2
  cost nothing). Otherwise "feasible": a correct algorithm whose predicted time is within `gap` =
  (predicted - bound) / predicted of the family's best. Combining collectives (reducescatter, allreduce,
  reduce) are built by inversion and concatenation, whose family the stage-1 bound does not cover: they are
  always "feasible", with no bound.
- Each stage's own status, objective, bound and gap are in `stages` (stage 2 is a heuristic: "heuristic").

If stage 1 finds no routing, InfeasibleError (exit 3). If stage 3 finds no schedule within its limit, the
stage-2 list schedule (a feasible schedule without merging) is used and a note says so. (The stage-1 times
ignore link contention, so they are not a schedule; the list schedule is what TACCL's scheduler starts from.)
"""

from __future__ import annotations

import heapq
import math
import time as _time
from dataclasses import dataclass, field

from mlopt.errors import InfeasibleError, InputError
from mlopt.formats.importers.taccl import Sketch
from mlopt.formats.topology import Topology
from mlopt.planners.collective.algorithm import Algorithm, Transfer, check_algorithm
from mlopt.planners.collective.taccl import combining, ordering, routing, scheduling
from mlopt.planners.collective.taccl.logical import (
    BASE_KIND,
    F_CHUNKUP,
    F_SIZE,
    ChunkModel,
    LogicalTopology,
    build_logical,
    candidates,
    generators,
    parse_size,
    with_symmetry,
)
from mlopt.sim.collectives import CollectiveSpec
from mlopt.solvers import Status, resolve_solver


@dataclass(frozen=True)
class SynthesisOptions:
    solver: str = "auto"  # MILP backend: auto | highs | cbc | gurobi
    time_limit_s: float | None = 60.0  # wall-clock limit of EACH MILP stage (routing, scheduling); None = none
    node_limit: int | None = None  # branch-and-bound nodes of each MILP stage (reproducible, unlike the time limit)
    mip_gap: float = 1e-4  # relative gap at which a stage's MILP counts as solved
    threads: int = 1  # solver threads (1: reproducible)
    seed: int = 0  # solver random seed
    hop_slack: int = 0  # chunks may use ranks on paths up to this many hops longer than the shortest
    path_restriction: str = "nodes"  # "nodes": any link between ranks of a chunk's shortest-path set (TACCL); "links": only links on such paths
    ordering: str = "auto"  # stage-2 heuristic: auto (best of both) | longest-path-first | earliest-first
    max_group: int = 6  # most chunks merged into one send by stage 3 (TACCL's max_contig); 1 = never merge
    contiguity: str = "internode"  # links where stage 3 may merge chunks: internode (TACCL) | all | none
    gamma: float = 0.01  # weight of each used switch-hyperedge link in eq. 5.11, in units of the smallest link latency
    physical_switches: bool = True  # share switch ports of every intra-node switch, named in the sketch or not
    uc_threshold_bytes: float = 1e6  # no sketch: hyperedges uc-max for chunks up to this size, uc-min above
    default_internode: str = "direct-map"  # no sketch: inter-node links "direct-map" or "fully-connected"
    default_symmetry: bool = True  # no sketch: rotate nodes onto each other when that is a symmetry
    bound_resolve: bool = True  # stage 1 with a gamma term solved optimally: re-solve for time alone to bound it
    verbose: bool = False  # stream solver logs
    dump_model: str | None = None  # write each MILP as MPS (suffixed -routing, -scheduling...) before solving

    def __post_init__(self) -> None:
        if self.path_restriction not in ("nodes", "links"):
            raise ValueError(f"path_restriction must be 'nodes' or 'links', got {self.path_restriction!r}")
        if self.contiguity not in ("internode", "all", "none"):
            raise ValueError(f"contiguity must be internode, all or none, got {self.contiguity!r}")
        if self.ordering not in ("auto",) + ordering.HEURISTICS:
            raise ValueError(f"ordering must be auto or one of {ordering.HEURISTICS}, got {self.ordering!r}")
        if self.default_internode not in ("direct-map", "fully-connected"):
            raise ValueError(f"default_internode must be direct-map or fully-connected, got {self.default_internode!r}")
        if self.hop_slack < 0 or self.max_group < 1:
            raise ValueError("hop_slack must be >= 0 and max_group >= 1")


@dataclass(frozen=True)
class StageReport:
    stage: str  # routing | ordering | scheduling (":reducescatter" for the inverted part)
    status: str  # the solver's Status value, or "heuristic" / "fallback"
    objective_us: float | None  # the stage's objective (routing: time + gamma term; ordering: list-schedule time)
    best_bound_us: float | None  # the solver's bound on that objective
    gap: float | None
    wall_time_s: float  # build + solve
    num_vars: int = 0
    num_constraints: int = 0
    num_binaries: int = 0
    message: str = ""


@dataclass(frozen=True)
class SynthesisResult:
    algorithm: Algorithm
    predicted_time_us: float  # stage-3 objective (with fallback: the list schedule's time)
    status: str  # "optimal" | "feasible" (see module docstring)
    best_bound_us: float | None  # lower bound on the time of every algorithm in the searched family
    gap: float | None  # (predicted - bound) / predicted
    chunk_bytes: float
    stages: tuple[StageReport, ...]
    notes: tuple[str, ...]
    logical: LogicalTopology = field(repr=False)
    wall_time_s: float = 0.0


def chunk_count(spec: CollectiveSpec) -> int:
    """Chunks in the larger of a rank's input and output buffer (buffer_bytes is that buffer's size)."""
    return max(spec.input_chunks(), spec.output_chunks())


def synthesize(topology: Topology, sketch: Sketch | None, spec: CollectiveSpec, buffer_bytes: float | None = None,
               options: SynthesisOptions | None = None, *, sketch_source: str = "<sketch>") -> SynthesisResult:
    """Synthesize `spec` on `topology` guided by `sketch` (None: the default sketch).

    buffer_bytes: size of the larger per-rank buffer (n k chunks for allgather/alltoall/reducescatter/
    allreduce, k for broadcast/reduce); None reads the sketch's hyperparameters.input_size.
    """
    options = options or SynthesisOptions()
    t0 = _time.perf_counter()
    source = sketch_source if sketch is not None else topology.name
    chunk_bytes, pieces = _chunk_bytes(topology, sketch, spec, buffer_bytes, sketch_source, source)

    solver, solver_note = resolve_solver(options.solver)
    notes: list[str] = [f"solver {solver_note}", f"chunk {chunk_bytes:g} B ({pieces} per buffer)"]
    base_spec = CollectiveSpec(BASE_KIND[spec.kind], spec.num_ranks, spec.chunks_per_rank, spec.root)
    logical, chunks, gens, cand = _logical_problem(topology, sketch, spec, base_spec, chunk_bytes, options, source,
                                                   notes)

    # ---- stage 1 -------------------------------------------------------------------------------------
    r1 = routing.solve_routing(logical, chunks, cand, gens, solver, options)
    stages = [_report("routing", r1.result, r1.build_s, r1.num_vars, r1.num_rows, r1.num_binaries)]
    if r1.bound_result is not None:
        stages.append(_report("routing-bound", r1.bound_result, 0.0, r1.num_vars, r1.num_rows, r1.num_binaries,
                              "stage 1 re-solved for time alone (its bound is best_bound_us)"))
    if r1.routes is None:
        raise InfeasibleError(_no_routing_message(r1, options, logical))

    # ---- stage 2 + 3 on the copy collective -----------------------------------------------------------
    graph = ordering.from_routes(r1.routes.edges, chunks, logical)
    copy_sched, copy_orders = _order_and_schedule(graph, logical, solver, options, stages, notes, "")

    reducing = spec.kind in ("reducescatter", "allreduce", "reduce")
    if not reducing:
        transfers = _transfers(graph, copy_sched, logical, step_offset=0, time_offset=0.0)
        predicted = copy_sched.time_us
    else:
        transfers, predicted = _reducing_transfers(topology, spec, base_spec, graph, copy_sched, logical, solver,
                                                   options, stages, notes)

    transfers.sort(key=lambda t: (t.step, t.src, t.dst, t.chunk))
    alg = Algorithm(f"taccl-{spec.kind}-{topology.name}", spec, tuple(transfers))
    problems = check_algorithm(alg)
    if problems:
        raise RuntimeError(f"synthesized algorithm is incorrect (bug): {problems[:3]}")

    # ---- status and bound -----------------------------------------------------------------------------
    bound = None if reducing else r1.time_bound_us
    gap = None
    status = "feasible"
    if bound is not None and predicted > 0:
        gap = max(0.0, (predicted - bound) / predicted)
        stage3 = next(s for s in stages if s.stage == "scheduling")
        if r1.result.status is Status.OPTIMAL and stage3.status == Status.OPTIMAL.value \
                and gap <= options.mip_gap + 1e-9:
            status = "optimal"
    return SynthesisResult(alg, predicted, status, bound, gap, chunk_bytes, tuple(stages), tuple(notes),
                           logical, _time.perf_counter() - t0)


def _chunk_bytes(topology: Topology, sketch: Sketch | None, spec: CollectiveSpec, buffer_bytes: float | None,
                 sketch_source: str, source: str) -> tuple[float, int]:
    """(chunk size in bytes, chunks per buffer) after checking the collective against topology and sketch."""
    if spec.kind not in BASE_KIND:
        raise InputError("<collective>", "kind", f"TACCL synthesis supports {', '.join(BASE_KIND)}; "
                         f"not {spec.kind!r}")
    if spec.num_ranks != topology.num_ranks:
        raise InputError("<collective>", "num_ranks", f"{spec.num_ranks} ranks, but topology "
                         f"{topology.name!r} has {topology.num_ranks}")
    if sketch is not None and sketch.input_chunkup != spec.chunks_per_rank:
        raise InputError(sketch_source, F_CHUNKUP, f"sketch partitions each buffer into {sketch.input_chunkup} "
                         f"chunk(s) per rank, the collective asks for {spec.chunks_per_rank}")
    size_field = "buffer_bytes"
    if buffer_bytes is None:
        if sketch is None or sketch.input_size is None:
            raise InputError(source, F_SIZE, "no buffer size: pass buffer_bytes or set input_size")
        buffer_bytes, size_field = parse_size(sketch.input_size, sketch_source), F_SIZE
    pieces = chunk_count(spec)
    if buffer_bytes <= 0 or abs(buffer_bytes - round(buffer_bytes)) > 1e-6 or round(buffer_bytes) % pieces:
        raise InputError(source if size_field == F_SIZE else "<collective>", size_field,
                         f"{buffer_bytes:g} bytes cannot be split into {pieces} equal whole-byte chunks")
    return round(buffer_bytes) / pieces, pieces


def _logical_problem(topology: Topology, sketch: Sketch | None, spec: CollectiveSpec, base_spec: CollectiveSpec,
                     chunk_bytes: float, options: SynthesisOptions, source: str, notes: list[str]):
    """(logical topology, chunk model, symmetry generators, candidate routes) of the copy collective."""
    logical = build_logical(topology, sketch, base_spec, chunk_bytes, options, source)
    notes.extend(logical.description)
    chunks = ChunkModel.of(base_spec)
    try:
        gens = generators(logical, chunks, source)
    except InputError:
        if sketch is not None:
            raise
        logical = with_symmetry(logical, ())  # the default node rotation is not a symmetry of this collective
        notes.append(f"default sketch: {spec.kind} is not symmetric under node rotation, no symmetry used")
        gens = []
    cand = candidates(logical, chunks, options, sketch is not None, source)
    return logical, chunks, gens, cand


def _reducing_transfers(topology: Topology, spec: CollectiveSpec, base_spec: CollectiveSpec, graph, copy_sched,
                        logical, solver, options, stages, notes) -> tuple[list[Transfer], float]:
    """(transfers, predicted us) of a combining collective: the copy collective inverted, ordered and
    scheduled again (stages 2 + 3), followed by the copy collective itself for an allreduce."""
    inv_logical = logical.transposed()
    phys = topology.link_map()
    missing = sorted({(graph.dst[t], graph.src[t]) for t in range(len(graph))} - set(phys))
    if missing:
        raise InfeasibleError(f"cannot invert the {base_spec.kind} into a {spec.kind}: topology "
                              f"{topology.name!r} has no link {missing[0][0]}->{missing[0][1]}")
    inv, origin = combining.invert(graph)
    inv_sched, _ = _order_and_schedule(inv, inv_logical, solver, options, stages, notes, ":" + _inverse_name(spec),
                                       priority=_mirrored(graph, copy_sched, logical, origin))
    transfers = _transfers(inv, inv_sched, inv_logical, step_offset=0, time_offset=0.0)
    predicted = inv_sched.time_us
    if spec.kind == "allreduce":
        last = max((t.step for t in transfers), default=0)
        groups = 1 + max((t.group for t in transfers if t.group is not None), default=-1)
        transfers += _transfers(graph, copy_sched, logical, step_offset=last, time_offset=inv_sched.time_us,
                                group_offset=groups)
        predicted = inv_sched.time_us + copy_sched.time_us
    notes.append(f"{spec.kind} built by inverting the synthesized {base_spec.kind}"
                 + (" and appending it" if spec.kind == "allreduce" else ""))
    return transfers, predicted


def _inverse_name(spec: CollectiveSpec) -> str:
    return "reduce" if spec.kind == "reduce" else "reducescatter"


def _report(stage, result, build_s, num_vars, num_rows, num_bin, message: str = "") -> StageReport:
    return StageReport(stage, result.status.value, result.objective, result.best_bound, result.gap,
                       build_s + result.wall_time_s, num_vars, num_rows, num_bin,
                       "; ".join(filter(None, [message, result.message])))


def _mirrored(graph, sched, logical, origin) -> list[float]:
    """Priority of each inverted transfer: the copy schedule run backwards (the inverse of a transfer that
    arrives at time a of a makespan T starts at T - a). Without the one-at-a-time reduction of a chunk's
    receives that is a schedule of the inverted graph as fast as the copy one (links, ports and dependencies
    all mirror), so listing in that order is a good start for the reducing half."""
    lat = ordering.lat_of(graph, logical)
    size: dict = {}
    for t, g in enumerate(sched.group):
        if g is not None:
            size[g] = size.get(g, 0) + 1
    ends = []
    for t in range(len(graph)):
        link = logical.links[graph.link(t)]
        g = sched.group[t]
        ends.append(sched.start_us[t] + (link.lat_of(size[g]) if g is not None else lat[t]))
    T = max(ends, default=0.0)
    return [T - ends[o] for o in origin]


def _order_and_schedule(graph, logical, solver, options, stages, notes, suffix, priority=None):
    t = _time.perf_counter()
    orders = ordering.order(graph, logical, options.ordering, priority if options.ordering == "auto" else None)
    stages.append(StageReport("ordering" + suffix, "heuristic", orders.makespan_us, None, None,
                              _time.perf_counter() - t, message=f"heuristic {orders.heuristic}"))
    if len(graph) == 0:
        sched = scheduling.list_schedule(orders)
        stages.append(StageReport("scheduling" + suffix, Status.OPTIMAL.value, 0.0, 0.0, 0.0, 0.0))
        return sched, orders
    r3 = scheduling.solve_schedule(graph, orders, logical, solver, options, "scheduling" + suffix.replace(":", "-"))
    report = _report("scheduling" + suffix, r3.result, r3.build_s, r3.num_vars, r3.num_rows, r3.num_binaries)
    if r3.schedule is None:
        notes.append(f"stage 3{suffix} found no schedule ({r3.result.status.value}, limit "
                     f"{options.time_limit_s} s): using the stage-2 list schedule without merged sends")
        stages.append(StageReport(report.stage, "fallback", orders.makespan_us, None, None, report.wall_time_s,
                                  report.num_vars, report.num_constraints, report.num_binaries,
                                  f"stage 3 {r3.result.status.value}: {r3.result.message}"))
        return scheduling.list_schedule(orders), orders
    stages.append(report)
    return r3.schedule, orders


def _transfers(graph, sched, logical, step_offset: int, time_offset: float, group_offset: int = 0) -> list[Transfer]:
    steps = assign_steps(graph, sched, logical)
    out = []
    for t in range(len(graph)):
        g = sched.group[t]
        out.append(Transfer(graph.chunk[t], graph.src[t], graph.dst[t], steps[t] + step_offset, graph.reduce[t],
                            sched.start_us[t] + time_offset,
                            None if g is None else g + group_offset))
    return out


def assign_steps(graph, sched, logical) -> list[int]:
    """Topological numbering by start time: transfers in order of start (dependencies first), equal start
    times (within 1e-6 of the largest latency) share a step, a transfer's step exceeds those of the
    transfers that deliver its data, and members of one merged send share a step."""
    n = len(graph)
    if n == 0:
        return []
    eps = 1e-6 * logical.max_lat
    children = graph.children()
    pending = [len(ds) for ds in graph.deps]
    heap = [(sched.start_us[t], t) for t in range(n) if pending[t] == 0]
    heapq.heapify(heap)
    step = [0] * n
    cur, last = 0, -math.inf
    while heap:
        s, t = heapq.heappop(heap)
        if s > last + eps:
            cur, last = cur + 1, s
        need = max((step[d] + 1 for d in graph.deps[t]), default=1)
        if need > cur:
            cur, last = need, s
        step[t] = cur
        for ch in children[t]:
            pending[ch] -= 1
            if pending[ch] == 0:
                heapq.heappush(heap, (sched.start_us[ch], ch))
    # merged sends share a step; re-establish dependencies until stable (no cycles: members are ready together)
    members: dict = {}
    for t in range(n):
        if sched.group[t] is not None:
            members.setdefault(sched.group[t], []).append(t)
    order = sorted(range(n), key=lambda t: (sched.start_us[t], step[t]))
    for _ in range(n + 1):
        changed = False
        for ts in members.values():
            top = max(step[t] for t in ts)
            for t in ts:
                if step[t] != top:
                    step[t], changed = top, True
        for t in order:
            need = max((step[d] + 1 for d in graph.deps[t]), default=1)
            if step[t] < need:
                step[t], changed = need, True
        if not changed:
            break
    return step


def _no_routing_message(r1, options, logical) -> str:
    status = r1.result.status.value
    return (f"TACCL stage 1 (routing MILP, {r1.num_binaries} binaries, time limit {options.time_limit_s} s) "
            f"found no routing: {status}{': ' + r1.result.message if r1.result.message else ''}. "
            "Try a longer time_limit_s, larger chunks (fewer per rank), a sketch with fewer links or more "
            "symmetry, path_restriction='links', or a larger hop_slack if the symmetry or sender maps make "
            "shortest paths unusable.")

"""`mlopt plan collective`: pick the fastest proven-correct algorithm for a collective on a topology.

Every candidate (TACCL synthesis from a sketch, spanning-tree packing, and the baselines) goes through
the same pipeline: a chunk-level Algorithm, proven by `check_algorithm`; lowered to an MSCCL-EF program,
proven again by the symbolic executor (postcondition, deadlocks, dependencies, limits); timed by the
network simulator at the requested size. The fastest wins; the plan records every candidate.

Plan status: the topology's lower bound (`mlopt.sim.bounds`) bounds every algorithm, so the plan's
best_bound is that bound and the gap is measured against it. "optimal" only when the chosen algorithm's
simulated time meets the bound within --mip-gap; otherwise "feasible" when a solver was involved in
making the winner (taccl, trees) and "heuristic" for baselines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from mlopt.errors import InfeasibleError, InputError
from mlopt.formats.importers.taccl import Sketch, import_taccl_sketch
from mlopt.formats.msccl import Program
from mlopt.formats.plan import Plan, PlanStatus, Provenance, input_hashes
from mlopt.formats.topology import Topology, unreachable_ranks
from mlopt.planners.collective import baselines, trees_schedule
from mlopt.planners.collective.algorithm import Algorithm, check_algorithm
from mlopt.planners.collective.lowering import LoweringError, lower
from mlopt.planners.collective.taccl import SynthesisOptions, synthesize
from mlopt.planners.collective.trees import packing_lp
from mlopt.planners.options import PlannerOptions
from mlopt.sim.bounds import lower_bound
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.network import simulate_program
from mlopt.sim.symbolic import check_program
from mlopt.solvers import resolve_solver

ALGORITHMS = ("auto", "taccl", "ring", "tree", "direct", "hierarchical", "trees")
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce")
SOLVER_MADE = frozenset({"taccl", "trees"})


@dataclass(frozen=True)
class CollectiveOptions:
    collective: str  # --collective: allgather | reducescatter | allreduce | alltoall | broadcast | reduce
    size_bytes: int  # --size: nccl-tests' convention (output per rank for allgather/alltoall, input for reducescatter)
    algorithm: str = "auto"  # --algorithm: auto (best simulated) or one of ALGORITHMS
    instances: int = 1  # --instances: copies of the program over sub-chunks, each on its own channels
    proto: str = "Simple"  # --proto: Simple | LL | LL128 (recorded in the XML)
    xml_dialect: str = "executor"  # --xml-dialect: executor (strict) | legacy
    root: int = 0  # --root: broadcast and reduce


@dataclass(frozen=True)
class Candidate:
    label: str  # e.g. "taccl[sketch=sk.json]", "ring"
    family: str  # one of ALGORITHMS (not auto)
    build: Callable[[], tuple[Algorithm, dict[str, Any]]]  # algorithm and what made it (stages, notes)


@dataclass
class Outcome:
    label: str
    family: str
    ok: bool
    reason: str = ""
    time_us: float | None = None
    program: Program | None = None
    algorithm: Algorithm | None = None
    made: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0

    def row(self, record_wall_time: bool) -> dict[str, Any]:
        row = {"algorithm": self.label, "family": self.family, "ok": self.ok, "reason": self.reason,
               "time_us": self.time_us}
        if record_wall_time:
            row["wall_time_s"] = self.wall_time_s
        return row


def _spec(topology: Topology, copts: CollectiveOptions, chunks_per_rank: int = 1) -> CollectiveSpec:
    return CollectiveSpec(copts.collective, topology.num_ranks, chunks_per_rank, copts.root)


def _taccl(topology: Topology, sketch: Sketch | None, sketch_source: str, copts: CollectiveOptions,
           options: PlannerOptions, uc_threshold_bytes: float | None = None):
    def build() -> tuple[Algorithm, dict[str, Any]]:
        kwargs = dict(solver=options.solver, time_limit_s=options.time_limit_s or 60.0, node_limit=options.node_limit,
                      mip_gap=options.mip_gap,
                      threads=options.threads, seed=options.seed,
                      dump_model=options.dump_model[:-4] if options.dump_model and options.dump_model.endswith(".mps")
                      else options.dump_model)
        if uc_threshold_bytes is not None:
            kwargs["uc_threshold_bytes"] = uc_threshold_bytes
        k = sketch.input_chunkup if sketch else 1
        result = synthesize(topology, sketch, _spec(topology, copts, k), copts.size_bytes,
                            SynthesisOptions(**kwargs), sketch_source=sketch_source)
        stages = [{"stage": s.stage, "status": s.status, "objective_us": s.objective_us,
                   "best_bound_us": s.best_bound_us, "gap": s.gap, "wall_time_s": s.wall_time_s}
                  for s in result.stages]
        return result.algorithm, {"stages": stages, "notes": list(result.notes), "status": result.status,
                                  "predicted_time_us": result.predicted_time_us,
                                  "family_bound_us": result.best_bound_us}

    return build


def _baseline(name: str, topology: Topology, copts: CollectiveOptions):
    def build() -> tuple[Algorithm, dict[str, Any]]:
        fn = {"ring": baselines.ring, "tree": baselines.double_binary_tree, "direct": baselines.direct,
              "hierarchical": baselines.hierarchical}[name]
        return fn(topology, _spec(topology, copts)), {}

    return build


def _trees(topology: Topology, copts: CollectiveOptions, options: PlannerOptions):
    def build() -> tuple[Algorithm, dict[str, Any]]:
        kind = copts.collective
        mode = "allreduce" if kind in ("allreduce", "reducescatter", "reduce") else "broadcast" if kind == "broadcast" else "allgather"
        root = copts.root if kind in ("broadcast", "reduce") else None
        packing = packing_lp(topology, options=options, mode=mode, root=root)
        k = trees_schedule.choose_chunks_per_rank(topology, packing, kind=kind, buffer_bytes=copts.size_bytes, root=root,
                                                 max_chunks_per_rank=TREES_MAX_CHUNKS_PER_RANK)
        fn = {"allreduce": trees_schedule.tree_allreduce, "reduce": trees_schedule.tree_reduce,
              "broadcast": trees_schedule.tree_broadcast, "allgather": trees_schedule.tree_allgather,
              "reducescatter": trees_schedule.tree_reducescatter}.get(kind)
        if fn is None:
            raise ValueError(f"spanning trees do not implement {kind}")
        alg = fn(topology, _spec(topology, copts, k), packing, copts.size_bytes)
        return alg, {"capacity": getattr(packing, "capacity", None), "trees": len(getattr(packing, "trees", ()))}

    return build


# Per MILP stage when auto tries several candidates and neither --time-limit nor --node-limit is given: a node
# limit, so that the plan is the same on every run, with a wall-clock limit as a safety net only.
AUTO_STAGE_NODE_LIMIT = 500
AUTO_STAGE_TIME_LIMIT_S = 60.0
TREES_MAX_CHUNKS_PER_RANK = 8  # keeps tree programs small enough to lower, prove and simulate quickly


def default_sketches(topology: Topology) -> list[tuple[Sketch, str]]:
    """Relay sketches in the style of TACCL's published ones, derived from the topology's NICs.

    Multi-node topologies only: the GPUs sharing a NIC funnel their chunks through one sender, which sends
    to the same local GPU of the other nodes (TACCL's sk1 for DGX-2: odd GPUs relay for their pair); one
    NIC per node (NDv2) relays everything through GPU 0 to GPU 1 (TACCL's sk1-ndv2).
    """
    if topology.num_nodes < 2 or not topology.nics:
        return []
    gpus = len(topology.nodes[0].ranks)
    if any(len(n.ranks) != gpus for n in topology.nodes):
        return []
    first = topology.nodes[0].ranks[0]
    groups = [tuple(r - first for r in nic.ranks) for nic in topology.nics if nic.node == topology.nodes[0].name]
    switched = [s for s in topology.switches if s.kind == "nvswitch"]
    intra = ({"strategy": "switch", "switches": [list(range(gpus))], "switch_hyperedge_strategy": ["uc-min"]}
             if switched else {"strategy": "none"})
    total = topology.num_ranks
    if len(groups) == 1:  # one NIC for the whole node
        conn, rev, sym, chunkup = {"0": [1]}, {}, [[gpus, total]], 1
    else:
        conn = {str(g[-1]): [g[0]] for g in groups}
        rev = {str(g[-1]): list(g) for g in groups}
        sym, chunkup = [[len(groups[0]), gpus], [gpus, total]], 2
    doc = {"nnodes": topology.num_nodes, "intranode_sketch": intra,
           "internode_sketch": {"strategy": "relay", "internode_conn": conn, "gpus_to_sender_rev_map": rev,
                                "enforce_ordering": bool(rev)},
           "symmetry_offsets": sym, "hyperparameters": {"input_chunkup": chunkup}}
    name = f"<relay sketch for {topology.name}>"
    return [(import_taccl_sketch(doc, name), name)]


def candidates(topology: Topology, copts: CollectiveOptions, options: PlannerOptions,
               sketches: list[tuple[Sketch, str]]) -> list[Candidate]:
    """What to try: the requested family, or for auto every family that applies to the collective."""
    families = [copts.algorithm] if copts.algorithm != "auto" else list(ALGORITHMS[1:])
    if copts.algorithm == "auto" and options.time_limit_s is None and options.node_limit is None:
        options = replace(options, time_limit_s=AUTO_STAGE_TIME_LIMIT_S, node_limit=AUTO_STAGE_NODE_LIMIT)
    out: list[Candidate] = []
    for family in families:
        if family == "taccl":
            if sketches:
                out += [Candidate(f"taccl[sketch={src}]", "taccl", _taccl(topology, sk, src, copts, options))
                        for sk, src in sketches]
                continue
            if any(s.kind == "nvswitch" for s in topology.switches) and copts.algorithm == "auto":
                # Both switch-hyperedge strategies instead of the size-based default.
                out.append(Candidate("taccl[uc-min]", "taccl",
                                     _taccl(topology, None, "<default sketch>", copts, options, 0.0)))
                out.append(Candidate("taccl[uc-max]", "taccl",
                                     _taccl(topology, None, "<default sketch>", copts, options, float("inf"))))
            else:
                out.append(Candidate("taccl", "taccl", _taccl(topology, None, "<default sketch>", copts, options)))
            if copts.algorithm == "auto" and copts.collective != "alltoall":
                out += [Candidate("taccl[relay]", "taccl", _taccl(topology, sk, src, copts, options))
                        for sk, src in default_sketches(topology)]
        elif family == "trees":
            out.append(Candidate("trees", "trees", _trees(topology, copts, options)))
        else:
            out.append(Candidate(family, family, _baseline(family, topology, copts)))
    return out


def declare_proven_modes(program: Program) -> Program:
    """`program` declaring in place as well when the checker proves it correct with its input and output as one
    buffer (the in-place layout of mlopt.sim.symbolic): a job calling the collective in place (torch's
    all_reduce and broadcast) then runs it on the tensor itself, without staging the output and copying it
    back. Unchanged when it already declares both modes or fails in place."""
    if program.inplace and program.outofplace:
        return program
    variant = not program.inplace  # the mode the program does not declare yet
    if not check_program(program, inplace=variant).ok:
        return program
    return replace(program, inplace=True, outofplace=True)


def evaluate(candidate: Candidate, topology: Topology, copts: CollectiveOptions) -> Outcome:
    """Build, prove, lower, prove again, simulate. Failures are outcomes, not exceptions."""
    started = time.perf_counter()
    outcome = Outcome(candidate.label, candidate.family, ok=False)
    try:
        alg, made = candidate.build()
        outcome.algorithm, outcome.made = alg, made
        problems = check_algorithm(alg)
        if problems:
            outcome.reason = f"algorithm fails its postcondition: {problems[0]}"
            return outcome
        program = lower(alg, instances=copts.instances, proto=copts.proto, name=f"{copts.collective}_{candidate.label}")
        report = check_program(program)
        if not report.ok:
            first = (report.problems + report.deadlock)[:1]
            outcome.reason = f"lowered program rejected by the checker: {first[0] if first else 'unknown'}"
            return outcome
        sim = simulate_program(program, topology, copts.size_bytes)
        outcome.ok, outcome.time_us, outcome.program = True, sim.time_us, declare_proven_modes(program)
    except InfeasibleError as exc:
        outcome.reason = str(exc)
    except InputError:
        raise  # bad user input (e.g. a sketch naming missing GPUs) stops the run: exit 2
    except (ValueError, LoweringError, KeyError, NotImplementedError) as exc:
        outcome.reason = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.wall_time_s = time.perf_counter() - started
    return outcome


@dataclass(frozen=True)
class CollectivePlan:
    plan: Plan
    program: Program


def plan_collective(topology: Topology, copts: CollectiveOptions, options: PlannerOptions, *,
                    inputs: dict[str, Any], sketches: list[tuple[Sketch, str]] = (),
                    progress: Callable[[str], None] | None = None) -> CollectivePlan:
    """Try the candidates, keep the fastest proven-correct one; InfeasibleError when none works."""
    if copts.collective not in COLLECTIVES:
        raise InputError("--collective", "$", f"unknown collective {copts.collective!r}")
    unreachable = unreachable_ranks(topology)
    if unreachable:
        raise InputError(str(inputs.get("topology") or topology.name), "$.links", f"the topology is disconnected: rank 0 cannot reach rank(s) "
                         f"{', '.join(map(str, unreachable[:8]))}{' ...' if len(unreachable) > 8 else ''} "
                         "(or they cannot reach it), so no collective over all ranks exists")
    shares = 1 if copts.collective in ("broadcast", "reduce") else topology.num_ranks
    if copts.size_bytes % shares:
        raise InputError("--size", "$", f"{copts.size_bytes} bytes do not split into {shares} equal rank shares "
                         f"for {copts.collective} on {topology.name}; use a multiple of {shares}")
    if copts.root >= topology.num_ranks:
        raise InputError("--root", "$", f"rank {copts.root} is not in {topology.name} ({topology.num_ranks} ranks)")
    report = progress or (lambda message: None)
    started = time.perf_counter()
    outcomes = []
    for candidate in candidates(topology, copts, options, list(sketches)):
        report(f"{candidate.label}")
        outcomes.append(evaluate(candidate, topology, copts))
    good = sorted((o for o in outcomes if o.ok), key=lambda o: (o.time_us, o.label))
    if not good:
        tried = "; ".join(f"{o.label}: {o.reason}" for o in outcomes)
        raise InfeasibleError(f"no algorithm for {copts.collective} on {topology.name} passed synthesis, "
                              f"proof and simulation (tried {tried}); try --algorithm ring, a longer "
                              f"--time-limit or another sketch")
    best = good[0]
    bound = lower_bound(copts.collective, topology, copts.size_bytes, root=copts.root)
    gap = max(0.0, (best.time_us - bound.time_us) / best.time_us) if best.time_us > 0 else 0.0
    if gap <= options.mip_gap:
        status = PlanStatus.OPTIMAL
    else:
        status = PlanStatus.FEASIBLE if best.family in SOLVER_MADE else PlanStatus.HEURISTIC
    wall = time.perf_counter() - started
    payload = {
        "collective": copts.collective,
        "size_bytes": copts.size_bytes,
        "topology": topology.name,
        "ngpus": topology.num_ranks,
        "algorithm": best.label,
        "predicted_time_us": best.time_us,
        "algbw_GBps": copts.size_bytes / best.time_us / 1e3,
        "lower_bound": bound.to_dict(),
        "ratio_to_bound": best.time_us / bound.time_us if bound.time_us > 0 else None,
        "instances": copts.instances,
        "proto": copts.proto,
        "xml_dialect": copts.xml_dialect,
        "candidates": [o.row(options.record_wall_time) for o in outcomes],
        "synthesis": _strip_wall_times(best.made, options.record_wall_time),
    }
    solver_name, solver_version = _solver_of(best, options)
    provenance = Provenance(input_hashes(inputs), solver_name, solver_version,
                            {**options.to_dict(), "collective": copts.collective, "size_bytes": copts.size_bytes,
                             "algorithm": copts.algorithm, "instances": copts.instances, "proto": copts.proto,
                             "xml_dialect": copts.xml_dialect, "root": copts.root})
    notes = tuple(best.made.get("notes", ()))
    plan = Plan("collective", status, best.time_us, bound.time_us, gap, wall, payload, provenance, notes)
    return CollectivePlan(plan, best.program)


def _strip_wall_times(value: Any, keep: bool) -> Any:
    """Solve times vary run to run: kept only with --record-wall-time (plans must be byte-identical)."""
    if isinstance(value, dict):
        return {k: _strip_wall_times(v, keep) for k, v in value.items() if keep or k != "wall_time_s"}
    if isinstance(value, list):
        return [_strip_wall_times(v, keep) for v in value]
    return value


def _solver_of(outcome: Outcome, options: PlannerOptions) -> tuple[str, str]:
    if outcome.family not in SOLVER_MADE:
        return "none", ""

    solver, _ = resolve_solver(options.solver)
    return solver.name, solver.version()

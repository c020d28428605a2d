"""`mlopt simulate --model trace.json --topology T [PLANS...]`: one training iteration (or several, chained)
simulated through the three layers, optionally under plans.

* Workload: the trace (`mlopt.sim.workload.from_trace`) or a synthetic spec (`--workload dp:ranks=1024,...`).
* System: every collective of the workload timed by `mlopt.sim.collective_algorithms.collective_time` with
  the chosen algorithm (or an MSCCL-EF XML plan whose collective and rank count match), memoised per distinct
  (collective, bytes, group, pairs). A permute has no algorithm to choose: `permute_time` sends all its pairs'
  messages at once, sharing links and NICs fairly whatever --mode (a permute's sends are simultaneous).
* Network: `mlopt.sim.network`'s alpha-beta model, congestion-unaware (every message alone on its link) or
  congestion-aware (messages of one collective share links, ports and NICs fairly).

Plans: an MSCCL-EF XML (collective plan) replaces the algorithm of the collectives it implements. Every other
plan kind is applied to the workload before it gets here, by its planner's entry in mlopt.planners.registry
(a memory plan adds its recomputations, a thread plan re-buckets the gradients, a schedule plan replaces its
comm-ops by motifs and orders them): this layer knows workloads, not plans. Workload rank r runs on topology
rank r.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlopt.errors import InputError
from mlopt.formats.io import read_bytes
from mlopt.formats.loaders import load_any
from mlopt.formats.msccl_xml import parse_program
from mlopt.formats.plan import load_plan
from mlopt.sim.collective_algorithms import collective_time, permute_time
from mlopt.sim.training import SimOptions, simulate_iteration


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

    size = load_plan(str(sidecar)).payload.get("size_bytes")
    return int(size) if isinstance(size, (int, float)) else None


def xml_plans(paths: Sequence[str]) -> list[XmlPlan]:
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


def _index_entries(index_path: str, index) -> list[str]:
    """The plan files a plan index (`mlopt plan --model -o DIR`'s index.json) lists, beside it."""
    folder = Path(index_path).parent
    entries = index.plans if hasattr(index, "plans") else index.get("plans", [])
    return [str(folder / (e.file if hasattr(e, "file") else e["file"])) for e in entries]


@dataclass(frozen=True)
class PlanFiles:
    """The plans of a simulation: MSCCL-EF XMLs (applied by the system layer) and the other plan files."""

    xmls: tuple[str, ...] = ()
    plans: tuple[tuple[str, str], ...] = ()  # (kind, path) of each other plan, in the order given
    left_out: tuple[str, ...] = ()  # plans of an index that are of none of the applied kinds


def classify_plans(paths: Sequence[str], applied_kinds: Collection[str] | None = None) -> PlanFiles:
    """The plans sorted by what applies them. A plan index stands for the plans it lists; of those, the plans of
    a kind not in `applied_kinds` (None: every kind) are left out (named). A plan whose payload names its
    MSCCL-EF XML (a collective plan's sidecar) stands for that XML beside it."""
    xmls, plans, left_out = [], [], []
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
        if from_index and applied_kinds is not None and kind not in applied_kinds:
            left_out.append(f"{path} ({kind})")
            continue
        xml_name = loaded.value.payload.get("xml") if loaded.kind == "plan" else None
        if isinstance(xml_name, str):
            xml = Path(path).with_name(xml_name)
            if not xml.exists():
                raise InputError(path, "kind", f"a {kind} plan's algorithm is its XML; {xml} is missing")
            xmls.append(str(xml))
        else:
            plans.append((kind, path))
    return PlanFiles(tuple(xmls), tuple(plans), tuple(left_out))


def evaluate(workload, topology, options: EvaluateOptions, plans: Sequence[XmlPlan] = (), *, source: str = "workload",
             order: tuple[int, ...] = ()):
    """Simulate `workload` (already chained and with its plans applied) on `topology`; `order` (from a schedule
    plan) issues the collectives in that order instead of `options.policy`."""
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

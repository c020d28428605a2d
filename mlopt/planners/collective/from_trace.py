"""The collective planner inside `mlopt plan --model`: one algorithm per distinct collective of the trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.formats.sizes import format_size
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.protocol import WrittenPlan
from mlopt.planners.collective.output import write_collective_plan
from mlopt.planners.collective.planner import COLLECTIVES, CollectiveOptions, plan_collective
from mlopt.planners.options import PlannerOptions


def group_size(trace: ModelTrace, group: str) -> int:
    for g in trace.process_groups:
        if g.name == group and g.ranks:
            return len(g.ranks)
    return trace.world_size


def collectives_of(trace: ModelTrace) -> list[tuple[str, int, int]]:
    """Distinct (collective, bytes, group size) of the trace's comm ops, in first-seen order."""
    seen: dict[tuple[str, int, int], None] = {}
    for op in trace.ops:
        if op.comm is not None and op.comm.collective in COLLECTIVES and op.comm.bytes > 0:
            seen.setdefault((op.comm.collective, op.comm.bytes, group_size(trace, op.comm.group)), None)
    return list(seen)


def why_not(trace: ModelTrace, topology: Topology | None) -> str | None:
    found = collectives_of(trace)
    if not found:
        return "the trace has no collectives to plan"
    if topology is None:
        return "needs --topology"
    sizes = sorted({n for _, _, n in found})
    if topology.num_ranks not in sizes:
        return (f"the trace's process groups have {', '.join(map(str, sizes))} ranks; topology {topology.name} "
                f"has {topology.num_ranks}")
    return None


def run(trace: ModelTrace, topology: Topology, options: PlannerOptions, out_dir: Path,
        inputs: dict[str, Any]) -> list[WrittenPlan]:
    written = []
    for collective, nbytes, ranks in collectives_of(trace):
        shares = 1 if collective in ("broadcast", "reduce") else ranks
        if ranks != topology.num_ranks or nbytes % shares:
            continue
        copts = CollectiveOptions(collective, nbytes)
        result = plan_collective(topology, copts, options, inputs=inputs)
        xml = out_dir / f"collective-{collective}-{format_size(nbytes)}.xml"
        _, sidecar = write_collective_plan(result, str(xml), copts, options)
        written.append(WrittenPlan(sidecar.name, result.plan))
    return written

"""`mlopt plan --model`: run every registered planner that applies and write an index of what happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt import __version__
from mlopt.formats import document
from mlopt.formats.io import write_json
from mlopt.formats.plan import input_hashes
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.options import PlannerOptions
from mlopt.planners.registry import planner_kinds


def plan_all(trace: ModelTrace, topology: Topology | None, options: PlannerOptions, out_dir: Path,
             inputs: dict[str, str | None]) -> dict[str, Any]:
    """Write one plan per applicable planner plus `index.json`; returns the index."""
    plans, skipped = [], []
    for kind in planner_kinds():
        reason = kind.why_not(trace, topology)
        if reason:
            skipped.append({"kind": kind.name, "reason": reason})
            continue
        for written in kind.run(trace, topology, options, out_dir, inputs):
            plans.append({"kind": kind.name, "file": written.file, "status": written.plan.status.value,
                          "objective": written.plan.objective, "gap": written.plan.gap})
    return write_plan_index(out_dir, plans, skipped, input_hashes(inputs))


def write_plan_index(out_dir: Path, plans: list[dict[str, Any]], skipped: list[dict[str, Any]],
                     input_digests: dict[str, str]) -> dict[str, Any]:
    """out_dir/index.json listing `plans` ({kind, file, status, objective, gap}) and `skipped` ({kind, reason});
    returns the index."""
    index = {
        **document.header(document.PLAN_INDEX),
        "mlopt_version": __version__,
        "inputs": input_digests,
        "plans": plans,
        "skipped": skipped,
    }
    write_json(out_dir / "index.json", index)
    return index

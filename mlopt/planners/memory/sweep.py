"""`mlopt plan memory --sweep 0.3,0.4,...,1.0`: one plan per budget ratio, a trade-off table and plot.

Ratios run in increasing order and each ILP is also offered the previous ratio's plan as a MIP start
(it fits the larger budget): the solve then starts from a plan at least as good as the previous one
whenever the start is accepted in full (`payload.ilp.warm_start` says). A single-budget `mlopt plan
memory` starts from the baselines only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable

from mlopt.errors import InfeasibleError, InputError
from mlopt.formats.io import write_json
from mlopt.planners.memory.planner import MemoryOptions, plan_memory
from mlopt.planners.memory.plots import plot_tradeoff
from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.options import PlannerOptions

MAX_SWEEP_POINTS = 100


def _ratio(text: str, flag: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise InputError(flag, "ratio", f"{text.strip()!r} is not a number") from None
    if not value.is_finite() or float(value) == math.inf:  # NaN, Infinity, or 1e400 (infinite as a float)
        raise InputError(flag, "ratio", f"{text.strip()!r} is not a finite number")
    if not value > 0:
        raise InputError(flag, "ratio", f"{text.strip()} must be positive")
    return value


def parse_ratios(text: str, flag: str = "--sweep") -> list[float]:
    """"0.3,0.5,0.7" or an arithmetic progression "0.3,0.4,...,1.0" (step from the first two terms)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if "..." in parts:
        if len(parts) != 4 or parts[2] != "...":
            raise InputError(flag, "ratios", "write a progression as FIRST,SECOND,...,LAST")
        first, second, last = (_ratio(parts[i], flag) for i in (0, 1, 3))
        step = second - first
        if step <= 0 or last < first:
            raise InputError(flag, "ratios", "a progression must increase")
        count = int((last - first) / step) + 1
        if count > MAX_SWEEP_POINTS:
            raise InputError(flag, "ratios", f"{count} points; at most {MAX_SWEEP_POINTS}")
        values = [first + step * n for n in range(count)]
    else:
        values = [_ratio(p, flag) for p in parts]
    if not values:
        raise InputError(flag, "ratios", "no ratios given")
    return sorted({float(v) for v in values})


def plan_file_name(ratio: float) -> str:
    return f"memory-{ratio:.2f}.plan.json"


def sweep_row(ratio: float, result: Any | None, error: InfeasibleError | None, algorithm: str) -> dict[str, Any]:
    if result is None:
        return {"budget_ratio": ratio, "algorithm": algorithm, "status": "infeasible", "file": None,
                "message": str(error)}
    plan, predicted = result.plan, result.plan.payload["predicted"]
    return {
        "budget_ratio": ratio, "algorithm": algorithm, "status": plan.status.value, "file": plan_file_name(ratio),
        "budget_bytes": plan.payload["budget_bytes"], "peak_bytes": predicted["peak_bytes"],
        "memory_ratio": predicted["memory_ratio"], "compute_us": predicted["compute_us"],
        "compute_overhead": predicted["compute_overhead"], "gap": plan.gap, "wall_time_s": plan.wall_time_s,
    }


def run_sweep(problem: MemoryProblem, ratios: list[float], options: MemoryOptions, planner_options: PlannerOptions,
              out_dir: Path, inputs: dict[str, Any],
              progress: Callable[[str], None] = lambda message: None) -> list[dict[str, Any]]:
    """Plan every ratio; write each plan, `sweep.json` and `sweep.png` into out_dir; return the rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    previous: tuple[tuple[str, Any], ...] = ()  # ratios ascend: a smaller budget's plan fits every larger one
    for ratio in ratios:
        progress(f"budget ratio {ratio:.2f}")
        try:
            result = plan_memory(problem, replace(options, budget_ratio=ratio, budget_bytes=None),
                                 planner_options, inputs, progress, warm_candidates=previous)
        except InfeasibleError as exc:
            rows.append(sweep_row(ratio, None, exc, options.algorithm))
            continue
        previous = ((f"plan at ratio {ratio:.2f}", result.schedule),)
        write_json(out_dir / plan_file_name(ratio), result.plan.to_dict(planner_options.record_wall_time))
        rows.append(sweep_row(ratio, result, None, options.algorithm))
    table = {"model": problem.name, "algorithm": options.algorithm,
             "rows": [row if planner_options.record_wall_time else {k: v for k, v in row.items() if k != "wall_time_s"}
                      for row in rows]}
    write_json(out_dir / "sweep.json", table)
    plot_tradeoff({options.algorithm: rows}, out_dir / "sweep.png", title=f"{problem.name}: memory vs compute")
    return rows


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)

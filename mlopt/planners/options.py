"""Knobs shared by every planner; each has a CLI flag of the same name (see mlopt/cli.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from mlopt.solvers import SolveOptions


@dataclass(frozen=True)
class PlannerOptions:
    solver: str = "auto"  # --solver: auto | highs | cbc | gurobi (auto: gurobi with a full licence, else highs)
    time_limit_s: float | None = None  # --time-limit: stop and return the best plan found, with its gap
    node_limit: int | None = None  # --node-limit: stop each MILP after this many branch-and-bound nodes (reproducible)
    mip_gap: float = 1e-4  # --mip-gap: relative gap at which a MILP counts as solved
    threads: int = 1  # --threads: solver threads (1 keeps runs reproducible)
    seed: int = 0  # --seed: solver and heuristic random seed
    dump_model: str | None = None  # --dump-model: write the MILP as MPS here for offline re-solves
    record_wall_time: bool = False  # --record-wall-time: put the wall time in the plan (breaks byte-identity)

    def to_dict(self) -> dict[str, Any]:
        """The options that shape the plan, for provenance (output-only knobs left out)."""
        d = asdict(self)
        d.pop("dump_model")
        d.pop("record_wall_time")
        if d["node_limit"] is None:
            d.pop("node_limit")  # plans made before the knob existed keep their provenance
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PlannerOptions":
        """The options back from `to_dict` (a plan's provenance.options, a sweep's cell); the output-only knobs
        and any option left out take their defaults. An option PlannerOptions does not have is a ValueError
        (provenance.options of a collective plan also holds that planner's own options: pick the shared ones)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"PlannerOptions has no option {unknown[0]!r} (it has {', '.join(sorted(known))})")
        return cls(**data)

    def solve_options(self, dump_suffix: str = "") -> SolveOptions:
        """Options for one solve; a planner with several solves names each dump with a suffix."""
        dump = None
        if self.dump_model:
            stem = self.dump_model[:-4] if self.dump_model.endswith(".mps") else self.dump_model
            dump = f"{stem}{dump_suffix}.mps"
        return SolveOptions(time_limit_s=self.time_limit_s, node_limit=self.node_limit, mip_gap=self.mip_gap,
                            threads=self.threads, seed=self.seed, dump_model=dump)

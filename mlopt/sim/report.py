"""`mlopt simulate` rows: simulated time of each algorithm at each size, beside the topology's lower bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlopt.formats.loaders import load_any
from mlopt.formats.msccl import Program
from mlopt.formats.msccl_xml import load_program
from mlopt.errors import InputError
from mlopt.formats.topology import Topology
from mlopt.sim.bounds import BoundModel
from mlopt.sim.network import simulate_program


def _program_of(path: str) -> tuple[str, Program]:
    loaded = load_any(path)
    if loaded.kind == "msccl":
        return Path(path).stem, loaded.value
    if loaded.kind == "plan" and loaded.value.kind == "collective":
        xml = Path(path).parent / loaded.value.payload["xml"]
        return f"{Path(path).stem}:{loaded.value.payload['algorithm']}", load_program(xml)
    raise InputError(path, "$", f"cannot simulate a {loaded.kind}: give MSCCL-EF XML or a collective plan")


def simulation_rows(paths: list[str], topology: Topology, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        label, program = _program_of(path)
        if program.ngpus != topology.num_ranks:
            raise InputError(path, "algo@ngpus", f"{program.ngpus} ranks, but {topology.name} has {topology.num_ranks}")
        bounds = BoundModel(program.coll, topology)
        for size in sizes:
            sim = simulate_program(program, topology, size)
            bound = bounds.at(size)
            rows.append({"file": path, "algorithm": label, "collective": program.coll, "buffer_bytes": size,
                         "time_us": sim.time_us, "algbw_GBps": sim.algbw_GBps, "busbw_GBps": sim.busbw_GBps,
                         "bound_us": bound.time_us, "bound_term": bound.which})
    return rows

"""Size bands: the message sizes each MSCCL-EF file claims (its `minBytes`/`maxBytes`), and how MSCCL picks a file.

MSCCL's selection rule, as the executor implements it (Azure/msccl-executor-nccl
src/misc/msccl/msccl_lifecycle.cc, `mscclInternalSchedulerInit` and `mscclInternalSchedulerSelectAlgo`; the
external Azure/msccl-scheduler src/scheduler.cc does the same):

- every regular file (or link) of `MSCCL_ALGO_DIR` is read in `readdir` order, which no filesystem promises
  to be sorted; a file that does not parse as an algorithm fails the initialisation;
- a call of `count` elements is matched against the files in that order and the FIRST match runs:
  same collective, `ngpus == nRanks`, the call's in-place-ness allowed (`inplace` / `outofplace`),
  `count > 0`, `count % nchunksperloop == 0`, and `minBytes <= nBytes <= maxBytes` (both ends inclusive;
  `maxBytes == 0` means no upper limit) where `nBytes = count * sizeof(type) * sizeMultiplier`, the
  multiplier being ngpus for allgather, reducescatter and alltoall and 1 otherwise (msccl_parser.cc) -- the
  same byte count as mlopt's `--size`.
- The older microsoft/msccl runtime (the legacy dialect) matches `minBytes <= nBytes < maxBytes`
  (maxBytes exclusive, -1 for no limit) over the files of `MSCCL_XML_FILES` in the order given.

Since the order is not something a file set can rely on, mlopt never writes two files of one set whose
ranges meet: a band is a closed range [min_bytes, max_bytes] of sizes, bands of a set tile the swept sizes
with no gap and no overlap, and then every order of the files selects the same file for every size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from mlopt.errors import InputError
from mlopt.formats.importers.taccl import Sketch
from mlopt.formats.msccl import Program
from mlopt.formats.sizes import format_size
from mlopt.formats.topology import Topology
from mlopt.planners.collective.planner import CollectiveOptions, CollectivePlan, plan_collective
from mlopt.planners.options import PlannerOptions
from mlopt.sim.network import simulate_program

# Stop refining a boundary between two grid sizes once it is known within this fraction of the size.
CROSSOVER_RESOLUTION = 1 / 256
CROSSOVER_MAX_STEPS = 16


@dataclass(frozen=True)
class SizeBand:
    """Sizes [min_bytes, max_bytes], both inclusive as the executor compares them; a file set's bands tile
    [set_min_bytes, set_max_bytes] (a single-size plan is a set of one)."""

    min_bytes: int
    max_bytes: int
    set_min_bytes: int
    set_max_bytes: int

    def contains(self, nbytes: int) -> bool:
        return self.min_bytes <= nbytes <= self.max_bytes

    def to_dict(self) -> dict[str, int]:
        return {"min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "set_min_bytes": self.set_min_bytes,
                "set_max_bytes": self.set_max_bytes}


def exact_band(size_bytes: int) -> SizeBand:
    """A plan for one size claims that size only: the simulator timed nothing else."""
    return SizeBand(size_bytes, size_bytes, size_bytes, size_bytes)


def band_of(payload: dict[str, Any], source: str) -> SizeBand:
    """The band a sidecar records (InputError when it is missing or not a band)."""
    doc = payload.get("size_band")
    keys = ("min_bytes", "max_bytes", "set_min_bytes", "set_max_bytes")
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), int) for k in keys):
        raise InputError(source, "$.payload.size_band", "missing or not {min_bytes, max_bytes, set_min_bytes, "
                                                        "set_max_bytes} (re-plan with this mlopt)")
    band = SizeBand(*(doc[k] for k in keys))
    if not 1 <= band.set_min_bytes <= band.min_bytes <= band.max_bytes <= band.set_max_bytes:
        raise InputError(source, "$.payload.size_band", f"not ordered: {band.to_dict()}")
    return band


def xml_range(band: SizeBand, dialect: str) -> tuple[int, int]:
    """minBytes/maxBytes that make the runtime of `dialect` claim exactly the band's sizes."""
    if dialect == "legacy":
        return band.min_bytes, band.max_bytes + 1  # the old runtime's maxBytes is exclusive
    if band.max_bytes == 0:
        raise ValueError("maxBytes 0 would mean 'no limit' to the executor")  # sizes are >= 1: a bug if reached
    return band.min_bytes, band.max_bytes


def claimed_range(program: Program, dialect: str) -> tuple[int, float]:
    """The closed range of sizes a written program claims under its dialect's rule (inf: no upper limit)."""
    if dialect == "legacy":
        return program.min_bytes, program.max_bytes - 1
    return program.min_bytes, math.inf if program.max_bytes == 0 else program.max_bytes


def executor_matches(program: Program, collective: str, ngpus: int, nbytes: int, inplace: bool,
                     element_bytes: int = 4) -> bool:
    """mscclInternalSchedulerSelectAlgo's test of one file for a call of `nbytes` (mlopt's --size bytes)."""
    multiplier = ngpus if program.coll in ("allgather", "reducescatter", "alltoall") else 1
    count, rest = divmod(nbytes, element_bytes * multiplier)
    size_ok = (rest == 0 and count > 0 and count % program.nchunksperloop == 0
               and program.min_bytes <= nbytes and (program.max_bytes == 0 or nbytes <= program.max_bytes))
    return (size_ok and program.coll == collective and program.ngpus == ngpus
            and (program.inplace if inplace else program.outofplace))


def select_file(programs: Sequence[tuple[str, Program]], collective: str, ngpus: int, nbytes: int,
                inplace: bool = False, element_bytes: int = 4) -> str | None:
    """The first of `programs` (in the order the scheduler read them) that the executor runs for the call."""
    for name, program in programs:
        if executor_matches(program, collective, ngpus, nbytes, inplace, element_bytes):
            return name
    return None


Claim = tuple[str, tuple[int, float]]  # a file's name and the closed range of sizes it claims


def overlap(a: tuple[int, float], b: tuple[int, float]) -> tuple[int, float] | None:
    """The sizes two closed ranges share, if any."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo <= hi else None


def overlap_problems(claims: Sequence[Claim]) -> list[str]:
    """Every pair of files that claim a size in common."""
    problems = []
    for i, (name_a, range_a) in enumerate(claims):
        for name_b, range_b in claims[i + 1:]:
            shared = overlap(range_a, range_b)
            if shared:
                problems.append(f"{name_a} and {name_b} both claim {shared[0]}..{shared[1]} bytes: MSCCL runs "
                                "whichever it reads first (readdir order)")
    return problems


def gap_problems(claims: Sequence[Claim], set_range: tuple[int, int]) -> list[str]:
    """The sizes of `set_range` that no file claims."""
    problems, covered = [], set_range[0]
    for name, (lo, hi) in sorted(claims, key=lambda c: (c[1][0], c[1][1], c[0])):
        if lo > covered:
            problems.append(f"no file claims {covered}..{min(lo - 1, set_range[1])} bytes of the planned range "
                            f"{set_range[0]}..{set_range[1]} (the next file, {name}, starts at {lo})")
        covered = max(covered, hi + 1)
    if covered <= set_range[1]:
        problems.append(f"no file claims {covered}..{set_range[1]} bytes of the planned range "
                        f"{set_range[0]}..{set_range[1]}")
    return problems


def tiling_problems(claims: Sequence[Claim], set_range: tuple[int, int]) -> list[str]:
    """Why the files do not tile `set_range` with exactly one file per size (empty when they do)."""
    return overlap_problems(claims) + gap_problems(claims, set_range)


@dataclass(frozen=True)
class BandPlan:
    """One file of a sweep: the plan made at the first of its grid sizes, and the sizes it claims."""

    band: SizeBand
    planned: CollectivePlan
    copts: CollectiveOptions  # the options it was planned with (size_bytes: the first grid size of the band)
    grid_sizes: tuple[int, ...]  # the swept sizes whose best program this is


def _runs(programs: Sequence[Program]) -> list[tuple[int, int]]:
    """(first, last) indexes of the runs of equal adjacent programs."""
    runs: list[tuple[int, int]] = []
    for i, program in enumerate(programs):
        if runs and programs[runs[-1][1]] == program:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def crossover_bytes(below: Program, above: Program, topology: Topology, lo_bytes: int, hi_bytes: int) -> int:
    """The smallest size in (lo_bytes, hi_bytes] from which `above` is faster than `below` in the simulator
    (bisection, assuming one crossover; `below` is the best at lo_bytes, `above` at hi_bytes). hi_bytes when
    the simulator does not find `above` faster there: the grid then says where the best program changes."""
    def above_wins(nbytes: int) -> bool:
        return simulate_program(above, topology, nbytes).time_us < simulate_program(below, topology, nbytes).time_us

    if not above_wins(hi_bytes):
        return hi_bytes
    resolution = max(1, int(lo_bytes * CROSSOVER_RESOLUTION))
    for _ in range(CROSSOVER_MAX_STEPS):
        if hi_bytes - lo_bytes <= resolution:
            break
        mid = min(hi_bytes - 1, max(lo_bytes + 1, math.isqrt(lo_bytes * hi_bytes)))  # geometric: sizes span decades
        if above_wins(mid):
            hi_bytes = mid
        else:
            lo_bytes = mid
    return hi_bytes


def plan_size_bands(topology: Topology, copts: CollectiveOptions, options: PlannerOptions, sizes: Sequence[int], *,
                    inputs: dict[str, Any], sketches: Sequence[tuple[Sketch, str]] = (),
                    progress: Callable[[str], None] | None = None) -> list[BandPlan]:
    """Plan every size of the grid, merge adjacent sizes with the same best program into one band, and put
    each boundary where the simulator says the best program changes; the bands tile [min(sizes), max(sizes)]."""
    grid = sorted(set(sizes))
    if not grid:
        raise InputError("--sizes", "$", "no sizes to plan")
    report = progress or (lambda message: None)
    planned = []
    for size in grid:
        report(f"{format_size(size)}")
        planned.append(plan_collective(topology, replace(copts, size_bytes=size), options, inputs=inputs,
                                       sketches=list(sketches), progress=progress))
    runs = _runs([p.program for p in planned])
    starts = [grid[0]] + [crossover_bytes(planned[prev_last].program, planned[first].program, topology,
                                          grid[prev_last], grid[first])
                          for (_, prev_last), (first, _) in zip(runs, runs[1:])]
    ends = [start - 1 for start in starts[1:]] + [grid[-1]]
    return [BandPlan(SizeBand(start, end, grid[0], grid[-1]), planned[first],
                     replace(copts, size_bytes=grid[first]), tuple(grid[first:last + 1]))
            for (first, last), start, end in zip(runs, starts, ends)]


def band_file_name(collective: str, index: int, band: SizeBand) -> str:
    """`allreduce-00-1KiB-767KiB.xml`: the zero-padded index sorts the files by size, although with bands that
    never meet the scheduler's order does not matter."""
    return f"{collective}-{index:02d}-{format_size(band.min_bytes)}-{format_size(band.max_bytes)}.xml"

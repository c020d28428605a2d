"""Size bands of MSCCL-EF files: a sweep's files tile its sizes, MSCCL's first-match rule picks the planned file for
every size whatever order it reads the folder in, and validate refuses sets that overlap or leave gaps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlopt.errors import InputError
from mlopt.formats.loaders import resolve_topology
from mlopt.formats.msccl_xml import load_program
from mlopt.formats.sizes import parse_size_range
from mlopt.planners.collective.planner import CollectiveOptions, plan_collective
from mlopt.planners.collective.size_bands import SizeBand, claimed_range, exact_band, select_file, \
    tiling_problems, xml_range
from mlopt.planners.options import PlannerOptions
from mlopt.sim.network import simulate_program
from mlopt.validate import validate_file

SWEEP = "1KiB..64MiB"  # on ring:4, TACCL's program wins the small sizes and the ring the large ones


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from mlopt.cli import main

    folder = tmp_path_factory.mktemp("bands") / "allreduce"
    assert main(["-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--sizes", SWEEP,
                 "-o", str(folder)]) == 0
    return folder


def _scheduler_view(folder: Path) -> list[tuple[str, object]]:
    """The XMLs as MSCCL_ALGO_DIR would hold them (the sidecars stay out), in sorted path order."""
    return [(p.name, load_program(p)) for p in sorted(folder.glob("*.xml"))]


def _bands(folder: Path) -> dict[str, SizeBand]:
    out = {}
    for xml in sorted(folder.glob("*.xml")):
        band = json.loads(xml.with_suffix(".json").read_text())["payload"]["size_band"]
        out[xml.name] = SizeBand(band["min_bytes"], band["max_bytes"], band["set_min_bytes"], band["set_max_bytes"])
    return out


def test_a_sweep_writes_one_file_per_band_tiling_the_swept_sizes(sweep):
    bands = _bands(sweep)
    assert len(bands) >= 2, "the sweep should find where the best program changes"
    ranges = [(name, (b.min_bytes, b.max_bytes)) for name, b in bands.items()]
    lo, hi = parse_size_range(SWEEP)[0], parse_size_range(SWEEP)[-1]
    assert tiling_problems(ranges, (lo, hi)) == []
    assert tiling_problems(ranges[1:], (lo, hi)) and tiling_problems(ranges + ranges[:1], (lo, hi))
    for name, program in _scheduler_view(sweep):
        assert (program.min_bytes, program.max_bytes) == xml_range(bands[name], "executor")
    assert list(bands) == sorted(bands, key=lambda n: bands[n].min_bytes)  # names sort by size
    programs = {load_program(sweep / name) for name in bands}
    assert len(programs) == len(bands)  # adjacent sizes with the same best program were merged


def test_msccl_first_match_picks_the_program_planned_for_every_swept_size(sweep):
    topology = resolve_topology("ring:4")
    view = _scheduler_view(sweep)
    for size in parse_size_range(SWEEP):
        planned = plan_collective(topology, CollectiveOptions("allreduce", size), PlannerOptions(), inputs={}).program
        for order in (view, view[::-1]):  # readdir order is unspecified: the answer must not depend on it
            chosen = select_file(order, "allreduce", 4, size)
            assert chosen is not None, f"no file for {size} bytes"
            program = dict(view)[chosen]
            assert (program.name, program.gpus) == (planned.name, planned.gpus), size
            # the in-place call too: the plans declare both modes
            assert select_file(order, "allreduce", 4, size, inplace=True) == chosen


def test_each_size_of_the_range_goes_to_the_band_that_claims_it(sweep):
    view, bands = _scheduler_view(sweep), _bands(sweep)
    step = 64  # the executor also needs count % nchunksperloop == 0: the aligned sizes nearest each end
    for name, band in bands.items():
        first, last = -(-band.min_bytes // step) * step, band.max_bytes // step * step
        for size in (first, last, (first + last) // 2 // step * step):
            assert select_file(view, "allreduce", 4, size, element_bytes=1) == name, size
    assert select_file(view, "allreduce", 4, 1023, element_bytes=1) is None  # below the sweep: NCCL runs it
    assert select_file(view, "allreduce", 4, 64 * 2**20 + 8, element_bytes=1) is None
    assert select_file(view, "allgather", 4, 4096) is None and select_file(view, "allreduce", 8, 4096) is None


def test_boundaries_sit_where_the_simulator_says_the_best_program_changes(sweep):
    topology = resolve_topology("ring:4")
    ordered = sorted(_bands(sweep).items(), key=lambda item: item[1].min_bytes)
    for (below_name, below), (above_name, above) in zip(ordered, ordered[1:]):
        below_program, above_program = load_program(sweep / below_name), load_program(sweep / above_name)

        def faster_above(nbytes: int) -> bool:
            return (simulate_program(above_program, topology, nbytes).time_us
                    < simulate_program(below_program, topology, nbytes).time_us)

        assert faster_above(above.min_bytes)
        assert not faster_above(below.min_bytes)


def test_a_single_size_plan_claims_exactly_its_size(run_cli, tmp_path):
    out = tmp_path / "ar.xml"
    assert run_cli("-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--size", "1MiB",
                   "--algorithm", "ring", "-o", out).code == 0
    program = load_program(out)
    assert (program.min_bytes, program.max_bytes) == (2**20, 2**20)
    assert json.loads(out.with_suffix(".json").read_text())["payload"]["size_band"] == exact_band(2**20).to_dict()
    view = [("ar.xml", program)]
    assert select_file(view, "allreduce", 4, 2**20) == "ar.xml"
    assert select_file(view, "allreduce", 4, 2**20 + 32) is None and select_file(view, "allreduce", 4, 2**19) is None


def test_size_and_sizes_are_exclusive(run_cli, tmp_path):
    both = run_cli("plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--size", "1MiB",
                   "--sizes", "1KiB..1MiB", "-o", tmp_path / "x")
    neither = run_cli("plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "-o", tmp_path / "y")
    assert both.code == 2 and neither.code == 2 and "exactly one of --size and --sizes" in both.err


def test_validate_accepts_the_set_and_refuses_a_gap(sweep, tmp_path):
    for sidecar in sorted(sweep.glob("*.json")):
        validate_file(str(sidecar))
    gapped = tmp_path / "gapped"
    shutil.copytree(sweep, gapped)
    first = sorted(gapped.glob("*.xml"))[0]
    first.unlink()
    first.with_suffix(".json").unlink()
    with pytest.raises(InputError, match="no file claims"):
        validate_file(str(sorted(gapped.glob("*.json"))[0]))


def test_validate_refuses_a_file_that_overlaps_the_set(run_cli, sweep, tmp_path):
    overlapped = tmp_path / "overlapped"
    shutil.copytree(sweep, overlapped)
    assert run_cli("-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--size", "1MiB",
                   "--algorithm", "ring", "-o", overlapped / "zz-ring-1MiB.xml").code == 0
    with pytest.raises(InputError, match="both claim 1048576..1048576 bytes"):
        validate_file(str(overlapped / "zz-ring-1MiB.json"))
    result = run_cli("validate", *sorted(overlapped.glob("*.json")))
    assert result.code == 2 and "both claim" in result.err


def test_validate_refuses_a_sidecar_band_the_xml_does_not_claim(sweep, tmp_path):
    edited = tmp_path / "edited"
    shutil.copytree(sweep, edited)
    sidecar = sorted(edited.glob("*.json"))[-1]
    doc = json.loads(sidecar.read_text())
    doc["payload"]["size_band"]["max_bytes"] -= 1
    sidecar.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="the XML claims"):
        validate_file(str(sidecar))


def test_legacy_ranges_are_exclusive_at_the_top():
    band = SizeBand(1024, 4095, 1024, 4095)
    assert xml_range(band, "executor") == (1024, 4095)
    assert xml_range(band, "legacy") == (1024, 4096)
    program = plan_collective(resolve_topology("ring:4"), CollectiveOptions("allreduce", 4096, "ring"),
                              PlannerOptions(), inputs={}).program
    from dataclasses import replace
    for dialect in ("executor", "legacy"):
        lo, hi = xml_range(band, dialect)
        assert claimed_range(replace(program, min_bytes=lo, max_bytes=hi), dialect) == (1024, 4095)
    assert claimed_range(replace(program, min_bytes=0, max_bytes=0), "executor") == (0, float("inf"))


def test_a_sweep_refuses_a_folder_with_another_sweeps_bands(run_cli, sweep, tmp_path):
    folder = tmp_path / "again"
    shutil.copytree(sweep, folder)
    assert run_cli("-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--sizes",
                   SWEEP, "-o", folder).code == 0  # the same bands: rewritten in place
    stale = folder / "allreduce-07-1B-2B.xml"
    stale.write_text((folder / sorted(_bands(sweep))[0]).read_text())
    result = run_cli("plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--sizes", SWEEP,
                     "-o", folder)
    assert result.code == 2 and "allreduce-07-1B-2B.xml from another sweep" in result.err


def test_the_sweep_summary_lists_each_band(run_cli, tmp_path):
    result = run_cli("-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--sizes",
                     SWEEP, "-o", tmp_path / "s", "--json")
    assert result.code == 0
    bands = json.loads(result.out)["bands"]
    assert [b["algorithm"] for b in bands] == ["taccl", "ring"]
    assert bands[0]["min_bytes"] == 1024 and bands[-1]["max_bytes"] == 64 * 2**20
    assert bands[0]["max_bytes"] + 1 == bands[1]["min_bytes"]

"""`mlopt sweep`: grids of planner runs whose plans equal the direct `mlopt plan ...` commands' byte for byte,
on every executor and from the cache; failures recorded, --resume, spec errors exit 2."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mlopt.formats.io import write_json
from mlopt.formats.topology import from_spec

COLLECTIVE_SPEC = """
grids:
  - planner: collective
    options:
      algorithm: ring
    grid:
      collective: [allgather, allreduce]
      size: [16KiB, 32KiB, 64KiB]
      topology: ["ring:4", {topo}]
  - planner: collective
    name: direct
    options:
      algorithm: direct
      collective: alltoall
      size: 1MiB
    grid:
      topology: ["ring:4", "fully-connected:4"]
  - planner: collective
    name: sketched
    options:
      topology: ndv2x2
      collective: allgather
      size: 1MiB
    grid:
      sketch: [bad/sk.json]
"""
BAD_SKETCH = {"nnodes": 2, "intranode_sketch": {"strategy": "none"},
              "internode_sketch": {"strategy": "relay", "internode_conn": {"9": [1]}},
              "symmetry_offsets": [[8, 16]], "hyperparameters": {"input_chunkup": 1}}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """No test writes to the user's plan cache (~/.cache/mlopt/plans), whatever options it passes."""
    monkeypatch.setenv("MLOPT_CACHE", str(tmp_path / "default-cache"))


@pytest.fixture(scope="module")
def collective_spec(tmp_path_factory) -> Path:
    """12 ring cells (one topology from a file), 2 `direct` alltoall cells (ring:4 has none: exit 3) and a
    broken sketch (exit 2)."""
    folder = tmp_path_factory.mktemp("spec")
    write_json(folder / "topos" / "fc4.json", from_spec("fully-connected:4").to_dict())
    write_json(folder / "bad" / "sk.json", BAD_SKETCH)
    spec = folder / "grid.yaml"
    spec.write_text(COLLECTIVE_SPEC.format(topo="topos/fc4.json"))
    return spec


@pytest.fixture(scope="module")
def first_run(collective_spec, tmp_path_factory):
    """The spec through the local pool (2 workers), filling a fresh cache."""
    from mlopt.cli import main

    base = tmp_path_factory.mktemp("sweep")
    out, cache = base / "out", base / "cache"
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = main(["sweep", str(collective_spec), "-o", str(out), "--workers", "2", "--cache", str(cache), "--json"])
    return code, json.loads(stdout.getvalue()), out, cache, collective_spec


def plan_files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.suffix in (".xml", ".json", ".csv") and p.name != "summary.csv"}


def by_cell(rows) -> dict[str, dict]:
    return {f"{r['grid']}/{r['cell']}": r for r in rows}


def test_sweep_records_plans_and_failures(first_run):
    code, rows, out, _, _ = first_run
    assert code == 1, "some cells failed: exit 1"
    cells = by_cell(rows)
    assert len(rows) == 15
    ring = [r for r in rows if r["grid"] == "collective"]
    assert len(ring) == 12 and all(r["status"] == "heuristic" and r["cache"] == "miss" for r in ring)
    assert cells["collective/allgather-16KiB-ring_4"]["axes"] == {"collective": "allgather", "size": "16KiB",
                                                                   "topology": "ring:4"}
    assert "collective/allreduce-64KiB-fc4" in cells, "a topology file is named by its stem"
    none = cells["direct/ring_4"]
    assert none["status"] == "infeasible" and none["exit_code"] == 3 and "no algorithm for alltoall" in none["message"]
    assert cells["direct/fully-connected_4"]["status"] in ("heuristic", "optimal")
    bad = cells["sketched/sk"]
    assert bad["status"] == "error" and bad["exit_code"] == 2
    assert "bad/sk.json" in bad["message"] and "internode_conn" in bad["message"]
    assert not (out / "direct" / "ring_4.xml").exists() and not (out / "sketched" / "sk.json").exists()
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 16 and summary[0].startswith("grid,cell,")
    md = (out / "summary.md").read_text()
    assert "13 of 15 cells have plans" in md and "| allgather-16KiB-ring_4 |" in md
    for coll in ("allgather", "allreduce"):
        for topo in ("ring_4", "fc4"):
            assert (out / "collective" / f"algbw-{coll}-{topo}.png").read_bytes()[:4] == b"\x89PNG"


def test_cells_equal_the_direct_commands_byte_for_byte(first_run, run_cli, tmp_path):
    _, rows, out, _, spec = first_run
    done = [r for r in rows if r["exit_code"] == 0]
    for row in done:
        argv = shlex.split(row["command"])[1:]
        target = tmp_path / argv[-1].rsplit("/", 2)[-2] / Path(argv[-1]).name
        result = run_cli("-q", *argv[:-1], target)
        assert result.code == 0, result.err
        for suffix in (".xml", ".json"):
            assert target.with_suffix(suffix).read_bytes() == (out / row["grid"] / target.name).with_suffix(
                suffix).read_bytes(), row["cell"]
    # and from a fresh process, for one cell
    row = done[0]
    argv = shlex.split(row["command"])[1:]
    target = tmp_path / "fresh" / Path(argv[-1]).name
    subprocess.run([sys.executable, "-m", "mlopt.cli", "-q", *argv[:-1], str(target)], check=True)
    assert target.read_bytes() == (out / row["grid"] / target.name).read_bytes()
    sidecar = (out / row["grid"] / target.name).with_suffix(".json")
    assert target.with_suffix(".json").read_bytes() == sidecar.read_bytes()


def test_cache_hits_copy_identical_plans(first_run, run_cli, tmp_path):
    _, rows, out, cache, spec = first_run
    again = tmp_path / "again"
    result = run_cli("sweep", spec, "-o", again, "--workers", "1", "--cache", cache, "--json")
    assert result.code == 1
    cache_of = {f"{r['grid']}/{r['cell']}": r["cache"] for r in json.loads(result.out)}
    assert sum(v == "hit" for v in cache_of.values()) == 13
    assert cache_of["direct/ring_4"] == "miss" and cache_of["sketched/sk"] == "miss", "failures are not cached"
    assert plan_files(again) == plan_files(out)
    entries = list(cache.glob("*/*/entry.json"))
    assert len(entries) == 13


def test_resume_keeps_complete_plans_and_redoes_the_rest(first_run, run_cli, tmp_path):
    import shutil

    _, rows, out, _, spec = first_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    broken = copy / "collective" / "allreduce-16KiB-ring_4.json"
    broken.write_text(broken.read_text()[:100])  # a torn plan is not complete
    (copy / "collective" / "allgather-32KiB-ring_4.xml").unlink()  # nor is a sidecar without its XML
    result = run_cli("sweep", spec, "-o", copy, "--resume", "--no-cache", "--workers", "1", "--json")
    assert result.code == 1
    state = {f"{r['grid']}/{r['cell']}": r["cache"] for r in json.loads(result.out)}
    assert state["collective/allreduce-16KiB-ring_4"] == "off" and state["collective/allgather-32KiB-ring_4"] == "off"
    assert sum(v == "resumed" for v in state.values()) == 11
    assert plan_files(copy) == plan_files(out)


def test_dask_cluster_gives_the_same_plans(first_run, run_cli, tmp_path):
    distributed = pytest.importorskip("distributed")
    _, _, out, _, spec = first_run
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, host="127.0.0.1",
                                  protocol="tcp", dashboard_address=None) as cluster:  # loopback only
        result = run_cli("sweep", spec, "-o", tmp_path / "dask", "--executor", "dask",
                         "--address", cluster.scheduler_address, "--no-cache")
    assert result.code == 1 and "2 of 15 cells failed" in result.err
    assert plan_files(tmp_path / "dask") == plan_files(out)


def test_dask_without_address_starts_a_local_two_worker_cluster(first_run, run_cli, tmp_path):
    pytest.importorskip("distributed")
    _, _, out, _, spec = first_run
    result = run_cli("sweep", spec, "-o", tmp_path / "dask", "--executor", "dask", "--workers", "2", "--no-cache")
    assert result.code == 1
    assert plan_files(tmp_path / "dask") == plan_files(out)


def test_ray_cluster_gives_the_same_plans(first_run, run_cli, tmp_path):
    pytest.importorskip("ray")
    _, _, out, _, spec = first_run
    result = run_cli("sweep", spec, "-o", tmp_path / "ray", "--executor", "ray", "--workers", "2",
                     "--no-cache")
    assert result.code == 1
    assert plan_files(tmp_path / "ray") == plan_files(out)


def test_memory_threads_and_schedule_grids(ddp_example_trace, run_cli, tmp_path):
    spec = tmp_path / "mt.yaml"
    spec.write_text(f"""
grids:
  - planner: memory
    options: {{model: {ddp_example_trace}}}
    grid:
      algorithm: [greedy, store-all]
      budget-ratio: [0.9, 1.0]
  - planner: threads
    options: {{model: {ddp_example_trace}, chunks: 40}}
    grid:
      nodes: [2, 8]
  - planner: schedule
    options: {{model: {ddp_example_trace}, topology: "fully-connected:2", max-steps: 20}}
    grid:
      algorithm: [fifo, syndicate]
""")
    out = tmp_path / "out"
    result = run_cli("sweep", spec, "-o", out, "--workers", "2", "--no-cache", "--json")
    assert result.code == 1
    rows = by_cell(json.loads(result.out))
    assert rows["memory/greedy-0.9"]["status"] == "infeasible" and "least feasible budget" in \
        rows["memory/greedy-0.9"]["message"]
    assert rows["memory/store-all-1.0"]["status"] == "heuristic" and rows["memory/store-all-1.0"]["peak_bytes"] > 0
    assert rows["threads/8"]["status"] in ("optimal", "feasible")
    assert rows["schedule/syndicate"]["iteration_us"] > 0
    for name, row in rows.items():
        if row["exit_code"]:
            continue
        argv = shlex.split(row["command"])[1:]
        target = tmp_path / "direct" / Path(argv[-1]).name
        assert run_cli("-q", *argv[:-1], target).code == 0
        assert target.read_bytes() == (out / row["plan"]).read_bytes(), name
    assert (out / "threads" / "8.plan.nccl-tuner.csv").read_bytes() == \
        (tmp_path / "direct" / "8.plan.nccl-tuner.csv").read_bytes()


# ---------------------------------------------------------------------------------------------------------
# the spec and the cache key, without running cells


def load(tmp_path: Path, text: str):
    from mlopt.sweep import load_spec

    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    return load_spec(spec)


@pytest.mark.parametrize("text, field, fragment", [
    ("planner: collectve\n", "$.planner", "not a planner"),
    ("planner: collective\noptions: {topology: ring:4, collective: allgather}\n", "$",
     "needs exactly one of --size and --sizes"),
    ("planner: collective\noptions: {topology: ring:4, collective: allgather, size: 1MiB, sizes: 1KiB..1MiB}\n",
     "$", "needs exactly one of --size and --sizes (given: size, sizes)"),
    ("planner: collective\noptions: {topology: ring:4, size: 1MiB}\ngrid: {collective: [allgathr]}\n",
     "$.grid.collective[0]", "allgathr"),
    ("planner: collective\noptions: {topology: ring:4, size: 1MiB, colective: allgather}\n", "$.options.colective",
     "no option --colective"),
    ("planner: collective\noptions: {topology: ring:4, size: 1MiB}\ngrid: {collective: allgather}\n",
     "$.grid.collective", "expected a non-empty list"),
    ("planner: collective\noptions: {topology: ring:4, collective: allgather, size: [1KiB, 2KiB]}\n",
     "$.options.size", "list them under `grid:`"),
    ("planner: collective\noptions: {topology: ring:4, collective: allgather, size: 1MiB, output: a.xml}\n",
     "$.options.output", "names every cell's output"),
    ("planner: memory\noptions: {model: t.json, sweep: '0.5,1.0'}\n", "$.options.sweep", "grid axis"),
    ("planner: collective\noptions: {topology: ring:4, collective: allgather}\ngrid: {size: [1KiB, 1KiB]}\n",
     "$.grid.size[1]", "repeats"),
    ("planner: collective\noptions: {topology: ring:4, collective: allgather}\ngrid: {size: 1KiB..x}\n",
     "$.grid.size", "not a size"),
    ("grids:\n  - {planner: memory, options: {model: t.json, budget-ratio: 1}}\n"
     "  - {planner: memory, options: {model: t.json, budget-ratio: 0.5}}\n", "$.grids[1].name", "own `name`"),
    ("planner: threads\noptions: {model: t.json, nodes: 2}\nrecord_wall_time: true\n", "$.record_wall_time",
     "unknown key"),
    ("planner: threads\noptions: {model: t.json, nodes: 2, record_wall_time: 1}\n", "$.options.record_wall_time",
     "flag"),
])
def test_bad_specs_exit_2_naming_file_and_field(run_cli, tmp_path, text, field, fragment):
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    result = run_cli("sweep", spec, "-o", tmp_path / "out")
    assert result.code == 2, result.err
    assert f"{spec}: {field}:" in result.err and fragment in result.err and "\n" not in result.err.strip()
    assert not (tmp_path / "out").exists()


def test_missing_extra_exits_2_naming_it(run_cli, tmp_path, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text("planner: collective\noptions: {topology: ring:4, collective: allgather, size: 1MiB}\n")
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    result = run_cli("sweep", spec, "-o", tmp_path / "out", "--executor", "dask")
    assert result.code == 2 and "mlopt[dask]" in result.err
    local = run_cli("sweep", spec, "-o", tmp_path / "out", "--address", "tcp://127.0.0.1:1")
    assert local.code == 2 and "--address" in local.err


def test_names_paths_and_cache_keys(tmp_path):
    from mlopt.sweep.cache import cell_key

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        write_json(tmp_path / d / "sk.json", BAD_SKETCH)
    write_json(tmp_path / "t.json", from_spec("ring:4").to_dict())
    spec = load(tmp_path, """
planner: collective
options: {collective: allgather, size: 1MiB}
grid:
  topology: [t.json, "ring:4"]
  sketch: [a/sk.json, b/sk.json, [a/sk.json, b/sk.json]]
""")
    outputs = [c.output for c in spec.cells]
    assert len(set(outputs)) == 6, "same-named sketches get distinct files"
    assert outputs[2] == "collective/t-sk+sk.xml" and outputs[0].startswith("collective/t-sk-")
    first = spec.cells[0]
    assert f"--topology {tmp_path / 't.json'}" in " ".join(first.args), "relative paths: from the spec's folder"
    assert f"--sketch {tmp_path / 'a' / 'sk.json'}" in " ".join(first.args)
    assert "--topology ring:4" in " ".join(spec.cells[3].args), "presets stay names"
    sizes = load(tmp_path, "planner: collective\noptions: {topology: ring:4, collective: allgather}\n"
                           "grid: {size: 1KiB..1GiB}\n")
    assert [c.axes[0][1] for c in sizes.cells] == ["1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB",
                                                    "16MiB", "64MiB", "256MiB", "1GiB"]
    key = cell_key(first)
    assert key == cell_key(first)
    write_json(tmp_path / "t.json", from_spec("fully-connected:4").to_dict())
    assert cell_key(first) != key, "the key follows the input files' content"


def test_the_sweep_never_imports_the_command_line(tmp_path):
    """mlopt.cli imports the sweep for `mlopt sweep`; the sweep checks specs with the kinds' declared options and
    runs cells with their plan_files, so it needs neither mlopt.cli nor click (a cell's run: tests/planners/
    test_registry.py)."""
    spec = tmp_path / "s.yaml"
    spec.write_text("planner: collective\noptions: {topology: ring:4, collective: allgather}\n"
                    "grid: {size: [1KiB, 2KiB]}\n")
    code = ("import sys, mlopt.sweep, mlopt.sweep.cells, mlopt.sweep.executors, mlopt.sweep.report; "
            f"assert len(mlopt.sweep.load_spec({str(spec)!r}).cells) == 2; "
            "assert 'mlopt.cli' not in sys.modules, 'imported mlopt.cli'; "
            "assert 'click' not in sys.modules, 'imported click'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

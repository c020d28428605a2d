"""The ctypes binding (mlopt.native.binding) and the CPU runtime behind it, end to end.

Plans: the reference MSCCL-EF XMLs (shared/reference/msccl-xml, the repo's fixtures) and XMLs the collective
planner writes for small topologies (every algorithm family, 2 to 32 ranks, both XML dialects). Every run's
outputs are compared with the collective computed directly in numpy (mlopt.native.run_collective, whose
reference is itself checked against the symbolic postconditions in tests/cli/test_run_collective.py).

Skipped as a whole when the library is not built (`pip install -e .` builds it; see docs/runtime.md).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, SHARED_REFERENCE
from mlopt.native import binding as native

try:
    native.library()
except native.RuntimeLibraryNotFound as _missing:
    pytest.skip(f"mlopt runtime library unavailable: {_missing}", allow_module_level=True)

from mlopt.formats.msccl_contract import effective_program, in_place_only  # noqa: E402
from mlopt.formats.msccl_xml import load_program, write_program  # noqa: E402
from mlopt.native.run_collective import check_outputs, expected_outputs, random_inputs  # noqa: E402



def _reference_xmls() -> list[Path]:
    """Third-party XMLs (shared/reference, copied into runtime/tests/data) and the repo's fixtures, by name."""
    found: dict[str, Path] = {}
    for folder in (SHARED_REFERENCE / "msccl-xml", REPO / "runtime/tests/data", REPO / "tests/data/msccl"):
        for path in sorted(folder.glob("*.xml")):
            found.setdefault(path.name, path)
    return [found[name] for name in sorted(found)]


REFERENCE_XMLS = _reference_xmls()
MEMORY_PLAN = REPO / "runtime/tests/data/fc2_memory.plan.json"

# (topology, collective, algorithm, root): every family the planner has, on small topologies.
PLANNER_CASES = [
    ("ring:2", "allgather", "ring", 0),
    ("ring:4", "allgather", "taccl", 0),
    ("fully-connected:8", "allgather", "direct", 0),
    ("ring:4", "allreduce", "ring", 0),
    ("fully-connected:4", "allreduce", "tree", 0),
    ("fully-connected:4", "allreduce", "trees", 0),
    ("fully-connected:2", "allreduce", "direct", 0),
    ("ring:8", "reducescatter", "ring", 0),
    ("fully-connected:4", "alltoall", "direct", 0),
    ("fully-connected:8", "alltoall", "direct", 0),
    ("fully-connected:4", "broadcast", "trees", 1),
    ("fully-connected:4", "reduce", "trees", 2),
    ("ndv2x2", "allgather", "hierarchical", 0),  # 16 ranks, two nodes
    ("ring:16", "allreduce", "ring", 0),
    ("ring:32", "allgather", "ring", 0),
]


def _case_id(case) -> str:
    topology, collective, algorithm, root = case
    return f"{collective}-{algorithm}-{topology.replace(':', '').replace('-', '')}" + (f"-root{root}" if root else "")


@pytest.fixture(scope="module")
def planner_xmls(tmp_path_factory) -> dict[str, Path]:
    """case id -> XML (and its JSON sidecar beside it) written by the collective planner's Python API."""
    from mlopt.formats.topology import from_spec
    from mlopt.planners.collective.output import write_collective_plan
    from mlopt.planners.collective.planner import CollectiveOptions, plan_collective
    from mlopt.planners.options import PlannerOptions

    folder = tmp_path_factory.mktemp("planner-xml")
    out = {}
    for case in PLANNER_CASES:
        topology, collective, algorithm, root = case
        copts = CollectiveOptions(collective, 1 << 20, algorithm, root=root)
        result = plan_collective(from_spec(topology), copts, PlannerOptions(), inputs={"topology": topology})
        xml, _ = write_collective_plan(result, str(folder / f"{_case_id(case)}.xml"), copts, PlannerOptions())
        out[_case_id(case)] = xml
    return out


def run_and_check(path: Path, chunk_elems: int, dtype: str = "float32", op: str = "sum", in_place: bool = False,
                  chunk_bytes: int = 0, seed: int = 0, fifo_slots: int = 0) -> native.RunStats:
    """Runs the program with `chunk_elems` elements per chunk and asserts every rank's output is right."""
    plan = native.Plan.load(path)
    info = plan.program_info
    count = chunk_elems * info["i_chunks"]
    inputs = random_inputs(info["ngpus"], count, dtype, op, seed)
    out_count = plan.output_count(count)
    assert out_count == chunk_elems * info["o_chunks"]
    root = 0
    if info["coll"] in ("broadcast", "reduce"):
        from mlopt.sim.symbolic import derive_spec

        root = derive_spec(load_program(path)).root
        assert info["root"] == root, "the library finds the root as mlopt.sim.symbolic does"
    else:
        assert info["root"] == -1
    with native.LocalComm(info["ngpus"]) as comm:
        outputs, stats = comm.run(plan, inputs, dtype=dtype, op=op, in_place=in_place, chunk_bytes=chunk_bytes,
                                  fifo_slots=fifo_slots, watchdog_ms=20000)
    assert [o.size for o in outputs] == [out_count] * info["ngpus"]
    mismatches = check_outputs(outputs, expected_outputs(info["coll"], inputs, dtype, op, out_count, root), dtype, 0)
    assert not mismatches, f"{path.name}: {mismatches[0].describe()}"
    return stats


# ------------------------------------------------------------------------------------------------ library


def test_version_matches_the_binding():
    major, minor, patch = native.version()
    assert major == native.EXPECTED_VERSION_MAJOR and minor >= 0 and patch >= 0
    header = (REPO / "runtime/include/mlopt/mlopt.h").read_text()
    assert f"#define MLOPT_VERSION_MAJOR {major}\n" in header
    assert f"#define MLOPT_VERSION_MINOR {native.EXPECTED_VERSION_MINOR}\n" in header
    assert native.version_problem((major, minor, patch), native.EXPECTED_VERSION_MAJOR) is None
    assert "does not match" in native.version_problem((major + 1, 0, 0), native.EXPECTED_VERSION_MAJOR)
    # Before 1.0 a minor version may change struct layouts: 0.1's program info had no struct_size.
    assert "does not match" in native.version_problem((0, 1, 0), 0, 2)
    assert native.version_problem((1, 7, 0), 1, 2) is None


def test_every_header_function_is_declared():
    header = (REPO / "runtime/include/mlopt/mlopt.h").read_text()
    declared = set(re.findall(r"MLOPT_API\s+[\w\s\*]+?\b(mlopt_\w+)\s*\(", header))
    assert declared == set(native._PROTOTYPES), "native._PROTOTYPES out of step with mlopt.h"


def _fake_library(tmp_path: Path, name: str, body: str) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a fake library")
    source = tmp_path / f"{name}.c"
    source.write_text(body)
    library = tmp_path / f"{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def test_a_library_of_another_major_version_is_refused(tmp_path, monkeypatch):
    stubs = "".join(f"void {name}(void) {{}}\n" for name in native._PROTOTYPES if name != "mlopt_version")
    fake = _fake_library(tmp_path, "libfake_v7", stubs + "void mlopt_version(int* a, int* b, int* c) "
                                                          "{ *a = 7; *b = 0; *c = 0; }\n")
    monkeypatch.setenv(native.LIBRARY_ENV, str(fake))
    with pytest.raises(native.RuntimeLibraryNotFound, match=r"version 7\.0\.0 does not match"):
        native.Plan.load(REFERENCE_XMLS[0])


def test_a_library_missing_functions_is_refused(tmp_path, monkeypatch):
    fake = _fake_library(tmp_path, "libfake_partial", "void mlopt_version(int* a, int* b, int* c) { *a = 0; }\n")
    monkeypatch.setenv(native.LIBRARY_ENV, str(fake))
    with pytest.raises(native.RuntimeLibraryNotFound, match="missing mlopt_"):
        native.library()


def test_missing_library_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv(native.LIBRARY_ENV, str(tmp_path / "nowhere.so"))
    with pytest.raises(native.RuntimeLibraryNotFound, match="MLOPT_RUNTIME_LIB=.*no such file"):
        native.library()
    monkeypatch.delenv(native.LIBRARY_ENV)
    monkeypatch.setattr(native, "BUNDLED_LIBRARY", tmp_path / "_lib" / native.LIBRARY_NAME)
    monkeypatch.setattr(native, "BUILD_ERROR_NOTE", tmp_path / "_lib" / "build-error.txt")
    with pytest.raises(native.RuntimeLibraryNotFound, match=r"not built: run `pip install -e \.`"):
        native.library()
    (tmp_path / "_lib").mkdir()
    (tmp_path / "_lib" / "build-error.txt").write_text("cmake was not found\n")
    with pytest.raises(native.RuntimeLibraryNotFound, match="last build failed: cmake was not found"):
        native.library()


# ------------------------------------------------------------------------------------------------ plans


@pytest.mark.parametrize("path", REFERENCE_XMLS, ids=lambda p: p.name)
def test_reference_xml_loads_with_the_python_parsers_summary(path):
    # As it runs: an in-place-only program's left-out buffer has its window's size in both languages.
    program = effective_program(load_program(path))
    plan = native.Plan.load(path)
    assert (plan.kind, plan.format, plan.planner) == ("msccl-xml", "msccl-ef", "collective")
    info = plan.program_info
    gpu = program.gpus[0]
    assert info["name"] == program.name and info["coll"] == program.coll and info["proto"] == program.proto
    assert (info["ngpus"], info["nchannels"], info["nchunksperloop"]) == (program.ngpus, program.nchannels,
                                                                          program.nchunksperloop)
    assert (info["inplace"], info["outofplace"]) == (program.inplace, program.outofplace)
    assert (info["min_bytes"], info["max_bytes"]) == (program.min_bytes, program.max_bytes)
    assert info["threadblocks"] == sum(len(g.tbs) for g in program.gpus)
    assert info["steps"] == sum(len(tb.steps) for g in program.gpus for tb in g.tbs)
    assert (info["i_chunks"], info["o_chunks"]) == (gpu.i_chunks, gpu.o_chunks)
    assert info["s_chunks"] == max(g.s_chunks for g in program.gpus)


def test_plan_from_memory_names_its_source():
    text = REFERENCE_XMLS[0].read_text()
    plan = native.Plan.from_bytes(text, "in-memory.xml")
    assert plan.program_info["ngpus"] == load_program(REFERENCE_XMLS[0]).ngpus
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.Plan.from_bytes(text[: len(text) // 2], "half.xml")
    assert caught.value.status_name == "MLOPT_ERR_PARSE" and caught.value.message.startswith("half.xml")


def test_truncated_xml_is_a_parse_error_with_a_position(tmp_path):
    broken = tmp_path / "broken.xml"
    lines = (REPO / "tests/data/msccl/ring_allgather_4.xml").read_text().splitlines(keepends=True)
    broken.write_text("".join(lines[:6]) + '      <step s="1" type="s" srcbuf="i"')
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.Plan.load(broken)
    error = caught.value
    assert error.status == 3 and error.status_name == "MLOPT_ERR_PARSE" and error.exit_code == 2
    assert error.line >= 6 and error.column >= 1 and error.offset > 0
    assert "broken.xml" in str(error) and "\n" not in str(error)


def test_out_of_range_offset_is_a_semantic_error_naming_the_field(tmp_path):
    source = (REPO / "tests/data/msccl/ring_allgather_4.xml").read_text()
    edited = tmp_path / "offset.xml"
    edited.write_text(source.replace('dstbuf="o" dstoff="0" cnt="1"', 'dstbuf="o" dstoff="9" cnt="1"', 1))
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.Plan.load(edited)
    error = caught.value
    assert error.status_name == "MLOPT_ERR_SEMANTIC", error.message
    assert "offset.xml" in error.message and "dstoff" in error.message and error.line > 0


def test_missing_attribute_and_missing_file(tmp_path):
    source = (REPO / "tests/data/msccl/ring_allgather_4.xml").read_text()
    edited = tmp_path / "noattr.xml"
    edited.write_text(source.replace(' cnt="1"', "", 1))
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.Plan.load(edited)
    assert caught.value.status_name in ("MLOPT_ERR_SCHEMA", "MLOPT_ERR_SEMANTIC") and "cnt" in caught.value.message
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.Plan.load(tmp_path / "absent.xml")
    assert caught.value.status_name == "MLOPT_ERR_IO" and "absent.xml" in caught.value.message


def test_json_sidecar_is_a_json_plan_without_a_program(planner_xmls):
    plan = native.Plan.load(planner_xmls["allreduce-ring-ring4"].with_suffix(".json"))
    assert (plan.kind, plan.format, plan.planner) == ("json", "mlopt.plan", "collective")
    assert plan.schema_version.split(".")[0] == "1"
    with pytest.raises(native.RuntimeLibraryError) as caught:
        plan.program_info
    assert caught.value.status_name == "MLOPT_ERR_INVALID_ARGUMENT"


def test_memory_plan_is_a_json_plan():
    if not MEMORY_PLAN.is_file():
        pytest.skip(f"{MEMORY_PLAN} is missing")
    plan = native.Plan.load(MEMORY_PLAN)
    assert (plan.kind, plan.format, plan.planner) == ("json", "mlopt.plan", "memory")


# ------------------------------------------------------------------------------------------------ running


@pytest.mark.parametrize("path", REFERENCE_XMLS, ids=lambda p: p.name)
@pytest.mark.parametrize("chunk_elems,chunk_bytes", [(1, 0), (300, 0), (1000, 1024)])
def test_reference_xml_computes_its_collective(path, chunk_elems, chunk_bytes):
    run_and_check(path, chunk_elems, chunk_bytes=chunk_bytes, in_place=in_place_only(load_program(path)))


def test_an_in_place_only_program_is_refused_out_of_place():
    path = SHARED_REFERENCE / "msccl-xml" / "msccl-scheduler_ndv4_ag-1k-512k.xml"
    if not path.is_file():
        pytest.skip(f"reference artefact not available: {path}")
    plan = native.Plan.load(path)
    assert (plan.program_info["i_chunks"], plan.program_info["o_chunks"]) == (2, 16)  # i_chunks="0" in the file
    inputs = random_inputs(8, 2 * 5, "float32", "sum", 0)
    with native.LocalComm(8) as comm, pytest.raises(native.RuntimeLibraryError) as caught:
        comm.run(plan, inputs)
    assert caught.value.status_name == "MLOPT_ERR_MISMATCH"
    assert "out-of-place run of an in-place-only program" in caught.value.message


@pytest.mark.parametrize("case", PLANNER_CASES, ids=_case_id)
def test_planner_xml_computes_its_collective(planner_xmls, case):
    path = planner_xmls[_case_id(case)]
    run_and_check(path, 257)  # odd: no accidental alignment
    stats = run_and_check(path, 1024, chunk_bytes=1024, seed=1)  # 4 loop slices of 256 floats
    assert stats.loop_iterations == 4 and stats.steps_executed > 0 and stats.wall_us > 0


@pytest.mark.parametrize("name", ["allreduce-ring-ring4", "reducescatter-ring-ring8",
                                  "reduce-trees-fullyconnected4-root2", "allreduce-trees-fullyconnected4"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_reductions_in_every_dtype_and_op(planner_xmls, name, dtype, op):
    run_and_check(planner_xmls[name], 100, dtype=dtype, op=op, chunk_bytes=64)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32"])
def test_copies_in_every_dtype_are_bitwise(planner_xmls, dtype):
    for name in ("allgather-direct-fullyconnected8", "alltoall-direct-fullyconnected4",
                 "broadcast-trees-fullyconnected4-root1"):
        run_and_check(planner_xmls[name], 33, dtype=dtype)


def test_bounded_fifos_still_complete(planner_xmls):
    run_and_check(planner_xmls["allreduce-ring-ring4"], 512, chunk_bytes=256, fifo_slots=1)


def test_legacy_dialect_runs_like_the_executor_dialect(planner_xmls, tmp_path):
    program = load_program(planner_xmls["reducescatter-ring-ring8"])
    legacy = tmp_path / "legacy.xml"
    legacy.write_text(write_program(program, "legacy"))
    run_and_check(legacy, 64)


def _in_place_variant(path: Path, folder: Path) -> Path | None:
    """The program with inplace="1" when the symbolic checker proves its in-place variant, else None."""
    from dataclasses import replace

    from mlopt.sim.symbolic import check_program

    program = replace(load_program(path), inplace=True, outofplace=False)
    if not check_program(program).ok:
        return None
    out = folder / f"inplace-{path.name}"
    out.write_text(write_program(program))
    return out


# Planner programs whose in-place variant the symbolic checker proves (direct alltoall and the tree allreduces
# overwrite inputs they still need, so they are out of place only).
@pytest.mark.parametrize("name", ["allgather-ring-ring2", "allgather-direct-fullyconnected8", "allreduce-ring-ring4",
                                  "reducescatter-ring-ring8", "broadcast-trees-fullyconnected4-root1",
                                  "reduce-trees-fullyconnected4-root2"])
def test_in_place_layouts(planner_xmls, tmp_path, name):
    variant = _in_place_variant(planner_xmls[name], tmp_path)
    assert variant is not None, f"{name} is no longer correct in place (symbolic check)"
    run_and_check(variant, 96, in_place=True)
    run_and_check(variant, 96, in_place=True, chunk_bytes=128)


def test_in_place_into_the_callers_buffers(planner_xmls, tmp_path):
    """Inputs that already are the windows of the caller's buffers are not copied; outputs are views."""
    variant = _in_place_variant(planner_xmls["allgather-direct-fullyconnected8"], tmp_path)
    plan = native.Plan.load(variant)
    count = plan.program_info["i_chunks"] * 5
    buffers = [np.zeros(8 * count, np.float32) for _ in range(8)]
    inputs = [buffers[r][r * count:(r + 1) * count] for r in range(8)]
    for r, window in enumerate(inputs):
        window[:] = np.arange(count) + 1000 * r
    with native.LocalComm(8) as comm:
        outputs, _ = comm.run(plan, inputs, outputs=buffers, in_place=True)
    expected = np.concatenate([np.arange(count) + 1000 * r for r in range(8)]).astype(np.float32)
    for r in range(8):
        assert np.shares_memory(outputs[r], buffers[r]) and np.array_equal(buffers[r], expected)
    with native.LocalComm(8) as comm, pytest.raises(ValueError, match="in place, each rank's buffer"):
        comm.run(plan, inputs, outputs=[b[:-1] for b in buffers], in_place=True)


def test_torch_tensors_including_bfloat16(planner_xmls):
    torch = pytest.importorskip("torch")
    plan = native.Plan.load(planner_xmls["allreduce-ring-ring4"])
    count = plan.program_info["i_chunks"] * 16
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.rand(count, generator=generator).to(torch.bfloat16) for _ in range(4)]
    with native.LocalComm(4) as comm:
        outputs, stats = comm.run(plan, inputs)
    assert all(o.dtype == torch.bfloat16 and o.shape == (count,) for o in outputs)
    exact = sum(x.double() for x in inputs)
    for out in outputs:
        assert torch.allclose(out.double(), exact, rtol=5 * 2**-7, atol=1e-6)
    given = [torch.empty(count, dtype=torch.bfloat16) for _ in range(4)]
    with native.LocalComm(4) as comm:
        result = comm.run(plan, inputs, outputs=given, op="max")
    assert result.outputs[0] is given[0]
    assert torch.equal(given[2], torch.stack(inputs).max(dim=0).values)


def test_numpy_bfloat16_bits_need_an_explicit_dtype(planner_xmls):
    plan = native.Plan.load(planner_xmls["allreduce-ring-ring4"])
    inputs = random_inputs(4, plan.program_info["i_chunks"] * 4, "bfloat16", "sum", 0)
    with native.LocalComm(4) as comm:
        with pytest.raises(ValueError, match="dtype='bfloat16'"):
            comm.run(plan, inputs)
        assert comm.run(plan, inputs, dtype="bfloat16").outputs[0].dtype == np.uint16


# ------------------------------------------------------------------------------------------------ misuse


def test_rank_count_mismatch_is_reported(planner_xmls):
    plan = native.Plan.load(planner_xmls["allreduce-ring-ring4"])
    inputs = random_inputs(2, plan.program_info["i_chunks"], "float32", "sum", 0)
    with native.LocalComm(2) as comm:
        with pytest.raises(native.RuntimeLibraryError) as caught:
            comm.run(plan, inputs)
    assert caught.value.status_name == "MLOPT_ERR_MISMATCH" and caught.value.exit_code == 2


def test_buffer_checks_protect_memory(planner_xmls):
    plan = native.Plan.load(planner_xmls["allgather-ring-ring2"])
    info = plan.program_info
    count = info["i_chunks"] * 8
    inputs = random_inputs(2, count, "float32", "sum", 0)
    with native.LocalComm(2) as comm:
        with pytest.raises(ValueError, match="2 input buffers|1 input buffers"):
            comm.run(plan, inputs[:1])
        with pytest.raises(ValueError, match="elements; the program writes"):
            comm.run(plan, inputs, outputs=[np.empty(count, np.float32)] * 2)
        with pytest.raises(ValueError, match="not C-contiguous"):
            comm.run(plan, [x[::2] for x in random_inputs(2, 2 * count, "float32", "sum", 0)])
        text = Path(planner_xmls["allgather-ring-ring2"]).read_text()
        assert 'inplace="1"' in text  # the planner declares in place too once the checker proves it
        out_of_place_only = native.Plan.from_bytes(text.replace('inplace="1"', 'inplace="0"'), "out-of-place only")
        with pytest.raises(ValueError, match="inplace"):
            comm.run(out_of_place_only, inputs, in_place=True)
        assert info["i_chunks"] > 1
        with pytest.raises(native.RuntimeLibraryError):  # not a whole number of chunks
            comm.run(plan, random_inputs(2, count + 1, "float32", "sum", 0))
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.LocalComm(0)
    assert caught.value.status_name == "MLOPT_ERR_INVALID_ARGUMENT"


def _two_rank_allgather(tmp_path, name: str, steps, chunks: int) -> Path:
    """A 2-rank allgather of `chunks` chunks per rank whose only threadblock on rank `me` runs steps(me, peer)."""
    gpus = "".join(f'<gpu id="{me}" i_chunks="{chunks}" o_chunks="{2 * chunks}" s_chunks="0"><tb id="0" '
                   f'send="{1 - me}" recv="{1 - me}" chan="0">{steps(me, 1 - me)}</tb></gpu>' for me in (0, 1))
    path = tmp_path / name
    path.write_text(f'<algo name="{name}" proto="Simple" nchannels="1" nchunksperloop="{2 * chunks}" ngpus="2" '
                    f'coll="allgather" inplace="0" outofplace="1" minBytes="0" maxBytes="0">{gpus}</algo>\n')
    return path


def _steps(*steps: tuple[str, int, int, int]) -> str:
    """<step> elements from (type, srcoff, dstoff, cnt), numbered in order."""
    return "".join(f'<step s="{s}" type="{kind}" srcbuf="i" srcoff="{src}" dstbuf="o" dstoff="{dst}" cnt="{cnt}" '
                   'depid="-1" deps="-1" hasdep="0"/>' for s, (kind, src, dst, cnt) in enumerate(steps))


def test_a_deadlocking_program_is_refused_when_loaded(tmp_path):
    """Both ranks receive before they send: one message each way, but no step can start (found at load time)."""
    path = _two_rank_allgather(tmp_path, "deadlock.xml",
                               lambda me, peer: _steps(("r", 0, peer, 1), ("s", 0, me, 1), ("cpy", 0, me, 1)), 1)
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.Plan.load(path)
    assert caught.value.status_name == "MLOPT_ERR_SEMANTIC" and caught.value.exit_code == 2
    assert caught.value.message.startswith(f"{path}: algo/gpu[@id=0]/tb[@id=0]/step[@s=0]@type (line 1): deadlock:")


def test_a_deadlock_under_bounded_fifos_is_reported_not_hung(tmp_path):
    """Both ranks send two messages before they receive: fine with unbounded FIFOs (so it loads), stuck when a
    connection holds one message; the watchdog reports it."""
    def steps(me: int, peer: int) -> str:
        return _steps(("cpy", 0, 2 * me, 2), ("s", 0, 0, 1), ("s", 1, 0, 1), ("r", 0, 2 * peer, 1), ("r", 0, 2 * peer + 1, 1))

    plan = native.Plan.load(_two_rank_allgather(tmp_path, "bounded.xml", steps, 2))
    inputs = random_inputs(2, 8, "float32", "sum", 0)
    with native.LocalComm(2) as comm:
        outputs, _ = comm.run(plan, inputs)  # unbounded: completes
    assert all(np.array_equal(out, np.concatenate(inputs)) for out in outputs)
    with native.LocalComm(2) as comm:
        with pytest.raises(native.RuntimeLibraryError) as caught:
            comm.run(plan, inputs, watchdog_ms=300, fifo_slots=1)
    assert caught.value.status_name == "MLOPT_ERR_DEADLOCK" and caught.value.exit_code == 1
    assert "bounded.xml" in caught.value.message or "rank" in caught.value.message


def test_plans_and_communicators_close_once():
    plan = native.Plan.load(REFERENCE_XMLS[0])
    plan.close()
    plan.close()
    with pytest.raises(ValueError, match="closed"):
        plan.program_info
    with native.LocalComm(3) as comm:
        assert comm.size == 3
    with pytest.raises(ValueError, match="closed"):
        comm.size


def test_stats_count_every_step_of_every_slice(planner_xmls):
    path = planner_xmls["allgather-ring-ring2"]
    plan = native.Plan.load(path)
    info = plan.program_info
    one = run_and_check(path, 256)
    four = run_and_check(path, 256, chunk_bytes=256)
    assert one.loop_iterations == 1 and four.loop_iterations == 4
    assert four.steps_executed == 4 * one.steps_executed
    assert one.steps_executed <= info["steps"]  # nops may or may not count
    assert math.isfinite(four.per_step_us) and four.per_step_us > 0


def test_backends_say_whether_they_can_run():
    assert native.backend_available("cpu") == (True, "")
    available, why = native.backend_available("cuda")
    assert available or why, "an unavailable CUDA backend says why"


def test_cpu_runs_report_their_backend_and_no_device_time(planner_xmls):
    plan = native.Plan.load(planner_xmls["allreduce-ring-ring4"])
    inputs = random_inputs(4, 64, "float32", "sum", 0)
    with native.LocalComm(4) as comm:
        _, stats = comm.run(plan, inputs)
        assert stats.backend == "cpu" and stats.device_us == 0.0 and stats.wall_us > 0
        with pytest.raises(ValueError, match="CUDA backend needs CUDA torch tensors"):
            comm.run(plan, inputs, backend="cuda")
        with pytest.raises(ValueError, match="backend 'tpu'"):
            comm.run(plan, inputs, backend="tpu")

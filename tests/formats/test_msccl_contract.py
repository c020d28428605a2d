"""The MSCCL-EF conformance corpus (tests/conformance/msccl_xml, docs/input-contract.md) through the Python side:
the loader and the contract check, `mlopt validate`, and the runtime library through its binding (the same
verdict, status and field as the manifest). runtime/tests/test_conformance.cpp holds the C++ loader to the
same manifest through the C ABI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_REFERENCE
from mlopt.errors import InputError
from mlopt.formats.msccl_contract import check_contract, effective_program, in_place_only
from mlopt.formats.msccl_xml import load_program
from mlopt.planners.collective.validate import proven_program

CORPUS = REPO / "tests" / "conformance" / "msccl_xml"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
ENTRIES = sorted(MANIFEST["files"].items())
STATUSES = {"parse", "schema", "semantic", "unsupported"}
SHARED = "@shared/"


def resolve(name: str) -> Path:
    """The corpus file, or the shared reference file for an @shared/ name (skipping the test without it)."""
    if not name.startswith(SHARED):
        return CORPUS / name
    folder = Path(os.environ.get("MLOPT_SHARED_REFERENCE", SHARED_REFERENCE))
    path = folder / name[len(SHARED):]
    if not path.is_file():
        pytest.skip(f"shared reference file not available: {path}")
    return path


def field_of(location: str) -> str:
    """The location without its "(line N)" / "(line N, column C)" (lines may differ between the parsers)."""
    return re.sub(r" ?\(line \d+(, column \d+)?\)$", "", location)


def python_verdict(path: Path) -> dict:
    """What the Python side says: refused (loader or contract), unproven (the symbolic proof), or accepted."""
    try:
        program = load_program(path)
        check_contract(program)
    except InputError as exc:
        return {"verdict": "refused", "status": exc.status, "field": field_of(exc.field), "message": exc.message}
    try:
        proven_program(effective_program(program), str(path))
    except InputError as exc:
        return {"verdict": "unproven", "field": exc.field, "message": exc.message}
    return {"verdict": "accepted"}


def check_against(expected: dict, got: dict, who: str) -> None:
    assert got["verdict"] == expected["verdict"], f"{who}: {got}"
    if expected["verdict"] == "refused":
        assert (got["status"], got["field"]) == (expected["status"], expected["field"]), f"{who}: {got}"
        assert expected.get("message", "") in got["message"], f"{who}: {got['message']}"


@pytest.mark.parametrize("name, expected", ENTRIES, ids=[name for name, _ in ENTRIES])
def test_python_gives_the_manifest_verdict(name, expected):
    check_against(expected, python_verdict(resolve(name)), "python")


def _library():
    from mlopt.native import binding as native

    try:
        native.library()
    except native.RuntimeLibraryNotFound as missing:
        pytest.skip(f"mlopt runtime library unavailable: {missing}")
    return native


def runtime_verdict(path: Path) -> dict:
    """What the C++ loader says through the binding: its status name and the location its message starts with."""
    native = _library()
    try:
        native.Plan.load(path)
    except native.RuntimeLibraryError as exc:
        prefix = f"{path}: "
        assert exc.message.startswith(prefix) and "\n" not in exc.message, exc.message
        location, _, message = exc.message[len(prefix):].partition(": ")
        status = exc.status_name.removeprefix("MLOPT_ERR_").lower()
        return {"verdict": "refused", "status": status, "field": field_of(location), "message": message}
    return {"verdict": "accepted"}


@pytest.mark.parametrize("name, expected", ENTRIES, ids=[name for name, _ in ENTRIES])
def test_the_runtime_library_gives_the_manifest_verdict(name, expected):
    """The loader of the runtime does not run the symbolic proof: an unproven file loads."""
    if expected["verdict"] == "unproven":
        expected = {"verdict": "accepted"}
    check_against(expected, runtime_verdict(resolve(name)), "runtime")


def test_the_manifest_lists_every_file_and_every_kind_of_verdict():
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.xml")}
    listed = {name for name, _ in ENTRIES if not name.startswith(SHARED)}
    assert on_disk == listed
    for name, entry in ENTRIES:
        assert entry["verdict"] in ("accepted", "refused", "unproven") and entry.get("rule"), name
        if entry["verdict"] == "refused":
            assert entry["status"] in STATUSES and "field" in entry, name
        else:
            assert "status" not in entry and "field" not in entry, name
    assert {e.get("status") for _, e in ENTRIES} >= STATUSES
    assert {e["verdict"] for _, e in ENTRIES} == {"accepted", "refused", "unproven"}
    sizes = {name: (CORPUS / name).stat().st_size for name in listed}
    assert max(sizes.values()) < 64 * 1024, "keep the corpus small: big files go to the shared reference folder"


def test_the_real_files_that_were_refused_are_accepted_in_place_only():
    for name in ("real/msccl-scheduler_ncv4_ar_tree_12_LL.xml", "real/msccl-scheduler_ndv4_ag-1k-512k.xml"):
        program = load_program(CORPUS / name)
        assert in_place_only(program)
        check_contract(program)
        wide = effective_program(program)
        assert wide != program and all((g.i_chunks, g.o_chunks) == (wide.gpus[0].i_chunks, wide.gpus[0].o_chunks)
                                        for g in wide.gpus)
        assert "proven for in-place" in proven_program(wide, name)


@pytest.mark.parametrize("name", ["bad/huge_ngpus.xml", "bad/huge_cnt.xml",
                                  "bad/unsupported_too_large_for_the_proof.xml"])
def test_huge_sizes_are_refused_without_work_proportional_to_them(name):
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(InputError):
        check_contract(load_program(CORPUS / name))
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 << 20 and elapsed < 5, (peak, elapsed)


@pytest.mark.parametrize("name", ["bad/missing_cnt.xml", "bad/unsupported_collective_gather.xml",
                                  "bad/deadlock_receive_first.xml", "bad/parse_truncated.xml",
                                  "unproven/teccl_copy_only.xml", "real/msccl-scheduler_ndv4_ag-1k-512k.xml"])
def test_mlopt_validate_exits_2_with_one_line_naming_file_and_field(name):
    path = CORPUS / name
    done = subprocess.run([sys.executable, "-m", "mlopt.cli", "validate", str(path)], capture_output=True, text=True,
                          timeout=120)
    expected = MANIFEST["files"][name]
    if expected["verdict"] == "accepted":
        said = (done.stdout + done.stderr).strip()  # the CLI says "ok" lines on stderr
        assert done.returncode == 0 and said.startswith(f"{path}: ok (msccl-ef program"), done
        assert said.endswith("proven for in-place; in place only)"), said
        return
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    lines = done.stderr.strip().splitlines()
    prefix = f"mlopt: error: {path}: "
    assert len(lines) == 1 and lines[0].startswith(prefix), lines
    location, _, message = lines[0][len(prefix):].partition(": ")
    if expected["verdict"] == "unproven":  # the proof is about the whole program
        assert location == "algo" and message.startswith("does not implement"), lines
        return
    assert field_of(location) == expected["field"] and re.search(r"\(line \d+", location), lines
    assert expected.get("message", "") in message

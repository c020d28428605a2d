"""`mlopt run-collective`: its reference collectives (checked against the symbolic postconditions, no library
needed) and the command end to end: exit 0 when every rank is right, 1 when a structurally valid program
computes the wrong thing, 2 for bad input; --json fields."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import REPO
from mlopt.errors import InputError
from mlopt.native.run_collective import (
    as_float64, element_counts, expected_outputs, random_inputs, reduce_inputs)
from mlopt.sim.collectives import KINDS, CollectiveSpec

RING_ALLGATHER = REPO / "tests/data/msccl/ring_allgather_4.xml"


# ------------------------------------------------------------------------------------------------ reference


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunks_per_rank", [1, 2])
def test_reference_matches_the_symbolic_postcondition(kind, chunks_per_rank):
    """Every output element of the numpy reference, with one element per chunk, equals the sum of the input
    elements the postcondition (mlopt.sim.collectives) says that output chunk holds."""
    n, root = 4, 2
    spec = CollectiveSpec(kind, n, chunks_per_rank, root)
    count, out_count = spec.input_chunks(), spec.output_chunks()
    inputs = random_inputs(n, count, "int32", "sum", seed=3)
    expected = expected_outputs(kind, inputs, "int32", "sum", out_count, root)
    for rank in range(n):
        got = expected(rank)
        if spec.expected(rank, 0) is None:
            assert got is None
            continue
        assert got.values.size == out_count
        for index in range(out_count):
            want = sum(int(inputs[s][i]) * m for (s, i), m in spec.expected(rank, index))
            assert int(got.values[index]) == want, (kind, rank, index)


def test_float_reductions_come_with_a_rounding_tolerance():
    inputs = random_inputs(8, 1000, "float16", "sum", seed=0)
    total, tolerance = reduce_inputs(inputs, "float16", "sum")
    assert tolerance is not None and np.all(tolerance > 0)
    naive = inputs[0].astype(np.float16)
    for x in inputs[1:]:
        naive = (naive + x).astype(np.float16)  # left to right, rounding every step: within the tolerance
    assert np.all(np.abs(naive.astype(np.float64) - total) <= tolerance)
    assert reduce_inputs(inputs, "float16", "max")[1] is None
    assert reduce_inputs(random_inputs(4, 10, "int32", "prod", 0), "int32", "prod")[1] is None


def test_inputs_never_overflow_a_reduction():
    for n in (2, 8, 32):
        ints = random_inputs(n, 4096, "int32", "prod", seed=1)
        assert np.all(np.abs(np.prod(np.stack(ints).astype(np.float64), axis=0)) < 2**31)
        floats = random_inputs(n, 4096, "float16", "prod", seed=1)
        product = np.prod(np.stack(floats).astype(np.float64), axis=0)
        assert np.all(np.abs(product) > 2**-14) and np.all(np.abs(product) < 65504)


def test_bfloat16_bits_round_trip():
    bits = random_inputs(1, 1000, "bfloat16", "sum", seed=0)[0]
    values = as_float64(bits, "bfloat16")
    assert bits.dtype == np.uint16 and np.all(np.abs(values) <= 1.0) and len(np.unique(values)) > 100


def test_size_splits_into_the_larger_buffers_chunks():
    assert element_counts(64 * 1024, "float32", 1, 4) == (4096, 16384)  # allgather: --size is the output
    assert element_counts(64 * 1024, "float32", 8, 2) == (16384, 4096)  # reducescatter: --size is the input
    assert element_counts(48, "float16", 3, 3) == (24, 24)
    with pytest.raises(InputError, match="use a multiple of 16 bytes"):
        element_counts(100, "float32", 1, 4)


# ------------------------------------------------------------------------------------------------ CLI


@pytest.fixture(scope="module")
def ring_allreduce(tmp_path_factory, runtime_library):
    from mlopt.cli import main

    out = tmp_path_factory.mktemp("run") / "ar.xml"
    assert main(["-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--size", "1MiB",
                 "--algorithm", "ring", "-o", str(out)]) == 0
    return out


def test_correct_program_exits_0_with_bandwidths(run_cli, ring_allreduce):
    result = run_cli("run-collective", ring_allreduce, "--size", "64KiB", "--iterations", "2", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["ok"] is True and report["mismatches"] == []
    assert (report["collective"], report["ranks"], report["dtype"], report["op"]) == ("allreduce", 4, "float32", "sum")
    assert report["size_bytes"] == report["input_bytes"] == report["output_bytes"] == 65536
    assert report["count"] == 16384 and report["iterations"] == 2 and len(report["times_us"]) == 2
    assert report["time_us"] > 0 and report["algbw_GBps"] > 0
    assert report["busbw_GBps"] == pytest.approx(report["algbw_GBps"] * 2 * 3 / 4, rel=1e-6)
    assert report["steps_executed"] > 0 and report["loop_iterations"] >= 1
    assert report["per_step_us"] == pytest.approx(report["time_us"] / report["steps_executed"], rel=1e-6)


def test_human_summary_names_the_result(run_cli, runtime_library):
    result = run_cli("run-collective", RING_ALLGATHER, "--size", "4KiB", "--dtype", "int32", "--iterations", "1",
                     "--chunk-bytes", "256")
    assert result.code == 0, result.err
    assert "allgather of 4KiB int32 on 4 ranks" in result.out and "GB/s" in result.out
    assert "4 loop iteration(s)" in result.out and "match the reference" in result.out


@pytest.mark.parametrize("dtype,op", [("float16", "max"), ("bfloat16", "sum"), ("int32", "prod")])
def test_reductions_in_other_dtypes(run_cli, ring_allreduce, dtype, op):
    result = run_cli("run-collective", ring_allreduce, "--size", "8KiB", "--dtype", dtype, "--op", op,
                     "--iterations", "1", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["ok"] is True


def test_wrong_program_exits_1_naming_rank_and_element(run_cli, runtime_library, tmp_path):
    """Rank 0 stores the chunks of ranks 1 and 2 in each other's places: every step valid, the result wrong."""
    text = RING_ALLGATHER.read_text()
    text = text.replace('<step s="3" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2"',
                        '<step s="3" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="1"', 1)
    text = text.replace('<step s="4" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1"',
                        '<step s="4" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="2"', 1)
    wrong = tmp_path / "swapped.xml"
    wrong.write_text(text)
    result = run_cli("run-collective", wrong, "--size", "1KiB", "--json")
    assert result.code == 1
    assert "swapped.xml" in result.err and "rank 0 output[64]" in result.err and len(result.err.splitlines()) == 1
    report = json.loads(result.out)
    assert report["ok"] is False and [m["rank"] for m in report["mismatches"]] == [0]
    assert report["mismatches"][0]["index"] == 64 and report["mismatches"][0]["bad_elements"] == 128


def test_rank_count_other_than_the_programs_exits_2(run_cli, runtime_library):
    result = run_cli("run-collective", RING_ALLGATHER, "--size", "1KiB", "--ranks", "8")
    assert result.code == 2 and "--ranks" in result.err and "4 ranks, not 8" in result.err


def test_broken_xml_exits_2_with_the_librarys_message(run_cli, runtime_library, tmp_path):
    broken = tmp_path / "broken.xml"
    broken.write_text(RING_ALLGATHER.read_text().replace('dstoff="0" cnt="1"', 'dstoff="7" cnt="1"', 1))
    result = run_cli("run-collective", broken, "--size", "1KiB")
    assert result.code == 2 and "broken.xml" in result.err and "dstoff" in result.err
    assert len(result.err.splitlines()) == 1


@pytest.mark.parametrize("args,field", [
    (["--size", "1000B"], "--size"),  # 4 output chunks of float32: a multiple of 16 bytes
    (["--size", "lots"], "--size"),
    (["--size", "1KiB", "--in-place"], "--in-place"),
    (["--size", "1KiB", "--dtype", "float64"], "--dtype"),
])
def test_bad_requests_exit_2(run_cli, runtime_library, args, field):
    result = run_cli("run-collective", RING_ALLGATHER, *args)
    assert result.code == 2 and field in result.err, result.err


def test_missing_file_and_json_plan_exit_2(run_cli, ring_allreduce, tmp_path):
    assert run_cli("run-collective", tmp_path / "absent.xml", "--size", "1KiB").code == 2
    sidecar = run_cli("run-collective", ring_allreduce.with_suffix(".json"), "--size", "1KiB")
    assert sidecar.code == 2 and "MSCCL-EF XML" in sidecar.err


def test_in_place_run_of_a_program_that_declares_it(run_cli, runtime_library, tmp_path):
    both = tmp_path / "both.xml"
    both.write_text(RING_ALLGATHER.read_text().replace('inplace="0"', 'inplace="1"', 1))
    result = run_cli("run-collective", both, "--size", "4KiB", "--in-place", "--iterations", "1", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["ok"] is True and report["in_place"] is True


def _stuck_allgather(tmp_path, steps):
    """A 2-rank allgather of 2 chunks per rank; rank `me`'s one threadblock runs steps(me, peer): (type, srcoff,
    dstoff) each with cnt 1."""
    step = ('<step s="{s}" type="{type}" srcbuf="i" srcoff="{src}" dstbuf="o" dstoff="{dst}" cnt="1" depid="-1" '
            'deps="-1" hasdep="0"/>')
    gpus = "".join(
        f'<gpu id="{me}" i_chunks="2" o_chunks="4" s_chunks="0"><tb id="0" send="{1 - me}" recv="{1 - me}" chan="0">'
        + "".join(step.format(s=s, type=t, src=src, dst=dst) for s, (t, src, dst) in enumerate(steps(me, 1 - me)))
        + "</tb></gpu>" for me in (0, 1))
    path = tmp_path / "stuck.xml"
    path.write_text('<algo name="stuck" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="2" coll="allgather" '
                    f'inplace="0" outofplace="1" minBytes="0" maxBytes="0">{gpus}</algo>\n')
    return path


def test_a_certain_deadlock_is_refused_as_bad_input(run_cli, runtime_library, tmp_path):
    """Both ranks receive before they send: every step valid, one message each way, no step can start; the
    loader finds it (docs/input-contract.md)."""
    path = _stuck_allgather(tmp_path, lambda me, peer: [("r", 0, 2 * peer), ("r", 0, 2 * peer + 1), ("s", 0, 0),
                                                         ("s", 1, 0), ("cpy", 0, 2 * me), ("cpy", 1, 2 * me + 1)])
    result = run_cli("run-collective", path, "--size", "1KiB", "--watchdog-ms", "300")
    assert result.code == 2 and len(result.err.splitlines()) == 1, result.err
    assert "stuck.xml: algo/gpu[@id=0]/tb[@id=0]/step[@s=0]@type (line 1): deadlock:" in result.err


def test_a_deadlock_exits_1_with_the_librarys_message(run_cli, runtime_library, tmp_path):
    """Both ranks send twice before they receive: fine with unbounded FIFOs (it loads), stuck when each
    connection holds one message; the library's watchdog reports it."""
    path = _stuck_allgather(tmp_path, lambda me, peer: [("cpy", 0, 2 * me), ("cpy", 1, 2 * me + 1), ("s", 0, 0),
                                                         ("s", 1, 0), ("r", 0, 2 * peer), ("r", 0, 2 * peer + 1)])
    assert run_cli("run-collective", path, "--size", "1KiB").code == 0
    result = run_cli("run-collective", path, "--size", "1KiB", "--watchdog-ms", "300", "--fifo-slots", "1")
    assert result.code == 1 and "stuck.xml" in result.err and len(result.err.splitlines()) == 1, result.err

"""MSCCL-EF XML reader/writer: executor and legacy dialects, errors with locations, limits."""

from __future__ import annotations

import gzip
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from mlopt.errors import InputError
from mlopt.formats.msccl import Gpu, Program, Step, Threadblock
from mlopt.formats.msccl_xml import (
    LEGACY_DEFAULT_MAX_BYTES,
    check_limits,
    detect_dialect,
    load_program,
    parse_program,
    save_program,
    write_program,
)

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "msccl-xml"
DATA = Path(__file__).resolve().parents[1] / "data" / "msccl"
ALLGATHER = "msccl-scheduler_ncv4_ag_hier_4_LL.xml"
ALLTOALL = "rccl_alltoall-8n-0-9kb.xml"


def reference(name: str) -> Path:
    path = REFERENCE / name
    if not path.exists():
        pytest.skip(f"reference artefact not available: {path}")
    return path


def step_types(program: Program) -> Counter:
    return Counter(st.type for g in program.gpus for tb in g.tbs for st in tb.steps)


def without_comments(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not line.lstrip().startswith("<!--"))


# ---------------------------------------------------------------------------------------------------------------
# Reference files


def test_reference_allgather_parses():
    p = load_program(reference(ALLGATHER))
    assert (p.name, p.proto, p.coll, p.ngpus, p.nchannels, p.nchunksperloop) == (
        "allgather_hierarchical", "LL", "allgather", 4, 4, 16,
    )  # fmt: skip
    assert (p.inplace, p.outofplace, p.min_bytes, p.max_bytes) == (False, True, 64, 792576)
    assert [g.id for g in p.gpus] == [0, 1, 2, 3]
    assert all((g.i_chunks, g.o_chunks, g.s_chunks, len(g.tbs)) == (4, 16, 0, 12) for g in p.gpus)
    assert sum(len(tb.steps) for g in p.gpus for tb in g.tbs) == 96
    assert step_types(p) == {"s": 32, "r": 32, "rcs": 16, "cpy": 16}
    assert {tb.chan for g in p.gpus for tb in g.tbs} == {0, 1, 2, 3}
    tb = p.gpus[0].tbs[4]
    assert (tb.send, tb.recv, tb.chan) == (1, 2, 0)
    assert tb.steps[1] == Step(1, "rcs", "i", 0, "o", 8, 1, -1, -1, False)
    assert check_limits(p) == []
    assert detect_dialect(reference(ALLGATHER).read_bytes()) == "executor"


def test_reference_alltoall_parses():
    p = load_program(reference(ALLTOALL))  # starts with two comment lines
    assert (p.name, p.proto, p.coll, p.ngpus, p.nchannels, p.nchunksperloop) == ("alltoall_llm", "LL", "alltoall", 8, 1, 8)
    assert (p.min_bytes, p.max_bytes) == (0, 9216)
    assert all((g.i_chunks, g.o_chunks, len(g.tbs)) == (8, 8, 15) for g in p.gpus)
    assert sum(len(tb.steps) for g in p.gpus for tb in g.tbs) == 120
    assert step_types(p) == {"s": 56, "r": 56, "cpy": 8}
    assert check_limits(p) == []


@pytest.mark.parametrize("name", [ALLGATHER, ALLTOALL])
def test_reference_round_trip_is_exact(name):
    path = reference(name)
    p = load_program(path)
    text = write_program(p)
    assert parse_program(text, "again.xml") == p
    # the writer reproduces the reference files byte for byte (apart from their comments)
    assert text == without_comments(path.read_text())


@pytest.mark.parametrize("name", [ALLGATHER, ALLTOALL])
def test_reference_legacy_round_trip(name):
    p = load_program(reference(name))
    text = write_program(p, "legacy")
    assert "outofplace=" not in text.splitlines()[0]  # implied by inplace="0"
    assert detect_dialect(text) == "legacy"
    assert parse_program(text, "legacy.xml") == p
    assert parse_program(text, "legacy.xml", dialect="legacy") == p


# ---------------------------------------------------------------------------------------------------------------
# Fixtures and dialects


def test_fixture_ring_allgather():
    p = load_program(DATA / "ring_allgather_4.xml")
    assert (p.name, p.coll, p.ngpus, p.nchunksperloop) == ("ring_allgather", "allgather", 4, 4)
    assert [len(tb.steps) for g in p.gpus for tb in g.tbs] == [5, 5, 5, 5]
    assert [st.type for st in p.gpus[2].tbs[0].steps] == ["cpy", "s", "rcs", "rcs", "r"]
    assert parse_program(write_program(p), "x") == p


def test_legacy_dialect_auto_detected():
    path = DATA / "legacy_ring_reducescatter_4.xml"
    text = path.read_text()
    assert detect_dialect(text) == "legacy"
    p = load_program(path)
    assert p.coll == "reducescatter"  # spelled reduce_scatter in the file
    assert (p.inplace, p.outofplace) == (False, True)  # outofplace defaults to "not inplace"
    assert (p.min_bytes, p.max_bytes) == (0, LEGACY_DEFAULT_MAX_BYTES)
    assert p == load_program(path, dialect="legacy")
    legacy = write_program(p, "legacy")
    assert 'coll="reduce_scatter"' in legacy and parse_program(legacy, "x") == p
    executor = write_program(p)
    assert 'coll="reducescatter"' in executor and 'outofplace="1"' in executor
    assert parse_program(executor, "x", dialect="executor") == p


def test_legacy_file_rejected_by_strict_executor_dialect():
    with pytest.raises(InputError) as err:
        load_program(DATA / "legacy_ring_reducescatter_4.xml", dialect="executor")
    assert err.value.field == "algo@outofplace (line 2)"
    assert "missing attribute 'outofplace'" in err.value.message


def test_legacy_spelling_rejected_in_executor_dialect():
    text = write_program(_tiny()).replace('coll="allgather"', 'coll="reduce_scatter"')
    with pytest.raises(InputError, match="legacy spelling"):
        parse_program(text, "x.xml", dialect="executor")


def test_legacy_optional_attributes():
    text = (
        '<algo name="a" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="1" redop="sum" nthreads="256">\n'
        '  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">\n'
        '    <tb id="0" send="1" recv="1" chan="0" rtype="p2p">\n'
        '      <step s="0" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="-1" deps="-1" hasdep="0"/>\n'
        "    </tb>\n"
        "  </gpu>\n"
        '  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0"/>\n'
        "</algo>\n"
    )
    p = parse_program(text, "old.xml")
    assert (p.proto, p.inplace, p.outofplace) == ("Simple", True, False)
    assert p.gpus[0].tbs[0].steps[0].srcoff == -1
    assert parse_program(write_program(p, "legacy"), "x") == p
    # The executor reads none of them: in its dialect they are ignored (and recorded), as it ignores them.
    executor = parse_program(text.replace('nchannels="1"', 'proto="LL" nchannels="1" outofplace="0" minBytes="0" maxBytes="9"'),
                             "x", "executor")
    assert executor.origin.ignored == ("algo@redop", "algo@nthreads", "tb@rtype")


def test_gzipped_file(tmp_path):
    path = tmp_path / "algo.xml.gz"
    path.write_bytes(gzip.compress(write_program(_tiny()).encode()))
    assert load_program(path) == _tiny()


def test_save_program_atomic_and_deterministic(tmp_path):
    p = _tiny()
    path = tmp_path / "out" / "algo.xml"
    save_program(p, path)
    text = path.read_text()
    assert text == write_program(p) == write_program(p)
    assert text.endswith("</algo>\n") and "\n  <gpu " in text and "\n    <tb " in text and "\n      <step " in text
    assert load_program(path) == p
    assert [f.name for f in path.parent.iterdir()] == ["algo.xml"]  # no temporary file left behind
    save_program(p, path, "legacy")
    assert load_program(path) == p and detect_dialect(path.read_text()) == "legacy"


def test_names_are_escaped():
    p = replace(_tiny(), name='a "quoted" <name> & more')
    assert parse_program(write_program(p), "x") == p


# ---------------------------------------------------------------------------------------------------------------
# Errors name the element, the attribute and the line


def _tiny() -> Program:
    """2-rank allgather: each rank copies its chunk, sends it and receives the other one."""

    def gpu(r: int) -> Gpu:
        steps = (Step(0, "cpy", "i", 0, "o", r, 1), Step(1, "s", "i", 0, "o", 0, 1), Step(2, "r", "i", 0, "o", 1 - r, 1))
        return Gpu(r, 1, 2, 0, (Threadblock(0, 1 - r, 1 - r, 0, steps),))

    return Program("tiny", "LL", 1, 2, 2, "allgather", False, True, 0, 4096, (gpu(0), gpu(1)))


def _error(text: str, dialect: str = "auto") -> InputError:
    with pytest.raises(InputError) as err:
        parse_program(text, "algo.xml", dialect)
    return err.value


def test_missing_step_attribute_names_location_and_line():
    lines = write_program(_tiny()).splitlines()
    n = [i for i, line in enumerate(lines) if '<step s="1"' in line][1]  # gpu 1's step 1
    lines[n] = re.sub(r' dstoff="\d+"', "", lines[n])
    err = _error("\n".join(lines))
    assert err.field == f"algo/gpu[@id=1]/tb[@id=0]/step[@s=1]@dstoff (line {n + 1})"
    assert err.message == "missing attribute 'dstoff' (executor dialect)"
    assert str(err) == f"algo.xml: {err.field}: {err.message}"


@pytest.mark.parametrize(
    "old, new, field, message",
    [
        ('type="r"', 'type="recv"', "step[@s=2]@type", "unknown step type 'recv'"),
        ('proto="LL"', 'proto="LL64"', "algo@proto", "unknown protocol 'LL64'"),
        ('coll="allgather"', 'coll="allgatherv"', "algo@coll", "unknown collective 'allgatherv'"),
        ('coll="allgather"', 'coll="gather"', "algo@coll", "mlopt does not support the collective 'gather'"),
        ('srcbuf="i" srcoff="0" dstbuf="o" dstoff="1"', 'srcbuf="x" srcoff="0" dstbuf="o" dstoff="1"', "step[@s=2]@srcbuf", "unknown buffer 'x'"),
        ('cnt="1"', 'cnt="1.0"', "step[@s=0]@cnt", "'1.0' is not an integer"),
        ('hasdep="0"', 'hasdep="2"', "step[@s=0]@hasdep", "must be 0 or 1"),
        ('inplace="0"', 'inplace="yes"', "algo@inplace", "must be 0 or 1"),
        ('chan="0"', 'chan="1"', "tb[@id=0]@chan", "channel 1 is not below nchannels=1"),
        ('send="1"', 'send="0"', "tb[@id=0]@send", "the gpu itself"),
        ('send="1"', 'send="7"', "tb[@id=0]@send", "out of range"),
        ('cnt="1"', 'cnt="-2"', "step[@s=0]@cnt", "below the minimum 0"),
        ('<step s="1"', '<step s="5"', "step[@s=5]@s", "s=5 but this is step 1"),
        ('cnt="1"', 'cnt="99999999999"', "step[@s=0]@cnt", "99999999999 is out of range for a 32-bit integer"),
        ('cnt="1"', 'cnt="-0000000000000000000000000099999999999"', "step[@s=0]@cnt", "-99999999999 is out of range"),
    ],
)
def test_bad_values(old, new, field, message):
    text = write_program(_tiny()).replace(old, new, 1)
    err = _error(text, "executor")
    assert field in err.field and re.search(r"\(line \d+\)$", err.field)
    assert message in err.message
    line = int(re.search(r"line (\d+)", err.field).group(1))
    assert new.split()[0] in text.splitlines()[line - 1]


def test_structure_errors():
    text = write_program(_tiny())
    duplicate = re.sub(r'<gpu id="1".*?</gpu>', '<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0"/>', text, flags=re.S)
    err = _error(duplicate)
    assert err.field == "algo/gpu[@id=0]@id (line 9)" and err.message == "duplicate gpu id 0"
    err = _error(text.replace('ngpus="2"', 'ngpus="3"'))
    assert err.field == "algo@ngpus (line 1)" and "no <gpu> with id 2" in err.message
    err = _error(text.replace('<tb id="0" send="0"', '<tb id="1" send="0"'))
    assert err.field.startswith("algo/gpu[@id=1]") and "missing 0" in err.message
    err = _error(text.replace("<tb ", "<step ", 1).replace("</tb>", "</step>", 1))
    assert err.field == "algo/gpu[@id=0]/step[@id=0] (line 3)" and err.status == "schema"
    assert err.message == "unexpected element <step> inside <gpu> (expected <tb>; the executor would skip it)"
    err = _error(text.replace('hasdep="0"/>', 'hasdep="0"><x/></step>', 1))
    assert err.field == "algo/gpu[@id=0]/tb[@id=0]/step[@s=0]/x[1] (line 4)" and "inside <step>" in err.message
    err = _error("<algorithm/>")
    assert "expected <algo>" in err.message


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ('<algo name="x"', 1, "unclosed token"),
        ("<algo>\n  <gpu>\n</algo>\n", 3, "mismatched tag"),
        ("<algo/>\n<algo/>\n", 2, "junk after document element"),
        ("", 1, "no element found"),
        ('<algo name="a" name="b"/>', 1, "duplicate attribute"),
        ("<algo>hello</algo>", 1, "unexpected text"),
        ('<!DOCTYPE algo [<!ENTITY x "y">]><algo/>', 1, "DOCTYPE"),
    ],
)
def test_malformed_xml(text, line, fragment):
    err = _error(text)
    assert re.fullmatch(rf"\(line {line}(, column \d+)?\)", err.field)
    assert err.message.startswith("malformed XML") and fragment in err.message


def test_unknown_dialect_is_a_programming_error():
    with pytest.raises(ValueError):
        parse_program("<algo/>", "x", dialect="new")
    with pytest.raises(ValueError):
        write_program(_tiny(), "auto")


# ---------------------------------------------------------------------------------------------------------------
# Limits


def _with_steps(program: Program, gpu: int, tb: int, steps: tuple[Step, ...]) -> Program:
    g = program.gpus[gpu]
    tbs = list(g.tbs)
    tbs[tb] = replace(tbs[tb], steps=steps)
    gpus = list(program.gpus)
    gpus[gpu] = replace(g, tbs=tuple(tbs))
    return replace(program, gpus=tuple(gpus))


def test_limits_65_steps_in_a_threadblock():
    p = _tiny()
    steps = tuple(Step(k, "cpy", "i", 0, "o", 0, 1) for k in range(65))
    p = replace(p, gpus=(replace(p.gpus[0], tbs=p.gpus[0].tbs + (Threadblock(1, -1, -1, 0, steps),)),) + p.gpus[1:])
    assert check_limits(p) == ["gpu 0 tb 1: 65 steps, the executor allows at most 64 per threadblock"]
    assert parse_program(write_program(p), "x") == p  # a limit, not a parse error
    assert check_limits(_with_steps(p, 0, 1, steps[:64])) == []


def test_limits_catalogue():
    p = _tiny()
    assert check_limits(p) == []
    big = _with_steps(p, 0, 0, (Step(0, "cpy", "i", 0, "o", 0, 72),) + p.gpus[0].tbs[0].steps[1:])
    assert check_limits(big) == ["gpu 0 tb 0 step 0 (cpy): cnt=72, the executor needs cnt below 72"]
    assert check_limits(replace(p, nchannels=33)) == ["nchannels=33 exceeds the executor's 32 channels"]
    renumbered = _with_steps(p, 1, 0, tuple(replace(st, s=st.s + 1) for st in p.gpus[1].tbs[0].steps))
    assert "gpu 1 tb 0 step 0 (cpy): s=1, steps must be numbered by position" in check_limits(renumbered)
    no_peer = replace(p, gpus=(p.gpus[0], replace(p.gpus[1], tbs=(replace(p.gpus[1].tbs[0], send=-1),))))
    assert check_limits(no_peer) == ["gpu 1 tb 0 step 1 (s): a s step sends but the threadblock has send=-1"]
    shared = replace(p, gpus=(replace(p.gpus[0], tbs=p.gpus[0].tbs + (Threadblock(1, 1, -1, 0, ()),)), p.gpus[1]))
    assert check_limits(shared) == [
        "gpu 0 tb 1: tbs 0 and 1 both send to gpu 1 on channel 0; one connection per (peer, channel) allows one "
        "threadblock"
    ]
    wide = replace(p, gpus=(replace(p.gpus[0], s_chunks=32769), p.gpus[1]))
    assert check_limits(wide) == [
        "gpu 0: s_chunks=32769 exceeds the 32768 chunks the executor can address (it keeps offsets in 16 bits)"
    ]
    nops = (
        Step(0, "nop", "i", -1, "o", -1, 0, 1, 0),
        Step(1, "cpy", "i", 0, "o", 0, 1),  # carries the nop's dependency but has none itself
        Step(2, "nop", "i", -1, "o", -1, 0, hasdep=True),
    )
    assert check_limits(_with_steps(p, 0, 0, nops)) == [
        "gpu 0 tb 0 step 1 (cpy): follows nop dependencies but has no dependency itself; the executor rejects this",
        "gpu 0 tb 0 step 2 (nop): nop without a dependency; the executor drops it and numbers the later steps one lower",
        "gpu 0 tb 0 step 2 (nop): nop with hasdep=1; the executor does not store nops, so it never signals",
    ]


# ---------------------------------------------------------------------------------------------------------------
# What the real parsers ignore or read differently (docs/input-contract.md; the corpus in tests/conformance)


def test_ignored_attributes_and_elements_are_recorded_once():
    text = write_program(_tiny())
    text = text.replace('maxBytes="4096"', 'maxBytes="4096" maxcount="1" nthreadblocks="1"')
    text = text.replace('cnt="1" depid', 'cnt="1" note="a" depid').replace("<tb ", '<copy i_off="0" o_off="1"/><tb ')
    program = parse_program(text, "rccl.xml")
    assert program == _tiny()  # nothing of it reaches the program
    assert program.origin.ignored == ("algo@maxcount", "algo@nthreadblocks", "gpu/copy", "step@note")


def test_min_and_max_bytes_saturate_like_strtoll():
    text = write_program(_tiny()).replace('maxBytes="4096"', 'maxBytes="' + "9" * 5000 + '"')
    assert parse_program(text, "x").max_bytes == (1 << 63) - 1
    err = _error(text.replace('minBytes="0"', 'minBytes="-99999999999999999999"'))
    assert err.field == "algo@minBytes (line 1)" and err.message == "-9223372036854775808 is below the minimum 0"


def test_statuses_sort_the_refusals_as_the_runtime_does():
    text = write_program(_tiny())
    assert _error(text[:50]).status == "parse"
    assert _error(text.replace(' cnt="1"', "", 1)).status == "schema"
    assert _error(text.replace('ngpus="2"', 'ngpus="3"')).status == "semantic"
    assert _error(text.replace('coll="allgather"', 'coll="scatter"')).status == "unsupported"


def test_nesting_is_bounded():
    deep = "<algo>" + "<x>" * 300 + "</x>" * 300 + "</algo>"
    err = _error(deep)
    assert err.status == "parse" and "nested deeper than 256" in err.message


def test_a_huge_ngpus_is_refused_listing_a_few_missing_ids():
    err = _error(write_program(_tiny()).replace('ngpus="2"', 'ngpus="2147483647"'))
    assert err.message == "ngpus=2147483647 but there is no <gpu> with id 2, 3, 4, 5, 6, 7, 8, 9 (and 2147483637 more)"


def test_origin_gives_contract_errors_their_line():
    from mlopt.formats.msccl_contract import check_contract

    text = write_program(_tiny()).replace('cnt="1" depid', 'cnt="72" depid', 1)
    with pytest.raises(InputError) as err:
        check_contract(parse_program(text, "big.xml"))
    assert str(err.value) == ("big.xml: algo/gpu[@id=0]/tb[@id=0]/step[@s=0]@cnt (line 4): cnt=72, the executor needs "
                              "cnt below 72")
    assert err.value.status == "semantic"


def test_in_place_only_programs_run_with_their_window():
    from mlopt.formats.msccl_contract import check_contract, effective_program

    def gpu(r: int) -> Gpu:
        steps = (Step(0, "s", "o", r, "o", r, 1), Step(1, "r", "o", 1 - r, "o", 1 - r, 1))
        return Gpu(r, 0, 2, 0, (Threadblock(0, 1 - r, 1 - r, 0, steps),))

    program = replace(_tiny(), inplace=True, outofplace=False, gpus=(gpu(0), gpu(1)))
    check_contract(program)
    assert [g.i_chunks for g in effective_program(program).gpus] == [1, 1]
    assert effective_program(_tiny()) == _tiny()  # not in place only: as declared
    both = replace(program, outofplace=True)
    with pytest.raises(InputError, match="only an in-place-only program"):
        check_contract(both)
    assert effective_program(both) == both

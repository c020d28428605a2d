"""Motif programs made and proven at plan time (mlopt/planners/schedule/programs.py), carried in the schedule
plan (payload["programs"], each motif naming one) and proven again by `mlopt validate`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mlopt.formats.msccl_xml import parse_program
from mlopt.planners.schedule import programs as P
from mlopt.planners.schedule.motifs import ROOTED

CYCLE = ((0, 1), (1, 2), (2, 3), (3, 0))


def keys():
    for collective in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"):
        for n in (1, 2, 3, 4, 8):
            for root in sorted({0, n - 1}) if collective in ROOTED else (0,):
                yield P.ProgramKey(collective, n, root)


@pytest.mark.parametrize("key", list(keys()), ids=str)
def test_every_motif_program_is_proven(key):
    program = P.motif_program(key)
    assert P.prove(program, key) == []
    assert P.prove(parse_program(P.proven_program_xml(key), "xml"), key) == []  # the XML as the plan carries it


def test_a_pattern_program_is_held_to_its_pairs():
    key = P.program_key("permute", (4, 5, 6, 7), pattern=[(4 + s, 4 + d) for s, d in CYCLE])
    assert key == P.ProgramKey("alltoall", 4, 0, CYCLE)  # positions, not ranks; a permute runs an all-to-all
    program = P.motif_program(key)
    assert P.prove(program, key) == []
    other = P.ProgramKey("alltoall", 4, 0, ((0, 2), (1, 2), (2, 3), (3, 0)))
    assert any("pair (0, 2)" in line for line in P.prove(program, other))


@pytest.mark.parametrize("case", ["root", "collective", "ranks", "in place only"])
def test_a_program_is_refuted_for_another_motif(case):
    key = P.ProgramKey("broadcast", 4, 1)
    program = P.motif_program(key)
    if case == "root":
        want = "holds"  # the postcondition: the other root's chunk is nowhere
        problems = P.prove(program, P.ProgramKey("broadcast", 4, 2))
    elif case == "collective":
        want, problems = "the motif a reduce", P.prove(program, P.ProgramKey("reduce", 4, 1))
    elif case == "ranks":
        want, problems = "over 4 ranks", P.prove(program, P.ProgramKey("broadcast", 8, 1))
    else:
        from dataclasses import replace
        want, problems = "outofplace", P.prove(replace(program, outofplace=False, inplace=True), key)
    assert problems and want in problems[0], problems


def test_the_enforcer_keeps_motif_program_xml():
    enforcer = pytest.importorskip("mlopt.native.enforcer")
    assert enforcer.motif_program_xml is P.motif_program_xml
    assert P.motif_program_xml("permute", 4, pattern=CYCLE) == P.motif_program_xml("alltoall", 4, pattern=CYCLE)
    with pytest.raises(ValueError, match="pairs"):
        P.motif_program_xml("permute", 4)


# ------------------------------------------------------------------------------------------------ plans


def _plan(run_cli, trace, out: Path) -> dict:
    result = run_cli("plan", "schedule", "--model", trace, "--topology", "fully-connected:2", "--max-steps", "100",
                     "-o", out)
    assert result.code == 0, result.err
    return json.loads(out.read_text())


@pytest.fixture
def planned(run_cli, ddp_example_trace, tmp_path) -> tuple[Path, dict]:
    path = tmp_path / "s.plan.json"
    return path, _plan(run_cli, ddp_example_trace, path)


def _rewrite(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc))


def test_the_plan_carries_every_motif_program_once(run_cli, ddp_example_trace, planned, tmp_path):
    path, doc = planned
    payload = doc["payload"]
    entries = {e["id"]: e for e in payload["programs"]}
    assert list(entries) == [f"p{i}" for i in range(len(entries))] and entries
    keys = [P.entry_key(e) for e in entries.values()]
    assert len(set(keys)) == len(keys)  # distinct programs only
    for e in entries.values():
        assert e["xml_sha256"] == hashlib.sha256(e["xml"].encode()).hexdigest()
        assert e["xml"] == P.motif_program_xml(e["collective"], e["ngpus"], e["root"] or 0, e["pattern"])
    motifs = [m for op in payload["comm_ops"] for m in op["motifs"]]
    assert motifs and all(P.entry_key(entries[m["program"]]) == P.motif_key(m) for m in motifs)
    again = tmp_path / "again.plan.json"
    _plan(run_cli, ddp_example_trace, again)
    assert again.read_bytes() == path.read_bytes()
    checked = run_cli("validate", path)
    assert checked.code == 0 and f"{len(entries)} motif programs proven" in checked.out + checked.err


def test_validate_refuses_a_corrupted_program_naming_the_plan_and_motif(run_cli, planned):
    path, doc = planned
    payload = doc["payload"]
    entry = next(e for e in payload["programs"] if e["collective"] == "allreduce" and e["ngpus"] == 2)
    user = next((i, j) for i, op in enumerate(payload["comm_ops"]) for j, m in enumerate(op["motifs"])
                if m["program"] == entry["id"])
    assert 'type="rrcs"' in entry["xml"]
    entry["xml"] = entry["xml"].replace('type="rrcs"', 'type="rcs"', 1)  # one rank no longer reduces
    entry["xml_sha256"] = hashlib.sha256(entry["xml"].encode()).hexdigest()
    _rewrite(path, doc)
    result = run_cli("validate", path)
    assert result.code == 2, result.out
    assert str(path) in result.err and f"$.payload.comm_ops[{user[0]}].motifs[{user[1]}]" in result.err
    assert f"runs program {entry['id']}" in result.err and "not a proven allreduce" in result.err


def test_validate_refuses_a_changed_xml_and_a_motif_naming_another_program(run_cli, planned):
    path, doc = planned
    payload = doc["payload"]
    first = payload["programs"][0]
    first["xml"] += " "
    _rewrite(path, doc)
    result = run_cli("validate", path)
    assert result.code == 2 and "xml_sha256" in result.err and str(path) in result.err
    first["xml"] = first["xml"][:-1]
    motif = next(m for op in payload["comm_ops"] for m in op["motifs"] if m["program"] != first["id"])
    motif["program"] = first["id"]
    _rewrite(path, doc)
    result = run_cli("validate", path)
    assert result.code == 2 and f"motif {motif['name']!r} is a" in result.err and ".program" in result.err


def test_a_plan_without_programs_still_validates(run_cli, planned):
    path, doc = planned
    del doc["payload"]["programs"]
    for op in doc["payload"]["comm_ops"]:
        for m in op["motifs"]:
            del m["program"]
    _rewrite(path, doc)
    result = run_cli("validate", path)
    assert result.code == 0, result.err
    assert "no motif programs carried" in result.out + result.err


# ------------------------------------------------------------------------------------------------ too large

def _too_large(monkeypatch, key: P.ProgramKey) -> None:
    """Make `key`'s program exceed the executor's limits, as a ring all-to-all over 64 or more ranks does (that
    one takes seconds to find out, so the tests pretend with a small key)."""
    from mlopt.planners.collective.lowering import LoweringError
    from mlopt.planners.schedule import validate as V

    real = P.motif_program.__wrapped__

    def refuse(asked: P.ProgramKey):
        if asked == key:
            raise LoweringError("cannot fit the executor's limits: a threadblock needs 99 steps")
        return real(asked)

    monkeypatch.setattr(P, "motif_program", refuse)
    monkeypatch.setattr(V, "motif_program", refuse)
    P.proven_program_xml.cache_clear()
    monkeypatch.setattr(P, "proven_program_xml", P.proven_program_xml.__wrapped__)


def test_a_program_too_large_for_the_executor_is_marked_not_fatal(monkeypatch):
    key = P.ProgramKey("allreduce", 3)
    _too_large(monkeypatch, key)
    rows = [{"motifs": [{"collective": "allreduce", "ranks": [4, 5, 6]}, {"collective": "allgather", "ranks": [0, 1]}]}]
    entries = P.carried_programs(rows)
    assert [e["id"] for e in entries] == ["p0", "p1"] and [m["program"] for m in rows[0]["motifs"]] == ["p0", "p1"]
    assert entries[0]["xml"] is None and entries[0]["xml_sha256"] is None
    assert "allreduce over 3 position(s)" in entries[0]["unrunnable"] and "99 steps" in entries[0]["unrunnable"]
    assert entries[1]["xml"] and "unrunnable" not in entries[1]


def test_validate_accepts_a_marked_program_only_when_mlopt_cannot_make_one(run_cli, planned, monkeypatch):
    path, doc = planned
    entry = doc["payload"]["programs"][0]
    key = P.entry_key(entry)
    entry.update(xml=None, xml_sha256=None, unrunnable="no program fits the executor: pretended")
    _rewrite(path, doc)
    result = run_cli("validate", path)  # mlopt does make this program: the mark is false
    assert result.code == 2 and "but mlopt makes one" in result.err and str(path) in result.err
    _too_large(monkeypatch, key)
    result = run_cli("validate", path)
    assert result.code == 0, result.err
    assert "1 too large for the MSCCL executor" in result.out + result.err
    del entry["unrunnable"]
    _rewrite(path, doc)
    result = run_cli("validate", path)
    assert result.code == 2 and "needs `unrunnable`" in result.err


def test_the_enforcer_refuses_a_motif_whose_program_is_marked(planned):
    enforcer = pytest.importorskip("mlopt.native.enforcer")
    _, doc = planned
    entry = doc["payload"]["programs"][0]
    entry.update(xml=None, xml_sha256=None, unrunnable="pretended")
    table = enforcer.MotifTable.from_plan(doc["payload"])
    assert table.programs[entry["id"]] is None
    motif = next(tm for op in table.ops for tm in op.motifs if tm.program == entry["id"])
    with pytest.raises(ValueError, match="no runnable program"):
        enforcer._carried(table, motif, "motif x")


def test_a_ring_alltoall_over_128_ranks_is_marked_without_lowering_it():
    rows = [{"motifs": [{"collective": "alltoall", "ranks": list(range(128))}]}]
    (entry,) = P.carried_programs(rows)
    assert entry["xml"] is None and "at least 8128 steps" in entry["unrunnable"]
    P.motif_program(P.ProgramKey("alltoall", 32))  # 496 messages per link: spread over channels, it fits

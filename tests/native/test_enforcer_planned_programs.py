"""ProgramCache with a chooser: a motif runs a planned MSCCL-EF XML (e.g. a collective plan) when it is usable.

A chooser `planned(collective, ranks, root_position, nbytes) -> path | None` names a file; the cache loads it
once and uses it when it can run the motif (same collective, ngpus = the motif's ranks, outofplace="1", a
rooted program's root = the motif's root position), else mlopt's own program, recording why
(`fallback_reasons`). Without a chooser nothing changes. End to end: an all-ranks all-reduce motif and a
sub-rank broadcast run on 4 in-process ranks with the planned program, outputs checked against numpy.

A schedule plan's own programs (payload["programs"], each motif naming one): a motif without a usable
chooser's program runs the plan's (`ProgramUse.origin` "plan"), not one made at run time; a plan without them
has them made as before, which the enforcer says once.

Skipped as a whole when the runtime library is not built.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from mlopt.native import binding as native

try:
    native.library()
except native.RuntimeLibraryNotFound as _missing:
    pytest.skip(f"mlopt runtime library unavailable: {_missing}", allow_module_level=True)

from mlopt.formats.io import sha256_bytes  # noqa: E402
from mlopt.formats.msccl_xml import write_program  # noqa: E402
from mlopt.formats.topology import fully_connected  # noqa: E402
from mlopt.planners.collective.baselines import ring  # noqa: E402
from mlopt.planners.collective.lowering import lower  # noqa: E402
from mlopt.native import enforcer as enforcer_module  # noqa: E402
from mlopt.planners.schedule import motifs as M  # noqa: E402
from mlopt.planners.schedule.programs import carried_programs  # noqa: E402
from mlopt.native.enforcer import (  # noqa: E402
    Enforcer,
    MotifTable,
    ProgramCache,
    expected_output,
    input_values,
    motif_program_xml,
    payload_row,
    stage,
)
from mlopt.sim.collectives import CollectiveSpec  # noqa: E402

N = 4
NBYTES = 4 * 8 * 4 * 16  # float32, whole chunks for every program here


def planned_xml(tmp_path: Path, collective: str = "allreduce", n: int = N, *, root: int = 0,
                inplace: bool = False) -> str:
    """A ring program in 2 instances on 2 channels (not the enforcer's own 1-channel ring) as a plan file."""
    alg = ring(fully_connected(n), CollectiveSpec(collective, n, 1, root=root))
    path = tmp_path / f"{collective}{n}-root{root}{'-inplace' if inplace else ''}.xml"
    path.write_text(write_program(lower(alg, instances=2, name=f"planned_{collective}{n}", inplace=inplace)))
    return str(path)


class Chooser:
    """Names `path` for every motif over all N ranks (as the mlopt backend's does), records what was asked."""

    def __init__(self, path: str | None, everyone: tuple[int, ...] = tuple(range(N))):
        self.path, self.everyone, self.asked = path, everyone, []

    def __call__(self, collective, ranks, root, nbytes):
        self.asked.append((collective, ranks, root, nbytes))
        return self.path if ranks == self.everyone else None


def whole(collective: str, ranks=tuple(range(N)), root=None) -> M.Motif:
    return M.as_motif(M.CommOp(collective, NBYTES, tuple(ranks), root))


def test_an_all_ranks_motif_runs_the_planned_program(tmp_path):
    path = planned_xml(tmp_path)
    chooser = Chooser(path)
    cache = ProgramCache(planned=chooser)
    try:
        first = stage(whole("allreduce"), cache, where="op 0 motif 0")
        second = stage(M.segment(M.CommOp("allreduce", NBYTES, tuple(range(N))), 2)[1], cache, where="op 1 motif 1")
        assert chooser.asked == [("allreduce", (0, 1, 2, 3), 0, NBYTES), ("allreduce", (0, 1, 2, 3), 0, NBYTES // 2)]
        assert first.program is second.program and first.program.source == path  # loaded once
        assert first.program.program_info["nchannels"] == 2  # the planned program, not the 1-channel ring
        assert first.use.planned and first.use.source == path and first.use.reason == ""
        assert cache.used == {path: 2} and cache.fallback_reasons == {}
    finally:
        cache.close()


@pytest.mark.parametrize("case", ["sub-rank", "in-place only", "ngpus", "collective", "root", "unreadable"])
def test_an_unusable_choice_falls_back_to_the_ring_with_a_reason(tmp_path, case):
    motif, path = whole("allreduce"), planned_xml(tmp_path)
    if case == "sub-rank":  # the chooser has nothing for a motif over some of the ranks
        motif, why = whole("allreduce", ranks=(0, 1)), "no planned allreduce program for ranks [0, 1]"
    elif case == "in-place only":
        path, why = planned_xml(tmp_path, inplace=True), "outofplace: the program does not declare outofplace=\"1\""
    elif case == "ngpus":
        path, why = planned_xml(tmp_path, n=2), "ngpus: the program is for 2 ranks, the motif has 4"
    elif case == "collective":
        path, why = planned_xml(tmp_path, "allgather"), "coll: the program is allgather, the motif allreduce"
    elif case == "root":
        motif = whole("broadcast", root=0)
        path = planned_xml(tmp_path, "broadcast", root=2)
        why = "root: the program's root is 2, the motif's root position 0"
    else:
        path, why = str(tmp_path / "missing.xml"), "missing.xml: cannot open"
    cache = ProgramCache(planned=Chooser(path, everyone=tuple(range(N))))
    try:
        staged = stage(motif, cache, where="op 0 motif 0")
        own, _ = cache.get(motif.collective, len(motif.ranks), 0)
        assert staged.program is own and not staged.use.planned
        assert staged.use.source == f"mlopt ring {motif.collective}"
        assert cache.used == {} and list(cache.fallback_reasons) == ["op 0 motif 0"]
        reason = cache.fallback_reasons["op 0 motif 0"]
        assert why in reason and (case == "sub-rank" or reason.startswith(f"{path}: "))  # file: field: ...
    finally:
        cache.close()


def test_without_a_chooser_nothing_changes():
    cache = ProgramCache()
    try:
        staged = stage(whole("allreduce"), cache, where="op 0 motif 0")
        assert staged.program is cache.get("allreduce", N)[0]
        assert staged.use.source == "mlopt ring allreduce" and not staged.use.planned and staged.use.reason == ""
        assert cache.used == {} and cache.fallback_reasons == {}
    finally:
        cache.close()


def test_planned_programs_run_in_the_enforcer(tmp_path):
    """An all-reduce in two segments (both over every rank) and a broadcast over ranks 1..3: the segments run
    the planned program, the sub-rank broadcast mlopt's ring; every rank's output is right."""
    path = planned_xml(tmp_path)
    everyone = tuple(range(N))
    ar, bc = M.CommOp("allreduce", NBYTES, everyone), M.CommOp("broadcast", NBYTES, (1, 2, 3), root=2)
    payload = {"channels": ["c0", "c1"], "comm_ops": [
        payload_row(ar, M.segment(ar, 2), [0, 0], [["c0"], ["c1"]], name="ar", op_id=0),
        payload_row(bc, [M.as_motif(bc)], [1], [["c0"]], name="bc", op_id=1)]}
    table = MotifTable.from_plan(payload)
    cache = ProgramCache(planned=Chooser(path))
    with Enforcer(N, watchdog_ms=5000) as enforcer:
        try:
            enforcer.load(table, programs=cache)
        finally:
            cache.close()  # the library copied the programs
        assert {k: (u.source, u.planned) for k, u in enforcer.motif_programs.items()} == {
            (0, 0): (path, True), (0, 1): (path, True), (1, 0): ("mlopt ring broadcast", False)}
        enforcer.start()
        buffers = {(r, op.index): input_values(r, op.index, 0, NBYTES // 4) for op in table.ops for r in op.ranks}
        for (r, o), buffer in buffers.items():
            enforcer.submit(r, o, buffer)  # in place
        for r in range(N):
            enforcer.wait(r)
        for (r, o), buffer in buffers.items():
            want, defined = expected_output(table.ops[o], r, 0)
            assert np.array_equal(buffer[defined], want[defined]), (r, o)


def test_the_planned_program_is_not_the_enforcers_own(tmp_path):
    """What the tests above tell apart: the chooser's file differs from mlopt's motif program."""
    assert Path(planned_xml(tmp_path)).read_text() != motif_program_xml("allreduce", N)


# ------------------------------------------------------------------------------------------------ the plan's programs


def planned_payload(tmp_path: Path) -> dict:
    """An all-reduce in two segments over every rank and a broadcast over ranks 1..3, carrying their programs
    as `mlopt plan schedule` writes them, the all-reduce's replaced by a 2-channel ring (not what the enforcer
    would make) so that running it shows it is the plan's."""
    everyone = tuple(range(N))
    ar, bc = M.CommOp("allreduce", NBYTES, everyone), M.CommOp("broadcast", NBYTES, (1, 2, 3), root=2)
    rows = [payload_row(ar, M.segment(ar, 2), [0, 0], [["c0"], ["c1"]], name="ar", op_id=0),
            payload_row(bc, [M.as_motif(bc)], [1], [["c0"]], name="bc", op_id=1)]
    programs = carried_programs(rows)
    assert [m["program"] for row in rows for m in row["motifs"]] == ["p0", "p0", "p1"]
    xml = Path(planned_xml(tmp_path)).read_text()
    programs[0].update(xml=xml, xml_sha256=sha256_bytes(xml.encode()))
    return {"channels": ["c0", "c1"], "comm_ops": rows, "programs": programs}


def test_a_plans_programs_are_the_ones_run(tmp_path):
    payload = planned_payload(tmp_path)
    table = MotifTable.from_plan(payload)
    assert table.programs == {e["id"]: e["xml"] for e in payload["programs"]}
    cache = ProgramCache()
    with Enforcer(N, watchdog_ms=5000) as enforcer:
        try:
            enforcer.load(table, programs=cache)
            first = table.ops[0].motifs[0].motif
            staged = stage(first, cache, where="op 0 motif 0", carried=("p0", table.programs["p0"]))
            assert staged.program.program_info["nchannels"] == 2  # the plan's 2-channel ring
        finally:
            cache.close()
        assert cache.origins == {"plan": 4} and enforcer.program_note == ""
        assert {k: (u.source, u.origin) for k, u in enforcer.motif_programs.items()} == {
            (0, 0): ("plan program p0", "plan"), (0, 1): ("plan program p0", "plan"),
            (1, 0): ("plan program p1", "plan")}
        enforcer.start()
        buffers = {(r, op.index): input_values(r, op.index, 0, NBYTES // 4) for op in table.ops for r in op.ranks}
        for (r, o), buffer in buffers.items():
            enforcer.submit(r, o, buffer)
        for r in range(N):
            enforcer.wait(r)
        for (r, o), buffer in buffers.items():
            want, defined = expected_output(table.ops[o], r, 0)
            assert np.array_equal(buffer[defined], want[defined]), (r, o)


def test_a_usable_chooser_program_still_comes_first(tmp_path):
    """The mlopt backend's collective plans keep running whole-collective motifs; the rest run the plan's."""
    path = planned_xml(tmp_path)
    table = MotifTable.from_plan(planned_payload(tmp_path))
    cache = ProgramCache(planned=Chooser(path))
    with Enforcer(N, watchdog_ms=5000) as enforcer:
        try:
            enforcer.load(table, programs=cache)
        finally:
            cache.close()
        assert {k: u.origin for k, u in enforcer.motif_programs.items()} == {
            (0, 0): "chooser", (0, 1): "chooser", (1, 0): "plan"}


def test_a_plan_without_programs_has_them_made_and_says_so_once(tmp_path, caplog, monkeypatch):
    payload = planned_payload(tmp_path)
    del payload["programs"]
    table = MotifTable.from_plan(payload)
    assert table.programs is None
    monkeypatch.setattr(enforcer_module, "_said_no_programs", False)
    with caplog.at_level(logging.WARNING, logger="mlopt.native.enforcer"):
        for _ in range(2):
            with Enforcer(N, watchdog_ms=5000) as enforcer:
                enforcer.load(table)
                assert {u.origin for u in enforcer.motif_programs.values()} == {"generated"}
                assert enforcer.program_note == enforcer_module.NO_PLANNED_PROGRAMS
    assert [r.getMessage() for r in caplog.records] == [enforcer_module.NO_PLANNED_PROGRAMS]


def test_a_changed_or_mismatched_program_is_refused(tmp_path):
    payload = planned_payload(tmp_path)
    payload["programs"][1]["xml"] += " "
    with pytest.raises(ValueError, match="'p1' is not the one its xml_sha256 names"):
        MotifTable.from_plan(payload)
    payload = planned_payload(tmp_path)
    payload["comm_ops"][1]["motifs"][0]["program"] = "p0"  # a 4-rank all-reduce for a 3-rank broadcast
    with Enforcer(N, watchdog_ms=5000) as enforcer:
        with pytest.raises(ValueError, match=r"op 1 \(bc\) motif 0: the plan's program p0 cannot run it: coll:"):
            enforcer.load(MotifTable.from_plan(payload))

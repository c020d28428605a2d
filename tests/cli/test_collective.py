"""`mlopt plan collective`, `mlopt simulate` and `mlopt validate` on XML, end to end through the CLI."""

from __future__ import annotations

import json

import pytest

from tests.conftest import reference
from mlopt.formats.msccl_xml import load_program
from mlopt.sim.symbolic import check_program


@pytest.fixture(scope="module")
def ring_plan(tmp_path_factory):
    """A ring allreduce on ring:4 written through the CLI (small and fast)."""
    from mlopt.cli import main

    out = tmp_path_factory.mktemp("plan") / "ar.xml"
    assert main(["-q", "plan", "collective", "--topology", "ring:4", "--collective", "allreduce", "--size", "1MiB",
                 "--algorithm", "ring", "-o", str(out)]) == 0
    return out


def test_plan_collective_writes_a_proven_xml_and_its_sidecar(ring_plan):
    sidecar = json.loads(ring_plan.with_suffix(".json").read_text())
    assert sidecar["format"] == "mlopt.plan" and sidecar["kind"] == "collective"
    payload = sidecar["payload"]
    assert payload["collective"] == "allreduce" and payload["ngpus"] == 4 and payload["algorithm"] == "ring"
    assert payload["xml"] == "ar.xml" and payload["predicted_time_us"] >= payload["lower_bound"]["time_us"]
    assert sidecar["provenance"]["status"] in ("heuristic", "optimal")
    assert sidecar["provenance"]["best_bound"] == payload["lower_bound"]["time_us"]
    assert check_program(load_program(ring_plan)).ok
    assert "wall_time_s" not in json.dumps(sidecar), "plans stay byte-identical without --record-wall-time"


def test_validate_accepts_the_plan_and_its_xml(run_cli, ring_plan):
    result = run_cli("validate", ring_plan, ring_plan.with_suffix(".json"), "--json")
    assert result.code == 0
    rows = json.loads(result.out)
    assert [r["kind"] for r in rows] == ["msccl-ef program", "collective plan"]
    assert "proven" in rows[0]["detail"]


def test_validate_notices_an_edited_xml(run_cli, ring_plan, tmp_path):
    copy = tmp_path / "ar.xml"
    copy.write_text(ring_plan.read_text().replace('dstoff="1"', 'dstoff="2"', 1))
    (tmp_path / "ar.json").write_text(ring_plan.with_suffix(".json").read_text())
    result = run_cli("validate", tmp_path / "ar.json")
    assert result.code == 2 and "$.payload.xml_sha256" in result.err
    broken = run_cli("validate", copy)
    assert broken.code == 2 and "does not implement allreduce" in broken.err


def test_same_inputs_give_byte_identical_collective_plans(run_cli, tmp_path):
    for name in ("a", "b"):
        assert run_cli("-q", "plan", "collective", "--topology", "switch:4", "--collective", "allgather", "--size", "64KiB",
                       "-o", tmp_path / name / "ag.xml").code == 0
    assert (tmp_path / "a/ag.xml").read_bytes() == (tmp_path / "b/ag.xml").read_bytes()
    assert (tmp_path / "a/ag.json").read_bytes() == (tmp_path / "b/ag.json").read_bytes()


def test_simulate_table_json_and_plot(run_cli, ring_plan, tmp_path):
    png = tmp_path / "sweep.png"
    result = run_cli("simulate", ring_plan, "--topology", "ring:4", "--sizes", "1KiB..1MiB", "--json", "--plot", png)
    assert result.code == 0
    rows = json.loads(result.out)
    assert [r["buffer_bytes"] for r in rows] == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert all(r["time_us"] >= r["bound_us"] for r in rows)
    assert rows[-1]["time_us"] > rows[0]["time_us"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_reference_xml(run_cli):
    xml = reference("msccl-xml", "msccl-scheduler_ncv4_ag_hier_4_LL.xml")
    result = run_cli("simulate", xml, "--topology", "fully-connected:4", "--size", "64KiB", "--json")
    assert result.code == 0 and json.loads(result.out)[0]["collective"] == "allgather"


@pytest.mark.parametrize("name", ["msccl-scheduler_ncv4_ag_hier_4_LL.xml", "rccl_alltoall-8n-0-9kb.xml"])
def test_validate_reference_xmls(run_cli, name):
    result = run_cli("validate", reference("msccl-xml", name))
    assert result.code == 0 and "proven" in result.err


def test_simulate_rank_mismatch_is_bad_input(run_cli, ring_plan):
    result = run_cli("simulate", ring_plan, "--topology", "ring:8", "--size", "1MiB")
    assert result.code == 2 and "algo@ngpus" in result.err


def test_malformed_xml_exits_2_with_line(run_cli, tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<algo name="x">\n  <gpu id="0">\n</algo>\n')
    result = run_cli("validate", bad)
    assert result.code == 2 and "line" in result.err and "\n" not in result.err.strip()


def test_bad_sketch_exits_2_naming_the_field(run_cli, tmp_path):
    sketch = tmp_path / "sk.json"
    sketch.write_text(json.dumps({"nnodes": 2, "intranode_sketch": {"strategy": "none"},
                                  "internode_sketch": {"strategy": "relay", "internode_conn": {"9": [1]}},
                                  "symmetry_offsets": [[8, 16]], "hyperparameters": {"input_chunkup": 1}}))
    out = tmp_path / "ag.xml"
    result = run_cli("plan", "collective", "--topology", "ndv2x2", "--collective", "allgather", "--size", "1MiB",
                     "--sketch", sketch, "-o", out)
    assert result.code == 2 and str(sketch) in result.err and "internode_conn" in result.err
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_reference_sketch_drives_synthesis(run_cli, tmp_path):
    sketch = reference("taccl", "taccl_sketch_sk2-ndv2-n2.json")
    out = tmp_path / "ag.xml"
    result = run_cli("plan", "collective", "--topology", "ndv2x2", "--collective", "allgather", "--size", "1MiB",
                     "--sketch", sketch, "-o", out, "--json")
    assert result.code == 0
    summary = json.loads(result.out)
    assert summary["algorithm"] == f"taccl[sketch={sketch}]" and summary["status"] in ("feasible", "optimal")
    assert check_program(load_program(out)).ok


def test_no_algorithm_exits_3(run_cli, tmp_path):
    result = run_cli("plan", "collective", "--topology", "ring:4", "--collective", "alltoall", "--size", "1MiB",
                     "--algorithm", "direct", "-o", tmp_path / "a.xml")
    assert result.code == 3 and "no algorithm for alltoall" in result.err and "direct" in result.err
    assert not (tmp_path / "a.xml").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--size", "1000"], "do not split into 16 equal rank shares"),
    (["--size", "12XB"], "is not a size"),
    (["--size", "1MiB", "--root", "99"], "rank 99 is not in"),
])
def test_bad_sizes_and_roots_exit_2(run_cli, tmp_path, args, fragment):
    result = run_cli("plan", "collective", "--topology", "ndv2x2", "--collective", "allgather", *args,
                     "-o", tmp_path / "a.xml")
    assert result.code == 2 and fragment in result.err and "\n" not in result.err.strip()
    assert not (tmp_path / "a.xml").exists()


def test_disconnected_topology_exits_2(run_cli, tmp_path):
    from mlopt.formats.io import write_json
    from mlopt.formats.topology import from_spec

    d = from_spec("fully-connected:4").to_dict()
    d["links"] = [l for l in d["links"] if (l["src"] < 2) == (l["dst"] < 2)]  # two islands {0,1} and {2,3}
    topo = tmp_path / "islands.json"
    write_json(topo, d)
    result = run_cli("plan", "collective", "--topology", topo, "--collective", "allgather", "--size", "1MiB",
                     "-o", tmp_path / "a.xml")
    assert result.code == 2 and f"{topo}: $.links: the topology is disconnected" in result.err and "2, 3" in result.err


def test_show_xml_and_plan(run_cli, ring_plan):
    shown = run_cli("show", ring_plan)
    assert shown.code == 0 and "MSCCL-EF program" in shown.out and "allreduce" in shown.out
    as_json = run_cli("show", ring_plan, "--json")
    assert as_json.code == 0 and json.loads(as_json.out)["ngpus"] == 4
    plan = run_cli("show", ring_plan.with_suffix(".json"))
    assert plan.code == 0 and "collective plan" in plan.out and "best_bound" in plan.out

"""Measured collective costs (`mlopt plan schedule --cost-table`): interpolation, bad tables, and a plan timed
from the table and replayed with it."""

from __future__ import annotations

import json

import pytest

from mlopt.errors import InputError
from mlopt.planners.schedule.costs import load_cost_table

HEADER = "collective,ranks,bytes,channel,time_us,algbw_GBps\n"


def _table(tmp_path, rows: str, name="costs.csv"):
    path = tmp_path / name
    path.write_text(HEADER + rows)
    return path


def test_interpolation_extrapolation_and_missing_curves(tmp_path):
    table = load_cost_table(_table(tmp_path, "allreduce,2,1000,*,10,0\nallreduce,2,3000,*,30,0\n"
                                             "allreduce,2,2000,*,15,0\nalltoall,4,64,nvlink,7,0\n"))
    t = lambda n: table.time_us("allreduce", 2, n, "*")  # noqa: E731
    assert t(500) == 10 and t(1000) == 10  # below the smallest size: its (latency-bound) time
    assert t(1500) == pytest.approx(12.5) and t(2000) == 15 and t(2500) == pytest.approx(22.5)
    assert t(5000) == pytest.approx(60)  # along the last segment (15 us per 1000 B)
    assert table.time_us("alltoall", 4, 1 << 20, "nvlink") == 7  # one point: constant
    assert table.time_us("allreduce", 4, 1000, "*") is None and table.time_us("allreduce", 2, 1000, "ib") is None


@pytest.mark.parametrize("rows, field", [
    ("allreduce,2,1000,*,10,0\nallreduce,2,1000,*,11,0\n", "row 3.bytes"),  # measured twice
    ("allreduce,2,10x,*,10,0\n", "row 2.bytes"),
    ("permute,2,1000,*,10,0\n", "row 2.collective"),
    ("allreduce,2,1000,pcie,10,0\n", "row 2.channel"),
    ("allreduce,1,1000,*,10,0\n", "row 2"),
    ("allreduce,2,1000,*,nan,0\n", "row 2.time_us"),
])
def test_bad_rows_name_the_row_and_column(tmp_path, rows, field):
    with pytest.raises(InputError) as err:
        load_cost_table(_table(tmp_path, rows), channels=("nvlink",))
    assert err.value.field == field


def test_missing_column(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("collective,ranks,bytes,time_us\nallreduce,2,10,1\n")
    with pytest.raises(InputError, match="channel"):
        load_cost_table(path)


def test_plan_is_timed_from_the_table_and_replays_with_it(run_cli, ddp_example_trace, tmp_path):
    # the DDP example's 2-rank all-reduces (4460800 B and 1028 KiB) and broadcasts on fully-connected:2
    costs = _table(tmp_path, "allreduce,2,1000000,*,1000,0\nallreduce,2,5000000,*,9000,0\n"
                             "broadcast,2,1,*,3,0\n")
    out = tmp_path / "s.json"
    result = run_cli("plan", "schedule", "--model", ddp_example_trace, "--topology", "fully-connected:2",
                     "--max-steps", "50", "--algorithm", "fifo", "--cost-table", costs, "-o", out)
    assert result.code == 0, result.err
    doc = json.loads(out.read_text())
    assert doc["payload"]["options"]["cost_table"] == str(costs) and "cost_table" in doc["provenance"]["inputs"]
    defaults = {op["nbytes"]: op["motifs"][0]["duration_us"] for op in doc["payload"]["comm_ops"]
                if op["collective"] == "allreduce"}
    assert defaults[4460800] == pytest.approx(1000 + 8000 * (4460800 - 1e6) / 4e6)
    assert defaults[1028 * 1024] == pytest.approx(1000 + 8000 * (1028 * 1024 - 1e6) / 4e6)
    replay = run_cli("validate", out, "--model", ddp_example_trace, "--topology", "fully-connected:2")
    assert replay.code == 0, replay.err
    bad = _table(tmp_path, "allreduce,2,1000,pcie,1,0\n", name="bad.csv")  # not a link class here
    refused = run_cli("plan", "schedule", "--model", ddp_example_trace, "--topology", "fully-connected:2",
                      "--cost-table", bad, "-o", tmp_path / "never.json")
    assert refused.code == 2 and f"{bad}: row 2.channel" in refused.err and not (tmp_path / "never.json").exists()

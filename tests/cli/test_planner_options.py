"""Every PlannerOptions knob has its CLI flag on the planners that solve MILPs, and the flag reaches it."""

from __future__ import annotations

from dataclasses import fields

import pytest

from mlopt.cli import _planner_options_from, cli
from mlopt.planners.options import PlannerOptions

MILP_PLANNERS = ("collective", "memory")


@pytest.mark.parametrize("planner", MILP_PLANNERS)
def test_every_planner_option_has_a_flag(planner):
    command = cli.commands["plan"].commands[planner]
    params = {p.name for p in command.params}
    assert {f.name for f in fields(PlannerOptions)} <= params


def test_flags_map_one_to_one():
    values = {"solver": "cbc", "time_limit_s": 5.0, "node_limit": 7, "mip_gap": 0.01, "threads": 2, "seed": 3,
              "dump_model": "m.mps", "record_wall_time": True}
    assert _planner_options_from(values) == PlannerOptions(**values)
    assert "node_limit" not in PlannerOptions().to_dict(), "provenance of plans made without the knob unchanged"
    assert PlannerOptions(node_limit=7).to_dict()["node_limit"] == 7

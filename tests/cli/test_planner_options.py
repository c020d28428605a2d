"""Every PlannerOptions knob has its CLI flag on the planners that solve MILPs, and the flag reaches it; every
flag of `mlopt plan KIND` is the click option of a declared CommandOption (the sweep checks specs with them)."""

from __future__ import annotations

from dataclasses import fields

import click
import pytest

from mlopt.cli import cli
from mlopt.planners.options import PLANNER_COMMAND_OPTIONS, PlannerOptions, planner_options_from_args
from mlopt.planners.registry import planner_kind

MILP_PLANNERS = ("collective", "memory")
# PlannerOptions field -> its flag (units in field names, not in flags)
FLAG_OF_FIELD = {"time_limit_s": "time-limit"}
# flags of `mlopt plan KIND` that are the command line's own, not a planner option
CLI_ONLY = {"check", "resolve", "strict-version", "output", "json", "sweep"}


@pytest.mark.parametrize("planner", MILP_PLANNERS)
def test_every_planner_option_has_a_flag(planner):
    command = cli.commands["plan"].commands[planner]
    flags = {opt[2:] for p in command.params for opt in p.opts if opt.startswith("--")}
    assert {FLAG_OF_FIELD.get(f.name, f.name.replace("_", "-")) for f in fields(PlannerOptions)} <= flags
    assert {o.name for o in PLANNER_COMMAND_OPTIONS} <= flags


@pytest.mark.parametrize("planner", ("collective", "memory", "threads", "schedule"))
def test_the_flags_are_the_declared_options(planner):
    """1:1: each declared option is a flag with its default, requiredness and choices, and nothing else is."""
    command = cli.commands["plan"].commands[planner]
    params = {opt[2:]: p for p in command.params for opt in p.opts if opt.startswith("--")}
    declared = {o.name: o for o in planner_kind(planner).all_command_options}
    assert set(params) - CLI_ONLY == set(declared)
    for name, option in declared.items():
        param = params[name]
        assert param.required == option.required, name
        assert param.multiple == option.multiple, name
        assert (param.default or None) == (option.default or None) or param.default == option.default, name
        if option.type == "choice":
            assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == option.choices, name
        assert param.is_flag == (option.type == "flag"), name


def test_flags_map_one_to_one():
    values = {"solver": "cbc", "time-limit": 5.0, "node-limit": 7, "mip-gap": 0.01, "threads": 2, "seed": 3,
              "dump-model": "m.mps", "record-wall-time": True}
    assert planner_options_from_args(values) == PlannerOptions(
        solver="cbc", time_limit_s=5.0, node_limit=7, mip_gap=0.01, threads=2, seed=3, dump_model="m.mps",
        record_wall_time=True)
    assert "node_limit" not in PlannerOptions().to_dict(), "provenance of plans made without the knob unchanged"
    assert PlannerOptions(node_limit=7).to_dict()["node_limit"] == 7

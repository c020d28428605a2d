"""Knobs shared by every planner; each has a CLI flag of the same name, declared here as data
(`PLANNER_COMMAND_OPTIONS`, from which mlopt/cli.py builds the click options)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import probe_output_path
from mlopt.formats.loaders import TopologyOptions
from mlopt.formats.sizes import parse_size
from mlopt.solvers import SolveOptions


@dataclass(frozen=True)
class PlannerOptions:
    solver: str = "auto"  # --solver: auto | highs | cbc | gurobi (auto: gurobi with a full licence, else highs)
    time_limit_s: float | None = None  # --time-limit: stop and return the best plan found, with its gap
    node_limit: int | None = None  # --node-limit: stop each MILP after this many branch-and-bound nodes (reproducible)
    mip_gap: float = 1e-4  # --mip-gap: relative gap at which a MILP counts as solved
    threads: int = 1  # --threads: solver threads (1 keeps runs reproducible)
    seed: int = 0  # --seed: solver and heuristic random seed
    dump_model: str | None = None  # --dump-model: write the MILP as MPS here for offline re-solves
    record_wall_time: bool = False  # --record-wall-time: put the wall time in the plan (breaks byte-identity)

    def to_dict(self) -> dict[str, Any]:
        """The options that shape the plan, for provenance (output-only knobs left out)."""
        d = asdict(self)
        d.pop("dump_model")
        d.pop("record_wall_time")
        if d["node_limit"] is None:
            d.pop("node_limit")  # plans made before the knob existed keep their provenance
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PlannerOptions":
        """The options back from `to_dict` (a plan's provenance.options, a sweep's cell); the output-only knobs
        and any option left out take their defaults. An option PlannerOptions does not have is a ValueError
        (provenance.options of a collective plan also holds that planner's own options: pick the shared ones)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"PlannerOptions has no option {unknown[0]!r} (it has {', '.join(sorted(known))})")
        return cls(**data)

    def solve_options(self, dump_suffix: str = "") -> SolveOptions:
        """Options for one solve; a planner with several solves names each dump with a suffix."""
        dump = None
        if self.dump_model:
            stem = self.dump_model[:-4] if self.dump_model.endswith(".mps") else self.dump_model
            dump = f"{stem}{dump_suffix}.mps"
        return SolveOptions(time_limit_s=self.time_limit_s, node_limit=self.node_limit, mip_gap=self.mip_gap,
                            threads=self.threads, seed=self.seed, dump_model=dump)


# ---------------------------------------------------------------------------------------------------------
# `mlopt plan KIND`'s options declared without click


@dataclass(frozen=True)
class CommandOption:
    """One option of `mlopt plan KIND`, declared without click: mlopt.cli builds the click option from it and
    the sweep checks a spec's values with it (`convert_option`), so both accept the same values.

    `name` is the long flag without `--` (`budget-ratio`); it is also the option's key in the `args` dict a
    kind's `prepare_plan` takes (one rule everywhere: the flag's spelling, dashes and all)."""

    name: str  # the long flag without --, and the key in `args`
    type: str  # "text" | "path" (text naming an output path) | "int" | "float" (finite) | "choice" | "flag"
    help: str  # the flag's --help text
    default: Any = None  # the value when the option is not given (flags: False; repeatable: ())
    required: bool = False  # `mlopt plan KIND` refuses to run without it
    choices: tuple[str, ...] = ()  # type "choice": the accepted values
    min: float | None = None  # int and float: the least accepted value (None: unbounded)
    max: float | None = None  # int and float: the largest accepted value (None: unbounded)
    min_open: bool = False  # float: `min` itself is refused (a positive time limit)
    multiple: bool = False  # repeatable (--sketch A --sketch B): a tuple of values
    size_range_axis: bool = False  # a sweep grid may give it as LO..HI: the sizes mlopt simulate's grid spans
    show_default: bool = False  # --help shows the default

    def range_text(self) -> str:
        low = "" if self.min is None else f"{self.min}{'<' if self.min_open else '<='}"
        high = "" if self.max is None else f"<={self.max}"
        return f"{low}x{high}"


def convert_option(option: CommandOption, text: str) -> Any:
    """One value of `option` from its text, as the command line converts it (the sweep's values are checked
    and converted with it, so a cell plans with exactly the values `mlopt plan KIND --NAME TEXT` would);
    ValueError with a one-line reason otherwise."""
    if option.type in ("text", "path"):
        return text
    if option.type == "choice":
        if text not in option.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(repr(c) for c in option.choices)}")
        return text
    if option.type == "int":
        try:
            value: Any = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a valid integer") from None
    elif option.type == "float":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a valid float") from None
        if not math.isfinite(value):
            raise ValueError(f"{text!r} is not a finite number")
    else:
        raise ValueError(f"--{option.name} is a flag: it takes no value")
    too_low = option.min is not None and (value < option.min or (option.min_open and value == option.min))
    if too_low or (option.max is not None and value > option.max):
        raise ValueError(f"{value} is not in the range {option.range_text()}")
    return value


def one_of_problem(group: tuple[str, ...], given: Any) -> str | None:
    """Why the options given break "exactly one of `group`" (`given`: the names given), None when they keep it."""
    named = [name for name in group if name in given]
    if len(named) == 1:
        return None
    listed = " and ".join(f"--{name}" for name in group)
    return f"needs exactly one of {listed}" + (f" (given: {', '.join(named)})" if named else "")


def command_args(options: tuple[CommandOption, ...], given: dict[str, Any], command: str,
                 one_of: tuple[tuple[str, ...], ...] = ()) -> dict[str, Any]:
    """Every option of `command` by name: those given (already converted), the rest at their defaults;
    InputError (exit 2) for an option the command does not have, a required one left out, or a group of which
    exactly one must be given (`one_of`) that is not."""
    known = {o.name: o for o in options}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InputError(command, f"--{unknown[0]}", f"no such option (it has {', '.join(known)})")
    missing = [f"--{o.name}" for o in options if o.required and given.get(o.name) is None]
    if missing:
        raise InputError(command, missing[0], "required: give it")
    for group in one_of:
        problem = one_of_problem(group, {name for name, value in given.items() if value is not None})
        if problem:
            raise InputError(command, f"--{group[0]}", problem)
    return {o.name: _coerce(o, given[o.name], command) if o.name in given else o.default for o in options}


_WHAT = {"text": "text", "path": "a path", "int": "an integer", "float": "a number", "choice": "one of the choices"}


def _coerce(option: CommandOption, value: Any, command: str) -> Any:
    """A value given in Python (not from text): text is converted as the command line would, an int is taken
    for a float option as a float (a plan records 1.0, as for `--budget-ratio 1`); None stays None (the
    option not given)."""
    try:
        if value is None:
            return None
        if option.multiple:
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                value = (value,)
            return tuple(convert_option(option, v) if isinstance(v, str) else v for v in value)
        if option.type == "flag":
            if not isinstance(value, bool):
                raise ValueError(f"a flag: expected true or false, found {value!r}")
            return value
        if isinstance(value, str):
            return convert_option(option, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected {_WHAT[option.type]}, found {value!r}")
        if option.type == "float":
            return convert_option(option, repr(float(value)))
        if option.type == "int" and isinstance(value, int):
            return convert_option(option, str(value))
        raise ValueError(f"expected {_WHAT[option.type]}, found {value!r}")
    except ValueError as exc:
        raise InputError(command, f"--{option.name}", str(exc)) from None


# ---------------------------------------------------------------------------------------------------------
# the shared flags of `mlopt plan KIND`


def _declarations():
    seed = CommandOption("seed", "int", "Solver and heuristic seed.", default=0, show_default=True)
    record = CommandOption("record-wall-time", "flag", "Record the wall time in the plan (breaks byte-identity).",
                           default=False)
    milp = (
        CommandOption("solver", "choice", "MILP backend (auto: gurobi with a full licence, else highs).",
                      default="auto", choices=("auto", "highs", "cbc", "gurobi"), show_default=True),
        CommandOption("time-limit", "float", "Seconds per solve; the best plan found is returned with its gap.",
                      min=0, min_open=True),
        CommandOption("node-limit", "int", "Branch-and-bound nodes per solve: a limit that gives the same plan on "
                                           "every run.", min=1),
        CommandOption("mip-gap", "float", "Relative gap at which a MILP counts as solved.", default=1e-4, min=0,
                      show_default=True),
        CommandOption("threads", "int", "Solver threads (1 keeps runs reproducible).", default=1, min=1,
                      show_default=True),
        seed,
        CommandOption("dump-model", "path", "Write the MILP as MPS for offline re-solves."),
        record,
    )
    solverless = (CommandOption("seed", "int", "Heuristic seed.", default=0, show_default=True), record)
    topology = (
        CommandOption("nodes", "int", "Replicate a one-node profile (TACCL topology file) over this many nodes.",
                      min=1),
        CommandOption("chunk-size", "text", "TACCL profile chunk size (e.g. 1MB) when the profile name lacks it."),
        CommandOption("time-unit-us", "float", "Microseconds per unit of a TACCL profile's scaled costs.",
                      default=1.0, min=0, min_open=True, show_default=True),
    )
    return milp, solverless, topology


# the knobs of PlannerOptions as flags (planners that solve MILPs: collective, memory, `plan --model`)
# the knobs of a planner without a MILP: its seed and --record-wall-time; the solver knobs keep their defaults
# the options of reading a topology: presets need none; TACCL node profiles may need all three
PLANNER_COMMAND_OPTIONS, SOLVERLESS_COMMAND_OPTIONS, TOPOLOGY_COMMAND_OPTIONS = _declarations()


def planner_options_from_args(args: dict[str, Any]) -> PlannerOptions:
    """PlannerOptions from `mlopt plan KIND`'s options by flag name (those a solverless kind lacks: defaults);
    an unwritable --dump-model fails here, before any work (it is written inside a solve)."""
    if args.get("dump-model"):
        probe_output_path(args["dump-model"])
    defaults = PlannerOptions()
    return PlannerOptions(
        solver=args.get("solver", defaults.solver), time_limit_s=args.get("time-limit", defaults.time_limit_s),
        node_limit=args.get("node-limit", defaults.node_limit), mip_gap=args.get("mip-gap", defaults.mip_gap),
        threads=args.get("threads", defaults.threads), seed=args.get("seed", defaults.seed),
        dump_model=args.get("dump-model"), record_wall_time=args.get("record-wall-time", False))


def topology_options_from_args(args: dict[str, Any]) -> TopologyOptions:
    """TopologyOptions from the --nodes, --chunk-size and --time-unit-us options by flag name."""
    chunk = args.get("chunk-size")
    return TopologyOptions(args.get("nodes"), parse_size(chunk, "--chunk-size") if chunk else None,
                           args.get("time-unit-us", 1.0))

"""What every planner kind declares, once, for every part of mlopt that handles its plans (issue 25).

A `PlannerKind` is the one place the rest of mlopt learns about a kind of plan: how `mlopt plan --model` runs
it, which files it writes for an output path, how `mlopt validate` replays it, which numbers the sweep reports,
what `--check` compares, and how `mlopt simulate` applies it to a workload. Each kind builds its entry in
`mlopt/planners/<kind>/kind.py`; `mlopt.planners.registry` lists them. This module holds only the types (the
kind modules import it, the registry imports the kind modules).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from mlopt.errors import InputError

from mlopt.formats.plan import Plan, PlanFile
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ModelTrace
from mlopt.planners.options import CommandOption, PlannerOptions, command_args


@dataclass(frozen=True)
class WrittenPlan:
    """One plan file a planner wrote into the output folder (its own extra files, e.g. XML, beside it)."""

    file: str  # name relative to the output folder
    plan: Plan


# None when the planner applies to the trace and topology, else the reason it does not ("needs --topology")
WhyNot = Callable[[ModelTrace, Topology | None], str | None]
# `mlopt plan --model`: the plans for the trace, written atomically into the output folder; `inputs` names the
# input files for provenance
RunFromTrace = Callable[[ModelTrace, Topology | None, PlannerOptions, Path, dict[str, Any]], list[WrittenPlan]]
# `mlopt validate`: (plan, source, model path, topology spec) -> a one-line detail; raises InputError
PayloadValidator = Callable[[PlanFile, str, str | None, str | None], str]


def no_recorded_options(payload: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {}


def options_in_payload(payload: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """For kinds that keep their own options in payload.options (threads, schedule)."""
    options = payload.get("options")
    return {name: (f"$.payload.options.{name}", v) for name, v in options.items()} if isinstance(options, dict) else {}


def same_options(specific: dict[str, Any]) -> dict[str, Any]:
    return dict(specific)


def same_file(path: Path) -> Path:
    return path


def no_file_checks(path: Path, plan: PlanFile) -> list[str]:
    return []


def own_name(path: Path, plan: PlanFile) -> str:
    return path.name


@dataclass(frozen=True)
class StalenessFacts:
    """What `mlopt plan KIND --check PLAN` needs to know beyond the shared provenance (docs/plan-check.md)."""

    # the kind's own options a plan records outside provenance.options: name -> (JSON path, value)
    recorded_options: Callable[[dict[str, Any]], dict[str, tuple[str, Any]]] = no_recorded_options
    # the kind's own options given now -> those a plan made now would record
    expected_options: Callable[[dict[str, Any]], dict[str, Any]] = same_options
    # PLAN as given on the command line -> the plan envelope to read (a collective plan's XML -> its sidecar)
    plan_file: Callable[[Path], Path] = same_file
    # stale reasons beyond inputs, options and version (a collective plan's XML changed after planning)
    file_checks: Callable[[Path, PlanFile], list[str]] = no_file_checks
    # the name a re-run's -o takes so that the re-run's files have the committed files' names
    rerun_name: Callable[[Path, PlanFile], str] = own_name


@dataclass(frozen=True)
class SimulatedIteration:
    """A workload (mlopt.sim.workload) as the plans applied so far left it, with what the plans need."""

    workload: Any
    trace: ModelTrace | None  # the trace the workload came from (None for a --workload spec)
    model_path: str | None
    order: tuple[int, ...] = ()  # collectives in the order a schedule plan issues them (empty: the policy's)


@dataclass(frozen=True)
class SimulationFacts:
    """How `mlopt simulate PLAN ...` applies a plan of the kind."""

    # (iteration, plan path) -> the iteration with the plan applied; None: the plan is an MSCCL-EF XML that the
    # system layer applies (mlopt.sim.evaluate.classify_plans takes it from the envelope)
    apply: Callable[[SimulatedIteration, str], SimulatedIteration] | None = None
    # kinds apply in increasing stage: re-bucketing the gradients (threads) before adding recomputation (memory)
    # before ordering the collectives (schedule), so each sees the items it changes
    stage: int = 0
    needs_trace: bool = False  # applies to a trace's ops (no --workload spec)
    at_most_one: bool = False
    # not applied alongside a plan of these kinds: (kinds, why), printed as a warning
    superseded_by: tuple[tuple[str, ...], str] = ((), "")


def envelope_metrics(doc: dict[str, Any]) -> dict[str, Any]:
    """Status, objective and gap of any plan envelope (the first columns of a sweep's summary)."""
    prov = doc.get("provenance", {})
    return {"status": prov.get("status"), "objective": prov.get("objective"), "gap": prov.get("gap")}


def one_file(output: str) -> list[str]:
    """The files of a kind that writes only its plan envelope at the output path."""
    return [str(PurePosixPath(output))]


# ---------------------------------------------------------------------------------------------------------
# `mlopt plan KIND` without click: its options declared as data, the plan files from a dict of them


def quiet(message: str) -> None:
    """A progress or notice callback that shows nothing (the sweep's cells, `mlopt -q`)."""


@dataclass(frozen=True)
class PlannedFiles:
    """What `mlopt plan KIND -o OUTPUT` wrote."""

    files: list[Path]  # every file written, the plan envelope last
    plan: Plan  # the plan (its envelope is files[-1])


@dataclass(frozen=True)
class PlanRequest:
    """`mlopt plan KIND ARGS` with its inputs read and its options built, before anything is planned: what
    `--check` compares, and the planning itself."""

    inputs: dict[str, Any]  # the input files (and presets) by provenance name, as a plan records them
    planner_options: PlannerOptions  # the shared knobs
    specific: dict[str, Any]  # the kind's own options, as `--check` compares them with a plan's
    title: str  # what is being planned, for a progress line ("planning allgather on ndv2x2")
    # (output, progress callback) -> the files written at `output` (atomically: all of them or none)
    write: Callable[[Path, Callable[[str], None]], PlannedFiles]
    notices: tuple[str, ...] = ()  # worth saying before planning (not warnings about the plan)


# args (every option by name, converted: see CommandOption) -> the request; raises MloptError subclasses
PreparePlan = Callable[[dict[str, Any]], PlanRequest]


@dataclass(frozen=True)
class PlannerKind:
    """Everything mlopt knows about one kind of plan, for every command that handles one."""

    name: str  # the plan's `kind` and the `mlopt plan KIND` subcommand
    options_type: type  # the kind's own options dataclass (round-trips through options_to_dict/options_from_dict)
    why_not: WhyNot
    run: RunFromTrace  # `mlopt plan --model`
    output_suffix: str  # of `mlopt plan KIND -o PATH` (the sweep names its cells' outputs with it)
    files: Callable[[str], list[str]]  # every file `-o output` writes (posix paths), the plan envelope last
    file_inputs: tuple[str, ...]  # options of `mlopt plan KIND` that always name files (the sweep resolves them)
    named_inputs: tuple[str, ...]  # options that name a preset or a file
    validate: PayloadValidator
    metrics: Callable[[dict[str, Any]], dict[str, Any]]  # plan envelope -> the sweep summary's row
    staleness: StalenessFacts = StalenessFacts()
    simulation: SimulationFacts | None = None  # None: `mlopt simulate` does not apply it
    # `mlopt plan KIND`: its own options (in --help order), then the shared ones (options.PLANNER_COMMAND_OPTIONS
    # or SOLVERLESS_COMMAND_OPTIONS); -o, --check, --resolve, --strict-version and --json are the CLI's own
    command_options: tuple[CommandOption, ...] = ()
    shared_options: tuple[CommandOption, ...] = ()
    prepare_plan: PreparePlan | None = None  # None: no `mlopt plan KIND` subcommand (a test's kind)
    one_of: tuple[tuple[str, ...], ...] = ()  # groups of options of which a command gives exactly one
    command_help: str = ""  # `mlopt plan KIND --help`: what the command plans and writes
    # (what was written, -o as given, the options by flag name) -> (the --json summary, the one line printed)
    summary: Callable[[PlannedFiles, str, dict[str, Any]], tuple[dict[str, Any], str]] | None = None

    @property
    def all_command_options(self) -> tuple[CommandOption, ...]:
        return (*self.command_options, *self.shared_options)

    def command_option(self, name: str) -> CommandOption | None:
        return next((o for o in self.all_command_options if o.name == name), None)

    def request(self, args: dict[str, Any]) -> PlanRequest:
        """`mlopt plan KIND` with these options (by flag name; left out: the CLI's defaults), ready to plan."""
        if self.prepare_plan is None:
            raise InputError(f"mlopt plan {self.name}", "$", "this kind has no plan command")
        return self.prepare_plan(command_args(self.all_command_options, args, f"mlopt plan {self.name}",
                                              self.one_of))

    def plan_files(self, args: dict[str, Any], output: Path,
                   progress: Callable[[str], None] = quiet) -> PlannedFiles:
        """What `mlopt plan KIND ARGS -o OUTPUT` writes, byte for byte, without the command line; errors are
        the command's (InputError: exit 2, InfeasibleError: exit 3)."""
        return self.request(args).write(Path(output), progress)

    def options_to_dict(self, options: Any) -> dict[str, Any]:
        """The kind's own options as plain data (every field; a memory profile too, unlike provenance)."""
        if not isinstance(options, self.options_type):
            raise TypeError(f"{self.name} options are {self.options_type.__name__}, not {type(options).__name__}")
        return options_to_dict(options)

    def options_from_dict(self, data: dict[str, Any]) -> Any:
        return options_from_dict(self.options_type, data)


# ---------------------------------------------------------------------------------------------------------
# options as plain data (the sweep's specs, provenance), for any options dataclass


def options_to_dict(options: Any) -> dict[str, Any]:
    """Every field of an options dataclass as JSON-ready data (tuples as lists)."""
    return {f.name: json.loads(json.dumps(getattr(options, f.name))) for f in fields(options)}


def options_from_dict(options_type: type, data: dict[str, Any]) -> Any:
    """The options dataclass back from `options_to_dict`'s data; fields left out take their defaults. A field
    it does not have is a ValueError; lists become tuples where the field's default is a tuple."""
    known = {f.name: f for f in fields(options_type)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{options_type.__name__} has no option {unknown[0]!r} (it has {', '.join(known)})")
    values = {}
    for name, value in data.items():
        default = known[name].default
        values[name] = tuple(value) if isinstance(value, list) and isinstance(default, tuple) else value
    missing = [n for n, f in known.items() if n not in values and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{options_type.__name__} needs option {missing[0]!r}")
    return options_type(**values)

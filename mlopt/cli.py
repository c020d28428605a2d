"""The `mlopt` command: parse, build the problem, call the planner, write atomically.

Every user error surfaces as one line on stderr and an exit code: 2 for bad input (naming the file and the
field), 3 for an infeasible problem (saying what would be feasible), 1 for anything unexpected.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mlopt import __version__, plan_check
from mlopt.errors import InputError, MloptError
from mlopt.formats import io
from mlopt.formats import show as show_module
from mlopt.formats import staleness as st
from mlopt.formats.io import canonical_json, staged_files, staged_folder, write_json
from mlopt.formats.loaders import TopologyOptions, load_any, load_trace_any, resolve_topology
from mlopt.formats.plan import load_plan
from mlopt.formats.show import stdout_console
from mlopt.formats.sizes import format_size, parse_size, parse_size_range
from mlopt.formats.staleness import changed_inputs
from mlopt.formats.topology import save_topology
from mlopt.formats.trace import save_trace
from mlopt.native.run_collective import RunCollectiveOptions, raise_for_mismatch, run_collective
from mlopt.planners.memory import kind as memory_kind
from mlopt.planners.memory import sweep as memory_sweep
from mlopt.planners.memory.plots import plot_memory_timeline
from mlopt.planners.memory.validate import replay_plan
from mlopt.planners.options import PLANNER_COMMAND_OPTIONS, TOPOLOGY_COMMAND_OPTIONS, CommandOption, command_args, \
    planner_options_from_args, topology_options_from_args
from mlopt.planners.protocol import PlannedFiles, SimulatedIteration, SimulationFacts
from mlopt.planners.registry import planner_kind, planner_kinds
from mlopt.planners.schedule.gantt import write_system_gantts
from mlopt.planners.umbrella import plan_all
from mlopt.profilers import contention as prof
from mlopt.profilers import hardware as hw
from mlopt.profilers.operators import ProfileOptions, profile_operators
from mlopt.sim import evaluate as ev
from mlopt.sim import training_plots
from mlopt.sim import workload as wl
from mlopt.sim.collective_algorithms import ALGORITHMS
from mlopt.sim.evaluate import EvaluateOptions
from mlopt.sim.plots import plot_size_sweep
from mlopt.sim.report import simulation_rows
from mlopt.solvers import resolve_solver
from mlopt.solvers.report import solver_report
from mlopt.sweep import run_sweep
from mlopt.sweep.report import print_table
from mlopt.trace_sources import make_trace
from mlopt.validate import validate_file

EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a job stopped by Ctrl-C


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf: FloatRange lets NaN through (every comparison with it is
    false), and a NaN or infinite budget, limit or cost would reach the planners' arithmetic and the solver."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        if converted is not None and not math.isfinite(converted):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return converted


def _print_json(value: Any) -> None:
    click.echo(canonical_json(value), nl=False)


ITERATION_ALGORITHMS = list(ALGORITHMS)  # --algorithm of `mlopt simulate`


def _click_option(option: CommandOption) -> Callable:
    """The click option of a declared `mlopt plan` option (mlopt.planners.options.CommandOption), so that the
    command line and the sweep, which checks a spec with the declaration, accept the same values."""
    common = {"help": option.help or None, "required": option.required, "show_default": option.show_default}
    if option.type == "flag":
        return click.option(f"--{option.name}", is_flag=True, help=option.help or None)
    if option.type == "int":
        kind: Any = click.IntRange(min=option.min, max=option.max) if (option.min, option.max) != (None, None) \
            else int
    elif option.type == "float":
        kind = FiniteFloatRange(min=option.min, max=option.max, min_open=option.min_open)
    elif option.type == "choice":
        kind = click.Choice(list(option.choices))
    else:
        kind = click.Path() if option.type == "path" else None
    return click.option(f"--{option.name}", type=kind, default=option.default, multiple=option.multiple, **common)


def _click_options(options: Sequence[CommandOption]) -> list[Callable]:
    return [_click_option(o) for o in options]


def _apply(decorators: list[Callable], func: Callable) -> Callable:
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def topology_options(func: Callable) -> Callable:
    """Options for reading a topology: presets need none; TACCL node profiles may need all three."""
    return _apply(_click_options(TOPOLOGY_COMMAND_OPTIONS), func)


def _topology_options(nodes: int | None, chunk_size: str | None, time_unit_us: float) -> TopologyOptions:
    return topology_options_from_args({"nodes": nodes, "chunk-size": chunk_size, "time-unit-us": time_unit_us})


def _check_and_output_options(output_required: bool, what: str) -> list[Callable]:
    """--check / --resolve / --strict-version (docs/plan-check.md) and -o, required unless --check."""
    def output_unless_check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None and output_required and ctx.params.get("check_path") is None:
            raise click.MissingParameter(ctx=ctx, param=param)  # -o is required unless --check (declared first)
        return value

    return [
        click.option("--check", "check_path", type=click.Path(), default=None,
                     help="Do not plan: exit 0 if PLAN (made by this command) is current for these inputs and "
                          "options, 1 if stale (docs/plan-check.md)."),
        click.option("--resolve", is_flag=True, help="With --check: also re-plan into a temporary folder and "
                                                     "compare the bytes."),
        click.option("--strict-version", is_flag=True, help="With --check: another mlopt version is stale."),
        click.option("-o", "--output", type=click.Path(), callback=output_unless_check,
                     help=f"Where to write {what} (required unless --check)."),
    ]


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")


def planner_options(func: Callable, output_required: bool = True) -> Callable:
    """The knobs every planner shares, mirroring mlopt.planners.options.PlannerOptions one to one."""
    return _apply([*_check_and_output_options(output_required, "the plan(s)"),
                   *_click_options(PLANNER_COMMAND_OPTIONS), JSON_OPTION], func)


def kind_options(kind_name: str) -> Callable[[Callable], Callable]:
    """Every option of `mlopt plan KIND` as its kind declares it (mlopt.planners.<kind>.kind), then -o, --check,
    --resolve, --strict-version, the shared knobs and --json."""
    kind = planner_kind(kind_name)
    what = "the plan(s)" if kind.shared_options == PLANNER_COMMAND_OPTIONS else "the plan"

    def decorate(func: Callable) -> Callable:
        return _apply([*_click_options(kind.command_options), *_check_and_output_options(True, what),
                       *_click_options(kind.shared_options), JSON_OPTION], func)

    return decorate


def _args_of(params: dict[str, Any]) -> dict[str, Any]:
    """click's parameters -> the options by flag name (`budget_ratio` -> `budget-ratio`), as kinds take them."""
    return {name.replace("_", "-"): value for name, value in params.items()}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="mlopt")
@click.option("-v", "--verbose", count=True, help="More output (-vv: tracebacks on internal errors).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and requested output.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Offline planners for distributed ML training: memory, collectives, threads, schedules."""
    ctx.obj = {"verbose": 0 if quiet else verbose + 1}


def _say(ctx: click.Context, message: str, level: int = 1) -> None:
    if (ctx.obj or {}).get("verbose", 1) >= level:
        click.echo(message, err=True)


@contextlib.contextmanager
def _progress(ctx: click.Context, title: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr for long work, updated with a short message; silent with -q or when piped."""
    if (ctx.obj or {}).get("verbose", 1) < 1 or not sys.stderr.isatty():
        yield lambda message: None
        return

    with Console(stderr=True).status(title) as status:
        yield lambda message: status.update(f"{title}: {message}")


@contextlib.contextmanager
def _progress_bar(ctx: click.Context, title: str) -> Iterator[Callable[[int, int, str], None]]:
    """A rich progress bar on stderr (done/total, current item); silent with -q or when piped."""
    if (ctx.obj or {}).get("verbose", 1) < 1 or not sys.stderr.isatty():
        yield lambda done, total, what: None
        return

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[what]}"), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(title, total=None, what="")

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, what=what)

        yield update


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"mlopt: warning: {message}", err=True)


STRICT_OPTION = click.option(
    "--strict", is_flag=True,
    help="Refuse a plan (or plan index) whose recorded sha256 of --model or --topology differs from the file "
         "given now (default: a warning naming the input).")


def _check_recorded_inputs(paths, given: dict[str, str | None], strict: bool) -> None:
    """Each plan or index among `paths` against the inputs given now: a warning per input whose bytes differ
    from those it was made for; an InputError (exit 2) with --strict."""
    for path in paths:
        for field, line in changed_inputs(path, given):
            if strict:
                raise InputError(str(path), field, f"{line}; --strict refuses it")
            click.echo(f"mlopt: warning: {path}: {field}: {line}", err=True)


def _validate_plans(files, model_path: str | None, topology_spec: str | None) -> None:
    """What `mlopt validate FILES --model --topology` checks, before anything is simulated: an MSCCL-EF
    program must prove its collective (no deadlock, offsets in range), a plan must replay against its trace;
    a plan index stands for the plans it lists."""
    for path in files:
        if str(path).endswith((".json", ".json.gz")) and load_any(path).kind == "plan-index":
            folder = Path(path).parent
            listed = [str(folder / entry["file"]) for entry in load_any(path).value["plans"]]
            _validate_plans(listed, model_path, topology_spec)
            continue
        validate_file(path, model_path, topology_spec)


# ---------------------------------------------------------------------------------------------------------
# show / validate


@cli.command()
@click.argument("spec")
@topology_options
@click.option("--json", "as_json", is_flag=True, help="Print the loaded document as canonical JSON.")
@click.option("--all-links", is_flag=True, help="List every link, not one row per link class.")
def show(spec: str, nodes, chunk_size, time_unit_us, as_json: bool, all_links: bool) -> None:
    """Human-readable tables of a topology (file or preset such as ndv2x2), trace, sketch or plan."""
    loaded = load_any(spec, _topology_options(nodes, chunk_size, time_unit_us))
    if as_json:
        _print_json(show_module.as_dict(loaded))
        return
    show_module.render(loaded, all_links=all_links)


@cli.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--model", "model_path", default=None, help="Trace the plans were made for (some kinds need it).")
@click.option("--topology", "topology_spec", default=None, help="Topology the plans were made for.")
@click.option("--json", "as_json", is_flag=True, help="Print one result per file as JSON.")
@STRICT_OPTION
@click.pass_context
def validate(ctx: click.Context, files: tuple[str, ...], model_path, topology_spec, as_json: bool,
             strict: bool) -> None:
    """Check files without a solver: format, schema, references; plans by replaying them."""
    results = []
    for f in files:
        results.append(validate_file(f, model_path, topology_spec))
        _check_recorded_inputs([f], {"model": model_path, "topology": topology_spec}, strict)
    if as_json:
        _print_json([r.to_dict() for r in results])
    else:
        for r in results:
            _say(ctx, f"{r.file}: ok ({r.kind}{': ' + r.detail if r.detail else ''})")


# ---------------------------------------------------------------------------------------------------------
# trace


@cli.command()
@click.argument("source")
@click.option("-o", "--output", required=True, type=click.Path(), help="Trace file to write (mlopt.trace JSON).")
@click.option("--kineto", default=None, help="Kineto JSON for per-op durations (ET import).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Rank of the ET's process (default: from Kineto's distributedInfo, else 0).")
@click.option("--step-scope", default=None, help="record_function name of the step in the ET (default: largest ## ... ##).")
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True, help="Batch size (model tracing).")
@click.option("--input-shape", default=None, help="Per-sample input shape such as 3,224,224 (model tracing).")
@click.option("--optimizer", type=click.Choice(["sgd", "adam", "none"]), default="sgd", show_default=True,
              help="Optimizer step traced after backward (model tracing).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed iterations; per-op time is their median (model tracing).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights and inputs (model tracing).")
@click.option("--name", default=None, help="Name recorded in the trace.")
@click.option("--channels-last", is_flag=True,
              help="Trace the model and inputs in torch.channels_last (model tracing; CPU: oneDNN NHWC convolutions).")
@click.option("--json", "as_json", is_flag=True, help="Print a summary on stdout.")
@click.pass_context
def trace(ctx: click.Context, source: str, output: str, kineto, rank, step_scope, batch, input_shape, optimizer, repeats,
          seed, name, channels_last, as_json) -> None:
    """Make a model trace: import a PyTorch Execution Trace file, or trace MODULE:CALLABLE on CPU.

    SOURCE is a PyTorch ET file (JSON, optionally gzipped) or a model such as torchvision:resnet50 or
    mypkg.models:build (any importable callable returning an nn.Module; needs the `torch` extra).
    """
    with _progress(ctx, f"tracing {source}") as progress:
        result = make_trace(source, kineto=kineto, rank=rank, step_scope=step_scope, batch=batch, input_shape=input_shape,
                            optimizer=optimizer, repeats=repeats, seed=seed, name=name,
                            memory_format="channels-last" if channels_last else "contiguous", progress=progress)
    save_trace(result, output)
    summary = {
        "file": output, "name": result.name, "ops": len(result.ops), "tensors": len(result.tensors),
        "by_role": {role: len(result.ops_by_role(role)) for role in ("forward", "backward", "optimizer", "comm", "other")},
    }
    if as_json:
        _print_json(summary)
    else:
        roles = ", ".join(f"{n} {r}" for r, n in summary["by_role"].items() if n)
        _say(ctx, f"wrote {output}: {summary['ops']} ops ({roles}), {summary['tensors']} tensors")


# ---------------------------------------------------------------------------------------------------------
# plan


def _check_or_write(ctx: click.Context, kind: str, kwargs: dict[str, Any], inputs: dict[str, Any], options,
                    replan: Callable[[Path], Any], specific: dict[str, Any] | None = None) -> bool:
    """`--check PLAN` (docs/plan-check.md): compare PLAN with these inputs and options (kind "index": every plan
    an `mlopt plan --model` index lists) and, with --resolve, with what `replan(output)` (the planning this very
    command does) writes into a temporary folder; print the verdict and exit 0 (current) or 1 (stale), writing
    nothing. False without --check."""
    if kwargs.get("check_path") is None:
        return False
    if ctx.params.get("sweep_text"):
        raise click.UsageError("--check takes one plan: check the plans of a --sweep one by one")
    path, strict = kwargs["check_path"], kwargs["strict_version"]
    checks = (plan_check.check_index(path, inputs, options.to_dict(), strict) if kind == "index"
              else [plan_check.check_plan(path, kind, inputs, options.to_dict(), specific, strict)])
    if kwargs["resolve"]:
        timed = st.recorded_wall_time([Path(c.plan) for c in checks])
        if timed is not None:
            raise InputError(str(timed), "$.provenance.wall_time_s", "recorded (--record-wall-time): a re-run "
                             "cannot repeat its bytes; --check it without --resolve")
        with tempfile.TemporaryDirectory(prefix="mlopt-check-") as tmp:
            out = plan_check.rerun_output(kind, path, Path(tmp))
            replan(out)
            st.apply_resolve(checks, st.compare_outputs(out if kind == "index" else Path(tmp),
                                                        Path(checks[0].plan).parent, strict))
    if kwargs["as_json"]:
        _print_json([c.to_dict() for c in checks] if kind == "index" else checks[0].to_dict())
    for check in checks:
        if not kwargs["as_json"] and (not check.current or (ctx.obj or {}).get("verbose", 1) >= 1):
            click.echo("\n".join(check.lines()))
        for warning in check.warnings:
            click.echo(f"mlopt: warning: {check.plan}: {warning}", err=True)
    stale = [c.plan for c in checks if not c.current]
    if len(stale) == len(checks) == 1:
        raise st.StalePlanError(f"{stale[0]} is stale (regenerate it without --check)")
    if stale:
        raise st.StalePlanError(f"{len(stale)} of the {len(checks)} files checked are stale (regenerate them "
                                f"without --check)")
    return True


@cli.group(invoke_without_command=True)
@click.option("--model", "model_path", default=None, help="Trace to plan for (mlopt trace or PyTorch ET).")
@click.option("--topology", "topology_spec", default=None, help="Topology preset or file.")
@topology_options
@functools.partial(planner_options, output_required=False)  # required below, not for subcommands
@click.pass_context
def plan(ctx: click.Context, model_path, topology_spec, nodes, chunk_size, time_unit_us, **kwargs) -> None:
    """Run planners. With --model (and no subcommand): every planner that applies, one plan file each.

    Writes DIR/<kind>.plan.json per planner and DIR/index.json listing what ran and what was skipped.
    """
    if ctx.invoked_subcommand is not None:
        return
    if model_path is None or (kwargs["output"] is None and kwargs["check_path"] is None):
        raise click.UsageError("give --model TRACE and -o DIR (or --check DIR, or a planner subcommand)")

    trace_obj = load_trace_any(model_path)
    topology = resolve_topology(topology_spec, _topology_options(nodes, chunk_size, time_unit_us)) if topology_spec else None
    inputs = {"model": model_path, "topology": topology_spec}
    planner_options = planner_options_from_args(_args_of(kwargs))
    def replan(out_dir: Path) -> None:
        with staged_folder(out_dir) as scratch:
            plan_all(trace_obj, topology, replace(planner_options, dump_model=None, record_wall_time=False),
                     scratch, inputs=inputs)

    if _check_or_write(ctx, "index", kwargs, inputs, planner_options, replan):
        return

    with staged_folder(kwargs["output"]) as scratch:  # every plan and the index, or nothing
        index = plan_all(trace_obj, topology, planner_options, scratch, inputs=inputs)
    if kwargs["as_json"]:
        _print_json(index)
        return
    for entry in index["plans"]:
        _say(ctx, f"{entry['kind']}: {entry['status']} -> {entry['file']}")
    for entry in index["skipped"]:
        _say(ctx, f"{entry['kind']}: skipped ({entry['reason']})")
    _say(ctx, f"wrote {Path(kwargs['output']) / 'index.json'}")


# The options every `mlopt plan KIND` has that are the command line's own, not the planner's (its output, the
# --check family, --json); the rest are the kind's (mlopt.planners.<kind>.kind.COMMAND_OPTIONS and the shared).
_CLI_ONLY = ("check_path", "resolve", "strict_version", "output", "as_json")


def _plan_kind(ctx: click.Context, kind_name: str, params: dict[str, Any]) -> None:
    """`mlopt plan KIND`: click's parameters -> the kind's options by flag name -> its PlanRequest; then --check
    or the plan written at -o, and the kind's summary of what was written."""
    own = {name: params.pop(name) for name in _CLI_ONLY}
    args = _args_of(params)
    request = planner_kind(kind_name).request(args)
    for notice in request.notices:
        _say(ctx, notice)
    def replan(output: Path) -> None:
        # output-only knobs off, so that the re-run writes only the plan's files and their bytes can repeat
        quiet = {name: value for name, value in (("dump-model", None), ("record-wall-time", False)) if name in args}
        planner_kind(kind_name).request({**args, **quiet}).write(output, lambda _text: None)

    if _check_or_write(ctx, kind_name, own, request.inputs, request.planner_options, replan, request.specific):
        return
    with _progress(ctx, request.title) as progress:
        planned = request.write(Path(own["output"]), progress)
    as_json, line = planner_kind(kind_name).summary(planned, own["output"], args)
    if own["as_json"]:
        _print_json(as_json)
    else:
        _say(ctx, line)


def _add_plan_command(kind_name: str) -> None:
    """`mlopt plan KIND` for a registered kind: its declared options as flags, its help, its summary line."""

    @plan.command(kind_name, help=planner_kind(kind_name).command_help)
    @kind_options(kind_name)
    @click.pass_context
    def command(ctx: click.Context, **params) -> None:
        _plan_kind(ctx, kind_name, params)


for _kind in planner_kinds():  # memory's command (below) adds --sweep to what the kind declares
    if _kind.prepare_plan is not None and _kind.name != "memory":
        _add_plan_command(_kind.name)


@plan.command("memory")
@kind_options("memory")
@click.option("--sweep", "sweep_text", default=None,
              help="Budget ratios, e.g. 0.3,0.4,...,1.0: one plan each, a table and a PNG in the -o folder.")
@click.pass_context
def plan_memory_cmd(ctx: click.Context, sweep_text: str | None, **params) -> None:
    """Checkpointing and operator implementations under a memory budget (MONeT); -o memory.plan.json.

    The kind's command (planner_kind("memory")), plus --sweep: a folder of plans over budget ratios."""
    given = sum(x is not None for x in (params["budget"], params["budget_ratio"], sweep_text))
    if given != 1:
        raise click.UsageError("give exactly one of --budget, --budget-ratio and --sweep")
    if sweep_text is None:
        _plan_kind(ctx, "memory", params)
        return
    if params["check_path"] is not None:
        raise click.UsageError("--check takes one plan: check the plans of a --sweep one by one")
    setup = memory_kind.memory_setup(command_args(planner_kind("memory").all_command_options,
                                                  _args_of({k: v for k, v in params.items() if k not in _CLI_ONLY}),
                                                  "mlopt plan memory"))
    with _progress(ctx, f"planning memory for {setup.model_path}") as progress:
        _memory_sweep(ctx, memory_kind.load_problem(setup), sweep_text, setup.memory_options, setup.planner_options,
                      Path(params["output"]), setup.inputs, params["as_json"], progress)


def _memory_sweep(ctx, problem, sweep_text, memory_options, options, out_dir, inputs, as_json, progress) -> None:


    ratios = memory_sweep.parse_ratios(sweep_text)
    with staged_folder(out_dir) as scratch:  # the plans, sweep.json and sweep.png, or nothing
        rows = memory_sweep.run_sweep(problem, ratios, memory_options, options, scratch, inputs, progress)
    if as_json:
        _print_json(rows)
        return


    table = Table("budget ratio", "status", "peak", "x store-all", "compute overhead", "gap", "solve s", "plan",
                  title=f"{problem.name}: {memory_options.algorithm}")
    for r in rows:
        if r["file"] is None:
            table.add_row(f"{r['budget_ratio']:.2f}", "infeasible", "", "", "", "", "", "")
            continue
        gap = "" if r["gap"] is None else f"{r['gap'] * 100:.2f}%"
        table.add_row(f"{r['budget_ratio']:.2f}", r["status"], format_size(r["peak_bytes"]), f"{r['memory_ratio']:.2f}",
                      f"{r['compute_overhead'] * 100:+.1f}%", gap, f"{r['wall_time_s']:.1f}", r["file"])
    stdout_console().print(table)
    _say(ctx, f"wrote {out_dir / 'sweep.json'} and {out_dir / 'sweep.png'}")


@dataclass(frozen=True)
class SimulateOptions:
    """Every option of `mlopt simulate` (docs/simulate.md), one field per flag of the same name (--json: as_json)."""
    files: tuple[str, ...] = ()  # FILES: plans to apply (iteration), MSCCL-EF XML to time, or memory plans to replay
    topology: str | None = None  # --topology: preset or file (iteration, collective algorithms)
    nodes: int | None = None  # --nodes: replicate a one-node TACCL profile over this many nodes
    chunk_size: str | None = None  # --chunk-size: TACCL profile chunk size when the profile name lacks it
    time_unit_us: float = 1.0  # --time-unit-us: microseconds per unit of a TACCL profile's scaled costs
    model: str | None = None  # --model: trace (iteration with --topology; alone: replay memory plans)
    workload: str | None = None  # --workload: synthetic workload spec instead of a trace (dp:ranks=...,...)
    algorithm: str = "ring"  # --algorithm: iteration: algorithm of every collective no collective plan covers
    mode: str = "unaware"  # --mode: iteration: unaware | aware | fifo network model
    policy: str = "fifo"  # --policy: iteration: which ready collective a free channel takes (fifo | lifo)
    channels: int = 1  # --channels: iteration: collectives in flight at once
    splits: int = 1  # --splits: iteration: chunks each collective is cut into
    iterations: int = 1  # --iterations: iteration: training iterations chained
    dims: str | None = None  # --dims: iteration: dimensions of the hierarchical algorithm, e.g. 2x4x4
    gantt: str | None = None  # --gantt: iteration: timeline PNG
    exposed_plot: str | None = None  # --exposed-plot: iteration: exposed vs overlapped communication PNG
    gantt_systems: str | None = None  # --gantt-systems: schedule plan: Gantt PNG of every compared system
    size: str | None = None  # --size: collective algorithms: one buffer size (nccl-tests' convention)
    sizes: str | None = None  # --sizes: collective algorithms: LO..HI (x4 steps) or a comma list
    plot: str | None = None  # --plot: PNG of time vs size (collectives) or memory over the step (memory plans)
    as_json: bool = False  # --json: print the rows as JSON
    strict: bool = False  # --strict: refuse plans whose recorded input hashes differ from the inputs given

    def topology_options(self) -> TopologyOptions:
        return _topology_options(self.nodes, self.chunk_size, self.time_unit_us)


@cli.command()
@click.argument("files", nargs=-1, required=False)
@click.option("--topology", default=None, help="Topology preset or file (collective algorithms).")
@topology_options
@click.option("--model", default=None,
              help="Trace: with --topology, simulate the training iteration (PLANS optional); alone, replay memory plans.")
@click.option("--workload", default=None,
              help="Synthetic workload instead of a trace, e.g. dp:ranks=1024,layers=50,bytes=4MiB (also mp, hybrid, fsdp).")
@click.option("--algorithm", type=click.Choice(ITERATION_ALGORITHMS), default="ring", show_default=True,
              help="Iteration: algorithm of every collective no collective plan covers.")
@click.option("--mode", type=click.Choice(["unaware", "aware", "fifo"]), default="unaware", show_default=True,
              help="Iteration: congestion-unaware (messages alone on their links), aware (links, ports and NICs "
                   "shared fairly) or fifo (aware, one message at a time per link).")
@click.option("--policy", type=click.Choice(["fifo", "lifo"]), default="fifo", show_default=True,
              help="Iteration: which ready collective a free channel takes.")
@click.option("--channels", type=click.IntRange(min=1), default=1, show_default=True,
              help="Iteration: collectives in flight at once.")
@click.option("--splits", type=click.IntRange(min=1), default=1, show_default=True,
              help="Iteration: chunks each collective is cut into.")
@click.option("--iterations", type=click.IntRange(min=1), default=1, show_default=True,
              help="Iteration: training iterations chained.")
@click.option("--dims", default=None, help="Iteration: dimensions of the hierarchical algorithm, e.g. 2x4x4.")
@click.option("--gantt", type=click.Path(), default=None, help="Iteration: timeline PNG.")
@click.option("--exposed-plot", type=click.Path(), default=None,
              help="Iteration: exposed vs overlapped communication PNG.")
@click.option("--gantt-systems", type=click.Path(), default=None,
              help="Schedule plan (with --model, --topology): Gantt PNG of every compared system, one panel each "
                   "(optSched's replay), plus <stem>.<system>.png per system.")
@click.option("--size", default=None, help="One buffer size (nccl-tests' convention).")
@click.option("--sizes", default=None, help="Sizes: LO..HI (x4 steps) or a comma list, e.g. 1KiB..1GiB.")
@click.option("--plot", type=click.Path(), default=None,
              help="Write a PNG: time vs size (collectives) or memory over the step (memory plans).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@STRICT_OPTION
def simulate(**params) -> None:
    """Simulate a training iteration (--model or --workload, with --topology; plans optional), time MSCCL-EF
    algorithms under the alpha-beta model, or replay memory plans (memory over the step)."""
    run_simulate(SimulateOptions(**params))


def run_simulate(o: SimulateOptions) -> None:
    """`mlopt simulate` with its options: the iteration, memory plans replayed, or collective algorithms timed."""
    if o.gantt_systems and (o.model is None or o.topology is None):
        raise click.UsageError("--gantt-systems draws a schedule plan's systems: give the plan with --model TRACE "
                               "and --topology")
    _check_recorded_inputs(o.files, {"model": o.model, "topology": o.topology}, o.strict)
    if o.workload is not None or (o.model is not None and o.topology is not None):
        options = EvaluateOptions(algorithm=o.algorithm, mode=o.mode, policy=o.policy, channels=o.channels,
                                  splits=o.splits, iterations=o.iterations, dims=_parse_dims(o.dims))
        _simulate_iteration(o.files, o.topology, o.topology_options(), o.model, o.workload, options, o.gantt,
                            o.exposed_plot, o.as_json, o.gantt_systems)
        return
    if not o.files:
        raise click.UsageError("give FILES (MSCCL-EF XML or memory plans), or --model/--workload with --topology")
    if _all_memory_plans(o.files):
        _simulate_memory(o.files, o.model, o.plot, o.as_json)
        return
    _simulate_collectives(o)


def _simulate_collectives(o: SimulateOptions) -> None:
    """MSCCL-EF algorithms timed under the alpha-beta model over --size or --sizes: a table, JSON, a plot."""
    if o.topology is None:
        raise click.UsageError("give --topology for collective algorithms")
    if (o.size is None) == (o.sizes is None):
        raise click.UsageError("give exactly one of --size and --sizes")
    sizes = [parse_size(o.size)] if o.size is not None else parse_size_range(o.sizes)
    topology = resolve_topology(o.topology, o.topology_options())
    _validate_plans(o.files, None, o.topology)
    rows = simulation_rows(list(o.files), topology, sizes)
    if o.plot:
        _write_plots({o.plot: lambda p: plot_size_sweep(rows, p, title=f"{rows[0]['collective']} on "
                                                                        f"{topology.name}")})
    if o.as_json:
        _print_json(rows)
        return
    table = Table("algorithm", "size", "time_us", "algbw GB/s", "busbw GB/s", "bound_us", "x bound",
                  title=f"simulated on {topology.name}")
    for r in rows:
        table.add_row(r["algorithm"], format_size(r["buffer_bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_GBps']:.2f}",
                      f"{r['busbw_GBps']:.2f}", f"{r['bound_us']:.1f}", f"{r['time_us'] / r['bound_us']:.2f}")
    stdout_console().print(table)


def _parse_dims(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        dims = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected sizes like 2x4x4", param_hint="--dims") from None
    if not dims or min(dims) < 1:
        raise click.BadParameter(f"{text!r}: every dimension must be at least 1", param_hint="--dims")
    return dims


def _iteration_workload(model_path: str | None, workload_spec: str | None, iterations: int):
    """(workload, trace or None, source name) for the iteration simulator."""
    if workload_spec is not None:
        if model_path is not None:
            raise click.UsageError("give one of --model and --workload")
        try:
            spec = wl.parse_workload_spec(workload_spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--workload") from None
        if iterations > 1 and spec.iterations > 1:
            raise click.UsageError("give the iterations once: in --workload (iterations=N) or as --iterations")
        return wl.chain(spec, iterations) if iterations > 1 else spec, None, "--workload"

    trace = load_trace_any(model_path)
    base = wl.from_trace(trace, source=model_path)
    return (wl.chain(base, iterations) if iterations > 1 else base), trace, model_path


def _simulated_kinds() -> dict[str, SimulationFacts]:
    """The plan kinds `mlopt simulate` applies, with how (their entries in mlopt.planners.registry)."""
    return {k.name: k.simulation for k in planner_kinds() if k.simulation is not None}


def _refuse_unapplied(plans: Sequence[tuple[str, str]], applied: dict[str, SimulationFacts]) -> None:
    """A plan named on the command line of a kind the simulator does not apply is bad input."""
    for kind, path in plans:
        if kind not in applied:
            raise InputError(path, "kind", f"the iteration simulator applies {', '.join(applied)} plans; {kind!r} "
                                           f"plans are not supported yet")


def _plans_by_kind(plans: Sequence[tuple[str, str]], applied: dict[str, SimulationFacts],
                   has_trace: bool) -> dict[str, list[str]]:
    """Plan paths by kind; a usage error for a kind that needs a trace without --model, or two plans of a kind
    that takes one."""
    by_kind: dict[str, list[str]] = {}
    for kind, path in plans:
        if applied[kind].needs_trace and not has_trace:
            raise click.UsageError(f"{kind} plans apply to a trace: give --model TRACE")
        by_kind.setdefault(kind, []).append(path)
    for kind, paths in by_kind.items():
        if applied[kind].at_most_one and len(paths) > 1:
            raise click.UsageError(f"give at most one {kind} plan")
    return by_kind


def _apply_plans(iteration: SimulatedIteration, by_kind: dict[str, list[str]],
                 applied: dict[str, SimulationFacts]) -> SimulatedIteration:
    """Each kind's plans applied to the workload, kinds in stage order; a plan superseded by a plan of another
    kind given too is left out with a warning."""
    for kind in sorted(by_kind, key=lambda k: applied[k].stage):
        facts = applied[kind]
        superseding, why = facts.superseded_by
        if any(by_kind.get(other) for other in superseding):
            for path in by_kind[kind]:
                click.echo(f"mlopt: warning: {path}: not applied ({why})", err=True)
            continue
        for path in by_kind[kind] if facts.apply is not None else ():
            iteration = facts.apply(iteration, path)
    return iteration


def _simulate_iteration(files, topology_spec, topology_opts, model_path, workload_spec, options, gantt_path,
                        exposed_path, as_json, gantt_systems_path=None) -> None:

    if topology_spec is None:
        raise click.UsageError("the iteration simulator needs --topology")
    topology = resolve_topology(topology_spec, topology_opts)
    workload, trace, source = _iteration_workload(model_path, workload_spec, options.iterations)
    applied = _simulated_kinds()
    plans = ev.classify_plans(files or (), applied_kinds=tuple(applied))
    _refuse_unapplied(plans.plans, applied)
    if trace is not None or not any(applied[kind].needs_trace for kind, _ in plans.plans):
        _validate_plans(files or (), model_path, topology_spec)  # else a usage error below
    for entry in plans.left_out:
        click.echo(f"mlopt: warning: {entry}: not applied (the iteration simulator does not model it yet)", err=True)
    by_kind = _plans_by_kind(plans.plans, applied, trace is not None)
    schedules = by_kind.get("schedule", [])
    if gantt_systems_path and not schedules:
        raise click.UsageError("--gantt-systems draws the systems of a schedule plan: give one (mlopt plan schedule)")
    iteration = _apply_plans(SimulatedIteration(workload, trace, model_path), by_kind, applied)
    workload, order = iteration.workload, iteration.order
    report = ev.evaluate(workload, topology, options, ev.xml_plans(plans.xmls), source=source, order=order)
    title = f"{workload.name} on {topology.name}"
    _write_plots({gantt_path: lambda p: _plot("plot_gantt", report, p, title),
                  exposed_path: lambda p: _plot("plot_exposed", report, p, title)})
    if gantt_systems_path:
        write_system_gantts(schedules[0], load_plan(schedules[0]).payload, trace, topology, source,
                            gantt_systems_path, title=f"{title}: systems of {Path(schedules[0]).name}")
    if as_json:
        _print_json(ev.summary(report, topology, options, workload))
        return
    _print_iteration(report, title)


FIGURE_SUFFIXES = ("", ".png", ".svg", ".pdf")  # what mlopt.sim.plots._save makes reproducible


def _plot(function: str, report, path: Path, title: str) -> None:
    getattr(training_plots, function)(report, path, title=title)


def _write_plots(plots: dict[str | None, Callable[[Path], Any]]) -> None:
    """Draw each requested figure (path -> drawing function; None paths are not requested) into a temporary
    file and install them together: a figure that fails leaves none of the others behind."""
    wanted = {path: draw for path, draw in plots.items() if path}
    if not wanted:
        return
    for path in wanted:
        suffix = Path(path).suffix.lower()
        if suffix not in FIGURE_SUFFIXES:
            raise InputError(str(path), "$", f"cannot draw a {suffix} figure; name it .png, .svg or .pdf")
    with staged_files(list(wanted)) as temps:
        for temp, draw in zip(temps, wanted.values()):
            draw(temp)


def _print_iteration(report, title: str) -> None:


    console = stdout_console()
    totals = Table("iteration us", "compute us", "communication us", "overlapped us", "exposed us", title=title)
    totals.add_row(f"{report.iteration_time_us:.1f}", f"{report.compute_us:.1f}", f"{report.comm_us:.1f}",
                   f"{report.overlapped_us:.1f}", f"{report.exposed_us:.1f}")
    console.print(totals)
    rows = report.collective_rows()
    if rows:
        table = Table("iteration", "collective", "op", "bytes", "ranks", "algorithm", "start us", "end us",
                      "exposed us", "exposed", title="collectives")
        for r in rows:
            table.add_row(str(r["iteration"]), r["collective"], r["name"], format_size(r["bytes"]), str(r["group_size"]),
                          r["algorithm"],
                          f"{r['start_us']:.1f}", f"{r['end_us']:.1f}", f"{r['exposed_us']:.1f}",
                          f"{r['exposed_share'] * 100:.0f}%")
        console.print(table)


def _all_memory_plans(files: tuple[str, ...]) -> bool:
    """True when every file is a memory plan (JSON with kind "memory"); other files go to the collective path."""
    kinds = set()
    for f in files:
        if not f.endswith(".json"):
            return False
        loaded = load_any(f)
        kinds.add(loaded.value.kind if loaded.kind == "plan" else loaded.kind)
    if "memory" in kinds and kinds != {"memory"}:
        raise click.UsageError("simulate memory plans on their own, not mixed with other files")
    return kinds == {"memory"}


def _simulate_memory(files: tuple[str, ...], model_path: str | None, plot_path: str | None, as_json: bool) -> None:
    if model_path is None:
        raise click.UsageError("memory plans are replayed against their trace: give --model TRACE")
    _validate_plans(files, model_path, None)
    rows, timelines, budgets = [], {}, []
    for f in files:
        plan_file = load_plan(f)
        problem, _, replayed = replay_plan(plan_file, f, model_path)
        label = f"{Path(f).name} ({plan_file.payload.get('algorithm')})"
        timelines[label] = replayed.timeline
        budgets.append(plan_file.payload["budget_bytes"])
        rows.append({"file": f, "algorithm": plan_file.payload.get("algorithm"), "budget_bytes": plan_file.payload["budget_bytes"],
                     "peak_bytes": replayed.peak_bytes, "forward_end_bytes": replayed.forward_end_bytes,
                     "compute_us": replayed.compute_us, "recompute_us": replayed.recompute_us,
                     "peak_at": f"{replayed.peak_event.phase} node {replayed.peak_event.node}"})
    if plot_path:
        _write_plots({plot_path: lambda p: plot_memory_timeline(
            timelines, p, budgets[0] if len(set(budgets)) == 1 else None,
            title=f"{problem.name}: memory over one training step")})
    if as_json:
        _print_json(rows)
        return

    table = Table("plan", "algorithm", "budget", "peak", "peak at", "held after forward", "compute ms", "recompute ms",
                  title=f"memory replay of {problem.name}")
    for r in rows:
        table.add_row(r["file"], str(r["algorithm"]), format_size(r["budget_bytes"]), format_size(r["peak_bytes"]),
                      r["peak_at"], format_size(r["forward_end_bytes"]), f"{r['compute_us'] / 1000:.1f}",
                      f"{r['recompute_us'] / 1000:.1f}")
    stdout_console().print(table)


# ---------------------------------------------------------------------------------------------------------
# run-collective


# ---------------------------------------------------------------------------------------------------------
# profile


@cli.group()
def profile() -> None:
    """Measure this machine: link profiles and topology, operator times, compute/communication contention."""


# --- profile hardware (mlopt/profilers/hardware.py)
@profile.command("hardware")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Topology to write (mlopt.topology JSON; the fit report is in its `source`).")
@click.option("--transport", type=click.Choice(["auto", "threads", "processes", "tcp", "runtime", "cuda"]), default="auto",
              show_default=True,
              help="auto: CUDA peer copies with 2+ GPUs, else threads; threads: the runtime's CPU ranks (what "
                   "run-collective uses); processes: shared memory between processes; tcp: loopback TCP; "
                   "runtime: processes over the runtime's multi-process communicator (the mlopt torch backend).")
@click.option("--ranks", "ranks_text", default=None,
              help="Ranks to profile (CPU: default 4, --quick 2; GPU: the first N GPUs, default all).")
@click.option("--sizes", "sizes_text", default=None,
              help="Chunk sizes s, e.g. 16KiB,64KiB,256KiB (CPU default; --quick 64KiB,256KiB; GPU default "
                   "64KiB,1MiB,16MiB).")
@click.option("--chunks", "chunks_text", default=None,
              help="Chunk counts n, e.g. 1,2,4,8 (default; --quick 1,4).")
@click.option("--repeats", "repeats_text", default=None,
              help="Runs per experiment; the fit uses medians (CPU default 5, GPU 10, --quick 3).")
@click.option("--quick", is_flag=True, help="Few ranks, sizes and repeats: seconds on a laptop (CI).")
@click.option("--beta-tol", "beta_tol_text", default=None,
              help="Relative beta difference that still joins two links into one class [default: 0.25].")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Measured vs fitted times per class (.png/.svg/.pdf) [default: OUTPUT with .fit.png].")
@click.option("--no-plot", is_flag=True, help="Do not draw the plot.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (classes, fit quality) as JSON.")
@click.pass_context
def profile_hardware_cmd(ctx: click.Context, output, transport, ranks_text, sizes_text, chunks_text, repeats_text,
                         quick, beta_tol_text, plot_path, no_plot, as_json) -> None:
    """Link alpha/beta per rank pair (TACCL's profiler) into an mlopt topology; docs/profile-hardware.md.

    Per ordered pair: n chunks of s bytes one after another vs one chunk of n*s, repeated; alpha and beta by
    least squares, links grouped into classes, fit quality (R^2, residuals) kept in the topology.
    """

    def whole(text, option: str, minimum: int):
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            raise InputError(option, "$", f"{text!r} is not a whole number") from None
        if value < minimum:
            raise InputError(option, "$", f"{value} is below the minimum {minimum}")
        return value

    ranks = whole(ranks_text, "--ranks", 2)
    repeats = whole(repeats_text, "--repeats", 1)
    sizes = hw.parse_sizes(sizes_text) if sizes_text else None
    chunks = hw.parse_int_list(chunks_text, "--chunks") if chunks_text else None
    beta_tol = None
    if beta_tol_text is not None:
        try:
            beta_tol = float(beta_tol_text)
        except ValueError:
            beta_tol = float("nan")
        if not 0 < beta_tol < float("inf"):
            raise InputError("--beta-tol", "$", f"{beta_tol_text!r} is not a positive number")
    options = hw.ProfileOptions(transport=transport, ranks=ranks, sizes=sizes, chunks=chunks, repeats=repeats,
                                quick=quick, **({"beta_tol": beta_tol} if beta_tol is not None else {}))
    with _progress_bar(ctx, "profiling links") as progress:
        result = hw.profile_hardware(options, progress)

    save_topology(result.topology, output)
    plot = None if no_plot else (plot_path or str(hw.default_plot_path(output)))
    if plot:
        hw.plot_fit(result, plot)
    summary = {**result.summary(), "file": output, "plot": plot, "elapsed_s": result.elapsed_s}
    if as_json:
        _print_json(summary)
        return
    for row in summary["classes"]:
        r2 = "n/a" if row["r2"] is None else f"{row['r2']:.3f}"
        gbps = "n/a" if row["bandwidth_GBps"] is None else f"{row['bandwidth_GBps']:.2f}"
        _say(ctx, f"class {row['class']}: {row['links']} links, alpha {row['alpha_us']:.2f} us, beta "
                  f"{row['beta_us_per_MB']:.1f} us/MB ({gbps} GB/s), R^2 {r2}{'' if row['ok'] else ' (flagged)'}")
    for group in summary["pcie_switches"]:
        _say(ctx, f"PCIe switch shared by ranks {', '.join(map(str, group))}")
    for w in summary["warnings"]:
        _say(ctx, f"mlopt: warning: {w}")
    _say(ctx, f"{result.transport}: {summary['ranks']} ranks, {summary['links']} links in {len(summary['classes'])} "
              f"classes ({result.elapsed_s:.1f} s); wrote {output}" + (f" and {plot}" if plot else ""))


# --- profile operators (mlopt/profilers/operators.py)
@profile.command("operators")
@click.option("--model", "model_path", required=True,
              help="Trace whose ops to measure (mlopt trace, or a PyTorch ET with shapes).")
@click.option("-o", "--output", required=True, type=click.Path(), help="Profiled trace to write (mlopt.trace JSON).")
@click.option("--ops-out", "ops_out", default=None, type=click.Path(),
              help="Also write an mlopt-op-profile JSON (per op type factors) for `plan memory --ops` on other traces.")
@click.option("--repeats", type=click.IntRange(min=3), default=None,
              help="Timed runs per op and implementation; median and IQR [default: 10, 5 with --quick].")
@click.option("--warmup", type=click.IntRange(min=1), default=None,
              help="Untimed runs first [default: 2, 1 with --quick].")
@click.option("--quick", is_flag=True, help="Few runs (CI): 5 timed after 1 warm-up.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where to run the ops (auto: CUDA when present).")
@click.option("--no-alternatives", "no_alternatives", is_flag=True,
              help="Only the default implementations (no oneDNN/cuDNN variants merged into the trace).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads while measuring [default: torch's]; 1 is steadier on a shared machine.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random operands.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
@click.pass_context
def profile_operators_cmd(ctx: click.Context, model_path, output, ops_out, repeats, warmup, quick, device,
                          no_alternatives, threads, seed, as_json) -> None:
    """Per op and implementation: compute time and workspace, merged into the trace for `plan memory`.

    Rebuilds every forward and backward op of a known type from its tensors' shapes, times it with torch
    (warm-up, then repeated runs: median and IQR) and measures its workspace; convolutions also with the
    backend's alternatives (CPU: oneDNN off, channels-last; CUDA: cuDNN autotuned, deterministic, off).
    """
    trace_obj = load_trace_any(model_path)
    options = ProfileOptions(device=device, repeats=repeats, warmup=warmup, quick=quick,
                             alternatives=not no_alternatives, seed=seed, threads=threads)
    with _progress_bar(ctx, "profiling operators") as progress:
        result = profile_operators(trace_obj, options, source=model_path, progress=progress)
    save_trace(result.trace, output)
    if ops_out:
        write_json(ops_out, result.ops_profile)
    summary = {"file": output, "ops_file": ops_out, **result.summary()}
    if as_json:
        _print_json(summary)
        return
    _print_operator_table(result, model_path)
    kept = sum(n for names in result.kept.values() for n in names.values())
    _say(ctx, f"{summary['profiled_ops']} ops measured ({summary['signatures']} distinct) on {result.device_name}, "
              f"{result.repeats} runs each; {kept} kept their traced time; wrote {output}"
              + (f" and {ops_out}" if ops_out else ""))


def _print_operator_table(result, model_path: str) -> None:


    table = Table("op", "phase", "ops", "shapes", "median us", "IQR/median", "total us", "traced us", "workspace",
                  "alternatives (time x default)", title=f"{model_path}: {result.device_name}")
    for row in result.rows():
        alternatives = ", ".join(f"{name} {factor:.2f}x" for name, factor in row["alternatives"].items())
        table.add_row(row["op"], row["phase"], str(row["ops"]), str(row["signatures"]), f"{row['median_us']:.1f}",
                      f"{row['spread'] * 100:.0f}%", f"{row['total_us']:.0f}", f"{row['traced_total_us']:.0f}",
                      format_size(row["max_workspace_bytes"]) if row["max_workspace_bytes"] else "-", alternatives)
    console = stdout_console()
    console.print(table)
    for name, check in result.catalog_checks.items():
        console.print(f"catalog check {name}: measured {check['measured']} (catalog {check['catalog']}; "
                      f"{check['meaning']}; {check['ops']} ops)")


# --- profile contention (mlopt/profilers/contention.py)
@profile.command("contention")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Samples to write (mlopt.contention-samples, with the fit in meta); `mlopt plan threads "
                   "--contention` reads them.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cpu: the runtime's CPU interpreter beside numpy matmul processes; cuda: NCCL beside a matmul "
                   "stream (two GPUs or more).")
@click.option("--ranks", type=int, default=None, help="All-reduce ranks (cpu: in-process, default 4; cuda: GPUs, "
                                                       "default all).")
@click.option("--threads", "threads_text", default=None,
              help="Communication threads r, e.g. 1,2,4,8 (cpu: interpreter workers, default 1,2,4,8, --quick "
                   "1,2,4; cuda: NCCL_NTHREADS x channels, default 128,...,4096).")
@click.option("--sizes", "sizes_text", default=None,
              help="All-reduce bytes per rank, e.g. 1MB,8MB (cpu: 1MiB,8MiB, --quick 1MiB,4MiB; cuda: 8MiB,64MiB).")
@click.option("--repeats", type=int, default=None, help="Rounds per (r, size); samples are medians (default 5, "
                                                         "--quick 3).")
@click.option("--comm-runs", type=int, default=None, help="Timed all-reduces per phase and round (default 5).")
@click.option("--compute-ms", type=FiniteFloatRange(), default=None,
              help="Length of the computation alone, ms (cpu default 100, --quick 30).")
@click.option("--compute-workers", type=int, default=None,
              help="cpu: processes running the matmuls, one core each (default: every core of this process).")
@click.option("--quick", is_flag=True, help="Three thread counts, two sizes, three repeats: seconds (CI).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Measured vs model per r (compute slowdown, all-reduce rates): .png, .svg or .pdf.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (parameters, fit quality, medians) as JSON.")
@click.pass_context
def profile_contention_cmd(ctx: click.Context, output, device, ranks, threads_text, sizes_text, repeats, comm_runs,
                           compute_ms, compute_workers, quick, plot_path, as_json) -> None:
    """LIBRA's contention samples (computation beside an all-reduce, all-reduces beside computation and alone,
    per thread count r) and their fit; -o samples.json. docs/profile-contention.md."""
    config = prof.make_config(
        device, quick, ranks=ranks, repeats=repeats, comm_runs=comm_runs, compute_ms=compute_ms,
        compute_workers=compute_workers,
        threads=prof.parse_threads(threads_text) if threads_text is not None else None,
        sizes=prof.parse_sizes(sizes_text) if sizes_text is not None else None)
    prof.check_plot_path(plot_path)
    if device == "cuda":
        problem = prof.cuda_problem(config.ranks)
        if problem:
            raise InputError("--device", "$", f"cuda: {problem}")
    bar = (ctx.obj or {}).get("verbose", 1) >= 1 and sys.stderr.isatty()
    with prof.progress_bar(bar, f"profiling contention ({device})") as (advance, set_total):
        result = prof.profile(config, output, advance, set_total)
    prof.write(result, output, plot_path)
    if as_json:
        _print_json({**result.summary(), "file": output, "plot": plot_path})
    else:
        for line in prof.summary_lines(result):
            _say(ctx, line)
        _say(ctx, f"wrote {output}" + (f" and {plot_path}" if plot_path else ""))
    if result.fit is None:
        raise prof.ProfileError(f"{output}: samples written, but the fit failed: {result.fit_error}")


@cli.command("run-collective")
@click.argument("xml_path", metavar="ALGO.XML")
@click.option("--ranks", type=click.IntRange(min=1), default=None,
              help="Ranks (threads) to run; must equal the program's ngpus (the default).")
@click.option("--size", "size_text", required=True,
              help="The larger buffer per rank, nccl-tests' convention: output for allgather and alltoall, the "
                   "buffer for allreduce, input for reducescatter. E.g. 64MiB.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16", "int32"]), default="float32",
              show_default=True)
@click.option("--op", type=click.Choice(["sum", "prod", "max", "min"]), default="sum", show_default=True,
              help="Reduction (reducescatter, allreduce, reduce).")
@click.option("--in-place", is_flag=True, help="One buffer per rank (the program must declare inplace=\"1\").")
@click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed runs after one warm-up run; times are averaged.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random input data.")
@click.option("--chunk-bytes", "chunk_text", default=None,
              help="Most bytes of a chunk one loop iteration moves (the executor's slice), e.g. 1MiB; "
                   "default: the whole chunk.")
@click.option("--fifo-slots", type=click.IntRange(min=0), default=0, show_default=True,
              help="Messages in flight per connection (0: unbounded).")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="Worker threads of the CPU backend (0: one per hardware thread).")
@click.option("--watchdog-ms", type=click.IntRange(min=1), default=10000, show_default=True,
              help="No progress for this long is reported as a deadlock.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def run_collective_cmd(xml_path: str, ranks, size_text, dtype, op, in_place, iterations, seed, chunk_text, fifo_slots,
                       threads, watchdog_ms, as_json: bool) -> None:
    """Run an MSCCL-EF algorithm on the CPU runtime, check every rank's output against the collective computed
    directly, and report GB/s. Exit 1 when an output is wrong, 2 for bad input."""
    options = RunCollectiveOptions(
        size_bytes=parse_size(size_text), ranks=ranks, dtype=dtype, op=op, in_place=in_place, iterations=iterations,
        seed=seed, chunk_bytes=parse_size(chunk_text, "--chunk-bytes") if chunk_text else 0, fifo_slots=fifo_slots,
        threads=threads, watchdog_ms=watchdog_ms)
    report = run_collective(xml_path, options)
    if as_json:
        _print_json(report.to_dict())
    else:
        click.echo(report.summary())
    raise_for_mismatch(report)


# ---------------------------------------------------------------------------------------------------------
# sweep

# --- sweep (mlopt/sweep/)
@cli.command("sweep")
@click.argument("spec_path", metavar="SPEC.yaml")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the plans (DIR/GRID/NAME...), summary.csv, summary.md and plots.")
@click.option("--executor", type=click.Choice(["local", "dask", "ray"]), default="local", show_default=True,
              help="local: a process pool here; dask, ray: a cluster (extras mlopt[dask], mlopt[ray]).")
@click.option("--address", default=None,
              help="Cluster to submit to: tcp://scheduler:8786 (dask), ray://head:10001 (ray); default: start a "
                   "local one on 127.0.0.1 with --workers workers.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes of the local pool or local cluster (default: CPUs here).")
@click.option("--resume", is_flag=True, help="Keep cells whose plan files exist and are complete.")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="Plan cache folder (default: $MLOPT_CACHE, else ~/.cache/mlopt/plans).")
@click.option("--no-cache", is_flag=True, help="Neither read nor fill the plan cache.")
@click.option("--json", "as_json", is_flag=True, help="Print one summary row per cell as JSON.")
@click.pass_context
def sweep_cmd(ctx: click.Context, spec_path, out_dir, executor, address, workers, resume, cache_dir, no_cache,
              as_json) -> None:
    """Run a grid of `mlopt plan ...` invocations (docs/sweep.md); exit 0 when every cell has its plan, 1
    when some failed (each failure is in the summary with its message), 2 for a bad spec."""
    if cache_dir and no_cache:
        raise click.UsageError("give --cache DIR or --no-cache, not both")
    verbose = (ctx.obj or {}).get("verbose", 1)
    result = run_sweep(spec_path, out_dir, executor=executor, address=address, workers=workers, resume=resume,
                       cache_dir=cache_dir, use_cache=not no_cache, verbose=verbose,
                       bar=verbose >= 1 and sys.stderr.isatty())
    if as_json:
        _print_json([{k: v for k, v in row.items() if k != "index"} for row in result.rows])
    elif verbose >= 1:
        print_table(result.rows, f"{spec_path}: {result.counts['plans']} of {len(result.rows)} cells have plans")
    _say(ctx, f"wrote {result.summary_csv} and {result.summary_md}"
              + (f" and {len(result.plots)} plots" if result.plots else ""))
    result.raise_for_failures()


# ---------------------------------------------------------------------------------------------------------
# solvers


@cli.command()
@click.option("--check", is_flag=True, help="Also solve a small known-optimum MILP on each available backend.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def solvers(check: bool, as_json: bool) -> None:
    """List MILP backends, their versions and availability (a size-limited Gurobi licence is reported)."""


    rows = solver_report(check)
    failed = [r["name"] for r in rows if r.get("check", "").startswith("FAILED")]
    if as_json:
        _print_json(rows)
    else:
        table = Table("solver", "available", "version", "note", *(["check"] if check else []))
        for r in rows:
            table.add_row(r["name"], "yes" if r["available"] else "no", r["version"], r["note"],
                          *([r.get("check", "")] if check else []))

        console = stdout_console()
        console.print(table)
        chosen, note = resolve_solver("auto")
        console.print(f"--solver auto uses {chosen.name} ({note})")
    if failed:
        raise click.ClickException(f"known-optimum check failed on: {', '.join(failed)}")


# ---------------------------------------------------------------------------------------------------------
# entry point


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to one line and an exit code instead of a traceback.

    As the program itself (argv None: the `mlopt` script, `python -m mlopt.cli`), a Ctrl-C after the command has
    decided its exit code is ignored: the interpreter's teardown (joining a sweep's worker pool, for one) would
    otherwise die of the signal after the outputs were complete, reporting a signal instead of that code."""
    try:
        return _main(argv)
    finally:
        if argv is None:
            _ignore_late_interrupts()


def _ignore_late_interrupts() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: list[str] | None) -> int:
    try:
        with warnings.catch_warnings(), _interrupt_handling():
            warnings.showwarning = _one_line_warning  # restored when the block exits
            _invoke(argv)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("mlopt: aborted", err=True)
        return EXIT_INTERNAL
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except MloptError as exc:
        click.echo(f"mlopt: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:  # outputs are staged or atomic: nothing partial is left behind
        click.echo("mlopt: interrupted", err=True)
        return EXIT_INTERRUPTED
    except RecursionError as exc:  # input nested too deeply for some reader that recursed on it
        click.echo(f"mlopt: error: input nested too deeply to process ({exc})", err=True)
        return InputError.exit_code
    except OSError as exc:
        if exc.filename is None or "-vv" in (argv if argv is not None else sys.argv):
            return _internal_error(exc, argv)
        # a file system refusal that no loader or writer turned into an InputError: still the user's path
        click.echo(f"mlopt: error: {exc.filename}: $: {exc.strerror or exc}", err=True)
        return InputError.exit_code
    except Exception as exc:  # a bug in mlopt, not bad input: one line, traceback with -vv
        return _internal_error(exc, argv)


@contextlib.contextmanager
def _interrupt_handling() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as usual and is also remembered (mlopt.formats.io.note_interrupt): one
    that Python swallows (raised inside a weakref callback or __del__, reported as "Exception ignored in")
    still stops the next output from being installed. That swallowed exception is not printed: the interrupt
    is reported once, by `main`. SIGINT left ignored by the parent stays ignored."""


    io.clear_interrupt()
    installed = (threading.current_thread() is threading.main_thread()  # signal.signal works there only
                 and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    previous_hook = sys.unraisablehook

    def on_sigint(signum, frame) -> None:
        io.note_interrupt()
        raise KeyboardInterrupt

    def quiet_interrupts(unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            previous_hook(unraisable)

    if installed:
        signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = quiet_interrupts
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        if installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _invoke(argv: list[str] | None) -> None:
    """click's main without its KeyboardInterrupt handling (which prints a blank line and turns Ctrl-C into
    Abort, exit 1): `main` reports an interrupt itself, as one line and exit 130."""
    args = list(sys.argv[1:] if argv is None else argv)
    with cli.make_context("mlopt", args) as ctx:
        cli.invoke(ctx)


def _internal_error(exc: BaseException, argv: list[str] | None) -> int:
    if "-vv" in (argv if argv is not None else sys.argv):
        raise exc
    click.echo(f"mlopt: internal error: {type(exc).__name__}: {exc} (rerun with -vv for the traceback)", err=True)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())

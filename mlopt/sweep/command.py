"""The sweep's only contact with the command line: a cell runs `mlopt plan PLANNER ARGS` through the click command
itself, and a spec's options are checked against that command's click options.

mlopt.cli imports the sweep (`mlopt sweep`) when that command runs, and this module imports mlopt.cli when a
cell runs or a spec is checked, so neither imports the other at module level; the rest of mlopt.sweep does
not touch the command line. (Running the registered planners without click, their options rebuilt with
`from_dict`, is issue 25's next step: the spec's command-line values would need the command's parsing.)
"""

from __future__ import annotations

import threading
import warnings

import click

from mlopt.errors import MloptError

# One cell at a time per process: the warnings machinery and click's context are process-global, so threaded
# workers (a Dask worker with several threads, or an in-process LocalCluster) take turns; processes are the
# unit of parallelism (local pool processes, single-threaded cluster workers).
_INVOKE_LOCK = threading.Lock()


def _cli():
    """mlopt.cli, imported on first use: it imports the sweep for `mlopt sweep` (an import circle otherwise)."""
    from mlopt import cli

    return cli


def plan_options(planner: str) -> dict[str, click.Option]:
    """Long option name (without --) -> the click option of `mlopt plan PLANNER`."""
    command = _cli().plan.commands[planner]
    out = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    out[opt[2:]] = param
    return out


def invoke(argv: list[str]) -> tuple[int, str, list[str]]:
    """`mlopt ARGV` through the click command group, errors mapped to exit codes and one-line messages as
    `mlopt.cli.main` maps them (but returned, not printed; warnings collected, not printed)."""
    cli = _cli()
    caught: list[str] = []
    try:
        with _INVOKE_LOCK, warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            try:
                cli.cli.main(args=argv, prog_name="mlopt", standalone_mode=False)
            finally:
                for w in records:
                    text = str(w.message)
                    if text not in caught:
                        caught.append(text)
        return 0, "", caught
    except click.exceptions.Exit as exc:
        return exc.exit_code, "", caught
    except click.Abort:
        return cli.EXIT_INTERNAL, "aborted", caught
    except click.ClickException as exc:
        return exc.exit_code, exc.format_message(), caught
    except MloptError as exc:
        return exc.exit_code, str(exc), caught
    except Exception as exc:  # noqa: BLE001 - a bug in mlopt: one line, like `mlopt` without -vv
        return cli.EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}", caught

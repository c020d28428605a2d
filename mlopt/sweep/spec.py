"""Sweep specs: a YAML (or JSON) grid of `mlopt plan ...` invocations -> cells.

    planner: collective            # collective | memory | threads | schedule
    name: ag                       # optional: the sub-folder of -o DIR (default: the planner)
    options:                       # fixed options of every cell, named as on the command line
      algorithm: ring
    grid:                          # axes: lists; their cartesian product gives the cells
      collective: [allgather, allreduce]
      size: 1KiB..1GiB             # `size` of a collective grid also takes a range (x4 steps)
      topology: [ndv2x2, dgx2x2]

or several such grids under `grids: [...]`. Option values are checked with the command's own option declarations
(mlopt.planners.options.CommandOption: types, choices, ranges; the command line builds its flags from the
same declarations) when the spec is loaded, so a typo exits 2 naming the spec and the field before any cell
runs; what only the planner can judge (a sketch's content, an infeasible budget) fails that cell alone.
Relative paths of file options (model, sketch, ops, contention, cost-table, and topology files) are
resolved against the spec's folder and passed on as absolute paths.

Each cell writes DIR/GRID/NAME.xml (collective) or DIR/GRID/NAME.plan.json, NAME being the cell's axis
values joined by `-` in grid order (`allgather-1KiB-ndv2x2`), so names are stable for a spec.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import check_regular_file, read_document
from mlopt.formats.loaders import load_trace_any, resolve_topology
from mlopt.formats.sizes import format_size, parse_size_range
from mlopt.planners.options import CommandOption, convert_option, one_of_problem
from mlopt.planners.registry import find_kind, kind_names
from mlopt.sweep.cells import REFUSED_OPTIONS, Cell
from mlopt.sweep.command import plan_options

GRID_KEYS = ("planner", "name", "options", "grid")
_TOKEN_BAD = re.compile(r"[^A-Za-z0-9._+=-]+")
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_STRIP_SUFFIXES = (".gz", ".json", ".yaml", ".yml", ".xml", ".csv")


@dataclass(frozen=True)
class Spec:
    path: str
    cells: tuple[Cell, ...]

    @property
    def planners(self) -> list[str]:
        return sorted({c.planner for c in self.cells})


def load_spec(path: str | Path) -> Spec:
    """Read and check a sweep spec; InputError (exit 2) naming the spec and the field otherwise."""
    source = str(path)
    doc = read_document(path)
    if not isinstance(doc, dict):
        raise InputError(source, "$", f"expected a mapping with `planner` and `grid` (or `grids`), "
                                      f"found {type(doc).__name__}")
    base = Path(path).resolve().parent
    if "grids" in doc:
        extra = sorted(set(doc) - {"grids", "description"})
        if extra:
            raise InputError(source, f"$.{extra[0]}", "unknown key beside `grids` (only `description` may be "
                                                       "there; put planner, options and grid in each grid)")
        grids = doc["grids"]
        if not isinstance(grids, list) or not grids:
            raise InputError(source, "$.grids", "expected a non-empty list of grids")
        specs = [(g, f"$.grids[{i}]") for i, g in enumerate(grids)]
    else:
        specs = [({k: v for k, v in doc.items() if k != "description"}, "$")]
    cells: list[Cell] = []
    names: dict[str, str] = {}
    inputs: list[tuple[str, str, bool, str]] = []
    for grid, field in specs:
        if not isinstance(grid, dict):
            raise InputError(source, field, f"expected a mapping, found {type(grid).__name__}")
        new = _grid_cells(grid, field, source, base, len(cells), inputs)
        name = new[0].grid
        if name in names:
            raise InputError(source, f"{field}.name", f"grid name {name!r} is also the name of {names[name]}: give "
                                                      f"each grid its own `name` (its output sub-folder)")
        names[name] = field
        cells.extend(new)
    for option, path, always_file, where in inputs:  # structure first (its errors are cheaper to read), then files
        check_input(option, path, always_file, source, where)
    return Spec(source, tuple(cells))


def _grid_cells(grid: dict[str, Any], field: str, source: str, base: Path, first_index: int,
                inputs: list[tuple[str, str, bool, str]]) -> list[Cell]:
    """The grid's cells; the input files its options name are appended to `inputs` (option, path, always a
    file, JSON path of the value) for `load_spec` to read once the whole spec is known to be well formed."""
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        raise InputError(source, f"{field}.{unknown[0]}", f"unknown key (a grid has {', '.join(GRID_KEYS)})")
    planner = grid.get("planner")
    kind = find_kind(planner) if isinstance(planner, str) else None
    if kind is None:
        raise InputError(source, f"{field}.planner",
                         f"{planner!r} is not a planner; expected one of {', '.join(kind_names())}")
    name = grid.get("name", planner)
    if not isinstance(name, str) or not _NAME_OK.match(name):
        raise InputError(source, f"{field}.name", f"{name!r}: expected a folder name (letters, digits, . _ -)")
    known = plan_options(planner)

    def option(key: Any, where: str) -> tuple[str, CommandOption]:
        norm = str(key).lstrip("-").replace("_", "-")
        if norm in REFUSED_OPTIONS:
            raise InputError(source, where, f"--{norm} cannot be set in a sweep: {REFUSED_OPTIONS[norm]}")
        if norm not in known:
            usable = ", ".join(sorted(k for k in known if k not in REFUSED_OPTIONS))
            raise InputError(source, where, f"`mlopt plan {planner}` has no option --{norm} (it has {usable})")
        return norm, known[norm]

    def resolve(norm: str, text: str) -> str:
        p = Path(text).expanduser()
        if p.is_absolute():
            return str(p)
        if norm in kind.file_inputs or (norm in kind.named_inputs and (base / p).exists()):
            return str(base / p)
        return text

    def values(norm: str, param: CommandOption, value: Any, where: str) -> tuple[list[str], str, Any]:
        """(argv fragment, file-name token, value as the command converts it) of one option value."""
        if param.type == "flag":
            if not isinstance(value, bool):
                raise InputError(source, where, f"--{norm} is a flag: expected true or false, found {value!r}")
            return ([f"--{norm}"] if value else []), (norm if value else f"no-{norm}"), value
        items = value if isinstance(value, list) and param.multiple else [value]
        args, tokens, converted = [], [], []
        for k, item in enumerate(items):
            here = f"{where}[{k}]" if items is value else where
            if isinstance(item, (list, dict)):
                what = "a list" if isinstance(item, list) else "a mapping"
                hint = "; to sweep over values, list them under `grid:`" if isinstance(item, list) else ""
                raise InputError(source, here, f"--{norm} takes one value, found {what}{hint}")
            if isinstance(item, bool) or item is None:
                raise InputError(source, here, f"--{norm} takes a value, found {item!r}")
            text = str(item)
            try:
                convert_option(param, text)
            except ValueError as exc:
                raise InputError(source, here, f"--{norm}: {exc}") from None
            if norm in kind.file_inputs or norm in kind.named_inputs:
                text = resolve(norm, text)
                inputs.append((norm, text, norm in kind.file_inputs, here))
            args += [f"--{norm}", text]
            converted.append(convert_option(param, text))
            tokens.append(_token(str(item), norm in kind.file_inputs or Path(text).is_file()))
        return args, "+".join(tokens), tuple(converted) if param.multiple else converted[0]

    options = grid.get("options") or {}
    if not isinstance(options, dict):
        raise InputError(source, f"{field}.options", f"expected a mapping of option: value, found "
                                                     f"{type(options).__name__}")
    axes = grid.get("grid") or {}
    if not isinstance(axes, dict):
        raise InputError(source, f"{field}.grid", f"expected a mapping of option: [values], found "
                                                  f"{type(axes).__name__}")
    fixed: list[str] = []
    fixed_options: list[tuple[str, Any]] = []
    given: dict[str, str] = {}
    record_wall_time = False
    for key, value in options.items():
        where = f"{field}.options.{key}"
        norm, param = option(key, where)
        if norm in given:
            raise InputError(source, where, f"--{norm} is given twice (as {given[norm]})")
        given[norm] = where
        args, _, converted = values(norm, param, value, where)
        fixed += args
        fixed_options.append((norm, converted))
        record_wall_time |= norm == "record-wall-time" and value is True
    # per axis: (args, token, shown, record-wall-time, (option, converted value))
    axis_values: list[list[tuple[list[str], str, str, bool, tuple[str, Any]]]] = []
    axis_names: list[str] = []
    for key, value in axes.items():
        where = f"{field}.grid.{key}"
        norm, param = option(key, where)
        if norm in given:
            raise InputError(source, where, f"--{norm} is also given as {given[norm]}")
        given[norm] = where
        if param.size_range_axis and isinstance(value, str):
            try:
                value = [format_size(s) for s in parse_size_range(value, f"{source}: {where}")]
            except InputError as exc:
                raise InputError(source, where, exc.message) from None
        if not isinstance(value, list) or not value:
            raise InputError(source, where, f"expected a non-empty list of values of --{norm}, found {value!r}")
        seen: dict[str, int] = {}
        entries = []
        for k, item in enumerate(value):
            args, token, converted = values(norm, param, item, f"{where}[{k}]")
            key_text = repr(args)
            if key_text in seen:
                raise InputError(source, f"{where}[{k}]", f"{item!r} repeats {where}[{seen[key_text]}]")
            seen[key_text] = k
            shown = "+".join(str(x) for x in item) if isinstance(item, list) else str(item)
            entries.append((args, token, shown, norm == "record-wall-time" and item is True, (norm, converted)))
        axis_values.append(entries)
        axis_names.append(norm)
    missing = [f"--{n}" for n, p in known.items() if p.required and n not in given and n != "output"]
    if missing:
        raise InputError(source, field, f"`mlopt plan {planner}` needs {', '.join(missing)}: give it under "
                                        f"`options:` (one value) or `grid:` (a list)")
    for group in kind.one_of:
        problem = one_of_problem(group, given)
        if problem:
            raise InputError(source, field, f"`mlopt plan {planner}` {problem}: give one under `options:` (one "
                                            f"value) or `grid:` (a list)")
    cells = []
    for k, combo in enumerate(itertools.product(*axis_values)):
        args, cell_options = list(fixed), list(fixed_options)
        for entry in combo:
            args += entry[0]
            cell_options.append(entry[4])
        stem = "-".join(entry[1] for entry in combo) or name
        cells.append(Cell(
            index=first_index + k, grid=name, planner=planner,
            axes=tuple((axis, entry[2]) for axis, entry in zip(axis_names, combo)),
            args=tuple(args), output=f"{name}/{stem}{kind.output_suffix}",
            record_wall_time=record_wall_time or any(entry[3] for entry in combo), options=tuple(cell_options)))
    return _unique_names(cells)


def check_input(option: str, path: str, always_file: bool, source: str, where: str) -> None:
    """A cell's input file is read before any cell runs: a missing or broken model (or topology file) is bad
    input of the spec, exit 2 naming the spec and the field, not one failed cell per grid point."""
    if not always_file and not Path(path).exists():
        return  # a preset name such as ndv2x2
    try:
        _load_input(option, path)
    except InputError as exc:
        raise InputError(source, where, f"--{option} {exc.file}: {exc.field}: {exc.message}") from None


@functools.lru_cache(maxsize=None)
def _load_input(option: str, path: str) -> None:
    check_regular_file(path)
    if option == "model":
        load_trace_any(path)
    elif option == "topology":
        resolve_topology(path)


def _token(text: str, is_path: bool) -> str:
    """A file-name piece for one value: a path's file name without its extensions, else the text, with
    characters other than letters, digits and . _ + = - replaced by _."""
    if is_path:
        text = Path(text).name
        stripped = True
        while stripped:
            stripped = False
            for suffix in _STRIP_SUFFIXES:
                if text.lower().endswith(suffix) and len(text) > len(suffix):
                    text, stripped = text[: -len(suffix)], True
    token = _TOKEN_BAD.sub("_", text).lstrip(".")
    return token or "_"


def _unique_names(cells: list[Cell]) -> list[Cell]:
    """Cells whose values spell the same file name (two sketches called sk.json in different folders) get
    a short hash of their arguments appended, so every cell has its own files."""
    count: dict[str, int] = {}
    for cell in cells:
        count[cell.output] = count.get(cell.output, 0) + 1
    if all(n == 1 for n in count.values()):
        return cells
    out = []
    suffix = cells[0].kind.output_suffix
    for cell in cells:
        if count[cell.output] > 1:
            digest = hashlib.sha256("\0".join(cell.args).encode()).hexdigest()[:8]
            stem = cell.output[: -len(suffix)]
            cell = replace(cell, output=f"{stem}-{digest}{suffix}")
        out.append(cell)
    return out

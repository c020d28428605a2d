"""Free-format MPS writer (read back by HiGHS, CBC, Gurobi, SCIP, CPLEX).

Conventions used, chosen so that all common readers agree:
- the NAME line ends in FREE: CBC's reader (CoinMpsIO) otherwise guesses fixed format from the first
  COLUMNS line and misreads the file; HiGHS and Gurobi ignore the tag;
- the objective is the first N row; its RHS is minus the objective constant;
- OBJSENSE / MAX section for maximisation (CBC ignores it, so the CBC adapter writes a min form);
- rows: E (lb == ub), L (only ub), G (only lb), G + RANGES (both finite), N (free);
- integers are wrapped in MARKER INTORG/INTEND and always get explicit bounds, because some readers
  give integer columns without bounds an upper bound of 1;
- every column appears in COLUMNS (an all-zero column gets an explicit 0 objective entry).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from mlopt.solvers.model import MatrixForm, Model


def _num(value: float) -> str:
    # repr of a Python float is the shortest string that round-trips exactly.
    return repr(float(value))


def _unique_objective_name(row_names: tuple[str, ...]) -> str:
    taken = set(row_names)
    name, k = "obj", 0
    while name in taken:
        k += 1
        name = f"obj_{k}"
    return name


def _check_unique(names: tuple[str, ...], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} name {name!r}: MPS needs unique names")
        seen.add(name)


def _row_type(lb: float, ub: float) -> str:
    if lb == ub:
        return "E"
    if math.isinf(lb) and math.isinf(ub):
        return "N"
    if math.isinf(lb):
        return "L"
    return "G"  # finite lb; a finite ub too becomes a RANGES entry


def _rows_section(form: MatrixForm, obj_name: str) -> Iterator[str]:
    yield "ROWS"
    yield f" N  {obj_name}"
    for name, lb, ub in zip(form.row_names, form.row_lb.tolist(), form.row_ub.tolist()):
        yield f" {_row_type(lb, ub)}  {name}"


def _columns_section(form: MatrixForm, obj_name: str) -> Iterator[str]:
    yield "COLUMNS"
    A, c, names = form.A, form.c.tolist(), form.row_names
    indptr, indices, data = A.indptr.tolist(), A.indices.tolist(), A.data.tolist()
    in_int_block = False
    for j, col in enumerate(form.col_names):
        is_int = bool(form.integrality[j])
        if is_int != in_int_block:
            yield f"    MARKER  'MARKER'  '{'INTORG' if is_int else 'INTEND'}'"
            in_int_block = is_int
        start, end = indptr[j], indptr[j + 1]
        if c[j] != 0.0 or start == end:
            yield f"    {col}  {obj_name}  {_num(c[j])}"
        for k in range(start, end):
            yield f"    {col}  {names[indices[k]]}  {_num(data[k])}"
    if in_int_block:
        yield "    MARKER  'MARKER'  'INTEND'"


def _rhs_and_ranges(form: MatrixForm, obj_name: str) -> Iterator[str]:
    rhs, ranges = [], []
    if form.constant != 0.0:
        rhs.append(f"    RHS  {obj_name}  {_num(-form.constant)}")
    for name, lb, ub in zip(form.row_names, form.row_lb.tolist(), form.row_ub.tolist()):
        kind = _row_type(lb, ub)
        value = ub if kind == "L" else lb
        if kind != "N" and value != 0.0:
            rhs.append(f"    RHS  {name}  {_num(value)}")
        if kind == "G" and not math.isinf(ub):
            ranges.append(f"    RNG  {name}  {_num(ub - lb)}")
    yield "RHS"
    yield from rhs
    if ranges:
        yield "RANGES"
        yield from ranges


def _column_bounds(name: str, lb: float, ub: float, is_int: bool) -> Iterator[str]:
    if is_int and lb == 0.0 and ub == 1.0:
        yield f" BV BND  {name}"
        return
    if lb == ub:
        yield f" FX BND  {name}  {_num(lb)}"
        return
    if math.isinf(lb) and math.isinf(ub):
        yield f" FR BND  {name}"
        return
    lo, up = ("LI", "UI") if is_int else ("LO", "UP")
    if math.isinf(lb):
        yield f" MI BND  {name}"
    elif lb != 0.0 or is_int:
        yield f" {lo} BND  {name}  {_num(lb)}"
    if math.isinf(ub):
        if is_int:
            yield f" PL BND  {name}"
    else:
        yield f" {up} BND  {name}  {_num(ub)}"


def _bounds_section(form: MatrixForm) -> Iterator[str]:
    yield "BOUNDS"
    for j, name in enumerate(form.col_names):
        yield from _column_bounds(name, float(form.col_lb[j]), float(form.col_ub[j]), bool(form.integrality[j]))


def mps_lines(form: MatrixForm) -> Iterator[str]:
    """The MPS text of `form`, line by line."""
    _check_unique(form.col_names, "variable")
    _check_unique(form.row_names, "constraint")
    obj_name = _unique_objective_name(form.row_names)
    yield f"NAME  {form.name}  FREE"
    if form.sense == "max":
        yield "OBJSENSE"
        yield "    MAX"
    yield from _rows_section(form, obj_name)
    yield from _columns_section(form, obj_name)
    yield from _rhs_and_ranges(form, obj_name)
    yield from _bounds_section(form)
    yield "ENDATA"


def write_mps(model: MatrixForm | Model, path: str | os.PathLike[str]) -> None:
    """Write `model` as free MPS to `path` atomically (temp file in the same folder + os.replace).
    Raises ValueError on duplicate names, OSError on I/O failure."""
    form = model.to_arrays() if isinstance(model, Model) else model
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii", newline="\n") as out:
            for line in mps_lines(form):
                out.write(line)
                out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def as_min_form(form: MatrixForm) -> MatrixForm:
    """`form` as a minimisation without objective constant (for readers that ignore OBJSENSE or offsets).
    The optimum of the original is sign * (optimum of the result) + form.constant, sign = -1 for max."""
    c = -form.c if form.sense == "max" else form.c
    c = np.array(c)
    c.setflags(write=False)
    return replace(form, c=c, sense="min", constant=0.0)

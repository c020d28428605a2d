"""MILP builder (`Model`) and its frozen array form (`MatrixForm`).

Planners build models with 100k+ variables, so the builder keeps flat Python lists (columns) and COO
triplets (matrix entries) instead of one object per variable or constraint; `to_arrays` turns them into
numpy / scipy.sparse arrays once, which is what every backend consumes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp

Sense = Literal["min", "max"]
ArrayLike = Sequence[float] | np.ndarray | range
IndexLike = Sequence[int] | np.ndarray | range
INF = math.inf

# MPS-safe names: no whitespace or quotes, and a first character no MPS reader mistakes for a number,
# a comment ('*') or a sign.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]():,+\-/@#<>=]{0,254}")


def check_name(name: str) -> str:
    """Return `name` if it is safe to write to MPS, else raise ValueError."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid name {name!r}: use 1-255 chars, letters/digits/_.[]():,+-/@#<>=, starting with a letter or _"
        )
    return name


def _check_bounds(lb: float, ub: float, what: str) -> None:
    if math.isnan(lb) or math.isnan(ub):
        raise ValueError(f"{what}: bounds must not be NaN")
    if lb > ub:
        raise ValueError(f"{what}: lower bound {lb} > upper bound {ub}")
    if lb == INF or ub == -INF:
        raise ValueError(f"{what}: bounds [{lb}, {ub}] admit no finite value")


def _as_list(values: ArrayLike | IndexLike) -> list:
    # numpy's tolist() converts in C and yields Python scalars, which keeps the COO lists homogeneous.
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _broadcast(value: float | ArrayLike, n: int, what: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.broadcast_to(arr, (n,))
    if arr.shape != (n,):
        raise ValueError(f"{what}: expected a scalar or {n} values, got shape {arr.shape}")
    return arr


# Integer bounds within this of an integer count as that integer (so 2.0000000001 does not become 3).
INTEGER_BOUND_TOL = 1e-9


def _integral_bounds(lb: np.ndarray, ub: np.ndarray, integrality: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round integer columns' bounds inward. Equivalent model, and it matters: HiGHS's MPS reader ignores
    fractional integer bounds, and HiGHS 1.15's presolve has declared feasible models with them infeasible."""
    lb = np.where(integrality, np.ceil(lb - INTEGER_BOUND_TOL), lb)
    ub = np.where(integrality, np.floor(ub + INTEGER_BOUND_TOL), ub)
    return lb, ub


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class MatrixForm:
    """A MILP in array form: optimise c @ x + constant s.t. row_lb <= A @ x <= row_ub, col_lb <= x <= col_ub,
    x[j] integer where integrality[j]. Arrays are read-only; integer columns have integral bounds (rounded
    inward, so an integer column with no integer in its bounds has col_lb > col_ub)."""

    c: np.ndarray
    constant: float
    sense: Sense
    A: sp.csc_array  # shape (num_constraints, num_vars), duplicates summed, explicit zeros removed
    row_lb: np.ndarray
    row_ub: np.ndarray
    col_lb: np.ndarray
    col_ub: np.ndarray
    integrality: np.ndarray  # bool mask
    col_names: tuple[str, ...]
    row_names: tuple[str, ...]
    name: str = "mlopt"

    @property
    def num_vars(self) -> int:
        return int(self.c.shape[0])

    @property
    def num_constraints(self) -> int:
        return int(self.row_lb.shape[0])

    @property
    def is_mip(self) -> bool:
        return bool(self.integrality.any())


class Model:
    """Incremental MILP builder. Variables and constraints are referred to by the int index returned on add."""

    def __init__(self, name: str = "mlopt"):
        self.name = check_name(name)
        self._col_lb: list[float] = []
        self._col_ub: list[float] = []
        self._col_int: list[bool] = []
        self._obj: list[float] = []
        self._col_names: list[str | None] = []  # None = default name x{i}
        self._row_lb: list[float] = []
        self._row_ub: list[float] = []
        self._row_names: list[str | None] = []  # None = default name c{j}
        self._entry_row: list[int] = []
        self._entry_col: list[int] = []
        self._entry_val: list[float] = []
        self._sense: Sense = "min"
        self._constant = 0.0

    @property
    def sense(self) -> Sense:
        return self._sense

    @property
    def constant(self) -> float:
        return self._constant

    @property
    def num_vars(self) -> int:
        return len(self._col_lb)

    @property
    def num_constraints(self) -> int:
        return len(self._row_lb)

    # -- variables -------------------------------------------------------------------------------------

    def add_var(
        self, name: str | None = None, lb: float = 0.0, ub: float = INF, integer: bool = False, obj: float = 0.0
    ) -> int:
        """Add one variable; returns its index."""
        lb, ub = float(lb), float(ub)
        _check_bounds(lb, ub, f"variable {name or self.num_vars}")
        self._col_names.append(None if name is None else check_name(name))
        self._col_lb.append(lb)
        self._col_ub.append(ub)
        self._col_int.append(bool(integer))
        self._obj.append(float(obj))
        return self.num_vars - 1

    def add_binary(self, name: str | None = None, obj: float = 0.0) -> int:
        return self.add_var(name, 0.0, 1.0, integer=True, obj=obj)

    def add_vars(
        self,
        prefix: str | None,
        n: int,
        lb: float | ArrayLike = 0.0,
        ub: float | ArrayLike = INF,
        integer: bool = False,
        obj: float | ArrayLike = 0.0,
    ) -> np.ndarray:
        """Add `n` variables named {prefix}_{k} (default names if prefix is None); returns their indices.
        lb/ub/obj may be scalars or length-n arrays."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        lbs, ubs, objs = _broadcast(lb, n, "lb"), _broadcast(ub, n, "ub"), _broadcast(obj, n, "obj")
        bad = np.isnan(lbs) | np.isnan(ubs) | (lbs > ubs) | (lbs == INF) | (ubs == -INF)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            _check_bounds(float(lbs[k]), float(ubs[k]), f"variable {prefix}_{k}")
        start = self.num_vars
        if prefix is None:
            self._col_names.extend([None] * n)
        else:
            check_name(prefix)
            self._col_names.extend(f"{prefix}_{k}" for k in range(n))
        self._col_lb.extend(lbs.tolist())
        self._col_ub.extend(ubs.tolist())
        self._col_int.extend([bool(integer)] * n)
        self._obj.extend(objs.tolist())
        return np.arange(start, start + n)

    # -- constraints -----------------------------------------------------------------------------------

    def add_constraint(
        self, idx: IndexLike, coef: ArrayLike, lb: float = -INF, ub: float = INF, name: str | None = None
    ) -> int:
        """Add lb <= sum(coef[k] * x[idx[k]]) <= ub; returns the row index. Repeated indices are summed."""
        cols, vals = _as_list(idx), _as_list(coef)
        row = self.num_constraints
        what = f"constraint {name or row}"
        if len(cols) != len(vals):
            raise ValueError(f"{what}: {len(cols)} indices but {len(vals)} coefficients")
        if cols and (min(cols) < 0 or max(cols) >= self.num_vars):
            raise ValueError(f"{what}: variable index outside [0, {self.num_vars})")
        lb, ub = float(lb), float(ub)
        _check_bounds(lb, ub, what)
        self._row_names.append(None if name is None else check_name(name))
        self._row_lb.append(lb)
        self._row_ub.append(ub)
        self._entry_row.extend([row] * len(cols))
        self._entry_col.extend(cols)
        self._entry_val.extend(vals)
        return row

    def add_le(self, idx: IndexLike, coef: ArrayLike, rhs: float, name: str | None = None) -> int:
        return self.add_constraint(idx, coef, -INF, rhs, name)

    def add_ge(self, idx: IndexLike, coef: ArrayLike, rhs: float, name: str | None = None) -> int:
        return self.add_constraint(idx, coef, rhs, INF, name)

    def add_eq(self, idx: IndexLike, coef: ArrayLike, rhs: float, name: str | None = None) -> int:
        return self.add_constraint(idx, coef, rhs, rhs, name)

    # -- objective -------------------------------------------------------------------------------------

    def set_objective(self, idx: IndexLike, coef: ArrayLike, sense: Sense = "min", constant: float = 0.0) -> None:
        """Replace the objective (including per-variable `obj` given on add) by sum(coef*x[idx]) + constant."""
        if sense not in ("min", "max"):
            raise ValueError(f"sense must be 'min' or 'max', got {sense!r}")
        cols, vals = np.asarray(_as_list(idx), dtype=np.int64), np.asarray(_as_list(coef), dtype=np.float64)
        if cols.shape != vals.shape:
            raise ValueError(f"objective: {cols.size} indices but {vals.size} coefficients")
        if cols.size and (cols.min() < 0 or cols.max() >= self.num_vars):
            raise ValueError(f"objective: variable index outside [0, {self.num_vars})")
        obj = np.zeros(self.num_vars)
        np.add.at(obj, cols, vals)
        self._obj = obj.tolist()
        self._sense = sense
        self._constant = float(constant)

    # -- export ----------------------------------------------------------------------------------------

    def to_arrays(self) -> MatrixForm:
        """Freeze the model into arrays (duplicate matrix entries summed)."""
        n, m = self.num_vars, self.num_constraints
        vals = np.asarray(self._entry_val, dtype=np.float64)
        c = np.asarray(self._obj, dtype=np.float64)
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(c)) and math.isfinite(self.constant)):
            raise ValueError("model has a non-finite constraint or objective coefficient")
        coo = sp.coo_array(
            (vals, (np.asarray(self._entry_row, dtype=np.int64), np.asarray(self._entry_col, dtype=np.int64))),
            shape=(m, n),
        )
        A = sp.csc_array(coo)  # COO -> CSC sums duplicate (row, col) entries
        A.sum_duplicates()
        A.eliminate_zeros()
        A.sort_indices()
        for part in (A.data, A.indices, A.indptr):
            part.setflags(write=False)
        integrality = np.asarray(self._col_int, dtype=bool)
        col_lb, col_ub = _integral_bounds(
            np.asarray(self._col_lb, dtype=np.float64), np.asarray(self._col_ub, dtype=np.float64), integrality
        )
        return MatrixForm(
            c=_readonly(c),
            constant=self.constant,
            sense=self.sense,
            A=A,
            row_lb=_readonly(np.asarray(self._row_lb, dtype=np.float64)),
            row_ub=_readonly(np.asarray(self._row_ub, dtype=np.float64)),
            col_lb=_readonly(col_lb),
            col_ub=_readonly(col_ub),
            integrality=_readonly(integrality),
            col_names=tuple(nm if nm is not None else f"x{i}" for i, nm in enumerate(self._col_names)),
            row_names=tuple(nm if nm is not None else f"c{j}" for j, nm in enumerate(self._row_names)),
            name=self.name,
        )

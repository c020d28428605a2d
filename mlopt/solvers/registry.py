"""Solver registry: name -> adapter class, and the "auto" choice."""

from __future__ import annotations

from types import MappingProxyType

from mlopt.solvers.base import Solver, SolverUnavailable
from mlopt.solvers.cbc import CbcSolver
from mlopt.solvers.gurobi import GurobiSolver
from mlopt.solvers.highs import HighsSolver

SOLVERS = MappingProxyType({"highs": HighsSolver, "cbc": CbcSolver, "gurobi": GurobiSolver})

AUTO = "auto"
# "auto" uses Gurobi when it is fully licensed, else the embedded HiGHS, else CBC.
AUTO_FALLBACKS = ("highs", "cbc")


def list_solvers() -> list[str]:
    """Names accepted by `get_solver` (whether or not they are available here)."""
    return list(SOLVERS)


def get_solver(name: str) -> Solver:
    """A fresh adapter instance for `name`; raises SolverUnavailable for an unknown name."""
    try:
        return SOLVERS[name]()
    except KeyError:
        raise SolverUnavailable(name, f"unknown solver; choose from {', '.join([AUTO, *SOLVERS])}") from None


def resolve_solver(name: str) -> tuple[Solver, str]:
    """The solver to use for `name` ("auto" or a registered name) and a one-line note on the choice.
    Raises SolverUnavailable when an explicitly named solver (or, for auto, every solver) is unusable."""
    if name != AUTO:
        solver = get_solver(name)
        availability = solver.available()
        if not availability.ok:
            raise SolverUnavailable(name, availability.reason)
        return solver, f"{name}: requested explicitly"
    gurobi = get_solver("gurobi")
    gurobi_check = gurobi.available()
    if gurobi_check.ok:
        return gurobi, "auto: gurobi with a full licence"
    reasons = [f"gurobi: {gurobi_check.reason}"]
    for fallback in AUTO_FALLBACKS:
        solver = get_solver(fallback)
        availability = solver.available()
        if availability.ok:
            return solver, f"{'; '.join(reasons)}; using {fallback}"
        reasons.append(f"{fallback}: {availability.reason}")
    raise SolverUnavailable(AUTO, "; ".join(reasons))

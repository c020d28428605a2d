"""CBC adapter: runs the CBC binary bundled with pulp as a subprocess on an MPS file.

- The model goes to CBC as a minimisation without objective constant and with generated names C{j}/R{i}
  (CBC ignores OBJSENSE; generated names make the solution file unambiguous to parse). The objective is
  recomputed from x in the caller's own sense.
- Columns in no row are fixed at their best value before CBC sees them (CBC 2.10 mishandles free empty
  columns with a cost, see `settle_empty_columns`), and "infeasible" on a MIP whose LP relaxation is
  unbounded is double-checked with a feasibility solve.
- x is read from CBC's binary solution file (full precision); the text one gives the status.
- Warm start: CBC's MIP-start file (`-mips`), partial starts allowed (CBC completes them by an LP).
- If the x CBC writes is infeasible or disagrees with the objective in its log (CBC 2.10.3's MIP
  preprocessing sometimes postsolves wrongly), the model is solved again without preprocessing; in the
  worst case a solve takes twice time_limit_s.
- Bound: parsed from CBC's log ("best possible" or "Lower bound:"), which CBC prints with only ~6
  significant digits; it is clipped so that it never lies beyond the incumbent.
- The log is captured for parsing; with verbose=True it is printed after the run (not streamed).
- threads > 1 is passed as 100 + threads, CBC's "deterministic parallel" mode, so that runs repeat.
- seed 0 keeps CBC's fixed default seed (CBC's own 0 would mean "seed from the clock").
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mlopt.solvers.base import (
    Availability,
    Outcome,
    SolveOptions,
    Solver,
    StartArrays,
    Status,
    classify_unbounded_or_infeasible,
    is_feasible,
)
from mlopt.solvers.model import MatrixForm
from mlopt.solvers.mps import as_min_form, write_mps

# Extra wall time granted beyond time_limit_s before the subprocess is killed (reading, presolve, output).
KILL_GRACE_S = 30.0

_VERSION_RE = re.compile(r"Version:\s*(\S+)")
_PARTIAL_SEARCH_RE = re.compile(r"Partial search - best objective \S+ \(best possible ([^)\s]+)\)")
_LOWER_BOUND_RE = re.compile(r"^Lower bound:\s*(\S+)", re.MULTILINE)
_LOG_OBJECTIVE_RE = re.compile(r"^Objective value:\s*(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class CbcRun:
    status_line: str  # first line of the solution file, e.g. "Optimal - objective value 3.0"
    x: np.ndarray
    log: str

    @property
    def claims_solution(self) -> bool:
        line = self.status_line
        return line.startswith("Optimal") or (line.startswith("Stopped") and "no integer solution" not in line)


def find_cbc() -> str | None:
    """Path of a runnable CBC binary: pulp's bundled one, else a `cbc` on PATH (pulp[cbc] / cbcbox)."""
    try:
        from pulp.apis import coin_api  # lazy: a missing or broken pulp means no bundled CBC, not an import error
    except Exception:  # noqa: BLE001 - pulp missing or broken: no CBC from it
        coin_api = None
    candidates = []
    if coin_api is not None:
        # Class attribute, read without instantiating PULP_CBC_CMD (whose constructor warns it is deprecated).
        bundled = getattr(getattr(coin_api, "PULP_CBC_CMD", None), "pulp_cbc_path", None)
        if bundled:
            candidates.append(os.path.normpath(bundled))
    on_path = shutil.which("cbc")
    if on_path:
        candidates.append(on_path)
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def _cbc_form(form: MatrixForm) -> MatrixForm:
    return replace(
        as_min_form(form),
        col_names=tuple(f"C{j}" for j in range(form.num_vars)),
        row_names=tuple(f"R{i}" for i in range(form.num_constraints)),
        name="mlopt",
    )


def settle_empty_columns(form: MatrixForm) -> tuple[MatrixForm, bool]:
    """Fix each column that appears in no row at its best value; True if one of them is unbounded.

    CBC 2.10's LP solver answers "optimal" for a free column with a cost and no matrix entries (it never
    prices such a column in), which also makes CBC call some unbounded MIPs infeasible. The best value of
    an empty column depends only on its own cost and bounds, so it is settled here instead.
    """
    empty = np.diff(form.A.indptr) == 0
    if not empty.any():
        return form, False
    cost = as_min_form(form).c
    lo = np.where(form.integrality, np.ceil(form.col_lb), form.col_lb)
    hi = np.where(form.integrality, np.floor(form.col_ub), form.col_ub)
    best = np.where(cost > 0, lo, np.where(cost < 0, hi, np.clip(0.0, lo, hi)))
    if np.any(empty & np.isinf(best)):
        return form, True
    settle = empty & (lo <= hi)  # an empty integer column with no integer in its bounds stays for CBC to reject
    col_lb, col_ub = np.where(settle, best, form.col_lb), np.where(settle, best, form.col_ub)
    col_lb.setflags(write=False)
    col_ub.setflags(write=False)
    return replace(form, col_lb=col_lb, col_ub=col_ub), False


def _write_mipstart(path: Path, start: tuple[np.ndarray, np.ndarray]) -> None:
    # Format: a status line CBC ignores, then "index name value" per variable (names are what CBC uses).
    idx, val = start
    lines = ["Stopped on time - objective value 0"]
    lines += [f"{k} C{j} {float(v)!r}" for k, (j, v) in enumerate(zip(idx.tolist(), val.tolist()))]
    path.write_text("\n".join(lines) + "\n")


def _option_args(options: SolveOptions) -> list[str]:
    args = ["-ratioGap", repr(float(options.mip_gap))]
    if options.time_limit_s is not None:
        args += ["-timeMode", "elapsed", "-sec", repr(float(options.time_limit_s))]
    if options.node_limit is not None:
        args += ["-maxNodes", str(int(options.node_limit))]
    if options.threads > 1:
        args += ["-threads", str(100 + options.threads)]
    if options.seed > 0:
        args += ["-randomCbcSeed", str(options.seed), "-randomSeed", str(options.seed)]
    return args


def parse_solution_file(text: str, num_vars: int) -> tuple[str, np.ndarray]:
    """(status line, x) from a CBC `-printingOptions all` solution file written for C{j}/R{i} names."""
    lines = text.splitlines()
    x = np.zeros(num_vars)
    for line in lines[1:]:
        tokens = line.split()
        if tokens and tokens[0] == "**":  # CBC marks infeasible entries with a leading "**"
            tokens = tokens[1:]
        if len(tokens) >= 3 and tokens[1].startswith("C"):
            x[int(tokens[1][1:])] = float(tokens[2])
    return (lines[0].strip() if lines else ""), x


def parse_binary_solution(data: bytes, num_rows: int, num_vars: int) -> np.ndarray | None:
    """Full-precision x from CBC's `-saveSolution` file, or None if it does not fit the model.
    Layout: int32 rows, int32 columns, float64 objective, row activities, row duals, column values,
    reduced costs (native byte order)."""
    header = np.frombuffer(data[:8], dtype=np.int32) if len(data) >= 8 else np.zeros(0)
    values = np.frombuffer(data[8:], dtype=np.float64) if (len(data) - 8) % 8 == 0 else np.zeros(0)
    if header.tolist() != [num_rows, num_vars] or values.size != 1 + 2 * num_rows + 2 * num_vars:
        return None
    start = 1 + 2 * num_rows
    return values[start : start + num_vars].copy()


def _significant_digits(text: str) -> int:
    return len(re.sub(r"[eE].*$", "", text).replace("-", "").replace(".", "").lstrip("0"))


def parse_bound(log: str) -> float | None:
    """CBC's final best bound (of the min form) from its log, or None. CBC prints it twice, rounded two
    ways ("Lower bound:" with 3 decimals, "best possible" with %g); the more precise text wins."""
    texts = _LOWER_BOUND_RE.findall(log)[-1:] + _PARTIAL_SEARCH_RE.findall(log)[-1:]
    values = []
    for text in texts:
        try:
            values.append((_significant_digits(text), float(text)))
        except ValueError:
            continue
    return max(values)[1] if values else None


def _bound_in_caller_sense(form: MatrixForm, min_bound: float | None, min_objective: float) -> float | None:
    if min_bound is None or math.isnan(min_bound):
        return None
    min_bound = min(min_bound, min_objective)  # undo log rounding: a lower bound never exceeds the incumbent
    sign = -1.0 if form.sense == "max" else 1.0
    return sign * min_bound + form.constant


def parse_log_objective(log: str) -> float | None:
    """The objective CBC reports in its final "Result" block (of the min form it was given), or None."""
    found = _LOG_OBJECTIVE_RE.findall(log)
    try:
        return float(found[-1]) if found else None
    except ValueError:
        return None


def solution_matches_log(form: MatrixForm, x: np.ndarray, log: str) -> bool:
    """Whether the x CBC wrote is feasible and has the objective its log reports."""
    if not is_feasible(form, x):
        return False
    reported = parse_log_objective(log)
    if reported is None:
        return True
    actual = float(as_min_form(form).c @ x)
    return abs(actual - reported) <= 1e-6 * max(1.0, abs(reported))


def _stopped_reason(status_line: str) -> str:
    return status_line.split(" - ")[0].removeprefix("Stopped on ").split(" (")[0].strip() or "unknown"


class CbcSolver(Solver):
    name = "cbc"

    def __init__(self) -> None:
        self._version: str | None = None  # asking costs a subprocess: once per instance

    def available(self) -> Availability:
        path = find_cbc()
        if path is None:
            return Availability(False, "no CBC binary: pulp's bundled cbc not found and no cbc on PATH")
        return Availability(True, path)

    def version(self) -> str:
        if self._version is None:
            path = find_cbc()
            if path is None:
                return "unavailable"
            out = subprocess.run([path, "-quit"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
            found = _VERSION_RE.search(out.stdout)
            self._version = found.group(1) if found else "unknown"
        return self._version

    def _solve(self, form: MatrixForm, options: SolveOptions, start: StartArrays) -> Outcome:
        settled, unbounded_column = settle_empty_columns(form)
        if unbounded_column:
            return classify_unbounded_or_infeasible(self, form, options)
        run = self._run(settled, options, start, preprocess=True)
        if isinstance(run, Outcome):
            return run
        outcome = self._outcome(form, options, run)
        if run.claims_solution and not solution_matches_log(form, run.x, run.log):
            # CBC 2.10.3's MIP preprocessing sometimes postsolves to a different, worse (or infeasible) x than
            # the one its log reports; solving without preprocessing gives the right one.
            rerun = self._run(settled, options, start, preprocess=False)
            if isinstance(rerun, Outcome):
                return rerun
            outcome = self._outcome(form, options, rerun)
            note = "re-solved without CBC preprocessing (its postsolved solution disagreed with its log)"
            outcome = replace(outcome, message="; ".join(filter(None, [outcome.message, note])))
        return outcome

    def _run(self, form: MatrixForm, options: SolveOptions, start: StartArrays, preprocess: bool) -> CbcRun | Outcome:
        """Run the CBC binary on `form`; an Outcome (ERROR) if it did not produce a solution file."""
        with tempfile.TemporaryDirectory(prefix="mlopt-cbc-") as tmp:
            folder = Path(tmp)
            mps, sol, mst, binary = (folder / name for name in ("model.mps", "model.sol", "start.mst", "x.bin"))
            write_mps(_cbc_form(form), mps)
            args = [str(find_cbc()), str(mps), *_option_args(options)]
            if not preprocess:
                args += ["-preprocess", "off"]
            if start is not None and start[0].size:
                _write_mipstart(mst, start)
                args += ["-mips", str(mst)]
            # -solution: text with the status line (x printed to 8 digits); -saveSolution: x in full precision.
            args += ["-solve", "-printingOptions", "all", "-solution", str(sol), "-saveSolution", str(binary)]
            timeout = None if options.time_limit_s is None else options.time_limit_s + KILL_GRACE_S
            try:
                proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=timeout, cwd=tmp)
            except subprocess.TimeoutExpired:
                message = f"cbc did not stop within time_limit + {KILL_GRACE_S:.0f} s; killed"
                return Outcome(Status.ERROR, message=message)
            log = proc.stdout + proc.stderr
            if options.verbose:
                sys.stdout.write(log)
            if proc.returncode != 0 or not sol.exists():
                tail = " | ".join(log.strip().splitlines()[-3:])
                return Outcome(Status.ERROR, message=f"cbc exit code {proc.returncode}: {tail}")
            status_line, x = parse_solution_file(sol.read_text(), form.num_vars)
            if binary.exists():
                precise = parse_binary_solution(binary.read_bytes(), form.num_constraints, form.num_vars)
                x = x if precise is None else precise
        return CbcRun(status_line, x, log)

    def _relaxation_unbounded(self, form: MatrixForm, options: SolveOptions) -> bool:
        relaxation = replace(form, integrality=np.zeros(form.num_vars, dtype=bool))
        return self._solve(relaxation, options, None).status is Status.UNBOUNDED

    def _outcome(self, form: MatrixForm, options: SolveOptions, run: CbcRun) -> Outcome:
        status_line, x, log = run.status_line, run.x, run.log
        min_objective = float(as_min_form(form).c @ x)
        if status_line.startswith("Optimal"):
            bound = _bound_in_caller_sense(form, parse_bound(log), min_objective) if form.is_mip else None
            objective = float(form.c @ x + form.constant)
            return Outcome(Status.OPTIMAL, x=x, best_bound=objective if bound is None else bound)
        if status_line.startswith(("Infeasible", "Integer infeasible")):
            if form.is_mip and self._relaxation_unbounded(form, options):
                # CBC 2.10 calls some unbounded MIPs (free integer columns) infeasible: decide it ourselves.
                return classify_unbounded_or_infeasible(self, form, options)
            return Outcome(Status.INFEASIBLE, message="infeasible")
        if status_line.startswith("Unbounded"):
            if form.is_mip:  # an unbounded relaxation leaves the MIP unbounded *or* infeasible
                return classify_unbounded_or_infeasible(self, form, options)
            return Outcome(Status.UNBOUNDED, message="unbounded")
        if status_line.startswith("Stopped"):
            reason = _stopped_reason(status_line)
            if "no integer solution" in status_line or not is_feasible(form, x):
                status = Status.TIME_LIMIT_NO_SOLUTION if reason == "time" else Status.ERROR
                return Outcome(status, message=f"cbc stopped ({reason}) without a feasible solution")
            bound = _bound_in_caller_sense(form, parse_bound(log), min_objective)
            message = f"cbc stopped ({reason}) with a feasible solution"
            return Outcome(Status.FEASIBLE, x=x, best_bound=bound, message=message)
        return Outcome(Status.ERROR, message=f"cbc: unrecognised status line {status_line!r}")

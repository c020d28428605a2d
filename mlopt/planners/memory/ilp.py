"""MONeT's 0-1 ILP (thesis chapter 4, eq. 4.1-4.16) and its checkpoint-only (Checkmate-style) restriction.

`solve_memory_ilp(problem, budget, options, joint)` builds the MILP for `MemoryProblem` under a memory
budget M, solves it (HiGHS by default) and decodes the best solution into a `Schedule`. Symbols are the
thesis's (table 4.1), with the stage indexing of problem.py: stage k enters with S^k (s_j^k), recomputes
r^k, runs backward_k, and leaves S^{k-1} (s_j^{k-1}, the stage's `keep`).

Variables (binary unless said):
  s_j^N            forward store (final outputs are in S^N without a choice)
  delta_{i,l}      forward implementation (sum_l = 1; = s_i^N for nodes only computed when stored)
  s_j^{k-1}        kept after stage k
  r_i^k            recompute forward_i before backward_k
  delta^k_{i,l}    recompute implementation (sum_l = r_i^k); q_i^k = sum of its in-place ones (4.10/4.11;
                   p_j^k is not a column: "x_j recomputed and not yet overwritten" is written as pairwise
                   rows q_t^k + r_u^k <= 1 for the later readers u of x_j)
  delta_hat_{k,l}  backward implementation (sum_l = 1)
  sigma_{k,l,j}    = delta_hat_{k,l} * s_j^{k-1}, w_j^k = s_j^k * (x_j needed at backward_k) (4.3.4;
                   continuous, only the lower side y >= a + b - 1 is needed because they appear only with
                   positive coefficients in <= memory rows)
  rho_k, o_j^k, F^k continuous: rho_k = max_i r_i^k (the stage recomputes), o_j^k a max, F^k the live
                   bytes below the window (one column instead of the same long sum in every row)

Memory rows, all <= M with the constants moved right (4.16), in bytes scaled by a power of two:
  (4.1)  forward_i: const + |L_i| + sum_{j<i, j not in L_i} |x_j| s_j^N + sum_l (|x_i| or 0 in place +
         c_i^l) delta_{i,l};
  (4.12) backward_k: const + |L_hat_k| + |y_k| + sum_l c_hat_k^l delta_hat_{k,l} + |S^{k-1} u D_k^l|
         (the union through sigma);
  (4.13)/(4.14) recomputation of i before backward_k, with the upper-bounded local set Lbar_i^k (values
         below i read by some candidate recomputation u >= i, all assumed to run) counted as r_i^k |Lbar|;
         other values below i count when kept or needed by backward_k, values above i when they entered
         the stage (and, greedy freeing, are still needed). Constants that hold through the whole
         recomputation phase (const, |L_hat_k|) are multiplied by rho_k, so rows bind only in stages that
         recompute.
Checkpoint rows (4.7) r_i^k <= s_j^k + r_j^k for j in N_i, s_j^{k-1} <= s_j^k + r_j^k, r_m^k <= r_c^k for
an intermediate m of c; (4.8) delta_hat_{k,l} <= s_j^k + r_j^k for j in D_k^l; objective (4.9).

The ILP is an upper bound of the replay (replay.py): every memory row over-approximates the live bytes
at one operator call (forward_i, a recomputation, backward_k), and rows are tightened by the drift that
rounding binaries within the solver's tolerance can add, so any decoded schedule replays within the
budget; its objective (4.9) is exactly the schedule's compute time.

Model reductions (counted in `IlpOutcome.stats["reductions"]`):
  (a) only stages whose backward reads forward values ("active" stages) recompute or keep values by
      choice; the others keep S^{k-1} = S^k less the values no later stage needs (dropping at the previous
      active stage is never worse) and get one memory row per implementation choice (equal rows: only
      the tightest is kept);
  (b) r_i^k exists only for i in a window of `window` nodes ending at the highest value stage k (or a later
      stage) needs, and only where x_i is useful (needed at stage <= k, or read by a useful candidate);
      s_j^{k-1} is a variable only at stages that touch j (j needed there, or a recompute candidate);
      elsewhere it is tied to s_j^k (to s_j^N before j is first touched): keeping a value through stages
      that never touch it and dropping it at the last touching stage is never worse;
  (c) memory rows whose largest possible left-hand side is within the budget are dropped, and the
      between-recomputation rows (4.15) are not built: the replay measures memory only at operator calls;
  (d) forced variables are fixed: s_j^{k-1} = 0 once x_j is needed by no later stage (x_j for j > k, and
      any value after its last use), s_j^N = 0 for values no stage needs, r_i^k = 0 when an input can
      never be live, r_i^k + s_i^k <= 1 unless i creates intermediates (recomputing a live value is only
      useful to bring them), illegal in-place variants fixed to 0;
  (e) intermediates of at most TINY_FRACTION of the budget that cost no forward time (batch-norm
      statistics) are stored and never recomputed.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mlopt.planners.memory import neighbourhood
from mlopt.planners.memory.problem import MemoryProblem
from mlopt.planners.memory.schedule import BackwardStage, ForwardStep, Schedule
from mlopt.planners.options import PlannerOptions
from mlopt.solvers import Model, SolveResult, Status, is_feasible, max_violation, resolve_solver
from mlopt.solvers.base import relative_gap

# Recomputation window (reduction b): at most this many nodes, ending at the stage's highest needed value.
DEFAULT_WINDOW = 16
# With a time limit, a solve that proves optimality early is repeated with a window this much larger
# (while at least max(MIN_PHASE_S, MIN_PHASE_SHARE * limit) seconds are left).
WINDOW_GROWTH = 1.5
MIN_PHASE_S = 5.0
MIN_PHASE_SHARE = 0.1
# ... and smaller when the model would get more rows than this.
DEFAULT_MAX_ROWS = 200_000
# Memory rows whose left-hand side has at most this many nonzeros below the window are written out in
# full; longer ones go through the stage's aggregate F^k.
AGGREGATE_MIN_TERMS = 8
# Reduction (e): an intermediate value no larger than this fraction of the budget whose forward pass
# costs nothing (batch norm's saved statistics) is stored in the forward pass and never recomputed.
TINY_FRACTION = 1e-5
# Liveness of the values S^k holds on entry to a stage, while its recomputations run. "greedy" (replay.py):
# a value is freed on entry, or after the last recomputation reading it, unless S^{k-1} or backward_k
# needs it. "stage": every entering value counts until backward_k, a looser upper bound.
ENTERING_LIVENESS = "greedy"

ZERO, ONE = -1, -2  # constant bits; a bit >= 0 is a column index


@dataclass(frozen=True)
class IlpOutcome:
    schedule: Schedule | None  # decoded from the solver's best solution (None if none found)
    result: SolveResult  # status, objective (= the schedule's compute_us), best_bound, gap
    stats: dict  # rows, cols, binaries, nonzeros, reductions, build_s, solve_s, warm start, ...


class _Lin:
    """Affine expression const + sum coef * x[col]."""

    __slots__ = ("const", "terms")

    def __init__(self, const: float = 0.0):
        self.const = float(const)
        self.terms: dict[int, float] = {}

    def bit(self, bit: int, coef: float = 1.0) -> "_Lin":
        if bit == ZERO or coef == 0:
            return self
        if bit == ONE:
            self.const += coef
        else:
            self.terms[bit] = self.terms.get(bit, 0.0) + coef
        return self

    def lin(self, other: "_Lin", scale: float = 1.0) -> "_Lin":
        self.const += scale * other.const
        for col, coef in other.terms.items():
            self.terms[col] = self.terms.get(col, 0.0) + scale * coef
        return self

    def copy(self) -> "_Lin":
        out = _Lin(self.const)
        out.terms = dict(self.terms)
        return out


class _Builder:
    def __init__(self, problem: MemoryProblem, budget: int, joint: bool, window: int | None, cap_rows: bool):
        self.p = problem
        self.M = int(budget)
        # Memory rows are written in units of U = 2^s bytes (exact for integers), U chosen so that the
        # budget is 2^15..2^16 units: byte counts near 1e9 otherwise trouble the solver's scaling.
        self.U = float(2 ** max(0, int(math.floor(math.log2(max(self.M, 1)))) - 15))
        self.joint = joint
        self.model = Model("monet" if joint else "checkpoint_only")
        self.meaning: list[tuple] = []  # per column
        self.col_ub: list[float] = []
        self.aux_defs: dict[int, list[_Lin]] = {}  # aux column -> expressions it is >= (value = max(0, ...))
        self.aux_order: list[int] = []
        self.rows_by_eq: dict[str, int] = defaultdict(int)
        self.red: dict[str, int] = defaultdict(int)
        self.notes: list[str] = []
        self.obj = _Lin()
        self.const_violated: list[str] = []
        self.window_arg = window
        self.cap_rows = cap_rows
        self.ctx = "fwd"
        self._prepare()

    # -- columns and rows ---------------------------------------------------------------------------

    def _binary(self, meaning: tuple) -> int:
        col = self.model.add_binary(None)
        self.meaning.append(meaning)
        self.col_ub.append(1.0)
        return col

    def _aux(self, meaning: tuple, exprs: list[_Lin], eq: str) -> int:
        """Continuous aux >= every expression in exprs (and >= 0); its least value is their max."""
        ub = max([0.0] + [self._max(e) for e in exprs])
        col = self.model.add_var(None, 0.0, ub)
        self.meaning.append(meaning)
        self.col_ub.append(ub)
        self.aux_defs[col] = exprs
        self.aux_order.append(col)
        for e in exprs:
            row = e.copy().bit(col, -1.0)
            self._le(row, 0.0, eq, memory=False)
        return col

    def _max(self, e: _Lin) -> float:
        return e.const + sum(c * self.col_ub[col] for col, c in e.terms.items() if c > 0)

    def _le(self, e: _Lin, rhs: float, eq: str, memory: bool = False) -> None:
        terms = {c: v for c, v in e.terms.items() if v != 0}
        bound = rhs - e.const
        if not terms:
            if 0.0 > bound + 1e-9:
                self.const_violated.append(eq)
                self.model.add_le([], [], bound)  # an empty row that cannot hold: the model is infeasible
                self.rows_by_eq[eq] += 1
            else:
                self.red["constant_rows_dropped"] += 1
            return
        if memory and self._max(e) <= rhs + 1e-9:
            self.red["dominated_memory_rows_dropped"] += 1
            return
        if memory:
            # Bytes are integers, so activity <= bound + 1/2 byte is the same row for integral columns;
            # less the drift that rounding binaries within the solver's integrality tolerance (1e-6) can
            # add, so a rounded solution still satisfies the row in exact bytes.
            drift = 1e-6 * sum(abs(v) for v in terms.values()) + 1e-7 * self.U
            bound = (bound + 0.5 - drift) / self.U
            terms = {c: v / self.U for c, v in terms.items()}
        self.model.add_le(list(terms), list(terms.values()), bound, self._name(eq))
        self.rows_by_eq[eq] += 1

    def _name(self, eq: str) -> str:
        """Row name: equation tag, stage and node it is about (MPS dumps stay readable)."""
        return f"e{eq}[{self.ctx}]#{self.model.num_constraints}"

    def _eq(self, e: _Lin, rhs: float, eq: str) -> None:
        terms = {c: v for c, v in e.terms.items() if v != 0}
        bound = rhs - e.const
        if not terms:
            if abs(bound) > 1e-9:
                self.const_violated.append(eq)
                self.model.add_eq([], [], bound)
                self.rows_by_eq[eq] += 1
            return
        self.model.add_eq(list(terms), list(terms.values()), bound, self._name(eq))
        self.rows_by_eq[eq] += 1

    # -- problem analysis ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Problem analysis: sizes, users, implementation sets, active stages, pinned values, windows and
        recomputation candidates, need/touch sets (reductions a-e)."""
        p = self.p
        n = p.n
        nodes = p.nodes
        self._check_nodes()
        self.n = n
        self.size = [int(node.out_bytes) for node in nodes]
        self.users = p.forward_users()
        self.finals = set(p.final_outputs)
        self.dead = [not self.users[j] and j not in self.finals for j in range(n)]
        self.last_user = [max(u) if u else -1 for u in self.users]
        # J_i and J_hat_k: every implementation for MONeT, the default only for checkpoint-only.
        self.fimpl = [list(range(len(node.forward))) if self.joint else [0] for node in nodes]
        self.bimpl = [list(range(len(node.backward))) if self.joint else [0] for node in nodes]
        for k, node in enumerate(nodes):
            if not node.backward:
                self.bimpl[k] = []
        self.deps = [{l: tuple(sorted(set(nodes[k].backward[l].deps))) for l in self.bimpl[k]} for k in range(n)]
        self.active = [k for k in range(n - 1, -1, -1) if any(self.deps[k][l] for l in self.bimpl[k])]
        # In-place legality in the forward pass (static part): x_j is read by no later node, is no final output.
        self.fwd_inplace_ok = {}
        for i, node in enumerate(nodes):
            for l in self.fimpl[i]:
                if node.forward[l].inplace:
                    j = node.inplace_input
                    ok = j is not None and j in node.inputs and j not in self.finals and self.last_user[j] <= i
                    self.fwd_inplace_ok[(i, l)] = ok
                    if not ok:
                        self.red["illegal_inplace_fixed"] += 1

        # Reduction (e): tiny free intermediates that some backward reads are pinned (stored, kept until
        # their last use, never recomputed).
        in_deps = {j for k in range(n) for l in self.bimpl[k] for j in self.deps[k][l]}
        self.pinned = {j for j in range(n) if self.dead[j] and j in in_deps
                       and self.size[j] <= TINY_FRACTION * self.M
                       and all(f.compute_us == 0 for f in nodes[j].forward)}
        self.red["tiny_free_values_pinned"] = len(self.pinned)
        # Windows and useful recomputation candidates per active stage (reductions a, b, d).
        n_active = len(self.active)
        maxdep = {k: max(j for l in self.bimpl[k] for j in self.deps[k][l]) for k in self.active}
        hi: dict[int, int] = {}
        running = -1
        for k in sorted(self.active):  # ascending: stages that run at or after k
            running = max(running, maxdep[k], k)
            hi[k] = running
        self.full_window = max(hi.values(), default=-1) + 1  # a window this wide restricts nothing
        self.window = self._choose_window(hi)
        self.hi = hi
        self._recompute_candidates(hi)
        self.red["stages_merged_no_dependencies"] = n - n_active
        self._need_and_touch()

    def _check_nodes(self) -> None:
        """ValueError unless nodes are numbered in order, read earlier nodes and have a forward."""
        n = self.p.n
        for pos, node in enumerate(self.p.nodes):
            if node.index != pos:
                raise ValueError(f"node at position {pos} has index {node.index}")
            if any(not 0 <= j < pos for j in node.inputs):
                raise ValueError(f"node {pos}: inputs must be earlier nodes, got {node.inputs}")
            if not node.forward:
                raise ValueError(f"node {pos} has no forward implementation")
            for b in node.backward:
                if any(not 0 <= j < n for j in b.deps):
                    raise ValueError(f"node {pos}: backward {b.name} depends on a node outside [0, {n})")
            if node.intermediate_of is not None and not 0 <= node.intermediate_of < n:
                raise ValueError(f"node {pos}: intermediate_of {node.intermediate_of} outside [0, {n})")

    def _recompute_candidates(self, hi: dict[int, int]) -> None:
        """Per active stage k: the window's lowest node lo[k] and the useful recomputation candidates
        cand[k] (needed at a stage <= k, or read by a useful candidate; reductions b, d)."""
        nodes = self.p.nodes
        needed_from: dict[int, set[int]] = {}
        acc: set[int] = set()
        for k in sorted(self.active):
            for l in self.bimpl[k]:
                acc.update(self.deps[k][l])
            needed_from[k] = set(acc)
        self.cand: dict[int, list[int]] = {}
        self.lo: dict[int, int] = {}
        for k in self.active:
            lo = max(0, hi[k] - self.window + 1)
            self.lo[k] = lo
            useful: set[int] = set()
            for i in range(hi[k], lo - 1, -1):
                if (i in self.finals and not self._intermediates_of(i)) or i in self.pinned:
                    continue
                if i in needed_from[k] or any(u in useful for u in self.users[i]) or any(
                        m in useful for m in self._intermediates_of(i)):
                    useful.add(i)
            for m in list(useful):
                c = nodes[m].intermediate_of
                if c is not None and c not in useful:
                    useful.discard(m)
            self.cand[k] = sorted(useful)
            self.red["recompute_vars_not_created_window"] += max(0, hi[k] + 1 - len(self.cand[k]))

    def _need_and_touch(self) -> None:
        """need(j): active stages where x_j must be live (a dependency, or an input of a candidate);
        touch(j): need(j) plus the stages where j is itself a candidate; min_need(j) the first."""
        n, nodes = self.n, self.p.nodes
        self.need: list[set[int]] = [set() for _ in range(n)]
        self.touch: list[set[int]] = [set() for _ in range(n)]
        for k in self.active:
            for l in self.bimpl[k]:
                for j in self.deps[k][l]:
                    self.need[j].add(k)
            for u in self.cand[k]:
                self.touch[u].add(k)
                for j in nodes[u].inputs:
                    self.need[j].add(k)
        for j in range(n):
            self.touch[j] |= self.need[j]
        self.min_need = [min(s) if s else math.inf for s in self.need]

    def window_for(self, schedule: Schedule) -> int:
        """The least window whose model has a recomputation variable for every recomputation of `schedule`
        (those at merged stages counted at the next active stage, as `encode` moves them); 1 if none."""
        active = set(self.active)
        need, moved = 1, []
        for stage in sorted(schedule.backward, key=lambda b: -b.node):
            rec = moved + [i for i, _ in stage.recompute]
            if stage.node not in active:
                moved = rec
                continue
            moved = []
            for i in rec:
                if i not in self.pinned:
                    need = max(need, self.hi[stage.node] - i + 1)
        return need

    def _out_extra(self, i: int, impl) -> int:
        """New bytes forward_i allocates for its output: |x_i|, in place max(0, |x_i| - |x_j|)."""
        if not impl.inplace:
            return self.size[i]
        return max(0, self.size[i] - self.size[self.p.nodes[i].inplace_input])

    def _intermediates_of(self, c: int) -> list[int]:
        if not hasattr(self, "_inter"):
            self._inter: dict[int, list[int]] = defaultdict(list)
            for node in self.p.nodes:
                if node.intermediate_of is not None:
                    self._inter[node.intermediate_of].append(node.index)
        return self._inter.get(c, [])

    def _choose_window(self, hi: dict[int, int]) -> int:
        w = DEFAULT_WINDOW if self.window_arg is None else int(self.window_arg)
        if w < 1:
            raise ValueError(f"window must be >= 1, got {w}")
        w = min(w, max(1, self.full_window))
        if self.cap_rows:
            # Rough row count: per active stage and candidate, its memory row and ~5 logic rows.
            while w > 4 and 6 * w * len(hi) + 2 * self.n > DEFAULT_MAX_ROWS:
                w = int(w * 0.8)
                self.red["window_capped_for_rows"] = w
        return w

    # -- the model ----------------------------------------------------------------------------------

    def build(self) -> None:
        """The whole model: forward pass (store and implementation choices, 4.1 rows), then the backward
        stages in execution order. Columns and rows are numbered as they are created: keep this order."""
        self._forward_store_bits()
        self._forward_impl_bits()
        self._add_eq4_1_forward_peaks()
        self._backward_stages()

    def _forward_store_bits(self) -> None:
        """s_j^N (forward store): a column only when x_j is needed by some backward stage."""
        self.sN = [ZERO] * self.n
        for j in range(self.n):
            if j in self.finals:
                self.sN[j] = ONE
            elif j in self.pinned:
                self.sN[j] = ONE
            elif self.need[j]:
                self.sN[j] = self._binary(("sN", j))
            else:
                self.red["store_fixed_unneeded"] += 1

    def _forward_impl_bits(self) -> None:
        """delta_{i,l}: forward implementation (4.1-impl), its compute in the objective (4.9) and the forward
        in-place rows (4.10-fwd). Nodes nobody reads are computed only when stored."""
        nodes = self.p.nodes
        self.dfwd: list[dict[int, int]] = []
        for i, node in enumerate(nodes):
            self.ctx = f"i={i}"
            run = self.sN[i] if self.dead[i] else ONE
            legal = [l for l in self.fimpl[i] if self.fwd_inplace_ok.get((i, l), True)
                     and not node.forward[l].reuses_intermediates]  # reuse: recomputation only
            bits: dict[int, int] = {}
            if run == ZERO or not legal:
                bits = {l: ZERO for l in self.fimpl[i]}
                if run != ZERO and not legal:
                    self.notes.append(f"node {i}: no legal forward implementation")
                    self._eq(_Lin(), 1.0, "4.1-impl")  # sum_l delta_{i,l} = 1 cannot hold: infeasible
            elif len(legal) == 1:
                bits = {l: ZERO for l in self.fimpl[i]}
                bits[legal[0]] = run
            else:
                for l in self.fimpl[i]:
                    bits[l] = self._binary(("d", i, l)) if l in legal else ZERO
                e = _Lin()
                for l in legal:
                    e.bit(bits[l])
                self._eq(e.bit(run, -1.0), 0.0, "4.1-impl")  # sum_l delta_{i,l} = 1 (= s_i^N if unread)
            self.dfwd.append(bits)
            for l, bit in bits.items():
                self.obj.bit(bit, nodes[i].forward[l].compute_us)
            # In-place in the forward pass: the overwritten x_j must not be stored (4.10, forward form).
            for l, bit in bits.items():
                if nodes[i].forward[l].inplace and bit != ZERO:
                    j = node.inplace_input
                    self._le(_Lin().bit(bit).bit(self.sN[j]), 1.0, "4.10-fwd")

    def _add_eq4_1_forward_peaks(self) -> None:
        """(4.1) forward peak of node i: const + |L_i| + stored earlier values + |x_i| (0 in place) + c_i."""
        for i, node in enumerate(self.p.nodes):
            self.ctx = f"i={i}"
            run = self.sN[i] if self.dead[i] else ONE
            if run == ZERO:
                continue
            e = _Lin()
            fixed = 0
            for j in range(i):
                if self.last_user[j] >= i or j in self.finals:
                    fixed += self.size[j]  # L_i: read by forward_i or a later node (or a final output)
                else:
                    e.bit(self.sN[j], self.size[j])
            e.bit(run, fixed)
            for l, bit in self.dfwd[i].items():
                impl = node.forward[l]
                e.bit(bit, impl.workspace_bytes + self._out_extra(i, impl))
            self._le(e, self.M - self.p.constant_bytes, "4.1", memory=True)  # (4.1) m_i <= M (4.16)

    def _backward_stages(self) -> None:
        """Backward stages in execution order: active ones (_active_stage) and merged runs between them.
        cur[j]: membership of x_j in the set entering the next stage."""
        cur = list(self.sN)
        self.r: dict[int, dict[int, int]] = {}
        self.drec: dict[int, dict[int, dict[int, int]]] = {}
        self.dhat: dict[int, dict[int, int]] = {}
        self.keep: dict[int, list[int]] = {}  # stage -> membership bits of S^{k-1}
        self.enter: dict[int, list[int]] = {}
        active = set(self.active)
        # Non-active stages with a backward: rows grouped per run of stages between active ones.
        pending: dict[tuple, tuple[float, str]] = {}
        for k in range(self.n - 1, -1, -1):
            self.ctx = f"k={k}"
            if k not in active:
                cur = self._merged_stage(k, cur, pending)
                continue
            self._flush_pending(pending, cur)
            cur = self._active_stage(k, cur)
        self._flush_pending(pending, cur)

    def _merged_stage(self, k: int, cur: list[int], pending: dict[tuple, tuple[float, str]]) -> list[int]:
        """Merged stage k: S^{k-1} = S^k, no recomputation; its (4.12) row per implementation choice is queued
        in pending (equal rows: only the tightest is kept). Returns the set entering the next stage."""
        node = self.p.nodes[k]
        self.enter[k] = cur
        # Values no later stage needs are dropped right away (4.7 with r = 0; reduction d).
        dropped = [j for j in range(self.n) if cur[j] != ZERO and self.min_need[j] >= k]
        if dropped:
            self._flush_pending(pending, cur)
            cur = list(cur)
            for j in dropped:
                cur[j] = ZERO
        self.keep[k] = cur
        if not self.bimpl[k]:
            return cur
        dh = self._dhat_bits(k)
        for l, bit in dh.items():
            self.obj.bit(bit, node.backward[l].compute_us)
        constant = self.p.constant_bytes + node.grad_live_bytes + node.y_bytes
        key = tuple(sorted((bit, node.backward[l].workspace_bytes) for l, bit in dh.items() if bit != ONE))
        base = max((node.backward[l].workspace_bytes for l, bit in dh.items() if bit == ONE), default=0)
        constant += base
        if key in pending:
            self.red["merged_stage_rows_dominated"] += 1
            if constant <= pending[key][0]:
                return cur
        pending[key] = (constant, "4.12")
        return cur

    def _flush_pending(self, pending: dict[tuple, tuple[float, str]], members: list[int]) -> None:
        """(4.12) rows of the queued merged stages (D_k empty), over the set `members` live through them."""
        for key, (constant, eq) in pending.items():
            e = _Lin()
            for j in range(self.n):
                e.bit(members[j], self.size[j])
            for bit, ws in key:
                e.bit(bit, ws)
            self._le(e, self.M - constant, eq, memory=True)  # (4.12) at a merged stage: D_k empty
        pending.clear()

    def _dhat_bits(self, k: int) -> dict[int, int]:
        if k in self.dhat:
            return self.dhat[k]
        ls = self.bimpl[k]
        if len(ls) == 1:
            bits = {ls[0]: ONE}
        else:
            bits = {l: self._binary(("dh", k, l)) for l in ls}
            self._eq(_Lin().lin(self._sum(bits.values())), 1.0, "4.5-impl")  # sum_l delta_hat_{k,l} = 1
        self.dhat[k] = bits
        return bits

    @staticmethod
    def _sum(bits) -> _Lin:
        e = _Lin()
        for b in bits:
            e.bit(b)
        return e

    def _active_stage(self, k: int, E: list[int]) -> list[int]:
        """Columns and rows of active stage k entered with membership bits E; returns S^{k-1}'s bits."""
        self.ctx = f"k={k}"
        node = self.p.nodes[k]
        self.enter[k] = E
        dh = self._dhat_bits(k)
        for l, bit in dh.items():
            self.obj.bit(bit, node.backward[l].compute_us)
        # Blocks in a fixed order: columns and rows are numbered as they are created.
        r = self._recompute_bits(k, E)
        self.r[k] = r
        self._add_eq4_7_recompute_inputs(E, r)
        drec = self._recompute_impl_bits(k, E, r)
        self.drec[k] = drec
        K = self._keep_bits(k, E, r)
        self.keep[k] = K
        self._add_eq4_8_backward_deps(k, E, r, dh)
        dep_impls = self._dep_impls(k, dh)
        self._add_eq4_10_eq4_11_inplace_recompute(E, r, K, dh, drec, dep_impls)
        B = self._live_at_backward(k, K, dh, dep_impls)
        self._add_eq4_12_backward_peak(k, dh, B)
        if not r:
            return K
        self._add_eq4_13_eq4_14_recompute_peaks(k, E, r, drec, B)
        return K

    def _recompute_bits(self, k: int, E: list[int]) -> dict[int, int]:
        """r_i^k for useful candidates, with the (4.7-live) rows; fixed 0 where x_i is live on entry anyway,
        where an input can never be live, or (intermediates) where the creator is not recomputable
        (reduction d)."""
        nodes, cand = self.p.nodes, self.cand[k]
        # A live value is recomputed only to bring its intermediates (the replay frees the old copy on
        # entry); for any other node that is never better than dropping it at the last stage touching it.
        avail = {i for i in cand if E[i] != ONE or self._intermediates_of(i)}
        self.red["recompute_fixed_live_on_entry"] += len(cand) - len(avail)
        changed = True
        while changed:
            changed = False
            for i in sorted(avail):
                creator = nodes[i].intermediate_of
                if any(E[j] == ZERO and j not in avail for j in nodes[i].inputs) or (
                        creator is not None and creator not in avail):
                    avail.discard(i)
                    self.red["recompute_fixed_inputs_unavailable"] += 1
                    changed = True
        r: dict[int, int] = {}
        for i in sorted(avail):
            r[i] = self._binary(("r", k, i))
            if E[i] != ZERO and not self._intermediates_of(i):
                self._le(_Lin().bit(r[i]).bit(E[i]), 1.0, "4.7-live")  # no recomputation of a live value
                self.red["recompute_excluded_when_live_on_entry"] += 1
        return r

    def _add_eq4_7_recompute_inputs(self, E: list[int], r: dict[int, int]) -> None:
        """(4.7) recomputation needs its inputs stored or recomputed; intermediates only with their creator."""
        nodes = self.p.nodes
        for i in r:
            for j in nodes[i].inputs:
                if E[j] == ONE:
                    continue
                # (4.7) r_i <= s_j + r_j
                self._le(_Lin().bit(r[i]).bit(E[j], -1.0).bit(r.get(j, ZERO), -1.0), 0.0, "4.7")
            c = nodes[i].intermediate_of
            if c is not None:
                self._le(_Lin().bit(r[i]).bit(r[c], -1.0), 0.0, "4.7-intermediate")  # (4.7) r_m <= r_creator

    def _recompute_impl_bits(self, k: int, E: list[int], r: dict[int, int]) -> dict[int, dict[int, int]]:
        """delta^k_{i,l} with sum_l = r_i^k (4.9-impl), their compute in the objective (4.9), and the
        (4.7-reuse) rows of recomputations that reuse stored intermediates."""
        nodes = self.p.nodes
        drec: dict[int, dict[int, int]] = {}
        for i in r:
            ls = self.fimpl[i]
            legal = [l for l in ls if (not nodes[i].forward[l].inplace or nodes[i].inplace_input is not None)
                     and not (nodes[i].forward[l].reuses_intermediates
                              and any(E[m] == ZERO for m in self._intermediates_of(i)))]
            if len(legal) == 1:
                bits = {l: ZERO for l in ls}
                bits[legal[0]] = r[i]
            else:
                bits = {l: (self._binary(("dk", k, i, l)) if l in legal else ZERO) for l in ls}
                self._eq(self._sum(bits.values()).bit(r[i], -1.0), 0.0, "4.9-impl")
            drec[i] = bits
            for l, bit in bits.items():
                self.obj.bit(bit, nodes[i].forward[l].compute_us)
                if bit == ZERO or not nodes[i].forward[l].reuses_intermediates:
                    continue
                for m in self._intermediates_of(i):
                    # (4.7) a reusing recomputation reads x_m, which must have entered the stage ...
                    if E[m] != ONE:
                        self._le(_Lin().bit(bit).bit(E[m], -1.0), 0.0, "4.7-reuse")
                    # ... and is not produced again: r_m^k <= r_i^k - delta^k_{i,reuse}
                    if m in r:
                        self._le(_Lin().bit(r[m]).bit(bit).bit(r[i], -1.0), 0.0, "4.7-reuse")
        return drec

    def _keep_bits(self, k: int, E: list[int], r: dict[int, int]) -> list[int]:
        """s_j^{k-1}: kept after the stage (reductions b, d), with the (4.7-keep) rows."""
        K = [ZERO] * self.n
        for j in range(self.n):
            if j in self.pinned:
                K[j] = ONE if self.min_need[j] < k else ZERO
                continue
            if self.min_need[j] >= k:  # needed by no later stage
                if E[j] != ZERO or j in r:
                    self.red["keep_fixed_not_needed_later"] += 1
                continue
            if E[j] == ZERO and j not in r:
                continue
            if k not in self.touch[j]:
                K[j] = E[j]  # tied: a value is dropped at a stage that touches it, never in between
                self.red["keep_tied_untouched_stage"] += 1
                continue
            K[j] = self._binary(("K", k, j))
            # (4.7) only stored or recomputed values can be kept: s_j^{k-1} <= s_j^k + r_j^k
            self._le(_Lin().bit(K[j]).bit(E[j], -1.0).bit(r.get(j, ZERO), -1.0), 0.0, "4.7-keep")
        return K

    def _add_eq4_8_backward_deps(self, k: int, E: list[int], r: dict[int, int], dh: dict[int, int]) -> None:
        """(4.8) the chosen backward implementation's dependencies are stored or recomputed."""
        for l, bit in dh.items():
            for j in self.deps[k][l]:
                if E[j] == ONE:
                    continue
                self._le(_Lin().bit(bit).bit(E[j], -1.0).bit(r.get(j, ZERO), -1.0), 0.0, "4.8")  # (4.8)

    def _dep_impls(self, k: int, dh: dict[int, int]) -> dict[int, list[int]]:
        """x_j -> the backward implementations of stage k that read it (D_k^l)."""
        dep_impls: dict[int, list[int]] = defaultdict(list)
        for l in dh:
            for j in self.deps[k][l]:
                dep_impls[j].append(l)
        return dep_impls

    def _add_eq4_10_eq4_11_inplace_recompute(self, E: list[int], r: dict[int, int], K: list[int],
                                             dh: dict[int, int], drec: dict[int, dict[int, int]],
                                             dep_impls: dict[int, list[int]]) -> None:
        """(4.10)/(4.11) in-place recomputation q_t^k overwrites x_j: x_j is then not kept, not read by a
        later recomputation and not a dependency of backward_k; q_t^k <= r_t^k holds by construction."""
        nodes = self.p.nodes
        for t, bits in drec.items():
            q = _Lin()
            for l, bit in bits.items():
                if nodes[t].forward[l].inplace:
                    q.bit(bit)
            if not q.terms and q.const == 0:
                continue
            j = nodes[t].inplace_input
            if j not in nodes[t].inputs:  # the overwritten value must be live (4.11 with p_j^k)
                self._le(q.copy().bit(E[j], -1.0).bit(r.get(j, ZERO), -1.0), 0.0, "4.11")  # (4.11) q <= p_j
            self._le(q.copy().bit(K[j]), 1.0, "4.10")  # (4.10) s_j^{k-1} <= 1 - q_t^k
            for u in self.users[j]:
                if u > t and u in r:
                    self._le(q.copy().bit(r[u]), 1.0, "4.10")  # (4.10) p_j^k = 0 after q_t^k
            for l in dep_impls.get(j, []):
                self._le(q.copy().bit(dh[l]), 1.0, "4.10")  # (4.10)+(4.8): x_j gone, D_k^l cannot run

    def _live_at_backward(self, k: int, K: list[int], dh: dict[int, int],
                          dep_impls: dict[int, list[int]]) -> dict[int, _Lin]:
        """B_j^k: x_j live at backward_k = in S^{k-1} or in the chosen D_k^l (4.12, sigma = delta_hat * s,
        linearised by 4.3.4)."""
        n_impl = len(dh)
        B: dict[int, _Lin] = {}
        for j in range(self.n):
            ls = dep_impls.get(j, [])
            e = _Lin()
            if len(ls) == n_impl:
                e.const = 1.0
            elif not ls:
                e.bit(K[j])
            else:
                for l in ls:
                    e.bit(dh[l])
                for l in dh:
                    if l in ls:
                        continue
                    if K[j] == ZERO:
                        continue
                    if K[j] == ONE:
                        e.bit(dh[l])
                        continue
                    # (4.3.4) sigma_{k,l,j} >= delta_hat_{k,l} + s_j^{k-1} - 1
                    sigma = self._aux(("sigma", k, l, j), [_Lin(-1.0).bit(dh[l]).bit(K[j])], "4.3.4")
                    e.bit(sigma)
            B[j] = e
        return B

    def _add_eq4_12_backward_peak(self, k: int, dh: dict[int, int], B: dict[int, _Lin]) -> None:
        """(4.12) backward_k peak: const + |L_hat_k| + |y_k| + c_hat + |S^{k-1} u D_k^l| <= M (4.16).

        c_hat_k^l includes the temporaries the stage's backward kernels allocate beyond what they return
        (build.py: batch norm's input-sized one, measured or from the catalog), as the replay counts them."""
        node = self.p.nodes[k]
        e = _Lin()
        for l, bit in dh.items():
            e.bit(bit, node.backward[l].workspace_bytes)
        for j in range(self.n):
            e.lin(B[j], self.size[j])
        self._le(e, self.M - self.p.constant_bytes - node.grad_live_bytes - node.y_bytes, "4.12", memory=True)

    def _add_eq4_13_eq4_14_recompute_peaks(self, k: int, E: list[int], r: dict[int, int],
                                           drec: dict[int, dict[int, int]], B: dict[int, _Lin]) -> None:
        """(4.13)/(4.14) recomputation peak of forward_i before backward_k, with the upper-bounded local
        set Lbar_i^k (every later candidate assumed recomputed); constants times r_i^k. (4.15) rows are
        not built (reduction c).

        rho_k = max_i r_i^k: the stage recomputes something. The row constants that hold at every point of
        the recomputation phase (const, |L_hat_k|, values fixed live) are multiplied by rho_k, the
        operator's own ones (|x_i|, c_i, |Lbar_i^k|) by r_i^k / delta^k_{i,l} (as in 4.14), so a row
        only binds when its recomputation runs, or relaxes to a state the stage really passes through.
        """
        nodes, n, lo = self.p.nodes, self.n, self.lo[k]
        const, G = self.p.constant_bytes, nodes[k].grad_live_bytes
        live = _StageLiveness(self, k, E, r, drec, B)
        below_expr = self._below_window(k, lo, live)
        rho = self._aux(("rho", k), [_Lin().bit(r[i]) for i in sorted(r)], "4.14-any")
        enter_nz = [j for j in range(n) if E[j] != ZERO]
        reads_from: set[int] = set()  # inputs of candidates u >= i
        order = sorted(r, reverse=True)
        for i in order:
            self.ctx = f"k={k},i={i}"
            reads_from.update(nodes[i].inputs)
            lbar = sorted(j for j in reads_from if j < i)
            e = below_expr.copy()
            for l, bit in drec[i].items():
                impl = nodes[i].forward[l]
                e.bit(bit, impl.workspace_bytes + self._out_extra(i, impl))
            e.bit(r[i], sum(self.size[j] for j in lbar))
            lbar_set = set(lbar)
            for j in lbar:
                if j < lo:  # counted in F^k as live_j: replace it by the constant
                    e.lin(live.below(j), -self.size[j])
            for j in range(lo, i):
                if j not in lbar_set:
                    e.lin(live.below(j), self.size[j])
            for j in enter_nz:
                if j > i:
                    e.lin(live.above(j), self.size[j])
            e.bit(rho, e.const + const + G)
            e.const = 0.0
            self._le(e, self.M, "4.14", memory=True)  # (4.13)/(4.14) <= M (4.16)

    def _below_window(self, k: int, lo: int, live: "_StageLiveness") -> _Lin:
        """F^k: live bytes below the window (the same in every recomputation row of the stage), as one aux
        column (4.14-sum) when the sum is long."""
        below = _Lin()
        for j in range(lo):
            below.lin(live.below(j), self.size[j])
        if len(below.terms) > AGGREGATE_MIN_TERMS:
            F = self._aux(("F", k), [below.copy().lin(below, 1.0 / self.U - 1.0)], "4.14-sum")  # in units U
            self.red["memory_rows_aggregated_stage"] += 1
            return _Lin().bit(F, self.U)
        return below

    def objective(self) -> None:
        idx = list(self.obj.terms)
        self.model.set_objective(idx, [self.obj.terms[c] for c in idx], "min", self.obj.const)

    # -- warm start and decoding ---------------------------------------------------------------------

    def encode(self, schedule: Schedule) -> tuple[np.ndarray | None, dict[int, float], str]:
        """`schedule` as a column vector: (x, _, note) when it encodes exactly under the reductions, else
        (None, partial, why) with `partial` its forward-pass choices (s^N, delta, delta_hat) only.

        Normalisation first: recomputations at a merged stage (its backward reads no forward value)
        move to the next active stage, values stored but needed by no stage are not stored; neither
        raises memory anywhere."""
        n, nodes = self.n, self.p.nodes
        partial: dict[int, float] = {}
        if len(schedule.forward) != n or len(schedule.backward) != n:
            return None, partial, "schedule has the wrong number of nodes"
        fwd = {f.node: f for f in schedule.forward}
        bwd = {b.node: b for b in schedule.backward}
        if set(fwd) != set(range(n)) or set(bwd) != set(range(n)):
            return None, partial, "schedule does not cover every node once"
        x = np.zeros(self.model.num_vars)
        assigned = np.zeros(self.model.num_vars, dtype=bool)
        problems: list[str] = []

        def put(bit: int, value: int, what: str, first_pass: bool = False) -> None:
            if bit == ZERO or bit == ONE:
                if (bit == ONE) != bool(value):
                    problems.append(f"{what} is fixed to {int(bit == ONE)} in the reduced model")
                return
            if assigned[bit] and x[bit] != value:
                problems.append(f"{what} is tied to a variable already set to {int(x[bit])}")
                return
            x[bit] = value
            assigned[bit] = True
            if first_pass:
                partial[bit] = float(value)

        for j in range(n):
            if j not in self.finals and j not in self.pinned:
                put(self.sN[j], int(bool(fwd[j].store) and bool(self.need[j])), f"s_{j}^N", True)
        for i in range(n):
            names = [nodes[i].forward[l].name for l in self.fimpl[i]]
            computed = (not self.dead[i]) or i in self.pinned or (fwd[i].store and bool(self.need[i]))
            if fwd[i].impl not in names:
                if computed:
                    problems.append(f"node {i}: forward implementation {fwd[i].impl!r} is not in this model")
                continue
            chosen = self.fimpl[i][names.index(fwd[i].impl)]
            for l, bit in self.dfwd[i].items():
                put(bit, int(computed and l == chosen), f"delta_{i},{l}", True)
        for k in range(n - 1, -1, -1):
            if self.bimpl[k]:
                names = [nodes[k].backward[l].name for l in self.bimpl[k]]
                if bwd[k].impl not in names:
                    problems.append(f"stage {k}: backward implementation {bwd[k].impl!r} is not in this model")
                    continue
                chosen = self.bimpl[k][names.index(bwd[k].impl)]
                for l, bit in self.dhat[k].items():
                    put(bit, int(l == chosen), f"delta_hat_{k},{l}", True)
        moved: dict[int, str] = {}
        for k in range(n - 1, -1, -1):
            rec = dict(moved)
            moved = {}
            rec.update(dict(bwd[k].recompute))
            if k not in self.r:  # a merged stage: its recomputations run at the next active stage
                moved = rec
                continue
            for i in sorted(rec):
                if i in self.pinned:  # pinned values are stored instead (reduction e)
                    del rec[i]
                elif i not in self.r[k]:
                    problems.append(f"stage {k}: recomputation of node {i} is outside the model's window")
            for i, bit in self.r[k].items():
                put(bit, int(i in rec), f"r_{i}^{k}")
                names = [nodes[i].forward[l].name for l in self.fimpl[i]]
                if i in rec and rec[i] not in names:
                    problems.append(f"stage {k}: recompute implementation {rec[i]!r} of node {i} is not in this model")
                for l, b in self.drec[k][i].items():
                    put(b, int(i in rec and nodes[i].forward[l].name == rec[i]), f"delta^{k}_{i},{l}")
            keep = set(bwd[k].keep)
            for j, bit in enumerate(self.keep[k]):
                if bit >= 0 and not assigned[bit]:
                    put(bit, int(j in keep), f"s_{j}^{k - 1}")
        if moved:
            problems.append("recomputations after the last stage that reads forward values")
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return None, partial, problems[0] + more
        self._fill_aux(x)
        return x, partial, ""

    def _fill_aux(self, x: np.ndarray) -> None:
        for col in self.aux_order:
            vals = [e.const + sum(c * x[v] for v, c in e.terms.items()) for e in self.aux_defs[col]]
            x[col] = max([0.0] + vals)

    def decode(self, x: np.ndarray) -> Schedule:
        n, nodes = self.n, self.p.nodes

        def val(bit: int) -> int:
            if bit == ONE:
                return 1
            if bit == ZERO:
                return 0
            return int(round(x[bit]))

        forward = []
        for i in range(n):
            store = bool(val(self.sN[i]))
            impl = nodes[i].forward[self.fimpl[i][0]].name
            for l, bit in self.dfwd[i].items():
                if val(bit):
                    impl = nodes[i].forward[l].name
            forward.append(ForwardStep(i, impl, store))
        backward = []
        for k in range(n - 1, -1, -1):
            impl = ""
            if self.bimpl[k]:
                impl = nodes[k].backward[self.bimpl[k][0]].name
                for l, bit in self.dhat[k].items():
                    if val(bit):
                        impl = nodes[k].backward[l].name
            recompute = []
            for i in sorted(self.r.get(k, {})):
                if val(self.r[k][i]):
                    name = nodes[i].forward[self.fimpl[i][0]].name
                    for l, bit in self.drec[k][i].items():
                        if val(bit):
                            name = nodes[i].forward[l].name
                    recompute.append((i, name))
            keep = tuple(j for j in range(n) if val(self.keep[k][j]))
            backward.append(BackwardStage(k, impl, tuple(recompute), keep))
        return Schedule(tuple(forward), tuple(backward))


class _StageLiveness:
    """Liveness of values at the recomputations of one active stage k, as expressions over its columns.

    Aux columns (4.14-max o_j^k, 4.3.4 w_j^k) are created on first use and cached, so the rows that ask first
    fix their column order.
    """

    def __init__(self, builder: _Builder, k: int, E: list[int], r: dict[int, int],
                 drec: dict[int, dict[int, int]], B: dict[int, _Lin]):
        self.b, self.k, self.E, self.r, self.B = builder, k, E, r, B
        self.below_cache: dict[int, _Lin] = {}
        self.above_cache: dict[int, _Lin] = {}
        # x_j, j > i, is live at recomputation i only if it entered the stage; with greedy freeing, also only
        # if a later recomputation reads it or it is kept or needed (E_j and B_j, 4.3.4 product).
        nodes = builder.p.nodes
        self.readers_here: set[int] = set()
        for u in r:
            self.readers_here.update(nodes[u].inputs)
            if any(nodes[u].forward[l].reuses_intermediates and bit != ZERO for l, bit in drec[u].items()):
                self.readers_here.update(builder._intermediates_of(u))  # read by a reusing recomputation

    def below(self, j: int) -> _Lin:
        """live_j: x_j (j < i) live at a recomputation when no later candidate reads it."""
        if j not in self.below_cache:
            self.below_cache[j] = self._below(j)
        return self.below_cache[j]

    def _below(self, j: int) -> _Lin:
        E, B = self.E, self.B
        if ENTERING_LIVENESS == "greedy":
            return B[j]
        if j not in self.r:  # not recomputable here: B_j <= E_j
            return _Lin().bit(E[j])
        if E[j] == ZERO:
            return B[j]
        if E[j] == ONE or B[j].const >= 1:
            return _Lin(1.0)
        o = self.b._aux(("o", self.k, j), [_Lin().bit(E[j]), B[j]], "4.14-max")  # (4.14) o >= s_j^k, o >= B_j
        return _Lin().bit(o)

    def above(self, j: int) -> _Lin:
        """x_j (j > i) live at a recomputation: it entered the stage (and, greedy, is still needed)."""
        if j in self.above_cache:
            return self.above_cache[j]
        E, B = self.E, self.B
        if ENTERING_LIVENESS != "greedy" or j in self.readers_here or B[j].const >= 1:
            e = _Lin().bit(E[j])
        elif E[j] == ONE:
            e = B[j]
        elif not B[j].terms:
            e = _Lin()
        else:
            w = self.b._aux(("w", self.k, j), [_Lin(-1.0).bit(E[j]).lin(B[j])], "4.3.4")  # (4.3.4) w >= s + B - 1
            e = _Lin().bit(w)
        self.above_cache[j] = e
        return e


def schedule_compute_us(problem: MemoryProblem, schedule: Schedule) -> float:
    """Compute time of a schedule as the ILP's objective (4.9) counts it: every computed forward node,
    every backward and every recomputation (forward nodes nobody reads count only when stored)."""
    nodes = problem.nodes
    users = problem.forward_users()
    finals = set(problem.final_outputs)
    total = 0.0
    for f in schedule.forward:
        node = nodes[f.node]
        if users[f.node] or f.node in finals or f.store:
            total += next(impl.compute_us for impl in node.forward if impl.name == f.impl)
    for b in schedule.backward:
        node = nodes[b.node]
        if node.backward:
            total += next(impl.compute_us for impl in node.backward if impl.name == b.impl)
        for i, name in b.recompute:
            total += next(impl.compute_us for impl in nodes[i].forward if impl.name == name)
    return total


def solve_memory_ilp(problem: MemoryProblem, budget_bytes: int, options: PlannerOptions, joint: bool = True,
                     warm_start: Schedule | None = None, dump_suffix: str = "", *,
                     window: int | None = None, start_window: int | None = None,
                     search_share: float = 0.0) -> IlpOutcome:
    """Solve MONeT's ILP (joint=True) or the checkpoint-only ILP (joint=False) under `budget_bytes`.

    The result's objective is the decoded schedule's compute time (4.9), its gap the solver's.

    `window` fixes the recomputation window (reduction b) for one solve. Without it, the solve starts
    at DEFAULT_WINDOW nodes and, while a solve proves optimality with time left under
    `options.time_limit_s`, solves again with a WINDOW_GROWTH times larger window warm-started from the
    best schedule so far (each larger model contains the smaller one's solutions); the last solve's
    status, bound and gap are returned (a proof of infeasibility also moves on to a larger window).
    `start_window` replaces DEFAULT_WINDOW as the first window (e.g. the window a warm start came from).
    Without a time limit there is one solve at DEFAULT_WINDOW.
    Windows are capped so that a model stays under about DEFAULT_MAX_ROWS rows.
    `search_share` > 0 (with a time limit): each solve stops branch and bound after (1 - search_share)
    of its limit; if that did not prove optimality, large-neighbourhood search (neighbourhood.py) improves
    the incumbent for the rest, and the result keeps the branch-and-bound bound.
    """
    if window is not None or options.time_limit_s is None:
        return _solve_once(problem, budget_bytes, options, joint, warm_start, dump_suffix, window, window is None,
                           search_share)
    t0 = time.perf_counter()
    deadline = t0 + options.time_limit_s
    if start_window is None and warm_start is not None:  # a first model that can take the whole start
        start_window = _window_for_start(problem, budget_bytes, joint, warm_start)
    w = DEFAULT_WINDOW if start_window is None else max(1, int(start_window))
    warm = warm_start
    warm_cost = _cost_or_none(problem, warm_start)
    phases: list[dict[str, Any]] = []
    best: IlpOutcome | None = None
    while True:
        remaining = deadline - time.perf_counter()
        out = _solve_once(problem, budget_bytes, replace(options, time_limit_s=max(remaining, 1e-3)), joint, warm,
                          dump_suffix, w, True, search_share)
        phases.append({"window": out.stats["window"], "status": out.result.status.value,
                       "objective": out.result.objective, "rows": out.stats["rows"], "cols": out.stats["cols"],
                       "warm_start": out.stats["warm_start"], "build_s": out.stats["build_s"],
                       "solve_s": out.stats["solve_s"]})
        if (best is None or best.schedule is None
                or (out.schedule is not None and out.result.objective <= best.result.objective)):
            best = out  # a wider window's rows can be more conservative: never return a worse schedule
        remaining = deadline - time.perf_counter()
        full = out.stats["window"] >= out.stats["full_window"] or out.stats["window"] < w
        # Grow after a proof (optimal, or infeasible: a wider window may admit a schedule).
        if (out.result.status not in (Status.OPTIMAL, Status.INFEASIBLE) or full
                or remaining < max(MIN_PHASE_S, MIN_PHASE_SHARE * options.time_limit_s)):
            break
        w = int(math.ceil(out.stats["window"] * WINDOW_GROWTH))
        if out.schedule is not None and (warm_cost is None or out.result.objective <= warm_cost):
            warm = out.schedule  # else the caller's schedule is cheaper than the smaller window's optimum
    stats = dict(best.stats)
    stats["phases"] = phases
    stats["build_s"] = sum(p.pop("build_s") for p in phases)
    stats["solve_s"] = sum(p.pop("solve_s") for p in phases)
    return IlpOutcome(best.schedule, best.result, stats)


def _window_for_start(problem: MemoryProblem, budget_bytes: int, joint: bool, warm_start: Schedule) -> int | None:
    """The first window of the growth sequence (DEFAULT_WINDOW, x WINDOW_GROWTH, ...) that holds every
    recomputation of the warm start, so that the first solve starts from all of it rather than from its
    forward choices only; None (the default) when DEFAULT_WINDOW already does or the schedule does not fit
    the model (wrong size)."""
    try:
        need = _Builder(problem, budget_bytes, joint, None, True).window_for(warm_start)
    except (KeyError, IndexError):
        return None
    w = DEFAULT_WINDOW
    while w < need:
        w = int(math.ceil(w * WINDOW_GROWTH))
    return None if w == DEFAULT_WINDOW else w


def _cost_or_none(problem: MemoryProblem, schedule: Schedule | None) -> float | None:
    if schedule is None:
        return None
    try:
        return schedule_compute_us(problem, schedule)
    except (StopIteration, IndexError, KeyError):
        return None


def _search_from(builder: "_Builder", form: Any, origin: np.ndarray | None, solver: Any, options: PlannerOptions,
                 seconds: float) -> Any:
    """Large-neighbourhood search (neighbourhood.py) from `origin` (the solver's incumbent, or the complete
    warm start when the solver stopped before taking it) for `seconds`; None without an origin, time, or
    feasibility after rounding (the search only moves between feasible vectors)."""
    if origin is None or seconds <= 0:
        return None
    x = neighbourhood.rounded(form, origin, builder._fill_aux)
    if not is_feasible(form, x):
        return None
    return neighbourhood.search(form, builder.meaning, builder.n, x, solver, options.solve_options(), seconds,
                                builder._fill_aux)


def _not_worse_than(result: SolveResult, form: Any, x: np.ndarray) -> SolveResult:
    """The solver's result, or the searched vector x (feasible: checked against every row) when it is
    cheaper or the solver returned none, e.g. stopped by its limit before taking its start. The bound is
    the solver's when it has one that x respects."""
    cost = float(form.c @ x + form.constant)
    if result.status.has_solution and result.objective is not None and result.objective <= cost:
        return result
    status = Status.OPTIMAL if result.status is Status.OPTIMAL else Status.FEASIBLE
    bound = result.best_bound if result.best_bound is not None and result.best_bound <= cost else None
    return replace(result, status=status, objective=cost, best_bound=bound, x=x,
                   gap=relative_gap(status, cost, bound))


def _solve_once(problem: MemoryProblem, budget_bytes: int, options: PlannerOptions, joint: bool,
                warm_start: Schedule | None, dump_suffix: str, window: int | None, cap_rows: bool,
                search_share: float = 0.0) -> IlpOutcome:
    t0 = time.perf_counter()
    builder = _Builder(problem, budget_bytes, joint, window, cap_rows)
    builder.build()
    builder.objective()
    form = builder.model.to_arrays()
    build_s = time.perf_counter() - t0

    stats: dict[str, Any] = {
        "formulation": "monet" if joint else "checkpoint-only",
        "rows": form.num_constraints,
        "cols": form.num_vars,
        "binaries": int(form.integrality.sum()),
        "nonzeros": int(form.A.nnz),
        "window": builder.window,
        "full_window": builder.full_window,
        "entering_liveness": ENTERING_LIVENESS,
        "active_stages": len(builder.active),
        "recompute_vars": sum(len(r) for r in builder.r.values()),
        "rows_by_equation": dict(sorted(builder.rows_by_eq.items())),
        "reductions": dict(sorted(builder.red.items())),
        "build_s": build_s,
    }
    if builder.notes:
        stats["notes"] = list(builder.notes)

    start = None
    if warm_start is not None:
        x0, partial, why = builder.encode(warm_start)
        if x0 is not None and not is_feasible(form, x0):
            why = f"violates the ILP's rows by {max_violation(form, x0):.6g} (its conservative memory bounds)"
            x0 = None
        if x0 is not None:
            start = x0
            stats["warm_start"] = "accepted"
            stats["warm_start_objective"] = float(form.c @ x0 + form.constant)
        elif partial:
            start = partial  # the solver completes the forward-pass choices by a sub-MIP
            stats["warm_start"] = f"partial (forward choices only): {why}"
        else:
            stats["warm_start"] = f"skipped: {why}"
    else:
        stats["warm_start"] = "none"

    solver, note = resolve_solver(options.solver)
    stats["solver_choice"] = note
    t1 = time.perf_counter()
    searching = search_share > 0 and options.time_limit_s is not None
    exact = (replace(options, time_limit_s=max(options.time_limit_s * (1 - search_share), 1e-3)) if searching
             else options)
    result = solver.solve(form, exact.solve_options(dump_suffix), start=start)
    if searching and result.status in (Status.FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION):  # stopped at its limit
        origin = result.x if result.status is Status.FEASIBLE else (start if isinstance(start, np.ndarray) else None)
        found = _search_from(builder, form, origin, solver, options, options.time_limit_s - (time.perf_counter() - t1))
        if found is not None:
            stats["search"] = found.stats
            result = _not_worse_than(result, form, found.x)
    stats["solve_s"] = time.perf_counter() - t1

    schedule = None
    if result.status.has_solution and result.x is not None:
        x = neighbourhood.rounded(form, result.x, builder._fill_aux)  # least auxiliaries for the rounded binaries
        violation = float(max_violation(form, x))
        stats["solution_max_violation"] = violation
        if violation > 1e-6:
            stats.setdefault("notes", []).append(f"rounded solution violates a row by {violation:.3g}")
        schedule = builder.decode(x)
        objective = schedule_compute_us(problem, schedule)
        result = replace(result, objective=objective, gap=relative_gap(result.status, objective, result.best_bound))
    return IlpOutcome(schedule, result, stats)

"""The memory-planning problem (MONeT, thesis chapter 4) and the exact semantics every part shares.

Symbols follow table 4.1 of ../shared/papers/001_*.txt. A problem is a chain of forward nodes
i = 0..N-1 in execution order (the DAG's topological order) and one backward stage per node,
run in reverse order k = N-1..0. Every part of the memory planner (the ILP, the baselines, the
replay validator, the PyTorch runtime) reads these definitions; the replay (`replay.py`) is the
ground truth, the ILP's constraints are upper bounds of it (so an ILP-feasible plan always replays
within budget).

Memory at any instant = constant_bytes (parameters, buffers, optimizer state, the input batch)
+ live forward values (node outputs x_j) + live gradients + the running operator's workspace.

Forward pass (Alg. 3). Node i runs with implementation l in J_i: inputs N_i must be live; peak
m_i = constant + |live values| + |x_i| (0 when l is in-place) + c_i^l. Then x_i is live; a value
stays live while a later forward node reads it, it is a final output (the loss), or it is stored
(s_i^N = 1); otherwise it is freed at once (greedy freeing). An in-place implementation overwrites
`inplace_input` (x_j's buffer becomes x_i's): allowed only if x_j is read by no later forward node
and is not stored; x_j is gone afterwards. A node nobody reads (no forward users, not a final
output), e.g. an intermediate storage node such as a ReLU sign mask, is computed only if stored.

Backward stage k (Alg. 4), for k = N-1..0: the live values on entry are S^k (S^N after the forward
pass: stored values + final outputs). First the recomputations r^k run in increasing node order,
each with an implementation (delta^k) and the same peak rule as the forward pass, plus the live
gradients |L_hat_k| (= grad_live_bytes). Then backward_k runs with implementation l in J_hat_k: its
dependencies D_k^l must be live; peak = constant + |L_hat_k| + |y_k| + c_hat_k^l + |S^{k-1} u D_k^l|
(values of S^k that are neither kept nor needed are freed before it). After it, the live values are
S^{k-1} (the stage's `keep` set), which may only contain values that were live in the stage:
s_i^{k-1} <= s_i^k + r_i^k  (4.7). Nodes without backward have an empty, free stage.

An implementation with `reuses_intermediates` exists for recomputation only (the forward pass may not
choose it): it reads the node's intermediate nodes (batch norm's saved mean/invstd) besides its inputs,
so they must be live on entering the stage, and it does not produce them, so they may not be
recomputed in that stage.

Gradients are decision-independent: grad_live_bytes and y_bytes are precomputed constants per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ForwardImpl:
    """One implementation l in J_i of a forward operator."""

    name: str
    compute_us: float  # tau_i^l
    workspace_bytes: int = 0  # c_i^l
    inplace: bool = False  # output overwrites Node.inplace_input's buffer (MONeT q)
    # Recomputation only: reads the node's intermediates kept from the forward pass (e.g. batch norm's
    # saved mean/invstd) instead of producing them again (MONeT: "reuse BatchNorm statistics").
    reuses_intermediates: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "compute_us": self.compute_us, "workspace_bytes": self.workspace_bytes,
               "inplace": self.inplace}
        if self.reuses_intermediates:
            out["reuses_intermediates"] = True
        return out


@dataclass(frozen=True)
class BackwardImpl:
    """One implementation l in J_hat_k of a backward operator."""

    name: str
    compute_us: float  # tau_hat_k^l
    workspace_bytes: int = 0  # c_hat_k^l
    deps: tuple[int, ...] = ()  # D_k^l: node indices whose outputs this backward reads
    kind: str = "input-activated"  # input-activated | output-activated | intermediate-activated | none

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "compute_us": self.compute_us, "workspace_bytes": self.workspace_bytes,
                "deps": list(self.deps), "kind": self.kind}


@dataclass(frozen=True)
class Node:
    """Forward node i and its backward stage k = i."""

    index: int  # i, position in execution order
    op_id: int  # the trace op this node is (intermediate nodes: their creator's op id)
    name: str  # operator name, e.g. "aten::convolution"; intermediates e.g. "mlopt::relu_mask"
    out_bytes: int  # |x_i|
    inputs: tuple[int, ...]  # N_i: node indices whose outputs forward_i reads (sorted, all < index)
    forward: tuple[ForwardImpl, ...]  # J_i; [0] is the default the trace was measured with
    backward: tuple[BackwardImpl, ...] = ()  # J_hat_k; [0] default; empty: no backward work at this stage
    inplace_input: int | None = None  # node whose buffer an in-place forward implementation overwrites
    intermediate_of: int | None = None  # intermediate storage node: its creator (recomputed only with it)
    y_bytes: int = 0  # |y_k|: gradient bytes backward_k adds at its highest (build.py: their running peak)
    # |L_hat_k|: gradient bytes live entering stage k, with the loss and its seed gradient, which the
    # training loop holds through the whole backward pass (build.py)
    grad_live_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "op_id": self.op_id, "name": self.name, "out_bytes": self.out_bytes,
            "inputs": list(self.inputs), "forward": [f.to_dict() for f in self.forward],
            "backward": [b.to_dict() for b in self.backward], "inplace_input": self.inplace_input,
            "intermediate_of": self.intermediate_of, "y_bytes": self.y_bytes,
            "grad_live_bytes": self.grad_live_bytes,
        }


@dataclass(frozen=True)
class MemoryProblem:
    name: str
    nodes: tuple[Node, ...]
    constant_bytes: int  # resident for the whole step: parameters, buffers, optimizer state, input batch
    final_outputs: tuple[int, ...] = ()  # nodes whose outputs stay live to the end of the forward pass
    warnings: tuple[str, ...] = ()  # e.g. unknown op types given a conservative default
    cost_source: str = "trace"  # where compute times came from: trace | profile FILE | defaults
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.nodes)

    def least_compute_us(self) -> float:
        """Every operator once at its fastest implementation: no schedule computes less. Against it, a
        plan's overhead is what saving memory costs, apart from what faster implementations save."""
        forward = sum(min(f.compute_us for f in node.forward if not f.reuses_intermediates)
                      for node in self.nodes if node.intermediate_of is None and node.forward)
        return forward + sum(min(b.compute_us for b in node.backward) for node in self.nodes if node.backward)

    def intermediates_of(self, c: int) -> list[int]:
        """The intermediate nodes whose creator is c, ascending."""
        return [node.index for node in self.nodes if node.intermediate_of == c]

    def forward_users(self) -> list[list[int]]:
        """users[j] = forward nodes that read x_j, ascending."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for j in node.inputs:
                users[j].append(node.index)
        return users

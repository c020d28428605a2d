"""A memory schedule: MONeT's decision variables (s, r, delta, delta_hat) in the order they execute.

The plan payload stores the schedule by node index with the node's trace op id beside it, so the
validator can check that the plan was made for the trace it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlopt.planners.memory.problem import MemoryProblem


@dataclass(frozen=True)
class ForwardStep:
    node: int  # i
    impl: str  # l with delta_{i,l} = 1
    store: bool  # s_i^N


@dataclass(frozen=True)
class BackwardStage:
    node: int  # k
    impl: str  # l with delta_hat_{k,l} = 1 ("" when the node has no backward)
    recompute: tuple[tuple[int, str], ...]  # (i, l) with r_i^k = 1 and delta^k_{i,l} = 1, increasing i
    keep: tuple[int, ...]  # S^{k-1}: values live after this stage, ascending


@dataclass(frozen=True)
class Schedule:
    forward: tuple[ForwardStep, ...]  # one per node, i = 0..N-1
    backward: tuple[BackwardStage, ...]  # one per node, k = N-1..0 (execution order)

    def to_dict(self, problem: MemoryProblem) -> dict[str, Any]:
        op = [node.op_id for node in problem.nodes]
        return {
            "forward": [{"node": f.node, "op_id": op[f.node], "impl": f.impl, "store": f.store}
                        for f in self.forward],
            "backward": [{"node": b.node, "op_id": op[b.node], "impl": b.impl,
                          "recompute": [{"node": i, "impl": l} for i, l in b.recompute],
                          "keep": list(b.keep)} for b in self.backward],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Schedule":
        return Schedule(
            forward=tuple(ForwardStep(f["node"], f["impl"], bool(f["store"])) for f in d["forward"]),
            backward=tuple(BackwardStage(b["node"], b["impl"],
                                         tuple((r["node"], r["impl"]) for r in b["recompute"]),
                                         tuple(b["keep"])) for b in d["backward"]),
        )

"""TACCL's collective-algorithm synthesizer (Shah et al., NSDI'23; thesis chapter 5).

Stages: `logical` (sketch -> logical topology, symmetry, shortest-path candidates), `routing` (stage 1 MILP,
eq. 5.1-5.15), `ordering` (stage 2 heuristics, §5.5.2), `scheduling` (stage 3 MILP, eq. 5.16-5.21),
`combining` (reducescatter / allreduce by inverting an allgather), orchestrated by `synthesizer.synthesize`.
"""

from mlopt.planners.collective.taccl.synthesizer import (
    StageReport,
    SynthesisOptions,
    SynthesisResult,
    assign_steps,
    synthesize,
)

__all__ = ["StageReport", "SynthesisOptions", "SynthesisResult", "assign_steps", "synthesize"]

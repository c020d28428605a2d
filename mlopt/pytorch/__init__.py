"""PyTorch integration: the "mlopt" torch.distributed backend, which runs collectives with mlopt's plans.

A training job (one process per rank, e.g. under torchrun) uses it like gloo:

    import mlopt.pytorch                                   # registers the "mlopt" backend
    mlopt.pytorch.configure(index="out/plans")             # or MLOPT_PLAN_INDEX=out/plans, or pg_options=
    torch.distributed.init_process_group("mlopt")          # every rank checks the others load the same plans
    model = torch.nn.parallel.DistributedDataParallel(model)   # gradients all-reduced by the runtime
    print(mlopt.pytorch.backend_of().fallbacks)            # collectives no plan covered (mlopt's ring ran)

or, to apply a whole plan index (thread plan -> DDP buckets, collective plans, schedule plan -> enforcer,
memory plan -> executor) in one call: `applied = mlopt.pytorch.apply_plans(index, model, trace=...)`
(docs/pytorch.md).

Each collective runs the index's plan for its kind, group size and nearest size, else mlopt's ring program
(`mlopt.pytorch.plans`); `mlopt.pytorch.backend` says which collectives, dtypes and options there are and how
torch lets Python implement a backend. The runtime library must have its multi-process part (version 0.4).
"""

from mlopt.pytorch.backend import (
    BACKEND_NAME,
    INDEX_ENV,
    BackendOptions,
    MloptProcessGroup,
    backend_of,
    configure,
    register,
    resolve_options,
)
from mlopt.pytorch.models import prepare_torchvision
from mlopt.pytorch.plans import Choice, PlanBook, PlanIndex, load_index
from mlopt.pytorch.apply import AppliedPlans, PlanOutcome, apply_plans
from mlopt.pytorch.memory import load_memory_plan

__all__ = [
    "BACKEND_NAME", "INDEX_ENV", "AppliedPlans", "BackendOptions", "Choice", "MloptProcessGroup", "PlanBook",
    "PlanIndex", "PlanOutcome", "apply_plans", "backend_of", "configure", "load_index", "load_memory_plan",
    "prepare_torchvision", "register", "resolve_options",
]

register()

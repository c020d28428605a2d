"""`mlopt sweep SPEC.yaml -o DIR`: grids of planner invocations (docs/sweep.md).

spec.py reads the grid into cells; cells.py turns a cell into its `mlopt plan ...` command and runs it
in-process (command.py: the kind's plan_files, which that command calls too); cache.py is the content-addressed
plan cache; executors.py runs cells on a local process pool, Dask or Ray; report.py writes the summary and plots; run.py ties them.
"""

from mlopt.sweep.run import SweepFailed, SweepResult, run_sweep
from mlopt.sweep.spec import Spec, load_spec

__all__ = ["SweepFailed", "SweepResult", "Spec", "load_spec", "run_sweep"]

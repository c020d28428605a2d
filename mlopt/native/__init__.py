"""The native binding: Python's way into the C++ runtime library (runtime/, built into _lib/ at install).

* `binding`: ctypes declarations of the C ABI (`runtime/include/mlopt/mlopt.h`): plans, in-process and
  multi-process communicators, bootstraps, errors as `RuntimeLibraryError`.
* `enforcer`: the Syndicate enforcer's harness: motif programs run in the schedule plan's order on every rank.
* `run_collective`: `mlopt run-collective`'s engine: run a collective program and check its outputs.

Nothing here imports torch; the PyTorch integration (mlopt.pytorch) builds on this package.
"""

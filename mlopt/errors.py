"""Errors that map to the CLI's exit codes.

Every error a user can cause is raised as one of these and turned into a single line on stderr by the CLI:
exit 2 for bad input (naming the file and the JSON path of the field), exit 3 for infeasible problems
(saying what would be feasible).
"""

from __future__ import annotations


class MloptError(Exception):
    """Base class: an error with a one-line message and a CLI exit code."""

    exit_code = 1


class InputError(MloptError):
    """Bad input: malformed file, missing or mistyped field, unknown name. Exit code 2.

    `status` sorts the refusal the way the C++ runtime's status codes do, where a loader sets it (the MSCCL-EF
    loader: "parse", "schema", "semantic", or "unsupported" for input that is valid but that mlopt does not
    model); "invalid" otherwise.
    """

    exit_code = 2

    def __init__(self, file: str, field: str, message: str, status: str = "invalid"):
        self.file = str(file)
        self.field = field
        self.message = message
        self.status = status
        super().__init__(f"{self.file}: {field}: {message}")


class InfeasibleError(MloptError):
    """The problem has no solution under the given limits. Exit code 3."""

    exit_code = 3

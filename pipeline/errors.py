"""Errors that the CLI turns into exit codes and one clear message (never a traceback).

Exit codes (documented in the README):
    0  success
    1  a stage failed while running (a bug, a crash in emulation, a diverging run, ...)
    2  user error: bad spec, missing or corrupt input file, unsupported model, does not fit the board
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_STAGE_FAILED = 1
EXIT_USER_ERROR = 2


class TinytrainError(Exception):
    """Base class: carries a message meant for the user and the exit code to end with."""

    exit_code = EXIT_STAGE_FAILED

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UserError(TinytrainError):
    """Something the user can fix: the spec, an input file, the model, the board choice."""

    exit_code = EXIT_USER_ERROR


class SpecError(UserError):
    """The YAML spec is malformed or invalid."""


class ModelError(UserError):
    """The model file cannot be read, is corrupt, or uses something we do not support."""


class UnsupportedOpError(ModelError):
    def __init__(self, op_name: str, op_index: int, *, where: str = "", hint: str | None = None):
        loc = f" in {where}" if where else ""
        super().__init__(f"unsupported op {op_name} at operator index {op_index}{loc}", hint=hint)
        self.op_name = op_name
        self.op_index = op_index


class StageFailed(TinytrainError):
    """A stage raised something that is not a user error: reported with exit code 1."""

    exit_code = EXIT_STAGE_FAILED

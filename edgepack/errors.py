"""Errors that carry a fix.

Every failure a user can cause (bad model, bad shape, missing toolchain, unreachable device ...)
is raised as an :class:`EdgepackError`. The CLI prints it as one paragraph, without a traceback.
"""

from __future__ import annotations


class EdgepackError(Exception):
    """A problem the user can fix: ``message`` names it, ``hint`` says how to fix it."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip()


class ModelError(EdgepackError):
    """The model file is corrupt, of an unknown format, or uses unsupported operators."""


class ShapeError(EdgepackError):
    """Input shapes are dynamic, malformed, or do not match the model."""


class ProfileError(EdgepackError):
    """Unknown device profile, or one whose backend is not supported yet."""


class ToolchainError(EdgepackError):
    """A cross compiler, emulator or other external tool is missing or failed."""


class OutputExistsError(EdgepackError):
    """The output directory already exists and ``force`` was not given."""


class ValidationError(EdgepackError):
    """Outputs did not match the reference."""

    exit_code = 1


class ProcessingError(EdgepackError):
    """Pre- or post-processing settings that are malformed or do not fit the model."""


class CompileError(EdgepackError):
    """TVM failed to build the model for the target."""


def first_line(exc: BaseException) -> str:
    """The line of an exception's text that says what went wrong (TVM puts it last, after a C++ backtrace)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line.strip()[:400]
    return lines[0].strip()[:400] if lines else text

"""The one error type users see: what went wrong (cause) and what to do about it (fix).

The CLI prints ``FastpathError`` as two short lines and exits with ``exit_code`` instead of a
traceback; anything else escaping is a bug in fastpath and keeps its traceback.
"""

from __future__ import annotations


class FastpathError(Exception):
    exit_code = 2

    def __init__(self, cause: str, fix: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.cause}\n  fix: {self.fix}" if self.fix else self.cause


class SpecError(FastpathError):
    """The spec file is missing, unparsable or invalid."""


class UsageError(FastpathError):
    """Bad command-line arguments or run directory state."""

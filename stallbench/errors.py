"""Errors the CLI turns into one clear line and exit code 2.

Every user-facing failure (bad scenario, unreadable Parquet, unusable result file) is a
``UserError``: the CLI prints ``str(err)`` and exits 2 without a traceback. Anything else is a
bug in stallbench and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user; printed as one line, exit code 2."""

    exit_code = 2


class ScenarioError(UserError):
    """A scenario file is missing, malformed or has a bad value.

    Carries file and dotted key separately so tests can check both, and so the message always
    names where to look.
    """

    def __init__(self, file: str, key: str | None, message: str) -> None:
        self.file = file
        self.key = key
        self.message = message
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}")


class DataError(UserError):
    """A dataset cannot be read or has a column stallbench cannot use."""


class ResultError(UserError):
    """A result file is missing, malformed, or of an unknown schema version."""


class PayloadError(Exception):
    """A serialized batch is corrupt; never turned into a garbage tensor."""

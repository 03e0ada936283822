"""Turning an exception into the one line a user reads.

The package's own errors live beside what raises them (``ConfigError`` in
config/, ``DataError`` in data/, ``CheckpointError`` in runner/checkpoint.py,
``RunNotFound`` in tracking/store.py); this module holds what every layer uses
to report them: :func:`first_line`.
"""

from __future__ import annotations


def first_line(exc: BaseException | str, *, named: bool = False, limit: int = 0) -> str:
    """The first line of an exception's text (or of a message), "" when it has none;
    ``named``: prefixed with the exception's type (``"OSError: disk full"``);
    ``limit``: cut to that many characters (0: not cut)."""
    lines = str(exc).strip().splitlines()
    line = lines[0].strip() if lines else ""
    if named and isinstance(exc, BaseException):
        line = f"{type(exc).__name__}: {line}"
    return line[:limit] if limit else line

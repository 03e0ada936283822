"""Errors a user reads: :class:`ConfigError`, the bad-input error every layer raises
(and subclasses: a run too big for memory, a comparison with nothing to compare), and
:func:`first_line`, which turns any exception into the one line a user reads.

Errors of one concern live beside what raises them (``DataError`` in data/,
``CheckpointError`` in runner/checkpoint.py, ``TrackingError`` in tracking/store.py,
``Terminated`` and ``RunStopped`` in interrupt.py).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, phrased as one line for the user."""


def first_line(exc: BaseException | str, *, named: bool = False, limit: int = 0) -> str:
    """The first line of an exception's text (or of a message), "" when it has none;
    ``named``: prefixed with the exception's type (``"OSError: disk full"``);
    ``limit``: cut to that many characters (0: not cut)."""
    lines = str(exc).strip().splitlines()
    line = lines[0].strip() if lines else ""
    if named and isinstance(exc, BaseException):
        line = f"{type(exc).__name__}: {line}"
    return line[:limit] if limit else line

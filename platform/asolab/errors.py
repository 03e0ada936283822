"""Errors a user reads: :class:`ConfigError`, the bad-input error every layer raises
(and subclasses: a run too big for memory, a comparison with nothing to compare, a
Python API argument of the wrong kind, :class:`ArgumentError`), and
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


class ArgumentError(ConfigError, TypeError):
    """A Python API function called with an argument it does not take: the message
    names the function, the argument and what it takes. (A ``ConfigError``, hence a
    ``ValueError``, and a ``TypeError``, so that each of those ``except`` catches it.)"""


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def text_arg(function: str, name: str, value: object, takes: str, optional: bool = False) -> str:
    """``value`` if it is a non-empty string (or None where ``optional``: then ""),
    else :class:`ArgumentError` naming ``function``'s argument ``name`` and what it
    ``takes``."""
    if value is None and optional:
        return ""
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ArgumentError(f"{function}: {name} takes {takes}; got {_shown(value)}")


def wrong(function: str, name: str, value: object, takes: str) -> ArgumentError:
    """The error for ``function``'s argument ``name`` given ``value``: what it ``takes``."""
    return ArgumentError(f"{function}: {name} takes {takes}; got {_shown(value)}")

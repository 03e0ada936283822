"""Turning an exception into the one line a user reads, and the Python API's error for an
argument of the wrong kind (:class:`ArgumentError`)."""

from __future__ import annotations

from .config.fields import ConfigError


def first_line(exc: BaseException | str) -> str:
    """The first line of an exception's text (or of a message), "" when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""


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

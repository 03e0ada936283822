"""Turning an exception into the one line a user reads."""

from __future__ import annotations


def first_line(exc: BaseException | str) -> str:
    """The first line of an exception's text (or of a message), "" when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""

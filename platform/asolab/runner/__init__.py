"""The runner: the ASO-SE cycle loop, its events, checkpoints and memory statistics.

``Runner`` and ``RunResult`` load on first use (they pull in torch), so that
the phase table (``runner.phases``) stays cheap to import for the tracking layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .cycle import Runner, RunResult
    from .events import Observer

__all__ = ["Observer", "RunResult", "Runner"]


def __getattr__(name: str) -> Any:
    if name in ("Runner", "RunResult"):
        from . import cycle

        return getattr(cycle, name)
    if name == "Observer":
        from .events import Observer

        return Observer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The runner: the ASO-SE cycle loop, its events, checkpoints and memory statistics."""

from .cycle import Runner, RunResult
from .events import Observer

__all__ = ["Observer", "RunResult", "Runner"]

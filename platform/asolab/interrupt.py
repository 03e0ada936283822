"""SIGTERM and SIGHUP handled like Ctrl-C, for every command that trains.

A batch scheduler's time limit or a plain ``kill`` sends SIGTERM; a closed
terminal or a dropped ssh connection sends SIGHUP. Python's default is to die
on the spot, which leaves the MLflow run RUNNING with only the last cycle's
checkpoint. Inside :func:`sigterm_as_interrupt` they raise :class:`Terminated`
instead, a ``KeyboardInterrupt``, so the run goes the way of Ctrl-C: it uploads
its latest checkpoint, ends KILLED, and the command exits with status 128 + the
signal's number (143 for SIGTERM, 129 for SIGHUP) and says how to continue (in
the run too, for a terminal that is gone).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's time limit, ``kill``) or SIGHUP (the terminal went
    away): stopped like Ctrl-C. ``status`` is the shell's exit status for the signal."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + int(signum)


class RunStopped(KeyboardInterrupt):
    """A tracked run (tracking/lifecycle.py) stopped before its end by Ctrl-C, SIGTERM or
    SIGHUP. Its checkpoints are in the store; ``command`` continues it. Still a
    ``KeyboardInterrupt`` (what stopped it), so ``except Exception`` does not swallow it.
    ``status`` is the shell's exit status: 130 for Ctrl-C, 128 + the signal's number."""

    def __init__(self, run_id: str, tracking_uri: str, command: str, status: int = 130) -> None:
        super().__init__(f"run {run_id} stopped; continue it with: {command}")
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.command = command
        self.status = status


# SIGHUP exists on POSIX only
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Raise :class:`Terminated` on SIGTERM or SIGHUP while the block runs (main thread
    only: elsewhere signal handlers cannot be set, and the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, stop) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

"""SIGTERM handled like Ctrl-C, for every command that trains.

A batch scheduler's time limit or a plain ``kill`` sends SIGTERM. Python's
default is to die on the spot, which leaves the MLflow run RUNNING with only
the last cycle's checkpoint. Inside :func:`sigterm_as_interrupt` it raises
:class:`Terminated` instead, a ``KeyboardInterrupt``, so the run goes the way
of Ctrl-C: it uploads its latest checkpoint, ends KILLED, and the command exits
with status 143 and says how to continue.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's time limit, ``kill``): stopped like Ctrl-C."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Raise :class:`Terminated` on SIGTERM while the block runs (main thread only:
    elsewhere signal handlers cannot be set, and the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

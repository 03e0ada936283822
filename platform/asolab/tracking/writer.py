"""The tracker's write queue: store writes in submission order, inline or on a
low-priority thread."""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# auto: inline for a local SQLite store, a thread otherwise
WRITE_MODES = ("auto", "inline", "thread")


class StoreWriter:
    """Store writes (metric batches, pictures, files, checkpoints) in submission order.

    For a remote store they run on one daemon thread, so that network round trips
    never hold up training; an error surfaces on the next call. For a local SQLite
    store (``inline``) they run at once, in the caller: a write there costs only CPU,
    and on a machine whose cores training keeps busy, a second thread costs the run
    about twice its CPU time (it preempts torch's worker threads, and every parallel
    region waits for the slowest), while inline work costs exactly its own.
    ``bench/tracking_overhead.py --compare-modes`` measures both side by side.
    """

    def __init__(self, inline: bool = False) -> None:
        self.inline = inline
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.busy_seconds = 0.0

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._raise()
        if self.inline:
            self._call(fn, args)
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="asolab-mlflow-writer", daemon=True
            )
            self._thread.start()
        self._queue.put((fn, args))

    def _call(self, fn: Callable[..., Any], args: tuple) -> None:
        start = time.perf_counter()
        try:
            fn(*args)
        finally:
            self.busy_seconds += time.perf_counter() - start

    def _loop(self) -> None:
        lowest_priority()
        while True:
            fn, args = self._queue.get()
            try:
                self._call(fn, args)
            except Exception as exc:
                log.exception("MLflow store write failed")
                self._error = self._error or exc
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Wait until everything submitted is written; re-raise the first failure."""
        self._queue.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def lowest_priority() -> None:
    """Give the calling thread (and the ``dot`` processes it starts) the lowest CPU
    priority: it then runs in the gaps training leaves instead of preempting torch's
    workers. Linux schedules threads one by one (a thread id is a valid ``who``)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError as exc:  # a sandbox may forbid it: the writes still happen
            log.debug("writer thread keeps its priority: %s", exc)

"""A run that runs slowly says so: an epoch whose images/s falls below a third of its
phase's median in this run gets one line naming the likely cause and what to set.

The thread count is decided once per run (asolab/threads.py), so a run that
started beside others, or that others started beside, can crawl for its whole
length; this names it while it happens instead of leaving a researcher to guess.
The progress observer prints the line and the MLflow tracker records it (the
``asolab.slow_epoch`` tag); both keep a :class:`Pace` of their own, and since the
verdict depends on the epochs alone, both reach the same one.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from ..threads import usable_cores
from .events import EpochEnd
from .phases import PHASE_TITLES

SLOWER = 3.0  # an epoch this many times slower than its phase's median is said
SHARED_GPU = 80.0  # percent GPU busy in a slow epoch: other work shares the GPU
AT_LEAST = 3  # epochs of a phase before its median means anything


def load_average() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def likely_cause(threads: int, load: float | None, cores: int) -> str:
    """Threads against the load: which one it probably is, and what to set."""
    seen = f"load {load:.1f} on {cores} cores" if load is not None else f"{cores} cores"
    if load is not None and load > cores:
        fewer = max(1, min(threads - 1, cores - int(load - threads)))
        return (
            f"likely cause: load: other processes keep the cores busy ({seen}) and this "
            f"run's {threads} thread(s) wait for them; run fewer things at once"
            + (f", or set threads = {fewer} (--set threads={fewer})" if threads > 1 else "")
        )
    if threads > 1:
        return (
            f"likely cause: threads: the machine is not busy ({seen}) yet this run's {threads} "
            "threads are slow; set threads = 1 (--set threads=1) and compare"
        )
    return (
        f"likely cause: something outside this run ({seen}, 1 thread): memory swapping or "
        "another process's burst; nothing to set here"
    )


class Pace:
    """Watches the epochs' images/s; :meth:`check` returns the one line, once per run."""

    def __init__(self) -> None:
        self.rates: dict[str, list[float]] = defaultdict(list)
        self.said = ""

    def check(self, event: EpochEnd) -> str:
        """The line for ``event`` if it is the run's first slow epoch, else ""."""
        rates = self.rates[event.phase]
        rates.append(event.images_per_sec)
        if self.said or len(rates) < AT_LEAST:
            return ""
        median = statistics.median(rates)
        if event.images_per_sec * SLOWER >= median:
            return ""
        title = PHASE_TITLES.get(event.phase, event.phase)
        cause = likely_cause(event.threads, load_average(), usable_cores())
        if event.gpu_busy is not None and event.gpu_busy >= SHARED_GPU:
            cause = (
                f"likely cause: the GPU: {event.gpu_busy:.0f}% busy while this run went slowly, "
                "so other work shares it (another run, a study's second worker); give the run "
                "a GPU of its own or fewer neighbours there"
            )
        self.said = (
            f"slow: epoch {event.global_epoch} ({title}, cycle {event.cycle + 1}) ran at "
            f"{event.images_per_sec:.0f} images/s, under a third of this run's median of "
            f"{median:.0f} for that phase; {cause}"
        )
        return self.said

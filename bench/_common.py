"""Helpers shared by the benchmarks: interleaved timing and table printing.

Speed on a shared machine is measured as ratios: the variants being compared
run side by side in one process, interleaved repeat by repeat, and each
variant's figure is the median over repeats, so load from other processes
hits every variant alike.
"""

from __future__ import annotations

import platform as _platform  # the standard library module (platform/ is not a package)
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from asolab import threads
from asolab.interrupt import Terminated, sigterm_as_interrupt

# Before torch loads OpenMP (a benchmark imports this module first): sleeping waits.
threads.prepare_environment()

import torch

# The smallest search: one cycle of one epoch per phase on a 4-channel supernet; each
# benchmark's --smoke sizes add their own final stage and data subset to it.
SMOKE_SEARCH = {
    "space.init_channels": 4,
    "search.cycles": 1,
    "search.w_epochs": 1,
    "search.alpha_epochs": 1,
    "search.retrain_epochs": 1,
}


def interleaved(
    fns: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median wall seconds per call of each function, calls interleaved round-robin."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width table (floats with 2 decimals unless already strings)."""
    cells = [
        [c if isinstance(c, str) else (f"{c:.2f}" if isinstance(c, float) else str(c)) for c in r]
        for r in rows
    ]
    widths = [max([len(str(h))] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    lines = [
        "  ".join(
            str(h).ljust(w) if i == 0 else str(h).rjust(w)
            for i, (h, w) in enumerate(zip(header, widths))
        )
    ]
    for r in cells:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
        )
    return "\n".join(lines)


def use_threads(requested: int = 0) -> int:
    """The thread count by asolab's rule (0 = auto), registered like a run's."""
    return threads.acquire(requested)


def cpu_model() -> str:
    """The CPU's model name, as ``lscpu`` gives it."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return _platform.processor() or "cpu"


def machine() -> str:
    """One line naming the machine a figure was taken on."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{_platform.machine()}, {torch.get_num_threads()} torch threads, {gpu}, "
        f"torch {torch.__version__}"
    )


def run_resumable(main: Callable[[], int], stopped: str) -> None:
    """Exit with ``main()``'s status; a Ctrl-C or SIGTERM (a killed run ends KILLED with
    its checkpoint) prints ``stopped`` and exits 130 or 143."""
    try:
        with sigterm_as_interrupt():
            sys.exit(main())
    except KeyboardInterrupt as exc:
        print(stopped, file=sys.stderr)
        sys.exit(exc.status if isinstance(exc, Terminated) else 130)

"""Memory: peak RSS of the default run, and RSS after every cycle of a long run.

    python bench/memory.py                  # default run (subprocess) + 10-cycle run without growth
    python bench/memory.py --skip-default   # only the 10-cycle run
    python bench/memory.py --smoke

1. ``asolab run`` on experiments/digits.toml as a user runs it (tracked, into a
   throwaway MLflow store) in a child process; its peak RSS is the child's
   ``ru_maxrss``.
2. A 10-cycle digits run without growth (small supernet, one epoch per phase)
   in this process; RSS is read at the end of every cycle (the runner's
   ``CycleEnd.memory``). A leak shows as RSS climbing cycle after cycle; the
   headline (last line) is the RSS change from cycle 2 to the last cycle,
   target within 5%.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, table

from asolab.config import load
from asolab.runner import Runner
from asolab.runner.events import Recorder
from asolab.runner.memory import peak_rss_mb

LONG = {
    "device": "cpu",
    "tracking.enabled": False,
    "growth.policy": "none",
    "space.init_channels": 8,
    "search.cycles": 10,
    "search.w_epochs": 1,
    "search.alpha_epochs": 1,
    "search.retrain_epochs": 1,
    "search.final_epochs": 0,
}
SMOKE = {"space.init_channels": 4, "search.cycles": 3, "data.train_subset": 64, "threads": 1}
CLI = "import sys; from asolab.cli import main; sys.exit(main(sys.argv[1:]))"


def default_run_peak(extra: list[str]) -> tuple[float, float]:
    """(peak RSS MB, seconds) of ``asolab run`` in a child process, into a temporary store."""
    with tempfile.TemporaryDirectory(prefix="asolab-mem-") as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{Path(tmp) / 'mlflow.db'}"}
        cmd = [
            sys.executable,
            "-c",
            CLI,
            "run",
            "--set",
            "device=cpu",
            *[a for s in extra for a in ("--set", s)],
        ]
        start = time.perf_counter()
        subprocess.run(
            cmd, env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak_kib / 1024.0, seconds


def long_run(overrides: dict) -> list[float]:
    """RSS (MB) at the end of each cycle of a run without growth."""
    rec = Recorder()
    Runner(load(None, overrides), [rec]).run()
    return [e.memory["rss_mb"] for e in rec.of("cycle_end")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--skip-default", action="store_true", help="skip the default run's peak")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = ap.parse_args(argv)
    overrides = {**LONG, "search.cycles": args.cycles}
    default_extra: list[str] = []
    if args.smoke:
        overrides.update(SMOKE)
        default_extra = [f"{k}={v}" for k, v in SMOKE.items() if k != "search.cycles"] + [
            "search.cycles=1",
            "search.final_epochs=0",
            "tracking.log_models=false",
        ]
    print(f"# {machine()}")
    rows = []
    if not args.skip_default:
        peak, seconds = default_run_peak(default_extra)
        rows.append(
            ["default run (asolab run, tracked)", "peak RSS", f"{peak:.0f} MB", f"{seconds:.0f} s"]
        )
    start = time.perf_counter()
    rss = long_run(overrides)
    seconds = time.perf_counter() - start
    for i, mb in enumerate(rss):
        rows.append([f"{len(rss)}-cycle run, no growth", f"cycle {i + 1}", f"{mb:.0f} MB", ""])
    rows.append(
        [
            f"{len(rss)}-cycle run, no growth",
            "peak RSS",
            f"{peak_rss_mb():.0f} MB",
            f"{seconds:.0f} s",
        ]
    )
    print(table(["run", "when", "RSS", "wall"], rows))
    base = rss[1] if len(rss) > 1 else rss[0]
    growth = 100 * (rss[-1] - base) / base
    print(
        f"RSS growth from cycle 2 to cycle {len(rss)}: {growth:+.2f}% "
        f"({base:.0f} -> {rss[-1]:.0f} MB); target within 5%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

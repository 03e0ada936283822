"""What the ``asolab`` command's exit costs, with the interpreter's teardown and without.

    python bench/exit_cost.py                # a tiny tracked run, 3 interleaved pairs
    python bench/exit_cost.py --repeats 5
    python bench/exit_cost.py --smoke        # a bad command (status 2): seconds (the suite runs it)

The same command ends two ways, each in a fresh process, the two interleaved:

* ``console``: the ``asolab`` console script (``asolab.cli.console``): threads joined and
  every exit handler run, then the process ends without the teardown;
* ``full``: ``python -m asolab.cli``, an ordinary exit, which also frees every module
  and object of torch, MLflow and Optuna one by one.

The child's output (both streams) is unbuffered. *exit* is the time from its last line (a run's
summary) to its end; *total* from its start to its end. One warm-up pair first (not in
``--smoke``) makes the tracking store both then share. The headline: the seconds the console script
saves at exit, and the ratio of the totals.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SMOKE_SEARCH, cpu_model, table

VARIANTS = {
    "console": ["-c", "from asolab.cli import console; console()"],
    "full": ["-m", "asolab.cli"],
}
TINY_RUN = [
    "run",
    *(f"--set={k}={v}" for k, v in SMOKE_SEARCH.items()),
    "--set=search.final_epochs=1",
]
BAD_COMMAND = ["nonesuch"]  # argparse: a usage error, status 2, before torch loads


def _env() -> dict[str, str]:
    """This checkout's asolab, unbuffered output."""
    import asolab

    root = str(Path(asolab.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def timed(variant: str, args: list[str], cwd: str) -> tuple[int, float, float]:
    """(exit status, seconds from the last output line to the end, seconds in all)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *VARIANTS[variant], *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    last = start
    for _ in proc.stdout:
        last = time.perf_counter()
    status = proc.wait()
    end = time.perf_counter()
    return status, end - last, end - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="interleaved pairs after the warm-up")
    p.add_argument("--smoke", action="store_true", help="one pair of a bad command's exit")
    a = p.parse_args(argv)
    args, repeats = (BAD_COMMAND, 1) if a.smoke else (TINY_RUN, a.repeats)
    load = os.getloadavg()[0]
    runs: dict[str, list[tuple[int, float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as cwd:
        for variant in VARIANTS if not a.smoke else ():  # warm-up: the store, the page cache
            timed(variant, args, cwd)
        for _ in range(repeats):
            for variant in VARIANTS:
                runs[variant].append(timed(variant, args, cwd))
    statuses = {v: {r[0] for r in rs} for v, rs in runs.items()}
    if len({frozenset(s) for s in statuses.values()}) != 1:
        print(f"the two exits gave different statuses: {statuses}", file=sys.stderr)
        return 1
    exit_s = {v: statistics.median(r[1] for r in rs) for v, rs in runs.items()}
    total_s = {v: statistics.median(r[2] for r in rs) for v, rs in runs.items()}
    what = "a bad command" if a.smoke else "a tiny tracked run"
    print(f"{what}, exit status {min(statuses['full'])}; {cpu_model()}, load {load:.2f}")
    print(f"medians of {repeats} interleaved pairs, seconds")
    rows = [[v, exit_s[v], total_s[v]] for v in VARIANTS]
    print(table(["variant", "exit s", "total s"], rows))
    saved = exit_s["full"] - exit_s["console"]
    print(
        f"the console script's exit saves {saved:.2f} s a command; "
        f"total {total_s['full'] / total_s['console']:.2f}x" + (" (smoke run)" if a.smoke else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What MLflow tracking costs a run: the default digits experiment with the
tracker off and on, side by side in one process, against a fresh SQLite store.

    python bench/tracking_overhead.py              # experiments/digits.toml, 4 pairs of runs
    python bench/tracking_overhead.py --tiny       # a seconds-long smoke run

The headline (last line) is what the issue's target is about: the wall time of
the tracked run over the untracked one. After one untimed warm-up run, pairs run
off-on, on-off, off-on, ... so that a drift in the machine's speed hits both
variants alike; the headline
is the median of the per-pair differences. The time the training loop spent
inside the tracker's hooks and the busy time of the tracker's own thread
(metrics, pictures, files, checkpoint uploads, which overlaps with training)
are printed as well, to show where the cost lies.
The store is created before timing (a one-off per store, like a user's
existing ``mlruns/``); imports happen before timing as well.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from asolab.config import load
from asolab.runner import Runner
from asolab.tracking import MlflowTracker
from mlflow import MlflowClient

TINY = [
    "device=cpu", "search.cycles=1", "search.w_epochs=1", "search.alpha_epochs=1", "search.retrain_epochs=1",
    "search.final_epochs=1", "space.init_channels=4", "data.train_subset=128",
]


def timed_run(cfg, tracker: MlflowTracker | None, checkpoint_dir: Path) -> float:
    start = time.perf_counter()
    Runner(cfg, [tracker] if tracker else [], checkpoint_dir=checkpoint_dir).run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", default=None, help="experiment file (default: experiments/digits.toml)")
    ap.add_argument("--tiny", action="store_true", help="a tiny configuration (smoke test)")
    ap.add_argument("--repeats", type=int, default=4, help="pairs of runs, in alternating order (default 4)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args(argv)
    cfg = load(args.experiment, [*(TINY if args.tiny else []), *args.overrides])

    rows = []
    with tempfile.TemporaryDirectory(prefix="asolab-bench-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        MlflowClient(uri).search_experiments()  # create the store's tables outside the timing
        timed_run(cfg, None, Path(tmp) / "warm-up")  # first-run costs (allocator, kernels, caches) hit neither variant
        for i in range(max(1, args.repeats)):
            # Both runs write checkpoints after every phase, so the difference is the tracker alone.
            # The order alternates (off-on, on-off, ...) so that a drift in the machine's speed cancels.
            tracker = MlflowTracker(tracking_uri=uri, experiment="overhead-bench")
            if i % 2 == 0:
                off = timed_run(cfg, None, Path(tmp) / f"off-{i}")
                on = timed_run(cfg, tracker, Path(tmp) / f"on-{i}")
            else:
                on = timed_run(cfg, tracker, Path(tmp) / f"on-{i}")
                off = timed_run(cfg, None, Path(tmp) / f"off-{i}")
            rows.append((off, on, tracker.log_seconds, tracker.background_seconds))

    print(f"{'pair':<6}{'off s':>9}{'on s':>9}{'difference':>12}{'in hooks s':>12}{'tracker thread s':>18}")
    for i, (off, on, hooks, thread) in enumerate(rows):
        print(f"{i:<6}{off:>9.2f}{on:>9.2f}{100 * (on - off) / off:>+11.2f}%{hooks:>12.2f}{thread:>18.2f}")
    overhead = statistics.median(100 * (on - off) / off for off, on, _, _ in rows)
    hooks = statistics.median(100 * h / on for _, on, h, _ in rows)
    print(f"median time inside the tracker's hooks: {hooks:.2f}% of the tracked run")
    print(
        f"tracking overhead: {overhead:+.2f}% wall time, tracked vs untracked "
        f"(median of {len(rows)} interleaved pairs of {cfg.search.cycles}-cycle runs); target < 2%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

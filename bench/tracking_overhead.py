"""What MLflow tracking costs a run: the default digits experiment with the
tracker off and on, side by side in one process, against a fresh SQLite store.

    python bench/tracking_overhead.py            # experiments/digits.toml as it is
    python bench/tracking_overhead.py --tiny     # a seconds-long smoke run

The headline (last line) is the tracker's time as a share of the tracked run's
wall time, measured directly and counted conservatively: the time the training
loop spends inside the tracker's hooks plus all the busy time of the tracker's
own thread (metrics, pictures, files, checkpoint uploads), as if none of it
overlapped with training. The wall-time difference between the two runs is
printed too; on a busy machine it is dominated by noise.
The store is created before timing (a one-off per store, like a user's
existing ``mlruns/``); imports happen before timing as well.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args(argv)
    cfg = load(args.experiment, [*(TINY if args.tiny else []), *args.overrides])

    with tempfile.TemporaryDirectory(prefix="asolab-bench-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        MlflowClient(uri).search_experiments()  # create the store's tables outside the timing
        # Both runs write checkpoints after every phase, so the difference is the tracker alone.
        off = timed_run(cfg, None, Path(tmp) / "off")
        tracker = MlflowTracker(tracking_uri=uri, experiment="overhead-bench")
        on = timed_run(cfg, tracker, Path(tmp) / "on")

    rows = [("off", off, 0.0), ("on", on, tracker.log_seconds)]
    print(f"{'tracker':<8}{'wall s':>10}{'in tracker s':>14}")
    for name, wall, inside in rows:
        print(f"{name:<8}{wall:>10.2f}{inside:>14.2f}")
    print(f"tracker thread (metrics, pictures, files, checkpoints): {tracker.background_seconds:.2f} s busy")
    print(f"wall-time difference: {100 * (on - off) / off:+.2f}% (noise included)")
    cost = tracker.log_seconds + tracker.background_seconds
    print(
        f"tracking overhead: {100 * cost / on:.2f}% of wall time ({tracker.log_seconds:.2f} s in the training loop "
        f"+ {tracker.background_seconds:.2f} s on the tracker's thread, over a {on:.1f} s run of {cfg.search.cycles} cycles)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

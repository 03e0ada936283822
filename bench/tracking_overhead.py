"""What MLflow tracking costs a run: the default digits experiment with the
tracker off and on, side by side in one process, against a fresh SQLite store.

    python bench/tracking_overhead.py                   # experiments/digits.toml, 6 pairs of runs
    python bench/tracking_overhead.py --compare-modes   # also: store writes on a thread vs inline
    python bench/tracking_overhead.py --tiny            # a seconds-long smoke run (no warm-up)

The headline (last line) is what the issue's target is about: the wall time of
the tracked run over the untracked one. After one untimed warm-up run, rounds
run the variants in rotating order (off-on, on-off, ...) so that a drift in the
machine's speed hits every variant alike; the headline is the median of the
per-round differences. The tracker runs as ``asolab run`` runs it (write mode
``auto``: inline for a local SQLite store). ``--compare-modes`` adds the
tracker with its store writes on a background thread, the mode used for remote
stores, to show why a local store writes inline. The time the training loop
spent inside the tracker's hooks (inline writes included) and the time spent
in store writes (``writes s``, inline or on the thread) are printed as well.
The store is created before timing (a one-off per store, like a user's
existing ``mlruns/``); imports happen before timing as well. A tiny tracked run,
untimed, pays the tracker's one-off costs (lazy imports, MLflow's scan of the
installed packages when it first logs a model).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlflow import MlflowClient

from asolab.compare.arms import paired_ci
from asolab.config import load
from asolab.options import add_set
from asolab.runner import Runner
from asolab.tracking import MlflowTracker

TINY = [
    "device=cpu",
    "search.cycles=1",
    "search.w_epochs=1",
    "search.alpha_epochs=1",
    "search.retrain_epochs=1",
    "search.final_epochs=1",
    "space.init_channels=4",
    "data.train_subset=128",
]
# --tiny alone (TINY also sizes the full run's untimed warm-up): no final epoch, which
# would train on the whole training split, most of a tiny run's time
TINY_ONLY = ["search.final_epochs=0"]


def timed_run(cfg, tracker: MlflowTracker | None, checkpoint_dir: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (all threads of this process) of one run."""
    start, cpu = time.perf_counter(), time.process_time()
    Runner(cfg, [tracker] if tracker else [], checkpoint_dir=checkpoint_dir).run()
    return time.perf_counter() - start, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "experiment",
        nargs="?",
        default=None,
        help="experiment file (default: experiments/digits.toml)",
    )
    ap.add_argument("--tiny", action="store_true", help="a tiny configuration (smoke test)")
    ap.add_argument(
        "--repeats", type=int, default=6, help="rounds of runs, in rotating order (default 6)"
    )
    ap.add_argument(
        "--compare-modes",
        action="store_true",
        help="also time the tracker writing on a background thread",
    )
    add_set(ap)
    args = ap.parse_args(argv)
    cfg = load(args.experiment, [*(TINY + TINY_ONLY if args.tiny else []), *args.overrides])
    variants = ["off", "on", *(["thread"] if args.compare_modes else [])]

    rounds: list[dict[str, tuple[float, float, float, float]]] = []
    with tempfile.TemporaryDirectory(prefix="asolab-bench-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        MlflowClient(uri).search_experiments()  # create the store's tables outside the timing
        if not args.tiny:  # a smoke run's figures mean nothing: no warm-up for them
            timed_run(
                cfg, None, Path(tmp) / "warm-up"
            )  # first-run costs (allocator, kernels, caches) hit neither variant
            # The tracker's one-off costs (lazy imports, MLflow's scan of the installed
            # packages when it first logs a model) are paid by a tiny tracked run, untimed.
            warm = MlflowTracker(tracking_uri=uri, experiment="overhead-bench-warm-up")
            timed_run(
                load(args.experiment, [*TINY, *args.overrides]), warm, Path(tmp) / "warm-up-2"
            )
        for i in range(max(1, args.repeats)):
            # Every run writes the same local checkpoints, so a difference is the tracker alone.
            # The order rotates so that a drift in the machine's speed cancels.
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            if i % 2:
                order.reverse()
            result = {}
            for name in order:
                tracker = None
                if name != "off":
                    tracker = MlflowTracker(
                        tracking_uri=uri,
                        experiment="overhead-bench",
                        write_mode="thread" if name == "thread" else "auto",
                    )
                seconds, cpu = timed_run(cfg, tracker, Path(tmp) / f"{name}-{i}")
                result[name] = (
                    seconds,
                    tracker.log_seconds if tracker else 0.0,
                    tracker.write_seconds if tracker else 0.0,
                    cpu,
                )
            rounds.append(result)

    tracked = [v for v in variants if v != "off"]
    header = f"{'round':<7}{'off s':>8}" + "".join(
        f"{v + ' s':>10}{v + ' diff':>12}{'in hooks s':>12}{'writes s':>10}" for v in tracked
    )
    print(header)
    for i, r in enumerate(rounds):
        off = r["off"][0]
        cells = "".join(
            (
                f"{r[v][0]:>10.2f}{100 * (r[v][0] - off) / off:>+11.2f}%"
                f"{r[v][1]:>12.2f}{r[v][2]:>10.2f}"
            )
            for v in tracked
        )
        print(f"{i:<7}{off:>8.2f}{cells}")

    def median_overhead(variant: str) -> float:
        return statistics.median(100 * (r[variant][0] - r["off"][0]) / r["off"][0] for r in rounds)

    hooks = statistics.median(100 * r["on"][1] / r["on"][0] for r in rounds)
    print(f"median time inside the tracker's hooks: {hooks:.2f}% of the tracked run")
    # CPU time barely moves with what the machine's other tenants do (time stolen from
    # this machine's cores is not counted), wall time does: on a shared machine this is
    # the steadier comparison of the same work.
    cpu = statistics.median(100 * (r["on"][3] - r["off"][3]) / r["off"][3] for r in rounds)
    print(f"CPU time (all threads), tracked vs untracked: {cpu:+.2f}% (median of {len(rounds)})")
    if "thread" in variants:
        print(
            "store writes on a background thread instead: "
            f"{median_overhead('thread'):+.2f}% wall time (median of {len(rounds)})"
        )
    # The pairs' spread on a shared machine is far wider than the tracker's cost: the
    # interval says what the wall-time pairs can and cannot resolve.
    low, high = paired_ci([100 * (r["on"][0] - r["off"][0]) / r["off"][0] for r in rounds])
    print(f"wall time, tracked vs untracked: 95% interval of the mean {low:+.2f}% .. {high:+.2f}%")
    print(
        f"tracking overhead: {median_overhead('on'):+.2f}% wall time, tracked vs untracked "
        f"(median of {len(rounds)} interleaved pairs of {cfg.search.cycles}-cycle runs); "
        "target < 2%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

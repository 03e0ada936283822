"""Data pipeline share: how much of a W-training epoch waits for data.

    python bench/data_pipeline.py                      # digits and Fashion-MNIST
    python bench/data_pipeline.py --datasets digits --epochs 3
    python bench/data_pipeline.py --smoke

A W-training epoch as the runner runs it (``Batches`` over the train split
with the data set's batched augmentation, a sampled path per step, SGD); the
time spent inside the ``Batches`` iterator (indexing, shuffling, augmentation)
is summed and divided by the epoch's wall time. Fashion-MNIST searches on a
``data.train_subset`` (default 4096 images, as a search would). The headline
(last line) is the largest share; the target is under 5%.
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import machine, table

from asolab.config import load
from asolab.data import Batches
from asolab.options import add_set
from asolab.runner import Runner


def measure(
    dataset: str, epochs: int, subset: int, overrides: list[str]
) -> tuple[int, float, float]:
    """(images, seconds waiting for data, epoch seconds) over ``epochs`` W-training epochs."""
    sets = [
        "device=cpu",
        "tracking.enabled=false",
        f"data.name={dataset!r}",
        f"data.train_subset={subset}",
        *overrides,
    ]
    runner = Runner(load(None, sets))
    runner.net.train()
    tau = runner.temperature()
    # Warm-up steps outside the timing: first calls of each op allocate and dispatch slowly.
    for x, y in list(
        Batches(runner.data.train.head(4 * runner.cfg.data.batch_size), runner.cfg.data.batch_size)
    ):
        runner.weight_step(x, y, runner.net.sample_plans(tau, differentiable=False))
    waiting = total = 0.0
    images = 0
    for _ in range(epochs):
        start = time.perf_counter()
        it = iter(
            Batches(
                runner.data.train,
                runner.cfg.data.batch_size,
                runner.shuffle,
                runner.data.augmentation,
            )
        )
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                waiting += time.perf_counter() - t0
                break
            waiting += time.perf_counter() - t0
            runner.weight_step(x, y, runner.net.sample_plans(tau, differentiable=False))
            images += len(y)
        total += time.perf_counter() - start
    return images, waiting, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="digits,fashion_mnist", help="comma-separated data sets")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument(
        "--subset",
        type=int,
        default=4096,
        help="data.train_subset (0 = all; digits has 1150 train images)",
    )
    add_set(ap)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = ap.parse_args(argv)
    overrides = list(args.overrides)
    if args.smoke:
        args.epochs, args.subset = 1, 64
        overrides += ["space.init_channels=4", "threads=1"]
    rows, shares = [], []
    for name in args.datasets.split(","):
        images, waiting, total = measure(name, args.epochs, args.subset, overrides)
        share = 100 * waiting / total
        shares.append((share, name))
        rows.append([name, images, total, waiting, images / total, f"{share:.2f}%"])
    print(
        f"# W-training epochs, batch size and augmentation of experiments/digits.toml; {machine()}"
    )
    print(table(["data set", "images", "epoch s", "in Batches s", "img/s", "data share"], rows))
    worst, name = max(shares)
    print(f"data pipeline share of W-training time: {worst:.2f}% at most ({name}); target < 5%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

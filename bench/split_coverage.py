"""How often a carved split lacks a class of an imbalanced set, with and without
``data.stratify``: a count, not a timing (the same on every machine).

    python bench/split_coverage.py                 # digits cut to a long tail, seeds 0-99
    python bench/split_coverage.py --seeds 20 --tail 0.5 --subset 200

The set: scikit-learn's digits with class k cut to ``round(180 * tail**k)`` images
(tail 0.6: 178, all the zeros, then 108, 65, 39, 23, 14, 8, 5, 3, 2), as an ``.npz``
in a temporary folder. For each seed the data are loaded as a run loads them (``load_data``: the
test carve from ``data.split_seed``, the validation carve and the search subset of
``--subset`` images from the seed), once at random and once per class. Printed per
split: the seeds whose split lacks at least one class the data set could have put
there, and the classes missing, summed over the seeds. No network is trained.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import table
from sklearn.datasets import load_digits

from asolab import config
from asolab.data import load_data

SPLITS = ("test", "validation", "search")


def long_tail(folder: Path, tail: float) -> tuple[Path, list[int]]:
    """Digits with class k cut to ``round(180 * tail**k)`` images (at least 1, at most
    all of them): the ``.npz`` and the counts."""
    digits = load_digits()
    keep, counts = [], []
    for k in range(10):
        members = np.flatnonzero(digits.target == k)
        n = max(1, round(180 * tail**k))
        keep.append(members[:n])
        counts.append(min(n, len(members)))
    idx = np.concatenate(keep)
    path = folder / "digits_tail.npz"
    np.savez(path, x_train=digits.images[idx].astype(np.float32), y_train=digits.target[idx])
    return path, counts


def coverage(path: Path, seeds: int, subset: int, stratify: bool) -> dict[str, list[int]]:
    """Per split: the seeds whose split lacks a class, and the classes missing in all."""
    out = {split: [0, 0] for split in SPLITS}
    for seed in range(seeds):
        cfg = config.DataConfig(
            name="arrays", path=str(path), train_subset=subset, stratify=stratify
        )
        notes = load_data(cfg, seed=seed).notes
        for split in SPLITS:
            note = notes.get(f"missing_{split}")
            if note:  # "... holds no image of N of its K classes ..."
                out[split][0] += 1
                out[split][1] += int(note.split(" holds no image of ")[1].split()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--tail", type=float, default=0.6, help="class k keeps 180 * tail**k images")
    p.add_argument("--subset", type=int, default=100, help="data.train_subset (the search's)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path, counts = long_tail(Path(tmp), args.tail)
        print(f"digits cut to a long tail: {sum(counts)} images, per class {counts}")
        print(f"data.train_subset = {args.subset}, seeds 0-{args.seeds - 1}")
        rows = []
        for stratify in (False, True):
            found = coverage(path, args.seeds, args.subset, stratify)
            label = "stratified" if stratify else "random"
            rows += [
                (label, split, f"{seeds}/{args.seeds}", str(classes))
                for split, (seeds, classes) in found.items()
            ]
    print(table(["carve", "split", "seeds lacking a class", "classes missing"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

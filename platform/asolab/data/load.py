"""``load_data``: a registered data set, loaded, checked and split deterministically.

Splits: ``test`` is the data set's own test split (sets without one, digits
among them, get a fixed carve-out from ``data.split_seed``); ``val`` is carved
out of the training data from the run's seed and is what alpha-training and
every selection use. The test split is reported, never optimised. Each carve is
random, or per class with ``data.stratify`` (:mod:`.splits`); a carved split, the
search subset or the training split that lacks a class gets a note naming it, as do
test and validation images that are copies of training images. A set without
declared normalisation is normalised by the per-channel mean and std of its
training split (everything but the test split), recorded with the run.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..config import DataConfig
from ..plugins import PluginError
from .checks import channel_stats, standardise
from .core import (
    NOTE_COPIES,
    NOTE_MISSING,
    Arrays,
    Augmentation,
    DataBundle,
    DataError,
    DatasetSpec,
    Split,
    dropped,
)
from .registry import REGISTRY
from .splits import Rows, copies, fingerprints, missing_classes, stratified_order

log = logging.getLogger(__name__)


def _check_val_size(fraction: float, n_val: int, n: int, name: str, need: int) -> None:
    """Refuse a validation split smaller than the number of classes.

    Alpha-training, the per-epoch val_acc, the choice of the final network and
    every study objective are measured on it: an empty split makes them all 0,
    and one with fewer examples than classes cannot hold an example of every
    class, so the search would steer by a measurement blind to some classes.
    """
    if n_val >= need:
        return
    least = math.ceil(need / n * 10_000) / 10_000  # 4 decimals, rounded up: n * least >= need
    raise DataError(
        f"data.val_fraction = {fraction:g} holds out {n_val} of the {n} training examples of "
        f"{name} for validation, which needs at least {need} (one per class: alpha-training "
        f"and selection are measured on it); use data.val_fraction >= {least:g}"
    )


def _check_train_subset(cfg: DataConfig, n: int, need: int) -> None:
    """Refuse a search subset that cannot hold one example per class (``train_subset = 1``
    would train on one image without a word); warn when it is less than one batch."""
    subset = cfg.train_subset
    if not subset or subset >= n:
        return
    if subset < need:
        raise DataError(
            f"data.train_subset = {subset} keeps {subset} of the {n} training examples of "
            f"{cfg.name} for the search, fewer than its {need} classes; use "
            f"data.train_subset >= {need} (0 = all)"
        )
    if subset < cfg.batch_size:
        log.warning(
            "data.train_subset = %d is less than data.batch_size = %d: each search epoch is "
            "one step on %d examples",
            subset,
            cfg.batch_size,
            subset,
        )


# data.drop_last warns when an epoch would leave out more than this share of a split
DROP_WARN_SHARE = 0.25


def _check_drop_last(cfg: DataConfig, sizes: dict[str, int]) -> None:
    """Warn when ``data.drop_last`` leaves out more than a quarter of a training split each
    epoch (a small own data set at a large batch): the run still trains, on less data."""
    if not cfg.drop_last:
        return
    for what, n in sizes.items():
        left = dropped(n, cfg.batch_size)
        if left > DROP_WARN_SHARE * n:
            log.warning(
                "data.drop_last leaves out %d of the %d %s images each epoch (%.0f%%); a "
                "data.batch_size that divides %d, or a smaller one, keeps more",
                left,
                n,
                what,
                100 * left / n,
                n,
            )


def _order(cfg: DataConfig, y: np.ndarray, n_first: int, draw: np.random.Generator) -> np.ndarray:
    """The order a carve takes its first ``n_first`` examples from: per class with
    ``data.stratify``, else at random (the draw every run made before the setting)."""
    return stratified_order(y, n_first, draw) if cfg.stratify else draw.permutation(len(y))


# the splits a note of missing classes names, by its key's end
SPLIT_TITLES = {
    "training": "training split",
    "test": "test split",
    "validation": "validation split (alpha-training, selection)",
    "search": "search subset (data.train_subset)",
}
# a note of classes missing from a split names at most this many
NAMED_CLASSES = 5


def _missing_classes(
    cfg: DataConfig,
    training: tuple[np.ndarray, np.ndarray],
    carved: dict[str, tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    names: tuple[str, ...] | None,
) -> dict[str, str]:
    """A note (``NOTE_MISSING`` + the split) for the training split (``training``: its
    labels and the data set's) if it holds no image of a class, and for each carved split
    (``carved``: its labels and those it was carved from) that lacks a class it could have
    held: rare classes of an imbalanced set, left out by a random carve. The network is
    built for every class; what is blind to one says so, with the fix: ``data.stratify``,
    or more images of a class too rare for a carve per class to reach every split."""
    splits = {"training": (training[0], np.arange(num_classes))}
    for what, (y, source) in carved.items():
        splits[what] = (y, np.unique(source))
    notes = {}
    for what, (y, expected) in splits.items():
        missing = missing_classes(y, expected)
        if not len(missing):
            continue
        named = [names[c] if names else str(c) for c in missing[:NAMED_CLASSES]]
        more = f" and {len(missing) - NAMED_CLASSES} more" if len(missing) > NAMED_CLASSES else ""
        carve = "data.stratify = true carves each split per class"
        if what == "training":
            fix = "the network is built for them but never trains on them"
            # carved out of training at random; else not in the data set at all
            if not cfg.stratify and np.isin(missing, training[1]).all():
                fix += f"; {carve}"
        elif cfg.stratify:
            fix = "too few images of them to carve into every split"
        else:
            fix = carve
        notes[NOTE_MISSING + what] = (
            f"the {SPLIT_TITLES[what]} holds no image of {len(missing)} of its "
            f"{len(expected)} classes ({', '.join(named)}{more}): {fix}"
        )
    return notes


def _spec(name: str) -> DatasetSpec:
    if name not in REGISTRY:
        raise DataError(f"unknown data set {name!r}; known: {', '.join(REGISTRY)}")
    try:
        return REGISTRY[name]
    except PluginError as exc:
        raise DataError(str(exc)) from None


def _load(spec: DatasetSpec, cfg: DataConfig) -> Arrays:
    """The loader's arrays, checked; a plugin's own failure is one line naming it."""
    origin = REGISTRY.origin(cfg.name)
    where = f"data set {cfg.name!r}" + ("" if REGISTRY.builtin(cfg.name) else f" ({origin})")
    try:
        raw = spec.loader(cfg)
    except DataError:
        raise
    except Exception as exc:  # a plugin's loader can fail in any way; say which one failed
        if REGISTRY.builtin(cfg.name):
            raise
        log.debug("loader of %s failed", cfg.name, exc_info=True)
        raise DataError(f"{where}: its loader failed: {type(exc).__name__}: {exc}") from None
    return standardise(spec, raw, where, cfg.image_size, cfg.layout)


def _to(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A split onto its device, once per run: to CUDA through pinned memory without
    blocking, so the copies of the splits overlap (batches never leave the device)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass(frozen=True)
class _Carved:
    """The splits as indices: the training images (``x``, ``y``: the test split carved
    out where the set has none), the validation and training indices into them (the
    search subset the training order's head), and the notes of what the splits hold
    (classes a split lacks, copies of training images)."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    val: np.ndarray
    train: np.ndarray
    notes: dict[str, str]


def _carve(cfg: DataConfig, a: Arrays, seed: int) -> _Carved:
    """The test carve from ``split_seed`` (where the set has none), then the validation
    carve and the search subset's order from ``seed``: at random, or per class."""
    xtr, ytr, xte, yte = a.x_train, a.y_train, a.x_test, a.y_test
    carved = {}  # the splits asolab carves: their labels and those carved from
    if xte is None or yte is None:
        n_test = int(round(cfg.test_fraction * len(ytr)))
        perm = _order(cfg, ytr, n_test, np.random.default_rng(cfg.split_seed))
        xte, yte = xtr[perm[:n_test]], ytr[perm[:n_test]]
        xtr, ytr = xtr[perm[n_test:]], ytr[perm[n_test:]]
        carved["test"] = (yte, a.y_train)
    num_classes = int(a.num_classes or 0)
    draw = np.random.default_rng(seed)
    n_val = int(round(cfg.val_fraction * len(ytr)))
    perm = _order(cfg, ytr, n_val, draw)
    _check_val_size(cfg.val_fraction, n_val, len(ytr), cfg.name, num_classes)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    _check_train_subset(cfg, len(train_idx), num_classes)
    carved["validation"] = (ytr[val_idx], ytr)
    if 0 < cfg.train_subset < len(train_idx):
        if cfg.stratify:  # the search's head too
            order = stratified_order(ytr[train_idx], cfg.train_subset, draw, both_sides=False)
            train_idx = train_idx[order]
        carved["search"] = (ytr[train_idx[: cfg.train_subset]], ytr[train_idx])
    training = (ytr[train_idx], a.y_train)
    notes = _missing_classes(cfg, training, carved, num_classes, a.classes)
    notes.update(_copies(xtr, val_idx, train_idx, xte, own_test="test" not in carved))
    return _Carved(xtr, ytr, xte, yte, val_idx, train_idx, notes)


def _copies(
    xtr: np.ndarray, val_idx: np.ndarray, train_idx: np.ndarray, xte: np.ndarray, own_test: bool
) -> dict[str, str]:
    """A note (``NOTE_COPIES`` + the split) for the test split if it holds exact copies of
    images the run trains or selects on (the training and validation splits), and for the
    validation split if it holds copies of training images: their accuracy then counts
    images the network has seen."""
    prints = fingerprints(xtr)
    test = Rows(xte, fingerprints(xte), np.arange(len(xte)))
    in_test = copies(test, Rows(xtr, prints, np.arange(len(xtr))))
    in_val = copies(Rows(xtr, prints, val_idx), Rows(xtr, prints, train_idx))
    found = {
        "test": (in_test, len(xte), "training or validation"),
        "validation": (in_val, len(val_idx), "training"),
    }
    notes = {}
    for what, (n, total, seen) in found.items():
        if not n:
            continue
        where = "the test split (test/, x_test)" if what == "test" and own_test else "the data set"
        notes[NOTE_COPIES + what] = (
            f"{n} of the {total} {what} images ({100 * n / total:.2g}%) are exact copies of "
            f"{seen} images: the {what} accuracy counts images the run has seen; remove the "
            f"copies from {where}"
        )
    return notes


def load_data(cfg: DataConfig, seed: int, device: torch.device | str = "cpu") -> DataBundle:
    """Load ``cfg.name`` and split it deterministically (test from ``split_seed``, val from
    ``seed``)."""
    spec = _spec(cfg.name)
    a = _load(spec, cfg)
    c = _carve(cfg, a, seed)
    xtr, ytr, train_idx, val_idx = c.x, c.y, c.train, c.val
    mean_, std_ = (a.mean, a.std) if a.mean and a.std else channel_stats(xtr)
    mean = torch.tensor(mean_, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(std_, dtype=torch.float32).view(1, -1, 1, 1)

    def split(x: np.ndarray, y: np.ndarray) -> Split:
        xt = (torch.from_numpy(np.ascontiguousarray(x)) - mean) / std
        return Split(_to(xt, device), _to(torch.from_numpy(np.ascontiguousarray(y)), device))

    full_train = split(xtr[train_idx], ytr[train_idx])
    train = full_train.head(cfg.train_subset) if cfg.train_subset else full_train
    height, width = int(xtr.shape[2]), int(xtr.shape[3])
    bundle = DataBundle(
        name=cfg.name,
        train=train,
        val=split(xtr[val_idx], ytr[val_idx]),
        test=split(c.x_test, c.y_test),
        full_train=full_train,
        num_classes=int(a.num_classes or 0),
        in_channels=int(xtr.shape[1]),
        image_size=max(height, width),
        augmentation=spec.augmentation if cfg.augment else Augmentation(),
        source=a.source,
        mean=tuple(float(m) for m in mean_),
        std=tuple(float(s) for s in std_),
        origin=str(REGISTRY.origin(cfg.name)),
        height=height,
        width=width,
        classes=a.classes,
        notes={**a.notes, **c.notes},
    )
    log.info("data set %s: %s", cfg.name, bundle.summary())
    # the search's and the final stage's training split, named once where they are one
    whole = len(train) == len(full_train)
    trained = {"training": train} if whole else {"search": train, "final": full_train}
    splits = {**trained, "validation (alpha-training)": bundle.val}
    _check_drop_last(cfg, {what: len(split) for what, split in splits.items()})
    for note in bundle.notes.values():
        log.info("data set %s: %s", cfg.name, note)
    return bundle

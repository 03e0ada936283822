"""Data sets: a registry of in-memory image sets with deterministic splits.

Every data set is held as normalised float tensors (the small sets asolab
searches on fit in memory many times over), batched by :class:`Batches`, and
augmented a whole batch at a time (random translation and flips as tensor ops),
so no time goes to per-sample PIL transforms.

Splits: ``test`` is the data set's own test split (digits, which has none, gets
a fixed carve-out from ``data.split_seed``); ``val`` is carved out of the
training data from the run's seed and is what alpha-training and every
selection use. The test split is reported, never optimised.
"""

from __future__ import annotations

import gzip
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .config import DataConfig

log = logging.getLogger(__name__)

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


class DataError(RuntimeError):
    """A data set could not be found or read; the message says how to get it."""


@dataclass(frozen=True)
class Augmentation:
    """Batched augmentation: random translation by up to ``shift`` pixels, optional flip."""

    shift: int = 0
    flip: bool = False

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        n = x.shape[0]
        if self.flip:
            mask = torch.rand(n, generator=generator) < 0.5
            x = torch.where(mask.to(x.device).view(n, 1, 1, 1), x.flip(3), x)
        if self.shift:
            x = _translate(
                x, torch.randint(-self.shift, self.shift + 1, (n, 2), generator=generator)
            )
        return x


def _translate(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Shift each image by whole pixels (zero fill) with one gather."""
    n, c, h, w = x.shape
    s = shifts.max().abs().item() if shifts.numel() else 0
    s = int(max(s, shifts.min().abs().item()))
    if s == 0:
        return x
    padded = F.pad(x, (s, s, s, s))
    dy = (s - shifts[:, 0]).to(x.device)
    dx = (s - shifts[:, 1]).to(x.device)
    rows = (
        (dy.view(n, 1) + torch.arange(h, device=x.device))
        .view(n, 1, h, 1)
        .expand(n, c, h, w + 2 * s)
    )
    out = padded.gather(2, rows)
    cols = (dx.view(n, 1) + torch.arange(w, device=x.device)).view(n, 1, 1, w).expand(n, c, h, w)
    return out.gather(3, cols)


@dataclass(frozen=True)
class DatasetSpec:
    """How to load one data set and what belongs to it."""

    name: str
    loader: Callable[
        [DataConfig], tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]
    ]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int
    augmentation: Augmentation
    how_to_get: str


def _load_digits(cfg: DataConfig):
    # Read scikit-learn's bundled CSV directly: importing sklearn costs ~140 MB of RSS
    # (scipy and friends) that a run never needs. find_spec locates it without importing it.
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    csv = (
        Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
        if spec
        else None
    )
    if csv is not None and csv.exists():
        table = np.loadtxt(csv, delimiter=",", dtype=np.float32)
        images, target = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images, target = bunch.images, bunch.target
    x = (images.astype(np.float32) / 16.0)[:, None]  # N,1,8,8 in [0,1]
    return x, target.astype(np.int64), None, None


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes (the MNIST format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
        if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":  # zero, zero, type 0x08 = unsigned byte
            raise ValueError("not an IDX file of unsigned bytes")
        ndim = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
        return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    except (OSError, EOFError, ValueError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(
            f"data file {path} is unreadable or truncated ({exc}); reinstall it or point "
            "data.data_dir at a good copy"
        ) from None


def _find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(stem)


def _load_fashion_mnist(cfg: DataConfig):
    folder = Path(cfg.data_dir) if cfg.data_dir else FASHION_MNIST_DIR
    try:
        arrays = [
            _read_idx(_find_idx(folder, stem))
            for stem in (
                "train-images-idx3-ubyte",
                "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte",
            )
        ]
    except FileNotFoundError as exc:
        raise DataError(
            f"data set 'fashion_mnist': {exc} not found in {folder}; "
            f"{REGISTRY['fashion_mnist'].how_to_get}"
        ) from None
    xtr, ytr, xte, yte = arrays
    return (
        (xtr.astype(np.float32) / 255.0)[:, None],
        ytr.astype(np.int64),
        (xte.astype(np.float32) / 255.0)[:, None],
        yte.astype(np.int64),
    )


def _torchvision_loader(cls_name: str) -> Callable:
    def load(cfg: DataConfig):
        import torchvision

        cls = getattr(torchvision.datasets, cls_name)
        root = cfg.data_dir or "data"
        try:
            train = cls(root, train=True, download=cfg.download)
            test = cls(root, train=False, download=cfg.download)
        except RuntimeError as exc:
            name = cls_name.lower()
            raise DataError(
                f"data set '{name}' not found in {root!r} ({exc}); {REGISTRY[name].how_to_get}"
            ) from None
        return (
            _as_array(train),
            np.asarray(train.targets, dtype=np.int64),
            _as_array(test),
            np.asarray(test.targets, dtype=np.int64),
        )

    return load


def _as_array(ds) -> np.ndarray:
    data = ds.data.numpy() if isinstance(ds.data, torch.Tensor) else np.asarray(ds.data)
    data = data.astype(np.float32) / 255.0
    return data[:, None] if data.ndim == 3 else data.transpose(0, 3, 1, 2)


_TV_HINT = (
    "set data.data_dir to a folder holding it, or data.download = true to let torchvision fetch "
    "it there"
)

REGISTRY: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(
        "digits",
        _load_digits,
        (0.3055,),
        (0.3796,),
        10,
        Augmentation(shift=1),
        "it ships with scikit-learn: pip install scikit-learn",
    ),
    "fashion_mnist": DatasetSpec(
        "fashion_mnist",
        _load_fashion_mnist,
        (0.2860,),
        (0.3530,),
        10,
        Augmentation(shift=2, flip=True),
        "install Debian's package (apt-get install dataset-fashion-mnist) or set data.data_dir "
        "to a folder with the four IDX files",
    ),
    "mnist": DatasetSpec(
        "mnist",
        _torchvision_loader("MNIST"),
        (0.1307,),
        (0.3081,),
        10,
        Augmentation(shift=2),
        _TV_HINT,
    ),
    "cifar10": DatasetSpec(
        "cifar10",
        _torchvision_loader("CIFAR10"),
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        10,
        Augmentation(shift=4, flip=True),
        _TV_HINT,
    ),
    "cifar100": DatasetSpec(
        "cifar100",
        _torchvision_loader("CIFAR100"),
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        100,
        Augmentation(shift=4, flip=True),
        _TV_HINT,
    ),
}


@dataclass
class Split:
    """One split as tensors on the run's device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def head(self, n: int) -> Split:
        return Split(self.x[:n], self.y[:n])


@dataclass
class DataBundle:
    """The three splits of a data set plus what the model needs to know about it."""

    name: str
    train: Split
    val: Split
    test: Split
    full_train: Split
    num_classes: int
    in_channels: int
    image_size: int
    augmentation: Augmentation

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "train": len(self.train),
            "full_train": len(self.full_train),
            "val": len(self.val),
            "test": len(self.test),
            "num_classes": self.num_classes,
            "in_channels": self.in_channels,
            "image_size": self.image_size,
        }


class Batches:
    """Iterates a split in (optionally shuffled, augmented) mini-batches."""

    def __init__(
        self,
        split: Split,
        batch_size: int,
        generator: torch.Generator | None = None,
        augmentation: Augmentation | None = None,
    ) -> None:
        self.split, self.batch_size = split, batch_size
        self.generator, self.augmentation = generator, augmentation

    def __len__(self) -> int:
        return -(-len(self.split) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.split)
        if self.generator is not None:
            order = torch.randperm(n, generator=self.generator).to(self.split.x.device)
        else:
            order = torch.arange(n, device=self.split.x.device)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            x, y = self.split.x[idx], self.split.y[idx]
            if self.augmentation is not None and self.generator is not None:
                x = self.augmentation(x, self.generator)
            yield x, y


def _check_val_size(fraction: float, n_val: int, n: int, spec: DatasetSpec) -> None:
    """Refuse a validation split smaller than the number of classes.

    Alpha-training, the per-epoch val_acc, the choice of the final network and
    every study objective are measured on it: an empty split makes them all 0,
    and one with fewer examples than classes cannot hold an example of every
    class, so the search would steer by a measurement blind to some classes.
    """
    need = spec.num_classes
    if n_val >= need:
        return
    least = math.ceil(need / n * 10_000) / 10_000  # 4 decimals, rounded up: n * least >= need
    raise DataError(
        f"data.val_fraction = {fraction:g} holds out {n_val} of the {n} training examples of "
        f"{spec.name} for validation, which needs at least {need} (one per class: alpha-training "
        f"and selection are measured on it); use data.val_fraction >= {least:g}"
    )


def _check_train_subset(cfg: DataConfig, n: int, spec: DatasetSpec) -> None:
    """Refuse a search subset that cannot hold one example per class (``train_subset = 1``
    would train on one image without a word); warn when it is less than one batch."""
    subset = cfg.train_subset
    if not subset or subset >= n:
        return
    if subset < spec.num_classes:
        raise DataError(
            f"data.train_subset = {subset} keeps {subset} of the {n} training examples of "
            f"{spec.name} for the search, fewer than its {spec.num_classes} classes; use "
            f"data.train_subset >= {spec.num_classes} (0 = all)"
        )
    if subset < cfg.batch_size:
        log.warning(
            "data.train_subset = %d is less than data.batch_size = %d: each search epoch is "
            "one step on %d examples",
            subset,
            cfg.batch_size,
            subset,
        )


def load_data(cfg: DataConfig, seed: int, device: torch.device | str = "cpu") -> DataBundle:
    """Load ``cfg.name`` and split it deterministically (test from ``split_seed``, val from
    ``seed``)."""
    if cfg.name not in REGISTRY:
        raise DataError(f"unknown data set {cfg.name!r}; known: {', '.join(REGISTRY)}")
    spec = REGISTRY[cfg.name]
    xtr, ytr, xte, yte = spec.loader(cfg)
    if xte is None:
        perm = np.random.default_rng(cfg.split_seed).permutation(len(ytr))
        n_test = int(round(cfg.test_fraction * len(ytr)))
        xte, yte = xtr[perm[:n_test]], ytr[perm[:n_test]]
        xtr, ytr = xtr[perm[n_test:]], ytr[perm[n_test:]]
    perm = np.random.default_rng(seed).permutation(len(ytr))
    n_val = int(round(cfg.val_fraction * len(ytr)))
    _check_val_size(cfg.val_fraction, n_val, len(ytr), spec)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    mean = torch.tensor(spec.mean).view(1, -1, 1, 1)
    std = torch.tensor(spec.std).view(1, -1, 1, 1)

    def split(x: np.ndarray, y: np.ndarray) -> Split:
        xt = (torch.from_numpy(np.ascontiguousarray(x)) - mean) / std
        return Split(xt.to(device), torch.from_numpy(np.ascontiguousarray(y)).to(device))

    _check_train_subset(cfg, len(train_idx), spec)
    full_train = split(xtr[train_idx], ytr[train_idx])
    train = full_train.head(cfg.train_subset) if cfg.train_subset else full_train
    bundle = DataBundle(
        name=spec.name,
        train=train,
        val=split(xtr[val_idx], ytr[val_idx]),
        test=split(xte, yte),
        full_train=full_train,
        num_classes=spec.num_classes,
        in_channels=int(xtr.shape[1]),
        image_size=int(xtr.shape[2]),
        augmentation=spec.augmentation if cfg.augment else Augmentation(),
    )
    log.info("data set %s: %s", spec.name, bundle.summary())
    return bundle

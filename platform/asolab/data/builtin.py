"""The data sets that come with asolab: digits, Fashion-MNIST, MNIST, CIFAR-10/100.

Each loader returns float arrays in [0, 1]; the declared mean/std are the
sets' usual normalisation constants.
"""

from __future__ import annotations

import functools
import gzip
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..config import DataConfig
from .core import Augmentation, DataError, DatasetSpec

log = logging.getLogger(__name__)

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


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
        table = _digits_table(csv)
        images, target = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images, target = bunch.images, bunch.target
    x = (images.astype(np.float32) / 16.0)[:, None]  # N,1,8,8 in [0,1]
    return x, target.astype(np.int64), None, None


@functools.lru_cache(maxsize=1)
def _digits_table(csv: Path) -> np.ndarray:
    """The digits CSV parsed once per process (30 ms each time: a study worker's trials and
    a ranking's stand-alone runs load it again and again), read-only: callers copy."""
    table = np.loadtxt(csv, delimiter=",", dtype=np.float32)
    table.setflags(write=False)
    return table


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
            f"{BUILTINS['fashion_mnist'].how_to_get}"
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
                f"data set '{name}' not found in {root!r} ({exc}); {BUILTINS[name].how_to_get}"
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


# per-channel mean and std of the training images
_MNIST = ((0.1307,), (0.3081,))
_CIFAR10 = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
_CIFAR100 = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
_CIFAR_AUGMENTATION = Augmentation(shift=4, flip=True)


def _torchvision(
    name: str,
    cls_name: str,
    stats: tuple[tuple[float, ...], tuple[float, ...]],
    classes: int,
    augmentation: Augmentation,
) -> DatasetSpec:
    """A data set that torchvision reads (or downloads) into data.data_dir."""
    mean, std = stats
    return DatasetSpec(
        name, _torchvision_loader(cls_name), mean, std, classes, augmentation, _TV_HINT
    )


BUILTINS: dict[str, DatasetSpec] = {
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
    "mnist": _torchvision("mnist", "MNIST", _MNIST, 10, Augmentation(shift=2)),
    "cifar10": _torchvision("cifar10", "CIFAR10", _CIFAR10, 10, Augmentation(shift=4, flip=True)),
    "cifar100": _torchvision(
        "cifar100", "CIFAR100", _CIFAR100, 100, Augmentation(shift=4, flip=True)
    ),
}

"""Check what a loader returned and bring it to one form: float32 ``(N, C, H, W)``,
int64 labels in ``[0, num_classes)``, a per-channel mean and std.

Built-in sets, folders, ``.npz`` files and plugins all pass through here, so every
one of them is refused the same way (one line, naming the data set, the array and
the fix) when its arrays do not make a classification data set.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .core import Arrays, DataError, DatasetSpec


def _images(x: object, what: str, where: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise DataError(f"{where}: {what} must be a numpy array, got {type(x).__name__}")
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise DataError(
            f"{where}: {what} has shape {x.shape}; images must be (N, H, W) or (N, C, H, W)"
        )
    _check_not_empty(x, what, where)
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(
            f"{where}: {what} has dtype {x.dtype}; images must be uint8 (0..255) or float"
        )
    x = x.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise DataError(f"{where}: {what} holds NaN or infinite values")
    return x


def _check_not_empty(x: np.ndarray, what: str, where: str) -> None:
    """Images need pixels and a channel: a 0x0 image would reach the network and fail
    there with a traceback."""
    if min(x.shape[1:]) == 0:
        raise DataError(
            f"{where}: {what} has shape {x.shape}: images of {x.shape[2]}x{x.shape[3]} pixels "
            f"with {x.shape[1]} channel(s); every image needs at least 1x1 pixels and a channel"
        )


def _check_class_numbers(y: np.ndarray, k: int, where: str) -> None:
    """Labels whose class count is inferred (their maximum + 1) must number the classes:
    most numbers below the maximum in use. One stray label of 10^6 would otherwise make
    a million-way classifier, and the error would blame the validation split."""
    present = len(np.unique(y))
    if k - present > present:
        raise DataError(
            f"{where}: y_train's labels run up to {k - 1}, so the data set would have {k} "
            f"classes, but only {present} of those numbers occur; labels must be class numbers "
            "0..K-1 (renumber them, e.g. np.unique(y, return_inverse=True)), or declare "
            "num_classes"
        )


def _labels(y: object, n: int, what: str, where: str, images: str) -> np.ndarray:
    if not isinstance(y, np.ndarray):
        raise DataError(f"{where}: {what} must be a numpy array, got {type(y).__name__}")
    y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.ndim != 1:
        raise DataError(f"{where}: {what} has shape {y.shape}; labels must be (N,)")
    if len(y) != n:
        raise DataError(
            f"{where}: {images} holds {n} images but {what} {len(y)} labels; they must match"
        )
    if np.issubdtype(y.dtype, np.floating) and np.array_equal(y, np.round(y)):
        y = y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: {what} has dtype {y.dtype}; labels must be whole class numbers")
    return y.astype(np.int64, copy=False)


def _check_range(y: np.ndarray, k: int, what: str, where: str) -> None:
    bad = (y < 0) | (y >= k)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{where}: {what}[{i}] = {int(y[i])} is out of range; labels must be in 0..{k - 1} "
            f"({k} classes)"
        )


def standardise(spec: DatasetSpec, raw: Arrays | tuple, where: str, image_size: int = 0) -> Arrays:
    """``raw`` checked and converted (resized to ``image_size`` when not 0) and
    ``num_classes`` filled in; ``mean``/``std`` are the declared ones or None."""
    a = raw if isinstance(raw, Arrays) else Arrays(*raw)
    if (a.x_test is None) != (a.y_test is None):
        raise DataError(f"{where}: give both x_test and y_test, or neither")
    xtr = _images(a.x_train, "x_train", where)
    xtr = resize(xtr, image_size) if image_size else xtr
    ytr = _labels(a.y_train, len(xtr), "y_train", where, "x_train")
    xte = yte = None
    if a.x_test is not None:
        xte = _images(a.x_test, "x_test", where)
        xte = resize(xte, image_size) if image_size else xte
        yte = _labels(a.y_test, len(xte), "y_test", where, "x_test")
        if xte.shape[1:] != xtr.shape[1:]:
            raise DataError(
                f"{where}: x_test images are {_shape(xte)} but x_train's {_shape(xtr)}; "
                "channels and sizes must agree (convert one split, or set data.image_size "
                "for sizes)"
                if xte.shape[1] == xtr.shape[1]
                else f"{where}: x_test has {xte.shape[1]} channel(s) but x_train "
                f"{xtr.shape[1]}; these cannot be reconciled: convert one split"
            )
    if len(ytr) == 0:
        raise DataError(f"{where}: the training split holds no images")
    k = spec.num_classes or a.num_classes or int(ytr.max()) + 1
    if not (spec.num_classes or a.num_classes) and ytr.min() >= 0:
        _check_class_numbers(ytr, k, where)
    _check_range(ytr, k, "y_train", where)
    if yte is not None:
        _check_range(yte, k, "y_test", where)
    present = len(np.unique(ytr))
    if present < 2:
        raise DataError(
            f"{where}: the training split holds one class only; classification needs two or more"
        )
    mean, std = spec.mean or a.mean, spec.std or a.std
    for what, stat in (("mean", mean), ("std", std)):
        if stat is not None and len(stat) not in (1, xtr.shape[1]):
            raise DataError(
                f"{where}: {what} has {len(stat)} values for {xtr.shape[1]}-channel images; give "
                "one per channel"
            )
    return Arrays(xtr, ytr, xte, yte, k, mean, std, a.source, a.classes)


def _shape(x: np.ndarray) -> str:
    return "x".join(str(d) for d in x.shape[1:])


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``(N, C, H, W)`` images (float64 sums: no drift on
    large sets); a constant channel gets std 1 so that normalising never divides by 0."""
    mean = x.mean(axis=(0, 2, 3), dtype=np.float64)
    std = x.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std > 1e-8, std, 1.0)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def resize(x: np.ndarray, size: int) -> np.ndarray:
    """Square ``size`` x ``size`` images, bilinear with antialiasing (in chunks: the
    float copy of a large set at once would double its memory)."""
    if x.shape[2] == size and x.shape[3] == size:
        return x
    out = np.empty((len(x), x.shape[1], size, size), dtype=np.float32)
    for i in range(0, len(x), 4096):
        chunk = torch.from_numpy(np.ascontiguousarray(x[i : i + 4096]))
        out[i : i + 4096] = F.interpolate(
            chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        ).numpy()
    return out

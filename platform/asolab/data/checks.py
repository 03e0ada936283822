"""Check what a loader returned and bring it to one form: float32 ``(N, C, H, W)``,
int64 labels in ``[0, num_classes)`` (labels given as class names numbered as the
names sort, or as ``classes`` lists them), a per-channel mean and std.

Built-in sets, folders, ``.npz`` files and plugins all pass through here, so every
one of them is refused the same way (one line, naming the data set, the array and
the fix) when its arrays do not make a classification data set.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from .core import NOTE_LAYOUT, NOTE_RESIZE, Arrays, DataError, DatasetSpec

# the channel counts that tell an image array's layout: grey, grey + alpha, RGB, RGBA
_CHANNELS = (1, 2, 3, 4)


def layout_of(shape: tuple[int, ...], layout: str, what: str, where: str) -> str:
    """``nchw`` or ``nhwc`` for a 4-dim image array: as ``data.layout`` says, or (auto)
    where the axis of 1 to 4 channels is, else which reading makes the images square; a
    shape that could be either is refused, with the key that settles it (read the wrong
    way, images train, badly, in silence)."""
    if layout != "auto":
        return layout
    second, last = shape[1] in _CHANNELS, shape[3] in _CHANNELS
    if second != last:
        return "nchw" if second else "nhwc"
    square_nchw, square_nhwc = shape[2] == shape[3], shape[1] == shape[2]
    if square_nchw != square_nhwc:
        return "nchw" if square_nchw else "nhwc"
    raise DataError(
        f"{where}: {what} has shape {tuple(shape)}, which could be (N, C, H, W) or (N, H, W, C); "
        'set data.layout = "nchw" or "nhwc"'
    )


def _images(x: object, what: str, where: str, layout: str = "auto") -> tuple[np.ndarray, str]:
    """``x`` as float ``(N, C, H, W)``, and the layout it was read in ("" for 3 dims)."""
    if not isinstance(x, np.ndarray):
        raise DataError(f"{where}: {what} must be a numpy array, got {type(x).__name__}")
    read = ""
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4:
        read = layout_of(x.shape, layout, what, where)
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if read == "nhwc" else x
    if x.ndim != 4:
        raise DataError(
            f"{where}: {what} has shape {x.shape}; images must be (N, H, W), (N, C, H, W) or "
            "(N, H, W, C)"
        )
    _check_not_empty(x, what, where)
    return _scaled(x, what, where), read


def _scaled(x: np.ndarray, what: str, where: str) -> np.ndarray:
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


def _is_named(y: object) -> bool:
    """Labels given as class names (text), not numbers."""
    return isinstance(y, np.ndarray) and y.dtype.kind in "US"


def _by_name(y: np.ndarray, index: Mapping[str, int], what: str, where: str) -> np.ndarray:
    """Names ``y`` as the class numbers ``index`` gives them; a name it lacks is refused."""
    names, inverse = np.unique(y.astype(str), return_inverse=True)
    numbers = np.array([index.get(n, -1) for n in names], dtype=np.int64)
    if (numbers < 0).any():
        i = int(np.argmax(numbers[inverse] < 0))
        raise DataError(
            f"{where}: {what}[{i}] = {str(y.astype(str).reshape(-1)[i])!r} is not a class of "
            f"{'classes' if what == 'y_train' else 'y_train'} ({', '.join(index)})"
        )
    return numbers[inverse].reshape(y.shape)


def _named_labels(a: Arrays, where: str) -> Arrays:
    """``a`` with labels given as class names (text) turned into class numbers: the
    k-th name of ``classes`` where given, else of the training labels' names sorted (as
    folders' classes are); the names become the set's classes."""
    if not (_is_named(a.y_train) or _is_named(a.y_test)):
        return a
    if a.y_test is not None and _is_named(a.y_train) != _is_named(a.y_test):
        raise DataError(
            f"{where}: y_train and y_test must both be class numbers or both class names "
            f"(text); here y_train is {a.y_train.dtype} and y_test {a.y_test.dtype}"
        )
    classes = tuple(a.classes) or tuple(str(n) for n in np.unique(a.y_train.astype(str)))
    index = {name: k for k, name in enumerate(classes)}
    y_test = None if a.y_test is None else _by_name(a.y_test, index, "y_test", where)
    return dataclasses.replace(
        a,
        y_train=_by_name(a.y_train, index, "y_train", where),
        y_test=y_test,
        num_classes=len(classes),
        classes=classes,
    )


def standardise(
    spec: DatasetSpec,
    raw: Arrays | tuple,
    where: str,
    image_size: int = 0,
    layout: str = "auto",
) -> Arrays:
    """``raw`` checked and converted (read in ``layout``, resized to ``image_size`` when
    not 0) and ``num_classes`` filled in; ``mean``/``std`` are the declared ones or None.
    What was done to the images that the data did not say (a layout told from the shape,
    a resize) is in the result's ``notes``."""
    a = raw if isinstance(raw, Arrays) else Arrays(*raw)
    if (a.x_test is None) != (a.y_test is None):
        raise DataError(f"{where}: give both x_test and y_test, or neither")
    a = _named_labels(a, where)
    notes = dict(a.notes)
    xtr, read = _images(a.x_train, "x_train", where, layout)
    if read and (read == "nhwc" or layout != "auto"):
        notes[NOTE_LAYOUT] = _layout_note(a.x_train.shape, read, layout)
    sizes = collections.Counter({tuple(xtr.shape[2:]): len(xtr)})
    xtr = resize(xtr, image_size) if image_size else xtr
    ytr = _labels(a.y_train, len(xtr), "y_train", where, "x_train")
    xte = yte = None
    if a.x_test is not None:
        xte, _ = _images(a.x_test, "x_test", where, read or layout)
        sizes[tuple(xte.shape[2:])] += len(xte)
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
    if len(np.unique(ytr)) < 2:
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
    to = (image_size, image_size)
    if image_size and any(hw != to for hw in sizes):
        notes[NOTE_RESIZE] = resize_note(sizes, to, "data.image_size")
    return Arrays(xtr, ytr, xte, yte, k, mean, std, a.source, a.classes, notes)


def _layout_note(shape: tuple[int, ...], read: str, layout: str) -> str:
    if layout != "auto":
        return f"read as {read.upper()} (data.layout)"
    return (
        f"x_train {tuple(shape)} read as (N, H, W, C): channels last; "
        'set data.layout = "nchw" if that is wrong'
    )


def resize_note(sizes: Mapping[tuple[int, int], int], to: tuple[int, int], why: str) -> str:
    """The one line a resize gets: how many images, from which sizes (height x width,
    with how many of each), to which, and why that size."""
    moved = {hw: n for hw, n in sorted(sizes.items()) if hw != to}
    froms = ", ".join(f"{h}x{w} ({n})" for (h, w), n in moved.items())
    total = sum(sizes.values())
    return (
        f"resized {sum(moved.values())} of {total} images from {froms} to {to[0]}x{to[1]} ({why})"
    )


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

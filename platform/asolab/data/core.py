"""The values every data set comes in: arrays from a loader, splits as tensors, batches.

Every data set is held as normalised float tensors (the sets asolab searches on
fit in memory; :mod:`asolab.data.memory` refuses one that would not), batched by
:class:`Batches`, and augmented a whole batch at a time (random translation and
flips as tensor ops), so no time goes to per-sample PIL transforms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..config import DataConfig

# the keys of Arrays.notes (and of the "notes" in a bundle's summary): what was done to
# the images that the data did not say; tracking/layout.py maps each to a run tag
NOTE_LAYOUT = "layout"
NOTE_RESIZE = "resize"
# and which classes a split holds no image of (data/load.py), a key per split:
# missing_training, missing_test, missing_validation, missing_search
NOTE_MISSING = "missing_"
# and how many test or validation images are exact copies of training images:
# copies_test, copies_validation
NOTE_COPIES = "copies_"
# and hidden files named as images a folder held, left out (data/folder.py)
NOTE_HIDDEN = "hidden"
# and how many images were turned upright as their EXIF orientation says (data/folder.py)
NOTE_ORIENTATION = "orientation"


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
class Arrays:
    """What a data set's loader returns.

    ``x_*``: ``(N, H, W)`` or ``(N, C, H, W)``, ``uint8`` (scaled by 1/255) or float
    (taken as is); ``y_*``: integer class labels in ``[0, num_classes)``. Without a
    test split, one is carved out with ``data.split_seed``. ``num_classes``, ``mean``
    and ``std`` default to the data set's declared ones, else to the labels' maximum
    + 1 and the training split's per-channel statistics. ``source`` (a path, a URL)
    is recorded with the run. ``notes``: what was done to the images that the data did
    not say (``NOTE_LAYOUT``, ``NOTE_RESIZE``), one line each, printed and recorded.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    num_classes: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    source: str = ""
    classes: tuple[str, ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)


Loader = Callable[[DataConfig], "Arrays | tuple"]


@dataclass(frozen=True)
class DatasetSpec:
    """How to load one data set and what is known about it before loading.

    ``mean``/``std``/``num_classes`` left ``None`` come from the loaded arrays.
    """

    name: str
    loader: Loader
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    num_classes: int | None = None
    augmentation: Augmentation = field(default_factory=lambda: Augmentation())
    how_to_get: str = ""


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
    # What the run records about where the data came from and how it was normalised.
    source: str = ""
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    origin: str = "built-in"
    height: int = 0  # 0: image_size (square); images need not be square
    width: int = 0
    classes: tuple[str, ...] = ()  # class names by label, where the data set has them
    notes: Mapping[str, str] = field(default_factory=dict)  # Arrays.notes: layout, resize

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "train": len(self.train),
            "full_train": len(self.full_train),
            "val": len(self.val),
            "test": len(self.test),
            "num_classes": self.num_classes,
            "in_channels": self.in_channels,
            "image_size": self.image_size,
        }
        if self.height and self.width and self.height != self.width:
            out["height"], out["width"] = self.height, self.width
        if self.source:
            out["source"] = self.source
        if self.mean:
            out["mean"] = [round(m, 4) for m in self.mean]
            out["std"] = [round(s, 4) for s in self.std]
        if self.origin != "built-in":
            out["origin"] = self.origin
        if self.classes:
            out["classes"] = list(self.classes)
        if self.notes:
            out["notes"] = dict(self.notes)
        return out


def preprocessing(bundle: DataBundle) -> dict[str, object]:
    """How raw images become the network's input, exactly (unrounded): what a saved
    model needs to take raw images as the run's data were taken. Pixel values 0..255
    are scaled to [0, 1], then normalised by ``mean`` and ``std`` per channel."""
    return {
        "data": bundle.name,
        "in_channels": bundle.in_channels,
        "height": bundle.height or bundle.image_size,
        "width": bundle.width or bundle.image_size,
        "mean": [float(m) for m in bundle.mean],
        "std": [float(s) for s in bundle.std],
        "classes": list(bundle.classes) or [str(i) for i in range(bundle.num_classes)],
    }


def dropped(n: int, batch_size: int) -> int:
    """The images ``data.drop_last`` leaves out of a split of ``n`` each epoch: its last,
    smaller batch, unless that is its only one."""
    return n % batch_size if n >= batch_size else 0


def eval_pad(bundle: DataBundle, batch_size: int, device: torch.device) -> int | None:
    """What a pass in eval mode pads a smaller batch to on ``device``: on CUDA the largest
    evaluation batch of the run (``batch_size``, or the larger of the validation and test
    splits where both are smaller), so that every evaluation meets one batch shape. A GPU
    pays for the first sight of each convolution shape (cuDNN chooses or times a plan
    for it: about 65 ms each on an H100), and each split's last or only batch was shapes
    of its own: 44 of the default digits run's 271 plans. The run meets that largest
    batch anyway, so its memory peak stays. In eval mode each image's output depends on
    that image alone (BatchNorm uses its running statistics): the zero images change no
    output. Elsewhere None: a CPU's kernels need no plan, and padding would only cost."""
    if device.type != "cuda":
        return None
    # a bundle without its test split (a check that selection never reads it) pads to val's
    splits = [s for s in (bundle.val, bundle.test) if s is not None]
    return min(batch_size, max(len(s) for s in splits))


class Batches:
    """Iterates a split in (optionally shuffled, augmented) mini-batches.

    ``drop_last`` leaves out the last, smaller batch (``data.drop_last``), unless it is
    the only one: a split smaller than one batch still gives one step. ``pad_to`` gives
    a smaller batch's images zero images up to that many (its labels stay as they are):
    for passes in eval mode, whose first ``len(y)`` outputs are the batch's
    (:func:`eval_pad`)."""

    def __init__(
        self,
        split: Split,
        batch_size: int,
        generator: torch.Generator | None = None,
        augmentation: Augmentation | None = None,
        drop_last: bool = False,
        pad_to: int | None = None,
    ) -> None:
        self.split, self.batch_size = split, batch_size
        self.generator, self.augmentation = generator, augmentation
        self.drop_last, self.pad_to = drop_last, pad_to

    def _stop(self) -> int:
        """Where the batches end: the split's end, or its last whole batch."""
        n = len(self.split)
        return n - dropped(n, self.batch_size) if self.drop_last else n

    def __len__(self) -> int:
        return -(-self._stop() // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.split)
        if self.generator is not None:
            order = torch.randperm(n, generator=self.generator).to(self.split.x.device)
        else:
            order = torch.arange(n, device=self.split.x.device)
        for start in range(0, self._stop(), self.batch_size):
            idx = order[start : start + self.batch_size]
            x, y = self.split.x[idx], self.split.y[idx]
            if self.augmentation is not None and self.generator is not None:
                x = self.augmentation(x, self.generator)
            if self.pad_to is not None and len(x) < self.pad_to:
                x = torch.cat([x, x.new_zeros((self.pad_to - len(x), *x.shape[1:]))])
            yield x, y

"""``data.name = "folder"``: images in the torchvision ImageFolder layout.

``data.data_dir/train/<class>/*.png`` (and ``test/<class>/...`` when there is a
test split; without one it is carved out with ``data.split_seed``), or the
classes right under ``data.data_dir``. Classes are the folder names, sorted.
Hidden files and folders (names starting with '.') and ``__MACOSX`` folders are
left out, with a note: a zip archive made on macOS holds a ``._`` twin of every
image, which is no image.
Grey and colour images mix (grey ones are repeated over three channels); an
alpha channel is kept only when every image has real transparency, and dropped
when it is opaque everywhere. Images are resized to ``data.image_size`` square
(default: the most common size among them, kept as it is). File headers are
read first, so a set too large for memory is refused before a pixel is decoded.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..config import DataConfig
from .checks import resize_note
from .core import NOTE_HIDDEN, NOTE_ORIENTATION, NOTE_RESIZE, Arrays, DataError
from .memory import check_fits, set_bytes

# the EXIF tag of how a photo is stored against how it is seen (1: as stored)
EXIF_ORIENTATION = 0x0112
# the folder a zip archive made on macOS holds its metadata in (a class folder otherwise)
MACOS_FOLDER = "__MACOSX"
# a note of hidden files left out names at most this many
NAMED_FILES = 3
# torchvision's IMG_EXTENSIONS (datasets.folder), read without importing torchvision
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_GREY = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N"}
_DECODE_ERRORS = (
    OSError,
    UnidentifiedImageError,
    ValueError,
    SyntaxError,
    Image.DecompressionBombError,
)


@dataclass(frozen=True)
class _Header:
    path: Path
    label: int
    size: tuple[int, int]  # (width, height), upright
    colour: bool
    turned: bool = False  # its EXIF orientation says to turn or mirror it upright


def _upright(img: Image.Image) -> tuple[tuple[int, int], bool]:
    """An image's size as a viewer shows it, and whether its EXIF orientation (a phone's
    photo stored on its side) says to turn it: orientations 5-8 swap width and height."""
    # only where the header holds it: a PNG's EXIF after its pixels would decode them all
    # (PIL loads the image to look), and the scan reads headers only (cameras write JPEG)
    has_exif = img.format == "TIFF" or "exif" in img.info
    orientation = img.getexif().get(EXIF_ORIENTATION, 1) if has_exif else 1
    w, h = img.size
    return ((h, w) if orientation in (5, 6, 7, 8) else (w, h)), orientation in range(2, 9)


def _hidden(parts: tuple[str, ...]) -> bool:
    """A path (its parts below the class folder) that is no one's image: a hidden file or
    folder (macOS's ``._`` twins of every file, ``.ipynb_checkpoints``, ``.thumbnails``)
    or a zip archive's ``__MACOSX`` folder of them."""
    return any(part.startswith(".") or part == MACOS_FOLDER for part in parts)


def _classes(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not _hidden((p.name,)))


def _scan(root: Path, classes: list[str], split: str, left_out: list[Path]) -> list[_Header]:
    """The headers of each class folder's images (``left_out`` gathers the hidden files
    named as images, which are skipped)."""
    out: list[_Header] = []
    for label, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            continue
        found = len(out)
        for path in sorted(folder.rglob("*")):
            if path.suffix.lower() not in EXTENSIONS or not path.is_file():
                continue
            if _hidden(path.relative_to(folder).parts):
                left_out.append(path)
                continue
            try:
                with Image.open(path) as img:
                    size, turned = _upright(img)
                    out.append(_Header(path, label, size, img.mode not in _GREY, turned))
            except _DECODE_ERRORS as exc:
                raise DataError(
                    f"data set 'folder': {path} is unreadable, corrupt or not an image ({exc}); "
                    "remove or replace it"
                ) from None
        if len(out) == found and split == "train":
            # torchvision's ImageFolder refuses this too: an empty class would be a class
            # the network is built for and never sees
            raise DataError(
                f"data set 'folder': class folder {folder} holds no images (looked for "
                f"{', '.join(EXTENSIONS)}); add images or remove the folder"
            )
    if not out:
        raise DataError(
            f"data set 'folder': no images in {root}/<class>/ for the {split} split "
            f"(looked for {', '.join(EXTENSIONS)})"
        )
    return out


def _decode(h: _Header, size: tuple[int, int]) -> np.ndarray:
    """One image as uint8 ``(H, W, C)``: C = 1 (grey), 3 (colour), +1 for real alpha."""
    try:
        with Image.open(h.path) as img:
            img.load()
            if h.turned:  # upright, as a viewer shows it
                img = ImageOps.exif_transpose(img)
            if img.mode == "F":
                raise ValueError("32-bit float images are not read; save it as 8 or 16 bits")
            if img.mode.startswith("I"):  # 16-bit grey: keep the top 8 bits
                img = Image.fromarray((np.asarray(img, dtype=np.uint32) >> 8).astype(np.uint8))
            alpha = img.mode in ("RGBA", "RGBa", "LA", "La", "PA") or "transparency" in img.info
            mode = ("RGB" if h.colour else "L") + ("A" if alpha else "")
            img = img.convert(mode)
            if img.size != size:
                img = img.resize(size, Image.Resampling.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except _DECODE_ERRORS as exc:
        raise DataError(
            f"data set 'folder': {h.path} is corrupt or unreadable ({exc}); remove or replace it"
        ) from None
    arr = arr[:, :, None] if arr.ndim == 2 else arr
    if alpha and arr[:, :, -1].min() == 255:  # an opaque alpha channel carries nothing
        arr = arr[:, :, :-1]
    return arr


def _stack(headers: list[_Header], size: tuple[int, int], colour: bool) -> np.ndarray:
    images = [_decode(dataclasses.replace(h, colour=colour), size) for h in headers]
    alpha = [h.path for h, a in zip(headers, images) if a.shape[2] in (2, 4)]
    if alpha and len(alpha) < len(images):
        opaque = next(h.path for h, a in zip(headers, images) if a.shape[2] in (1, 3))
        raise DataError(
            f"data set 'folder': channel counts cannot be reconciled: {alpha[0]} has "
            f"transparency but {opaque} has none; flatten the transparent images onto a "
            "background (or give every image an alpha channel)"
        )
    x = np.stack(images)  # N, H, W, C
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _notes(left_out: list[Path], images: list[_Header]) -> dict[str, str]:
    """The notes of the hidden files named as images that were left out
    (``NOTE_HIDDEN``), and of the images turned upright (``NOTE_ORIENTATION``)."""
    notes = {}
    if left_out:
        named = ", ".join(p.name for p in left_out[:NAMED_FILES])
        more = ", ..." if len(left_out) > NAMED_FILES else ""
        notes[NOTE_HIDDEN] = (
            f"left out {len(left_out)} hidden file(s) named as images ({named}{more}): names "
            f"starting with '.' or under {MACOS_FOLDER}, an archive's or a tool's, not images"
        )
    turned = sum(h.turned for h in images)
    if turned:
        notes[NOTE_ORIENTATION] = (
            f"turned {turned} of {len(images)} images upright as their EXIF orientation says "
            "(a camera's photo stored on its side), as image viewers show them"
        )
    return notes


def load_folder(cfg: DataConfig) -> Arrays:
    """The images under ``cfg.data_dir`` as uint8 arrays, labels from folder names."""
    if not cfg.data_dir:
        raise DataError(
            "data set 'folder' needs data.data_dir: the folder holding train/<class>/ images"
        )
    root = Path(cfg.data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data set 'folder': data.data_dir {str(root)!r} is not a folder")
    train_root = root / "train" if (root / "train").is_dir() else root
    classes = _classes(train_root)
    if len(classes) < 2:
        raise DataError(
            f"data set 'folder': {train_root} holds {len(classes)} class folder(s) "
            f"({', '.join(classes) or 'none'}); classification needs two or more: one "
            "sub-folder per class"
        )
    left_out: list[Path] = []
    train = _scan(train_root, classes, "train", left_out)
    test_root = root / "test" if train_root != root and (root / "test").is_dir() else None
    test: list[_Header] = []
    if test_root is not None:
        extra = sorted(set(_classes(test_root)) - set(classes))
        if extra:
            raise DataError(
                f"data set 'folder': {test_root} has class folder(s) {', '.join(extra)} that "
                f"{train_root} lacks; the test split's classes must be training classes"
            )
        test = _scan(test_root, classes, "test", left_out)
    everything = train + test
    counts = collections.Counter(h.size for h in everything)
    if cfg.image_size:
        size, why = (cfg.image_size, cfg.image_size), "data.image_size"
    else:
        size = counts.most_common(1)[0][0]
        why = "the most common size; data.image_size sets another"
    notes = _notes(left_out, everything)
    if any(s != size for s in counts):
        hw = {(h, w): n for (w, h), n in counts.items()}  # PIL sizes are (width, height)
        notes[NOTE_RESIZE] = resize_note(hw, (size[1], size[0]), why)
    colour = any(h.colour for h in everything)
    channels = 3 if colour else 1
    check_fits(f"data set 'folder' ({root})", set_bytes(len(everything), channels, *size))
    x = _stack(everything, size, colour)
    y = np.array([h.label for h in everything], dtype=np.int64)
    n = len(train)
    return Arrays(
        x[:n],
        y[:n],
        x[n:] if test else None,
        y[n:] if test else None,
        num_classes=len(classes),
        source=str(root.resolve()),
        classes=tuple(classes),
        notes=notes,
    )

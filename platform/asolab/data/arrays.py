"""``data.name = "arrays"``: a data set in one ``.npz`` file (``data.path``).

Keys: ``x_train``, ``y_train`` and optionally ``x_test``, ``y_test``; images
``(N, H, W)`` or ``(N, C, H, W)``, ``uint8`` (0..255) or float; labels whole
numbers from 0, or class names as text; an optional ``classes`` array of class
names fixes the class count (labels must lie below it) or the names' order. The
arrays' shapes are read from the file's headers first, so a set too large for
memory is refused before it is loaded.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from ..config import DataConfig
from .core import Arrays, DataError
from .memory import check_fits, set_bytes

REQUIRED = ("x_train", "y_train")
OPTIONAL = ("x_test", "y_test", "classes")


def _headers(path: Path, where: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in the archive, read without loading any."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as fh:
                    major, _ = np.lib.format.read_magic(fh)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if major == 1
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(fh)
                out[info.filename[: -len(".npy")]] = (shape, dtype)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise DataError(
            f"{where}: not a readable .npz file ({exc}); write it with numpy.savez"
        ) from None
    return out


def load_arrays(cfg: DataConfig) -> Arrays:
    """The arrays of ``cfg.path``, checked for the keys and sized before loading."""
    if not cfg.path:
        raise DataError("data set 'arrays' needs data.path: an .npz file with x_train, y_train")
    path = Path(cfg.path).expanduser()
    where = f"data set 'arrays' ({path})"
    if not path.is_file():
        raise DataError(f"{where}: no such file; set data.path to an .npz file")
    headers = _headers(path, where)
    missing = [k for k in REQUIRED if k not in headers]
    if missing:
        raise DataError(
            f"{where}: missing key(s) {', '.join(missing)} (it has: "
            f"{', '.join(sorted(headers)) or 'none'}); save x_train and y_train, optionally "
            "x_test and y_test"
        )
    if ("x_test" in headers) != ("y_test" in headers):
        have, lack = ("x_test", "y_test") if "x_test" in headers else ("y_test", "x_test")
        raise DataError(f"{where}: it has {have} but no {lack}; save both or neither")
    objects = [k for k in (*REQUIRED, *OPTIONAL) if k in headers and headers[k][1].hasobject]
    if objects:  # np.load refuses them without pickle, which would run code from the file
        raise DataError(
            f"{where}: {', '.join(objects)} holds Python objects (dtype object, as pandas "
            "gives text); save numbers, or class names as text: np.asarray(y, dtype=str)"
        )
    one_copy = 0
    for key in ("x_train", "x_test"):
        if key in headers:
            shape = headers[key][0]
            one_copy += set_bytes(int(np.prod(shape[:1])), 1, int(np.prod(shape[1:])), 1)
    check_fits(where, one_copy)
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {k: npz[k] for k in (*REQUIRED, *OPTIONAL) if k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"{where}: an array cannot be read ({exc}); write it again") from None
    classes = tuple(str(c) for c in data["classes"]) if "classes" in data else ()
    return Arrays(
        data["x_train"],
        data["y_train"],
        data.get("x_test"),
        data.get("y_test"),
        num_classes=len(classes) or None,
        source=str(path.resolve()),
        classes=classes,
    )

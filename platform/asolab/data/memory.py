"""Refuse a data set that would not fit the memory left, before loading it.

A set is held in memory as float32 tensors; loading it takes about three copies at
the peak (the decoded arrays, their float form, the normalised splits), so the
estimate is ``3 x images x channels x height x width x 4`` bytes.
"""

from __future__ import annotations

import psutil

from .core import DataError

PEAK_COPIES = 3
_GB = 1024**3


def set_bytes(n: int, channels: int, height: int, width: int) -> int:
    """Bytes one float32 copy of ``n`` images takes."""
    return n * channels * height * width * 4


def check_fits(where: str, one_copy: int) -> None:
    """Raise DataError when ``PEAK_COPIES`` copies of ``one_copy`` bytes exceed the
    memory available now."""
    need = PEAK_COPIES * one_copy
    free = int(psutil.virtual_memory().available)
    if need > free:
        raise DataError(
            f"{where}: loading it needs about {need / _GB:.1f} GB of memory ({one_copy / _GB:.2f} "
            f"GB as float32, {PEAK_COPIES} copies at the peak) but {free / _GB:.1f} GB are free; "
            "use fewer or smaller images (data.image_size) or a machine with more memory"
        )

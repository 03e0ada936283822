"""Data sets: a registry of in-memory image sets with deterministic splits.

``load_data(cfg, seed)`` is the one entry: it finds ``cfg.name`` in
:data:`REGISTRY` (built-in sets, ``folder``, ``arrays``, plugins), refuses a set
that would not fit in memory, checks the loader's arrays and splits them.
Modules: ``core`` (the values), ``builtin``, ``folder``, ``arrays``,
``registry`` (names and plugins), ``checks``, ``memory``, ``load``.
"""

from .builtin import FASHION_MNIST_DIR
from .core import (
    Arrays,
    Augmentation,
    Batches,
    DataBundle,
    DataError,
    DatasetSpec,
    Split,
    _translate,
    eval_pad,
    preprocessing,
)
from .load import load_data
from .registry import REGISTRY, register_dataset

__all__ = [
    "FASHION_MNIST_DIR",
    "REGISTRY",
    "Arrays",
    "Augmentation",
    "Batches",
    "DataBundle",
    "preprocessing",
    "DataError",
    "DatasetSpec",
    "Split",
    "_translate",
    "eval_pad",
    "load_data",
    "register_dataset",
]

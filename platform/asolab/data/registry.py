"""``REGISTRY``: every data set a config may name.

The built-in sets, ``folder`` and ``arrays`` (the researcher's own images and
arrays, no code), the sets that installed packages declare under the entry-point
group ``asolab.datasets``, and those registered in code with
:func:`register_dataset`. An entry point names a :class:`DatasetSpec` or a loader
``(DataConfig) -> Arrays``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..plugins import PluginError, Registry, qualname
from .arrays import load_arrays
from .builtin import BUILTINS
from .core import Arrays, Augmentation, DatasetSpec
from .folder import load_folder

GROUP = "asolab.datasets"

OWN = {
    "folder": DatasetSpec(
        "folder", load_folder, how_to_get="set data.data_dir to a folder of train/<class>/ images"
    ),
    "arrays": DatasetSpec(
        "arrays", load_arrays, how_to_get="set data.path to an .npz file with x_train, y_train"
    ),
}


def _as_spec(name: str, obj: Any) -> DatasetSpec:
    if isinstance(obj, DatasetSpec):
        return dataclasses.replace(obj, name=name)
    if callable(obj):
        return DatasetSpec(name, obj)
    raise PluginError(
        f"data set plugin {name!r} gives a {type(obj).__name__}; it must name a DatasetSpec or "
        "a loader function (DataConfig) -> asolab.data.Arrays"
    )


REGISTRY: Registry[DatasetSpec] = Registry("data set", GROUP, {**BUILTINS, **OWN}, _as_spec)


def register_dataset(
    name: str,
    loader: Callable[..., Arrays | tuple] | DatasetSpec,
    *,
    num_classes: int | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    augmentation: Augmentation | None = None,
) -> None:
    """Make ``name`` a valid ``data.name`` in this process: ``loader(cfg)`` returns
    :class:`Arrays` (or ``(x_train, y_train, x_test, y_test)``); ``num_classes``,
    ``mean``, ``std`` default to what the arrays say, ``augmentation`` to none."""
    spec = _as_spec(name, loader)
    if not isinstance(loader, DatasetSpec):
        spec = dataclasses.replace(
            spec,
            num_classes=num_classes,
            mean=tuple(mean) if mean else None,
            std=tuple(std) if std else None,
            augmentation=augmentation or Augmentation(),
        )
    REGISTRY.register(name, spec, qualname(loader))

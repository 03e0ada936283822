"""The field machinery of every settings file: a field with its default, its
constraint and its help text; one leaf value checked against it; a table of a
file built into its settings class. Experiment configs (:mod:`.schema`) and
study configs (:mod:`asolab.study.config`) are both made of these fields.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError as ConfigError


class Registered:
    """The names of a registry, read when a config is checked, not when this module loads.

    Each registry lives in the module that implements its entries (data sets in
    ``data.py``, schedules in ``evolution/temperature.py``, growth policies in
    ``evolution/growth.py``, operations in ``space/ops.py``), so adding one touches
    that module only. Those modules import torch; reading them lazily keeps
    ``import asolab.config`` torch-free and free of import cycles.
    """

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr

    def __call__(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.attr))


def choices_of(meta: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A field's allowed values (a registry's names resolved), or None."""
    choices = meta.get("choices")
    return choices() if callable(choices) else choices


def constraint(
    *,
    ge: float | None = None,
    le: float | None = None,
    gt: float | None = None,
    choices: Sequence[str] | Registered | None = None,
    inf: bool = False,
    help: str = "",
) -> dict[str, Any]:
    """``inf``: the float field also takes ``inf`` (its help says what inf means)."""
    return {"ge": ge, "le": le, "gt": gt, "choices": choices, "inf": inf, "help": help}


def field(default: Any, **check: Any) -> Any:
    """A config field: its default, its constraint and its help text (read by the
    validator and by ``python -m asolab.config_doc``). A callable default is a factory."""
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for defaults")
    if callable(default):
        return dataclasses.field(default_factory=default, metadata=constraint(**check))
    return dataclasses.field(default=default, metadata=constraint(**check))


def to_dict(cfg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = to_dict(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = value
    return out


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, str(tp)
    )


def describe_allowed(meta: Mapping[str, Any]) -> str:
    choices = choices_of(meta)
    if choices:
        return "one of " + ", ".join(map(str, choices))
    lo = meta.get("ge") if meta.get("ge") is not None else meta.get("gt")
    hi = meta.get("le")
    left = "[" if meta.get("ge") is not None else "("
    if lo is None and hi is None:
        return ""
    # "inf]" only where inf is taken: an unbounded float field is otherwise finite, "inf)"
    right = f"{hi}]" if hi is not None else ("inf]" if meta.get("inf") else "inf)")
    return f"in {left}{'-inf' if lo is None else lo}, {right}"


def coerce(value: Any, f: dataclasses.Field, where: str) -> Any:
    """Check one leaf value against its field's type and constraint."""
    meta = f.metadata
    tp = {"int": int, "float": float, "bool": bool, "str": str}.get(str(f.type), None)
    if str(f.type).startswith("tuple"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(
                f"{where} must be a list of strings; allowed: {describe_allowed(meta)}"
            )
        bad = [v for v in value if v not in choices_of(meta)]
        if bad:
            raise ConfigError(
                f"{where} has unknown value {bad[0]!r}; allowed: {describe_allowed(meta)}"
            )
        if len(set(value)) != len(value) or not value:
            raise ConfigError(f"{where} must list distinct names and at least one")
        return tuple(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp is None or not isinstance(value, tp) or (tp is not bool and isinstance(value, bool)):
        allowed = describe_allowed(meta)
        raise ConfigError(
            f"{where} must be {type_name(tp)}{' ' + allowed if allowed else ''} (got {value!r})"
        )
    if tp is float and not math.isfinite(value) and not (meta.get("inf") and value == math.inf):
        # nan compares false with every bound, so the range check below would let it through
        allowed = describe_allowed(meta)
        raise ConfigError(
            f"{where} must be a finite "
            f"number{'; allowed: ' + allowed if allowed else ''} (got {value!r})"
        )
    out_of_range = (
        (meta.get("choices") and value not in choices_of(meta))
        or (meta.get("ge") is not None and value < meta["ge"])
        or (meta.get("gt") is not None and value <= meta["gt"])
        or (meta.get("le") is not None and value > meta["le"])
    )
    if out_of_range:
        raise ConfigError(f"{where} = {value!r} is out of range; allowed: {describe_allowed(meta)}")
    return value


def build(cls: type, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"{source}: unknown key '{path}'; allowed: {', '.join(fields)}")
        f = fields[key]
        sub = section_type(f)
        if sub is not None:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: '{path}' must be a table [{path}]")
            kwargs[key] = build(sub, value, source, path + ".")
        else:
            kwargs[key] = coerce(value, f, f"{source}: {path}")
    return cls(**kwargs)


def section_type(f: dataclasses.Field) -> type | None:
    """The settings class of a field that is a table (``[data]``, ``[sampler]``...), else None."""
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None

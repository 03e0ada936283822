"""Checks that span fields, and ``--set`` overrides: a config's whole-file
validation on top of each field's own check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from .fields import ConfigError, build, to_dict
from .schema import PARAMETER_FREE, PRIMITIVES, WIDENING_POLICIES, ExperimentConfig


def cross_checks(cfg: ExperimentConfig, source: str) -> None:
    """Constraints that involve more than one field."""
    t = cfg.temperature
    if t.min_temperature > t.initial_temperature:
        raise ConfigError(
            f"{source}: temperature.min_temperature ({t.min_temperature}) must not exceed "
            f"temperature.initial_temperature ({t.initial_temperature})"
        )
    if not [p for p in cfg.space.primitives if p != "none"]:
        raise ConfigError(f"{source}: space.primitives needs at least one operation besides 'none'")
    weighted = set(cfg.space.primitives) - {"none", *PARAMETER_FREE()}
    if cfg.search.param_free_cap >= 0 and not weighted:
        raise ConfigError(
            f"{source}: search.param_free_cap needs an operation with weights in space.primitives "
            "(a conv); add one or set the cap to -1"
        )
    foreign = [p for p in cfg.space.primitives if p not in PRIMITIVES()]
    if foreign and cfg.growth.policy in WIDENING_POLICIES():
        raise ConfigError(
            f"{source}: growth.policy = {cfg.growth.policy!r} may widen, which knows the built-in "
            f"ops only, and space.primitives has {', '.join(foreign)}; use growth.policy = "
            "deepen, branch or none"
        )
    if cfg.search.weight_lr_min > cfg.search.weight_lr:
        raise ConfigError(f"{source}: search.weight_lr_min must not exceed search.weight_lr")
    if cfg.search.w_epochs + cfg.search.retrain_epochs + cfg.search.final_epochs == 0:
        raise ConfigError(
            f"{source}: at least one of search.w_epochs, retrain_epochs, final_epochs must be > 0"
        )
    if cfg.search.budget_minutes and not cfg.search.final_epochs:
        raise ConfigError(
            f"{source}: search.budget_minutes sizes the final stage; set search.final_epochs "
            "(the most epochs it may train) above 0, or budget_minutes = 0"
        )
    dev = cfg.device
    if not (
        dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:") and dev[5:].isdigit())
    ):
        raise ConfigError(
            f"{source}: device = {dev!r} is not valid; allowed: auto, cpu, cuda, cuda:N, mps"
        )


def from_dict(data: Mapping[str, Any], source: str = "config") -> ExperimentConfig:
    cfg = build(ExperimentConfig, data, source)
    cross_checks(cfg, source)
    return cfg


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=v`` -> ("a.b", v) with v parsed as a TOML value (bare words are strings)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    key, raw = (s.strip() for s in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def parse_overrides(overrides: Mapping[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    """Overrides as ``{key: value}``: a mapping as it is, ``key=value`` strings (``--set``)
    parsed by :func:`parse_override`. The one parser of every override a user gives."""
    if not overrides:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides must be a mapping or a list of 'key=value' strings, got {overrides!r}"
        )
    return dict(parse_override(o) for o in overrides)


def nest(overrides: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(
    cfg: ExperimentConfig, overrides: Mapping[str, Any], source: str = "--set"
) -> ExperimentConfig:
    merged = from_dict(merge(to_dict(cfg), nest(overrides)), source)
    if "name" not in overrides and _data_of(merged) != _data_of(cfg):
        # Runs on other data than the file's own are filed under that data (experiment,
        # param "name", description), not under the file's name ("digits").
        merged = merged.replace(name=data_label(merged))
    return merged


def _data_of(cfg: ExperimentConfig) -> tuple[str, str, str]:
    return (cfg.data.name, cfg.data.data_dir, cfg.data.path)


def data_label(cfg: ExperimentConfig) -> str:
    """A name for the data a config reads: ``folder-<folder's name>``, the ``.npz``
    file's stem, else the data set's name."""
    return data_set_name(cfg.data.name, cfg.data.data_dir, cfg.data.path)


def data_set_name(name: str, data_dir: str = "", path: str = "") -> str:
    """:func:`data_label` from the recorded params (``data.name``, ``data.data_dir``,
    ``data.path``): compare groups runs by it."""
    if name == "folder" and data_dir:
        return f"folder-{Path(data_dir).expanduser().resolve().name}"
    if name == "arrays" and path:
        return Path(path).stem
    return name

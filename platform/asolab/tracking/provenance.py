"""Where a run's data set and ops come from, when not from asolab itself.

A run that used a plugin (an installed package's entry point) or an entry
registered in code records it in the tag ``asolab.plugins``, with the package's
name and version, so that the run can be repeated knowing what to install.
"""

from __future__ import annotations

import json

from ..config import ExperimentConfig
from ..data import REGISTRY
from ..space.ops import OPS
from . import layout as L


def plugin_origins(cfg: ExperimentConfig) -> dict[str, str]:
    """``{"data set <name>" | "op <name>": origin}`` of the entries not built in."""
    out: dict[str, str] = {}
    if cfg.data.name in REGISTRY and not REGISTRY.builtin(cfg.data.name):
        out[f"data set {cfg.data.name}"] = str(REGISTRY.origin(cfg.data.name))
    for op in cfg.space.primitives:
        if op in OPS and not OPS.builtin(op):
            out[f"op {op}"] = str(OPS.origin(op))
    return out


def plugin_tags(cfg: ExperimentConfig) -> dict[str, str]:
    """The run's ``asolab.plugins`` tag, or nothing when it used built-ins only."""
    origins = plugin_origins(cfg)
    return {L.TAG_PLUGINS: json.dumps(origins, sort_keys=True)} if origins else {}

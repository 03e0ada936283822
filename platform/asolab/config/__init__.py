"""Experiment configuration: frozen, typed dataclasses loaded from TOML.

An experiment file has one table per concern (``[data]``, ``[space]``,
``[search]``, ``[temperature]``, ``[mutation]``, ``[growth]``, ``[tracking]``,
``[speed]``) plus top-level ``seed`` and ``device``. Every field carries its
constraint in its metadata, so the loader validates the whole file once, at the
edge, and refuses bad input with one line naming the file, the key and what is
allowed.

Overrides use the same path syntax as the file: ``--set search.cycles=2``.

``fields`` is the field machinery (a field, its check, a table built into its
class), ``schema`` the experiment's settings classes, ``validate`` the checks
across fields and the overrides, ``files`` where config files are found and
how they are read. Everything public is importable from here.
"""

from .fields import (
    ConfigError,
    Registered,
    build,
    choices_of,
    describe_allowed,
    field,
    flatten,
    section_type,
    to_dict,
)
from .files import (
    DEFAULT_EXPERIMENT,
    EXPERIMENTS_DIR,
    PROJECT_ROOT,
    config_json,
    load,
    read_toml,
    resolve_experiment_path,
    resolve_named_file,
    shipped_dir,
)
from .schema import (
    DATASETS,
    FINAL_GENOTYPES,
    FINAL_WEIGHTS,
    GROWTH_POLICIES,
    OPERATIONS,
    PARAMETER_FREE,
    PRIMITIVES,
    SCHEDULES,
    SEED_MAX,
    SELECTIONS,
    W_SAMPLINGS,
    WIDENING_POLICIES,
    DataConfig,
    ExperimentConfig,
    GrowthConfig,
    MutationConfig,
    SearchConfig,
    SpaceConfig,
    SpeedConfig,
    TemperatureConfig,
    TrackingConfig,
)
from .validate import apply_overrides, data_set_name, from_dict, parse_override, parse_overrides

__all__ = [
    "DATASETS",
    "DEFAULT_EXPERIMENT",
    "EXPERIMENTS_DIR",
    "FINAL_GENOTYPES",
    "FINAL_WEIGHTS",
    "GROWTH_POLICIES",
    "OPERATIONS",
    "PARAMETER_FREE",
    "PRIMITIVES",
    "PROJECT_ROOT",
    "SCHEDULES",
    "SEED_MAX",
    "SELECTIONS",
    "W_SAMPLINGS",
    "WIDENING_POLICIES",
    "ConfigError",
    "DataConfig",
    "ExperimentConfig",
    "GrowthConfig",
    "MutationConfig",
    "Registered",
    "SearchConfig",
    "SpaceConfig",
    "SpeedConfig",
    "TemperatureConfig",
    "TrackingConfig",
    "describe_allowed",
    "apply_overrides",
    "build",
    "data_set_name",
    "choices_of",
    "config_json",
    "field",
    "flatten",
    "from_dict",
    "load",
    "parse_override",
    "parse_overrides",
    "read_toml",
    "resolve_experiment_path",
    "resolve_named_file",
    "section_type",
    "shipped_dir",
    "to_dict",
]

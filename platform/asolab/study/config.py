"""Study configuration: which experiment keys Optuna tunes, how, and for how long.

A study file (TOML, in ``studies/``) names a base experiment file, fixed
overrides for every trial, the search space, the objective, the sampler, the
pruner, the budget and where things are stored::

    name = "temperature_mutation"     # default: the file's stem
    experiment = "digits"             # base experiment (a bare name looks in experiments/)
    n_trials = 20                     # trials the study should hold in total
                                      # (0 = no limit, needs a timeout)
    timeout = 0                       # seconds per invocation (0 = no limit)
    seed = 0                          # seeds the sampler (mixed with the worker and the
                                      # trials so far)

    [overrides]                       # fixed for every trial, same tables as an experiment file
    search.final_epochs = 0

    [params.temperature.initial_temperature]
    low = 0.5
    high = 10.0
    log = true

    [params.temperature.min_temperature]
    low = 0.02                        # sampled as a fraction of initial_temperature,
    high = 0.5                        # so min <= initial always holds
    fraction_of = "temperature.initial_temperature"

Parameters are named by their experiment key path. Everything is validated
once, here, with one-line errors naming the file, the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from dataclasses import field as section
from pathlib import Path
from typing import Any

from ..config import (
    ConfigError,
    ExperimentConfig,
    build,
    field,
    flatten,
    load,
    parse_override,
    read_toml,
    resolve_experiment_path,
    resolve_named_file,
    shipped_dir,
)

STUDIES_DIR = shipped_dir("studies")
DEFAULT_STUDY = STUDIES_DIR / "temperature_mutation.toml"

SAMPLERS = ("tpe", "random", "nsga2")
PRUNERS = ("median", "percentile", "hyperband", "threshold", "none")
PARAM_TYPES = ("float", "int", "categorical")
# objective metric -> Optuna direction; values come from the run's RunResult. The
# test split is reported, never optimised, so test_acc is not an objective.
OBJECTIVES = {"val_acc": "maximize", "val_loss": "minimize", "params": "minimize"}
FRACTION_SUFFIX = "_fraction"


@dataclass(frozen=True)
class ParamSpec:
    """One tuned experiment key and its distribution.

    With ``fraction_of``, Optuna samples ``<key>_fraction`` in [low, high] and the
    experiment receives ``fraction * <fraction_of>``: the way to keep
    ``temperature.min_temperature <= temperature.initial_temperature``.
    """

    key: str
    type: str = "float"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    fraction_of: str = ""

    @property
    def optuna_name(self) -> str:
        return self.key + FRACTION_SUFFIX if self.fraction_of else self.key


@dataclass(frozen=True)
class ObjectiveConfig:
    """What a trial returns: one metric (a best value) or two (a Pareto front)."""

    metrics: tuple[str, ...] = field(
        ("val_acc",),
        choices=tuple(OBJECTIVES),
        help="one metric (the best value) or two (a Pareto front), all on the validation split",
    )
    # Seed noise of one digits run is about as large as the knobs' effect (bench/README.md,
    # study_signal.py): averaging a trial over seeds divides it by sqrt(seeds).
    seeds: int = field(
        1,
        ge=1,
        le=100,
        help=(
            "runs per trial, seeds base.seed .. base.seed + seeds - 1; the trial's values are "
            "their means"
        ),
    )

    @property
    def directions(self) -> tuple[str, ...]:
        return tuple(OBJECTIVES[m] for m in self.metrics)


@dataclass(frozen=True)
class SamplerConfig:
    """Which Optuna sampler; every setting explicit (Optuna 5 changed some defaults)."""

    name: str = field("tpe", choices=SAMPLERS)
    n_startup_trials: int = field(5, ge=0, help="tpe: random trials before the model takes over")
    multivariate: bool = field(
        True, help="tpe: model the parameters jointly (temperature and its floor interact)"
    )
    constant_liar: bool = field(
        True, help="tpe: keep parallel workers from sampling the same point"
    )
    population_size: int = field(8, ge=2, help="nsga2: individuals per generation")


@dataclass(frozen=True)
class PrunerConfig:
    """When a trial stops early on its per-cycle validation accuracy."""

    name: str = field("median", choices=PRUNERS)
    n_startup_trials: int = field(
        3, ge=0, help="median / percentile: never prune before this many trials finished"
    )
    n_warmup_steps: int = field(0, ge=0, help="median / percentile: never prune before this cycle")
    percentile: float = field(
        25.0, ge=0.0, le=100.0, help="percentile: keep trials in the top (100 - percentile)%"
    )
    min_resource: int = field(1, ge=1, help="hyperband, in cycles")
    reduction_factor: int = field(3, ge=2, help="hyperband")
    lower: float = field(0.0, help="threshold: prune when val_acc < lower")


@dataclass(frozen=True)
class StorageConfig:
    """Where the study lives and how crashed workers are recovered."""

    url: str = field(
        "",  # a journal file: no server to run on one machine
        help="Optuna storage ('' = JournalStorage in optuna-journal.log beside the MLflow store); "
        "--storage overrides it",
    )
    heartbeat_interval: int = field(
        60, ge=1, help="seconds between a running trial's heartbeats (< grace_period)"
    )
    grace_period: int = field(
        180,
        ge=1,
        help="a RUNNING trial silent this long is stale: failed and retried (one "
        "whose owner process is alive on this host never is, on a journal)",
    )
    max_retry: int = field(1, ge=0, help="how often a stale trial's parameters are retried")


@dataclass(frozen=True)
class StudyTrackingConfig:
    """Where the study's MLflow parent run and trial runs go."""

    tracking_uri: str = field(
        "", help="'' = the base experiment's tracking.tracking_uri, MLFLOW_TRACKING_URI, or mlruns/"
    )
    experiment: str = field("", help="MLflow experiment ('' = study-<name>)")


@dataclass(frozen=True)
class StudySettings:
    """A study file's own keys and tables, checked like an experiment file's fields.

    ``[overrides]``, ``[params.*]`` and ``[[enqueue]]`` name experiment keys, so they
    are free-form tables, checked against the base experiment in :func:`from_dict`.
    """

    name: str = field(
        "study", help="study name (default: the file's stem); no quotes or backslashes"
    )
    experiment: str = field(
        "digits",
        help="base experiment file: a bare name looks in "
        "experiments/, a relative path next to the study file",
    )
    n_trials: int = field(
        10, ge=0, help="trials the study should hold in total (0 = no limit, needs a timeout)"
    )
    timeout: float = field(0.0, ge=0.0, help="seconds per invocation (0 = no limit)")
    seed: int = field(
        0, ge=0, help="seeds the sampler (mixed with the worker and the trials so far)"
    )
    objective: ObjectiveConfig = section(default_factory=ObjectiveConfig)
    sampler: SamplerConfig = section(default_factory=SamplerConfig)
    pruner: PrunerConfig = section(default_factory=PrunerConfig)
    storage: StorageConfig = section(default_factory=StorageConfig)
    tracking: StudyTrackingConfig = section(default_factory=StudyTrackingConfig)


@dataclass(frozen=True)
class StudyConfig(StudySettings):
    """A whole study, validated: the file's settings, ``source`` (the file), ``base``
    (the resolved base experiment, overrides applied; ``experiment`` is its path),
    the tuned ``params``, fixed ``overrides`` (the file's and ``--set``'s) and
    ``enqueue``-d points."""

    source: str = ""
    base: ExperimentConfig = section(default_factory=ExperimentConfig)
    params: tuple[ParamSpec, ...] = ()
    overrides: tuple[tuple[str, Any], ...] = ()
    enqueue: tuple[tuple[tuple[str, Any], ...], ...] = ()
    set_overrides: tuple[str, ...] = ()  # `--set` texts, in ``overrides``; workers get them too

    @property
    def multi_objective(self) -> bool:
        return len(self.objective.metrics) > 1

    @property
    def mlflow_experiment(self) -> str:
        return self.tracking.experiment or f"study-{self.name}"

    def replace(self, **changes: Any) -> StudyConfig:
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- validation

_FREE_TABLES = ("overrides", "params", "enqueue")  # experiment keys: checked against the base
_PARAM_KEYS = ("type", "low", "high", "log", "step", "choices", "fraction_of")
_SPEC_MARKERS = {"type", "low", "high", "choices"}


def _spec_tables(data: Mapping[str, Any], prefix: str = "") -> dict[str, Mapping[str, Any]]:
    """``[params.a.b]`` and ``[params."a.b"]`` both name the experiment key ``a.b``."""
    out: dict[str, Mapping[str, Any]] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and _SPEC_MARKERS & set(value):
            out[path] = value
        elif isinstance(value, Mapping):
            out.update(_spec_tables(value, path + "."))
        else:
            raise ConfigError(f"params.{path} must be a table with low/high or choices")
    return out


def _param(key: str, data: Mapping[str, Any], source: str, known: Mapping[str, Any]) -> ParamSpec:
    where = f"{source}: params.{key}"
    for k in data:
        if k not in _PARAM_KEYS:
            raise ConfigError(
                f"{source}: unknown key 'params.{key}.{k}'; allowed: {', '.join(_PARAM_KEYS)}"
            )
    if key not in known:
        raise ConfigError(
            f"{where}: '{key}' is not an experiment key; allowed: any of {', '.join(sorted(known))}"
        )
    current = known[key]
    default_type = (
        "categorical"
        if "choices" in data
        else ("int" if isinstance(current, int) and not isinstance(current, bool) else "float")
    )
    kind = data.get("type", default_type)
    if kind not in PARAM_TYPES:
        raise ConfigError(
            f"{where}.type = {kind!r} is not known; allowed: {', '.join(PARAM_TYPES)}"
        )
    fraction_of = data.get("fraction_of", "")
    if fraction_of and (fraction_of not in known or kind != "float"):
        raise ConfigError(
            f"{where}.fraction_of = {fraction_of!r} must name another float experiment key and "
            "needs type = 'float'"
        )
    if kind == "categorical":
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choices must be a non-empty list")
        return ParamSpec(key=key, type=kind, choices=tuple(choices))
    return _numeric_param(key, kind, data, where, fraction_of)


def _numeric_param(
    key: str, kind: str, data: Mapping[str, Any], where: str, fraction_of: str
) -> ParamSpec:
    """An int or float parameter: its range, log scale and step, checked."""
    low, high = data.get("low"), data.get("high")
    num = (int,) if kind == "int" else (int, float)
    for name, v in (("low", low), ("high", high)):
        if not isinstance(v, num) or isinstance(v, bool):
            raise ConfigError(
                f"{where}.{name} must be {'an integer' if kind == 'int' else 'a number'} (got "
                f"{v!r})"
            )
    if not low <= high:
        raise ConfigError(f"{where}: low ({low}) must not exceed high ({high})")
    log = data.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log must be true or false")
    if log and low <= 0:
        raise ConfigError(f"{where}: log = true needs low > 0 (got {low})")
    if fraction_of and not (0 < low and high <= 1):
        raise ConfigError(
            f"{where}: with fraction_of, low and high are fractions in (0, 1] (got [{low}, {high}])"
        )
    step = data.get("step")
    if step is not None and (not isinstance(step, (int, float)) or step <= 0 or log):
        raise ConfigError(
            f"{where}.step must be a positive number and cannot be combined with log = true"
        )
    if kind == "float":
        low, high = float(low), float(high)
    return ParamSpec(
        key=key, type=kind, low=low, high=high, log=log, step=step, fraction_of=fraction_of
    )


def _check_space(params: tuple[ParamSpec, ...], base: ExperimentConfig, source: str) -> None:
    """Every corner of the search space must give a valid experiment config."""
    by_key = {p.key: p for p in params}
    for p in params:
        if p.fraction_of and p.fraction_of in by_key and by_key[p.fraction_of].fraction_of:
            raise ConfigError(
                f"{source}: params.{p.key}.fraction_of cannot point at another fraction parameter"
            )
    for corner in ("low", "high"):
        values: dict[str, Any] = {}
        for p in params:
            if p.fraction_of:
                continue
            values[p.key] = (
                p.choices[0 if corner == "low" else -1]
                if p.type == "categorical"
                else getattr(p, corner)
            )
        for p in params:
            if p.fraction_of:
                ref = values.get(p.fraction_of, base.flat()[p.fraction_of])
                values[p.key] = getattr(p, corner) * ref
        try:
            base.replace(**values)
        except ConfigError as exc:
            raise ConfigError(
                f"{source}: the search space's {corner} corner gives an invalid experiment ({exc})"
            ) from None


def _pairs(data: Any, source: str, section: str) -> tuple[tuple[str, Any], ...]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: '{section}' must be a table [{section}]")
    return tuple(sorted(flatten(data).items()))


def _settings(data: Mapping[str, Any], source: str) -> StudySettings:
    """The file's own keys, through the experiment config's validator, then the
    constraints between them."""
    objective = data.get("objective")
    metrics = objective.get("metrics") if isinstance(objective, Mapping) else None
    if metrics == "test_acc" or (isinstance(metrics, list) and "test_acc" in metrics):
        raise ConfigError(
            f"{source}: objective.metrics: test_acc is the test split, "
            "which is reported, never optimised; use val_acc"
        )
    plain = {k: v for k, v in data.items() if k not in _FREE_TABLES}
    allowed = [f.name for f in fields(StudySettings)] + list(_FREE_TABLES)
    for key in plain:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown key '{key}'; allowed: {', '.join(allowed)}")
    s = build(StudySettings, plain, source)
    check_study_name(s.name, f"{source}: name")
    if s.n_trials == 0 and s.timeout == 0:
        raise ConfigError(
            f"{source}: n_trials = 0 means no trial limit and needs a time budget: "
            "set timeout > 0 (seconds) or n_trials >= 1"
        )
    if len(s.objective.metrics) > 2:
        raise ConfigError(
            f"{source}: objective.metrics must list one or two distinct metrics; "
            f"allowed: {', '.join(OBJECTIVES)}"
        )
    beat, grace = s.storage.heartbeat_interval, s.storage.grace_period
    if beat >= grace:
        raise ConfigError(
            f"{source}: storage.heartbeat_interval ({beat}) must be less than storage.grace_period "
            f"({grace}), or live trials would be failed as stale between two heartbeats"
        )
    if len(s.objective.metrics) > 1 and s.pruner.name != "none":
        raise ConfigError(
            f"{source}: pruner.name = {s.pruner.name!r}: Optuna cannot prune "
            "multi-objective trials; use pruner.name = 'none'"
        )
    return s


def _params(data: Mapping[str, Any], base: ExperimentConfig, source: str) -> tuple[ParamSpec, ...]:
    raw_params = data.get("params", {})
    if not isinstance(raw_params, Mapping) or not raw_params:
        raise ConfigError(
            f"{source}: [params] must declare at least one parameter, e.g. "
            "[params.mutation.strength] low = 0.0, high = 1.0"
        )
    try:
        tables = _spec_tables(raw_params)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    params = tuple(_param(k, v, source, base.flat()) for k, v in tables.items())
    _check_space(params, base, source)
    return params


Point = tuple[tuple[str, Any], ...]  # an enqueued point: (parameter, value) pairs


def _enqueue(
    data: Mapping[str, Any], params: tuple[ParamSpec, ...], source: str
) -> tuple[Point, ...]:
    enqueue_raw = data.get("enqueue", [])
    if not isinstance(enqueue_raw, list) or not all(isinstance(e, Mapping) for e in enqueue_raw):
        raise ConfigError(
            f"{source}: enqueue must be a list of tables ([[enqueue]]) of parameter values"
        )
    names = {p.optuna_name for p in params}
    enqueue = []
    for i, entry in enumerate(enqueue_raw):
        flat = flatten(entry)
        unknown = [k for k in flat if k not in names]
        if unknown:
            raise ConfigError(
                f"{source}: enqueue[{i}] names '{unknown[0]}', which is not a parameter; allowed: "
                f"{', '.join(sorted(names))}"
            )
        enqueue.append(tuple(sorted(flat.items())))
    return tuple(enqueue)


def from_dict(data: Mapping[str, Any], source: str = "study") -> StudyConfig:
    """Validate a parsed study file."""
    settings = _settings(data, source)
    overrides = _pairs(data.get("overrides", {}), source, "overrides")
    base_path = _resolve_base(settings.experiment, source)
    try:
        base = load(base_path, dict(overrides))
    except ConfigError as exc:
        raise ConfigError(f"{source}: base experiment: {exc}") from None
    params = _params(data, base, source)
    return StudyConfig(
        **{f.name: getattr(settings, f.name) for f in fields(StudySettings)},
        source=source,
        base=base,
        params=params,
        overrides=overrides,
        enqueue=_enqueue(data, params, source),
    ).replace(experiment=str(base_path))


def check_study_name(name: Any, where: str = "--study-name") -> str:
    """A study name goes into MLflow filter strings (``tags.`asolab.study` = '<name>'``),
    so quotes and backslashes, which would break or change the filter, are refused."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where} must be a non-empty string (got {name!r})")
    bad = sorted({c for c in name if c in "'\"\\`" or not c.isprintable()})
    if bad:
        raise ConfigError(
            f"{where} {name!r} contains {' '.join(repr(c) for c in bad)}; "
            "use letters, digits and - _ . (no quotes, backslashes or control characters)"
        )
    return name


def _resolve_base(experiment: str, source: str) -> Path:
    p = Path(experiment)
    if not p.is_absolute() and source not in ("study", "") and (Path(source).parent / p).exists():
        return Path(source).parent / p  # relative to the study file
    try:
        return resolve_experiment_path(experiment)
    except ConfigError as exc:
        raise ConfigError(f"{source}: experiment: {exc}") from None


def resolve_study_path(path: str | Path | None) -> Path:
    """A file path, or a bare name looked up in studies/ (default: temperature_mutation)."""
    return resolve_named_file(path, DEFAULT_STUDY, STUDIES_DIR, "study")


def load_study(path: str | Path | None = None, overrides: Sequence[str] = ()) -> StudyConfig:
    """Load and validate a study file (default: studies/temperature_mutation.toml).

    ``overrides`` (``asolab study --set section.key=value``) go over the file's
    ``[overrides]``: fixed for every trial, validated with the rest, once, here. A key
    the study tunes is refused: Optuna's value would replace it in every trial.
    """
    file = resolve_study_path(path)
    data = read_toml(file, "study")
    data.setdefault("name", file.stem)
    if overrides:
        pairs = dict(parse_override(o) for o in overrides)
        try:
            tuned = set(_spec_tables(data.get("params", {})))
        except (ConfigError, AttributeError):  # a malformed [params]: from_dict says how
            tuned = set()
        study_only = {f.name for f in fields(StudySettings)} - {
            f.name for f in fields(ExperimentConfig)
        }
        for key in pairs:
            if key.split(".", 1)[0] in study_only:
                raise ConfigError(
                    f"--set {key}: a key of the study file, not of the trials' experiment; "
                    f"edit it in {file} (--n-trials and --timeout set the budget)"
                )
            if key in tuned:
                raise ConfigError(
                    f"--set {key}: the study tunes this key (params.{key} in {file}); "
                    "change its range in the file, or drop --set"
                )
        fixed = data.get("overrides", {})
        data["overrides"] = {**(flatten(fixed) if isinstance(fixed, Mapping) else {}), **pairs}
    return from_dict(data, str(file)).replace(set_overrides=tuple(overrides))


def trial_overrides(params: Mapping[str, Any], cfg: StudyConfig) -> dict[str, Any]:
    """Optuna's sampled values -> experiment ``section.key`` overrides (fractions resolved)."""
    out: dict[str, Any] = {}
    for p in cfg.params:
        if not p.fraction_of and p.optuna_name in params:
            out[p.key] = params[p.optuna_name]
    base = cfg.base.flat()
    for p in cfg.params:
        if p.fraction_of and p.optuna_name in params:
            ref = out.get(p.fraction_of, base[p.fraction_of])
            # Round-off must never push min above initial: clamp to the reference.
            out[p.key] = min(ref, params[p.optuna_name] * ref)
    return out


def in_range(p: ParamSpec, value: Any) -> bool:
    """Whether a sampled value lies in the declared distribution (used by tests and checks)."""
    if p.type == "categorical":
        return value in p.choices
    return p.low - 1e-12 <= value <= p.high + 1e-12 and not (
        isinstance(value, float) and math.isnan(value)
    )

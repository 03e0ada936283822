"""Study configuration: which experiment keys Optuna tunes, how, and for how long.

A study file (TOML, in ``studies/``) names a base experiment file, fixed
overrides for every trial, the search space, the objective, the sampler, the
pruner, the budget and where things are stored::

    name = "temperature_mutation"     # default: the file's stem
    experiment = "digits"             # base experiment (a bare name looks in experiments/)
    n_trials = 20                     # trials the study should hold in total (0 = no limit, needs a timeout)
    timeout = 0                       # seconds per invocation (0 = no limit)
    seed = 0                          # seeds the sampler (mixed with the worker and the trials so far)

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
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..config import PROJECT_ROOT, ConfigError, ExperimentConfig, flatten, load, resolve_experiment_path, resolve_named_file

STUDIES_DIR = PROJECT_ROOT / "studies"
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

    metrics: tuple[str, ...] = ("val_acc",)
    # Runs per trial, seeds base.seed .. base.seed + seeds - 1; the trial's values are their
    # means. Seed noise of one digits run is about as large as the knobs' effect
    # (bench/README.md, study_signal.py): averaging divides it by sqrt(seeds).
    seeds: int = 1

    @property
    def directions(self) -> tuple[str, ...]:
        return tuple(OBJECTIVES[m] for m in self.metrics)


@dataclass(frozen=True)
class SamplerConfig:
    """Which Optuna sampler; every setting explicit (Optuna 5 changed some defaults)."""

    name: str = "tpe"
    n_startup_trials: int = 5  # tpe: random trials before the model takes over
    multivariate: bool = True  # tpe: model the parameters jointly (temperature and its floor interact)
    constant_liar: bool = True  # tpe: keep parallel workers from sampling the same point
    population_size: int = 8  # nsga2


@dataclass(frozen=True)
class PrunerConfig:
    """When a trial stops early on its per-cycle validation accuracy."""

    name: str = "median"
    n_startup_trials: int = 3  # median / percentile: never prune before this many trials finished
    n_warmup_steps: int = 0  # median / percentile: never prune before this cycle
    percentile: float = 25.0  # percentile: keep trials in the top (100 - percentile)%
    min_resource: int = 1  # hyperband, in cycles
    reduction_factor: int = 3  # hyperband
    lower: float = 0.0  # threshold: prune when val_acc < lower


@dataclass(frozen=True)
class StorageConfig:
    """Where the study lives and how crashed workers are recovered."""

    url: str = ""  # '' = JournalStorage in mlruns/optuna-journal.log
    heartbeat_interval: int = 60  # seconds between a running trial's heartbeats (< grace_period)
    grace_period: int = 180  # a RUNNING trial silent this long is stale: failed and retried
    # (a trial whose owner process is alive on this host is never failed on the journal)
    max_retry: int = 1  # how often a stale trial's parameters are retried


@dataclass(frozen=True)
class StudyTrackingConfig:
    """Where the study's MLflow parent run and trial runs go."""

    tracking_uri: str = ""  # '' = the base experiment's tracking.tracking_uri, MLFLOW_TRACKING_URI, or mlruns/
    experiment: str = ""  # MLflow experiment ('' = "study-<name>")


@dataclass(frozen=True)
class StudyConfig:
    """A whole study, validated; ``base`` is the resolved base experiment."""

    name: str
    source: str
    experiment: str
    base: ExperimentConfig
    params: tuple[ParamSpec, ...]
    n_trials: int = 10
    timeout: float = 0.0
    seed: int = 0
    overrides: tuple[tuple[str, Any], ...] = ()
    enqueue: tuple[tuple[tuple[str, Any], ...], ...] = ()
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    tracking: StudyTrackingConfig = field(default_factory=StudyTrackingConfig)

    @property
    def multi_objective(self) -> bool:
        return len(self.objective.metrics) > 1

    @property
    def mlflow_experiment(self) -> str:
        return self.tracking.experiment or f"study-{self.name}"

    def replace(self, **changes: Any) -> "StudyConfig":
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- validation

_TOP_KEYS = ("name", "experiment", "n_trials", "timeout", "seed", "overrides", "params", "enqueue",
             "objective", "sampler", "pruner", "storage", "tracking")
_PARAM_KEYS = ("type", "low", "high", "log", "step", "choices", "fraction_of")
_SPEC_MARKERS = {"type", "low", "high", "choices"}


def _table(cls: type, data: Any, source: str, section: str, checks: Mapping[str, Any]) -> Any:
    """Build a settings dataclass from a TOML table, checking types and ranges."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: '{section}' must be a table [{section}]")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{source}: {section}.{key}"
        if key not in fields:
            raise ConfigError(f"{source}: unknown key '{section}.{key}'; allowed: {', '.join(fields)}")
        kind = type(getattr(defaults, key))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is tuple:
            value = tuple(value) if isinstance(value, list) else (value,)
        elif not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"{where} must be {_kind_name(kind)} (got {value!r})")
        check = checks.get(key)
        if check is not None:
            ok, allowed = check
            if not ok(value):
                raise ConfigError(f"{where} = {value!r} is out of range; allowed: {allowed}")
        kwargs[key] = value
    return cls(**kwargs)


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, kind.__name__)


def _choice(options: tuple[str, ...] | list[str]) -> tuple[Any, str]:
    return (lambda v: v in options, "one of " + ", ".join(options))


def _at_least(lo: float) -> tuple[Any, str]:
    return (lambda v: v >= lo, f">= {lo}")


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
            raise ConfigError(f"{source}: unknown key 'params.{key}.{k}'; allowed: {', '.join(_PARAM_KEYS)}")
    if key not in known:
        raise ConfigError(f"{where}: '{key}' is not an experiment key; allowed: any of {', '.join(sorted(known))}")
    current = known[key]
    default_type = "categorical" if "choices" in data else ("int" if isinstance(current, int) and not isinstance(current, bool) else "float")
    kind = data.get("type", default_type)
    if kind not in PARAM_TYPES:
        raise ConfigError(f"{where}.type = {kind!r} is not known; allowed: {', '.join(PARAM_TYPES)}")
    fraction_of = data.get("fraction_of", "")
    if fraction_of and (fraction_of not in known or kind != "float"):
        raise ConfigError(f"{where}.fraction_of = {fraction_of!r} must name another float experiment key and needs type = 'float'")
    if kind == "categorical":
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choices must be a non-empty list")
        return ParamSpec(key=key, type=kind, choices=tuple(choices))
    low, high = data.get("low"), data.get("high")
    num = (int,) if kind == "int" else (int, float)
    for name, v in (("low", low), ("high", high)):
        if not isinstance(v, num) or isinstance(v, bool):
            raise ConfigError(f"{where}.{name} must be {'an integer' if kind == 'int' else 'a number'} (got {v!r})")
    if not low <= high:
        raise ConfigError(f"{where}: low ({low}) must not exceed high ({high})")
    log = data.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log must be true or false")
    if log and low <= 0:
        raise ConfigError(f"{where}: log = true needs low > 0 (got {low})")
    if fraction_of and not (0 < low and high <= 1):
        raise ConfigError(f"{where}: with fraction_of, low and high are fractions in (0, 1] (got [{low}, {high}])")
    step = data.get("step")
    if step is not None and (not isinstance(step, (int, float)) or step <= 0 or log):
        raise ConfigError(f"{where}.step must be a positive number and cannot be combined with log = true")
    if kind == "float":
        low, high = float(low), float(high)
    return ParamSpec(key=key, type=kind, low=low, high=high, log=log, step=step, fraction_of=fraction_of)


def _check_space(params: tuple[ParamSpec, ...], base: ExperimentConfig, source: str) -> None:
    """Every corner of the search space must give a valid experiment config."""
    by_key = {p.key: p for p in params}
    for p in params:
        if p.fraction_of and p.fraction_of in by_key and by_key[p.fraction_of].fraction_of:
            raise ConfigError(f"{source}: params.{p.key}.fraction_of cannot point at another fraction parameter")
    for corner in ("low", "high"):
        values: dict[str, Any] = {}
        for p in params:
            if p.fraction_of:
                continue
            values[p.key] = p.choices[0 if corner == "low" else -1] if p.type == "categorical" else getattr(p, corner)
        for p in params:
            if p.fraction_of:
                ref = values.get(p.fraction_of, base.flat()[p.fraction_of])
                values[p.key] = getattr(p, corner) * ref
        try:
            base.replace(**values)
        except ConfigError as exc:
            raise ConfigError(f"{source}: the search space's {corner} corner gives an invalid experiment ({exc})") from None


def _pairs(data: Any, source: str, section: str) -> tuple[tuple[str, Any], ...]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: '{section}' must be a table [{section}]")
    return tuple(sorted(flatten(data).items()))


def from_dict(data: Mapping[str, Any], source: str = "study") -> StudyConfig:
    """Validate a parsed study file."""
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{source}: unknown key '{key}'; allowed: {', '.join(_TOP_KEYS)}")
    name = data.get("name", "study")
    check_study_name(name, f"{source}: name")
    experiment = data.get("experiment", "digits")
    if not isinstance(experiment, str):
        raise ConfigError(f"{source}: experiment must be a string naming an experiment file (got {experiment!r})")
    n_trials = data.get("n_trials", 10)
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 0:
        raise ConfigError(f"{source}: n_trials must be an integer >= 0 (got {n_trials!r}; 0 = no limit, needs a timeout)")
    timeout = data.get("timeout", 0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        raise ConfigError(f"{source}: timeout must be a number of seconds >= 0 (got {timeout!r})")
    if n_trials == 0 and timeout == 0:
        raise ConfigError(f"{source}: n_trials = 0 means no trial limit and needs a time budget: set timeout > 0 (seconds) or n_trials >= 1")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"{source}: seed must be an integer >= 0 (got {seed!r})")

    overrides = _pairs(data.get("overrides", {}), source, "overrides")
    base_path = _resolve_base(experiment, source)
    try:
        base = load(base_path, dict(overrides))
    except ConfigError as exc:
        raise ConfigError(f"{source}: base experiment: {exc}") from None

    objective = _table(ObjectiveConfig, data.get("objective", {}), source, "objective", {"seeds": _at_least(1)})
    if "test_acc" in objective.metrics:
        raise ConfigError(f"{source}: objective.metrics: test_acc is the test split, which is reported, never optimised; use val_acc")
    bad = [m for m in objective.metrics if m not in OBJECTIVES]
    if bad or not 1 <= len(objective.metrics) <= 2 or len(set(objective.metrics)) != len(objective.metrics):
        raise ConfigError(f"{source}: objective.metrics must list one or two distinct metrics; allowed: {', '.join(OBJECTIVES)}")
    sampler = _table(SamplerConfig, data.get("sampler", {}), source, "sampler", {
        "name": _choice(SAMPLERS), "n_startup_trials": _at_least(0), "population_size": _at_least(2)})
    pruner = _table(PrunerConfig, data.get("pruner", {}), source, "pruner", {
        "name": _choice(PRUNERS), "n_startup_trials": _at_least(0), "n_warmup_steps": _at_least(0),
        "percentile": (lambda v: 0 <= v <= 100, "in [0, 100]"), "min_resource": _at_least(1),
        "reduction_factor": _at_least(2)})
    storage = _table(StorageConfig, data.get("storage", {}), source, "storage", {
        "heartbeat_interval": _at_least(1), "grace_period": _at_least(1), "max_retry": _at_least(0)})
    if storage.heartbeat_interval >= storage.grace_period:
        raise ConfigError(
            f"{source}: storage.heartbeat_interval ({storage.heartbeat_interval}) must be less than storage.grace_period "
            f"({storage.grace_period}), or live trials would be failed as stale between two heartbeats")
    tracking = _table(StudyTrackingConfig, data.get("tracking", {}), source, "tracking", {})
    if len(objective.metrics) > 1 and pruner.name != "none":
        raise ConfigError(f"{source}: pruner.name = {pruner.name!r}: Optuna cannot prune multi-objective trials; use pruner.name = 'none'")

    known = base.flat()
    raw_params = data.get("params", {})
    if not isinstance(raw_params, Mapping) or not raw_params:
        raise ConfigError(f"{source}: [params] must declare at least one parameter, e.g. [params.mutation.strength] low = 0.0, high = 1.0")
    try:
        tables = _spec_tables(raw_params)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    params = tuple(_param(k, v, source, known) for k, v in tables.items())
    _check_space(params, base, source)

    enqueue_raw = data.get("enqueue", [])
    if not isinstance(enqueue_raw, list) or not all(isinstance(e, Mapping) for e in enqueue_raw):
        raise ConfigError(f"{source}: enqueue must be a list of tables ([[enqueue]]) of parameter values")
    names = {p.optuna_name for p in params}
    enqueue = []
    for i, entry in enumerate(enqueue_raw):
        flat = flatten(entry)
        unknown = [k for k in flat if k not in names]
        if unknown:
            raise ConfigError(f"{source}: enqueue[{i}] names '{unknown[0]}', which is not a parameter; allowed: {', '.join(sorted(names))}")
        enqueue.append(tuple(sorted(flat.items())))

    return StudyConfig(
        name=name, source=source, experiment=str(base_path), base=base, params=params,
        n_trials=n_trials, timeout=float(timeout), seed=seed, overrides=overrides, enqueue=tuple(enqueue),
        objective=objective, sampler=sampler, pruner=pruner, storage=storage, tracking=tracking,
    )


def check_study_name(name: Any, where: str = "--study-name") -> str:
    """A study name goes into MLflow filter strings (``tags.`asolab.study` = '<name>'``),
    so quotes and backslashes, which would break or change the filter, are refused."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where} must be a non-empty string (got {name!r})")
    bad = sorted({c for c in name if c in "'\"\\`" or not c.isprintable()})
    if bad:
        raise ConfigError(f"{where} {name!r} contains {' '.join(repr(c) for c in bad)}; "
                          "use letters, digits and - _ . (no quotes, backslashes or control characters)")
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


def load_study(path: str | Path | None = None) -> StudyConfig:
    """Load and validate a study file (default: studies/temperature_mutation.toml)."""
    file = resolve_study_path(path)
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML ({exc})") from None
    data = dict(data)
    data.setdefault("name", file.stem)
    return from_dict(data, str(file))


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
    return p.low - 1e-12 <= value <= p.high + 1e-12 and not (isinstance(value, float) and math.isnan(value))

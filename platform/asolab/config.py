"""Experiment configuration: frozen, typed dataclasses loaded from TOML.

An experiment file has one table per concern (``[data]``, ``[space]``,
``[search]``, ``[temperature]``, ``[mutation]``, ``[growth]``, ``[tracking]``,
``[speed]``)
plus top-level ``seed`` and ``device``. Every field carries its constraint in
its metadata, so the loader validates the whole file once, at the edge, and
refuses bad input with one line naming the file, the key and what is allowed.

Overrides use the same path syntax as the file: ``--set search.cycles=2``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The largest seed torch.manual_seed and numpy's generators both accept as one signed 64-bit value.
SEED_MAX = 2**63 - 1


def shipped_dir(name: str) -> Path:
    """Where the configs that come with asolab live: ``<checkout>/<name>`` in a source
    checkout (editable install, PYTHONPATH), else the package data of an installed wheel
    (``asolab/<name>``, mapped from the checkout's folder by pyproject.toml)."""
    checkout = PROJECT_ROOT / name
    if (PROJECT_ROOT / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return Path(__file__).resolve().parent / name


EXPERIMENTS_DIR = shipped_dir("experiments")
DEFAULT_EXPERIMENT = EXPERIMENTS_DIR / "digits.toml"

FINAL_GENOTYPES = ("best", "last", "derived")
W_SAMPLINGS = ("gumbel", "fair")  # how W-training picks the path of each step
FINAL_WEIGHTS = ("inherit", "fresh")  # what the final network starts from


class ConfigError(ValueError):
    """A configuration problem, phrased as one line for the user."""


class Registered:
    """The names of a registry, read when a config is checked, not when this module loads.

    Each registry lives in the module that implements its entries (data sets in
    ``data.py``, schedules in ``evolution/sampling.py``, growth policies in
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


def _check(
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


def _field(default: Any, **check: Any) -> Any:
    """A config field: its default, its constraint and its help text (read by the
    validator and by ``python -m asolab.config_doc``). A callable default is a factory."""
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for defaults")
    if callable(default):
        return field(default_factory=default, metadata=_check(**check))
    return field(default=default, metadata=_check(**check))


DATASETS = Registered("asolab.data", "REGISTRY")
PRIMITIVES = Registered("asolab.space.ops", "PRIMITIVES")  # the built-in ops, the default
OPERATIONS = Registered("asolab.space.ops", "OPS")  # every op: built-in, plugins, code
PARAMETER_FREE = Registered("asolab.space.ops", "PARAMETER_FREE")
SCHEDULES = Registered("asolab.evolution.sampling", "SCHEDULES")
GROWTH_POLICIES = Registered("asolab.evolution.growth", "POLICIES")
WIDENING_POLICIES = Registered("asolab.evolution.growth", "WIDENING")
SELECTIONS = Registered("asolab.evolution.selection", "SELECTIONS")


@dataclass(frozen=True)
class DataConfig:
    """Which data set, how it is split, batched and augmented."""

    name: str = _field(
        "digits",
        choices=DATASETS,
        help="the data set: a built-in one, folder, arrays, or a plugin's (docs/data.md)",
    )
    data_dir: str = _field(
        "",
        help=(
            "folder holding the data set files ('' = its default place); for 'folder', the "
            "ImageFolder root with train/<class>/ (and test/<class>/) (docs/data.md)"
        ),
    )
    path: str = _field("", help="the .npz file of data set 'arrays' (docs/data.md)")
    image_size: int = _field(
        0,
        ge=0,
        le=65536,
        help="resize images to image_size x image_size (0 = as loaded; 'folder': the most common)",
    )
    download: bool = _field(False, help="let torchvision download mnist/cifar into data_dir")
    val_fraction: float = _field(
        0.2,
        gt=0.0,
        le=0.5,
        help=(
            "share of the training data held out for alpha-training and selection; it must hold "
            "at least one example per class, else the run is refused with the least fraction "
            "that does"
        ),
    )
    test_fraction: float = _field(
        0.2,
        gt=0.0,
        le=0.5,
        help="share carved out as test split for data sets without one (digits)",
    )
    split_seed: int = _field(
        0,
        ge=0,
        le=SEED_MAX,
        help="seed of the test carve-out; fixed so that all runs share one test split",
    )
    train_subset: int = _field(
        0,
        ge=0,
        help="use at most this many training examples for search (0 = all); fewer than the "
        "data set's classes is refused, fewer than batch_size warned of",
    )
    batch_size: int = _field(64, ge=1, le=65536, help="training batch size")
    eval_batch_size: int = _field(
        512, ge=1, le=65536, help="evaluation batch size (validation, test)"
    )
    augment: bool = _field(
        True, help="the data set's own batched augmentation on the training split"
    )


@dataclass(frozen=True)
class SpaceConfig:
    """The DARTS-style search space: operations, cells and supernet size."""

    primitives: tuple[str, ...] = _field(
        PRIMITIVES,
        choices=OPERATIONS,
        help=(
            "the op set: candidate operations on every edge (default: the eight built-in ones; "
            "plugins add more, docs/python-api.md#plugins)"
        ),
    )
    init_channels: int = _field(
        16, ge=1, le=1024, help="supernet width: channels of the first cells"
    )
    layers: int = _field(
        3, ge=1, le=64, help="number of cells; reduction cells sit at 1/3 and 2/3 depth"
    )
    steps: int = _field(2, ge=1, le=8, help="intermediate nodes per cell")
    stem_multiplier: int = _field(
        3, ge=1, le=8, help="stem width = stem_multiplier * init_channels"
    )
    stem_stride: int = _field(
        1,
        choices=(1, 2),
        help=(
            "stride of the stem convolution: 2 halves the resolution every cell runs at "
            "(about 3-4x less arithmetic per image on 28x28 inputs)"
        ),
    )


@dataclass(frozen=True)
class SearchConfig:
    """The ASO-SE cycle: epochs per phase and optimiser settings."""

    cycles: int = _field(
        3, ge=1, le=1000, help="ASO-SE cycles (W-training, alpha-training, mutation, W-retraining)"
    )
    warmup_epochs: int = _field(
        0,
        ge=0,
        le=1000,
        help="extra W-training epochs in the first cycle, before alphas are trained",
    )
    w_epochs: int = _field(2, ge=0, le=1000, help="W-training epochs per cycle")
    w_sampling: str = _field(
        "gumbel",
        choices=W_SAMPLINGS,
        help=(
            "W-training's path per step: gumbel = one op per edge drawn by hard Gumbel-softmax "
            "from the alphas at the current temperature; fair = every op of an edge drawn once "
            "in each round of as many steps as it has ops, whatever the alphas say "
            "(docs/concepts.md)"
        ),
    )
    alpha_epochs: int = _field(1, ge=0, le=1000, help="alpha-training epochs per cycle")
    param_free_cap: int = _field(
        -1,
        ge=-1,
        le=1000,
        help=(
            "the most parameter-free ops (skip_connect, max/avg pool) a cell of a derived or "
            "mutated genotype may have: derive() swaps the cheapest ones for their edge's "
            "strongest op with weights, mutation draws none past it, and the random control arm "
            "draws from the same capped space (-1 = no cap; docs/concepts.md)"
        ),
    )
    retrain_epochs: int = _field(
        2, ge=0, le=1000, help="W-retraining epochs of the derived network per cycle"
    )
    selection: str = _field(
        "alpha",
        choices=SELECTIONS,
        help=(
            "how the mutation phase reads the genotype off the supernet: alpha = the "
            "largest alpha per edge (derive()); perturbation = per edge the op whose masking "
            "lowers the sampled supernet's validation accuracy most, recorded per cycle in "
            "selection/cycle_NNN.json (docs/baselines.md)"
        ),
    )
    selection_images: int = _field(
        512,
        ge=1,
        le=1_000_000,
        help="perturbation selection: the first this many validation images it measures on",
    )
    selection_paths: int = _field(
        4,
        ge=1,
        le=1000,
        help=(
            "perturbation selection: sampled supernet paths (drawn from the alphas with a "
            "generator seeded by the run's seed) each op's accuracy is averaged over"
        ),
    )
    final_epochs: int = _field(
        0,
        ge=0,
        le=1000,
        help=(
            "extra W-retraining epochs of the final network after the last cycle (with "
            "budget_minutes: the most it may train)"
        ),
    )
    budget_minutes: float = _field(
        0.0,
        ge=0.0,
        le=100000.0,
        help=(
            "wall-clock minutes for the whole run (0 = off): after its first epoch the final "
            "stage trains as many of final_epochs as fit in what is left (at least one), "
            "the learning-rate schedule still ending at weight_lr_min; the count is recorded"
        ),
    )
    weight_lr: float = _field(
        0.05,
        gt=0.0,
        le=10.0,
        help="SGD on weights: initial learning rate (cosine-annealed over the weight epochs)",
    )
    weight_lr_min: float = _field(
        0.001, ge=0.0, le=10.0, help="SGD on weights: the learning rate the annealing ends at"
    )
    weight_momentum: float = _field(0.9, ge=0.0, le=0.999, help="SGD on weights: momentum")
    weight_decay: float = _field(3e-4, ge=0.0, le=1.0, help="SGD on weights: weight decay")
    alpha_lr: float = _field(3e-3, gt=0.0, le=10.0, help="Adam on alphas: learning rate")
    alpha_weight_decay: float = _field(1e-3, ge=0.0, le=1.0, help="Adam on alphas: weight decay")
    grad_clip: float = _field(
        5.0, gt=0.0, inf=True, help="gradient-norm clip of every weight step (inf = no clipping)"
    )
    checkpoint_minutes: float = _field(
        5.0,
        ge=0.0,
        le=1440.0,
        help=(
            "upload a phase's checkpoint, or write one after a final-stage epoch, once the last "
            "uploaded one is this old (0 = every one); cycles and the final stage always upload "
            "theirs, an interrupted run its latest"
        ),
    )
    calibration_batches: int = _field(
        8,
        ge=0,
        le=10000,
        help=(
            "training batches that re-estimate BatchNorm statistics of a derived network (0 = off)"
        ),
    )
    final_genotype: str = _field(
        "best",
        choices=FINAL_GENOTYPES,
        help=(
            "the network trained in the final epochs: best = the cycle genotype with the highest "
            "validation accuracy, last = the last cycle's mutated genotype, derived = derive() "
            "of the final alphas, unmutated"
        ),
    )
    final_weights: str = _field(
        "inherit",
        choices=FINAL_WEIGHTS,
        help=(
            "what the final network's training starts from: inherit = the weights the search "
            "trained (ASO-SE's function-preserving hand-over), fresh = newly initialised weights "
            "(the NAS protocol of re-training the search's result); the final epochs and their "
            "learning rates are the same"
        ),
    )


@dataclass(frozen=True)
class TemperatureConfig:
    """Gumbel-softmax temperature: a pure function of run progress."""

    schedule: str = _field(
        "exponential",
        choices=SCHEDULES,
        help="how the temperature falls from initial to min (docs/concepts.md)",
    )
    initial_temperature: float = _field(
        5.0, gt=0.0, le=100.0, help="Gumbel-softmax temperature at the start of the run"
    )
    min_temperature: float = _field(
        0.5, gt=0.0, le=100.0, help="the temperature's floor (<= initial_temperature)"
    )
    anneal_fraction: float = _field(
        0.8,
        gt=0.0,
        le=1.0,
        help="share of the run after which the temperature stays at min_temperature",
    )


@dataclass(frozen=True)
class MutationConfig:
    """Mutation phase: how many op edits, guided by the alphas."""

    strength: float = _field(
        0.25, ge=0.0, le=1.0, help="s in k = max(1, round(s * E)) op edits over E genotype edges"
    )


@dataclass(frozen=True)
class GrowthConfig:
    """Function-preserving growth during the mutation phase."""

    policy: str = _field(
        "none",
        choices=GROWTH_POLICIES,
        help=(
            "growth in the mutation phase: one kind always, cycle = rotate widen/deepen/branch, "
            "plateau = grow when val acc stalls (docs/growth.md)"
        ),
    )
    max_params: int = _field(
        0, ge=0, help="never grow past this many supernet parameters (0 = no cap)"
    )
    plateau_patience: int = _field(
        1, ge=1, le=100, help="cycles without validation gain before 'plateau' grows"
    )


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs are recorded (used by the MLflow observer)."""

    enabled: bool = _field(
        True, help="record the run in MLflow (asolab run --no-track turns it off)"
    )
    tracking_uri: str = _field(
        "", help="MLflow tracking URI ('' = MLFLOW_TRACKING_URI or the local mlruns/ store)"
    )
    experiment: str = _field("", help="MLflow experiment name ('' = the experiment file's name)")
    log_models: bool = _field(True, help="log the final derived network as an MLflow model")


@dataclass(frozen=True)
class SpeedConfig:
    """How the kernels run: switches that change speed, not the method (bench/ measures each)."""

    channels_last: bool = _field(
        True,
        help=(
            "weights and activations in channels-last layout: on the CPU oneDNN's depthwise "
            "and pooling kernels run faster that way (training steps 1.1-1.6x, the default run "
            "1.24x: bench/final_speed.py, bench/search_throughput.py --cycle)"
        ),
    )


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: everything a run needs, validated."""

    name: str = _field("digits", help="experiment name (defaults to the file's stem)")
    seed: int = _field(
        0,
        ge=0,
        le=SEED_MAX,
        help=(
            "seeds weights, sampling, mutation and the validation split; same seed and thread "
            "count, same run on the CPU"
        ),
    )
    device: str = _field(
        "auto", help="auto (CUDA, then MPS, then the CPU) | cpu | cuda | cuda:N | mps"
    )
    threads: int = _field(
        0,
        ge=0,
        le=1024,
        help="torch CPU threads (0 = auto: usable cores minus other asolab processes' threads)",
    )
    data: DataConfig = field(default_factory=DataConfig)
    space: SpaceConfig = field(default_factory=SpaceConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    temperature: TemperatureConfig = field(default_factory=TemperatureConfig)
    mutation: MutationConfig = field(default_factory=MutationConfig)
    growth: GrowthConfig = field(default_factory=GrowthConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def flat(self) -> dict[str, Any]:
        """Flattened ``section.key -> value`` view (for MLflow params)."""
        return flatten(self.to_dict())

    def replace(self, **overrides: Any) -> ExperimentConfig:
        """Return a validated copy with ``section.key`` overrides applied."""
        return apply_overrides(self, overrides, source="override")


# --------------------------------------------------------------------------- helpers


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


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, str(tp)
    )


def _allowed(meta: Mapping[str, Any]) -> str:
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


def _coerce(value: Any, f: dataclasses.Field, where: str) -> Any:
    """Check one leaf value against its field's type and constraint."""
    meta = f.metadata
    tp = {"int": int, "float": float, "bool": bool, "str": str}.get(str(f.type), None)
    if str(f.type).startswith("tuple"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings; allowed: {_allowed(meta)}")
        bad = [v for v in value if v not in choices_of(meta)]
        if bad:
            raise ConfigError(f"{where} has unknown value {bad[0]!r}; allowed: {_allowed(meta)}")
        if len(set(value)) != len(value) or not value:
            raise ConfigError(f"{where} must list distinct names and at least one")
        return tuple(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp is None or not isinstance(value, tp) or (tp is not bool and isinstance(value, bool)):
        allowed = _allowed(meta)
        raise ConfigError(
            f"{where} must be {_type_name(tp)}{' ' + allowed if allowed else ''} (got {value!r})"
        )
    if tp is float and not math.isfinite(value) and not (meta.get("inf") and value == math.inf):
        # nan compares false with every bound, so the range check below would let it through
        raise ConfigError(
            f"{where} must be a finite "
            f"number{'; allowed: ' + _allowed(meta) if _allowed(meta) else ''} (got {value!r})"
        )
    out_of_range = (
        (meta.get("choices") and value not in choices_of(meta))
        or (meta.get("ge") is not None and value < meta["ge"])
        or (meta.get("gt") is not None and value <= meta["gt"])
        or (meta.get("le") is not None and value > meta["le"])
    )
    if out_of_range:
        raise ConfigError(f"{where} = {value!r} is out of range; allowed: {_allowed(meta)}")
    return value


def _build(cls: type, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"{source}: unknown key '{path}'; allowed: {', '.join(fields)}")
        f = fields[key]
        sub = _section_type(f)
        if sub is not None:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: '{path}' must be a table [{path}]")
            kwargs[key] = _build(sub, value, source, path + ".")
        else:
            kwargs[key] = _coerce(value, f, f"{source}: {path}")
    return cls(**kwargs)


def _section_type(f: dataclasses.Field) -> type | None:
    """The settings class of a field that is a table (``[data]``, ``[sampler]``...), else None."""
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


def _cross_checks(cfg: ExperimentConfig, source: str) -> None:
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
    cfg = _build(ExperimentConfig, data, source)
    _cross_checks(cfg, source)
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


def _nest(overrides: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(
    cfg: ExperimentConfig, overrides: Mapping[str, Any], source: str = "--set"
) -> ExperimentConfig:
    merged = _merge(to_dict(cfg), _nest(overrides))
    return from_dict(merged, source)


def resolve_named_file(path: str | Path | None, default: Path, folder: Path, kind: str) -> Path:
    """The file a user named: ``path`` if it is a file, else a bare name (``.toml``
    optional) looked up first in ``./<folder.name>/`` of the working directory, then
    in ``folder`` (the shipped configs); ``default``'s name looked up the same way
    when None. ``kind`` names the file in the error ("experiment", "study")."""
    if path is None:
        path = default.stem
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{kind} file {str(path)!r} is a directory; name a .toml file in it")
    if p.exists():
        return p
    name = p.name if p.suffix == ".toml" else f"{p.name}.toml"
    folders = _search_folders(folder)
    for candidate in (f / name for f in folders):
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted({x.stem for f in folders for x in f.glob("*.toml")}))
    raise ConfigError(f"{kind} file {str(path)!r} not found; known {folder.name}: {known}")


def _search_folders(folder: Path) -> list[Path]:
    """``./<name>`` of the working directory first, then the shipped folder (once)."""
    local = Path.cwd() / folder.name
    if local.is_dir() and local.resolve() != folder.resolve():
        return [local, folder]
    return [folder]


def read_toml(file: Path, kind: str) -> dict[str, Any]:
    """A TOML file's tables; one ConfigError line for a file that cannot be read or parsed."""
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{file}: not a text file (it holds bytes that are not UTF-8); {kind} files are TOML "
            "text"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{kind} file {file} cannot be read ({exc.strerror or exc})") from None


def resolve_experiment_path(path: str | Path | None) -> Path:
    """A file path, or a bare name looked up in ./experiments/, then in the shipped ones."""
    return resolve_named_file(path, DEFAULT_EXPERIMENT, EXPERIMENTS_DIR, "experiment")


def load(
    path: str | Path | None = None, overrides: Sequence[str] | Mapping[str, Any] = ()
) -> ExperimentConfig:
    """Load an experiment file (default: digits) and apply ``--set`` overrides."""
    file = resolve_experiment_path(path)
    data = read_toml(file, "experiment")
    data.setdefault("name", file.stem)
    cfg = from_dict(data, str(file))
    if overrides:
        pairs = (
            dict(overrides)
            if isinstance(overrides, Mapping)
            else dict(parse_override(o) for o in overrides)
        )
        cfg = apply_overrides(cfg, pairs, f"{file} (--set)")
    return cfg


def config_json(cfg: ExperimentConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)

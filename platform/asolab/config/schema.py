"""The experiment config's schema: one frozen dataclass per concern (``[data]``,
``[space]``, ``[search]``, ``[temperature]``, ``[mutation]``, ``[growth]``,
``[tracking]``, ``[speed]``) plus top-level ``seed`` and ``device``. Every field
carries its default, its constraint and its help text.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as section
from typing import Any

from .fields import Registered, field, flatten, to_dict

# The largest seed torch.manual_seed and numpy's generators both accept as one signed 64-bit value.
SEED_MAX = 2**63 - 1


FINAL_GENOTYPES = ("best", "last", "derived")
W_SAMPLINGS = ("gumbel", "fair")  # how W-training picks the path of each step
FINAL_WEIGHTS = ("inherit", "fresh")  # what the final network starts from
# how 4-dim image arrays are laid out (data/checks.py reads them): "auto" tells them apart by
# where the axis of 1 or 3 channels is, and refuses a shape that could be either
LAYOUTS = ("auto", "nchw", "nhwc")


DATASETS = Registered("asolab.data", "REGISTRY")
PRIMITIVES = Registered("asolab.space.ops", "PRIMITIVES")  # the built-in ops, the default
OPERATIONS = Registered("asolab.space.ops", "OPS")  # every op: built-in, plugins, code
PARAMETER_FREE = Registered("asolab.space.ops", "PARAMETER_FREE")
SCHEDULES = Registered("asolab.evolution.temperature", "SCHEDULES")
GROWTH_POLICIES = Registered("asolab.evolution.growth", "POLICIES")
WIDENING_POLICIES = Registered("asolab.evolution.growth", "WIDENING")
SELECTIONS = Registered("asolab.evolution.selection", "SELECTIONS")


@dataclass(frozen=True)
class DataConfig:
    """Which data set, how it is split, batched and augmented."""

    name: str = field(
        "digits",
        choices=DATASETS,
        help="the data set: a built-in one, folder, arrays, or a plugin's (docs/data.md)",
    )
    data_dir: str = field(
        "",
        help=(
            "folder holding the data set files ('' = its default place); for 'folder', the "
            "ImageFolder root with train/<class>/ (and test/<class>/) (docs/data.md)"
        ),
    )
    path: str = field("", help="the .npz file of data set 'arrays' (docs/data.md)")
    layout: str = field(
        "auto",
        choices=LAYOUTS,
        help=(
            "axis order of 4-dim image arrays: nchw (N, C, H, W), nhwc (N, H, W, C, numpy's and "
            "PIL's), or auto: nhwc when the last axis is 1 or 3 and the second is not, nchw the "
            "other way round, refused when the shape could be either"
        ),
    )
    image_size: int = field(
        0,
        ge=0,
        le=65536,
        help="resize images to image_size x image_size (0 = as loaded; 'folder': the most common)",
    )
    download: bool = field(False, help="let torchvision download mnist/cifar into data_dir")
    val_fraction: float = field(
        0.2,
        gt=0.0,
        le=0.5,
        help=(
            "share of the training data held out for alpha-training and selection; it must hold "
            "at least one example per class, else the run is refused with the least fraction "
            "that does"
        ),
    )
    test_fraction: float = field(
        0.2,
        help="share carved out as test split for data sets without one (digits)",
        gt=0.0,
        le=0.5,
    )
    split_seed: int = field(
        0,
        ge=0,
        le=SEED_MAX,
        help="seed of the test carve-out; fixed so that all runs share one test split",
    )
    stratify: bool = field(
        False,
        help=(
            "carve the test split (where the data set has none), the validation split and the "
            "search subset per class, each class in proportion, instead of at random: for "
            "imbalanced data, whose rare classes a random carve can leave out of a split "
            "(a run warns of each class a split lacks)"
        ),
    )
    train_subset: int = field(
        0,
        ge=0,
        help="use at most this many training examples for search (0 = all); fewer than the "
        "data set's classes is refused, fewer than batch_size warned of",
    )
    batch_size: int = field(64, ge=1, le=65536, help="training batch size")
    drop_last: bool = field(
        False,
        help=(
            "drop each training epoch's last, smaller batch (W-training, alpha-training, "
            "W-retraining, the final stage; evaluation sees every image): every step then "
            "trains on data.batch_size images, one shape for cuDNN's plans and CUDA graphs "
            "(the default digits run meets 254 convolution shapes, 116 with it); epochs are "
            "shuffled anew, so no image is left out for long; a split smaller than one batch "
            "keeps its one step"
        ),
    )
    eval_batch_size: int = field(
        512,
        ge=1,
        le=65536,
        help=(
            "evaluation batch size (validation, test); on CUDA a smaller batch is padded "
            "with zero images to the run's largest evaluation batch (this, or the larger "
            "split where both are smaller), which changes no output in eval mode: one "
            "batch shape, so one cuDNN plan per convolution for all evaluation"
        ),
    )
    augment: bool = field(
        True, help="the data set's own batched augmentation on the training split"
    )


@dataclass(frozen=True)
class SpaceConfig:
    """The DARTS-style search space: operations, cells and supernet size."""

    primitives: tuple[str, ...] = field(
        PRIMITIVES,
        choices=OPERATIONS,
        help=(
            "the op set: candidate operations on every edge (default: the eight built-in ones; "
            "plugins add more, docs/python-api.md#plugins)"
        ),
    )
    init_channels: int = field(
        16, ge=1, le=1024, help="supernet width: channels of the first cells"
    )
    layers: int = field(
        3, ge=1, le=64, help="number of cells; reduction cells sit at 1/3 and 2/3 depth"
    )
    steps: int = field(2, ge=1, le=8, help="intermediate nodes per cell")
    stem_multiplier: int = field(3, ge=1, le=8, help="stem width = stem_multiplier * init_channels")
    stem_stride: int = field(
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

    cycles: int = field(
        3, ge=1, le=1000, help="ASO-SE cycles (W-training, alpha-training, mutation, W-retraining)"
    )
    warmup_epochs: int = field(
        0,
        ge=0,
        le=1000,
        help="extra W-training epochs in the first cycle, before alphas are trained",
    )
    w_epochs: int = field(2, ge=0, le=1000, help="W-training epochs per cycle")
    w_sampling: str = field(
        "gumbel",
        choices=W_SAMPLINGS,
        help=(
            "W-training's path per step: gumbel = one op per edge drawn by hard Gumbel-softmax "
            "from the alphas (op o with probability softmax(alphas)_o, at any temperature); "
            "fair = every op of an edge drawn once "
            "in each round of as many steps as it has ops, whatever the alphas say "
            "(docs/concepts.md)"
        ),
    )
    alpha_epochs: int = field(1, ge=0, le=1000, help="alpha-training epochs per cycle")
    param_free_cap: int = field(
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
    retrain_epochs: int = field(
        2, ge=0, le=1000, help="W-retraining epochs of the derived network per cycle"
    )
    selection: str = field(
        "alpha",
        choices=SELECTIONS,
        help=(
            "how the mutation phase reads the genotype off the supernet: alpha = the "
            "largest alpha per edge (derive()); perturbation = per edge the op whose masking "
            "lowers the sampled supernet's validation accuracy most, recorded per cycle in "
            "selection/cycle_NNN.json (docs/baselines.md)"
        ),
    )
    selection_images: int = field(
        256,
        ge=1,
        help="perturbation selection: the first this many validation images it measures on",
        le=1_000_000,
    )
    selection_paths: int = field(
        2,
        ge=1,
        le=1000,
        help=(
            "perturbation selection: sampled supernet paths (drawn from the alphas with a "
            "generator seeded by the run's seed) each op's accuracy is averaged over"
        ),
    )
    final_epochs: int = field(
        0,
        ge=0,
        le=1000,
        help=(
            "extra W-retraining epochs of the final network after the last cycle (with "
            "budget_minutes: the most it may train)"
        ),
    )
    budget_minutes: float = field(
        0.0,
        ge=0.0,
        le=100000.0,
        help=(
            "wall-clock minutes for the whole run (0 = off): after its first epoch the final "
            "stage trains as many of final_epochs as fit in what is left (at least one), "
            "the learning-rate schedule still ending at weight_lr_min; the count is recorded"
        ),
    )
    weight_lr: float = field(
        0.05,
        gt=0.0,
        le=10.0,
        help="SGD on weights: initial learning rate (cosine-annealed over the weight epochs)",
    )
    weight_lr_min: float = field(
        0.001, ge=0.0, le=10.0, help="SGD on weights: the learning rate the annealing ends at"
    )
    weight_momentum: float = field(0.9, ge=0.0, le=0.999, help="SGD on weights: momentum")
    weight_decay: float = field(3e-4, ge=0.0, le=1.0, help="SGD on weights: weight decay")
    alpha_lr: float = field(
        3e-3,
        gt=0.0,
        le=10.0,
        help=(
            "Adam on alphas: learning rate; Adam moves each alpha by about this much a step, "
            "so few alpha steps at a small rate leave them near uniform (the default digits "
            "run: 15 steps, entropy 0.99996 of uniform); a run's summary says how far they "
            "moved (docs/baselines.md)"
        ),
    )
    alpha_weight_decay: float = field(1e-3, ge=0.0, le=1.0, help="Adam on alphas: weight decay")
    grad_clip: float = field(
        5.0, gt=0.0, inf=True, help="gradient-norm clip of every weight step (inf = no clipping)"
    )
    checkpoint_minutes: float = field(
        5.0,
        ge=0.0,
        le=1440.0,
        help=(
            "upload a phase's checkpoint, or write one after a final-stage epoch, once the last "
            "uploaded one is this old (0 = every one); cycles and the final stage always upload "
            "theirs, an interrupted run its latest"
        ),
    )
    calibration_batches: int = field(
        8,
        ge=0,
        le=10000,
        help=(
            "training batches that re-estimate BatchNorm statistics of a derived network (0 = off)"
        ),
    )
    final_genotype: str = field(
        "best",
        choices=FINAL_GENOTYPES,
        help=(
            "the network trained in the final epochs: best = the cycle genotype with the highest "
            "validation accuracy, last = the last cycle's mutated genotype, derived = derive() "
            "of the final alphas, unmutated"
        ),
    )
    final_weights: str = field(
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

    schedule: str = field(
        "exponential",
        help="how the temperature falls from initial to min (docs/concepts.md)",
        choices=SCHEDULES,
    )
    initial_temperature: float = field(
        5.0,
        gt=0.0,
        le=100.0,
        help=(
            "Gumbel-softmax temperature at the start of the run; it shapes alpha-training's "
            "straight-through gradient (low: the drawn op and its nearest rival, high: every "
            "op), not which ops are drawn (docs/concepts.md#temperature)"
        ),
    )
    min_temperature: float = field(
        0.5, gt=0.0, le=100.0, help="the temperature's floor (<= initial_temperature)"
    )
    anneal_fraction: float = field(
        0.8,
        gt=0.0,
        le=1.0,
        help="share of the run after which the temperature stays at min_temperature",
    )


@dataclass(frozen=True)
class MutationConfig:
    """Mutation phase: how many op edits, guided by the alphas."""

    strength: float = field(
        0.25, ge=0.0, le=1.0, help="s in k = max(1, round(s * E)) op edits over E genotype edges"
    )


@dataclass(frozen=True)
class GrowthConfig:
    """Function-preserving growth during the mutation phase."""

    policy: str = field(
        "none",
        choices=GROWTH_POLICIES,
        help=(
            "growth in the mutation phase: one kind always, cycle = rotate widen/deepen/branch, "
            "plateau = grow when val acc stalls (docs/growth.md)"
        ),
    )
    max_params: int = field(
        0, ge=0, help="never grow past this many supernet parameters (0 = no cap)"
    )
    plateau_patience: int = field(
        1, ge=1, le=100, help="cycles without validation gain before 'plateau' grows"
    )


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs are recorded (used by the MLflow observer)."""

    enabled: bool = field(
        True, help="record the run in MLflow (asolab run --no-track turns it off)"
    )
    tracking_uri: str = field(
        "", help="MLflow tracking URI ('' = MLFLOW_TRACKING_URI or the local mlruns/ store)"
    )
    experiment: str = field("", help="MLflow experiment name ('' = the experiment file's name)")
    log_models: bool = field(True, help="log the final derived network as an MLflow model")


@dataclass(frozen=True)
class SpeedConfig:
    """How the kernels run: switches that change speed, not the method (bench/ measures each)."""

    channels_last: bool = field(
        True,
        help=(
            "weights and activations in channels-last layout: on the CPU oneDNN's depthwise "
            "and pooling kernels run faster that way (training steps 1.1-1.6x, the default run "
            "1.24x: bench/final_speed.py, bench/search_throughput.py --cycle); on the CPU only "
            "when every cell has at least 8 channels (fewer crashed oneDNN on an AVX2 machine)"
        ),
    )
    autocast: str = field(
        "off",
        choices=Registered("asolab.runner.speed", "AUTOCAST"),
        help=(
            "mixed precision of the forward pass: off | bf16 | fp16 (fp16: CUDA only, with a "
            "gradient scaler); Gumbel sampling, the alpha softmax and the loss stay in fp32"
        ),
    )
    cudnn_benchmark: bool = field(
        True,
        help=(
            "let cuDNN time its convolution algorithms per shape (CUDA only): at the "
            "DARTS-like size (3x32x32) the first step after a growth step pays for it, "
            "under 3 steady steps on an H100, and steady steps run up to 1.4x faster; at "
            "8x8 steps are bound by the host and it only costs (the digits experiment "
            "turns it off: 30 s on an H100 against 45 s)"
        ),
    )
    cudnn_benchmark_scope: str = field(
        "full-batch",
        choices=Registered("asolab.runner.speed", "BENCHMARK_SCOPES"),
        help=(
            "which convolutions cuDNN times when speed.cudnn_benchmark is on: full-batch "
            "(those of data.batch_size images, wherever they first run; evaluation chunks, "
            "an epoch's last batch and probes take cuDNN's heuristics) | all (every shape); "
            "cuDNN keeps one plan per shape, so a short search meets most shapes once: the "
            "default digits run makes 254 plans, 92 of them for full batches"
        ),
    )
    compile: str = field(
        "off",
        choices=Registered("asolab.runner.speed", "COMPILE_MODES"),
        help=(
            "torch.compile the fixed network of W-retraining and the final stage: off | "
            "default | reduce-overhead (CUDA graphs on CUDA); each new genotype compiles "
            "anew, so it pays only for long fixed phases (bench/gpu_check.py measures it)"
        ),
    )
    cuda_graphs: bool = field(
        False,
        help=(
            "replay the forward and backward pass of W-retraining's and the final stage's "
            "network as CUDA graphs, one launch each (CUDA only; captured once per phase): "
            "4.6x W-retraining's step on an H100 at the DARTS-like size, 2.4x on digits; "
            "off by default: one capture failed on the H100 at the CIFAR-like shape and left "
            "that process's CUDA random numbers unusable; ignored where speed.compile is on"
        ),
    )
    sampled_graphs: bool = field(
        False,
        help=(
            "run W-training's sampled step with every edge's op chosen on the device (a "
            "torch.cond branch per candidate op), each edge compiled once per shape and, on "
            "CUDA, replayed as CUDA graphs whatever path is drawn; the same step as the eager "
            "one to rounding; built-in ops only (a run with others trains eagerly and says "
            "so); on CUDA it needs torch 2.12 or later (CUDA graph conditional nodes; "
            "earlier it trains eagerly and says so); off by default until measured on a "
            "GPU; off CUDA it runs without graphs, slower than the eager step"
        ),
    )
    deterministic: bool = field(
        False,
        help=(
            "deterministic kernels wherever torch has them (torch.use_deterministic_algorithms, "
            "cuDNN's deterministic algorithms and no timing, whatever speed.cudnn_benchmark "
            "says): a GPU run then repeats itself from its seed, at some cost in speed; an op "
            "with no deterministic kernel warns, naming itself, instead of failing; on the CPU "
            "a run repeats itself already, at a given thread count"
        ),
    )


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: everything a run needs, validated."""

    name: str = field("digits", help="experiment name (defaults to the file's stem)")
    seed: int = field(
        0,
        ge=0,
        le=SEED_MAX,
        help=(
            "seeds weights, sampling, mutation and the validation split; same seed and thread "
            "count, same run on the CPU"
        ),
    )
    device: str = field(
        "auto", help="auto (CUDA, then MPS, then the CPU) | cpu | cuda | cuda:N | mps"
    )
    threads: int = field(
        0,
        ge=0,
        le=1024,
        help="torch CPU threads (0 = auto: usable cores minus other asolab processes' threads)",
    )
    data: DataConfig = section(default_factory=DataConfig)
    space: SpaceConfig = section(default_factory=SpaceConfig)
    search: SearchConfig = section(default_factory=SearchConfig)
    temperature: TemperatureConfig = section(default_factory=TemperatureConfig)
    mutation: MutationConfig = section(default_factory=MutationConfig)
    growth: GrowthConfig = section(default_factory=GrowthConfig)
    tracking: TrackingConfig = section(default_factory=TrackingConfig)
    speed: SpeedConfig = section(default_factory=SpeedConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def flat(self) -> dict[str, Any]:
        """Flattened ``section.key -> value`` view (for MLflow params)."""
        return flatten(self.to_dict())

    def replace(self, **overrides: Any) -> ExperimentConfig:
        """Return a validated copy with ``section.key`` overrides applied."""
        from .validate import apply_overrides  # validate builds on this schema

        return apply_overrides(self, overrides, source="override")

"""Names of everything asolab records in MLflow: the one contract between the
writers (the run tracker, a study's parent and trial runs, a comparison run) and
the readers (compare, studies, tests, docs/tracking.md).

Every metric, tag, param and artifact path written anywhere is named here; a
test runs a run, a study and a comparison and checks that everything they
recorded is declared (:func:`declared`). Change a name here and every reader
follows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..runner.phases import EVALUATION, FINAL
from ..runner.phases import PHASE_INDEX as PHASE_INDEX

# ======================================================= runs (asolab run, a study's trials)

# A run id as tables and names print it: enough to tell runs apart, and accepted
# wherever a run is named (an id prefix).
RUN_ID_PREFIX = 8


def short_id(run_id: str) -> str:
    """The printed prefix of a run id."""
    return run_id[:RUN_ID_PREFIX]


# ---------------------------------------------------------------- tags
TAG_VERSION = "asolab.version"
TAG_GIT_COMMIT = "asolab.git_commit"
TAG_DATASET = "asolab.dataset"
# what was done to the images that the data did not say, one line each: a prefix + the
# note's key (data/core.py NOTE_*): asolab.data_note.layout (an array's layout told from
# its shape, or data.layout), asolab.data_note.resize (how many images, from and to which size),
# asolab.data_note.missing_<split> (the classes a split holds no image of),
# asolab.data_note.copies_<split> (its exact copies of training images)
TAG_DATA_NOTE = "asolab.data_note."
TAG_DEVICE = "asolab.device"
# the GPU a run ran on: asolab.device_info.gpu_name, .gpu_index, .gpu_memory_gib,
# .cuda_visible_devices (runner/device.py describe_device)
TAG_DEVICE_INFO = "asolab.device_info."
TAG_HOST = "asolab.host"
TAG_GENOTYPE = "asolab.genotype"  # canonical string of the latest genotype
TAG_FINAL_GENOTYPE = "asolab.final_genotype"
# the longest tag value the tracker writes (MLflow's limit); a longer one is cut to it
MAX_TAG_LENGTH = 8000
# last checkpointed position, e.g. "cycle 1 / after alpha" (position_text)
TAG_PHASE = "asolab.position"
TAG_ERROR = "asolab.error"  # one line: why a run failed
TAG_STUDY = "asolab.study"  # study name, on a study's parent and trial runs
TAG_TRIAL = "asolab.trial"  # trial number, on trial runs
TAG_TRIAL_STATE = "asolab.trial_state"  # COMPLETE | PRUNED | FAIL
TAG_RESUMED = "asolab.resumed"  # how many times the run was resumed (absent when never)
# models:/<id> of the final network (load with asolab.load_model or mlflow.pyfunc.load_model)
TAG_MODEL_URI = "asolab.model_uri"
TAG_RUN_KIND = "asolab.kind"  # what recorded the run: one of the KIND_* values
# one line, only where the cell pictures are Pillow's fallback (graphviz's dot missing)
TAG_CELLS_NOTE = "asolab.cells_note"
# torch threads the run uses and how they were chosen, e.g. "2 (auto)"; the count is
# also the param "threads" (the first process's; a resume may force another count)
TAG_THREADS = "asolab.threads"
# the run's first epoch that ran under a third of its phase's median images/s, the likely
# cause and what to set (runner/pace.py); absent when none did
TAG_SLOW_EPOCH = "asolab.slow_epoch"
# speed.deterministic: the ops that had no deterministic kernel, comma-separated
TAG_NONDETERMINISTIC = "asolab.nondeterministic_ops"
# where the latest resume started, e.g. "cycle 0 / before retrain"
TAG_RESUMED_FROM = "asolab.resumed_from"
# which process runs the run now, JSON {host, pid, started, beat}; beat is refreshed with
# every metric batch (tracking/lease.py)
TAG_LEASE = "asolab.lease"
# the hash of the run's config (runner/checkpoint.py config_hash): its checkpoints must match
TAG_CONFIG_HASH = "asolab.config_hash"
# the command that continues a stopped run (set when it stops; also in its description)
TAG_RESUME_COMMAND = "asolab.resume_command"
# JSON {"data set <name>" | "op <name>": origin} of every plugin or code-registered entry the
# run used (absent when it used built-ins only); origin names the package and its version
TAG_PLUGINS = "asolab.plugins"
KIND_RUN = "run"  # asolab runs and study trials
KIND_STUDY = "study"  # a study's parent run
KIND_COMPARISON = "comparison"  # a comparison run (compare never selects it)
# a multi-seed trial's own run (its knobs, its objective: the mean over seeds, its state);
# its seed runs, kind "run", are nested under it; compare never selects it
KIND_TRIAL = "trial"
# MLflow's own tags that asolab sets
MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"
MLFLOW_PARENT_RUN = "mlflow.parentRunId"  # a trial run's study parent run
MLFLOW_RUN_NAME = "mlflow.runName"
MLFLOW_DATA_CONTEXT = "mlflow.data.context"  # tag of the run's dataset input
DATASET_CONTEXT = "train"  # its value

# ---------------------------------------------------------------- params
# The whole resolved config, flattened: "seed", "data.name", "temperature.initial_temperature",
# "mutation.strength", ... (ExperimentConfig.flat()); no prefix.

# ---------------------------------------------------------------- metrics (step = global epoch)
TRAIN_LOSS, TRAIN_ACC, VAL_LOSS, VAL_ACC = "train_loss", "train_acc", "val_loss", "val_acc"
TEMPERATURE, WEIGHT_LR, ALPHA_LR = "temperature", "weight_lr", "alpha_lr"
EPOCH_SECONDS, IMAGES_PER_SEC = "epoch_seconds", "images_per_sec"
TORCH_THREADS = "torch_threads"  # the count the epoch used (fixed for the whole run)
CYCLE, PHASE_INDEX_METRIC = "cycle", "phase_index"
# on a GPU: percent of the epoch's training loop in which it ran kernels (runner/gpubusy.py)
GPU_BUSY_PCT = "gpu_busy_pct"
EPOCH_METRICS = (
    TRAIN_LOSS,
    TRAIN_ACC,
    VAL_LOSS,
    VAL_ACC,
    TEMPERATURE,
    WEIGHT_LR,
    ALPHA_LR,
    EPOCH_SECONDS,
    IMAGES_PER_SEC,
    TORCH_THREADS,
    CYCLE,
    PHASE_INDEX_METRIC,
)
# per cycle (step = global epoch at the cycle's end); the memory ones are runner/memory.py's keys
CYCLE_VAL_ACC, CYCLE_VAL_LOSS = "cycle_val_acc", "cycle_val_loss"
SUPERNET_PARAMS, DERIVED_PARAMS = "supernet_params", "derived_params"
MUTATION_EDITS = "mutation_edits"
# the alphas' mean per-edge softmax entropy over log(ops): 1 = not moved from uniform
ALPHA_ENTROPY = "alpha_entropy"
RSS_MB, PEAK_RSS_MB = "rss_mb", "peak_rss_mb"
CUDA_ALLOCATED_MB, CUDA_PEAK_MB = "cuda_allocated_mb", "cuda_peak_mb"
CUDA_PEAK_RESERVED_MB = "cuda_peak_reserved_mb"
MEMORY_METRICS = (RSS_MB, PEAK_RSS_MB, CUDA_ALLOCATED_MB, CUDA_PEAK_MB, CUDA_PEAK_RESERVED_MB)
CYCLE_METRICS = (
    CYCLE_VAL_ACC,
    CYCLE_VAL_LOSS,
    SUPERNET_PARAMS,
    DERIVED_PARAMS,
    *MEMORY_METRICS,
    MUTATION_EDITS,
    ALPHA_ENTROPY,
)
# per cycle with growth (step = global epoch at the cycle's end)
GROWTH_EVENTS, GROWTH_PRESERVATION_ERROR, GROWTH_PARAMS_AFTER = (
    "growth_events",
    "growth_preservation_error",
    "growth_params_after",
)
GROWTH_METRICS = (GROWTH_EVENTS, GROWTH_PRESERVATION_ERROR, GROWTH_PARAMS_AFTER)
# once, at the end (step = total epochs); memory as FINAL_PREFIX + a MEMORY_METRICS name
FINAL_PREFIX = "final_"
FINAL_VAL_ACC, FINAL_VAL_LOSS = "final_val_acc", "final_val_loss"
TEST_ACC, TEST_LOSS = "test_acc", "test_loss"
FINAL_PARAMS, FINAL_SUPERNET_PARAMS = "final_params", "final_supernet_params"
RUN_SECONDS = "run_seconds"
RUN_GPU_BUSY_PCT = "run_gpu_busy_pct"  # on a GPU: every epoch's, weighted by its seconds
FINAL_METRICS = (
    FINAL_VAL_ACC,
    FINAL_VAL_LOSS,
    TEST_ACC,
    TEST_LOSS,
    FINAL_PARAMS,
    FINAL_SUPERNET_PARAMS,
    RUN_SECONDS,
    RUN_GPU_BUSY_PCT,
    *(FINAL_PREFIX + m for m in MEMORY_METRICS),
)
RUN_METRICS = EPOCH_METRICS + (GPU_BUSY_PCT,) + CYCLE_METRICS + GROWTH_METRICS + FINAL_METRICS

# phase -> the value of the "phase_index" epoch metric: the runner's cycle phases in
# order, then the final stage (PHASE_INDEX, from the runner's phase table)

# ---------------------------------------------------------------- artifacts
CONFIG_ARTIFACT = "config.json"
RUN_INFO_ARTIFACT = "run_info.json"  # the data split sizes, the architecture spec, total epochs
GENOTYPE_DIR = "genotypes"  # genotypes/cycle_000.json ... and genotypes/final.json
FINAL_GENOTYPE_ARTIFACT = f"{GENOTYPE_DIR}/final.json"
CELLS_DIR = "cells"  # cells/cycle_000.png: normal and reduction cell side by side
MUTATIONS_DIR = "mutations"  # mutations/cycle_000.json: before, after, edits
GROWTH_DIR = "growth"  # growth/cycle_000.json: list of growth events
SELECTION_DIR = "selection"  # selection/cycle_000.json: perturbation selection's drops
CHECKPOINT_DIR = "checkpoints"  # checkpoints/checkpoint.pt: the latest
CHECKPOINT_ARTIFACT = f"{CHECKPOINT_DIR}/checkpoint.pt"
MODEL_DIR = "model"  # the final derived network: an MLflow pyfunc model (tracking/predictor.py)
MODEL_NAME = MODEL_DIR  # mlflow.pyfunc.load_model(f"runs:/{run_id}/{MODEL_NAME}")
# inside the model: the network's files, which hold no code (asolab.load_model reads only these)
MODEL_NETWORK_DIR = "data/network"  # (pyfunc keeps a model's data_path under data/)
MODEL_NETWORK_FILE = "network.json"  # spec, genotype, preprocessing, the weights file's name
MODEL_WEIGHTS_SAFETENSORS = "weights.safetensors"  # where the safetensors package is installed
MODEL_WEIGHTS_TORCH = "weights.pt"  # else: tensors only, read with torch.load(weights_only=True)
MODEL_LOADER = "asolab.tracking.predictor"  # the pyfunc loader_module: installed asolab code


def genotype_artifact(cycle: int) -> str:
    return f"{GENOTYPE_DIR}/cycle_{cycle:03d}.json"


def cells_artifact(cycle: int) -> str:
    return f"{CELLS_DIR}/cycle_{cycle:03d}.png"


def mutation_artifact(cycle: int) -> str:
    return f"{MUTATIONS_DIR}/cycle_{cycle:03d}.json"


def selection_artifact(cycle: int) -> str:
    """search.selection = "perturbation": per edge, the validation accuracy drop of
    masking each op, and the op chosen (evolution/selection.py)."""
    return f"{SELECTION_DIR}/cycle_{cycle:03d}.json"


def growth_artifact(cycle: int) -> str:
    return f"{GROWTH_DIR}/cycle_{cycle:03d}.json"


def position_text(cycle: int, phase: str, stage_epoch: int = 0) -> str:
    """The ``asolab.position`` tag after ``phase`` of ``cycle`` ("final": the final
    stage; with ``stage_epoch``, a checkpoint inside it after that many epochs)."""
    if phase == FINAL:
        return f"final stage / after epoch {stage_epoch}" if stage_epoch else "after final stage"
    return f"cycle {cycle} / after {phase}"


def resumed_text(position: dict | None) -> str:
    """The ``asolab.resumed_from`` tag for a runner's ``resumed_from`` position
    (None: the run had no checkpoint yet and started again from its first epoch)."""
    if position is None:
        return "start (stopped before its first checkpoint) (epoch 0)"
    nxt = position.get("next", "?")
    if nxt == FINAL and position.get("stage_epoch"):
        return (
            f"final stage / before epoch {position['stage_epoch'] + 1} (epoch "
            f"{position.get('global_epoch')})"
        )
    if nxt in (FINAL, EVALUATION):
        return (
            f"before {'final stage' if nxt == FINAL else 'final evaluation'} (epoch "
            f"{position.get('global_epoch')})"
        )
    return f"cycle {position.get('cycle')} / before {nxt} (epoch {position.get('global_epoch')})"


# ---------------------------------------------------------------- browsing (MLflow UI)
TAG_NOTE = "mlflow.note.content"  # MLflow's run / experiment description (Markdown)
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"  # tells the UI these are model-training experiments
EXPERIMENT_KIND = "custom_model_development"
WORKFLOW_PARAM = "workflowType=machine_learning"  # the UI's URL parameter for the training view
# An experiment tag holding the runs table's columns and sort; the UI loads it from the URL
# parameter viewStateShareKey (its "share view" feature).
VIEW_KEY = "asolab"
TAG_VIEW_STATE = f"mlflow.sharedViewState.{VIEW_KEY}"
TAG_BEST = "asolab.best"  # "true" on a study's best trial run (filter: tags.`asolab.best` = 'true')
FINAL_CELLS_ARTIFACT = f"{CELLS_DIR}/final.png"  # the final genotype's cells
# ... as a strip 40 px tall, the cells side by side: the run description's first lines
FINAL_CELLS_THUMB_ARTIFACT = f"{CELLS_DIR}/final_thumb.png"
# genotypes/*.json hold {"canonical": <str(genotype)>, "genotype": <Genotype.to_dict()>}
GENOTYPE_CANONICAL_KEY = "canonical"
GENOTYPE_OPS_KEY = "primitives"  # ... and the op set searched (space.primitives)
# the runs table's columns: what a researcher reads first
VIEW_METRICS = (
    "test_acc",
    "final_val_acc",
    "final_params",
    FINAL_PREFIX + PEAK_RSS_MB,
    "run_seconds",
)
VIEW_PARAMS = (
    "temperature.initial_temperature",
    "temperature.min_temperature",
    "temperature.anneal_fraction",
    "mutation.strength",
    "search.cycles",
    "search.final_epochs",
)
VIEW_TAGS = (TAG_DATASET, TAG_BEST, TAG_TRIAL_STATE, TAG_FINAL_GENOTYPE)
# The final stage's epoch count that search.budget_minutes fitted (a param, logged when
# fitted; search.final_epochs then holds the most it could have been).
PARAM_FINAL_EPOCHS_FITTED = "fitted.final_epochs"


def final_epochs_trained(params: Mapping[str, str]) -> int | None:
    """The final epochs a run with these MLflow params trains: the count a budget
    fitted, else ``search.final_epochs`` (None if it has neither, or not a number)."""
    raw = params.get(PARAM_FINAL_EPOCHS_FITTED) or params.get("search.final_epochs")
    try:
        return int(float(raw)) if raw else None
    except ValueError:
        return None


# ---------------------------------------------------------------- control arms (asolab baseline)
# Every run of a baseline set is tagged with its arm ("aso-se" for the search itself; the
# control arms are asolab.baseline.ARMS), the ASO-SE run of the same seed it controls for,
# and the ASO-SE run the set was asked for (the source run tags itself).
TAG_ARM = "asolab.arm"
TAG_CONTROLS = "asolab.controls"
TAG_BASELINE_OF = "asolab.baseline_of"
ARM_ASO_SE = "aso-se"

# ---------------------------------------------------------------- ranking diagnostic (asolab rank)
# Metrics of the run whose supernet is ranked (step 0): Kendall's tau (and its two-sided
# p-value) and Spearman's rho between one-shot (supernet) and stand-alone validation
# accuracy, over the genotypes sampled from the final alphas, over the random ones, and
# over both together; with two or more stand-alone seeds (--standalone-seeds), the
# stand-alone proxy's reliability: tau (and p) between its first two seeds, all genotypes;
# and whether the alphas' genotypes train better alone than random ones (their lead).
RANKING_KENDALL_TAU = "ranking_kendall_tau"  # + a group's suffix
RANKING_KENDALL_P = "ranking_kendall_p"  # + a group's suffix
RANKING_SPEARMAN_RHO = "ranking_spearman_rho"  # + a group's suffix
# the genotype groups: (metric-name suffix, label)
RANKING_GROUPS = (("", "alphas"), ("_random", "random"), ("_all", "all"))
RANKING_PROXY_TAU = "ranking_proxy_kendall_tau"
RANKING_PROXY_P = "ranking_proxy_kendall_p"
RANKING_GENOTYPES = "ranking_genotypes"
RANKING_STANDALONE_EPOCHS = "ranking_standalone_epochs"  # epochs per training (--epochs)
RANKING_STANDALONE_SEEDS = "ranking_standalone_seeds"  # trainings per genotype
RANKING_STANDALONE_MEAN = "ranking_standalone_mean"  # mean stand-alone val acc, from the alphas
RANKING_STANDALONE_MEAN_RANDOM = RANKING_STANDALONE_MEAN + "_random"  # ... of the random ones
RANKING_ALPHAS_LEAD = "ranking_alphas_lead"  # the first minus the second ...
RANKING_ALPHAS_LEAD_LOW = RANKING_ALPHAS_LEAD + "_low"  # ... and its 95% interval (Welch's t)
RANKING_ALPHAS_LEAD_HIGH = RANKING_ALPHAS_LEAD + "_high"
RANKING_ALPHA_ENTROPY = "ranking_alpha_entropy"  # the ranked supernet's (1: alphas never moved)
# Parameter count (and multiply-adds) as a ranking baseline: their Kendall tau (and p) and
# Spearman rho against the stand-alone accuracy over all genotypes, and the supernet's tau
# over all genotypes minus the parameter count's (> 0: the supernet ranks better).
RANKING_PARAMS_KENDALL_TAU = "ranking_params_kendall_tau"
RANKING_PARAMS_KENDALL_P = "ranking_params_kendall_p"
RANKING_PARAMS_SPEARMAN_RHO = "ranking_params_spearman_rho"
RANKING_FLOPS_KENDALL_TAU = "ranking_flops_kendall_tau"
RANKING_FLOPS_SPEARMAN_RHO = "ranking_flops_spearman_rho"
RANKING_TAU_MINUS_PARAMS = "ranking_tau_minus_params"
RANKING_SIZE_METRICS = (
    RANKING_PARAMS_KENDALL_TAU,
    RANKING_PARAMS_KENDALL_P,
    RANKING_PARAMS_SPEARMAN_RHO,
    RANKING_FLOPS_KENDALL_TAU,
    RANKING_FLOPS_SPEARMAN_RHO,
    RANKING_TAU_MINUS_PARAMS,
)
RANKING_METRICS = (
    *(
        name + suffix
        for suffix, _ in RANKING_GROUPS
        for name in (RANKING_KENDALL_TAU, RANKING_KENDALL_P, RANKING_SPEARMAN_RHO)
    ),
    RANKING_PROXY_TAU,
    RANKING_PROXY_P,
    RANKING_GENOTYPES,
    RANKING_STANDALONE_EPOCHS,
    RANKING_STANDALONE_SEEDS,
    RANKING_STANDALONE_MEAN,
    RANKING_STANDALONE_MEAN_RANDOM,
    RANKING_ALPHAS_LEAD,
    RANKING_ALPHAS_LEAD_LOW,
    RANKING_ALPHAS_LEAD_HIGH,
    RANKING_ALPHA_ENTROPY,
    *RANKING_SIZE_METRICS,
)
RANKING_DIR = "ranking"
RANKING_PAIRS_ARTIFACT = (
    f"{RANKING_DIR}/pairs.json"  # one record per genotype: source, genotype, both accuracies
)
RANKING_PLOT_ARTIFACT = f"{RANKING_DIR}/scatter.png"
# validation (and, marked, test) accuracy against parameters, the Pareto front drawn
RANKING_PARETO_ARTIFACT = f"{RANKING_DIR}/pareto.png"

# ================================================================ a study's parent and trial runs

TAG_STUDY_PARENT = "asolab.study_parent"  # "true" on a study's parent run
TAG_STORAGE = "asolab.study_storage"  # the Optuna storage URL (password masked)
TAG_STUDY_DIRECTIONS = "asolab.study_directions"  # e.g. "maximize" or "maximize,minimize"
TAG_STUDY_OBJECTIVE = "asolab.study_objective"  # e.g. "val_acc" or "val_acc,params"
TAG_BEST_TRIAL = "asolab.best_trial"  # number of the best trial (one objective)
TAG_PARETO_TRIALS = "asolab.pareto_trials"  # numbers of the Pareto-front trials (two objectives)
# parent params: the study's settings, and the search space as "space.<parameter>"
STUDY_PARAMS = (
    "study.name",
    "study.experiment",
    "study.objective",
    "study.sampler",
    "study.pruner",
    "study.seed",
)
SPACE_PREFIX = "space."
# parent metrics (step = finished trials): trials.<state>, the best trial's value and
# parameters (also as tags) under BEST_PREFIX, the Pareto front's size
TRIALS_PREFIX = "trials."
TRIAL_STATES_COUNTED = ("complete", "pruned", "fail")
BEST_PREFIX = "best."
BEST_VALUE = BEST_PREFIX + "value"
PARETO_SIZE = "pareto.size"
PLOTS_DIR = "plots"  # plots/<name>.png|html; the study file itself sits at the artifact root
# trial runs: their sampled parameters as "trial.<parameter>", their values as "objective.<metric>"
TRIAL_PARAM_PREFIX = "trial."
OBJECTIVE_PREFIX = "objective."

# ======================================================= a comparison run (asolab compare --log)

COMPARISON_PARAMS = ("selection", "run_ids")
COMPARISON_METRICS = ("runs", "skipped", "distinct_genotypes", "best_val_acc")
REPORT_DIR = "report"  # the written report: index.html, runs.csv, pictures

# ================================================================ what counts as declared

# every TAG_* and MLFLOW_* name above
TAGS = tuple(v for k, v in list(globals().items()) if k.startswith(("TAG_", "MLFLOW_")))
_ARTIFACTS = (
    re.escape(CONFIG_ARTIFACT),
    re.escape(RUN_INFO_ARTIFACT),
    re.escape(FINAL_GENOTYPE_ARTIFACT),
    rf"{GENOTYPE_DIR}/cycle_\d{{3}}\.json",
    rf"{CELLS_DIR}/cycle_\d{{3}}\.png",
    rf"{MUTATIONS_DIR}/cycle_\d{{3}}\.json",
    rf"{GROWTH_DIR}/cycle_\d{{3}}\.json",
    rf"{SELECTION_DIR}/cycle_\d{{3}}\.json",
    re.escape(CHECKPOINT_ARTIFACT),
    re.escape(FINAL_CELLS_ARTIFACT),
    re.escape(FINAL_CELLS_THUMB_ARTIFACT),
    rf"{MODEL_DIR}/.+",
    rf"{PLOTS_DIR}/[^/]+",
    r"[^/]+\.toml",
    rf"{REPORT_DIR}/.+",
    rf"{RANKING_DIR}/[^/]+",
)


def declared(kind: str, name: str, config_keys: tuple[str, ...] = ()) -> bool:
    """Whether ``name`` is a declared ``kind`` ("metric", "tag", "param", "artifact").

    ``config_keys`` are the flattened experiment keys (a run's params); passed in,
    so that this module stays free of imports.
    """
    if kind == "metric":
        fixed = RUN_METRICS + COMPARISON_METRICS + RANKING_METRICS + (BEST_VALUE, PARETO_SIZE)
        prefixes = (TRIALS_PREFIX, BEST_PREFIX, OBJECTIVE_PREFIX)
        return name in fixed or name.startswith(prefixes)
    if kind == "tag":
        return name in TAGS or name.startswith((BEST_PREFIX, TAG_DATA_NOTE, TAG_DEVICE_INFO))
    if kind == "param":
        fixed = STUDY_PARAMS + COMPARISON_PARAMS + tuple(config_keys)
        return name in fixed or name.startswith((SPACE_PREFIX, TRIAL_PARAM_PREFIX))
    if kind == "artifact":
        return any(re.fullmatch(p, name) for p in _ARTIFACTS)
    raise ValueError(f"unknown kind {kind!r}")

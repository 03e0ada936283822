"""Names of everything asolab records in MLflow: the one contract between the
tracker that writes runs and the readers (compare, studies, tests, docs/tracking.md).

Change a name here and every reader follows.
"""

from __future__ import annotations

# ---------------------------------------------------------------- tags
TAG_VERSION = "asolab.version"
TAG_GIT_COMMIT = "asolab.git_commit"
TAG_DATASET = "asolab.dataset"
TAG_DEVICE = "asolab.device"
TAG_HOST = "asolab.host"
TAG_GENOTYPE = "asolab.genotype"  # canonical string of the latest genotype
TAG_FINAL_GENOTYPE = "asolab.final_genotype"
TAG_PHASE = "asolab.position"  # last checkpointed position, e.g. "cycle 1 / after alpha" (position_text)
TAG_ERROR = "asolab.error"  # one line: why a run failed
TAG_STUDY = "asolab.study"  # study name, on a study's parent and trial runs
TAG_TRIAL = "asolab.trial"  # trial number, on trial runs
TAG_TRIAL_STATE = "asolab.trial_state"  # COMPLETE | PRUNED | FAIL

# ---------------------------------------------------------------- params
# The whole resolved config, flattened: "seed", "data.name", "temperature.initial_temperature",
# "mutation.strength", ... (ExperimentConfig.flat()).

# ---------------------------------------------------------------- metrics (step = global epoch)
EPOCH_METRICS = (
    "train_loss", "train_acc", "val_loss", "val_acc", "temperature",
    "weight_lr", "alpha_lr", "epoch_seconds", "images_per_sec", "cycle", "phase_index",
)
# per cycle (step = global epoch at the cycle's end)
CYCLE_METRICS = (
    "cycle_val_acc", "cycle_val_loss", "supernet_params", "derived_params",
    "rss_mb", "peak_rss_mb", "cuda_allocated_mb", "cuda_peak_mb", "mutation_edits",
)
# once, at the end (step = total epochs)
FINAL_METRICS = (
    "final_val_acc", "final_val_loss", "test_acc", "test_loss", "final_params", "final_supernet_params",
    "run_seconds", "final_rss_mb", "final_peak_rss_mb", "final_cuda_allocated_mb", "final_cuda_peak_mb",
)

# ---------------------------------------------------------------- artifacts
CONFIG_ARTIFACT = "config.json"
GENOTYPE_DIR = "genotypes"  # genotypes/cycle_000.json ... and genotypes/final.json


def genotype_artifact(cycle: int) -> str:
    return f"{GENOTYPE_DIR}/cycle_{cycle:03d}.json"


FINAL_GENOTYPE_ARTIFACT = f"{GENOTYPE_DIR}/final.json"
CELLS_DIR = "cells"  # cells/cycle_000.png: normal and reduction cell side by side
MUTATIONS_DIR = "mutations"  # mutations/cycle_000.json: before, after, edits
GROWTH_DIR = "growth"  # growth/cycle_000.json: list of growth events
CHECKPOINT_DIR = "checkpoints"  # checkpoints/checkpoint.pt: the latest
MODEL_DIR = "model"  # the final derived network, mlflow.pytorch format

# ---------------------------------------------------------------- added with the MLflow tracker
TAG_RESUMED = "asolab.resumed"  # how many times the run was resumed (absent when never)
TAG_MODEL_URI = "asolab.model_uri"  # models:/<id> of the final network (load with mlflow.pytorch.load_model)
TAG_RUN_KIND = "asolab.kind"  # "run" for asolab runs
TAG_RESUMED_FROM = "asolab.resumed_from"  # where the latest resume started, e.g. "cycle 0 / before retrain"

# phase -> the value of the "phase_index" epoch metric
PHASE_INDEX = {"w_train": 0, "alpha": 1, "mutate": 2, "retrain": 3, "final": 4}
# per cycle with growth (step = global epoch at the cycle's end)
GROWTH_METRICS = ("growth_events", "growth_preservation_error", "growth_params_after")

CHECKPOINT_ARTIFACT = f"{CHECKPOINT_DIR}/checkpoint.pt"
MODEL_NAME = MODEL_DIR  # mlflow.pytorch.load_model(f"runs:/{run_id}/{MODEL_NAME}")
DATASET_CONTEXT = "train"  # mlflow.data.context tag of the run's dataset input


def cells_artifact(cycle: int) -> str:
    return f"{CELLS_DIR}/cycle_{cycle:03d}.png"


def mutation_artifact(cycle: int) -> str:
    return f"{MUTATIONS_DIR}/cycle_{cycle:03d}.json"


def growth_artifact(cycle: int) -> str:
    return f"{GROWTH_DIR}/cycle_{cycle:03d}.json"


def position_text(cycle: int, phase: str, stage_epoch: int = 0) -> str:
    """The ``asolab.position`` tag after ``phase`` of ``cycle`` ("final": the final
    stage; with ``stage_epoch``, a checkpoint inside it after that many epochs)."""
    if phase == "final":
        return f"final stage / after epoch {stage_epoch}" if stage_epoch else "after final stage"
    return f"cycle {cycle} / after {phase}"


def resumed_text(position: dict) -> str:
    """The ``asolab.resumed_from`` tag for a runner's ``resumed_from`` position."""
    nxt = position.get("next", "?")
    if nxt == "final" and position.get("stage_epoch"):
        return f"final stage / before epoch {position['stage_epoch'] + 1} (epoch {position.get('global_epoch')})"
    if nxt in ("final", "evaluation"):
        return f"before {'final stage' if nxt == 'final' else 'final evaluation'} (epoch {position.get('global_epoch')})"
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
# genotypes/*.json hold {"canonical": <str(genotype)>, "genotype": <Genotype.to_dict()>}
GENOTYPE_CANONICAL_KEY = "canonical"
# the runs table's columns: what a researcher reads first
VIEW_METRICS = ("test_acc", "final_val_acc", "final_params", "run_seconds")
VIEW_PARAMS = (
    "temperature.initial_temperature", "temperature.min_temperature", "temperature.anneal_fraction",
    "mutation.strength", "search.cycles", "search.final_epochs",
)
VIEW_TAGS = (TAG_TRIAL_STATE, TAG_FINAL_GENOTYPE)

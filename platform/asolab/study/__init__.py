"""Optuna studies whose trials are asolab runs: study config -> study, objective,
pruning, storage, workers, and the study's parent run in MLflow.

Import cost matters for the CLI, so the heavy modules load on first use.
"""

from __future__ import annotations

from typing import Any

from .config import StudyConfig, load_study

__all__ = ["StudyConfig", "StudyOutcome", "WorkersFailed", "load_study", "run_study"]


def __getattr__(name: str) -> Any:
    if name in ("run_study", "StudyOutcome", "WorkersFailed"):
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

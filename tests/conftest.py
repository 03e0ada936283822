"""Shared fixtures: tiny, real configs on the digits set."""

from __future__ import annotations

import os

import pytest

from asolab import threads

# As the CLI does: before torch loads OpenMP, let its waiting threads sleep, not spin.
threads.prepare_environment()

from asolab import config
from asolab.data import load_data

# One torch thread per test process (tiny tensors gain nothing from more), registered
# like every asolab process so that runs started beside the suite leave it its core.
threads.acquire(1)
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

TINY = {
    "threads": 1,
    "tracking.enabled": False,
    "space.init_channels": 4,
    "search.cycles": 2,
    "search.w_epochs": 1,
    "search.alpha_epochs": 1,
    "search.retrain_epochs": 1,
    "search.final_epochs": 0,
    "data.train_subset": 300,
}


@pytest.fixture
def tiny_cfg() -> config.ExperimentConfig:
    return config.load(None, TINY)


@pytest.fixture(scope="session")
def digits():
    return load_data(config.DataConfig(), seed=0)

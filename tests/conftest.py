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

# The smallest whole run: one cycle of one epoch per phase, one node per cell, no model
# logged (tests of data sets, plugins and the Python API; tracking stays as each test sets).
ONE_CYCLE = {
    "threads": 1,
    "space.init_channels": 4,
    "space.steps": 1,
    "search.cycles": 1,
    "search.w_epochs": 1,
    "search.alpha_epochs": 1,
    "search.retrain_epochs": 1,
    "search.final_epochs": 0,
    "search.calibration_batches": 0,
    "data.batch_size": 16,
    "tracking.log_models": False,
}

PROJECT_MLRUNS = config.PROJECT_ROOT / "mlruns"


def _entries(folder):
    return set(os.listdir(folder)) if folder.is_dir() else set()


@pytest.fixture(autouse=True)
def project_store_untouched():
    """Tests write only to temporary folders: a test that leaves anything new in the
    project's own mlruns/ (MLflow's default artifact folder, relative to the working
    directory, for an experiment created without an artifact location) fails."""
    before = _entries(PROJECT_MLRUNS)
    yield
    new = sorted(_entries(PROJECT_MLRUNS) - before)
    assert not new, f"the test wrote {new} into {PROJECT_MLRUNS}; write to a tmp_path store instead"


def cell_layouts(net, forward):
    """``forward()``'s result and, per cell of ``net``, whether its output was channels-last."""
    import torch  # here: this module must set OpenMP's wait policy before torch loads

    seen: list[bool] = []
    hooks = [
        cell.register_forward_hook(
            lambda _m, _i, out: seen.append(
                out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
            )
        )
        for cell in net.cells
    ]
    try:
        return forward(), seen
    finally:
        for h in hooks:
            h.remove()


@pytest.fixture
def tiny_cfg() -> config.ExperimentConfig:
    return config.load(None, TINY)


@pytest.fixture(scope="session")
def digits():
    return load_data(config.DataConfig(), seed=0)

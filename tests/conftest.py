"""Shared fixtures: tiny, real configs on the digits set."""

from __future__ import annotations

import compileall
import os
import shutil
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from asolab import threads

# The suite starts dozens of fresh Pythons that import asolab. Where PYTHONDONTWRITEBYTECODE
# is set, none of them writes the bytecode it compiled, so each compiled the package's ~100
# modules again (about 0.5 CPU-s a child): compile them once here (atomic writes, so the
# xdist workers may both do it).
if sys.dont_write_bytecode:
    compileall.compile_dir(Path(threads.__file__).parent, quiet=1)

# As the CLI does: before torch loads OpenMP, let its waiting threads sleep, not spin. The
# xdist workers always share the cores, but each imports this file before the other has
# registered (one_torch_thread), so the registry cannot tell them: a test that runs two
# threads then spun beside the other worker (tests/test_threads.py's auto runs took 64 s
# in one suite run, 3-6 s in another).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault(*threads.WAIT_POLICY)
threads.prepare_environment()

from asolab import config

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
    "data.train_subset": 128,
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


def pytest_collection_modifyitems(items):
    """The slow end-to-end tests first (in their order): with ``--dist loadgroup`` xdist
    hands tests out in this order, after the xdist groups, so a long one never starts
    last while the other core has nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _shared_tmp(tmp_path_factory) -> Path:
    """A folder every xdist worker of this session sees (the session's own with -n 0)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch thread per test process (tiny tensors gain nothing from more), registered
    like every asolab process so that runs started beside the suite leave it its core.
    A fixture, not done at import: xdist's controller, which runs no test, loads this file
    too, and importing torch there (2 s) would delay the workers' start."""
    threads.acquire(1)


@pytest.fixture(scope="session", autouse=True)
def migrated_store_template(tmp_path_factory):
    """A fresh SQLite MLflow store starts as a copy of one made by MLflow's own migrations.

    MLflow builds a new store's tables by running every migration since its first release:
    about 4 s of CPU, paid by some 70 tests. The template is made once per session (one
    worker builds it, the other waits on the lock) by the same function, on an empty
    database; each new store then gets its pages by SQLite's backup, in milliseconds. The
    default experiment is not in the template: MLflow still creates it in each store, with
    that store's artifact root. A store with any table, or a copy that fails (a read-only
    folder, a full disk), goes the ordinary way, so it fails as it would without this."""
    import mlflow
    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store
    import sqlalchemy

    migrate = db_utils._initialize_tables
    template = _shared_tmp(tmp_path_factory) / f"mlflow-{mlflow.__version__}-template.db"
    with FileLock(f"{template}.lock"):
        if not template.exists():
            building = template.with_suffix(".building")
            building.unlink(missing_ok=True)
            engine = sqlalchemy.create_engine(f"sqlite:///{building}")
            migrate(engine)
            engine.dispose()
            building.rename(template)

    def initialize(engine):
        if engine.dialect.name != "sqlite" or sqlalchemy.inspect(engine).get_table_names():
            return migrate(engine)
        raw = engine.raw_connection()
        try:
            with sqlite3.connect(template) as source:
                source.backup(raw.driver_connection)
        except sqlite3.Error:
            # another opener of the same new store may have copied it first
            if not sqlalchemy.inspect(engine).get_table_names():
                return migrate(engine)
        finally:
            raw.close()

    db_utils._initialize_tables = initialize
    registry_store._initialize_tables = initialize
    yield
    db_utils._initialize_tables = migrate
    registry_store._initialize_tables = migrate


@pytest.fixture(autouse=True)
def project_store_untouched():
    """Tests write only to temporary folders: a test that leaves anything new in the
    project's own mlruns/ (MLflow's default artifact folder, relative to the working
    directory, for an experiment created without an artifact location) fails."""
    before = _entries(PROJECT_MLRUNS)
    yield
    new = sorted(_entries(PROJECT_MLRUNS) - before)
    assert not new, f"the test wrote {new} into {PROJECT_MLRUNS}; write to a tmp_path store instead"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """The forked children's server ends with the session and is reaped here, before xdist
    stops the worker: its CPU and its children's then count in this process's."""
    if "processes" in sys.modules:
        sys.modules["processes"].shutdown()


@pytest.fixture(autouse=True)
def forked_children_ended():
    """A child started through tests/processes.py does not outlive its test."""
    yield
    if "processes" in sys.modules:
        sys.modules["processes"].kill_leftovers()


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
    # imported here, not above: xdist's controller loads this file too, and the data
    # loaders' torch and scikit-learn (2.3 s) would delay the workers' start
    from asolab.data import load_data

    return load_data(config.DataConfig(), seed=0)


@dataclass(frozen=True)
class TrainedRun:
    """One finished run: its config, result and events, and the checkpoint its runner
    wrote at the end of each phase, by (cycle, phase). Tests read it, never change it."""

    cfg: config.ExperimentConfig
    result: Any
    recorder: Any
    checkpoints: dict[tuple[int, str], Path]

    def checkpoint(self, cycle: int, phase: str, folder: Path) -> Path:
        """A copy of the checkpoint written at the end of ``phase`` of ``cycle``, as
        ``folder/checkpoint.pt``: the file a run killed right after it leaves behind."""
        folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(self.checkpoints[cycle, phase], folder / "checkpoint.pt"))


def _trained(folder: Path, overrides: dict) -> TrainedRun:
    """One run of ``overrides`` in ``folder``, keeping a copy of each checkpoint it wrote."""
    from asolab.runner import Runner
    from asolab.runner.events import Recorder

    kept: dict[tuple[int, str], Path] = {}

    class KeepCheckpoints(Recorder):
        def on_checkpoint(self, event):
            super().on_checkpoint(event)
            kept[event.cycle, event.phase] = Path(
                shutil.copy(folder / "checkpoint.pt", folder / f"{event.cycle}-{event.phase}.pt")
            )

    cfg = config.load(None, overrides)
    recorder = KeepCheckpoints()
    result = Runner(cfg, [recorder], checkpoint_dir=folder).run()
    return TrainedRun(cfg, result, recorder, kept)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> TrainedRun:
    """The run of ``TINY``, trained once per worker: the tests that need a finished run of
    it, its events or a checkpoint it wrote take them from here instead of training again
    (each such training is seconds of CPU)."""
    return _trained(tmp_path_factory.mktemp("tiny-run"), TINY)


@pytest.fixture(scope="session")
def tiny_final_run(tmp_path_factory) -> TrainedRun:
    """``TINY`` with one final epoch, trained once per worker (the final stage's tests)."""
    return _trained(tmp_path_factory.mktemp("tiny-final-run"), {**TINY, "search.final_epochs": 1})

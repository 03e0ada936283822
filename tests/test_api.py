"""The Python API: ``asolab.run``, ``load_config``, ``runs``, ``load_model``, light to import."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ONE_CYCLE
from mlflow import MlflowClient

import asolab
from asolab.config import PROJECT_ROOT, ConfigError, ExperimentConfig
from asolab.data import load_data
from asolab.tracking import layout as L


def test_import_asolab_loads_neither_torch_nor_mlflow():
    code = (
        "import sys, asolab; asolab.run; asolab.load_config; "
        "print(json.dumps(sorted(m for m in ('torch', 'mlflow', 'pandas') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code],
        env={"PYTHONPATH": str(PROJECT_ROOT / "platform")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == []


def test_load_config_takes_a_name_a_path_or_a_config_with_overrides():
    by_name = asolab.load_config("digits", {"search.cycles": 1})
    by_path = asolab.load_config(PROJECT_ROOT / "experiments" / "digits.toml", ["search.cycles=1"])
    assert isinstance(by_name, ExperimentConfig) and by_name == by_path
    again = asolab.load_config(by_name, {"seed": 3})
    assert again.seed == 3 and again.search.cycles == 1
    with pytest.raises(ConfigError, match="search.cycles"):
        asolab.load_config("digits", {"search.cycles": 0})
    with pytest.raises(ConfigError, match="mapping or a list"):
        asolab.load_config("digits", "search.cycles=1")


def test_run_returns_the_result_and_the_mlflow_run_and_load_model_predicts(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {**ONE_CYCLE, "data.train_subset": 150, "tracking.log_models": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = asolab.run("digits", overrides, tracking_uri=store)
    # MLflow's advice to give an input example (the model's signature says it all) is not
    # printed under every run: its text starts with a colour code
    assert not [w for w in caught if "input example" in str(w.message)]
    assert isinstance(result, asolab.RunResult) and result.tracking_uri == store
    run = MlflowClient(store).get_run(result.run_id)
    assert run.data.metrics[L.TEST_ACC] == pytest.approx(result.test_acc)
    assert run.data.tags[L.TAG_FINAL_GENOTYPE] == str(result.genotype)
    assert result.params == int(run.data.metrics[L.FINAL_PARAMS])

    # the compare table of the store, as a DataFrame
    table = asolab.runs(tracking_uri=store)
    assert list(table["run_id"]) == [result.run_id]
    assert table.loc[0, "test_acc"] == pytest.approx(result.test_acc)
    # how far its alphas moved: the run's own record, and the table's column
    alphas = run.data.metrics[L.ALPHA_ENTROPY]
    assert result.alpha_entropy == pytest.approx(alphas) == table.loc[0, "alpha_entropy"]
    assert 0 < result.alpha_entropy < 1
    assert asolab.runs(tracking_uri=store, filter="params.seed = '7'").empty

    # the final network, by a prefix of the run id, predicts as the run measured
    model = asolab.load_model(result.run_id[:8], tracking_uri=store)
    assert isinstance(model.network, torch.nn.Module) and not model.network.training
    data = load_data(result.config.data, seed=result.config.seed)
    with torch.no_grad():
        acc = (model.network(data.test.x).argmax(1) == data.test.y).float().mean().item()
    assert acc == pytest.approx(result.test_acc, abs=1e-6)


def test_load_model_of_a_run_without_a_model_says_so(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = asolab.run("digits", {**ONE_CYCLE, "data.train_subset": 100}, store)
    with pytest.raises(ConfigError, match="has no model"):
        asolab.load_model(result.run_id, tracking_uri=store)
    with pytest.raises(ConfigError, match="nope"):
        asolab.load_model("nope", tracking_uri=store)


def test_run_untracked_records_nothing_and_has_no_run_id(tmp_path):
    result = asolab.run("digits", {**ONE_CYCLE, "data.train_subset": 100}, track=False)
    assert result.run_id is None and result.tracking_uri is None
    assert 0 <= result.val_acc <= 1 and result.genotype.num_edges > 0


def test_a_stopped_run_raises_run_stopped_with_the_run_and_the_command(tmp_path):
    """Ctrl-C inside a tracked run: ``asolab.RunStopped`` (still a KeyboardInterrupt)
    names the run, its store and the command that continues it, as the run records."""
    from asolab.runner.events import Observer

    class CtrlC(Observer):
        def on_epoch_end(self, event):
            raise KeyboardInterrupt

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {**ONE_CYCLE, "data.train_subset": 150}
    with pytest.raises(asolab.RunStopped) as stopped:
        asolab.run("digits", overrides, tracking_uri=store, observers=[CtrlC()])
    exc = stopped.value
    assert isinstance(exc, KeyboardInterrupt) and exc.status == 130
    assert exc.tracking_uri == store and f"--resume {exc.run_id}" in exc.command
    assert str(exc) == f"run {exc.run_id} stopped; continue it with: {exc.command}"
    run = MlflowClient(store).get_run(exc.run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags[L.TAG_RESUME_COMMAND] == exc.command


def test_mlflow_progress_bars_are_off_inside_and_the_users_setting_wins(monkeypatch):
    import os

    from asolab.tracking.environment import PROGRESS_BAR, quiet_mlflow

    monkeypatch.delenv(PROGRESS_BAR, raising=False)
    with quiet_mlflow():
        assert os.environ[PROGRESS_BAR] == "false"
    assert PROGRESS_BAR not in os.environ  # back as it was
    monkeypatch.setenv(PROGRESS_BAR, "true")
    with quiet_mlflow():
        assert os.environ[PROGRESS_BAR] == "true"

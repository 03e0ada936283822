"""Optuna studies end to end: real journal storages and MLflow stores in tmp_path,
tiny digits runs (2 cycles of one epoch per phase, 4 channels, 300 examples)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from asolab.cli import main
from asolab.config import ConfigError
from asolab.study import load_study, run_study
from asolab.study.config import in_range
from asolab.study.objective import suggest
from asolab.study.report import TAG_STUDY_PARENT
from asolab.study.run import open_study
from asolab.study.storage import ATTR_MLFLOW_RUN, ATTR_OWNER, ATTR_RETRY_OF, ATTR_STALE
from asolab.tracking.layout import TAG_ERROR, TAG_STUDY, TAG_TRIAL, TAG_TRIAL_STATE

pytestmark = pytest.mark.slow

TINY_EXPERIMENT = """
seed = 0
device = "cpu"
threads = 1
[data]
name = "digits"
train_subset = 300
[space]
init_channels = 4
[search]
cycles = 2
w_epochs = 1
alpha_epochs = 1
retrain_epochs = 1
final_epochs = 0
[tracking]
log_models = false
"""

SPACE = """
[params.temperature.initial_temperature]
low = 0.5
high = 10.0
log = true
[params.temperature.min_temperature]
low = 0.05
high = 1.0
fraction_of = "temperature.initial_temperature"
[params.temperature.anneal_fraction]
low = 0.2
high = 1.0
[params.mutation.strength]
low = 0.0
high = 1.0
"""


def write_study(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / "tiny.toml").write_text(TINY_EXPERIMENT)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nexperiment = "tiny.toml"\n' + textwrap.dedent(body))
    return path


def stores(tmp_path: Path) -> dict[str, str]:
    return {"storage_url": str(tmp_path / "optuna-journal.log"), "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}


def load(tmp_path: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "optuna-journal.log"))))


def runs_of(tmp_path: Path, name: str) -> tuple[object, list]:
    """(parent run, child runs) of a study in the tmp MLflow store."""
    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name(f"study-{name}")
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{name}'")
    parents = [r for r in runs if r.data.tags.get(TAG_STUDY_PARENT) == "true"]
    assert len(parents) == 1, "one parent run per study"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], children


def artifacts(tmp_path: Path, run_id: str, folder: str) -> list[str]:
    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return [Path(a.path).name for a in c.list_artifacts(run_id, folder)]


def test_three_trials_resume_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    file = write_study(tmp_path, "tm", """
        n_trials = 3
        seed = 3
        [sampler]
        name = "random"
        [pruner]
        name = "none"
        """ + SPACE)
    cfg = load_study(file)
    outcome = run_study(cfg, **stores(tmp_path))
    study = load(tmp_path, "tm")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert outcome.new_trials == [0, 1, 2]
    for t in trials:
        assert set(t.params) == {p.optuna_name for p in cfg.params}
        for p in cfg.params:
            assert in_range(p, t.params[p.optuna_name]), (p.optuna_name, t.params[p.optuna_name])
        # min_temperature is a fraction of initial_temperature, so the constraint always holds
        assert 0 < t.user_attrs["temperature.min_temperature"] <= t.params["temperature.initial_temperature"]
        assert 0.0 <= t.value <= 1.0

    parent, children = runs_of(tmp_path, "tm")
    assert parent.info.run_id == outcome.parent_run_id
    assert sorted(int(r.data.tags[TAG_TRIAL]) for r in children) == [0, 1, 2]
    assert {r.data.tags[TAG_TRIAL_STATE] for r in children} == {"COMPLETE"}
    by_trial = {int(r.data.tags[TAG_TRIAL]): r for r in children}
    for t in trials:
        run = by_trial[t.number]
        assert run.info.run_id == t.user_attrs[ATTR_MLFLOW_RUN]
        assert run.data.metrics["objective.val_acc"] == pytest.approx(t.value)
        assert float(run.data.params["temperature.initial_temperature"]) == pytest.approx(t.params["temperature.initial_temperature"])
        assert float(run.data.params["temperature.min_temperature"]) == pytest.approx(t.user_attrs["temperature.min_temperature"])
    assert parent.data.metrics["best.value"] == pytest.approx(study.best_value)
    assert parent.data.tags["asolab.best_trial"] == str(study.best_trial.number)
    plots = artifacts(tmp_path, parent.info.run_id, "plots")
    assert {"optimization_history.png", "param_importances.png", "contour.png"} <= set(plots)

    # The same command again, with a bigger budget: same study, same parent run, one more trial.
    s = stores(tmp_path)
    argv = ["study", str(file), "--n-trials", "4", "--storage", s["storage_url"], "--tracking-uri", s["tracking_uri"]]
    assert main(argv) == 0
    resumed = load(tmp_path, "tm").get_trials()
    assert len(resumed) == 4
    assert all(resumed[3].params != t.params for t in resumed[:3]), "a resumed invocation must not replay old points"
    parent2, children2 = runs_of(tmp_path, "tm")
    assert parent2.info.run_id == parent.info.run_id and len(children2) == 4
    assert main(argv) == 0  # budget met: nothing to add
    assert len(load(tmp_path, "tm").get_trials()) == 4

    capsys.readouterr()
    assert main(["study", str(file), "--summary", "--storage", s["storage_url"], "--tracking-uri", s["tracking_uri"]]) == 0
    out = capsys.readouterr().out
    assert "4 trials (4 complete)" in out and "best trials" in out and parent.info.run_id in out
    assert f"{study.best_value:.4g}" in out


def test_aggressive_pruner_prunes_and_marks_the_run(tmp_path: Path) -> None:
    file = write_study(tmp_path, "pr", """
        n_trials = 2
        [sampler]
        name = "random"
        [pruner]
        name = "threshold"
        lower = 1.01          # no accuracy reaches it: every trial is pruned after its first cycle
        """ + SPACE)
    run_study(load_study(file), **stores(tmp_path))
    trials = load(tmp_path, "pr").get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [0] for t in trials)
    _, children = runs_of(tmp_path, "pr")
    assert len(children) == 2
    for run in children:
        assert run.data.tags[TAG_TRIAL_STATE] == "PRUNED"
        assert run.info.status == "FINISHED"
        assert "val_acc" in run.data.metrics  # what it logged before pruning is kept


def test_nan_trial_fails_and_the_study_goes_on(tmp_path: Path) -> None:
    file = write_study(tmp_path, "nan", """
        n_trials = 2
        [overrides]           # unclipped gradients + weight decay 1.0: lr 10 overflows to NaN
        search.grad_clip = 1e38
        search.weight_decay = 1.0
        data.batch_size = 4
        data.train_subset = 120
        [sampler]
        name = "random"
        [pruner]
        name = "none"
        [params.search.weight_lr]
        low = 0.01
        high = 10.0
        log = true
        [[enqueue]]
        "search.weight_lr" = 10.0
        [[enqueue]]
        "search.weight_lr" = 0.01
        """)
    run_study(load_study(file), **stores(tmp_path))
    trials = load(tmp_path, "nan").get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "FloatingPointError" in trials[0].user_attrs[TAG_ERROR]
    _, children = runs_of(tmp_path, "nan")
    failed = [r for r in children if r.data.tags[TAG_TRIAL] == "0"][0]
    assert failed.info.status == "FAILED"
    assert failed.data.tags[TAG_TRIAL_STATE] == "FAIL"
    assert "nan" in failed.data.tags[TAG_ERROR]


def test_two_workers_share_the_budget(tmp_path: Path) -> None:
    file = write_study(tmp_path, "par", """
        n_trials = 4
        [overrides]
        data.train_subset = 150
        [sampler]
        name = "tpe"
        n_startup_trials = 10
        [pruner]
        name = "none"
        """ + SPACE)
    outcome = run_study(load_study(file), workers=2, **stores(tmp_path))
    trials = load(tmp_path, "par").get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    owners = {t.user_attrs[ATTR_OWNER] for t in trials}
    assert len(owners) == 2, "both worker processes ran trials"
    _, children = runs_of(tmp_path, "par")
    assert sorted(int(r.data.tags[TAG_TRIAL]) for r in children) == [0, 1, 2, 3]
    assert {r.info.run_id for r in children} == {t.user_attrs[ATTR_MLFLOW_RUN] for t in trials}
    assert outcome.new_trials == [0, 1, 2, 3]
    # each worker's sampler seed differs, so they do not propose the same point
    assert len({t.params["mutation.strength"] for t in trials}) == 4


def test_two_objectives_give_a_pareto_front(tmp_path: Path) -> None:
    file = write_study(tmp_path, "pareto", """
        n_trials = 3
        [objective]
        metrics = ["val_acc", "params"]
        [sampler]
        name = "nsga2"
        population_size = 2
        [pruner]
        name = "none"
        [params.mutation.strength]
        low = 0.0
        high = 1.0
        [params.space.init_channels]
        low = 4
        high = 8
        step = 4
        """)
    outcome = run_study(load_study(file), **stores(tmp_path))
    study = load(tmp_path, "pareto")
    assert len(study.directions) == 2
    assert all(t.state == TrialState.COMPLETE and len(t.values) == 2 for t in study.get_trials())
    assert all(t.values[1] > 0 for t in study.get_trials())  # derived parameter count
    assert "pareto_front.png" in outcome.plots
    parent, _ = runs_of(tmp_path, "pareto")
    assert "pareto_front.png" in artifacts(tmp_path, parent.info.run_id, "plots")
    front = {int(n) for n in parent.data.tags["asolab.pareto_trials"].split(",")}
    assert front == {t.number for t in study.best_trials}


def test_trial_of_a_dead_worker_is_failed_and_retried(tmp_path: Path) -> None:
    file = write_study(tmp_path, "stale", """
        n_trials = 1
        [sampler]
        name = "random"
        [pruner]
        name = "none"
        """ + SPACE)
    cfg = load_study(file)
    s = stores(tmp_path)
    # A worker that started trial 0 and was killed: its process is gone, the trial is RUNNING.
    study = open_study(cfg, s["storage_url"], "stale")
    trial = study.ask()
    params = {p.optuna_name: suggest(trial, p) for p in cfg.params}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    trial.set_user_attr(ATTR_OWNER, f"{socket.gethostname()}:{int(dead.stdout)}")

    run_study(cfg, **s)
    trials = load(tmp_path, "stale").get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "gone" in trials[0].user_attrs[ATTR_STALE]
    assert trials[1].user_attrs[ATTR_RETRY_OF] == 0
    assert trials[1].params == pytest.approx(params)
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_study_file_errors_name_file_and_key(tmp_path: Path) -> None:
    cases = {
        'sampler = { name = "grid" }': "sampler.name",
        "[params.temperature.bogus]\nlow = 1.0\nhigh = 2.0": "temperature.bogus",
        '[params.temperature.min_temperature]\nlow = 0.5\nhigh = 2.0\nfraction_of = "temperature.initial_temperature"': "fraction",
        "[params.mutation.strength]\nlow = 0.0\nhigh = 2.0": "high corner",
        'objective = { metrics = ["val_acc", "params"] }\n[params.mutation.strength]\nlow = 0.0\nhigh = 1.0': "pruner.name",
        "n_trialz = 3": "n_trialz",
    }
    for i, (body, needle) in enumerate(cases.items()):
        file = write_study(tmp_path, f"bad{i}", body + "\n")
        with pytest.raises(ConfigError) as err:
            load_study(file)
        message = str(err.value)
        assert str(file) in message and needle in message and "\n" not in message, message
    assert main(["study", str(tmp_path / "nope.toml")]) == 2

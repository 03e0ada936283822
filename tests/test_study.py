"""Optuna studies end to end: real journal storages and MLflow stores in tmp_path,
tiny digits runs (2 cycles of one epoch per phase, 4 channels, 96 examples)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import optuna
import processes
import pytest
from layout_check import undeclared
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.trial import TrialState

from asolab.cli import main
from asolab.config import ConfigError
from asolab.study import load_study, report, run_study
from asolab.study import run as study_run
from asolab.study.config import in_range
from asolab.study.objective import suggest
from asolab.study.report import TAG_STUDY_PARENT
from asolab.study.run import open_study
from asolab.study.storage import (
    ATTR_HEARTBEAT,
    ATTR_MLFLOW_RUN,
    ATTR_OWNER,
    ATTR_OWNER_STARTED,
    ATTR_RETRY_OF,
    ATTR_STALE,
    JOURNAL_NAME,
    Heartbeat,
    budget_lock,
    owner_id,
    process_started,
    recover_stale_trials,
    used_budget,
)
from asolab.tracking import layout
from asolab.tracking.layout import (
    TAG_DEVICE_INFO,
    TAG_ERROR,
    TAG_STUDY,
    TAG_TRIAL,
    TAG_TRIAL_STATE,
)

pytestmark = pytest.mark.slow

TINY_EXPERIMENT = """
seed = 0
device = "cpu"
threads = 1
[data]
name = "digits"
train_subset = 96
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


# Trials of one cycle, randomly sampled and never pruned (top-level keys go before it).
SHORT_RANDOM_TRIALS = """
[overrides]
search.cycles = 1
[sampler]
name = "random"
[pruner]
name = "none"
"""
# One such trial: the recovery tests' study.
ONE_SHORT_RANDOM_TRIAL = "n_trials = 1\n" + SHORT_RANDOM_TRIALS


def write_study(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / "tiny.toml").write_text(TINY_EXPERIMENT)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nexperiment = "tiny.toml"\n' + textwrap.dedent(body))
    return path


def stores(tmp_path: Path) -> dict[str, str]:
    return {
        "storage_url": str(tmp_path / "optuna-journal.log"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }


def load(tmp_path: Path, name: str) -> optuna.Study:
    return optuna.load_study(
        study_name=name,
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(tmp_path / "optuna-journal.log"))
        ),
    )


def runs_of(tmp_path: Path, name: str, experiment: str = "") -> tuple[object, list]:
    """(parent run, child runs) of a study in the tmp MLflow store."""
    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name(experiment or f"study-{name}")
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{name}'")
    parents = [r for r in runs if r.data.tags.get(TAG_STUDY_PARENT) == "true"]
    assert len(parents) == 1, "one parent run per study"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    return parents[0], children


def artifacts(tmp_path: Path, run_id: str, folder: str) -> list[str]:
    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return [Path(a.path).name for a in c.list_artifacts(run_id, folder)]


def test_three_trials_resume_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    file = write_study(
        tmp_path,
        "tm",
        """
        n_trials = 3
        seed = 3
        [overrides]           # one cycle a trial: the study's bookkeeping is tested here
        search.cycles = 1
        [sampler]
        name = "random"
        [pruner]
        name = "none"
        """
        + SPACE,
    )
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
        assert (
            0
            < t.user_attrs["temperature.min_temperature"]
            <= t.params["temperature.initial_temperature"]
        )
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
        assert float(run.data.params["temperature.initial_temperature"]) == pytest.approx(
            t.params["temperature.initial_temperature"]
        )
        assert float(run.data.params["temperature.min_temperature"]) == pytest.approx(
            t.user_attrs["temperature.min_temperature"]
        )
    assert parent.data.metrics["best.value"] == pytest.approx(study.best_value)
    assert parent.data.tags["asolab.best_trial"] == str(study.best_trial.number)
    plots = artifacts(tmp_path, parent.info.run_id, "plots")
    assert {"optimization_history.png", "param_importances.png", "contour.png"} <= set(plots)
    # every name the parent and the trial runs hold is declared in tracking/layout.py
    client = MlflowClient(stores(tmp_path)["tracking_uri"])
    for run in (parent, *children):
        assert undeclared(client, run.info.run_id, cfg.base.flat()) == [], run.info.run_id

    # The same command again, with a bigger budget: same study, same parent run, one more trial.
    s = stores(tmp_path)
    argv = [
        "study",
        str(file),
        "--n-trials",
        "4",
        "--storage",
        s["storage_url"],
        "--tracking-uri",
        s["tracking_uri"],
    ]
    assert main(argv) == 0
    resumed = load(tmp_path, "tm").get_trials()
    assert len(resumed) == 4
    assert all(resumed[3].params != t.params for t in resumed[:3]), (
        "a resumed invocation must not replay old points"
    )
    parent2, children2 = runs_of(tmp_path, "tm")
    assert parent2.info.run_id == parent.info.run_id and len(children2) == 4
    assert main(argv) == 0  # budget met: nothing to add
    assert len(load(tmp_path, "tm").get_trials()) == 4

    def summary(tracking_uri: str) -> int:
        return main(
            ["study", str(file), "--summary", "--storage", s["storage_url"]]
            + ["--tracking-uri", tracking_uri]
        )

    capsys.readouterr()
    assert summary(s["tracking_uri"]) == 0
    out = capsys.readouterr().out
    assert "4 trials (4 complete)" in out and "best trials" in out and parent.info.run_id in out
    assert f"{study.best_value:.4g}" in out

    # A tracking store that cannot be read is not "no parent run yet".
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert summary(closed) == 0
    out = capsys.readouterr().out
    assert "could not be read" in out and "not reachable" in out and "(none yet)" not in out
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert summary(empty) == 0
    assert "parent run (none yet)" in capsys.readouterr().out


def test_aggressive_pruner_prunes_and_marks_the_run(tmp_path: Path) -> None:
    file = write_study(
        tmp_path,
        "pr",
        """
        n_trials = 2
        [sampler]
        name = "random"
        [pruner]
        name = "threshold"
        lower = 1.01          # no accuracy reaches it: every trial is pruned after its first cycle
        """
        + SPACE,
    )
    # --study-name differs from the file's name: trial runs carry the study's actual name
    run_study(load_study(file), study_name="pr-renamed", **stores(tmp_path))
    trials = load(tmp_path, "pr-renamed").get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [0] for t in trials)
    _, children = runs_of(tmp_path, "pr-renamed", experiment="study-pr")
    assert len(children) == 2
    # named to be told apart in the UI's narrow name column: number, temperature, strength
    names = sorted(r.info.run_name for r in children)
    assert [n.split()[0] for n in names] == ["t000", "t001"] and all(
        " τ" in n and " s" in n for n in names
    )
    assert len(set(names)) == 2
    for run in children:
        assert run.data.tags[TAG_STUDY] == "pr-renamed"
        assert run.data.tags[TAG_TRIAL_STATE] == "PRUNED"
        assert run.info.status == "FINISHED"
        assert "val_acc" in run.data.metrics  # what it logged before pruning is kept


def test_nan_trial_fails_and_the_study_goes_on(tmp_path: Path) -> None:
    file = write_study(
        tmp_path,
        "nan",
        """
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
        """,
    )
    run_study(load_study(file), **stores(tmp_path))
    trials = load(tmp_path, "nan").get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "FloatingPointError" in trials[0].user_attrs[TAG_ERROR]
    _, children = runs_of(tmp_path, "nan")
    failed = [r for r in children if r.data.tags[TAG_TRIAL] == "0"][0]
    assert failed.info.status == "FAILED"
    assert failed.data.tags[TAG_TRIAL_STATE] == "FAIL"
    assert "nan" in failed.data.tags[TAG_ERROR]


@pytest.fixture
def forked_workers(monkeypatch: pytest.MonkeyPatch) -> list[processes.Popen]:
    """The study's ``--worker`` processes forked from tests/processes.py's server, not
    started as fresh interpreters: each is still a process of its own, running the
    product's worker command line, but without the ~8 CPU-s of imports a fresh one pays
    (``start_worker`` itself, the fresh-interpreter path, is tests/test_gpu_workers.py's).
    The list holds the workers as they start."""
    started: list[processes.Popen] = []

    def start(cmd, gpu, **popen):
        proc = processes.Popen(list(cmd), env=study_run.worker_env(os.environ, gpu), **popen)
        started.append(proc)
        return proc

    monkeypatch.setattr(study_run, "start_worker", start)
    return started


def test_two_workers_share_the_budget(tmp_path: Path, forked_workers: list) -> None:
    file = write_study(
        tmp_path,
        "par",
        """
        n_trials = 4
        [sampler]
        name = "tpe"
        n_startup_trials = 10
        [pruner]
        name = "none"
        """
        + SPACE,
    )
    # --set reaches the worker processes, which re-read the file; --gpus 3,5: one GPU per
    # worker (on a machine without them the runs use the CPU and record what they were given)
    outcome = run_study(
        load_study(file, ["data.train_subset=150", "search.cycles=1"]),
        workers=2,
        gpus="3,5",
        **stores(tmp_path),
    )
    trials = load(tmp_path, "par").get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    owners = {t.user_attrs[ATTR_OWNER] for t in trials}
    assert len(owners) == 2, "both worker processes ran trials"
    _, children = runs_of(tmp_path, "par")
    assert sorted(int(r.data.tags[TAG_TRIAL]) for r in children) == [0, 1, 2, 3]
    assert {r.info.run_id for r in children} == {t.user_attrs[ATTR_MLFLOW_RUN] for t in trials}
    assert outcome.new_trials == [0, 1, 2, 3]
    assert {r.data.params["data.train_subset"] for r in children} == {"150"}
    assert {r.data.params["search.cycles"] for r in children} == {"1"}
    visible = {r.data.tags[TAG_DEVICE_INFO + "cuda_visible_devices"] for r in children}
    assert visible == {"3", "5"}
    # each worker's sampler seed differs, so they do not propose the same point
    assert len({t.params["mutation.strength"] for t in trials}) == 4


def test_two_objectives_give_a_pareto_front(tmp_path: Path) -> None:
    file = write_study(
        tmp_path,
        "pareto",
        """
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
        """,
    )
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
    assert undeclared(MlflowClient(stores(tmp_path)["tracking_uri"]), parent.info.run_id) == []


def test_trial_of_a_dead_worker_is_failed_and_retried(tmp_path: Path) -> None:
    file = write_study(
        tmp_path,
        "stale",
        """
        n_trials = 1
        [sampler]
        name = "random"
        [pruner]
        name = "none"
        """
        + SPACE,
    )
    cfg = load_study(file)
    s = stores(tmp_path)
    # A worker that started trial 0 and was killed: its process is gone, the trial is RUNNING.
    study = open_study(cfg, s["storage_url"], "stale")
    trial = study.ask()
    params = {p.optuna_name: suggest(trial, p) for p in cfg.params}
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
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
        (
            "[params.temperature.min_temperature]\nlow = 0.5\nhigh = 2.0\n"
            'fraction_of = "temperature.initial_temperature"'
        ): "fraction",
        "[params.mutation.strength]\nlow = 0.0\nhigh = 2.0": "high corner",
        (
            'objective = { metrics = ["val_acc", "params"] }\n'
            "[params.mutation.strength]\nlow = 0.0\nhigh = 1.0"
        ): "pruner.name",
        "n_trialz = 3": "n_trialz",
        'objective = { metrics = ["test_acc"] }': "use val_acc",
        "storage = { heartbeat_interval = 60, grace_period = 60 }": (
            "storage.heartbeat_interval (60) must be less than storage.grace_period"
        ),
        "n_trials = 0\ntimeout = 0": "needs a time budget",
        "n_trials = -1": "n_trials = -1 is out of range; allowed: in [0, inf)",
        'timeout = "1h"': "timeout must be a number",
        "sampler = { population_size = 1 }": "sampler.population_size = 1 is out of range",
    }
    for i, (body, needle) in enumerate(cases.items()):
        file = write_study(tmp_path, f"bad{i}", body + "\n")
        with pytest.raises(ConfigError) as err:
            load_study(file)
        message = str(err.value)
        assert str(file) in message and needle in message and "\n" not in message, message
    assert main(["study", str(tmp_path / "nope.toml")]) == 2


def test_cli_refuses_bad_budgets_names_and_sqlite_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    file = write_study(tmp_path, "cli", "n_trials = 2\n" + SPACE)
    s = stores(tmp_path)
    base = ["study", str(file), "--storage", s["storage_url"], "--tracking-uri", s["tracking_uri"]]
    sqlite = f"sqlite:///{tmp_path / 'optuna.db'}"
    cases = {
        ("--timeout", "-5"): "--timeout must be >= 0 seconds",
        ("--n-trials", "-1"): "--n-trials must be >= 0",
        ("--n-trials", "0"): "needs a time budget",  # the file has no timeout
        ("--study-name", "it's"): "no quotes, backslashes",
        ("--study-name", "a\\b"): "no quotes, backslashes",
        ("--study-name", "a'b", "--summary"): "no quotes, backslashes",
        (
            "--workers",
            "2",
            "--storage",
            sqlite,
        ): "Optuna documents SQLite as unsafe for concurrent workers",
    }
    for extra, needle in cases.items():
        capsys.readouterr()
        assert main(base + list(extra)) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("asolab: error: ") and needle in err and err.count("\n") == 1, err
    # refused before anything was created
    assert not (tmp_path / "optuna-journal.log").exists() and not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "mlflow.db").exists()

    quoted = tmp_path / "quoted.toml"
    quoted.write_text(file.read_text().replace('name = "cli"', 'name = "it\'s"'))
    with pytest.raises(ConfigError, match=r"quoted\.toml: name .*no quotes"):
        load_study(quoted)


def test_time_budget_alone(tmp_path: Path) -> None:
    # n_trials = 0: no trial limit, the time budget decides
    file = write_study(
        tmp_path, "timed", "n_trials = 0\ntimeout = 1\n" + SHORT_RANDOM_TRIALS + SPACE
    )
    s = stores(tmp_path)
    assert (
        main(
            ["study", str(file), "--storage", s["storage_url"], "--tracking-uri", s["tracking_uri"]]
        )
        == 0
    )
    trials = load(tmp_path, "timed").get_trials()
    assert trials and all(t.state == TrialState.COMPLETE for t in trials)
    # no trial starts once the budget is spent (a trial running then finishes)
    assert all(t.datetime_start < trials[0].datetime_start + timedelta(seconds=1) for t in trials)


def test_failed_workers_end_with_an_error_and_keep_the_others_trials(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    forked_workers: list,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    file = write_study(tmp_path, "crash", ONE_SHORT_RANDOM_TRIAL + SPACE)
    killed: list[int] = []
    start = study_run.start_worker  # forked_workers' start

    def start_and_kill_worker_0(cmd, gpu, **popen):
        """Worker 0 is killed as it starts, as the OOM killer would, before it draws a
        trial: a thread that polled for it (every 50 ms) sometimes found it a trial in, on
        a loaded machine, and the study then rightly failed and retried that trial."""
        proc = start(cmd, gpu, **popen)
        if cmd[cmd.index("--worker") + 1] == "0":
            proc.send_signal(signal.SIGKILL)
            killed.append(proc.pid)
        return proc

    monkeypatch.setattr(study_run, "start_worker", start_and_kill_worker_0)
    s = stores(tmp_path)
    code = main(
        [
            "study",
            str(file),
            "--workers",
            "2",
            "--storage",
            s["storage_url"],
            "--tracking-uri",
            s["tracking_uri"],
        ]
    )
    assert killed
    assert code == 2
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith(
        "asolab: error: 1 of the study's worker processes failed (worker 0: killed by SIGKILL)"
    ), last
    assert "1 trials (1 complete)" in captured.out  # the summary of what was recorded comes first
    trials = load(tmp_path, "crash").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE]
    parent, children = runs_of(tmp_path, "crash")
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials.complete"] == 1
    assert [r.data.tags[TAG_TRIAL_STATE] for r in children] == ["COMPLETE"]


def age_heartbeats(db: Path) -> None:
    """Make every Optuna heartbeat in an RDB storage look a long time old."""
    with sqlite3.connect(db) as con:
        con.execute("UPDATE trial_heartbeats SET heartbeat = '2000-01-01 00:00:00.000000'")


RDB_STORAGE = """
[storage]
heartbeat_interval = 1
grace_period = 5
"""


@pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed"
)  # the tests ask for trials themselves
def test_dead_trial_on_an_rdb_storage_is_failed_marked_and_retried(tmp_path: Path) -> None:
    file = write_study(tmp_path, "rdb", ONE_SHORT_RANDOM_TRIAL + RDB_STORAGE + SPACE)
    cfg = load_study(file)
    url, uri = f"sqlite:///{tmp_path / 'optuna.db'}", stores(tmp_path)["tracking_uri"]
    # A worker on another machine started trial 0 and its MLflow run, then died.
    study = open_study(cfg, url, "rdb")
    parent = report.ensure_parent_run(uri, cfg, "rdb", url)
    trial = study.ask()
    params = {p.optuna_name: suggest(trial, p) for p in cfg.params}
    c = MlflowClient(uri)
    dead_run = c.create_run(
        c.get_run(parent).info.experiment_id,
        run_name="rdb-trial-0000",
        tags={"mlflow.parentRunId": parent, TAG_STUDY: "rdb", TAG_TRIAL: "0"},
    ).info.run_id
    trial.set_user_attr(ATTR_MLFLOW_RUN, dead_run)
    trial.set_user_attr(ATTR_OWNER, "another-host:4242")
    assert Heartbeat(study, trial, 1).beat()  # its last heartbeat...
    age_heartbeats(tmp_path / "optuna.db")  # ...was long ago

    run_study(cfg, storage_url=url, tracking_uri=uri)
    trials = optuna.load_study(study_name="rdb", storage=url).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    retry = trials[1]
    assert retry.params == pytest.approx(params)
    assert retry.user_attrs[ATTR_RETRY_OF] == 0
    # the retry's own attributes, not the dead trial's copied ones
    assert retry.user_attrs[ATTR_OWNER] == owner_id()
    assert retry.user_attrs[ATTR_MLFLOW_RUN] != dead_run
    dead = c.get_run(dead_run)
    assert dead.info.status == "KILLED"
    assert dead.data.tags[TAG_TRIAL_STATE] == "FAIL" and "heartbeat" in dead.data.tags[TAG_ERROR]
    _, children = runs_of(tmp_path, "rdb")
    by_trial = {r.data.tags[TAG_TRIAL]: r for r in children}
    assert by_trial["1"].info.run_id == retry.user_attrs[ATTR_MLFLOW_RUN]
    assert by_trial["1"].data.tags[TAG_TRIAL_STATE] == "COMPLETE"


@pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed"
)  # the tests ask for trials themselves
def test_a_retry_chain_counts_once_against_the_budget(tmp_path: Path) -> None:
    file = write_study(tmp_path, "chain", RDB_STORAGE + "max_retry = 2\n" + SPACE)
    cfg = load_study(file)
    study = open_study(cfg, f"sqlite:///{tmp_path / 'optuna.db'}", "chain")
    for attempt in range(3):  # the trial, then its two retries, all on machines that die
        trial = study.ask()
        if attempt == 0:
            for p in cfg.params:
                suggest(trial, p)
        else:  # a waiting retry carries none of the dead attempt's attributes
            assert trial.user_attrs[ATTR_RETRY_OF] == attempt - 1
            assert ATTR_MLFLOW_RUN not in trial.user_attrs and ATTR_OWNER not in trial.user_attrs
        trial.set_user_attr(ATTR_MLFLOW_RUN, f"run-{attempt}")
        trial.set_user_attr(ATTR_OWNER, "another-host:4242")
        assert Heartbeat(study, trial, 1).beat()
        age_heartbeats(tmp_path / "optuna.db")
        stale = recover_stale_trials(study, cfg.storage)
        assert [(s.trial.number, s.trial.user_attrs[ATTR_MLFLOW_RUN]) for s in stale] == [
            (attempt, f"run-{attempt}")
        ]
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 3  # max_retry = 2: no third retry
    assert used_budget(study) == 1  # one set of parameters, tried three times


def test_a_live_owner_on_this_host_is_never_stale(tmp_path: Path) -> None:
    file = write_study(tmp_path, "live", SPACE)
    cfg = load_study(file)
    study = open_study(cfg, stores(tmp_path)["storage_url"], "live")
    long_ago = time.time() - 10_000
    alive, away, reused = study.ask(), study.ask(), study.ask()
    newcomer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owners = {
            alive: (owner_id(), process_started(os.getpid())),
            away: ("another-host:4242", long_ago),
            # the owner died and its pid now belongs to a process that started later
            reused: (f"{socket.gethostname()}:{newcomer.pid}", process_started(newcomer.pid) - 100),
        }
        for trial, (owner, started) in owners.items():
            trial.set_user_attr(ATTR_OWNER, owner)
            trial.set_user_attr(ATTR_OWNER_STARTED, started)
            trial.set_user_attr(ATTR_HEARTBEAT, long_ago)
        stale = {s.trial.number: s.reason for s in recover_stale_trials(study, cfg.storage)}
    finally:
        newcomer.kill()
        newcomer.wait()
    assert set(stale) == {away.number, reused.number}
    assert "no heartbeat" in stale[away.number]
    assert "gone" in stale[reused.number]
    states = {t.number: t.state for t in load(tmp_path, "live").get_trials()}
    assert states[alive.number] == TrialState.RUNNING  # busy, not dead: however old its heartbeat
    assert states[away.number] == states[reused.number] == TrialState.FAIL


@pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed"
)  # the tests ask for trials themselves
def test_heartbeat_keeps_beating_after_a_failed_beat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asolab.study.storage")
    file = write_study(tmp_path, "beat", RDB_STORAGE + SPACE)
    cfg = load_study(file)
    db = tmp_path / "optuna.db"
    study = open_study(cfg, f"sqlite:///{db}", "beat")
    trial = study.ask()

    def wait_for(check: object, seconds: float = 10) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if check():  # type: ignore[operator]
                return True
            time.sleep(0.1)
        return False

    def last_beat() -> str:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT heartbeat FROM trial_heartbeats").fetchone()[0]

    with Heartbeat(study, trial, cfg.storage.heartbeat_interval):
        with sqlite3.connect(db) as con:  # the database loses its heartbeat table for a while
            con.execute("ALTER TABLE trial_heartbeats RENAME TO heartbeats_away")
        assert wait_for(lambda: "heartbeat of trial 0 failed" in caplog.text)
        with sqlite3.connect(db) as con:
            con.execute("ALTER TABLE heartbeats_away RENAME TO trial_heartbeats")
        age_heartbeats(db)
        assert wait_for(lambda: not last_beat().startswith("2000")), (
            "the heartbeat stopped after a failed beat"
        )


def test_a_trial_failed_elsewhere_is_not_told_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="asolab.study.run")
    file = write_study(tmp_path, "told", SPACE)
    cfg = load_study(file)
    study = open_study(cfg, stores(tmp_path)["storage_url"], "told")
    trial = study.ask()
    load(tmp_path, "told").tell(
        trial.number, state=TrialState.FAIL
    )  # another worker judged it stale
    frozen = study_run._tell(study, trial, [0.5])
    assert frozen.state == TrialState.FAIL
    assert "already holds it as FAIL" in caplog.text
    other = study.ask()  # a genuine mistake still raises
    with pytest.raises(ValueError):
        study_run._tell(study, other, [0.5, 0.5], state=TrialState.COMPLETE)


def test_budget_lock_serialises_workers_whatever_the_storage(tmp_path: Path) -> None:
    url = "postgresql://optuna@db.example/optuna"
    events: list[str] = []
    held = threading.Event()

    def other_worker() -> None:
        with budget_lock(url):
            held.set()
            time.sleep(0.5)
            events.append("other leaves")

    for lock_url, expected in (
        (url, ["other leaves", "this enters"]),
        (url + "2", ["this enters", "other leaves"]),
    ):
        events.clear()
        held.clear()
        worker = threading.Thread(target=other_worker)
        worker.start()
        assert held.wait(10)
        with budget_lock(lock_url):  # the same storage waits; another storage has its own lock
            events.append("this enters")
        worker.join()
        assert events == expected


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # the test asks itself
@pytest.mark.parametrize("kind", ["journal", "rdb"])
def test_storage_of_reaches_the_studys_storage(tmp_path: Path, kind: str) -> None:
    """Pins the one private Optuna access (``Study._storage``, behind storage_of): it is
    the storage the study was opened on, or Optuna's cache around it, and writing a
    trial's attribute through it (by the public trial id) is what the study reads back."""
    from asolab.study.config import StorageConfig
    from asolab.study.storage import make_storage, optuna_heartbeat, storage_of, trial_id

    url = str(tmp_path / "j.log") if kind == "journal" else f"sqlite:///{tmp_path / 'o.db'}"
    storage = make_storage(url, StorageConfig())
    study = optuna.create_study(study_name="pin", storage=storage)
    trial = study.ask()
    reached = storage_of(study)
    assert reached is storage or getattr(reached, "_backend", None) is storage
    assert (optuna_heartbeat(study) is not None) == (kind == "rdb")
    reached.set_trial_user_attr(trial_id(study, trial.number), "asolab.pin", 1)
    assert study.get_trials(deepcopy=False)[trial.number].user_attrs["asolab.pin"] == 1


def test_objective_averaged_over_seeds(tmp_path: Path) -> None:
    """objective.seeds = 2: a trial is one MLflow run under the study's run (its knobs,
    its objective = the mean over seeds, its state) with its two seed runs (seeds 0 and 1)
    nested under it, named trial first, then seed; the pruner sees distinct steps."""
    file = write_study(
        tmp_path,
        "sd",
        """
        n_trials = 1
        [objective]
        metrics = ["val_acc"]
        seeds = 2
        """
        + SHORT_RANDOM_TRIALS
        + SPACE,
    )
    run_study(load_study(file), **stores(tmp_path))
    (trial,) = load(tmp_path, "sd").get_trials()
    assert trial.state == TrialState.COMPLETE
    _, children = runs_of(tmp_path, "sd")
    (trial_run,) = children  # one row per trial under the study's run
    assert trial_run.info.run_id == trial.user_attrs[ATTR_MLFLOW_RUN]
    assert trial_run.info.status == "FINISHED"
    assert trial_run.data.tags[TAG_TRIAL_STATE] == "COMPLETE"
    assert trial_run.data.tags[layout.TAG_RUN_KIND] == layout.KIND_TRIAL
    assert trial_run.info.run_name.startswith("t000 τ") and "seed" not in trial_run.info.run_name
    c = MlflowClient(stores(tmp_path)["tracking_uri"])
    seeds = c.search_runs(
        [trial_run.info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{trial_run.info.run_id}'",
    )
    by_seed = {r.data.params["seed"]: r for r in seeds}
    assert sorted(by_seed) == ["0", "1"]
    for s in ("0", "1"):
        assert by_seed[s].info.run_name.startswith(f"t000 seed{s} τ"), by_seed[s].info.run_name
        assert by_seed[s].data.tags[TAG_TRIAL] == "0" and by_seed[s].info.status == "FINISHED"
    accs = [by_seed[s].data.metrics["final_val_acc"] for s in ("0", "1")]
    assert trial.value == pytest.approx(sum(accs) / 2)
    assert [v for (v,) in trial.user_attrs["objective_per_seed"]] == pytest.approx(accs)
    assert sorted(trial.intermediate_values) == [0, 1]  # one cycle per seed, steps kept apart
    # the trial's row reads its objective and its knobs in the UI's default columns
    assert trial_run.data.metrics["objective.val_acc"] == pytest.approx(trial.value)
    assert trial_run.data.metrics["final_val_acc"] == pytest.approx(trial.value)
    for key in ("temperature.initial_temperature", "mutation.strength"):
        assert float(trial_run.data.params[key]) == pytest.approx(trial.params[key])
    assert "seed" not in trial_run.data.params
    note = trial_run.data.tags[layout.TAG_NOTE]
    assert "**Trial 0**" in note
    # the per-seed table reads apart in the UI (no padless Markdown table), and the trial's
    # row shows a whole parameter count, the seeds' mean rounded
    assert "```\nseed  val acc  test acc  parameters\n" in note and "|---" not in note
    sizes = [by_seed[s].data.metrics["final_params"] for s in ("0", "1")]
    assert trial_run.data.metrics["final_params"] == round(sum(sizes) / 2)
    assert trial_run.data.tags[layout.TAG_DATASET] == "digits"  # the data-set column
    assert undeclared(c, trial_run.info.run_id, load_study(file).base.flat()) == []
    # compare sees the seed runs (with genotypes), never the trial's grouping run
    from asolab.compare.select import load_selection

    selection = load_selection(stores(tmp_path)["tracking_uri"], study="sd")
    assert sorted(r.run_id for r in selection.records) == sorted(
        r.info.run_id for r in by_seed.values()
    )
    assert not selection.skipped


def test_objective_seeds_must_be_positive(tmp_path: Path) -> None:
    file = write_study(tmp_path, "bad", "[objective]\nseeds = 0\n" + SPACE)
    with pytest.raises(ConfigError, match="objective.seeds = 0 is out of range"):
        load_study(file)


def test_the_journal_lies_beside_the_mlflow_store_of_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """One store folder: with no --storage and no --tracking-uri, a study keeps its journal
    in ./mlruns beside mlflow.db, so two project folders never share a study; with a
    SQLite tracking URI elsewhere, the journal lies beside that file. --summary is
    read-only: it creates no file and no folder."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        file = write_study(folder, "one", ONE_SHORT_RANDOM_TRIAL + SPACE)
        monkeypatch.chdir(folder)
        capsys.readouterr()
        assert main(["study", "--summary", str(file)]) == 2  # nothing recorded here yet
        assert "no study 'one'" in capsys.readouterr().err
        assert main(["compare"]) == 2  # read-only too
        assert "no MLflow store" in capsys.readouterr().err
        assert sorted(p.name for p in folder.iterdir()) == ["one.toml", "tiny.toml"]
        assert main(["study", str(file)]) == 0
        store = folder / "mlruns"
        assert {"mlflow.db", "optuna-journal.log"} <= {p.name for p in store.iterdir()}
        journal = optuna.storages.journal.JournalFileBackend(str(store / JOURNAL_NAME))
        (study,) = optuna.get_all_study_summaries(JournalStorage(journal))
        assert study.n_trials == 1  # its own trial only: b did not pick up a's study
        before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
        assert main(["study", "--summary", str(file)]) == 0
        assert "1 trials (1 complete)" in capsys.readouterr().out
        assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    file = write_study(elsewhere, "two", ONE_SHORT_RANDOM_TRIAL + SPACE)
    uri = f"sqlite:///{elsewhere / 'store' / 'runs.db'}"
    assert main(["study", str(file), "--tracking-uri", uri]) == 0
    assert {p.name for p in (elsewhere / "store").iterdir()} >= {"runs.db", "optuna-journal.log"}
    here = optuna.storages.journal.JournalFileBackend(str(folders[1] / "mlruns" / JOURNAL_NAME))
    there = optuna.storages.journal.JournalFileBackend(str(elsewhere / "store" / JOURNAL_NAME))
    assert [s.study_name for s in optuna.get_all_study_summaries(JournalStorage(here))] == ["one"]
    assert [s.study_name for s in optuna.get_all_study_summaries(JournalStorage(there))] == ["two"]


def test_set_applies_to_every_trial_and_the_cost_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A quick study without copying the file: --set changes every trial's experiment
    over the file's [overrides]; the planned cost comes first, and after the first trial
    an estimate of the time left."""
    file = write_study(tmp_path, "quick", "n_trials = 2\n" + SHORT_RANDOM_TRIALS + SPACE)
    s = stores(tmp_path)
    argv = ["study", str(file), "--storage", s["storage_url"], "--tracking-uri", s["tracking_uri"]]
    capsys.readouterr()
    assert main([*argv, "--set", "data.train_subset=150", "--set", "search.cycles=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("study quick: 2 trials x 1 seeds = 2 runs of 2 cycles"), lines[0]
    assert lines[1].startswith("trial    0 COMPLETE")
    assert lines[2].startswith("  about ") and "left for 1 more trials" in lines[2], lines[2]
    _, children = runs_of(tmp_path, "quick")
    assert len(children) == 2
    assert main(argv) == 0  # the budget is met: the plan says so, nothing runs
    assert "2 held already, 0 to run" in capsys.readouterr().out.splitlines()[0]
    for run in children:  # the file says cycles = 1 ([overrides]); --set wins
        assert run.data.params["data.train_subset"] == "150"
        assert run.data.params["search.cycles"] == "2"

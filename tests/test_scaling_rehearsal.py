"""The multi-machine set-up of docs/scaling-out.md, rehearsed on one machine.

Real servers, started here: PostgreSQL (the fixture of test_study_postgres.py)
holding both the Optuna study and MLflow's backend store, and ``mlflow server``
on it with proxied artifacts (``--artifacts-destination`` a local folder). Two
``asolab study --workers 2`` invocations play two machines, reaching MLflow only
through ``MLFLOW_TRACKING_URI=http://127.0.0.1:PORT``; one worker is SIGKILLed
in the middle of a trial, as a lost machine would be. Skipped, with the reason,
only where PostgreSQL or its driver is missing.

The two machines are forked from the preloaded server of tests/processes.py (the
rehearsal is about the machines' processes, not their interpreters' start-up); their
workers are the product's own, fresh ``python -m asolab.cli study --worker``
processes, children of the machine as on a real one.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import processes
import psutil
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState
from servers import start_mlflow_server
from test_study_postgres import PASSWORD, Postgres, postgres  # noqa: F401 (the fixture)

import asolab
from asolab.cli import main
from asolab.study.report import TAG_STORAGE, TAG_STUDY_PARENT
from asolab.study.storage import ATTR_MLFLOW_RUN, ATTR_OWNER, ATTR_RETRY_OF
from asolab.tracking import layout as L

N_TRIALS = 4
EXPERIMENT = """
seed = 0
device = "cpu"
threads = 1
[data]
name = "digits"
train_subset = 120
[space]
init_channels = 4
[search]
cycles = 1
w_epochs = 1
alpha_epochs = 1
retrain_epochs = 1
final_epochs = 0
"""
STUDY = f"""
name = "rehearsal"
experiment = "tiny.toml"
n_trials = {N_TRIALS}
[sampler]
name = "random"
[pruner]
name = "none"
[storage]
heartbeat_interval = 1   # a dead worker's trial is stale 3 s after its last beat
grace_period = 3
[params.mutation.strength]
low = 0.0
high = 1.0
"""


@pytest.fixture
def mlflow_server(tmp_path: Path, postgres: Postgres) -> Iterator[str]:  # noqa: F811
    """``mlflow server`` on a PostgreSQL backend store with proxied artifacts; its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as con:
        con.execute(text("CREATE DATABASE mlflow"))
    engine.dispose()
    with start_mlflow_server(postgres.url.rsplit("/", 1)[0] + "/mlflow", tmp_path) as url:
        yield url


def _wait_for_parent_run(client: MlflowClient, machine: processes.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert machine.poll() is None, machine.communicate()[0]
        experiments = [e.experiment_id for e in client.search_experiments()]
        if experiments and client.search_runs(
            experiments, filter_string=f"tags.`{TAG_STUDY_PARENT}` = 'true'"
        ):
            return
        time.sleep(0.5)
    raise AssertionError("the first machine created no parent run")


def _kill_a_worker_mid_trial(machine: processes.Popen, storage: str) -> int:
    """SIGKILL a worker of ``machine`` while a trial it owns runs (its MLflow run
    started); its pid."""
    # One storage for the whole poll: a storage per look opens a connection pool each
    # time, and the pools outlived the looks until the server refused new clients
    # ("too many clients already") on a slow machine.
    rdb = optuna.storages.RDBStorage(storage)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            workers = {p.pid: p for p in psutil.Process(machine.pid).children()}
            try:
                study = optuna.load_study(study_name="rehearsal", storage=rdb)
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            except (KeyError, optuna.exceptions.StorageInternalError):  # not created yet
                running = []
            for t in running:
                if ATTR_MLFLOW_RUN not in t.user_attrs:
                    continue
                pid = int(str(t.user_attrs.get(ATTR_OWNER, ":0")).rsplit(":", 1)[1])
                if pid in workers:
                    workers[pid].send_signal(signal.SIGKILL)
                    return pid
            time.sleep(0.2)
    finally:
        rdb.engine.dispose()
    raise AssertionError("no trial of the first machine's workers was seen running")


@pytest.mark.slow
def test_two_machines_with_two_workers_each_over_http(
    tmp_path: Path,
    postgres: Postgres,  # noqa: F811
    mlflow_server: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    (tmp_path / "tiny.toml").write_text(textwrap.dedent(EXPERIMENT))
    file = tmp_path / "rehearsal.toml"
    file.write_text(textwrap.dedent(STUDY))
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "PYTHONUNBUFFERED": "1"}

    def machine(seed: int) -> processes.Popen:
        cmd = [sys.executable, "-m", "asolab.cli", "study", str(file), "--workers", "2"]
        cmd += ["--storage", postgres.url, "--seed", str(seed)]
        return processes.Popen(
            cmd, cwd=tmp_path, env=env, stdout=processes.PIPE, stderr=processes.STDOUT, text=True
        )

    # As docs/scaling-out.md says: the first machine creates the study and its parent
    # run, then the others join.
    first = machine(1)
    machines = [first]
    try:
        _wait_for_parent_run(MlflowClient(mlflow_server), first)
        machines.append(machine(2))
        _kill_a_worker_mid_trial(first, postgres.url)
        outs = [p.communicate(timeout=300)[0] for p in machines]
    finally:
        for p in machines:
            p.kill()
    assert first.returncode == 2 and "killed by SIGKILL" in outs[0], outs[0]
    assert machines[1].returncode == 0, outs[1]
    # the storage's password is masked wherever a machine names it
    masked = f"storage {postgres.url.split(':')[0]}://asolab:***@127.0.0.1"
    assert "study rehearsal:" in outs[1] and masked in outs[1], outs[1]
    assert not [out for out in outs if PASSWORD in out]

    study = optuna.load_study(study_name="rehearsal", storage=postgres.url)
    trials = study.get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    retries = [t for t in trials if ATTR_RETRY_OF in t.user_attrs]
    assert len(failed) == 1, [(t.number, t.state.name) for t in trials]
    assert [int(t.user_attrs[ATTR_RETRY_OF]) for t in retries] == [failed[0].number]
    assert retries[0].state == TrialState.COMPLETE
    assert retries[0].params == failed[0].params
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == N_TRIALS
    numbers = [t.number for t in trials]
    assert len(set(numbers)) == len(numbers)
    # the samplers of the machines' workers (each its own seed) proposed different points
    # (which workers completed trials is the machines' race, so it is not checked)
    points = [tuple(sorted(t.params.items())) for t in complete]
    assert len(set(points)) == len(points), points

    # Every trial recorded once, all under the one parent run, read over HTTP.
    client = MlflowClient(mlflow_server)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{L.TAG_STUDY}` = 'rehearsal'",
    )
    (parent,) = [r for r in runs if r.data.tags.get(TAG_STUDY_PARENT) == "true"]
    children = [r for r in runs if r is not parent]
    assert all(r.data.tags[L.MLFLOW_PARENT_RUN] == parent.info.run_id for r in children)
    # once each, the killed one included; a complete trial's run says so and holds its value
    assert sorted(int(r.data.tags[L.TAG_TRIAL]) for r in children) == sorted(numbers)
    by_trial = {int(r.data.tags[L.TAG_TRIAL]): r for r in children}
    for t in complete:
        run = by_trial[t.number]
        assert run.info.run_id == t.user_attrs[ATTR_MLFLOW_RUN]
        assert run.data.tags[L.TAG_TRIAL_STATE] == "COMPLETE"
        assert run.data.metrics["objective.val_acc"] == pytest.approx(t.value)
    assert PASSWORD not in parent.data.tags[TAG_STORAGE]
    assert "asolab:***@" in parent.data.tags[TAG_STORAGE]
    assert parent.info.status == "FINISHED"  # by the machine that ended the study
    assert parent.data.metrics["trials.complete"] == len(complete)
    dead = next(r for r in children if int(r.data.tags[L.TAG_TRIAL]) == failed[0].number)
    assert dead.info.status == "KILLED"  # its worker died: marked by the one that found it stale

    # Artifacts and the logged model come back through the server's proxy.
    best = max(
        (r for r in children if r.info.status == "FINISHED"),
        key=lambda r: r.data.metrics.get("val_acc", 0.0),
    )
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    config_file = client.download_artifacts(best.info.run_id, L.CONFIG_ARTIFACT, str(downloads))
    assert '"digits"' in Path(config_file).read_text()
    assert best.info.artifact_uri.startswith("mlflow-artifacts:")  # proxied, not a local path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    model = asolab.load_model(best.info.run_id, tracking_uri=mlflow_server)
    assert model.params == int(best.data.metrics[L.FINAL_PARAMS])

    # compare and baseline work over HTTP.
    capsys.readouterr()
    assert main(["compare", "--study", "rehearsal", "--tracking-uri", mlflow_server]) == 0
    table = capsys.readouterr().out
    assert sum(r.info.run_id[:8] in table for r in children) >= N_TRIALS
    args = ["baseline", best.info.run_id, "--arms", "random-final", "--seeds", "0", "--quiet"]
    assert main([*args, "--tracking-uri", mlflow_server]) == 0
    arms = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{L.TAG_BASELINE_OF}` = '{best.info.run_id}'",
    )
    assert arms and all(r.info.status == "FINISHED" for r in arms)

"""Two machines resume one run at the same instant, through a real ``mlflow server``:
one goes on, the other refuses in one line naming it, and no step is written twice.

The two "machines" are two long-lived processes with their own temp folders (so no
lock file is shared: only the server is), each told to resume the same run at the
same instant, ten times over. The winner of each race resumes for real, writes one
new epoch and stops (Ctrl-C), leaving the run resumable for the next race; the last
winner finishes it. One server, one run, two processes (forked from the preloaded server
of tests/processes.py: separate processes, pids, temp folders and connections, without
each re-importing torch, MLflow and Optuna).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import processes
import pytest
from mlflow import MlflowClient
from servers import start_mlflow_server

import asolab
from asolab.config import PROJECT_ROOT
from asolab.runner.events import Observer
from asolab.tracking import layout as L

RACES = 10
CONFIG = {
    "seed": 3,
    "threads": 1,
    "device": "cpu",
    "space.init_channels": 4,
    "space.steps": 1,
    "search.cycles": 1,
    # 11 epochs: one before the races, one more at each race (our observer stops an epoch
    # before the tracker records it), the last race finishes the run
    "search.w_epochs": 4,
    "search.alpha_epochs": 4,
    "search.retrain_epochs": 3,
    "search.final_epochs": 0,
    "search.calibration_batches": 0,
    "search.checkpoint_minutes": 0,
    "data.train_subset": 48,
    "data.batch_size": 16,
    "growth.policy": "none",
    "tracking.log_models": False,
}

# One "machine": resumes the run it is told to at the instant it is told, stops at the
# epoch it is told (Ctrl-C), and says what happened, one line "RACE {json}" per race
# (MLflow prints lines of its own).
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from asolab import api
    from asolab.runner.events import Observer
    from asolab.tracking.store import TrackingError

    class Stop(Observer):
        def __init__(self, epoch):
            self.epoch = epoch
        def on_epoch_end(self, event):
            if event.global_epoch == self.epoch:
                raise KeyboardInterrupt

    print("RACE " + json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        run_id, uri, at, stop = json.loads(line)
        time.sleep(max(0.0, at - time.time()))
        observers = [Stop(stop)] if stop >= 0 else []
        try:
            api.run(resume=run_id, tracking_uri=uri, observers=observers)
            out = {"ran": "finished"}
        except KeyboardInterrupt:
            out = {"ran": "stopped"}
        except TrackingError as exc:
            out = {"refused": str(exc)}
        print("RACE " + json.dumps({"pid": os.getpid(), **out}), flush=True)
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """``mlflow server`` on a SQLite backend with proxied artifacts; its URL."""
    where = tmp_path_factory.mktemp("race-server")
    with start_mlflow_server(f"sqlite:///{where / 'mlflow.db'}", where) as url:
        yield url


class _StopAt(Observer):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, event) -> None:
        if event.global_epoch == self.epoch:
            raise KeyboardInterrupt


def _machine(tmp_path: Path, name: str) -> processes.Popen:
    tmp = tmp_path / name
    tmp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(tmp),  # its own temp folder: no lock file in common with the other
        "PYTHONPATH": str(PROJECT_ROOT / "platform"),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    proc = processes.Popen(
        [sys.executable, "-c", WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert "ready" in _said(proc)
    return proc


def _said(proc: processes.Popen) -> dict:
    """The machine's next report."""
    while True:
        line = proc.stdout.readline()
        assert line, f"machine {proc.pid} exited ({proc.poll()})"
        if line.startswith("RACE "):
            return json.loads(line[len("RACE ") :])


@pytest.mark.slow
def test_two_machines_resuming_one_run_at_once_one_refuses_and_no_step_is_written_twice(
    server, tmp_path
):
    with pytest.raises(KeyboardInterrupt):  # killed after its first epoch is recorded
        asolab.run("digits", CONFIG, tracking_uri=server, observers=[_StopAt(1)])
    client = MlflowClient(server)
    (run,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    run_id = run.info.run_id
    machines = [_machine(tmp_path, "a"), _machine(tmp_path, "b")]
    outcomes = []
    try:
        for race in range(RACES):
            last = race == RACES - 1  # the last one finishes the run
            # both start at one instant, 0.3 s on: time enough for both to read the order
            order = json.dumps([run_id, server, time.time() + 0.3, -1 if last else race + 2])
            for m in machines:
                m.stdin.write(order + "\n")
                m.stdin.flush()
            said = [_said(m) for m in machines]
            ran = [s for s in said if "ran" in s]
            refused = [s for s in said if "refused" in s]
            outcomes.append(said)
            assert len(ran) == 1 and len(refused) == 1, said
            line = refused[0]["refused"]
            assert "\n" not in line and f"process {ran[0]['pid']}" in line, said
            assert ran[0]["ran"] == ("finished" if last else "stopped"), said
    finally:
        for m in machines:
            m.stdin.close()
            m.wait(timeout=60)

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))
    assert [m.step for m in client.get_metric_history(run_id, L.VAL_ACC)] == list(range(11))
    assert int(run.data.tags[L.TAG_RESUMED]) == RACES
    winners = [next(s["pid"] for s in said if "ran" in s) for said in outcomes]
    print(f"{RACES} races: winners by pid {winners}")

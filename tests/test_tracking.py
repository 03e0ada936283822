"""MLflow tracking against a real SQLite store: what a run records, resume after
SIGKILL, an unreachable server, run states and ``asolab ui``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import mlflow.pytorch
import pytest
import torch
from asolab.cli import main
from asolab.config import PROJECT_ROOT, load
from asolab.runner import Runner
from asolab.runner.events import Observer, Recorder
from asolab.space.genotype import Genotype
from asolab.space.network import extract
from asolab.tracking import (
    MlflowTracker,
    TrackingError,
    check_reachable,
    default_tracking_uri,
    resolve_tracking_uri,
)
from asolab.tracking import layout as L
from mlflow import MlflowClient

# Tiny but complete: 2 cycles of every phase, growth in each mutation, 1 final epoch.
TINY = [
    "seed=3",
    "device=cpu",
    "threads=1",
    "search.cycles=2",
    "search.w_epochs=2",
    "search.alpha_epochs=1",
    "search.retrain_epochs=1",
    "search.final_epochs=1",
    "space.init_channels=4",
    "data.train_subset=192",
    "growth.policy=widen",
]
TOTAL_EPOCHS = 2 * (2 + 1 + 1) + 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_args(overrides: list[str]) -> list[str]:
    out: list[str] = []
    for o in overrides:
        out += ["--set", o]
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlruns")
    return f"sqlite:///{root / 'mlflow.db'}"


@pytest.fixture(scope="module")
def tracked(store, tmp_path_factory):
    """One uninterrupted tiny run, tracked; the reference for the resume test."""
    cfg = load(None, TINY)
    recorder = Recorder()
    tracker = MlflowTracker(tracking_uri=store, experiment="tracking-test")
    runner = Runner(cfg, [recorder, tracker], checkpoint_dir=tmp_path_factory.mktemp("ckpt"))
    result = runner.run()
    return {"cfg": cfg, "recorder": recorder, "tracker": tracker, "runner": runner, "result": result}


def _history(client: MlflowClient, run_id: str, key: str) -> list:
    return sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)


def _json_artifact(client: MlflowClient, run_id: str, path: str, tmp: Path):
    return json.loads(Path(client.download_artifacts(run_id, path, str(tmp))).read_text())


def test_run_records_everything(tracked, store, tmp_path):
    client = MlflowClient(store)
    tracker, recorder, cfg = tracked["tracker"], tracked["recorder"], tracked["cfg"]
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "tracking-test"
    # artifacts land beside the database, not in ./mlartifacts
    assert Path(store[len("sqlite:///"):]).parent.as_uri() in run.info.artifact_uri
    assert run.info.run_name.startswith("digits-seed3-") and tracker.run_id[:8] in run.info.run_name

    tags = run.data.tags
    for key in (L.TAG_VERSION, L.TAG_GIT_COMMIT, L.TAG_DEVICE, L.TAG_HOST):
        assert tags.get(key), key
    assert tags[L.TAG_DATASET] == "digits" and tags[L.TAG_DEVICE] == "cpu"

    # the whole resolved config, as params and as config.json
    flat = cfg.flat()
    assert set(run.data.params) == set(flat)
    assert run.data.params["search.cycles"] == "2" and run.data.params["growth.policy"] == "widen"
    assert _json_artifact(client, tracker.run_id, L.CONFIG_ARTIFACT, tmp_path) == cfg.to_dict()

    # the data set as a dataset input
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "digits" and inp.dataset.digest
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == L.DATASET_CONTEXT

    # per epoch: one value per step 0..N-1 for every epoch metric
    for key in L.EPOCH_METRICS:
        steps = [m.step for m in _history(client, tracker.run_id, key)]
        assert steps == list(range(TOTAL_EPOCHS)), key
    epochs = recorder.of("epoch_end")
    assert [m.value for m in _history(client, tracker.run_id, "val_acc")] == pytest.approx([e.val_acc for e in epochs])
    assert [m.value for m in _history(client, tracker.run_id, "phase_index")] == [L.PHASE_INDEX[e.phase] for e in epochs]

    # per cycle: genotypes equal to the runner's, pictures, parameters, memory, mutation, growth
    cycles = recorder.of("cycle_end")
    assert len(cycles) == 2
    for ev in cycles:
        g = Genotype.from_json(Path(client.download_artifacts(tracker.run_id, L.genotype_artifact(ev.cycle), str(tmp_path))).read_text())
        assert g == ev.genotype
        png = Path(client.download_artifacts(tracker.run_id, L.cells_artifact(ev.cycle), str(tmp_path))).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        mutation = _json_artifact(client, tracker.run_id, L.mutation_artifact(ev.cycle), tmp_path)
        (mev,) = [m for m in recorder.of("mutation") if m.cycle == ev.cycle]
        assert len(mutation["edits"]) == len(mev.edits) and Genotype.from_dict(mutation["after"]) == mev.after
    for key in ("cycle_val_acc", "supernet_params", "derived_params", "rss_mb", "peak_rss_mb", "mutation_edits"):
        hist = _history(client, tracker.run_id, key)
        assert [m.step for m in hist][:2] == [c.global_epoch for c in cycles], key
    assert [m.value for m in _history(client, tracker.run_id, "derived_params")][:2] == [c.derived_params for c in cycles]
    assert tags[L.TAG_GENOTYPE] == str(tracked["result"].genotype)

    growth = recorder.of("growth")
    assert growth, "growth.policy=widen should grow the network"
    record = _json_artifact(client, tracker.run_id, L.growth_artifact(growth[0].cycle), tmp_path)
    assert record[0]["kind"] == growth[0].kind and record[0]["params_after"] == growth[0].params_after
    errors = _history(client, tracker.run_id, "growth_preservation_error")
    assert errors and errors[0].value == pytest.approx(max(g.preservation_error for g in growth if g.cycle == growth[0].cycle))

    # checkpoint, final genotype, test accuracy, parameter count
    assert [f.path for f in client.list_artifacts(tracker.run_id, L.CHECKPOINT_DIR)] == [L.CHECKPOINT_ARTIFACT]
    end = recorder.of("run_end")[-1]
    assert Genotype.from_json(Path(client.download_artifacts(tracker.run_id, L.FINAL_GENOTYPE_ARTIFACT, str(tmp_path))).read_text()) == end.genotype
    assert tags[L.TAG_FINAL_GENOTYPE] == str(end.genotype)
    assert run.data.metrics["test_acc"] == pytest.approx(end.test_acc)
    assert run.data.metrics["final_params"] == end.derived_params
    assert run.data.metrics["final_peak_rss_mb"] == pytest.approx(end.memory["peak_rss_mb"])

    # the final model loads back with the documented call and computes what the runner's network computes
    mlflow.set_tracking_uri(store)
    try:
        model = mlflow.pytorch.load_model(f"runs:/{tracker.run_id}/{L.MODEL_NAME}")
    finally:
        mlflow.set_tracking_uri(None)
    x = tracked["runner"].data.test.x[:8].cpu()
    with torch.no_grad():
        expected = extract(tracked["runner"].net, end.genotype)(x)
        assert torch.allclose(model(x), expected, atol=1e-5)
    assert tags[L.TAG_MODEL_URI].startswith("models:/")


def test_sigkill_then_resume_is_exactly_once(tracked, store, tmp_path):
    """Kill -9 after the second checkpoint (mid-cycle), resume: same run, no step lost or doubled."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = ["run", "--quiet", "--experiment", "resume-test", *_set_args([*TINY, f"tracking.tracking_uri={store}"])]
    proc = subprocess.Popen([sys.executable, "-m", "asolab.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = MlflowClient(store)
    run_id = None
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            exp = client.get_experiment_by_name("resume-test")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if runs and runs[0].data.tags.get(L.TAG_PHASE, "").endswith("after alpha"):
                time.sleep(0.5)  # let the checkpoint upload finish and retraining begin
                run_id = runs[0].info.run_id
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert run_id is not None, "the run never reached its second checkpoint"
    killed = client.get_run(run_id)
    assert killed.info.status == "RUNNING"  # SIGKILL leaves no chance to close it
    assert L.TAG_FINAL_GENOTYPE not in killed.data.tags

    assert main(["run", "--quiet", "--resume", run_id, "--set", f"tracking.tracking_uri={store}"]) == 0

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[L.TAG_RESUMED] == "1"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {sorted(steps)}"
    assert sorted(m.step for m in client.get_metric_history(run_id, "train_loss")) == list(range(TOTAL_EPOCHS))
    assert sorted(m.step for m in client.get_metric_history(run_id, "cycle_val_acc")) == [c.global_epoch for c in tracked["recorder"].of("cycle_end")]
    reference = tracked["result"].genotype
    assert run.data.tags[L.TAG_FINAL_GENOTYPE] == str(reference)
    ref_val = [m.value for m in _history(MlflowClient(store), tracked["tracker"].run_id, "val_acc")]
    assert [m.value for m in _history(client, run_id, "val_acc")] == pytest.approx(ref_val)


def test_unreachable_server_fails_before_training(monkeypatch, capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    started = []
    monkeypatch.setattr(Runner, "run", lambda self: started.append(self))
    assert main(["run", "--quiet", "--set", f"tracking.tracking_uri={url}", "--set", "search.cycles=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert started == []
    assert len(err.splitlines()) == 1 and err.startswith("asolab: error:") and url in err and "--no-track" in err
    with pytest.raises(TrackingError, match="not reachable"):
        check_reachable(url)
    with pytest.raises(TrackingError, match="file store"):
        check_reachable("file:///tmp/mlruns")


def test_uri_resolution(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri() == f"sqlite:///{PROJECT_ROOT / 'mlruns' / 'mlflow.db'}"
    assert resolve_tracking_uri() == default_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert resolve_tracking_uri() == "http://tracking.example:5000"
    assert resolve_tracking_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"


class _Raise(Observer):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def on_epoch_end(self, event) -> None:
        raise self.exc


class TrialPruned(Exception):
    """Stands in for optuna.TrialPruned: the tracker goes by the class name."""


@pytest.mark.parametrize(
    "exc, status",
    [(KeyboardInterrupt(), "KILLED"), (RuntimeError("boom\nsecond line"), "FAILED"), (TrialPruned("pruned at 0"), "FINISHED")],
)
def test_run_states(exc, status, store, tmp_path):
    cfg = load(None, [*TINY, "search.cycles=1", "growth.policy=none"])
    tracker = MlflowTracker(tracking_uri=store, experiment="states", tags={"asolab.note": "x"}, log_models=False)
    with pytest.raises(type(exc)):
        Runner(cfg, [tracker, _Raise(exc)], checkpoint_dir=tmp_path).run()
    run = MlflowClient(store).get_run(tracker.run_id)
    assert run.info.status == status
    assert run.data.tags["asolab.note"] == "x"
    assert [m.step for m in MlflowClient(store).get_metric_history(tracker.run_id, "train_loss")] == [0]  # logged so far is kept
    if status == "FAILED":
        assert run.data.tags[L.TAG_ERROR] == "RuntimeError: boom second line"
    else:
        assert L.TAG_ERROR not in run.data.tags


def test_ui_serves_the_store(tracked, store):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "asolab.cli", "ui", "--port", str(port), "--tracking-uri", store],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, ok = time.time() + 120, False
        while time.time() < deadline and proc.poll() is None and not ok:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    ok = r.status == 200
            except OSError:
                time.sleep(0.5)
        assert ok, f"mlflow server did not come up on {base}"
        exp_id = MlflowClient(store).get_experiment_by_name("tracking-test").experiment_id
        req = urllib.request.Request(
            base + "/api/2.0/mlflow/runs/search",
            data=json.dumps({"experiment_ids": [exp_id]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            runs = json.loads(r.read())["runs"]
        assert tracked["tracker"].run_id in [r["info"]["run_id"] for r in runs]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert f"http://127.0.0.1:{port}" in out
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/health", timeout=2)

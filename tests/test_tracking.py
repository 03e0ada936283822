"""MLflow tracking against a real SQLite store: what a run records, resume after
SIGKILL, an unreachable server, run states and ``asolab ui``."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import optuna
import processes
import pytest
import torch
from layout_check import undeclared
from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus
from ports import free_port

from asolab.cli import main, resume_command
from asolab.config import PROJECT_ROOT, load
from asolab.runner import Runner
from asolab.runner import checkpoint as ckpt
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
from asolab.tracking.store import RunNotFound, ensure_experiment, find_run

# One worker builds the module's store and tracked run (--dist loadgroup), not both.
pytestmark = pytest.mark.xdist_group("tracking")

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
    "search.checkpoint_minutes=0",  # a checkpoint after every phase: stop and resume anywhere
]
TOTAL_EPOCHS = 2 * (2 + 1 + 1) + 1


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
    return {
        "cfg": cfg,
        "recorder": recorder,
        "tracker": tracker,
        "runner": runner,
        "result": result,
    }


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
    assert Path(store[len("sqlite:///") :]).parent.as_uri() in run.info.artifact_uri
    assert run.info.run_name.startswith("digits-seed3-") and tracker.run_id[:8] in run.info.run_name

    assert (
        undeclared(client, tracker.run_id, cfg.flat()) == []
    )  # every name is in tracking/layout.py

    tags = run.data.tags
    for key in (L.TAG_VERSION, L.TAG_GIT_COMMIT, L.TAG_DEVICE, L.TAG_HOST):
        assert tags.get(key), key
    assert tags[L.TAG_DATASET] == "digits" and tags[L.TAG_DEVICE] == "cpu"
    assert tags[L.TAG_THREADS] == "1 (set)" and run.data.params["threads"] == "1"

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
    assert [m.value for m in _history(client, tracker.run_id, "val_acc")] == pytest.approx(
        [e.val_acc for e in epochs]
    )
    assert [m.value for m in _history(client, tracker.run_id, "phase_index")] == [
        L.PHASE_INDEX[e.phase] for e in epochs
    ]

    # per cycle: genotypes equal to the runner's, pictures, parameters, memory, mutation, growth
    cycles = recorder.of("cycle_end")
    assert len(cycles) == 2
    for ev in cycles:
        g = Genotype.from_json(
            Path(
                client.download_artifacts(
                    tracker.run_id, L.genotype_artifact(ev.cycle), str(tmp_path)
                )
            ).read_text()
        )
        assert g == ev.genotype
        png = Path(
            client.download_artifacts(tracker.run_id, L.cells_artifact(ev.cycle), str(tmp_path))
        ).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        mutation = _json_artifact(client, tracker.run_id, L.mutation_artifact(ev.cycle), tmp_path)
        (mev,) = [m for m in recorder.of("mutation") if m.cycle == ev.cycle]
        assert (
            len(mutation["edits"]) == len(mev.edits)
            and Genotype.from_dict(mutation["after"]) == mev.after
        )
    for key in (
        "cycle_val_acc",
        "cycle_val_loss",
        "supernet_params",
        "derived_params",
        "rss_mb",
        "peak_rss_mb",
        "mutation_edits",
        "alpha_entropy",
    ):
        hist = _history(client, tracker.run_id, key)
        assert [m.step for m in hist] == [c.global_epoch for c in cycles], key
    per_cycle = {
        "derived_params": [c.derived_params for c in cycles],
        "supernet_params": [c.supernet_params for c in cycles],
        "cycle_val_loss": [c.val_loss for c in cycles],
        "mutation_edits": [c.mutation_edits for c in cycles],
        "alpha_entropy": [c.alpha_entropy for c in cycles],
    }
    for key, expected in per_cycle.items():
        assert [m.value for m in _history(client, tracker.run_id, key)] == pytest.approx(
            expected
        ), key
    assert [c.mutation_edits for c in cycles] == [len(m.edits) for m in recorder.of("mutation")]
    # growth metrics at the end of every cycle that grew, from the cycle's own growth events
    grown = [c for c in cycles if c.growth]
    assert grown, "growth.policy=widen should grow the network"
    growth_metrics = {
        "growth_events": [len(c.growth) for c in grown],
        "growth_preservation_error": [max(g.preservation_error for g in c.growth) for c in grown],
        "growth_params_after": [c.growth[-1].params_after for c in grown],
    }
    for key, expected in growth_metrics.items():
        hist = _history(client, tracker.run_id, key)
        assert [m.step for m in hist] == [c.global_epoch for c in grown], key
        assert [m.value for m in hist] == pytest.approx(expected), key
    assert tags[L.TAG_GENOTYPE] == str(tracked["result"].genotype)

    growth = recorder.of("growth")
    assert growth, "growth.policy=widen should grow the network"
    record = _json_artifact(client, tracker.run_id, L.growth_artifact(growth[0].cycle), tmp_path)
    assert (
        record[0]["kind"] == growth[0].kind and record[0]["params_after"] == growth[0].params_after
    )
    errors = _history(client, tracker.run_id, "growth_preservation_error")
    assert errors and errors[0].value == pytest.approx(
        max(g.preservation_error for g in growth if g.cycle == growth[0].cycle)
    )

    # checkpoint, final genotype, test accuracy, parameter count
    assert [f.path for f in client.list_artifacts(tracker.run_id, L.CHECKPOINT_DIR)] == [
        L.CHECKPOINT_ARTIFACT
    ]
    end = recorder.of("run_end")[-1]
    assert (
        Genotype.from_json(
            Path(
                client.download_artifacts(tracker.run_id, L.FINAL_GENOTYPE_ARTIFACT, str(tmp_path))
            ).read_text()
        )
        == end.genotype
    )
    assert tags[L.TAG_FINAL_GENOTYPE] == str(end.genotype)
    assert run.data.metrics["test_acc"] == pytest.approx(end.test_acc)
    assert run.data.metrics["final_params"] == end.derived_params
    assert run.data.metrics["final_peak_rss_mb"] == pytest.approx(end.memory["peak_rss_mb"])
    finals = {
        "test_loss": end.test_loss,
        "final_val_acc": end.val_acc,
        "final_val_loss": end.val_loss,
        "final_supernet_params": end.supernet_params,
        "run_seconds": end.seconds,
    }
    for key, expected in finals.items():
        (metric,) = client.get_metric_history(tracker.run_id, key)
        assert (metric.step, metric.value) == (TOTAL_EPOCHS, pytest.approx(expected)), key
    assert 0 < end.seconds < 600

    # the stored checkpoint is the one after the final stage: it holds the trained final network
    assert tags[L.TAG_PHASE] == "after final stage"
    state = ckpt.load(
        client.download_artifacts(tracker.run_id, L.CHECKPOINT_ARTIFACT, str(tmp_path))
    )
    assert (
        state["position"]["cycle"] == cfg.search.cycles
        and state["position"]["global_epoch"] == TOTAL_EPOCHS
    )
    assert Genotype.from_json(state["genotype"]) == end.genotype
    net = tracked["runner"].net.state_dict()
    assert all(torch.equal(state["model"][k], v.cpu()) for k, v in net.items())

    # the final model loads back with the documented call and computes what the runner's
    # network computes
    mlflow.set_tracking_uri(store)
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{tracker.run_id}/{L.MODEL_NAME}")
    finally:
        mlflow.set_tracking_uri(None)
    x = tracked["runner"].data.test.x[:8].cpu()
    with torch.no_grad():
        expected = extract(tracked["runner"].net, end.genotype)(x)
        network = model.get_raw_model().network  # no pickle: built from the spec
        assert torch.allclose(network(x), expected, atol=1e-5)
    assert tags[L.TAG_MODEL_URI].startswith("models:/")
    # the logged model carries the run's final figures (the UI's Models tab shows them)
    logged = client.get_logged_model(tags[L.TAG_MODEL_URI].removeprefix("models:/"))
    linked = {m.key: m.value for m in logged.metrics or []}
    assert (
        linked["test_acc"] == pytest.approx(end.test_acc)
        and linked["final_params"] == end.derived_params
    )
    assert {m.step for m in logged.metrics} == {TOTAL_EPOCHS}
    assert logged.source_run_id == tracker.run_id and logged.status == LoggedModelStatus.READY
    outputs = client.get_run(tracker.run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(logged.model_id, TOTAL_EPOCHS)]


def _steps(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    run = client.get_run(run_id)
    return {
        key: sorted(m.step for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }


def test_sigkill_in_retraining_then_resume_is_exactly_once(tracked, store, tmp_path):
    """kill -9 in mid-cycle (cycle 0's retraining), resume: the same run, with exactly
    the metric steps of an uninterrupted run, none lost, none doubled."""
    run_id = _killed_run(store, tmp_path, "resume-test", "epoch:0:retrain")
    client = MlflowClient(store)
    killed = client.get_run(run_id)
    assert killed.data.tags[L.TAG_PHASE] == "cycle 0 / after mutate"  # where it was killed
    assert L.TAG_FINAL_GENOTYPE not in killed.data.tags
    assert "cycle_val_acc" not in killed.data.metrics  # cycle 0 had not ended

    # the command a stopped run prints, with the store spelled out (not the default one)
    command = resume_command(None, run_id, store)
    assert main([*shlex.split(command)[1:], "--quiet"]) == 0

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[L.TAG_RESUMED] == "1"
    retrain0 = next(
        e for e in tracked["recorder"].of("epoch_end") if (e.cycle, e.phase) == (0, "retrain")
    )
    assert (
        run.data.tags[L.TAG_RESUMED_FROM]
        == f"cycle 0 / before retrain (epoch {retrain0.global_epoch})"
    )
    assert len(client.search_runs([run.info.experiment_id])) == 1
    # every metric of the uninterrupted run, at exactly its steps (duplicates would show)
    reference = _steps(client, tracked["tracker"].run_id)
    assert {
        "mutation_edits",
        "growth_events",
        "growth_preservation_error",
        "growth_params_after",
    } <= set(reference)
    assert _steps(client, run_id) == reference
    assert run.data.tags[L.TAG_FINAL_GENOTYPE] == str(tracked["result"].genotype)
    ref_val = [m.value for m in _history(client, tracked["tracker"].run_id, "val_acc")]
    assert [m.value for m in _history(client, run_id, "val_acc")] == pytest.approx(ref_val)
    for key in (
        "mutation_edits",
        "growth_preservation_error",
        "growth_params_after",
        "cycle_val_acc",
    ):
        ref = [m.value for m in _history(client, tracked["tracker"].run_id, key)]
        assert [m.value for m in _history(client, run_id, key)] == pytest.approx(ref), key
    # the growth artifact of the killed cycle is complete too
    (ref_growth,) = [c.growth for c in tracked["recorder"].of("cycle_end") if c.cycle == 0]
    record = _json_artifact(client, run_id, L.growth_artifact(0), tmp_path)
    assert [(g["kind"], g["params_after"]) for g in record] == [
        (g.kind, g.params_after) for g in ref_growth
    ]


# The default checkpoint interval: only cycle ends (and the final stage) upload at once.
DEFAULT_INTERVAL = [o for o in TINY if not o.startswith("search.checkpoint_minutes")]


def test_by_default_a_sigkill_goes_back_to_the_last_cycle_end_and_replays_exactly(
    tracked, store, tmp_path
):
    """With search.checkpoint_minutes at its default, the phases inside a cycle are not
    uploaded: kill -9 in cycle 1's retraining leaves cycle 0's end as the store's
    checkpoint, and the resume replays cycle 1 to exactly the uninterrupted run."""
    run_id = _killed_run(store, tmp_path, "interval-test", "epoch:1:retrain", DEFAULT_INTERVAL)
    client = MlflowClient(store)
    assert client.get_run(run_id).data.tags[L.TAG_PHASE] == "cycle 0 / after retrain"
    assert _resume(run_id, store) == 0
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[L.TAG_RESUMED_FROM].startswith("cycle 1 / before w_train")
    reference = tracked["tracker"].run_id
    assert _steps(client, run_id) == _steps(client, reference)
    for key in ("val_acc", "train_loss", "cycle_val_acc", "growth_params_after", "test_acc"):
        ref = [m.value for m in _history(client, reference, key)]
        assert [m.value for m in _history(client, run_id, key)] == pytest.approx(ref), key
    assert run.data.tags[L.TAG_FINAL_GENOTYPE] == str(tracked["result"].genotype)


@pytest.mark.parametrize(
    "signum, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"]
)
def test_a_signal_stops_a_run_like_ctrl_c(tracked, store, tmp_path, signum, status):
    """SIGTERM (a scheduler's time limit) or SIGHUP (the terminal closed, an ssh connection
    dropped) inside a cycle: the run uploads its latest phase end, ends KILLED with status
    128 + the signal and the resume command, printed and recorded; the resume is exact."""
    name = f"{signal.Signals(signum).name.lower()}-test"
    proc = _frozen_run(store, tmp_path, name, "epoch:1:retrain", DEFAULT_INTERVAL, subprocess.PIPE)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-2000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert run.info.status == "KILLED"
    assert run.data.tags[L.TAG_PHASE] == "cycle 1 / after mutate"
    assert f"--resume {run.info.run_id}" in err
    assert f"--resume {run.info.run_id}" in run.data.tags[L.TAG_RESUME_COMMAND]
    assert _resume(run.info.run_id, store) == 0
    resumed = client.get_run(run.info.run_id)
    assert resumed.data.tags[L.TAG_RESUMED_FROM].startswith("cycle 1 / before retrain")
    assert _steps(client, run.info.run_id) == _steps(client, tracked["tracker"].run_id)


def test_an_interrupted_run_uploads_its_latest_phase_end(tracked, store, tmp_path):
    """An error (or Ctrl-C) inside a cycle still gives the store the checkpoint of the
    last finished phase, not only the last cycle's: the resume starts there."""

    class Fails(Recorder):
        def on_epoch_end(self, event):
            if (event.cycle, event.phase) == (1, "retrain"):
                raise RuntimeError("disk full")

    tracker = MlflowTracker(tracking_uri=store, experiment="interrupted-upload-test")
    cfg = load(None, DEFAULT_INTERVAL)
    with pytest.raises(RuntimeError, match="disk full"):
        Runner(cfg, [tracker, Fails()], checkpoint_dir=tmp_path / "ckpt").run()
    client = MlflowClient(store)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[L.TAG_PHASE] == "cycle 1 / after mutate"
    assert _resume(tracker.run_id, store) == 0
    run = client.get_run(tracker.run_id)
    assert run.data.tags[L.TAG_RESUMED_FROM].startswith("cycle 1 / before retrain")
    assert _steps(client, tracker.run_id) == _steps(client, tracked["tracker"].run_id)


def test_resuming_a_finished_run_is_refused(tracked, store, capsys):
    client = MlflowClient(store)
    run_id = tracked["tracker"].run_id
    before = _steps(client, run_id)
    assert (
        main(["run", "--quiet", "--resume", run_id, "--set", f"tracking.tracking_uri={store}"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and err.startswith("asolab: error:")
        and "FINISHED" in err
        and run_id in err
    )
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and L.TAG_RESUMED not in run.data.tags
    assert _steps(client, run_id) == before


def test_resume_command_names_the_file_and_the_store():
    assert resume_command(None, "abc", default_tracking_uri()) == "asolab run --resume abc"
    assert (
        resume_command("experiments/x y.toml", "abc", "sqlite:////tmp/m.db")
        == "asolab run 'experiments/x y.toml' --resume abc --set tracking.tracking_uri=sqlite:////tmp/m.db"
    )


def test_a_run_is_found_by_its_id_an_id_prefix_or_its_name(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("find-run")
    one, twin_a, twin_b = (client.create_run(exp, run_name=n) for n in ("one", "twin", "twin"))
    rid = one.info.run_id
    for ref in (rid, rid[:8], rid[:4], f" {rid[:8]} ", "one"):
        assert find_run(client, ref).info.run_id == rid
    with pytest.raises(RunNotFound, match=r"^run 'zz' not found in the tracking store$"):
        find_run(client, "zz")
    with pytest.raises(RunNotFound, match="give the full id") as err:
        find_run(client, "twin", "store X")
    assert "'twin' names 2 runs in store X" in str(err.value)
    assert twin_a.info.run_id in str(err.value) and twin_b.info.run_id in str(err.value)


def test_resume_looks_in_the_given_store_only(store, capsys, monkeypatch):
    """A run of another store is not found in the default one: the error says how to point at it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    other = store.replace("mlflow.db", "other.db")
    MlflowClient(other).search_experiments()  # an existing, empty store
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "--quiet",
                "--resume",
                "0123456789abcdef",
                "--set",
                f"tracking.tracking_uri={other}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "not found in tracking store" in err
        and "tracking.tracking_uri" in err
    )


def test_unreachable_server_fails_before_training(monkeypatch, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    started = []
    monkeypatch.setattr(Runner, "run", lambda self: started.append(self))
    assert (
        main(
            ["run", "--quiet", "--set", f"tracking.tracking_uri={url}", "--set", "search.cycles=1"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert started == []
    assert (
        len(err.splitlines()) == 1
        and err.startswith("asolab: error:")
        and url in err
        and "--no-track" in err
    )
    with pytest.raises(TrackingError, match="not reachable"):
        check_reachable(url)
    with pytest.raises(TrackingError, match="file store"):
        check_reachable("file:///tmp/mlruns")


def test_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(PROJECT_ROOT)  # the quick start's store: mlruns/ of the checkout
    assert default_tracking_uri() == f"sqlite:///{PROJECT_ROOT / 'mlruns' / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)  # an installed asolab, run from any folder
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert resolve_tracking_uri() == default_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert resolve_tracking_uri() == "http://tracking.example:5000"
    assert resolve_tracking_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"


class _Raise(Observer):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def on_epoch_end(self, event) -> None:
        raise self.exc


@pytest.mark.parametrize(
    "exc, status",
    [
        (KeyboardInterrupt(), "KILLED"),
        (RuntimeError("boom\nsecond line"), "FAILED"),
        (optuna.TrialPruned("pruned at 0"), "FINISHED"),
    ],
)
def test_run_states(exc, status, store, tmp_path):
    cfg = load(None, [*TINY, "search.cycles=1", "growth.policy=none"])
    tracker = MlflowTracker(
        tracking_uri=store, experiment="states", tags={"asolab.note": "x"}, log_models=False
    )
    with pytest.raises(type(exc)):
        Runner(cfg, [tracker, _Raise(exc)], checkpoint_dir=tmp_path).run()
    run = MlflowClient(store).get_run(tracker.run_id)
    assert run.info.status == status
    assert run.data.tags["asolab.note"] == "x"
    assert [
        m.step for m in MlflowClient(store).get_metric_history(tracker.run_id, "train_loss")
    ] == [0]  # logged so far is kept
    if status == "FAILED":
        assert run.data.tags[L.TAG_ERROR] == "RuntimeError: boom"  # its first line
    else:
        assert L.TAG_ERROR not in run.data.tags


def test_a_failure_right_after_the_run_was_created_closes_it(store, tmp_path):
    class FailOnStart(Observer):
        def on_run_start(self, event) -> None:
            raise RuntimeError("progress display broke")

    cfg = load(None, [*TINY, "search.cycles=1", "growth.policy=none"])
    tracker = MlflowTracker(tracking_uri=store, experiment="states", log_models=False)
    with pytest.raises(RuntimeError):
        Runner(cfg, [tracker, FailOnStart()], checkpoint_dir=tmp_path).run()
    run = MlflowClient(store).get_run(tracker.run_id)
    assert run.info.status == "FAILED"  # not RUNNING forever
    assert run.data.tags[L.TAG_ERROR] == "RuntimeError: progress display broke"


class _CtrlCTwice(Observer):
    """Ctrl-C in the first epoch, and a second one while the tracker waits for its uploads."""

    def __init__(self, tracker: MlflowTracker) -> None:
        self.tracker = tracker

    def on_epoch_end(self, event) -> None:
        main_thread = threading.main_thread().ident

        def second_ctrl_c() -> None:
            # Queued on the tracker's own thread, so the drain waits for this job; it
            # sends SIGINT once the main thread is inside that drain.
            deadline = time.time() + 60
            while time.time() < deadline:
                frame, names = sys._current_frames().get(main_thread), set()
                while frame is not None:
                    names.add(frame.f_code.co_name)
                    frame = frame.f_back
                if {"drain", "on_run_interrupted"} <= names:
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.01)

        self.tracker._writer.submit(second_ctrl_c)
        raise KeyboardInterrupt


def test_a_second_ctrl_c_while_uploads_drain_still_ends_the_run_killed(store, tmp_path):
    cfg = load(None, [*TINY, "search.cycles=1", "growth.policy=none"])
    # Uploads drain only when they run on the tracker's thread (a remote store's mode).
    tracker = MlflowTracker(
        tracking_uri=store, experiment="states", log_models=False, write_mode="thread"
    )
    with pytest.raises(KeyboardInterrupt):
        Runner(cfg, [tracker, _CtrlCTwice(tracker)], checkpoint_dir=tmp_path).run()
    assert MlflowClient(store).get_run(tracker.run_id).info.status == "KILLED"


class _CtrlCInsideAWrite(MlflowTracker):
    """Ctrl-C lands while the first batch of epoch metrics is being written (inline)."""

    hit = False

    def _write_batch(self, metrics, tags) -> None:
        if not self.hit and any(m.key == "train_loss" for m in metrics):
            self.hit = True
            raise KeyboardInterrupt
        super()._write_batch(metrics, tags)


def test_ctrl_c_inside_an_inline_metric_write_loses_nothing(store, tmp_path):
    cfg = load(None, [*TINY, "search.cycles=1", "growth.policy=none"])
    tracker = _CtrlCInsideAWrite(tracking_uri=store, experiment="states", log_models=False)
    with pytest.raises(KeyboardInterrupt):
        Runner(cfg, [tracker], checkpoint_dir=tmp_path).run()
    client = MlflowClient(store)
    assert tracker.hit and client.get_run(tracker.run_id).info.status == "KILLED"
    # the interrupted batch (both W-training epochs) is written by the end-of-run handler
    assert [m.step for m in _history(client, tracker.run_id, "train_loss")] == [0, 1]
    assert client.get_run(tracker.run_id).data.tags[L.TAG_PHASE].startswith("cycle 0")


def test_store_writes_inline_or_on_a_thread_record_the_same_run(store, tmp_path):
    cfg = load(None, [*TINY, "search.cycles=1"])
    client, recorded = MlflowClient(store), {}
    for mode in ("auto", "thread"):
        tracker = MlflowTracker(
            tracking_uri=store, experiment="write-modes", log_models=False, write_mode=mode
        )
        Runner(cfg, [tracker], checkpoint_dir=tmp_path / mode).run()
        # auto writes a local SQLite store inline: no thread competes with training for the cores
        assert tracker._writer.inline is (mode == "auto")
        run = client.get_run(tracker.run_id)
        steps = {k: [m.step for m in _history(client, tracker.run_id, k)] for k in run.data.metrics}
        artifacts = sorted(
            a.path
            for folder in ("", "genotypes", "cells", "checkpoints")
            for a in client.list_artifacts(tracker.run_id, folder or None)
        )
        recorded[mode] = (run.info.status, steps, artifacts, run.data.tags[L.TAG_GENOTYPE])
    assert recorded["auto"] == recorded["thread"]
    assert recorded["auto"][0] == "FINISHED" and "cells/cycle_000.png" in recorded["auto"][2]
    with pytest.raises(ValueError, match="write_mode"):
        MlflowTracker(write_mode="later")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_the_writer_thread_and_its_dot_processes_run_at_the_lowest_priority():
    """Store writes on the thread must fill the gaps training leaves, not preempt
    torch's workers: the thread, and the processes it starts, run at nice 19."""
    from asolab.tracking.writer import StoreWriter

    seen = {}

    def job():
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        out = subprocess.run(["sh", "-c", "ps -o ni= -p $$"], capture_output=True, text=True)
        seen["child"] = int(out.stdout)

    writer = StoreWriter(inline=False)
    writer.submit(job)
    writer.drain()
    assert seen == {"thread": 19, "child": 19}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19  # the caller's is kept


def test_corrupt_sqlite_store_is_a_one_line_error(tmp_path, capsys):
    db = tmp_path / "garbage.db"
    db.write_bytes(bytes(range(256)) * 40)
    uri = f"sqlite:///{db}"
    with pytest.raises(TrackingError, match="not a database") as info:
        check_reachable(uri)
    assert "\n" not in str(info.value) and uri in str(info.value)
    assert main(["run", "--quiet", "--set", f"tracking.tracking_uri={uri}"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and err.startswith("asolab: error:") and "not a database" in err
    )


def test_a_relative_sqlite_store_serves_runs_and_the_ui(tmp_path, monkeypatch):
    """``sqlite:///mlflow.db`` (relative to the working folder) is a valid store: the
    run writes its artifacts beside it and ``asolab ui`` serves it. MLflow keeps
    artifact locations as file:// URIs, which must be absolute."""
    from asolab.tracking.ui import server_command, server_env

    monkeypatch.chdir(tmp_path)
    uri = "sqlite:///rel.db"
    # the smallest whole run (conftest.py's ONE_CYCLE): the test is about where it lands
    smallest = [
        *("seed=3", "device=cpu", "threads=1", "space.init_channels=4", "space.steps=1"),
        *("search.cycles=1", "search.w_epochs=1", "search.alpha_epochs=1"),
        *("search.retrain_epochs=1", "search.final_epochs=0", "search.calibration_batches=0"),
        *("data.train_subset=120", "tracking.log_models=false"),
    ]
    assert main(["run", "--quiet", *_set_args([*smallest, f"tracking.tracking_uri={uri}"])]) == 0
    run = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("digits").experiment_id]
    )[0]
    assert run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith((tmp_path / "artifacts").as_uri())
    assert (tmp_path / "artifacts").is_dir()
    cmd = server_command(uri, "127.0.0.1", 5000)
    assert cmd[cmd.index("--default-artifact-root") + 1] == (tmp_path / "artifacts").as_uri()
    assert cmd[cmd.index("--workers") + 1] == "1"
    # no MLflow job runners unless the user asks for them
    jobs = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
    assert server_env({})[jobs] == "false" and server_env({jobs: "true"})[jobs] == "true"


def test_ui_serves_the_store(tracked, store):
    import contextlib

    import psutil

    port = free_port()
    # Only 127.0.0.1:PORT is an allowed Host: http://localhost:PORT then stands for a
    # server reached by a name it was not told about (MLflow answers 403 but on /health).
    env = {**os.environ, "MLFLOW_SERVER_ALLOWED_HOSTS": f"127.0.0.1:{port}"}
    env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", None)  # asolab ui's own default
    # forked from the preloaded server (tests/processes.py): the command's behaviour is
    # tested here, not its interpreter's start-up
    proc = processes.Popen(
        [sys.executable, "-m", "asolab.cli", "ui", "--port", str(port), "--tracking-uri", store],
        stdout=processes.PIPE,
        stderr=processes.STDOUT,
        start_new_session=True,
        env=env,
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
        # no MLflow job runner (its huey consumers each import MLflow): asolab runs no jobs
        served = []
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):  # one that ended meanwhile
                served.append(" ".join(p.cmdline()))
        assert served and not [c for c in served if "mlflow.server.jobs" in c], served
        exp_id = MlflowClient(store).get_experiment_by_name("tracking-test").experiment_id
        req = urllib.request.Request(
            base + "/api/2.0/mlflow/runs/search",
            data=json.dumps({"experiment_ids": [exp_id]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            runs = json.loads(r.read())["runs"]
        assert tracked["tracker"].run_id in [r["info"]["run_id"] for r in runs]

        check_reachable(base)  # the API answers: a run can use this server
        other_name = f"http://localhost:{port}"
        with urllib.request.urlopen(other_name + "/health", timeout=10) as r:
            assert r.status == 200  # /health passes; only the API refuses the name
        with pytest.raises(
            TrackingError, match=f"403 Invalid Host header.*--allowed-hosts localhost:{port}"
        ) as info:
            check_reachable(other_name)
        assert "\n" not in str(info.value)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert f"http://127.0.0.1:{port}" in out
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/health", timeout=2)


def test_position_tags_name_checkpoints_inside_the_final_stage():
    """The asolab.position / asolab.resumed_from tags of a checkpoint taken between
    final-stage epochs say how far the stage got, as phase checkpoints do."""
    assert L.position_text(3, "final", 5) == "final stage / after epoch 5"
    assert L.position_text(3, "final") == "after final stage"
    assert L.position_text(1, "alpha") == "cycle 1 / after alpha"
    inside = {"cycle": 3, "phase": 0, "global_epoch": 17, "stage_epoch": 5, "next": "final"}
    assert L.resumed_text(inside) == "final stage / before epoch 6 (epoch 17)"
    assert L.resumed_text({**inside, "stage_epoch": 0}) == "before final stage (epoch 17)"


def test_stopped_inside_the_final_stage_resumes_there_exactly_once(store, tmp_path):
    """A run stopped after a checkpoint between final-stage epochs continues the
    same MLflow run at the next epoch, with exactly the metric steps and final
    figures of an uninterrupted run."""
    overrides = [
        *TINY,
        "search.cycles=1",  # the stage is what is stopped: one short cycle before it will do
        "search.w_epochs=1",
        "search.final_epochs=3",
        "search.checkpoint_minutes=0",
        f"tracking.tracking_uri={store}",
    ]
    cfg = load(None, overrides)
    reference = MlflowTracker(tracking_uri=store, experiment="final-stage-resume", log_models=False)
    Runner(cfg, [reference], checkpoint_dir=tmp_path / "ref").run()

    class Stopped(Exception):
        pass

    class StopInsideFinalStage(Observer):
        def on_checkpoint(self, event):
            if event.phase == "final" and event.stage_epoch == 2:
                raise Stopped

    tracker = MlflowTracker(tracking_uri=store, experiment="final-stage-resume", log_models=False)
    with pytest.raises(Stopped):
        Runner(cfg, [tracker, StopInsideFinalStage()], checkpoint_dir=tmp_path / "stopped").run()
    client = MlflowClient(store)
    stopped = client.get_run(tracker.run_id)
    assert stopped.info.status == "FAILED"
    assert stopped.data.tags[L.TAG_PHASE] == "final stage / after epoch 2"

    # the short id the tables print names the run too
    assert main(["run", "--quiet", "--resume", tracker.run_id[:8], *_set_args(overrides)]) == 0
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[L.TAG_RESUMED_FROM].startswith("final stage / before epoch 3 (epoch ")
    assert _steps(client, tracker.run_id) == _steps(client, reference.run_id)
    ref = client.get_run(reference.run_id).data
    assert run.data.metrics["test_acc"] == ref.metrics["test_acc"]
    assert run.data.tags[L.TAG_FINAL_GENOTYPE] == ref.tags[L.TAG_FINAL_GENOTYPE]


def test_layout_names_what_the_runner_reports(tracked):
    """The phase_index values follow the runner's phase table and keep the values runs
    already recorded; the memory metrics are memory_stats' keys; the learning rates are
    the EpochEnd.lrs keys."""
    from asolab.runner.memory import memory_stats
    from asolab.runner.phases import PHASES

    assert list(L.PHASE_INDEX) == [p.name for p in PHASES] + ["final"]
    assert L.PHASE_INDEX == {"w_train": 0, "alpha": 1, "mutate": 2, "retrain": 3, "final": 4}
    assert set(memory_stats(torch.device("cpu"))) <= set(L.MEMORY_METRICS)
    assert {k for e in tracked["recorder"].of("epoch_end") for k in e.lrs} == {
        L.WEIGHT_LR,
        L.ALPHA_LR,
    }


# The killed process for the kill tests below: `asolab run` that stops at a chosen
# moment, creates a marker file, and waits to be killed. argv: the marker, the
# moment, then asolab's arguments. The moment is "epoch:CYCLE:PHASE" (the first
# epoch of that phase has ended, and everything the tracker had handed to its
# writer is in the store; that epoch's metrics are still in its buffer) or the
# name of an MlflowClient method (the moment it is called, which it never is).
_FREEZE_AT = """
import pathlib, sys, time
from asolab.cli import main

marker, where = pathlib.Path(sys.argv[1]), sys.argv[2]

def freeze(*args, **kwargs):
    marker.touch()
    time.sleep(600)

if where.startswith("epoch:"):
    from asolab.runner import Runner
    from asolab.runner.events import Observer

    _, cycle, phase = where.split(":")

    class Freeze(Observer):
        def __init__(self, runner):
            self.runner = runner

        def on_epoch_end(self, event):
            if (event.cycle, event.phase) == (int(cycle), phase):
                for obs in self.runner.observers:
                    if hasattr(obs, "_writer"):
                        obs._writer.drain()
                freeze()

    init = Runner.__init__

    def with_freeze(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.observers.append(Freeze(self))

    Runner.__init__ = with_freeze
else:
    from mlflow import MlflowClient

    setattr(MlflowClient, where, freeze)
sys.exit(main(sys.argv[3:]))
"""


def _frozen_run(
    store: str,
    tmp_path: Path,
    experiment: str,
    where: str,
    overrides=TINY,
    stderr=subprocess.STDOUT,
) -> processes.Popen:
    """Start `asolab run` in a process and wait until it freezes at ``where`` (see
    _FREEZE_AT); the caller sends the signal. The process is forked from the preloaded
    server of tests/processes.py: what is tested is how a run dies, not an interpreter's
    start-up (a fresh one re-imports torch, MLflow and Optuna, ~10 s of CPU)."""
    marker = tmp_path / "frozen"
    args = [
        "run",
        "--quiet",
        "--experiment",
        experiment,
        *_set_args([*overrides, f"tracking.tracking_uri={store}"]),
    ]
    proc = processes.Popen(
        [sys.executable, "-c", _FREEZE_AT, str(marker), where, *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not marker.exists():
        time.sleep(0.1)
    if not marker.exists():
        proc.kill()
        out = proc.communicate()[0]
        raise AssertionError(f"the run never reached {where}:\n{out[-3000:]}")
    return proc


def _killed_run(store: str, tmp_path: Path, experiment: str, where: str, overrides=TINY) -> str:
    """Start `asolab run` in a process, SIGKILL it at ``where`` (see _FREEZE_AT), return its
    run id."""
    proc = _frozen_run(store, tmp_path, experiment, where, overrides)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    client = MlflowClient(store)
    (killed,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert killed.info.status == "RUNNING"  # SIGKILL leaves no chance to close it
    return killed.info.run_id


def _resume(run_id: str, store: str) -> int:
    return main(["run", "--quiet", "--resume", run_id, "--set", f"tracking.tracking_uri={store}"])


def test_sigkill_before_the_first_checkpoint_then_resume_restarts_in_the_same_run(
    tracked, store, tmp_path
):
    """kill -9 in the first W-training phase, before any checkpoint: --resume starts the
    run again inside the same MLflow run, which ends exactly like an uninterrupted one."""
    run_id = _killed_run(store, tmp_path, "restart-test", "epoch:0:w_train")
    client = MlflowClient(store)
    assert client.list_artifacts(run_id, L.CHECKPOINT_DIR) == []
    assert _resume(run_id, store) == 0

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[L.TAG_RESUMED] == "1"
    assert run.data.tags[L.TAG_RESUMED_FROM].startswith("start")
    assert len(client.search_runs([run.info.experiment_id])) == 1
    reference = tracked["tracker"].run_id
    assert _steps(client, run_id) == _steps(client, reference)
    for key in ("val_acc", "train_loss", "cycle_val_acc", "test_acc"):
        ref = [m.value for m in _history(client, reference, key)]
        assert [m.value for m in _history(client, run_id, key)] == pytest.approx(ref), key
    assert run.data.tags[L.TAG_FINAL_GENOTYPE] == str(tracked["result"].genotype)


def _run_models(client: MlflowClient, run: Any) -> list:
    return list(
        client.search_logged_models(
            [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
        )
    )


def test_sigkill_while_the_final_model_is_logged_then_resume_leaves_one_ready_model(
    tracked, store, tmp_path
):
    """kill -9 while the final model's files are uploaded: after --resume the run has
    exactly one logged model, READY, loadable, holding the run's final metrics."""
    run_id = _killed_run(store, tmp_path, "model-kill-test", "log_model_artifacts")
    client = MlflowClient(store)
    (begun,) = _run_models(client, client.get_run(run_id))
    assert begun.status == LoggedModelStatus.PENDING and "test_acc" in {
        m.key for m in begun.metrics or []
    }
    assert _resume(run_id, store) == 0

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    (model,) = _run_models(client, run)
    assert model.model_id == begun.model_id and model.status == LoggedModelStatus.READY
    linked = {m.key: m.value for m in model.metrics or []}
    assert linked["test_acc"] == run.data.metrics["test_acc"] == tracked["result"].test_acc
    assert run.data.tags[L.TAG_MODEL_URI] == f"models:/{model.model_id}"
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
    assert _steps(client, run_id) == _steps(client, tracked["tracker"].run_id)
    mlflow.set_tracking_uri(store)
    try:
        loaded = mlflow.pyfunc.load_model(run.data.tags[L.TAG_MODEL_URI])
    finally:
        mlflow.set_tracking_uri(None)
    x = tracked["runner"].data.test.x[:4].cpu()
    with torch.no_grad():
        expected = extract(tracked["runner"].net, tracked["result"].genotype)(x)
        network = loaded.get_raw_model().network
        assert torch.allclose(network(x), expected, atol=1e-5)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("asolab: error:"), err
    return err


def test_an_empty_resume_id_is_refused_and_starts_no_run(store, capsys):
    client = MlflowClient(store)
    before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    capsys.readouterr()  # MLflow's own lines when this test made the store
    assert (
        main(
            [
                "run",
                "--quiet",
                "--resume",
                "",
                *_set_args([*TINY, f"tracking.tracking_uri={store}"]),
            ]
        )
        == 2
    )
    assert "--resume" in _one_error_line(capsys)
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == before


def test_a_run_whose_checkpoint_is_corrupt_is_named_in_the_error_and_ends_failed(
    store, tmp_path, capsys
):
    """The error names the run (not the deleted download), offers no 'earlier checkpoint'
    (none is kept), and the run no longer looks RUNNING."""
    client = MlflowClient(store)
    run_id = client.create_run(ensure_experiment(client, store, "broken-runs")).info.run_id
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    client.log_artifact(run_id, str(bad), L.CHECKPOINT_DIR)
    capsys.readouterr()
    assert _resume(run_id, store) == 2
    err = _one_error_line(capsys)
    assert f"run {run_id}" in err and "corrupt" in err and "start a new run" in err
    assert "asolab-run-" not in err and "earlier" not in err
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and "corrupt" in run.data.tags[L.TAG_ERROR]


def test_a_run_killed_before_it_recorded_its_config_ends_failed_on_resume(store, capsys):
    client = MlflowClient(store)
    run_id = client.create_run(ensure_experiment(client, store, "broken-runs")).info.run_id
    capsys.readouterr()
    assert _resume(run_id, store) == 2
    assert "nothing to continue" in _one_error_line(capsys)
    assert client.get_run(run_id).info.status == "FAILED"


def test_too_small_a_validation_split_is_one_error_line(capsys):
    assert (
        main(["run", "--quiet", "--no-track", *_set_args([*TINY, "data.val_fraction=0.0001"])]) == 2
    )
    err = _one_error_line(capsys)
    assert "data.val_fraction" in err and "at least 10" in err and "one per class" in err


# Opens a new SQLite store at a given moment, as `asolab run` does first. argv: URI, start time.
_OPEN_AT = """
import sys, time
from asolab.tracking.store import check_reachable

uri, start = sys.argv[1], float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
check_reachable(uri)
"""


def test_runs_started_at_the_same_moment_on_a_new_store_both_open_it(tmp_path):
    """MLflow creates a new SQLite store's tables without any lock between processes;
    two (three) runs starting at once must not fail on each other's migrations. The
    openers are processes forked from the preloaded server of tests/processes.py (separate
    processes and connections, as the race needs; no interpreter start-up to wait for)."""
    for attempt in range(2):
        uri = f"sqlite:///{tmp_path / f'new{attempt}.db'}"
        processes.warm()
        start = time.time() + 2  # after every process has started
        procs = [
            processes.Popen(
                [sys.executable, "-c", _OPEN_AT, uri, str(start)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(3)
        ]
        outs = [(p.wait(timeout=120), p.communicate()[0].decode()) for p in procs]
        assert [rc for rc, _ in outs] == [0, 0, 0], "\n".join(out[-600:] for _, out in outs)
        assert MlflowClient(uri).search_experiments()  # a usable store, fully migrated


def test_cell_pictures_without_graphviz_are_noted_in_the_run(
    store, tracked, tmp_path, monkeypatch, caplog
):
    """Where graphviz's dot is missing, Pillow draws the cells (labels may crowd): the run
    carries a one-line note saying so and how to install graphviz, and the log says it
    once; with dot installed, no note."""
    from asolab.space import plot

    client = MlflowClient(store)
    if shutil.which("dot"):
        assert L.TAG_CELLS_NOTE not in client.get_run(tracked["tracker"].run_id).data.tags
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without graphviz
    plot._warn_no_dot.cache_clear()
    cfg = load(None, [*TINY, "search.cycles=1"])
    tracker = MlflowTracker(tracking_uri=store, experiment="tracking-no-dot", log_models=False)
    with caplog.at_level("WARNING", logger="asolab.space.plot"):
        Runner(cfg, [tracker]).run()
    run = client.get_run(tracker.run_id)
    assert run.data.tags[L.TAG_CELLS_NOTE] == plot.NO_DOT_NOTE
    assert "install graphviz" in plot.NO_DOT_NOTE and "\n" not in plot.NO_DOT_NOTE
    assert "final.png" in [
        Path(a.path).name for a in client.list_artifacts(run.info.run_id, "cells")
    ]
    assert caplog.text.count("graphviz's dot is not installed") == 1


def test_the_uis_first_screen_holds_what_a_researcher_reads_first(tmp_path):
    """The run description leads with the genotype, one line of accuracies, parameters,
    peak memory and wall time, then the cell picture (before the UI's "Show more"), values
    rounded, no Markdown table; the shared view has data-set, peak-memory and best-trial
    columns; `asolab ui` keeps the server's access log in a file."""
    from asolab.tracking.browse import run_description, view_state
    from asolab.tracking.ui import server_log

    head = {
        "val acc": 0.448275862,
        "test acc": 0.4,
        "params": 24682,
        "peak memory": "726 MB",
        "wall time": "36.9 s",
    }
    text = run_description("r1", head, "normal: ... ; reduce: ...", {"data set": "digits"})
    lines = text.splitlines()
    assert lines[0] == "**Final genotype** `normal: ... ; reduce: ...`"
    assert lines[2].startswith("[![final cells](get-artifact?path=cells%2Ffinal_thumb.png")
    assert lines[2].endswith(
        ") val acc **0.4483** · test acc **0.4000** · params **24,682** · "
        "peak memory **726 MB** · wall time **36.9 s**"
    )
    assert lines[4].startswith("![final cells](get-artifact?path=cells%2Ffinal.png")
    assert "|---" not in text and "- data set: digits" in text
    columns = view_state()["selectedColumns"]
    for shown in ("tags.`asolab.dataset`", "tags.`asolab.best`", "metrics.`final_peak_rss_mb`"):
        assert shown in columns
    assert server_log(f"sqlite:///{tmp_path / 'mlflow.db'}") == tmp_path / "ui.log"
    # the strip: the picture's cells side by side, 40 px tall (the title left out)
    import io

    from PIL import Image

    from asolab.space.genotype import Genotype
    from asolab.space.plot import genotype_png, thumbnail_png

    g = Genotype.parse(
        "normal: sep_conv_3x3(0) skip_connect(1) -> 2 ; "
        "reduce: max_pool_3x3(0) skip_connect(1) -> 2"
    )
    full = Image.open(io.BytesIO(genotype_png(g, "final genotype")))
    strip = Image.open(io.BytesIO(thumbnail_png(genotype_png(g, "final genotype"))))
    assert strip.height == 40 and strip.width > 40 * full.width / full.height

"""GPU busy per epoch (runner/gpubusy.py): the driver's utilization samples averaged
over each epoch's training loop, recorded in MLflow and summed up, with what to do, at
the run's end.

NVML needs a GPU. Here a meter reads samples that the test writes, through the same
class the runner uses; tests/test_device_placement.py reads the real driver on a GPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import ONE_CYCLE
from mlflow import MlflowClient

from asolab import config
from asolab.progress import summary_table
from asolab.runner import Runner
from asolab.runner.events import Observer, Recorder, RunEnd
from asolab.runner.gpubusy import (
    ALL,
    GpuBusy,
    advice,
    in_words,
    mean_after,
    now_us,
    source_text,
)
from asolab.study.cli import gpu_room
from asolab.study.objective import keep_gpu_busy
from asolab.study.storage import ATTR_GPU_BUSY
from asolab.tracking import MlflowTracker
from asolab.tracking import layout as L


def steady(percent: float) -> GpuBusy:
    """A meter whose GPU reports ``percent`` at every read, stamped when read."""
    return GpuBusy(lambda last: [(now_us(), percent)], buffered=True)


def test_an_epochs_figure_is_the_mean_of_the_samples_after_its_mark():
    samples = [(10, 90.0), (20, 10.0), (30, 30.0)]
    assert mean_after(samples, 10) == 20.0  # the sample stamped at the mark is before it
    assert mean_after(samples, 0) == pytest.approx(130 / 3)
    assert mean_after(samples, 30) is None  # an epoch shorter than one sample period


def test_an_epoch_counts_the_samples_read_after_its_mark_by_the_drivers_clock():
    # the driver's stamps, read in turn: before the epoch (the thread's read, then the
    # mark's), then after it; they need not agree with this host's clock
    reads = iter([[(5, 100.0), (7, 90.0)], [(9, 80.0)], [(11, 20.0), (13, 40.0)]])
    asked = []
    busy = GpuBusy(lambda last: asked.append(last) or next(reads, []), buffered=True)
    busy.close()
    busy._pull()
    mark = busy.mark()
    assert mark == 9 and busy.since(mark) == 30.0
    assert asked[:3] == [0, 7, 9]  # each read asks for the samples after the last one seen


def test_the_summary_weights_epochs_by_their_seconds_and_advises_under_half():
    busy = steady(0.0)
    busy.close()
    busy.record("w_train", 40.0, 3.0)
    busy.record("w_train", 10.0, 1.0)
    busy.record("retrain", 80.0, 4.0)
    summary = busy.summary()
    assert summary == {"w_train": 32.5, "retrain": 80.0, ALL: pytest.approx(56.25)}
    assert list(summary) == ["w_train", "retrain", ALL]
    assert in_words(summary) == "56% (W-training 32%, W-retraining 80%)"
    assert advice(summary) == ""  # busy more than half the time: nothing to say
    low = advice({"w_train": 14.0, ALL: 14.0})
    assert low.startswith("GPU busy 14% of the training loops") and "--gpus 0,0" in low
    assert advice({}) == ""


def test_off_cuda_and_without_a_gpu_nothing_is_measured():
    assert GpuBusy.open(torch.device("cpu")) is None
    if not torch.cuda.is_available():  # no driver here: a run goes on without the figure
        assert GpuBusy.open(torch.device("cuda")) is None


class NoKernel(Observer):
    """Warns as torch does of an op with no deterministic kernel (index_add on CUDA)."""

    def on_epoch_end(self, event) -> None:
        warnings.warn("index_add_cuda_ does not have a deterministic implementation", stacklevel=1)


def test_a_tracked_run_records_gpu_busy_and_what_was_not_deterministic(tmp_path):
    """One tracked run, on a meter that reads 20% and with speed.deterministic on: the
    GPU busy figures and advice, and the op torch warned of as a tag and a summary row."""
    small = {"data.train_subset": 64, "search.final_epochs": 1, "speed.deterministic": True}
    cfg = config.load(None, {**ONE_CYCLE, **small})
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recorder, tracker = Recorder(), MlflowTracker(tracking_uri=store, experiment="gpu-busy")
    runner = Runner(cfg, [recorder, tracker, NoKernel()])
    runner.gpu_busy = steady(20.0)
    with warnings.catch_warnings(record=True):  # off the test's output
        runner.run()

    epochs = recorder.of("epoch_end")
    assert [e.gpu_busy for e in epochs] == [20.0] * len(epochs) and len(epochs) == 4
    client = MlflowClient(store)
    history = client.get_metric_history(tracker.run_id, L.GPU_BUSY_PCT)
    assert sorted((m.step, m.value) for m in history) == [(i, 20.0) for i in range(4)]
    run = client.get_run(tracker.run_id)
    assert run.data.metrics[L.RUN_GPU_BUSY_PCT] == 20.0
    expected = "20% (W-training 20%, alpha-training 20%, W-retraining 20%, final training 20%)"
    assert f"- GPU busy in training: {expected}\n" in run.data.tags[L.TAG_NOTE]
    assert run.data.tags[L.TAG_NONDETERMINISTIC] == "index_add_cuda_"

    (end,) = recorder.of("run_end")
    lines = summary_table(end).splitlines()
    assert [line for line in lines if line.startswith("GPU busy (training loops)")] == [
        f"GPU busy (training loops)   {expected}"
    ]
    assert lines[-1].startswith("GPU busy 20% of the training loops: the host launching")
    (row,) = [line for line in lines if line.startswith("not deterministic")]
    assert row.split() == ["not", "deterministic", "index_add_cuda_"]
    assert not runner.gpu_busy._thread.join(5) and not runner.gpu_busy._thread.is_alive()


def _end(gpu_busy: dict[str, float]) -> RunEnd:
    return RunEnd(None, 0, 0, 0.0, 0.0, 0.0, 0.0, 1.0, {}, 0, gpu_busy=gpu_busy)


def test_a_studys_first_trial_on_an_idle_gpu_says_it_has_room_for_more_workers():
    import optuna

    study = optuna.create_study()
    for busy in ({"w_train": 14.0, ALL: 14.04}, {ALL: 70.0}, {}):
        trial = study.ask()
        keep_gpu_busy(trial, _end(busy))
        study.tell(trial, 1.0)
    idle, busy, off_gpu = study.trials
    assert idle.user_attrs[ATTR_GPU_BUSY] == 14.0 and ATTR_GPU_BUSY not in off_gpu.user_attrs
    assert gpu_room(idle) == (
        "  its GPU was busy 14% of the training loops (every process on it counted): it has "
        "room for more trials at once, e.g. --gpus 0,0 (two workers on GPU 0; docs/scaling-out.md)"
    )
    assert gpu_room(busy) == "" and gpu_room(off_gpu) == ""


def test_a_study_summary_on_gpus_has_each_trials_gpu_busy():
    import optuna

    from asolab.study.config import load_study
    from asolab.study.report import summary_frame

    cfg = load_study(None)
    study = optuna.create_study(direction="maximize")
    for value, busy in ((0.9, {ALL: 14.0}), (0.8, {ALL: 30.0})):
        trial = study.ask()
        keep_gpu_busy(trial, _end(busy))
        study.tell(trial, value)
    frame = summary_frame(study, cfg)
    assert frame["gpu_busy_pct"].tolist() == [14.0, 30.0]
    off = optuna.create_study(direction="maximize")
    off.tell(off.ask(), 0.9)
    assert "gpu_busy_pct" not in summary_frame(off, cfg).columns  # a study on CPUs


def test_the_gpu_check_report_says_where_gpu_busy_comes_from_or_why_not():
    assert source_text(torch.device("cpu")) == "none on cpu"
    if not torch.cuda.is_available():
        assert source_text(torch.device("cuda")).startswith("none: ")

"""What a run shows while it runs: progress from Python (a terminal, a notebook)."""

from __future__ import annotations

import dataclasses

from conftest import ONE_CYCLE

import asolab
from asolab import progress

SMALL = {**ONE_CYCLE, "data.train_subset": 100}


def test_a_run_from_python_shows_progress_and_its_summary_and_is_silent_when_asked(capsys):
    asolab.run("digits", SMALL, track=False, progress=True)
    out, err = capsys.readouterr()
    assert out == ""  # bars, lines and the summary on stderr, as tqdm writes
    assert "asolab: digits (" in err and "device cpu, 1 cycle\n" in err  # the banner
    assert "W-training 1: 100%" in err and "alpha-training 1: 100%" in err  # the bars
    for row in ("final genotype", "validation accuracy", "test accuracy", "wall time (s)"):
        assert row in err, err
    asolab.run("digits", SMALL, track=False, progress=False)
    assert capsys.readouterr() == ("", "")


def test_progress_is_on_by_default_where_a_terminal_or_a_notebook_looks(monkeypatch):
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Tty())
    assert progress.attached() == "terminal"
    monkeypatch.setattr("sys.stderr", open("/dev/null", "w"))
    assert progress.attached() == ""

    class ZMQInteractiveShell:  # what a Jupyter kernel's get_ipython() returns
        pass

    class IPython:
        @staticmethod
        def get_ipython():
            return ZMQInteractiveShell()

    monkeypatch.setitem(__import__("sys").modules, "IPython", IPython)
    assert progress.attached() == "notebook"
    from tqdm.auto import tqdm as auto

    assert progress.ProgressObserver(notebook=True)._bars is auto


# ------------------------------------------------------------------ a run that crawls


def _epochs(rates: list[float], threads: int = 2) -> list:
    from asolab.runner.events import EpochEnd

    return [
        EpochEnd("w_train", i, 0, i, 1.0, 0.5, 1.0, 0.5, 1.0, {}, 1.0, rate, threads)
        for i, rate in enumerate(rates)
    ]


def test_an_epoch_under_a_third_of_the_median_names_load_or_threads_and_what_to_set(
    monkeypatch,
):
    from asolab.runner import pace

    monkeypatch.setattr(pace, "usable_cores", lambda: 2)
    monkeypatch.setattr(pace, "load_average", lambda: 6.5)  # others keep both cores busy
    watch = pace.Pace()
    said = [watch.check(e) for e in _epochs([120, 110, 40, 13, 12])]
    assert said[:3] == ["", "", ""]  # 40 is not under a third of the median (110)
    assert said[3].startswith("slow: epoch 3 (W-training, cycle 4) ran at 13 images/s")
    assert "likely cause: load" in said[3] and "load 6.5 on 2 cores" in said[3]
    assert "set threads = 1 (--set threads=1)" in said[3]
    assert said[4] == ""  # one line per run
    monkeypatch.setattr(pace, "load_average", lambda: 0.4)  # a quiet machine: the threads
    quiet = pace.Pace()
    line = [quiet.check(e) for e in _epochs([120, 110, 100, 13])][-1]
    assert "likely cause: threads" in line and "set threads = 1" in line
    # on a GPU that was busy through the slow epoch: others share the GPU, not the cores
    shared = pace.Pace()
    on_gpu = [
        dataclasses.replace(e, gpu_busy=b)
        for e, b in zip(_epochs([120, 110, 100, 13]), [20, 20, 20, 97])
    ]
    line = [shared.check(e) for e in on_gpu][-1]
    assert "likely cause: the GPU: 97% busy while this run went slowly" in line
    idle = pace.Pace()  # a GPU run whose slow epoch left the GPU idle: the host is the cause
    on_gpu[-1] = dataclasses.replace(on_gpu[-1], gpu_busy=5.0)
    assert "likely cause: threads" in [idle.check(e) for e in on_gpu][-1]


def test_a_slow_epoch_is_printed_and_recorded_as_a_tag(tiny_cfg, tmp_path, monkeypatch):
    import io

    from mlflow import MlflowClient

    from asolab.runner import pace
    from asolab.runner.events import RunStart
    from asolab.tracking import MlflowTracker
    from asolab.tracking import layout as L

    monkeypatch.setattr(pace, "load_average", lambda: 9.0)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    screen = io.StringIO()
    tracker = MlflowTracker(tracking_uri=store, experiment="slow")
    bar = progress.ProgressObserver(screen)
    start = RunStart(tiny_cfg, {"name": "digits", "train": 1, "val": 1, "test": 1}, "cpu", {})
    for observer in (tracker, bar):
        observer.on_run_start(start)
        for e in _epochs([100, 100, 100, 20]):
            observer.on_epoch_end(e)
    tracker.flush()
    tag = MlflowClient(store).get_run(tracker.run_id).data.tags[L.TAG_SLOW_EPOCH]
    assert tag.startswith("slow: epoch 3") and "likely cause: load" in tag
    assert tag in screen.getvalue()


def test_the_banner_names_the_gpu_as_the_machine_numbers_it(tiny_cfg):
    """A study worker's ``cuda:0`` is whatever GPU ``CUDA_VISIBLE_DEVICES`` gave it: the
    banner says which (runner/device.py's describe_device, as the run's tags record it)."""
    import io

    from asolab.runner.events import RunStart

    data = {"name": "digits", "train": 1150, "val": 288, "test": 359}
    stream = io.StringIO()
    shown = progress.ProgressObserver(stream=stream)
    info = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_index": "3", "gpu_memory_gib": "79.2"}
    shown.on_run_start(RunStart(tiny_cfg, data, "cuda", {}, device_info=info))
    shown.on_run_start(RunStart(tiny_cfg, data, "cpu", {}))
    assert stream.getvalue().splitlines() == [
        "asolab: digits (1150 train / 288 val / 359 test), device cuda "
        "(NVIDIA H100 80GB HBM3, GPU 3), 2 cycles",
        "asolab: digits (1150 train / 288 val / 359 test), device cpu, 2 cycles",
    ]

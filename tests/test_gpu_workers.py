"""A GPU per study worker: the round-robin assignment, and the environment a real
worker process starts with (spawned by the function the study spawns them with)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asolab.config import ConfigError
from asolab.study.gpus import (
    GPU_ENV,
    assign_gpus,
    parse_gpus,
    study_gpus,
    visible_gpus,
    worker_env,
)
from asolab.study.run import start_worker


def test_workers_take_the_gpus_round_robin():
    assert assign_gpus(5, ["0", "1"]) == ["0", "1", "0", "1", "0"]
    assert assign_gpus(2, ["2", "3", "6"]) == ["2", "3"]
    assert assign_gpus(2, []) == [None, None]  # no GPU: CPU workers, environment untouched


def test_gpus_named_without_workers_get_a_worker_each():
    """``asolab study --gpus 0,1`` uses both GPUs; ``--gpus 0,0`` puts two workers on GPU 0
    (what the GPU busy advice says to run); ``--workers`` given wins."""
    from asolab.study.cli import study_workers

    assert study_workers(None, "0,1") == 2 and study_workers(None, "0,0,1,1") == 4
    assert study_workers(None, "") == 1  # no --gpus: one worker, as before
    assert study_workers(3, "0,1") == 3 and study_workers(1, "0,1") == 1
    with pytest.raises(ConfigError, match="is not a GPU id"):
        study_workers(None, "0,x")


def test_the_gpus_on_offer():
    assert parse_gpus("0, 1,3") == ["0", "1", "3"]
    with pytest.raises(ConfigError, match="--gpus '0,,1'"):
        parse_gpus("0,,1")
    assert visible_gpus({GPU_ENV: "2,3"}) == ["2", "3"]
    assert visible_gpus({GPU_ENV: "GPU-8a1f,GPU-77c2"}) == ["GPU-8a1f", "GPU-77c2"]
    assert visible_gpus({GPU_ENV: "1,-1,2"}) == ["1"]  # CUDA stops at an invalid id
    assert visible_gpus({GPU_ENV: ""}) == []
    assert worker_env({"PATH": "/bin", GPU_ENV: "0,1"}, "1") == {"PATH": "/bin", GPU_ENV: "1"}
    assert worker_env({"PATH": "/bin"}, None) == {"PATH": "/bin"}


@pytest.mark.parametrize("gpu", ["3", None])
def test_a_worker_process_sees_its_gpu_before_torch_starts(gpu, monkeypatch):
    monkeypatch.setenv(GPU_ENV, "0,1,2,3")
    probe = (
        "import os, torch; "
        f"print(os.environ.get('{GPU_ENV}'), torch.cuda.device_count() <= 1 or '{gpu}' == 'None')"
    )
    proc = start_worker([sys.executable, "-c", probe], gpu, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    seen, one_device = out.split()
    assert seen == (gpu or "0,1,2,3")
    assert one_device == "True"  # with a GPU set, torch in the worker counts at most that one


def test_gpu_ids_are_checked_and_gpus_where_none_is_visible_are_refused(
    tmp_path, monkeypatch, capsys
):
    """NZ05, NZ09 (--gpus on a machine without GPUs), NZ08 (a garbage id): one line,
    exit 2, before the study writes anything; --set device=cpu says the CPU is meant."""
    import torch

    from asolab.cli import main

    with pytest.raises(ConfigError, match="'x;touch /tmp/y' is not a GPU id"):
        parse_gpus("0,x;touch /tmp/y")
    assert parse_gpus("GPU-8a1f-77c2,MIG-GPU-8a1f/1/0,2") == [
        "GPU-8a1f-77c2",
        "MIG-GPU-8a1f/1/0",
        "2",
    ]
    monkeypatch.setenv(GPU_ENV, "-1")  # hide every GPU: this machine has none
    assert torch.cuda.device_count() == 0 or pytest.skip("CUDA was initialised before")
    store = tmp_path / "mlflow.db"
    base = ["study", "studies/temperature_mutation.toml", "--n-trials", "1"]
    base += ["--tracking-uri", f"sqlite:///{store}", "--storage", str(tmp_path / "j.log")]
    for extra in (["--workers", "2", "--gpus", "0,1"], ["--gpus", "0"], ["--gpus", "x;touch a"]):
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("asolab: error: --gpus") and "\n" not in err, err
        assert "device=cpu" in err or "not a GPU id" in err, err
    assert not store.exists()  # refused before the store was touched
    assert study_gpus("0,1", "cpu", 2) == ["0", "1"]  # the CPU on purpose: as asked, warned

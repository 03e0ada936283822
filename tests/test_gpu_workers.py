"""A GPU per study worker: the round-robin assignment, and the environment a real
worker process starts with (spawned by the function the study spawns them with)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asolab.config import ConfigError
from asolab.study.gpus import GPU_ENV, assign_gpus, parse_gpus, visible_gpus, worker_env
from asolab.study.run import start_worker


def test_workers_take_the_gpus_round_robin():
    assert assign_gpus(5, ["0", "1"]) == ["0", "1", "0", "1", "0"]
    assert assign_gpus(2, ["2", "3", "6"]) == ["2", "3"]
    assert assign_gpus(2, []) == [None, None]  # no GPU: CPU workers, environment untouched


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

"""Thread counts: the "auto" rule sees other asolab processes when a run starts; the
count is kept for the whole run, recorded, and reused by a resume (the count changes
the run)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from asolab import threads
from asolab.cli import _forced_threads
from asolab.config import ConfigError
from asolab.runner import Runner
from asolab.runner import checkpoint as ckpt
from asolab.runner.events import Recorder

CLAIMER = (
    "import sys, time; from pathlib import Path; from asolab import threads; "
    "threads.claim(int(sys.argv[2]), Path(sys.argv[1])); print('claimed', flush=True); "
    "time.sleep(120)"
)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A private registry and a machine of 2 usable cores; torch back to 1 thread after."""
    folder = tmp_path / "registry"
    monkeypatch.setenv(threads.REGISTRY_ENV, str(folder))
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    yield folder
    torch.set_num_threads(1)


@pytest.fixture
def other_process(registry):
    """Start another process that claims ``n`` threads in the registry; killed after the test."""
    procs = []

    def start(n: int) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(registry), str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "claimed"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_auto_rule_subtracts_the_threads_of_live_asolab_processes(registry, other_process):
    assert threads.auto_threads(cores=4, directory=registry) == 4
    proc = other_process(3)
    assert threads.others(registry) == {proc.pid: 3}
    assert threads.auto_threads(cores=4, directory=registry) == 1
    assert threads.auto_threads(cores=2, directory=registry) == 1  # never below one
    proc.kill()
    proc.wait()
    assert threads.auto_threads(cores=4, directory=registry) == 4
    assert not (registry / f"{proc.pid}.json").exists()  # the dead process's entry is gone


def test_an_entry_whose_pid_was_reused_does_not_count(registry):
    registry.mkdir(parents=True)
    # A live pid (this test's parent) with another start time: a reused pid.
    entry = {"pid": threads.os.getppid(), "threads": 2, "started": time.time() + 1000}
    (registry / "stale.json").write_text(json.dumps(entry))
    assert threads.auto_threads(cores=2, directory=registry) == 2


def test_a_run_with_auto_threads_records_the_count_it_chose_and_resume_keeps_it(
    tiny_cfg, registry, other_process, tmp_path
):
    auto = tiny_cfg.replace(threads=0)

    class Stop(Exception):
        pass

    class StopAtFirstCheckpoint(Recorder):
        def on_checkpoint(self, event):
            raise Stop

    rec = StopAtFirstCheckpoint()
    with pytest.raises(Stop):
        Runner(auto, [rec], checkpoint_dir=tmp_path).run()
    start = rec.of("run_start")[0]
    assert (start.config.threads, start.threads_source) == (
        2,
        "auto",
    )  # 2 usable cores, nobody else
    assert ckpt.load(tmp_path / "checkpoint.pt")["config"]["threads"] == 2

    other_process(1)  # now "auto" would give 1; a new run takes 1, the resumed one keeps 2
    assert Runner(auto).cfg.threads == 1 and torch.get_num_threads() == 1
    rec = Recorder()
    resumed = Runner.resume(tmp_path / "checkpoint.pt", [rec])
    assert resumed.cfg.threads == 2 and torch.get_num_threads() == 2
    resumed.run()
    assert (rec.of("run_start")[0].config.threads, rec.of("run_start")[0].threads_source) == (
        2,
        "resumed",
    )
    forced = Runner.resume(tmp_path / "checkpoint.pt", threads=1)
    assert (forced.cfg.threads, forced.threads_source, torch.get_num_threads()) == (1, "set", 1)


def test_a_run_registers_its_threads_for_the_others(tiny_cfg, registry):
    Runner(tiny_cfg.replace(threads=1))
    entry = json.loads((registry / f"{threads.os.getpid()}.json").read_text())
    assert entry["threads"] == 1


def test_resume_takes_a_thread_count_from_set_and_refuses_a_bad_one():
    assert _forced_threads(["tracking.tracking_uri=x"]) == 0
    assert _forced_threads(["threads=3", "seed=1"]) == 3
    with pytest.raises(ConfigError, match="threads"):
        _forced_threads(["threads=many"])


def test_the_wait_policy_sleeps_only_beside_other_asolab_processes(registry, other_process):
    """Alone, OpenMP keeps its default (fast for a run that has the cores); beside another
    asolab process, waits sleep; never once torch is loaded."""
    code = "import os, asolab.cli, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in threads.os.environ.items() if k != "OMP_WAIT_POLICY"}

    def policy() -> str:
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.strip()

    assert policy() == "None"
    other_process(1)
    assert policy() == "PASSIVE"
    assert threads.prepare_environment() is False  # torch is loaded in this process: too late


def test_the_suites_workers_wait_sleeping():
    """pytest -n: each worker's OpenMP waits sleep (conftest.py), as asolab's do beside
    another asolab process; the workers import torch before either has registered."""
    if not threads.os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("one test process: no other worker beside it")
    assert threads.os.environ.get(threads.WAIT_POLICY[0]) == threads.WAIT_POLICY[1]


def test_an_auto_run_keeps_its_count_when_another_process_starts_beside_it(
    tiny_cfg, registry, other_process
):
    """The count is decided once: a run that started alone with 2 threads keeps them for
    every epoch after another asolab process appeared (a count that changed mid-run would
    make the same seed give another result), while a run started then takes what is left."""

    class StartsAnother(Recorder):
        def on_epoch_end(self, event):
            super().on_epoch_end(event)
            if event.global_epoch == 0:
                other_process(1)

    rec = StartsAnother()
    Runner(tiny_cfg.replace(threads=0), [rec]).run()
    assert {e.threads for e in rec.of("epoch_end")} == {2}
    assert rec.of("run_start")[0].config.threads == 2
    assert Runner(tiny_cfg.replace(threads=0)).cfg.threads == 1  # the newcomer: what is left

"""The bad day, with real failures: a read-only database file, a full disk (a small
tmpfs) under the store and under the temp folder, a corrupt database, another run's
checkpoint in a run's place, two processes on one run, Ctrl-C under a pipe whose
reader dies with it, SIGKILL's leftovers. Each ends in one line and exit status 2
(or 130), with the run's state right in the store.

Mounting a tmpfs and ``chattr +i`` need root (CI runs as root); elsewhere those
cases skip and say why.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import processes
import pytest
from mlflow import MlflowClient

from asolab.cli import main
from asolab.progress import ProgressObserver
from asolab.runner import Runner
from asolab.runner import checkpoint as ckpt
from asolab.runner.events import Observer
from asolab.tracking import layout as L
from asolab.tracking.ui import allowed_hosts, server_command

TINY = [
    "seed=1",
    "device=cpu",
    "threads=1",
    "search.cycles=1",
    "search.w_epochs=1",
    "search.alpha_epochs=1",
    "search.retrain_epochs=1",
    "search.final_epochs=0",
    "space.init_channels=4",
    "data.train_subset=192",
    "growth.policy=none",
    "tracking.log_models=false",
    "search.checkpoint_minutes=0",
]


def _args(uri: str, *extra: str) -> list[str]:
    out = ["run", "--quiet", *extra]
    for o in [*TINY, f"tracking.tracking_uri={uri}"]:
        out += ["--set", o]
    return out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("asolab: error:"), err
    return err


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """An empty MLflow database, made once (MLflow builds its tables in seconds)."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(template, tmp_path) -> str:
    (tmp_path / "store").mkdir()
    shutil.copy(template, tmp_path / "store" / "mlflow.db")
    return f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs of the given size (KiB) at a new folder; unmounted after the test."""
    mounted = []

    def mount(kib: int) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): needs root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: Path) -> None:
    """Fill the file system of ``folder`` to the last byte."""
    with open(folder / "filler", "ab", buffering=0) as f:
        for chunk in (65536, 512, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:  # ENOSPC: full to this chunk's size, as wanted
                continue


class _At(Observer):
    """Calls ``action`` once, at the first epoch end of ``phase`` (injected into the CLI's
    runner, as an observer would be)."""

    def __init__(self, phase: str, action) -> None:
        self.phase, self.action, self.done = phase, action, False

    def on_epoch_end(self, event) -> None:
        if event.phase == self.phase and not self.done:
            self.done = True
            self.action()


@pytest.fixture
def inject(monkeypatch):
    """Add an observer to every Runner the CLI builds in this test."""

    def add(observer: Observer | None) -> None:
        """``None``: back to the plain Runner."""
        if observer is None:
            monkeypatch.undo()
            return
        init = Runner.__init__

        def with_observer(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.observers.append(observer)

        monkeypatch.setattr(Runner, "__init__", with_observer)

    return add


# ------------------------------------------------------------------ the store


def test_a_read_only_database_file_is_refused_before_training(store, capsys):
    db = Path(store[len("sqlite:///") :])
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here (needs root on ext4/overlay/tmpfs)")
    try:
        assert os.access(db.parent, os.W_OK)  # the folder is writable: only the file is not
        assert main(_args(store)) == 2
        err = _one_error_line(capsys)
        assert "read-only" in err and str(db) in err and "chattr -i" in err
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    assert _runs(store) == []


def test_a_full_disk_under_the_store_is_one_line_at_start_and_mid_run(
    template, tmpfs, inject, capsys
):
    disk = tmpfs(2048)
    shutil.copy(template, disk / "mlflow.db")
    uri = f"sqlite:///{disk / 'mlflow.db'}"
    _fill(disk)
    assert main(_args(uri)) == 2  # refused at the start: not even a transaction fits
    assert "the disk is full" in _one_error_line(capsys)
    (disk / "filler").unlink()
    assert _runs(uri) == []

    inject(_At("alpha", lambda: _fill(disk)))  # the disk fills up while the run goes on
    assert main(_args(uri)) == 2
    err = _one_error_line(capsys)
    (run,) = _runs(uri)
    assert "the disk is full" in err and f"--resume {run.info.run_id}" in err
    (disk / "filler").unlink()
    # With no byte left even its FAILED state could not be written; nothing recorded is
    # lost, and once there is room the same command continues it.
    client = MlflowClient(uri)
    assert client.get_run(run.info.run_id).info.status in ("RUNNING", "FAILED")
    inject(None)
    assert main(_args(uri, "--resume", run.info.run_id)) == 0
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, L.VAL_ACC)] == [0, 1, 2]


def test_a_full_temp_folder_is_one_line_and_the_run_fails_with_the_reason(
    store, tmpfs, monkeypatch, capsys
):
    small = tmpfs(64)  # a checkpoint of the tiny run takes a few hundred KiB
    monkeypatch.setattr(tempfile, "tempdir", str(small))
    assert main(_args(store)) == 2
    err = _one_error_line(capsys)
    assert "cannot write the checkpoint" in err and "disk is full" in err and "TMPDIR" in err
    (run,) = _runs(store)
    assert run.info.status == "FAILED" and "TMPDIR" in run.data.tags[L.TAG_ERROR]
    assert not list(small.glob("asolab-run-*"))  # its local folder went with it


def _corrupt(db: Path, table: str) -> None:
    """Overwrite the first bytes of the root pages of ``table`` and its indexes: the
    schema still reads, the table does not."""
    con = sqlite3.connect(db)
    pages = [
        p for (p,) in con.execute("SELECT rootpage FROM sqlite_master WHERE tbl_name = ?", (table,))
    ]
    size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(db, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * size)
            f.write(b"\xff" * 16)


def test_a_corrupt_database_is_one_line_for_run_resume_and_compare(store, capsys):
    _corrupt(Path(store[len("sqlite:///") :]), "runs")
    for argv in (
        _args(store),
        _args(store, "--resume", "0123abcd"),
        ["compare", "--tracking-uri", store],
    ):
        assert main(argv) == 2, argv
        err = _one_error_line(capsys)
        assert "corrupt" in err and "--filter" not in err and "restore" in err, err


def test_a_corrupt_store_is_refused_before_anything_is_written_to_it(store, capsys):
    """D64: the check runs in a read-only transaction before the first write, so the
    file a new experiment would have gone into stays byte for byte as it was."""
    db = Path(store[len("sqlite:///") :])
    _corrupt(db, "runs")
    before = db.read_bytes()
    assert main(_args(store, "--experiment", "garbtest")) == 2
    err = _one_error_line(capsys)
    assert "corrupt" in err and "restore" in err, err
    assert db.read_bytes() == before


# ------------------------------------------------------------------ resume


def _interrupted(uri: str, inject, phase: str = "retrain") -> str:
    """A run stopped by Ctrl-C in ``phase`` of its only cycle; its id."""

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    inject(_At(phase, ctrl_c))
    before = {r.info.run_id for r in _runs(uri)}
    assert main(_args(uri)) == 130
    (run_id,) = {r.info.run_id for r in _runs(uri)} - before
    return run_id


def test_a_resume_refuses_another_runs_checkpoint(store, inject, capsys):
    first = _interrupted(store, inject)
    second = _interrupted(store, inject)
    client = MlflowClient(store)

    def local(run_id: str) -> Path:
        uri = client.get_run(run_id).info.artifact_uri
        return Path(uri[len("file://") :]) / L.CHECKPOINT_ARTIFACT

    shutil.copy(local(second), local(first))  # a valid checkpoint, of the other run
    inject(None)  # no more Ctrl-C
    capsys.readouterr()
    assert main(_args(store, "--resume", first)) == 2
    err = _one_error_line(capsys)
    assert f"belongs to run {second}, not to run {first}" in err
    run = client.get_run(first)
    assert run.info.status == "FAILED" and L.TEST_ACC not in run.data.metrics


FREEZE = """
import sys, time
from asolab.cli import main
from asolab.runner import Runner
from asolab.runner.events import Observer

marker = sys.argv[1]

class Freeze(Observer):
    def on_epoch_end(self, event):
        if event.phase == "alpha":
            open(marker, "w").close()
            time.sleep(600)

init = Runner.__init__

def with_freeze(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.observers.append(Freeze())

Runner.__init__ = with_freeze
sys.exit(main(sys.argv[2:]))
"""


def _frozen(tmp_path: Path, argv: list[str], shell: str = "") -> Any:
    """``asolab`` with ``argv`` in a new session (its own process group), frozen at its
    first alpha epoch. Forked from the preloaded server of tests/processes.py (the test
    is about how the process dies, not about an interpreter's start-up), except under
    ``shell`` (``{cmd}`` in it), a real ``bash -c`` pipeline: a forked child's stdio is
    set up by the launcher, and only the shell's pipe reaches the progress bar's write
    the way a user's ``| tee`` does (its BrokenPipeError branch)."""
    marker = tmp_path / "frozen"
    cmd = [sys.executable, "-c", FREEZE, str(marker), *argv]
    popen, extra = processes.Popen, {}
    if shell:
        cmd = ["bash", "-c", shell.format(cmd=" ".join(map(shlex.quote, cmd)))]
        popen = subprocess.Popen
        # A user's shell hands its commands Ctrl-C. A pytest started in the background by a
        # script (``&`` without job control) ignores SIGINT, and bash keeps an ignored
        # signal ignored for all it runs: the run would never see the Ctrl-C sent below.
        extra["preexec_fn"] = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    proc = popen(
        cmd,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        **extra,
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not marker.exists():
        time.sleep(0.1)
    assert marker.exists(), "the run never reached its first alpha epoch"
    return proc


def test_a_run_is_resumed_by_one_process_at_a_time_and_a_dead_ones_folder_is_removed(
    store, tmp_path, monkeypatch, capsys
):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    proc = _frozen(tmp_path, _args(store))
    try:
        (run,) = _runs(store)
        run_id = run.info.run_id
        # While it runs, no second process may run it (it would write every step twice).
        assert main(_args(store, "--resume", run_id)) == 2
        err = _one_error_line(capsys)
        assert f"process {proc.pid}" in err and "kill" in err
        assert MlflowClient(store).get_run(run_id).info.status == "RUNNING"
    finally:
        proc.kill()
        proc.wait()
    (left,) = (tmp_path / "tmp").glob("asolab-run-*")  # SIGKILL left its folder behind
    # A lease refreshed a minute ago by a process on another machine: refused, with the way out.
    client = MlflowClient(store)
    other = {"host": "elsewhere", "pid": 4242, "started": 1.0, "beat": time.time() - 60}
    client.set_tag(run_id, L.TAG_LEASE, json.dumps(other))
    assert main(_args(store, "--resume", run_id)) == 2
    err = _one_error_line(capsys)
    assert "process 4242 on elsewhere" in err and "--force" in err
    assert main(_args(store, "--resume", run_id, "--force")) == 0
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, L.VAL_ACC)] == [0, 1, 2]
    assert not left.exists() and not list((tmp_path / "tmp").glob("asolab-run-*"))


def test_ctrl_c_under_a_pipe_whose_reader_dies_still_closes_the_run(store, tmp_path):
    """``asolab run 2>&1 | cat``, Ctrl-C to the group: the reader dies at once, the run's
    stderr is a broken pipe, and still the run ends KILLED and records how to continue."""
    (tmp_path / "tmp").mkdir()
    argv = [a for a in _args(store) if a != "--quiet"]  # progress bars on the dying pipe
    proc = _frozen(tmp_path, argv, shell="{cmd} 2>&1 | cat > /dev/null")
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    deadline = time.time() + 60  # the python process may outlive bash by a moment
    while time.time() < deadline and _runs(store)[0].info.status == "RUNNING":
        time.sleep(0.2)
    (run,) = _runs(store)
    command = run.data.tags.get(L.TAG_RESUME_COMMAND, "")
    assert run.info.status == "KILLED"
    assert command.startswith(f"asolab run --resume {run.info.run_id}") and store in command
    assert command in run.data.tags[L.TAG_NOTE]
    assert not list((tmp_path / "tmp").glob("asolab-run-*"))


def test_after_a_progress_bar_the_resume_hint_starts_on_its_own_line(tiny_cfg):
    def ctrl_c() -> None:
        raise KeyboardInterrupt

    stream = io.StringIO()
    runner = Runner(tiny_cfg, [ProgressObserver(stream=stream), _At("w_train", ctrl_c)])
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert "W-training" in stream.getvalue() and stream.getvalue().endswith("\n")


def test_stale_local_folders_of_dead_processes_are_removed(tmp_path):
    dead = tmp_path / "asolab-run-999999-x"
    dead.mkdir()
    (dead / ckpt.OWNER_FILE).write_text(json.dumps({"pid": 2**22 + 7, "started": 1.0}))
    (dead / "checkpoint.pt").write_bytes(b"x" * 100)
    reused = tmp_path / "asolab-run-1-y"  # pid 1 lives, but started at another time
    reused.mkdir()
    (reused / ckpt.OWNER_FILE).write_text(json.dumps({"pid": 1, "started": 1.0}))
    live = tmp_path / "asolab-baseline-z"
    live.mkdir()
    own = {"pid": os.getpid(), "started": ckpt.threads.started(os.getpid())}
    (live / ckpt.OWNER_FILE).write_text(json.dumps(own))
    other = tmp_path / "asolab-report-w"  # not a run's folder: left alone
    other.mkdir()
    assert sorted(ckpt.remove_stale(tmp_path)) == sorted([dead, reused])
    assert live.exists() and other.exists()


# ------------------------------------------------------------------ asolab ui


def test_the_ui_never_accepts_any_host_header_on_its_own(capsys, store):
    assert allowed_hosts("127.0.0.1", 5000) == ""
    assert allowed_hosts("10.1.2.3", 5001) == "10.1.2.3:5001,10.1.2.3"
    assert allowed_hosts("0.0.0.0", 5000, "lab:5000, 10.1.2.3:5000") == "lab:5000,10.1.2.3:5000"
    cmd = server_command(store, "10.1.2.3", 5001, allowed=allowed_hosts("10.1.2.3", 5001))
    assert cmd[cmd.index("--allowed-hosts") + 1] == "10.1.2.3:5001,10.1.2.3" and "*" not in cmd
    for argv in (
        ["ui", "--host", "0.0.0.0", "--tracking-uri", store],
        ["ui", "--host", "0.0.0.0", "--allowed-hosts", "*", "--tracking-uri", store],
    ):
        assert main(argv) == 2
        assert "--allowed-hosts" in _one_error_line(capsys)

"""Who runs a run now: so that one run is never run or resumed by two processes at once.

Two ``--resume`` of the same run at the same time would both replay its steps
and write each of them twice. Three guards:

* a lock file per run (``leases/<run id>.lock`` beside a SQLite store, else in
  the temp folder), held with ``flock`` for as long as this process runs the
  run. The operating system drops it when the process dies (SIGKILL included),
  so a dead process never blocks a resume, and nothing needs overriding;
* the ``asolab.lease`` tag (host, pid, process start, heartbeat), written when
  the run starts or resumes and refreshed with every metric batch, for what a
  lock on this machine cannot see: a process on another machine writing to the
  same server or database. A RUNNING run whose lease was refreshed less than
  :data:`STALE_SECONDS` ago by another machine, or that names a live process of
  this one, is refused unless the user says the other process is gone
  (``--force``);
* for two resumes that start at the same instant through a server or another
  shared database, where neither has written its tag when the other reads it:
  each writes the tag with this process's random token, waits longer than the
  write's round trip plus :data:`SETTLE_MARGIN`, and reads it back; only the
  process whose token is there goes on (:func:`_contend`). A rival stalled
  between its read and its write for longer than that wait is the one window
  left (docs/tracking.md).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import layout as L
from .store import TrackingError, sqlite_path

log = logging.getLogger(__name__)

# A lease not refreshed for this long is taken to be dead (a metric batch refreshes it
# at least every phase, and every 30 s of epochs).
STALE_SECONDS = 15 * 60
FORCE_HINT = "--force"
# Seconds a resumer waits after writing its lease tag, beyond twice that write's round
# trip, before it reads the tag back: the time a rival that read the tag just before
# this write may take to write its own (tracking/lease.py _contend).
SETTLE_MARGIN = 1.0
TOKEN = uuid.uuid4().hex  # this process, in its lease tag

_HELD: dict[str, int] = {}  # run id -> the open lock file this process holds


def _forked() -> None:
    """In a forked child (multiprocessing's default start on Linux, a forkserver): a token
    of its own, and none of its parent's leases. With the parent's token two forked
    resumers would each read their shared token back and both win the contest."""
    global TOKEN
    TOKEN = uuid.uuid4().hex
    for fd in _HELD.values():
        # the child's copy only: the parent's descriptor keeps the lock held
        os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def lock_file(uri: str, run_id: str) -> Path:
    """Where the lock of ``run_id`` lives: beside a SQLite store, else in the temp folder."""
    db = sqlite_path(uri)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = (
        db.absolute().parent / "leases"
        if db is not None
        else Path(tempfile.gettempdir()) / f"asolab-leases-{uid}"
    )
    return folder / f"{run_id}.lock"


def _started(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def tag_value() -> str:
    """The ``asolab.lease`` tag for this process, with a fresh heartbeat and the
    process's token (which tells two processes apart on any machines)."""
    pid = os.getpid()
    return json.dumps(
        {
            "host": socket.gethostname(),
            "pid": pid,
            "started": _started(pid),
            "beat": time.time(),
            "token": TOKEN,
        }
    )


def take(uri: str, run_id: str, run: Any = None, force: bool = False) -> None:
    """Hold ``run_id`` for this process. ``run`` (the MLflow run, when it exists
    already) is checked for a live lease of another process; TrackingError names that
    process and how to go on. ``force`` skips the tag check (never the lock: a lock
    is held only by a live process of this machine)."""
    if run_id in _HELD:
        return
    fd = _lock(lock_file(uri, run_id), run_id, uri)
    try:
        if run is not None and not force:
            _check_tag(run, run_id)
        if run is not None and (fd is None or sqlite_path(uri) is None):
            _contend(uri, run_id)  # no lock shared with the other machines: the tag decides
    except BaseException:
        _unlock(fd, lock_file(uri, run_id))
        raise
    if fd is not None:
        _HELD[run_id] = fd


def _contend(uri: str, run_id: str) -> None:
    """Decide between processes that resume ``run_id`` at the same moment and share
    only the tracking server: each writes the lease tag with its own token, waits
    until any write of a process that read the tag before this one's write landed
    has landed too (twice the write's round trip, plus :data:`SETTLE_MARGIN`), and
    reads the tag again. The last write wins, and every contender reads the same
    last write: one goes on, each other one refuses, naming it. A process that
    reads the tag after the wait finds the winner's lease and refuses in
    :func:`_check_tag`."""
    from .store import client

    c = client(uri)
    started = time.monotonic()
    c.set_tag(run_id, L.TAG_LEASE, tag_value())
    round_trip = time.monotonic() - started
    time.sleep(2 * round_trip + SETTLE_MARGIN)
    tag = c.get_run(run_id).data.tags.get(L.TAG_LEASE, "")
    try:
        holder = json.loads(tag)
        won = holder.get("token") == TOKEN
    except (ValueError, AttributeError):
        holder, won = {}, False
    if not won:
        who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
        raise TrackingError(
            f"run {run_id} in {uri} is being resumed by {who}, which took it at the same "
            f"moment; wait for that process to end (the run is then FINISHED, or resumable again)"
        )
    log.debug("lease of run %s won after %.2f s", run_id, time.monotonic() - started)


def release(uri: str, run_id: str) -> None:
    """Give ``run_id`` back (the run ended); a no-op if this process does not hold it."""
    fd = _HELD.pop(run_id, None)
    if fd is not None:
        _unlock(fd, lock_file(uri, run_id))


def _lock(path: Path, run_id: str, uri: str) -> int | None:
    try:
        import fcntl
    except ImportError:  # Windows: the tag alone
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("no lock for run %s (%s): only its lease tag guards it", run_id, exc)
        return None
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 40).decode(errors="replace").strip() or "PID"
            os.close(fd)
            raise TrackingError(
                f"run {run_id} in {uri} is being run by process {holder} on this machine; "
                f"wait for it to end, or stop it (kill {holder}: the run ends KILLED), then resume"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file that its last holder removed as we opened it
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)
    return None


def _unlock(fd: int | None, path: Path) -> None:
    if fd is None:
        return
    try:
        path.unlink(missing_ok=True)  # still locked: whoever opens it now finds it gone
    except OSError:
        pass  # a read-only store folder: the file stays, unlocked, and is reused
    os.close(fd)


def _check_tag(run: Any, run_id: str) -> None:
    if run.info.status != "RUNNING":
        return  # its last process closed it (KILLED, FAILED): nobody runs it
    try:
        lease = json.loads(run.data.tags.get(L.TAG_LEASE, ""))
        host, pid, beat = str(lease["host"]), int(lease["pid"]), float(lease["beat"])
        started = lease.get("started")
    except (ValueError, KeyError, TypeError):
        return  # no lease (an older version, or killed before it wrote one)
    if host == socket.gethostname():
        now = _started(pid)
        alive = pid != os.getpid() and now is not None and started is not None
        if alive and abs(now - float(started)) <= 1.0:
            raise TrackingError(
                f"run {run_id} is being run by process {pid} on this machine; wait for it to "
                f"end or stop it (kill {pid}), then resume (or, if process {pid} is not "
                f"asolab, resume with {FORCE_HINT})"
            )
        return
    age = time.time() - beat
    if age < STALE_SECONDS:
        raise TrackingError(
            f"run {run_id} is being run by process {pid} on {host} (last heard of "
            f"{age / 60:.0f} min ago); if that process is really gone, resume with {FORCE_HINT}"
        )

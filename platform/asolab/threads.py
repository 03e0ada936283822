"""CPU threads: how many torch threads a process takes, so that processes sharing
cores do not collapse.

Two things make several torch processes on a few cores slow each other down by
7-27x: more threads than cores, and OpenMP threads that *spin* while they wait
at the end of every parallel region (libgomp's default), burning the core
another process needs. So:

* :func:`prepare_environment` sets ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads
  sleep) unless the user set it. OpenMP reads it once, when torch loads it, so
  this must run before ``import torch``: the CLI, the benchmarks and the test
  suite call it first thing.
* :func:`acquire` picks the thread count once, at the start of a run. ``0``
  ("auto") means the cores this process may use (its CPU affinity, capped by a
  cgroup CPU quota) minus the threads other live asolab processes of this user
  already took, at least 1. Those are read from a registry: one small file per
  process (pid, process start time, threads) in a per-user folder, written
  atomically under a lock and checked for liveness, so two runs started at the
  same moment see each other. The load average is not used: it lags by a
  minute, and a thread count that depended on it would be a moving target.

The count changes the run (floating-point sums are split differently across
threads), so it is decided once, at the start, and never changed while the run
goes on: the same command with the same seed gives the same result whatever
else starts or ends beside it. The run records the count (the ``threads``
param, the ``asolab.threads`` tag, the ``torch_threads`` metric per epoch) and
``--resume`` continues with it. (An earlier version followed the other
processes during a run, dropping to one thread when another started: faster
beside others, but two seed-0 runs then differed by what else ran.)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# Read by libgomp (torch's OpenMP on Linux) and by Intel's OpenMP alike.
WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")
# Where the registry lives (default: a per-user folder in the temp dir).
REGISTRY_ENV = "ASOLAB_THREADS_DIR"


def prepare_environment() -> bool:
    """Let waiting OpenMP threads sleep instead of spin when other asolab processes
    already run here (unless the user chose a policy). Returns False when torch was
    already imported, which makes it too late.

    Only then: sleeping waits stop the collapse of processes that share cores, but a
    run alone pays a wake-up on every small op (the default digits run measured 2.2x
    slower alone with PASSIVE than with OpenMP's default), and alone it has the cores.
    """
    if "torch" in sys.modules:
        return False
    try:
        shared = bool(others())
    except OSError:  # an unreadable registry: nothing known of other processes
        shared = False
    if shared:
        os.environ.setdefault(*WAIT_POLICY)
    return True


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, quota)) if quota else max(1, cores)


def _cgroup_quota() -> int:
    """Whole CPUs allowed by ``/sys/fs/cgroup/cpu.max`` (0 = no quota or unreadable)."""
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return 0
    if limit == "max":
        return 0
    return max(1, int(int(limit) / int(period)))


def registry_dir() -> Path:
    default = (
        Path(tempfile.gettempdir())
        / f"asolab-threads-{os.getuid() if hasattr(os, 'getuid') else 0}"
    )
    return Path(os.environ.get(REGISTRY_ENV) or default)


def started(pid: int) -> float | None:
    """When process ``pid`` started (None if it is gone): with the pid, it names one process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def others(directory: Path | None = None) -> dict[int, int]:
    """pid -> threads of the other live asolab processes; stale entries are removed."""
    directory = directory or registry_dir()
    out: dict[int, int] = {}
    for path in directory.glob("*.json"):
        try:
            entry = json.loads(path.read_text())
            pid, threads, since = (
                int(entry["pid"]),
                int(entry["threads"]),
                float(entry["started"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written (never: writes are atomic) or foreign; leave it alone
        if pid == os.getpid():
            continue
        now = started(pid)
        if now is None or abs(now - since) > 1.0:  # gone, or the pid was reused
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        out[pid] = threads
    return out


def auto_threads(cores: int | None = None, directory: Path | None = None) -> int:
    """The "auto" rule: usable cores minus the threads other asolab processes took, at least 1."""
    cores = usable_cores() if cores is None else cores
    return max(1, cores - sum(others(directory).values()))


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialise read-decide-write across processes (no-op where fcntl is missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def claim(threads: int, directory: Path | None = None) -> None:
    """Record that this process uses ``threads`` threads (replacing its earlier entry)."""
    directory = directory or registry_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"pid": os.getpid(), "threads": threads, "started": started(os.getpid())})
    )
    os.replace(tmp, path)
    _remove_at_exit(path)


_registered: set[Path] = set()


def _remove_at_exit(path: Path) -> None:
    if path not in _registered:
        _registered.add(path)
        atexit.register(lambda: path.unlink(missing_ok=True))


def acquire(requested: int = 0, directory: Path | None = None) -> int:
    """Decide this process's thread count (``requested``, or the auto rule when 0),
    record it in the registry and set torch to it. Returns the count."""
    import torch

    directory = directory or registry_dir()
    try:
        with _locked(directory):
            threads = requested or auto_threads(directory=directory)
            claim(threads, directory)
    except OSError as exc:  # an unwritable temp dir must not stop a run
        log.warning(
            "thread registry %s unusable (%s); other asolab processes will not see this one",
            directory,
            exc,
        )
        threads = requested or usable_cores()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    log.info("%d torch threads (%s)", threads, "set" if requested else "auto")
    return threads

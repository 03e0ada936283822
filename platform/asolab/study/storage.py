"""Optuna storages for studies: the local journal file, RDB URLs, crash recovery.

The default storage is Optuna's ``JournalStorage`` on a ``JournalFileBackend``
at ``mlruns/optuna-journal.log``: Optuna documents SQLite as unsafe for
concurrent workers, while the journal file is safe for several processes on one
machine. ``postgresql://`` / ``mysql://`` URLs (several machines) become an
``RDBStorage`` with Optuna's heartbeat and its retry callback;
``redis://`` becomes a journal on Redis; a path ending in ``.log`` (or
``journal:///path``) is a journal file.

Optuna 5 has heartbeats only for RDB storages, so for journals asolab does the
equivalent itself: a running trial records its owner (``host:pid``) and a
heartbeat time in its user attributes; when a worker starts (and before each
new trial) RUNNING trials whose owner process is gone on this host, or whose
heartbeat is older than the grace period, are failed and their parameters are
enqueued again (at most ``max_retry`` times).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryFailedTrialCallback
from optuna.trial import FrozenTrial, TrialState

from ..config import PROJECT_ROOT, ConfigError
from ..tracking.layout import TAG_ERROR
from .config import StorageConfig

log = logging.getLogger(__name__)

JOURNAL_NAME = "optuna-journal.log"

ATTR_OWNER = "asolab.owner"  # host:pid of the worker running the trial
ATTR_HEARTBEAT = "asolab.heartbeat"  # unix time of the trial's last heartbeat (journal storages)
ATTR_RETRY_OF = "asolab.retry_of"  # number of the stale trial whose parameters this trial retries
ATTR_RETRIES = "asolab.retries"  # how many times these parameters were retried
ATTR_STALE = "asolab.stale"  # why a trial was failed as stale (its worker died)
ATTR_MLFLOW_RUN = "asolab.mlflow_run_id"  # the trial's MLflow child run
ATTR_ERROR = TAG_ERROR  # one line: why the trial failed


def default_storage_url() -> str:
    return "journal://" + (PROJECT_ROOT / "mlruns" / JOURNAL_NAME).as_posix()


def journal_path(url: str) -> Path | None:
    """The journal file of a ``journal:///path`` URL or a bare ``*.log`` path (None otherwise)."""
    if url.startswith("journal:///"):
        return Path("/" + url[len("journal:///"):].lstrip("/"))
    if "://" not in url and url.endswith(".log"):
        return Path(url)
    return None


def resolve_storage_url(url: str, config_url: str = "") -> str:
    """``--storage``, else the study file's ``storage.url``, else the local journal file."""
    return url or config_url or default_storage_url()


def is_rdb(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "oracle", "mssql")


def make_storage(url: str, settings: StorageConfig) -> BaseStorage:
    """Open the storage a URL names; a bad URL is a one-line ConfigError."""
    path = journal_path(url)
    try:
        if path is not None:
            from optuna.storages.journal import JournalFileBackend

            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path)))
        if url.startswith("redis://"):
            from optuna.storages.journal import JournalRedisBackend

            return JournalStorage(JournalRedisBackend(url))
        if is_rdb(url):
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning, module="optuna")
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning, module=__name__)
            return RDBStorage(
                url,
                heartbeat_interval=settings.heartbeat_interval,
                grace_period=settings.grace_period,
                **_retry_callback(settings.max_retry),
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            )
    except ConfigError:
        raise
    except Exception as exc:  # driver missing, server down, bad credentials...
        raise ConfigError(f"study storage {url!r} cannot be opened ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    raise ConfigError(
        f"study storage {url!r} is not supported; use a journal file (journal:///path/optuna.log or path.log), "
        "sqlite:///file.db (one process), postgresql://user:pass@host/db, mysql://..., or redis://host:port"
    )


def _retry_callback(max_retry: int) -> dict[str, Any]:
    """Optuna >= 4.9 renamed the stale-trial retry callback and its RDBStorage argument."""
    new = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if new is not None:
        return {"heartbeat_stale_trial_callback": new(max_retry=max_retry)}
    return {"failed_trial_callback": RetryFailedTrialCallback(max_retry=max_retry)}


@contextlib.contextmanager
def budget_lock(url: str) -> Iterator[None]:
    """Serialise "count trials, then ask for one" among the workers of one machine.

    Only journal files get a lock (a file beside the journal); with a shared
    database several machines may overshoot the trial budget by a trial or two.
    """
    path = journal_path(url)
    if path is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the budget may overshoot slightly
        yield
        return
    with open(str(path) + ".asolab-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_gone(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid))


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of failed trials whose parameters another trial retries."""
    out: set[int] = set()
    for t in trials:
        n = t.user_attrs.get(ATTR_RETRY_OF)
        if n is None:  # set by Optuna's RetryFailedTrialCallback (RDB storages)
            n = t.system_attrs.get("failed_trial")
        if n is not None:
            out.add(int(n))
    return out


def used_budget(study: optuna.Study) -> int:
    """Trials that count against ``n_trials``: finished or running, not counting
    failed trials whose parameters were retried (the retry counts instead)."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return sum(1 for t in trials if t.state in counted or (t.state == TrialState.FAIL and t.number not in retried))


def recover_stale_trials(study: optuna.Study, settings: StorageConfig, now: float | None = None) -> list[FrozenTrial]:
    """Fail RUNNING trials whose worker died and enqueue their parameters again.

    RDB storages do this with Optuna's own heartbeat (``fail_stale_trials``);
    journal storages with the owner and heartbeat attributes asolab writes.
    Returns the trials that were failed here.
    """
    storage = study._storage
    if isinstance(storage, RDBStorage):
        if storage.is_heartbeat_enabled():
            optuna.storages.fail_stale_trials(study)
        return []
    now = time.time() if now is None else now
    failed: list[FrozenTrial] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = str(t.user_attrs.get(ATTR_OWNER, ""))
        beat = t.user_attrs.get(ATTR_HEARTBEAT)
        if beat is None and t.datetime_start is not None:
            beat = t.datetime_start.timestamp()
        reason = ""
        if owner and _owner_gone(owner):
            reason = f"worker {owner} is gone"
        elif beat is not None and now - float(beat) > settings.grace_period:
            reason = f"no heartbeat for {now - float(beat):.0f} s (grace period {settings.grace_period} s)"
        if not reason:
            continue
        try:
            storage.set_trial_user_attr(t._trial_id, ATTR_STALE, reason)
            storage.set_trial_user_attr(t._trial_id, ATTR_ERROR, f"stale trial: {reason}")
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except (RuntimeError, ValueError):  # another worker got there first
            continue
        log.warning("trial %d of study %s failed as stale: %s", t.number, study.study_name, reason)
        retries = int(t.user_attrs.get(ATTR_RETRIES, 0))
        if retries < settings.max_retry:
            study.enqueue_trial(dict(t.params), user_attrs={ATTR_RETRY_OF: t.number, ATTR_RETRIES: retries + 1})
            log.warning("trial %d's parameters are enqueued again (retry %d of %d)", t.number, retries + 1, settings.max_retry)
        failed.append(t)
    return failed


class Heartbeat:
    """While a trial runs: Optuna's heartbeat thread on RDB storages, asolab's on journals."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial, interval: float) -> None:
        self.study, self.trial, self.interval = study, trial, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._optuna_ctx: Any = None

    def __enter__(self) -> "Heartbeat":
        storage = self.study._storage
        self.trial.set_user_attr(ATTR_OWNER, owner_id())
        if isinstance(storage, RDBStorage):
            from optuna.storages._heartbeat import get_heartbeat_thread

            self._optuna_ctx = get_heartbeat_thread(self.trial._trial_id, storage)
            self._optuna_ctx.__enter__()
            return self
        self.trial.set_user_attr(ATTR_HEARTBEAT, time.time())
        self._thread = threading.Thread(target=self._beat, name=f"asolab-heartbeat-{self.trial.number}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.study._storage.set_trial_user_attr(self.trial._trial_id, ATTR_HEARTBEAT, time.time())
            except Exception:  # the trial finished meanwhile
                return

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._optuna_ctx is not None:
            self._optuna_ctx.__exit__(*exc)

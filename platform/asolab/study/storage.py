"""Optuna storages for studies: the local journal file, RDB URLs, crash recovery.

The default storage is Optuna's ``JournalStorage`` on a ``JournalFileBackend``
at ``optuna-journal.log`` beside the MLflow store (the folder of a local SQLite
tracking URI, else ``./mlruns`` of the working directory): Optuna documents SQLite as unsafe for
concurrent workers, while the journal file is safe for several processes on one
machine. ``postgresql://`` / ``mysql://`` / ``sqlite://`` URLs become an
``RDBStorage`` with Optuna's heartbeat and a stale-trial retry callback;
``redis://`` becomes a journal on Redis; a path ending in ``.log`` (or
``journal:///path``) is a journal file.

Crash recovery, when a worker starts and before each new trial. A running
trial records its owner (``host:pid``) in its user attributes, and a thread
beats while it runs: Optuna's heartbeat on RDB storages (Optuna 5 has none for
journals), the ``asolab.heartbeat`` attribute on journals. A RUNNING trial is
stale, and failed, when

- its owner is on this host and that process is gone (at once, any storage);
- its heartbeat is older than ``grace_period``: on journals asolab checks this
  for owners on other hosts only (a live local owner is never failed); on RDB
  storages Optuna's ``fail_stale_trials`` checks every trial.

A stale trial's parameters are retried in a new trial (at most ``max_retry`` times).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from ..config import ConfigError
from ..errors import first_line
from ..tracking.layout import TAG_ERROR
from ..tracking.store import database_unreachable, foreign_sqlite, mask_password, store_dir
from .config import StorageConfig

log = logging.getLogger(__name__)

JOURNAL_NAME = "optuna-journal.log"

ATTR_OWNER = "asolab.owner"  # host:pid of the worker running the trial
ATTR_OWNER_STARTED = "asolab.owner_started"  # its process start time: tells a reused pid apart
ATTR_HEARTBEAT = "asolab.heartbeat"  # unix time of the trial's last heartbeat (journal storages)
ATTR_RETRY_OF = "asolab.retry_of"  # number of the stale trial whose parameters this trial retries
ATTR_STALE = "asolab.stale"  # why a trial was failed as stale (its worker died)
ATTR_MLFLOW_RUN = "asolab.mlflow_run_id"  # the trial's MLflow child run
ATTR_ERROR = TAG_ERROR  # one line: why the trial failed
# on a GPU: how busy its run kept the GPU's training loops, percent (its last seed's run)
ATTR_GPU_BUSY = "asolab.gpu_busy_pct"
# Attributes of one attempt at running a trial: a retry must not inherit them.
RUN_ATTRS = (
    ATTR_OWNER,
    ATTR_OWNER_STARTED,
    ATTR_HEARTBEAT,
    ATTR_RETRY_OF,
    ATTR_STALE,
    ATTR_MLFLOW_RUN,
    ATTR_ERROR,
    ATTR_GPU_BUSY,
)


def default_storage_url(tracking_uri: str) -> str:
    """The journal file beside the MLflow store ``tracking_uri`` (a resolved URI):
    a study run from one folder never shares its study with another folder's."""
    return "journal://" + (store_dir(tracking_uri) / JOURNAL_NAME).as_posix()


def journal_path(url: str) -> Path | None:
    """The journal file of a ``journal:///path`` URL or a bare ``*.log`` path (None otherwise)."""
    if url.startswith("journal:///"):
        return Path("/" + url[len("journal:///") :].lstrip("/"))
    if "://" not in url and url.endswith(".log"):
        return Path(url)
    return None


def resolve_storage_url(url: str, config_url: str, tracking_uri: str) -> str:
    """``--storage``, else the study file's ``storage.url``, else the journal file beside
    the MLflow store ``tracking_uri``."""
    return url or config_url or default_storage_url(tracking_uri)


def journal_missing(url: str) -> bool:
    """Whether ``url`` names a journal file that does not exist (yet): a read-only
    command must not create it, nor its folder."""
    path = journal_path(url)
    return path is not None and not path.is_file()


def is_rdb(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in (
        "sqlite",
        "postgresql",
        "mysql",
        "oracle",
        "mssql",
    )


def is_sqlite(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] == "sqlite"


def make_storage(url: str, settings: StorageConfig) -> BaseStorage:
    """Open the storage a URL names; a bad URL is a one-line ConfigError."""
    path = journal_path(url)
    try:
        if path is not None:
            from optuna.storages.journal import JournalFileBackend

            path.parent.mkdir(parents=True, exist_ok=True)
            _check_journal(path)
            return JournalStorage(JournalFileBackend(str(path)))
        if url.startswith("redis://"):
            from optuna.storages.journal import JournalRedisBackend

            with warnings.catch_warnings():  # experimental in Optuna; asolab documents it
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return JournalStorage(JournalRedisBackend(url))
        if is_rdb(url):
            _check_rdb(url)
            return _rdb_storage(url, settings)
    except ConfigError:
        raise
    except Exception as exc:  # driver missing, server down, bad credentials...
        raise ConfigError(
            f"study storage {mask_password(url)!r} cannot be opened ({type(exc).__name__}: "
            f"{first_line(exc)})"
        ) from None
    raise ConfigError(
        f"study storage {mask_password(url)!r} is not supported; use a journal file "
        "(journal:///path/optuna.log or path.log), sqlite:///file.db (one process), "
        "postgresql://user:pass@host/db, mysql://..., or redis://host:port"
    )


def _check_journal(path: Path) -> None:
    """Refuse a file that is not an Optuna journal (one JSON operation per line):
    Optuna would append its own lines to it, and fail later with an assertion."""
    if path.is_dir():
        raise ConfigError(
            f"study storage {path} is a directory; give a journal file such as "
            f"{path / JOURNAL_NAME}"
        )
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as fh:
        first = fh.readline(1 << 20)
    try:
        ok = first.endswith(b"\n") and "op_code" in json.loads(first.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(
            f"study storage {path} is not an Optuna journal file (its first line is not a journal "
            f"entry); give a new file, or the journal the study was started with"
        )


# Tables of every Optuna RDB storage; a SQLite file without them belongs to something else.
OPTUNA_TABLES = frozenset({"studies", "trials", "version_info"})


def _check_rdb(url: str) -> None:
    """One line, before Optuna opens the storage: a SQLite file that holds something
    else (Optuna would add its tables to it), or a database server that does not
    answer (Optuna would retry for minutes, with a warning each time)."""
    fix = "omit --storage for the local journal file"
    if is_sqlite(url):
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        reason = foreign_sqlite(Path(path), OPTUNA_TABLES, "an Optuna storage") if path else ""
        if reason:
            raise ConfigError(f"study storage {url}: {reason}; give a new file or {fix}")
        return
    reason = database_unreachable(url)
    if reason:
        raise ConfigError(
            f"study storage {mask_password(url)!r} cannot be reached ({reason}); "
            f"start the database or fix the URL, or {fix}"
        )


def _rdb_storage(url: str, settings: StorageConfig, attempts: int = 5) -> RDBStorage:
    """Optuna's RDB storage with its heartbeat and stale-trial retry.

    Machines started at the same moment on an empty database race to create
    Optuna's tables. A loser gets an IntegrityError (its CREATE waited for the
    winner's and then collided in the catalog) or a ProgrammingError "already
    exists" (the winner committed between its check and its CREATE); opening
    again finds the tables the winner made.
    """
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                # Optuna flags the heartbeat arguments as experimental; asolab relies on them
                # knowingly.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    heartbeat_interval=settings.heartbeat_interval,
                    grace_period=settings.grace_period,
                    heartbeat_stale_trial_callback=RetryStaleTrial(settings.max_retry),
                    engine_kwargs={"pool_pre_ping": True} if not is_sqlite(url) else None,
                )
        except (IntegrityError, ProgrammingError) as exc:
            lost_race = isinstance(exc, IntegrityError) or "already exists" in str(exc)
            if not lost_race or attempt + 1 == attempts:
                raise
            log.info(
                "study storage %s: tables created concurrently by another process; opening again",
                mask_password(url),
            )
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


class RetryStaleTrial:
    """Retries a stale trial's parameters: Optuna's retry callback, minus the dead attempt.

    Optuna's callback copies every user attribute into the retry. The dead
    attempt's MLflow run id, owner, heartbeat and error must not come along: a
    retry that failed before creating its own MLflow run would otherwise write
    into the dead trial's run, and it would look owned by a dead worker. The
    retry gets ``asolab.retry_of`` = the number of the trial it retries; Optuna
    keeps the whole chain in the ``retry_history`` system attribute.
    """

    def __init__(self, max_retry: int) -> None:
        self.max_retry = max_retry
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._optuna = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        attempt = len(trial.system_attrs.get("retry_history", [])) + 1
        if attempt > self.max_retry:
            log.warning(
                "trial %d's parameters are not retried (storage.max_retry = %d reached)",
                trial.number,
                self.max_retry,
            )
            return
        clean = copy.deepcopy(trial)
        clean.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in RUN_ATTRS}
        clean.user_attrs[ATTR_RETRY_OF] = trial.number
        self._optuna(study, clean)
        log.warning(
            "trial %d's parameters are retried in a new trial (retry %d of %d)",
            trial.number,
            attempt,
            self.max_retry,
        )


def storage_of(owner: optuna.Study | optuna.Trial) -> BaseStorage:
    """The storage a study (or a live trial's study) reads and writes: what
    ``optuna.load_study`` was given, or Optuna's cache around it.

    A live trial says it publicly (``Trial.storage``). A study alone has no public
    accessor, so that case is the one use of Optuna's private ``Study._storage``
    (pinned by ``test_storage_of_reaches_the_studys_storage``): recovering stale
    trials needs the storage to write attributes of trials other workers own.
    """
    if isinstance(owner, optuna.Trial):
        return owner.storage
    return owner._storage


def trial_id(owner: optuna.Study | optuna.Trial, number: int) -> int:
    """The storage's id of trial ``number`` of a study (or of a live trial's study),
    through the storage's public API."""
    storage = storage_of(owner)
    study = owner.study if isinstance(owner, optuna.Trial) else owner
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def optuna_heartbeat(owner: optuna.Study | optuna.Trial) -> Any | None:
    """The study's storage when Optuna keeps heartbeats in it (RDB storages), else None.

    Optuna wraps RDB storages in a cache, so ``isinstance(..., RDBStorage)`` would
    not tell; the heartbeat interval does.
    """
    storage = storage_of(owner)
    interval = getattr(storage, "get_heartbeat_interval", None)
    return storage if interval is not None and interval() is not None else None


def lock_path(url: str) -> Path:
    """This machine's budget lock file for a storage (any kind), keyed by the storage."""
    journal = journal_path(url)
    key = f"journal:{journal.resolve()}" if journal is not None else url
    return (
        Path(tempfile.gettempdir())
        / f"asolab-study-{hashlib.sha256(key.encode()).hexdigest()[:16]}.lock"
    )


@contextlib.contextmanager
def budget_lock(url: str) -> Iterator[None]:
    """Serialise "count trials, then ask for one" among the workers of this machine.

    A lock file in the temporary directory, named after the storage, so that K
    workers on one machine never overshoot ``n_trials`` whatever the storage;
    several machines sharing a database may overshoot by a trial or two.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the budget may overshoot slightly
        yield
        return
    try:
        fh = open(lock_path(url), "a")
    except OSError as exc:
        log.warning("no budget lock (%s); parallel workers may overshoot n_trials", exc)
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def process_started(pid: int) -> float:
    """A process's start time as psutil computes it (the same way for every process of a host)."""
    import psutil

    return psutil.Process(pid).create_time()


def _owner_alive(pid: int, owner_started: float | None) -> bool:
    """Whether the worker process that owns a trial still runs on this host.

    A zombie is gone; so is a process that started at another time than the
    owner did: the owner's pid was reused by another program.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # a second of slack: the boot time psutil adds moves when the clock is set
        return owner_started is None or abs(proc.create_time() - float(owner_started)) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists, but we may not look at it
        return True


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of failed trials whose parameters another trial retries."""
    out: set[int] = set()
    for t in trials:
        if ATTR_RETRY_OF in t.user_attrs:
            out.add(int(t.user_attrs[ATTR_RETRY_OF]))
        # Optuna's "failed_trial" names only the first trial of a retry chain;
        # "retry_history" names every trial of it, the middle ones included.
        out.update(int(n) for n in t.system_attrs.get("retry_history", []))
    return out


def used_budget(study: optuna.Study) -> int:
    """Trials that count against ``n_trials``: finished or running, not counting
    failed trials whose parameters were retried (the retry counts instead)."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return sum(
        1
        for t in trials
        if t.state in counted or (t.state == TrialState.FAIL and t.number not in retried)
    )


@dataclass(frozen=True)
class StaleTrial:
    """A trial failed because its worker died: ``trial`` is its last RUNNING state
    (with its MLflow run id), ``reason`` one line for the MLflow run."""

    trial: FrozenTrial
    reason: str


def _stale_reason(t: FrozenTrial, grace_period: int, now: float, check_heartbeat: bool) -> str:
    """Why a RUNNING trial is stale, or '' when it is not."""
    owner = str(t.user_attrs.get(ATTR_OWNER, ""))
    host, _, pid = owner.rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        # Ask the OS rather than the heartbeat: a live owner may only be slow to
        # beat (a busy machine, a slow disk), and failing its trial would run it twice.
        alive = _owner_alive(int(pid), t.user_attrs.get(ATTR_OWNER_STARTED))
        return "" if alive else f"worker {owner} is gone"
    if not check_heartbeat:  # RDB storages: Optuna's heartbeat decides
        return ""
    beat = t.user_attrs.get(
        ATTR_HEARTBEAT, t.datetime_start.timestamp() if t.datetime_start else None
    )
    if beat is not None and now - float(beat) > grace_period:
        return f"no heartbeat for {now - float(beat):.0f} s (grace period {grace_period} s)"
    return ""


def _fail_stale(study: optuna.Study, t: FrozenTrial, reason: str, retry: RetryStaleTrial) -> bool:
    """Fail one stale trial and retry its parameters; False if another worker got there first."""
    # Optuna has no public way to set attributes of a trial this process did not ask
    # for: through the storage, which every worker shares.
    storage, tid = storage_of(study), trial_id(study, t.number)
    try:
        storage.set_trial_user_attr(tid, ATTR_STALE, reason)
        storage.set_trial_user_attr(tid, ATTR_ERROR, f"stale trial: {reason}")
        failed = study.tell(t.number, state=TrialState.FAIL)
    except (RuntimeError, ValueError):  # already finished: another worker failed it
        return False
    retry(study, failed)
    return True


def _fail_optuna_stale(
    study: optuna.Study, running: dict[int, FrozenTrial], grace_period: int
) -> list[StaleTrial]:
    """Optuna's heartbeat check (RDB storages): the trials it failed, of those RUNNING before.

    ``fail_stale_trials`` says nothing about what it failed, so compare with the
    trials RUNNING before it: one now FAIL without ``asolab.error`` was failed
    here (a trial that failed in its worker always carries that attribute).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # runs the storage's RetryStaleTrial for each
    return [
        StaleTrial(running[t.number], f"no heartbeat for over {grace_period} s (Optuna heartbeat)")
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.number in running and ATTR_ERROR not in t.user_attrs
    ]


def recover_stale_trials(
    study: optuna.Study, settings: StorageConfig, now: float | None = None
) -> list[StaleTrial]:
    """Fail the RUNNING trials whose worker died and retry their parameters.

    Returns the trials failed here, so that their MLflow runs can say so.
    """
    now = time.time() if now is None else now
    rdb = optuna_heartbeat(study)
    retry = RetryStaleTrial(settings.max_retry)
    running = {t.number: t for t in study.get_trials(deepcopy=True, states=(TrialState.RUNNING,))}
    stale: list[StaleTrial] = []
    for t in running.values():
        reason = _stale_reason(t, settings.grace_period, now, check_heartbeat=rdb is None)
        if reason and _fail_stale(study, t, reason, retry):
            stale.append(StaleTrial(t, reason))
    if rdb is not None:
        stale += _fail_optuna_stale(study, running, settings.grace_period)
    for s in stale:
        log.warning(
            "trial %d of study %s failed as stale: %s", s.trial.number, study.study_name, s.reason
        )
    return stale


class Heartbeat:
    """While a trial runs, a thread beats every ``interval`` seconds: Optuna's
    heartbeat on RDB storages, the ``asolab.heartbeat`` attribute on journals.

    A failed beat (a network blip, a locked database) is logged and the thread
    keeps beating: stopping would let the live trial be failed as stale. It
    stops when the block ends, or when the storage says the trial has finished.
    """

    def __init__(self, study: optuna.Study, trial: optuna.Trial, interval: float) -> None:
        self.study, self.trial, self.interval = study, trial, interval
        self._rdb = optuna_heartbeat(trial)
        self._trial_id = trial_id(trial, trial.number)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self.trial.set_user_attr(ATTR_OWNER, owner_id())
        self.trial.set_user_attr(ATTR_OWNER_STARTED, process_started(os.getpid()))
        self.beat()  # at once: a worker killed before its first interval is found too
        self._thread = threading.Thread(
            target=self._run, name=f"asolab-heartbeat-{self.trial.number}", daemon=True
        )
        self._thread.start()
        return self

    def beat(self) -> bool:
        """One heartbeat; False once the trial has finished (no more beats needed)."""
        try:
            if self._rdb is not None:
                self._rdb.record_heartbeat(self._trial_id)
            else:
                # not trial.set_user_attr: that also writes the Trial's cache, which the trial's
                # thread reads
                storage = storage_of(self.trial)
                storage.set_trial_user_attr(self._trial_id, ATTR_HEARTBEAT, time.time())
        except optuna.exceptions.UpdateFinishedTrialError:
            # Told meanwhile, here or by another worker that judged it stale
            # (the trial's own tell then reports that clash): nothing to keep alive.
            log.debug("trial %d has finished; its heartbeat stops", self.trial.number)
            return False
        except Exception as exc:
            log.warning(
                "heartbeat of trial %d failed (%s: %s); trying again in %s s",
                self.trial.number,
                type(exc).__name__,
                first_line(exc),
                self.interval,
            )
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.beat():
                return

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

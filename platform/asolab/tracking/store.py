"""Where runs are recorded: resolving the tracking URI, checking it, and the
experiment and checkpoint plumbing shared by the tracker, the CLI and ``asolab ui``.

The default store is MLflow's SQLite backend at ``./mlruns/mlflow.db`` of the
working directory (the project root when run from a checkout) with artifacts
under ``./mlruns/artifacts/``. ``tracking.tracking_uri``
in the experiment file, else ``MLFLOW_TRACKING_URI``, points elsewhere (another
SQLite file, or a remote ``mlflow server``). This module imports mlflow only
inside the functions that need it, so the CLI starts fast.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import first_line
from .environment import quiet_mlflow

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

DB_NAME = "mlflow.db"
ARTIFACTS_DIRNAME = "artifacts"
CHECKPOINT_FILE = "checkpoint.pt"


class TrackingError(RuntimeError):
    """The tracking store cannot be used; one line naming the URI and the fix."""


# Tables every MLflow SQLite store has; a database without them belongs to something else.
MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "params", "tags"})


def default_store_dir() -> Path:
    """``./mlruns`` of the working directory (the project root when run from a checkout)."""
    return Path.cwd() / "mlruns"


def default_tracking_uri() -> str:
    """``sqlite:///<working directory>/mlruns/mlflow.db``."""
    return f"sqlite:///{default_store_dir() / DB_NAME}"


def store_dir(uri: str) -> Path:
    """The folder of the store ``uri`` names: a local SQLite file's folder, else
    :func:`default_store_dir`. The Optuna journal of studies lies there, beside MLflow's
    database, so that one folder holds a project's whole record."""
    db = sqlite_path(uri)
    return db.absolute().parent if db is not None else default_store_dir()


def resolve_tracking_uri(config_uri: str = "") -> str:
    """The config's URI, else ``MLFLOW_TRACKING_URI``, else :func:`default_tracking_uri`."""
    return config_uri or os.environ.get("MLFLOW_TRACKING_URI", "") or default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other scheme)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :])


def artifact_root(uri: str) -> Path | None:
    """Where artifacts of a SQLite store live: ``artifacts/`` beside the database.

    Absolute even for a relative ``sqlite:///mlflow.db``: MLflow stores artifact
    locations as ``file://`` URIs, which cannot be relative."""
    db = sqlite_path(uri)
    return None if db is None else db.absolute().parent / ARTIFACTS_DIRNAME


def _fix_hint(uri: str) -> str:
    return (
        "start the server (mlflow server --host 127.0.0.1 --port N), point tracking.tracking_uri "
        "or MLFLOW_TRACKING_URI at a reachable store, or run with --no-track"
    )


def check_reachable(uri: str, timeout: float = 3.0) -> None:
    """Raise :class:`TrackingError` unless runs can be written to ``uri``.

    Called before training starts so that a wrong URI costs seconds, not a run.
    Ends with one real API call: a server's ``/health`` answers even where its
    API refuses the client (MLflow exempts it from the Host-header check), and
    a SQLite file can exist without being an MLflow database.
    """
    if uri.startswith(("http://", "https://")):
        _check_health(
            uri, timeout
        )  # first: it fails fast, where the client would retry for minutes
        _check_api(uri)
        return
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(
                f"tracking store {uri}: cannot create {db.parent} ({exc.strerror}); choose "
                "another tracking.tracking_uri"
            ) from None
        if not os.access(db.parent, os.W_OK):
            raise TrackingError(
                f"tracking store {uri}: {db.parent} is not writable; choose another "
                "tracking.tracking_uri"
            )
        check_sqlite_store(uri)
        from .health import check_writable_db

        check_writable_db(uri)  # a read-only file in a writable folder, a full disk
        _check_api(uri)
        return
    if uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking URI {uri!r} is MLflow's old file store, which MLflow 3 refuses; "
            f"use a SQLite store such as {default_tracking_uri()!r} or a tracking server"
        )
    reason = database_unreachable(uri, timeout)  # another database (postgresql://, mysql://, ...)
    if reason:
        raise TrackingError(
            f"tracking store {mask_password(uri)} cannot be reached ({reason}); start the "
            "database or fix the URL in tracking.tracking_uri / MLFLOW_TRACKING_URI, or run with "
            "--no-track"
        )
    _check_api(uri)


# Drivers whose connect() takes a timeout in seconds; without one a dead host waits minutes.
_CONNECT_TIMEOUT_ARG = {"postgresql": "connect_timeout", "mysql": "connect_timeout"}


def database_unreachable(url: str, timeout: float = 5.0) -> str:
    """Why a SQLAlchemy database URL cannot be connected to, in one line ('' if it can).

    One attempt with a short connect timeout: MLflow and Optuna retry a refused
    connection for minutes, with a warning each time, before they give up.
    """
    import sqlalchemy

    dialect = url.split(":", 1)[0].split("+", 1)[0]
    arg = _CONNECT_TIMEOUT_ARG.get(dialect)
    connect_args = {arg: max(1, int(timeout))} if arg else {}
    try:
        engine = sqlalchemy.create_engine(
            url, connect_args=connect_args, poolclass=sqlalchemy.pool.NullPool
        )
    except ModuleNotFoundError as exc:
        return f"its database driver is not installed: No module named {exc.name!r}"
    except Exception as exc:  # a malformed URL, an unknown dialect
        return first_line(exc, named=True, limit=300)
    try:
        with engine.connect():
            return ""
    except Exception as exc:  # OperationalError and friends: refused, unknown host, bad password
        return first_line(getattr(exc, "orig", None) or exc, named=True, limit=300)
    finally:
        engine.dispose()


def mask_password(url: str) -> str:
    """A URL for messages: its password replaced by ***."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':', 1)[0]}:***@{host}"
    return url


def check_sqlite_store(uri: str) -> None:
    """Refuse a SQLite file that is not an MLflow store: not a database at all, or a
    database with tables of its own, which MLflow would silently add its tables to."""
    db = sqlite_path(uri)
    reason = foreign_sqlite(db, MLFLOW_TABLES, "an MLflow store") if db is not None else ""
    if reason:
        raise TrackingError(
            f"tracking store {uri}: {reason}; point tracking.tracking_uri (or --tracking-uri) "
            "at an MLflow database or a new file"
        )


def foreign_sqlite(db: Path, own_tables: frozenset[str], what: str) -> str:
    """Why the SQLite file ``db`` cannot become or be ``what`` ('' if it can): not a
    database, or one with tables but not ``own_tables`` (another program's data).
    A missing or empty file is fine: it becomes a new store."""
    if db.is_dir():
        return f"{db} is a directory, not a database file (such as {db / DB_NAME})"
    if not db.is_file() or db.stat().st_size == 0:
        return ""
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
        try:
            tables = {
                r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if "malformed" in str(exc):
            return (
                f"{db} is corrupt ({exc}); restore it from a backup (sqlite3 {db} .recover may "
                "save its runs)"
            )
        return f"{db} is not an SQLite database ({exc})"
    if tables and not own_tables <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        return (
            f"{db} is a database of something else (tables: {shown}), not {what}; "
            "asolab will not add tables to it"
        )
    return ""


def _check_health(uri: str, timeout: float) -> None:
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            if resp.status >= 400:
                raise TrackingError(
                    f"tracking server {uri} answered HTTP {resp.status} on /health; "
                    f"{_fix_hint(uri)}"
                )
    except urllib.error.HTTPError as exc:
        raise TrackingError(
            f"tracking server {uri} answered HTTP {exc.code}; {_fix_hint(uri)}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(
            f"tracking server {uri} is not reachable ({reason}); {_fix_hint(uri)}"
        ) from None


def _check_api(uri: str) -> None:
    """One read through the MLflow client, the way the run will talk to the store."""
    from mlflow import MlflowClient

    # MLflow announces at INFO level that it creates a new SQLite store's tables;
    # on the user's terminal that is noise before asolab's own output (or error line).
    db_log = logging.getLogger("mlflow.store.db.utils")
    db_log.setLevel(max(db_log.level, logging.WARNING))  # the CLI may have made it quieter
    try:
        open_store(uri)
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # the client raises MlflowException, SQLAlchemy's and requests' errors
        raise TrackingError(_api_failure(uri, exc)) from None


_OPENED: set[str] = set()


def open_store(uri: str) -> None:
    """Let MLflow create (or migrate) a SQLite store's tables under a file lock,
    once per process; other stores are left alone.

    MLflow builds a new SQLite store's tables, and migrates an old one, on first
    use with no lock between processes: two runs started at once on a new store
    race through the same migrations, and one fails ("Online migration expected
    to match one row", "table ... already exists") or both leave the schema half
    migrated for good. The lock file lies beside the database. Every later client
    of ``uri`` in this process reuses the store built here (MLflow caches stores
    per URI).
    """
    db = sqlite_path(uri)
    if db is None or uri in _OPENED:
        return
    from filelock import FileLock  # a dependency of torch; works on every platform
    from mlflow import MlflowClient

    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db) + ".lock"):
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    _OPENED.add(uri)


def _api_failure(uri: str, exc: Exception) -> str:
    """One line: what the store answered, and the fix."""
    from .health import store_failure

    failure = store_failure(exc, uri)
    if failure is not None:
        return str(failure)
    text = " ".join(str(exc).split())
    status = _http_status(exc)
    if status == 403 and "Invalid Host header" in text:
        host = urllib.parse.urlsplit(uri).netloc
        return (
            f"tracking server {uri} refuses requests addressed to {host!r} (HTTP 403 Invalid Host "
            f"header); start it with mlflow server --allowed-hosts {host} (or "
            f"MLFLOW_SERVER_ALLOWED_HOSTS={host})"
        )
    if status in (401, 403):
        return (
            f"tracking server {uri} refused the request (HTTP {status}); set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, "
            "for that server"
        )
    what = "tracking server" if uri.startswith(("http://", "https://")) else "tracking store"
    detail = f"{type(exc).__name__}: {text}"[:300]
    fix = (
        "point tracking.tracking_uri at an MLflow database (or a new file), or run with --no-track"
        if sqlite_path(uri) is not None
        else _fix_hint(uri)
    )
    return f"{what} {uri} cannot be used ({detail}); {fix}"


def _http_status(exc: Any) -> int | None:
    try:
        return int(exc.get_http_status_code())
    except Exception:  # not an MlflowException, or one without an HTTP status
        return None


def client(uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "experiment"


def ensure_experiment(mlflow_client: MlflowClient, uri: str, name: str) -> str:
    """The id of experiment ``name``, created if needed (restored if deleted), tagged
    for the MLflow UI (:mod:`asolab.tracking.browse`).

    In a SQLite store its artifacts go to ``artifacts/<name>/`` beside the
    database, never to ``./mlartifacts`` of whatever folder the run started in.
    """
    from mlflow.exceptions import MlflowException

    from .browse import experiment_tags, tag_experiment

    exp = mlflow_client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            mlflow_client.restore_experiment(exp.experiment_id)
        # Experiments made before asolab described them get the UI's tags once.
        tag_experiment(mlflow_client, exp.experiment_id, name, exp.tags)
        return exp.experiment_id
    root = artifact_root(uri)
    location = (root / _safe(name)).as_uri() if root is not None else None
    try:
        return mlflow_client.create_experiment(
            name, artifact_location=location, tags=experiment_tags(name)
        )
    except MlflowException:
        # Another process (a parallel study worker) created it first.
        exp = mlflow_client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


class RunNotFound(LookupError):
    """No run, or more than one, answers to what the user typed; the message says which."""


_ID_PREFIX = re.compile(r"[0-9a-f]{4,32}")


def find_run(mlflow_client: MlflowClient, ref: str, where: str = "the tracking store") -> Any:
    """The run ``ref`` names: its id, a unique prefix of its id (the short ids that
    ``asolab compare`` and the summaries print) or its run name.

    RunNotFound when nothing matches, or when a prefix or a name matches several runs
    (the message lists them, so the user can pick the full id); ``where`` names the
    store in that message.
    """
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    from .health import store_failure

    ref = ref.strip()
    try:
        return mlflow_client.get_run(ref)
    except MlflowException as exc:  # not a full id (a prefix or a name), or a broken store
        failure = store_failure(exc, mlflow_client.tracking_uri)
        if failure is not None:
            raise failure from None
    clauses = []
    if _ID_PREFIX.fullmatch(ref):
        clauses.append(f"attributes.run_id LIKE '{ref}%'")
    if ref and "'" not in ref:
        clauses.append(f"attributes.run_name = '{ref}'")
    exp_ids = [e.experiment_id for e in mlflow_client.search_experiments(ViewType.ACTIVE_ONLY)]
    matches: dict[str, Any] = {}
    for clause in clauses:
        # One search per clause: MLflow's filter language has no OR.
        for run in mlflow_client.search_runs(exp_ids, clause, max_results=50):
            matches[run.info.run_id] = run
    if len(matches) == 1:
        return next(iter(matches.values()))
    if not matches:
        raise RunNotFound(f"run {ref!r} not found in {where}")
    listed = ", ".join(sorted(f"{r.info.run_id} ({r.info.run_name})" for r in matches.values()))
    raise RunNotFound(f"{ref!r} names {len(matches)} runs in {where}: {listed}; give the full id")


def resumable_run(mlflow_client: MlflowClient, uri: str, run_id: str) -> Any:
    """The MLflow run ``run_id`` if it can be resumed; TrackingError if it is
    not in the store, or has FINISHED (resuming would train and log it again).
    ``run_id`` may be an id prefix or a run name (:func:`find_run`)."""
    try:
        run = find_run(mlflow_client, run_id, f"tracking store {uri}")
    except RunNotFound as exc:
        raise TrackingError(
            f"{exc}; check the run id, and resume with "
            "the experiment file and tracking.tracking_uri (or MLFLOW_TRACKING_URI) the run was "
            "started with"
        ) from None
    if run.info.status == "FINISHED":
        raise TrackingError(
            f"run {run.info.run_id} in {uri} has FINISHED; there is nothing to resume "
            "(start a new run)"
        )
    return run


def download_checkpoint(uri: str, run_id: str, dst: str | Path) -> Path | None:
    """Fetch ``checkpoints/checkpoint.pt`` of ``run_id`` into ``dst``; None if the run
    has none yet (it stopped in its first phase); TrackingError if the run cannot be
    resumed (see :func:`resumable_run`) or its checkpoint cannot be fetched."""
    from mlflow.exceptions import MlflowException

    from .layout import CHECKPOINT_DIR

    c = client(uri)
    resumable_run(c, uri, run_id)
    names = [Path(a.path).name for a in c.list_artifacts(run_id, CHECKPOINT_DIR)]
    if CHECKPOINT_FILE not in names:
        return None
    try:
        local = _download(c, run_id, f"{CHECKPOINT_DIR}/{CHECKPOINT_FILE}", dst)
    except (MlflowException, OSError) as exc:
        raise TrackingError(
            f"the checkpoint of run {run_id} in {uri} cannot be fetched ({type(exc).__name__}); "
            "check the store's artifact folder, then resume again"
        ) from None
    return local


def _download(c: MlflowClient, run_id: str, path: str, dst: str | Path) -> Path:
    """One artifact, without MLflow's progress bar (the terminal shows asolab's own
    output, and an error stays one line)."""
    with quiet_mlflow():
        return Path(c.download_artifacts(run_id, path, str(dst)))


def recorded_config(uri: str, run_id: str, dst: str | Path) -> dict[str, Any] | None:
    """The config ``run_id`` recorded when it started (its ``config.json``), or None
    if it was stopped before it recorded one."""
    import json

    from mlflow.exceptions import MlflowException

    from .layout import CONFIG_ARTIFACT

    c = client(uri)
    if CONFIG_ARTIFACT not in [a.path for a in c.list_artifacts(run_id)]:
        return None
    try:
        return json.loads(_download(c, run_id, CONFIG_ARTIFACT, dst).read_text())
    except (MlflowException, OSError, ValueError):
        return None


def mark_failed(uri: str, run_id: str, reason: str) -> None:
    """End ``run_id`` FAILED with ``reason`` in its ``asolab.error`` tag: a run that
    cannot be resumed must not look RUNNING for good. Nothing it recorded is removed,
    and a FAILED run can still be resumed once the reason is gone."""
    from .layout import TAG_ERROR

    c = client(uri)
    c.set_tag(run_id, TAG_ERROR, reason[:8000])
    c.set_terminated(run_id, "FAILED")

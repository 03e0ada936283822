"""Where runs are recorded: resolving the tracking URI, checking it, and the
experiment and checkpoint plumbing shared by the tracker, the CLI and ``asolab ui``.

The default store is MLflow's SQLite backend at ``<project>/mlruns/mlflow.db``
with artifacts under ``<project>/mlruns/artifacts/``. ``tracking.tracking_uri``
in the experiment file, else ``MLFLOW_TRACKING_URI``, points elsewhere (another
SQLite file, or a remote ``mlflow server``). This module imports mlflow only
inside the functions that need it, so the CLI starts fast.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import PROJECT_ROOT

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

DEFAULT_STORE_DIR = PROJECT_ROOT / "mlruns"
DB_NAME = "mlflow.db"
ARTIFACTS_DIRNAME = "artifacts"
CHECKPOINT_FILE = "checkpoint.pt"


class TrackingError(RuntimeError):
    """The tracking store cannot be used; one line naming the URI and the fix."""


def default_tracking_uri() -> str:
    """``sqlite:///<project>/mlruns/mlflow.db``."""
    return f"sqlite:///{DEFAULT_STORE_DIR / DB_NAME}"


def resolve_tracking_uri(config_uri: str = "") -> str:
    """The config's URI, else ``MLFLOW_TRACKING_URI``, else :func:`default_tracking_uri`."""
    return config_uri or os.environ.get("MLFLOW_TRACKING_URI", "") or default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other scheme)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):])


def artifact_root(uri: str) -> Path | None:
    """Where artifacts of a SQLite store live: ``artifacts/`` beside the database."""
    db = sqlite_path(uri)
    return None if db is None else db.parent / ARTIFACTS_DIRNAME


def _fix_hint(uri: str) -> str:
    return (
        "start the server (mlflow server --host 127.0.0.1 --port N), point tracking.tracking_uri or "
        "MLFLOW_TRACKING_URI at a reachable store, or run with --no-track"
    )


def check_reachable(uri: str, timeout: float = 3.0) -> None:
    """Raise :class:`TrackingError` unless runs can be written to ``uri``.

    Called before training starts so that a wrong URI costs seconds, not a run.
    Ends with one real API call: a server's ``/health`` answers even where its
    API refuses the client (MLflow exempts it from the Host-header check), and
    a SQLite file can exist without being an MLflow database.
    """
    if uri.startswith(("http://", "https://")):
        _check_health(uri, timeout)  # first: it fails fast, where the client would retry for minutes
        _check_api(uri)
        return
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"tracking store {uri}: cannot create {db.parent} ({exc.strerror}); choose another tracking.tracking_uri") from None
        if not os.access(db.parent, os.W_OK):
            raise TrackingError(f"tracking store {uri}: {db.parent} is not writable; choose another tracking.tracking_uri")
        _check_api(uri)
        return
    if uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking URI {uri!r} is MLflow's old file store, which MLflow 3 refuses; "
            f"use a SQLite store such as {default_tracking_uri()!r} or a tracking server"
        )
    _check_api(uri)  # another database (postgresql://, mysql://, ...)


def _check_health(uri: str, timeout: float) -> None:
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            if resp.status >= 400:
                raise TrackingError(f"tracking server {uri} answered HTTP {resp.status} on /health; {_fix_hint(uri)}")
    except urllib.error.HTTPError as exc:
        raise TrackingError(f"tracking server {uri} answered HTTP {exc.code}; {_fix_hint(uri)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(f"tracking server {uri} is not reachable ({reason}); {_fix_hint(uri)}") from None


def _check_api(uri: str) -> None:
    """One read through the MLflow client, the way the run will talk to the store."""
    from mlflow import MlflowClient

    # MLflow announces at INFO level that it creates a new SQLite store's tables;
    # on the user's terminal that is noise before asolab's own output (or error line).
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # the client raises MlflowException, SQLAlchemy's and requests' errors
        raise TrackingError(_api_failure(uri, exc)) from None


def _api_failure(uri: str, exc: Exception) -> str:
    """One line: what the store answered, and the fix."""
    text = " ".join(str(exc).split())
    status = _http_status(exc)
    if status == 403 and "Invalid Host header" in text:
        host = urllib.parse.urlsplit(uri).netloc
        return (
            f"tracking server {uri} refuses requests addressed to {host!r} (HTTP 403 Invalid Host header); "
            f"start it with mlflow server --allowed-hosts {host} (or MLFLOW_SERVER_ALLOWED_HOSTS={host})"
        )
    if status in (401, 403):
        return (
            f"tracking server {uri} refused the request (HTTP {status}); set MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, for that server"
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
        return mlflow_client.create_experiment(name, artifact_location=location, tags=experiment_tags(name))
    except MlflowException:
        # Another process (a parallel study worker) created it first.
        exp = mlflow_client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def resumable_run(mlflow_client: MlflowClient, uri: str, run_id: str) -> Any:
    """The MLflow run ``run_id`` if it can be resumed; TrackingError if it is
    not in the store, or has FINISHED (resuming would train and log it again)."""
    from mlflow.exceptions import MlflowException

    try:
        run = mlflow_client.get_run(run_id)
    except MlflowException:
        raise TrackingError(
            f"run {run_id!r} not found in tracking store {uri}; check the run id, and resume with the experiment file "
            "and tracking.tracking_uri (or MLFLOW_TRACKING_URI) the run was started with"
        ) from None
    if run.info.status == "FINISHED":
        raise TrackingError(f"run {run_id} in {uri} has FINISHED; there is nothing to resume (start a new run)")
    return run


def download_checkpoint(uri: str, run_id: str, dst: str | Path) -> Path:
    """Fetch ``checkpoints/checkpoint.pt`` of ``run_id`` into ``dst``; TrackingError if
    the run cannot be resumed (see :func:`resumable_run`) or has no checkpoint."""
    from mlflow.exceptions import MlflowException

    from .layout import CHECKPOINT_DIR

    c = client(uri)
    resumable_run(c, uri, run_id)
    try:
        local = c.download_artifacts(run_id, f"{CHECKPOINT_DIR}/{CHECKPOINT_FILE}", str(dst))
    except (MlflowException, OSError):
        raise TrackingError(
            f"run {run_id!r} in {uri} has no {CHECKPOINT_DIR}/{CHECKPOINT_FILE} to resume from "
            "(it stopped before its first phase ended); start a new run"
        ) from None
    return Path(local)

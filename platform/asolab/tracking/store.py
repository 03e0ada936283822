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
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

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
    """
    if uri.startswith(("http://", "https://")):
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
        return
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"tracking store {uri}: cannot create {db.parent} ({exc.strerror}); choose another tracking.tracking_uri") from None
        if not os.access(db.parent, os.W_OK):
            raise TrackingError(f"tracking store {uri}: {db.parent} is not writable; choose another tracking.tracking_uri")
        return
    if uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking URI {uri!r} is MLflow's old file store, which MLflow 3 refuses; "
            f"use a SQLite store such as {default_tracking_uri()!r} or a tracking server"
        )


def client(uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "experiment"


def ensure_experiment(mlflow_client: MlflowClient, uri: str, name: str) -> str:
    """The id of experiment ``name``, created if needed (restored if deleted).

    In a SQLite store its artifacts go to ``artifacts/<name>/`` beside the
    database, never to ``./mlartifacts`` of whatever folder the run started in.
    """
    from mlflow.exceptions import MlflowException

    exp = mlflow_client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            mlflow_client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    root = artifact_root(uri)
    location = (root / _safe(name)).as_uri() if root is not None else None
    try:
        return mlflow_client.create_experiment(name, artifact_location=location)
    except MlflowException:
        # Another process (a parallel study worker) created it first.
        exp = mlflow_client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def download_checkpoint(uri: str, run_id: str, dst: str | Path) -> Path:
    """Fetch ``checkpoints/checkpoint.pt`` of ``run_id`` into ``dst``; TrackingError if it has none."""
    from mlflow.exceptions import MlflowException

    from .layout import CHECKPOINT_DIR

    c = client(uri)
    try:
        c.get_run(run_id)
    except MlflowException:
        raise TrackingError(f"run {run_id!r} not found in tracking store {uri}; check the run id (asolab ui lists runs)") from None
    try:
        local = c.download_artifacts(run_id, f"{CHECKPOINT_DIR}/{CHECKPOINT_FILE}", str(dst))
    except (MlflowException, OSError):
        raise TrackingError(
            f"run {run_id!r} in {uri} has no {CHECKPOINT_DIR}/{CHECKPOINT_FILE} to resume from "
            "(it stopped before its first phase ended); start a new run"
        ) from None
    return Path(local)

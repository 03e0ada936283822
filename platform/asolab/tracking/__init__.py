"""MLflow tracking: the observer that records runs, the store it writes to, and ``asolab ui``.

``MlflowTracker`` is imported lazily (it pulls in mlflow), so that importing
this package for :class:`TrackingError` or the URI helpers stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .store import TrackingError, check_reachable, default_tracking_uri, resolve_tracking_uri

if TYPE_CHECKING:  # pragma: no cover
    from .mlflow_tracker import MlflowTracker

__all__ = [
    "MlflowTracker",
    "TrackingError",
    "check_reachable",
    "default_tracking_uri",
    "resolve_tracking_uri",
]


def __getattr__(name: str) -> Any:
    if name == "MlflowTracker":
        from .mlflow_tracker import MlflowTracker

        return MlflowTracker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

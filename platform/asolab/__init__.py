"""asolab: ASO-SE neural architecture evolution, tracked in MLflow and tuned with Optuna."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("asolab")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

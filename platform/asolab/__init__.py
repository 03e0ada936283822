"""asolab: ASO-SE neural architecture evolution, tracked in MLflow and tuned with Optuna.

The Python API (docs/python-api.md)::

    import asolab
    result = asolab.run("digits", {"search.cycles": 1})   # -> asolab.RunResult
    cfg = asolab.load_config("digits", {"data.name": "folder"})
    table = asolab.runs(experiment="digits")              # -> pandas.DataFrame
    model = asolab.load_model(result.run_id)              # .predict(images), .network
    asolab.register_dataset("mine", loader)               # data.name = "mine"
    asolab.register_op("conv_7x7", factory)               # space.primitives = [...]

The names load their modules on first use, so ``import asolab`` stays light
(neither torch nor mlflow is imported until a function needs it).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("asolab")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from .api import RunResult, load_config, load_model, register_dataset, register_op, run, runs
    from .data import Arrays

_API = {
    "RunResult": "api",
    "run": "api",
    "load_config": "api",
    "runs": "api",
    "load_model": "api",
    "register_dataset": "api",
    "register_op": "api",
    "Arrays": "data",
}
__all__ = [
    "Arrays",
    "RunResult",
    "load_config",
    "load_model",
    "register_dataset",
    "register_op",
    "run",
    "runs",
]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    raise AttributeError(f"module 'asolab' has no attribute {name!r}")

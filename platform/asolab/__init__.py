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

from typing import TYPE_CHECKING, Any

from .version import __version__ as __version__

if TYPE_CHECKING:
    from .api import RunResult, load_config, load_model, register_dataset, register_op, run, runs
    from .data import Arrays
    from .interrupt import RunStopped

_API = {
    "RunResult": "api",
    "run": "api",
    "load_config": "api",
    "runs": "api",
    "load_model": "api",
    "register_dataset": "api",
    "register_op": "api",
    "Arrays": "data",
    "RunStopped": "interrupt",
}
__all__ = [
    "Arrays",
    "RunResult",
    "RunStopped",
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

"""Compare runs: select them from MLflow, analyse their genotypes, write a report.

``select`` turns runs into :class:`~asolab.compare.select.RunRecord` values and
a pandas table; ``analysis`` derives diffs, distances, op frequencies, clusters
of identical genotypes and per-run evolution; ``report`` renders a
self-contained HTML page; ``cli`` is ``asolab compare``.

Submodules import mlflow and pandas; this package imports them only on first
use of a name, so ``asolab --help`` stays fast.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "CompareError": "select",
    "RunRecord": "select",
    "Selection": "select",
    "Skipped": "select",
    "load_selection": "select",
    "analyse": "analysis",
    "Comparison": "analysis",
    "write_report": "report",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)

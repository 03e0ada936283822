"""The scripts of bench/ imported as modules, for the tests that call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as a fresh module; bench/ goes on ``sys.path`` first, because
    the scripts import their siblings (``_common``, ``search_quality``)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""Control arms of ASO-SE runs, and the supernet's ranking diagnostic.

``arms`` trains a fixed genotype for exactly an ASO-SE run's weight-training
budget (no mlflow); ``run`` turns a recorded ASO-SE run into its control arms
as ordinary tracked runs; ``ranking`` measures how well the supernet ranks
architectures; ``cli`` is ``asolab baseline`` and ``asolab rank``.
"""

from __future__ import annotations

from typing import Any

from .names import ARMS, DEFAULT_ARMS

__all__ = ["ARMS", "DEFAULT_ARMS", "FixedGenotypeRunner", "matched_random", "random_genotype"]


def __getattr__(name: str) -> Any:
    """The runners load on first use (they pull in torch): ``asolab --help`` imports
    this package for the arms' names only."""
    if name in ("FixedGenotypeRunner", "matched_random", "random_genotype"):
        from . import arms

        return getattr(arms, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Control arms of ASO-SE runs, and the supernet's ranking diagnostic.

``arms`` trains a fixed genotype for exactly an ASO-SE run's weight-training
budget (no mlflow); ``run`` turns a recorded ASO-SE run into its control arms
as ordinary tracked runs; ``ranking`` measures how well the supernet ranks
architectures; ``cli`` is ``asolab baseline`` and ``asolab rank``.
"""

from .arms import ARMS, DEFAULT_ARMS, FixedGenotypeRunner, matched_random, random_genotype

__all__ = ["ARMS", "DEFAULT_ARMS", "FixedGenotypeRunner", "matched_random", "random_genotype"]

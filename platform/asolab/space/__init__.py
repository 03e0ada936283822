"""The search space: operations, genotypes, cells and the supernet."""

from .genotype import Genotype, diff, distance
from .network import DerivedNetwork, SearchNetwork
from .ops import OPS, PRIMITIVES, register_op
from .spec import ArchSpec, CellSpec

__all__ = [
    "OPS",
    "PRIMITIVES",
    "ArchSpec",
    "CellSpec",
    "DerivedNetwork",
    "Genotype",
    "SearchNetwork",
    "diff",
    "register_op",
    "distance",
]

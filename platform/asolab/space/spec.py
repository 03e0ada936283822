"""Architecture spec: the network's shape as data.

The spec (channels per cell, which cells reduce, which have their own alphas,
steps, primitives, stem) is everything needed to rebuild a network's modules
and alphas before loading its weights. It is saved with every checkpoint, so
a network that grew during a run is rebuilt at its grown size on resume.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..config import SpaceConfig
from .genotype import CELL_TYPES, own_cell_name


@dataclass(frozen=True)
class CellSpec:
    """One cell: its per-node channel count, whether it halves the resolution,
    whether it is a residual cell added by growth (output = input + gate * cell),
    the branches growth added to it: ``(node, input, op)`` extra paths, each
    with its own op module and a zero-initialised gate (see evolution/morphism.py),
    and whether it has its own alpha matrix (``own_alphas``, set by deepen)
    instead of sharing its cell type's."""

    channels: int
    reduction: bool = False
    residual: bool = False
    branches: tuple[tuple[int, int, str], ...] = ()
    own_alphas: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellSpec:
        # Specs saved before a field existed lack it and take its default.
        branches = tuple((int(k), int(j), str(op)) for k, j, op in d.get("branches", ()))
        return cls(**{**d, "branches": branches})


def edge_stride(reduction: bool, input_index: int) -> int:
    """The stride of an edge: 2 on a reduction cell's edges from its two inputs."""
    return 2 if reduction and input_index < 2 else 1


def halved(height: int) -> int:
    """The height after a stride-2 op (3x3 padding 1, or FactorizedReduce)."""
    return (height + 1) // 2


@dataclass(frozen=True)
class CellInput:
    """What a position in the cell stack receives: the two previous states'
    channels and heights, and whether the newer one came out of a reduction
    cell (then the older, larger state is reduced on the way in)."""

    c_prev_prev: int
    c_prev: int
    reduction_prev: bool
    h_prev_prev: int
    h_prev: int


@dataclass(frozen=True)
class ArchSpec:
    """The whole network's shape."""

    in_channels: int
    num_classes: int
    primitives: tuple[str, ...]
    steps: int
    stem_channels: int
    cells: tuple[CellSpec, ...]
    stem_stride: int = 1

    @classmethod
    def from_config(cls, space: SpaceConfig, in_channels: int, num_classes: int) -> ArchSpec:
        """DARTS layout: reduction cells at 1/3 and 2/3 depth, channels doubling at each."""
        cells, c = [], space.init_channels
        reductions = {space.layers // 3, 2 * space.layers // 3} if space.layers >= 2 else set()
        for i in range(space.layers):
            if i in reductions:
                c *= 2
            cells.append(CellSpec(channels=c, reduction=i in reductions))
        return cls(
            in_channels=in_channels,
            num_classes=num_classes,
            primitives=tuple(space.primitives),
            steps=space.steps,
            stem_channels=space.stem_multiplier * space.init_channels,
            cells=tuple(cells),
            stem_stride=space.stem_stride,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["primitives"] = list(self.primitives)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchSpec:
        return cls(
            **{
                **d,
                "primitives": tuple(d["primitives"]),
                "cells": tuple(CellSpec.from_dict(c) for c in d["cells"]),
            }
        )

    def with_cells(self, cells: list[CellSpec] | tuple[CellSpec, ...]) -> ArchSpec:
        return replace(self, cells=tuple(cells))

    def alpha_key(self, index: int) -> str:
        """The key of cell ``index``'s alpha matrix (and of its plan): ``cellN``
        for a cell with its own alphas, else its cell type."""
        cs = self.cells[index]
        if cs.own_alphas:
            return own_cell_name(index)
        return "reduce" if cs.reduction else "normal"

    @property
    def alpha_keys(self) -> tuple[str, ...]:
        """Every alpha matrix's key: the two cell types, then the own-alpha cells by index."""
        return CELL_TYPES + tuple(
            own_cell_name(i) for i, c in enumerate(self.cells) if c.own_alphas
        )

    def stem_size(self, image_size: int) -> int:
        """The stem's output height for ``image_size`` (a 3x3 convolution with padding 1)."""
        return (image_size - 1) // self.stem_stride + 1

    def inputs(self, image_size: int = 1) -> list[CellInput]:
        """The input pair at every position ``0 .. len(cells)`` (the last feeds the
        classifier); heights for square images of ``image_size``. A residual cell
        passes its input pair on, so it changes nothing for the positions after it.
        The one account of the stack's geometry: the supernet, growth and memory
        estimation all read it."""
        h = self.stem_size(image_size)
        c_pp, c_p, h_pp, h_p, reduction_prev = self.stem_channels, self.stem_channels, h, h, False
        out = []
        for cs in self.cells:
            out.append(CellInput(c_pp, c_p, reduction_prev, h_pp, h_p))
            if not cs.residual:
                h_out = halved(h_p) if cs.reduction else h_p
                c_pp, c_p, h_pp, h_p = c_p, self.steps * cs.channels, h_p, h_out
                reduction_prev = cs.reduction
        out.append(CellInput(c_pp, c_p, reduction_prev, h_pp, h_p))
        return out

    @property
    def num_edges(self) -> int:
        """Edges per cell: node k reads from k + 2 earlier states."""
        return sum(k + 2 for k in range(self.steps))

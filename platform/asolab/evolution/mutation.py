"""Mutation: alpha-guided op edits on a derived genotype.

For mutation strength ``s`` and ``E`` genotype edges (own-alpha cells'
included) the phase makes ``k = max(1, round(s * E))`` edits on distinct edges
chosen uniformly. Each edit re-samples the edge's op by Gumbel-max over that
edge's alphas (the cell's own matrix for an own-alpha cell), excluding the
current op and ``none``: op ``o`` with probability softmax(alphas)_o among the
others. The temperature does not change the draw (an argmax does not move when
its arguments are divided by tau: docs/concepts.md, "Temperature"). With a cap on
parameter-free ops per cell (``search.param_free_cap``) an edit never takes a
cell past it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..space.cells import edge_index
from ..space.genotype import Genotype
from ..space.ops import NONE, PARAMETER_FREE
from ..space.sampling import gumbel_softmax_st


@dataclass(frozen=True)
class Edit:
    """One op edit on edge (cell, node, input)."""

    cell: str
    node: int
    input: int
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.cell} node {self.node} input {self.input}: {self.before} -> {self.after}"


def num_edits(strength: float, num_edges: int) -> int:
    return max(1, round(strength * num_edges))


def mutate(
    genotype: Genotype,
    alphas: dict[str, torch.Tensor],
    primitives: tuple[str, ...],
    strength: float,
    temperature: float,
    param_free_cap: int = -1,
) -> tuple[Genotype, list[Edit]]:
    """Apply ``num_edits(strength, E)`` alpha-guided op edits; returns the new genotype and the
    edits.

    ``alphas`` maps every cell name of ``genotype`` (``normal``, ``reduce``,
    ``cellN``) to its alpha matrix, as ``SearchNetwork.alphas`` does. With
    ``param_free_cap`` >= 0 an edit draws no parameter-free op into a cell that
    already has that many on its other edges."""
    edges = list(genotype.edges())
    chosen = torch.randperm(len(edges))[: num_edits(strength, len(edges))].tolist()
    edits: list[Edit] = []
    for n in sorted(chosen):
        kind, node, op, j = edges[n]
        logits = alphas[kind][edge_index(node, j)].detach().float().clone()
        banned = {op, NONE}
        elsewhere = genotype.param_free(kind) - (op in PARAMETER_FREE)  # the cell's other edges
        if 0 <= param_free_cap <= elsewhere:
            banned |= PARAMETER_FREE
        excluded = [primitives.index(p) for p in banned if p in primitives]
        if len(excluded) >= len(primitives):
            continue  # no other op to switch to
        logits[excluded] = float("-inf")
        _, index = gumbel_softmax_st(logits, temperature)
        new_op = primitives[int(index)]
        genotype = genotype.replace_op(kind, node, j, new_op)
        edits.append(Edit(kind, node, j, op, new_op))
    return genotype, edits

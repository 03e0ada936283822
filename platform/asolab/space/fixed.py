"""The derived network as plain modules: a genotype's ops wired once, no plans.

:class:`FixedNetwork` holds exactly the modules a genotype runs, taken from the
supernet (the same module and parameter objects, so training it trains the
supernet's weights, as the plan-driven view does), and wires them at build time:
its forward pass is a fixed sequence of module calls with no per-edge plan
lookup. That makes it cheaper on the host, and a graph that ``torch.compile``
(and CUDA graphs) can capture whole, for the phases whose architecture stays
fixed for many steps (W-retraining, the final stage).

It computes what ``supernet(x, supernet.genotype_plans(genotype))`` computes,
in the same order of additions, so the two agree to the last bit in eager mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from .cells import SearchCell, edge_index
from .genotype import Genotype, Node


class FixedCell(nn.Module):
    """One cell of the derived network: preprocessing, the kept ops per node
    (grouped by input edge, in the plan's order) and growth branches."""

    def __init__(self, cell: SearchCell, nodes: Sequence[Node], primitives: Sequence[str]) -> None:
        super().__init__()
        self.preprocess0, self.preprocess1 = cell.preprocess0, cell.preprocess1
        self.ops = nn.ModuleList()
        # per node: ((input, (slot, slot, ...)), ...): edges in input order, as the
        # supernet sums them; an edge with several ops sums them first (MixedOp's order)
        wiring: list[tuple[tuple[int, tuple[int, ...]], ...]] = []
        for k, node in enumerate(nodes):
            by_input: dict[int, list[int]] = {}
            for op, j in node:
                by_input.setdefault(j, []).append(len(self.ops))
                self.ops.append(cell.edges[edge_index(k, j)].ops[primitives.index(op)])
            wiring.append(tuple((j, tuple(by_input[j])) for j in sorted(by_input)))
        self.wiring = tuple(wiring)
        self.branches = cell.branches
        self.branch_gates = cell.branch_gates
        self.branch_at = tuple((k, j) for k, j, _ in cell.branch_specs)

    def forward(self, s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
        states = [self.preprocess0(s0), self.preprocess1(s1)]
        for k, edges in enumerate(self.wiring):
            node = None
            for j, slots in edges:
                y = None
                for slot in slots:
                    out = self.ops[slot](states[j])
                    y = out if y is None else y + out
                node = y if node is None else node + y
            for b, (bk, j) in enumerate(self.branch_at):
                if bk == k:
                    node = node + self.branch_gates[b] * self.branches[b](states[j])
            states.append(node)
        return torch.cat(states[2:], dim=1)


class FixedNetwork(nn.Module):
    """A genotype's network built from the supernet's own modules (shared, not copied).

    ``supernet`` is a :class:`~asolab.space.network.SearchNetwork`; the result holds
    no reference to it, only to the modules the genotype runs."""

    def __init__(self, supernet: nn.Module, genotype: Genotype) -> None:
        super().__init__()
        self.genotype = genotype
        self.stem, self.pool, self.classifier = supernet.stem, supernet.pool, supernet.classifier
        keys = [supernet.spec.alpha_key(i) for i in range(len(supernet.cells))]
        prims = supernet.spec.primitives
        self.cells = nn.ModuleList(
            FixedCell(cell, supernet.genotype_nodes(genotype, key), prims)
            for cell, key in zip(supernet.cells, keys)
        )
        # residual cells (deepen): output = input + gate * cell
        self.residual_gates = nn.ParameterList()
        self.residual = []
        for i in range(len(supernet.cells)):
            if str(i) in supernet.gates:
                self.residual.append(len(self.residual_gates))
                self.residual_gates.append(supernet.gates[str(i)])
            else:
                self.residual.append(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s0 = s1 = self.stem(x)
        for cell, gate in zip(self.cells, self.residual):
            if gate >= 0:
                s1 = s1 + self.residual_gates[gate] * cell(s0, s1)
            else:
                s0, s1 = s1, cell(s0, s1)
        return self.classifier(self.pool(s1).flatten(1))

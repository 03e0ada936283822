"""The supernet: weights, architecture parameters (alphas) and derivation.

``SearchNetwork`` is built from an :class:`~asolab.space.spec.ArchSpec`. Its
alphas are registered parameters, one ``(edges, ops)`` matrix per cell type,
shared by all cells of that type. ``forward(x, plans)`` runs what the plans say
(see :mod:`asolab.space.cells`); the helpers below build plans for hard Gumbel
sampling, for a fixed genotype and for the DARTS continuous relaxation.

The *derived network* is not a copy: :class:`DerivedNetwork` is a view that
runs the supernet's own modules along a genotype, so retraining it improves the
supernet's weights and nothing drifts apart. ``extract`` makes a standalone
copy only for export.
"""

from __future__ import annotations

import copy
from typing import Iterable, Iterator

import torch
import torch.nn as nn

from ..evolution.sampling import gumbel_softmax_st
from .cells import Plan, SearchCell, edge_index
from .genotype import CELL_TYPES, Genotype
from .spec import ArchSpec

Plans = dict[str, Plan]


class SearchNetwork(nn.Module):
    """DARTS-style supernet with one alpha matrix per cell type."""

    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.spec = spec
        self.stem = nn.Sequential(
            nn.Conv2d(spec.in_channels, spec.stem_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(spec.stem_channels),
        )
        self.cells = nn.ModuleList()
        self.gates = nn.ParameterDict()
        c_pp, c_p, reduction_prev = spec.stem_channels, spec.stem_channels, False
        for i, cs in enumerate(spec.cells):
            cell = SearchCell(spec.steps, c_pp, c_p, cs.channels, cs.reduction, reduction_prev, spec.primitives, cs.branches)
            self.cells.append(cell)
            if cs.residual:
                if cs.reduction or cell.out_channels != c_p:
                    raise ValueError(f"residual cell {i} must be a normal cell with {c_p} output channels")
                # The gate starts at zero so that an inserted cell is the identity.
                self.gates[str(i)] = nn.Parameter(torch.zeros(1))
                continue  # a residual cell passes its input pair on, updated in place
            c_pp, c_p, reduction_prev = c_p, cell.out_channels, cs.reduction
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c_p, spec.num_classes)
        n_edges, n_ops = spec.num_edges, len(spec.primitives)
        self.alphas = nn.ParameterDict({kind: nn.Parameter(1e-3 * torch.randn(n_edges, n_ops)) for kind in CELL_TYPES})
        none_mask = torch.tensor([float("-inf") if p == "none" else 0.0 for p in spec.primitives])
        self.register_buffer("_none_mask", none_mask, persistent=False)

    # ------------------------------------------------------------------ parameters

    def alpha_parameters(self) -> list[nn.Parameter]:
        return [self.alphas[k] for k in CELL_TYPES]

    def weight_parameters(self) -> list[nn.Parameter]:
        # Partition by identity: `p in list_of_tensors` would compare values elementwise.
        alpha_ids = {id(p) for p in self.alpha_parameters()}
        return [p for p in self.parameters() if id(p) not in alpha_ids]

    def num_weights(self) -> int:
        return sum(p.numel() for p in self.weight_parameters())

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor, plans: Plans) -> torch.Tensor:
        s0 = s1 = self.stem(x)
        for i, cell in enumerate(self.cells):
            plan = plans["reduce" if cell.reduction else "normal"]
            if str(i) in self.gates:
                s1 = s1 + self.gates[str(i)] * cell(s0, s1, plan)
            else:
                s0, s1 = s1, cell(s0, s1, plan)
        return self.classifier(self.pool(s1).flatten(1))

    # ------------------------------------------------------------------ plans

    def sample_plans(self, temperature: float, differentiable: bool) -> Plans:
        """Hard Gumbel-softmax: one op per edge and cell type.

        With ``differentiable`` the straight-through weight (value exactly 1)
        multiplies the op output, so gradients reach the alphas; without it the
        sample is drawn under no_grad and nothing but the op runs.
        """
        plans: Plans = {}
        for kind in CELL_TYPES:
            if differentiable:
                hard, index = gumbel_softmax_st(self.alphas[kind], temperature)
                plans[kind] = [[(int(i), hard[e, i])] for e, i in enumerate(index.tolist())]
            else:
                # 'none' has no weights to train: W-training paths never sample it.
                with torch.no_grad():
                    _, index = gumbel_softmax_st(self.alphas[kind] + self._none_mask, temperature)
                plans[kind] = [[(int(i), None)] for i in index.tolist()]
        return plans

    def genotype_plans(self, genotype: Genotype) -> Plans:
        """Run exactly the genotype's edges; every other edge is dropped."""
        plans: Plans = {}
        for kind in CELL_TYPES:
            plan: list[list[tuple[int, None]] | None] = [None] * self.spec.num_edges
            for k, node in enumerate(genotype.cell(kind)):
                for op, j in node:
                    e = edge_index(k, j)
                    plan[e] = (plan[e] or []) + [(self.spec.primitives.index(op), None)]
            plans[kind] = plan
        return plans

    def continuous_plans(self) -> Plans:
        """DARTS relaxation: every op of every edge, weighted by softmax(alphas)."""
        plans: Plans = {}
        for kind in CELL_TYPES:
            w = self.alphas[kind].softmax(-1)
            plans[kind] = [[(i, w[e, i]) for i in range(w.shape[1])] for e in range(w.shape[0])]
        return plans

    # ------------------------------------------------------------------ derivation

    def derive(self) -> Genotype:
        """DARTS rule: per node keep the two inputs whose strongest non-none op
        weighs most (softmax over the edge's alphas), each with that op."""
        prims = self.spec.primitives
        allowed = [i for i, p in enumerate(prims) if p != "none"]
        cells = {}
        for kind in CELL_TYPES:
            w = self.alphas[kind].detach().softmax(-1).cpu()
            nodes = []
            for k in range(self.spec.steps):
                candidates = []
                for j in range(k + 2):
                    row = w[edge_index(k, j)]
                    best = max(allowed, key=lambda i: row[i].item())
                    candidates.append((row[best].item(), j, prims[best]))
                top = sorted(candidates, key=lambda c: -c[0])[:2]
                nodes.append(tuple((op, j) for _, j, op in top))
            cells[kind] = tuple(nodes)
        concat = tuple(range(2, self.spec.steps + 2))
        return Genotype(normal=cells["normal"], normal_concat=concat, reduce=cells["reduce"], reduce_concat=concat)

    def derived_modules(self, genotype: Genotype) -> list[nn.Module]:
        """The modules the derived network runs: stem, preprocessing, kept ops,
        growth branches (they run under every plan), classifier."""
        modules: list[nn.Module] = [self.stem, self.classifier]
        for cell in self.cells:
            modules += [cell.preprocess0, cell.preprocess1, *cell.branches]
            kind = "reduce" if cell.reduction else "normal"
            for k, node in enumerate(genotype.cell(kind)):
                for op, j in node:
                    modules.append(cell.edges[edge_index(k, j)].ops[self.spec.primitives.index(op)])
        return modules

    def derived_parameters(self, genotype: Genotype) -> Iterator[nn.Parameter]:
        """The weights the derived network uses (gates of residual cells and branches included)."""
        seen: set[int] = set()
        gates = [*self.gates.values(), *(g for cell in self.cells for g in cell.branch_gates)]
        params = [p for m in self.derived_modules(genotype) for p in m.parameters()] + gates
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                yield p

    @torch.no_grad()
    def recalibrate_batchnorm(self, genotype: Genotype, batches: Iterable[torch.Tensor]) -> None:
        """Recompute the BatchNorm statistics along the genotype's path.

        Running statistics gathered while paths were sampled mix the input
        distributions of many paths; re-estimating them on a few training
        batches makes the derived network's eval-mode accuracy reflect the
        weights it inherited (standard practice in one-shot NAS).
        """
        norms = [m for mod in self.derived_modules(genotype) for m in mod.modules() if isinstance(m, nn.BatchNorm2d)]
        momenta = [bn.momentum for bn in norms]
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average over the batches below
        was_training = self.training
        self.train()
        plans = self.genotype_plans(genotype)
        for x in batches:
            self(x, plans)
        for bn, m in zip(norms, momenta):
            bn.momentum = m
        self.train(was_training)

    def count_derived(self, genotype: Genotype) -> int:
        return sum(p.numel() for p in self.derived_parameters(genotype))


class DerivedNetwork(nn.Module):
    """A genotype run on the supernet's own modules (a view, not a copy)."""

    def __init__(self, supernet: SearchNetwork, genotype: Genotype) -> None:
        super().__init__()
        self.supernet, self.genotype = supernet, genotype
        self._plans = supernet.genotype_plans(genotype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.supernet(x, self._plans)


def extract(supernet: SearchNetwork, genotype: Genotype) -> DerivedNetwork:
    """A standalone copy of the derived network (for export; training uses the view)."""
    clone = copy.deepcopy(supernet).cpu()
    return DerivedNetwork(clone, genotype).eval()

"""The supernet: weights, architecture parameters (alphas) and derivation.

``SearchNetwork`` is built from an :class:`~asolab.space.spec.ArchSpec`. Its
alphas are registered parameters, one ``(edges, ops)`` matrix per cell type,
shared by all cells of that type, plus one matrix of its own for each cell
whose spec says ``own_alphas`` (a cell inserted by deepen), keyed ``cellN``
(``N``: its index in ``spec.cells``). Plans are keyed like the alphas:
``forward(x, plans)`` runs each cell by the plan of its alpha key (see
:mod:`asolab.space.cells`); the helpers below build plans for hard Gumbel
sampling, for a fixed genotype and for the DARTS continuous relaxation.

The *derived network* is not a copy: :class:`DerivedNetwork` is a view that
runs the supernet's own modules along a genotype, so retraining it improves the
supernet's weights and nothing drifts apart. ``extract`` makes a standalone
copy only for export.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from .cells import Plan, SearchCell, edge_index
from .genotype import Genotype, Node
from .ops import NONE, PARAMETER_FREE
from .sampling import FairPaths, gumbel_softmax_st
from .spec import ArchSpec

Plans = dict[str, Plan]


class SearchNetwork(nn.Module):
    """DARTS-style supernet with one alpha matrix per cell type and one per own-alpha cell."""

    def __init__(self, spec: ArchSpec, only: Genotype | None = None) -> None:
        """``only``: build just the ops that genotype runs, every other edge op an empty
        placeholder (what :func:`standalone` and the FLOPs count need: a tenth of the
        modules to build); their random initialisation differs from a whole supernet's."""
        super().__init__()
        self.spec = spec
        self.stem = nn.Sequential(
            nn.Conv2d(
                spec.in_channels,
                spec.stem_channels,
                3,
                stride=spec.stem_stride,
                padding=1,
                bias=False,
            ),
            nn.BatchNorm2d(spec.stem_channels),
        )
        self.cells = nn.ModuleList()
        self.gates = nn.ParameterDict()
        if only is not None:
            _refuse_foreign_cells(spec, only)
        inputs = spec.inputs()
        for i, (cs, into) in enumerate(zip(spec.cells, inputs, strict=False)):
            cell = SearchCell(
                spec.steps,
                into.c_prev_prev,
                into.c_prev,
                cs.channels,
                cs.reduction,
                into.reduction_prev,
                spec.primitives,
                cs.branches,
                None if only is None else _kept_ops(spec, only, i),
            )
            self.cells.append(cell)
            if cs.residual:
                if cs.reduction or cell.out_channels != into.c_prev:
                    raise ValueError(
                        f"residual cell {i} must be a normal cell with {into.c_prev} output "
                        "channels"
                    )
                # The gate starts at zero so that an inserted cell is the identity.
                self.gates[str(i)] = nn.Parameter(torch.zeros(1))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(inputs[-1].c_prev, spec.num_classes)
        n_edges, n_ops = spec.num_edges, len(spec.primitives)
        # Insertion order (cell types, then own cells by index) is the order of
        # alpha_parameters(), hence of the alpha optimizer's saved state.
        self.alphas = nn.ParameterDict(
            {key: nn.Parameter(1e-3 * torch.randn(n_edges, n_ops)) for key in spec.alpha_keys}
        )
        self._plan_keys = [spec.alpha_key(i) for i in range(len(spec.cells))]
        # W-training never samples an op without weights ('none'): -inf on its logits.
        none_mask = torch.full((n_ops,), float("-inf"))
        none_mask[self.trainable_ops()] = 0.0
        self.register_buffer("_none_mask", none_mask, persistent=False)

    # ------------------------------------------------------------------ parameters

    def alpha_parameters(self) -> list[nn.Parameter]:
        return list(self.alphas.values())

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
            plan = plans[self._plan_keys[i]]
            if str(i) in self.gates:
                s1 = s1 + self.gates[str(i)] * cell(s0, s1, plan)
            else:
                s0, s1 = s1, cell(s0, s1, plan)
        return self.classifier(self.pool(s1).flatten(1))

    # ------------------------------------------------------------------ plans

    def sample_plans(self, temperature: float, differentiable: bool) -> Plans:
        """Hard Gumbel-softmax: one op per edge and alpha matrix.

        With ``differentiable`` the straight-through weight (value exactly 1)
        multiplies the op output, so gradients reach the alphas; without it the
        sample is drawn on the host (:meth:`path_logits`, :meth:`sample_path`) and
        nothing but the op runs.
        """
        if not differentiable:
            return self.sample_path(self.path_logits(), temperature)
        plans: Plans = {}
        for kind in self.alphas:
            hard, index = gumbel_softmax_st(self.alphas[kind], temperature)
            # one gather and one unbind for every edge's weight: a select per edge would
            # cost two ops forward and a zero-filled gradient each backward
            weights = hard.gather(1, index.unsqueeze(1)).squeeze(1).unbind()
            plans[kind] = [[(int(i), weights[e])] for e, i in enumerate(index.tolist())]
        return plans

    def path_logits(self) -> dict[str, torch.Tensor]:
        """What W-training samples paths from: each alpha matrix with 'none' masked out
        (it has no weights to train), detached, on the host. The alphas stay frozen for
        a whole W-training phase, so one copy serves every step of it: the paths are then
        drawn without a device sync per step (on the CPU the copy is the tensor itself,
        and the draws are those of sampling on the device)."""
        with torch.no_grad():
            return {kind: (a + self._none_mask).cpu() for kind, a in self.alphas.items()}

    @staticmethod
    def sample_path(logits: dict[str, torch.Tensor], temperature: float) -> Plans:
        """One op per edge by hard Gumbel-softmax over ``logits`` (:meth:`path_logits`)."""
        plans: Plans = {}
        for kind, a in logits.items():
            _, index = gumbel_softmax_st(a, temperature)
            plans[kind] = [[(i, None)] for i in index.tolist()]
        return plans

    def trainable_ops(self) -> list[int]:
        """Indices of the primitives W-training may sample (all but 'none')."""
        return [i for i, p in enumerate(self.spec.primitives) if p != NONE]

    def fair_plans(self, paths: FairPaths) -> Plans:
        """One op per edge and alpha matrix, each edge's ops in fair rounds (W-training)."""
        return {
            kind: [[(i, None)] for i in paths.draw(kind, self.spec.num_edges)]
            for kind in self.alphas
        }

    def genotype_nodes(self, genotype: Genotype, key: str) -> tuple[Node, ...]:
        """The nodes ``genotype`` gives the cells of alpha key ``key``.

        An own-alpha cell the genotype does not list (a genotype derived before
        deepen inserted it) runs the genotype's cell of its type, which is what
        its alphas were initialised to. A genotype listing an own cell that this
        network does not have is refused: it belongs to another network.
        """
        _refuse_foreign_cells(self.spec, genotype)
        if key in genotype.cell_names:  # also a cell type no cell has (no "reduce" cell)
            return genotype.cell(key)
        return genotype.cell(_cell_name(self.spec, genotype, self._plan_keys.index(key)))

    def genotype_plans(self, genotype: Genotype) -> Plans:
        """Run exactly the genotype's edges; every other edge is dropped (own-alpha
        cells the genotype does not list: see :meth:`genotype_nodes`)."""
        plans: Plans = {}
        for kind in self.alphas:
            plan: list[list[tuple[int, None]] | None] = [None] * self.spec.num_edges
            for e, i in _edge_ops(self.spec, self.genotype_nodes(genotype, kind)):
                plan[e] = (plan[e] or []) + [(i, None)]
            plans[kind] = plan
        return plans

    def continuous_plans(self) -> Plans:
        """DARTS relaxation: every op of every edge, weighted by softmax(alphas)."""
        plans: Plans = {}
        for kind in self.alphas:
            w = self.alphas[kind].softmax(-1)
            plans[kind] = [[(i, w[e, i]) for i in range(w.shape[1])] for e in range(w.shape[0])]
        return plans

    # ------------------------------------------------------------------ derivation

    def alpha_entropy(self) -> float:
        """How undecided the alphas are: the entropy of each edge's softmax over its ops,
        divided by that of the uniform distribution (log of the op count), averaged over
        every edge of every alpha matrix. 1 means the alphas have not moved from where
        they started (derive() then picks by small differences); 0 means one op per edge."""
        entropies = []
        for a in self.alphas.values():
            p = a.detach().float().softmax(-1)
            h = -(p * p.clamp_min(1e-12).log()).sum(-1) / math.log(a.shape[-1])
            entropies.append(h)
        return torch.cat(entropies).mean().item()

    def derive(self, param_free_cap: int = -1) -> Genotype:
        """DARTS rule: per node keep the two inputs whose strongest non-none op
        weighs most (softmax over the edge's alphas), each with that op; one
        cell per alpha matrix, the own-alpha cells in ``own_cells``.

        With ``param_free_cap`` >= 0 a cell keeps at most that many parameter-free
        ops (``PARAMETER_FREE``): the kept edges where the swap costs least
        weight take their strongest op with weights instead (-1: no cap)."""
        prims = self.spec.primitives
        allowed = [i for i, p in enumerate(prims) if p != NONE]
        weighted = [i for i in allowed if prims[i] not in PARAMETER_FREE]
        cells = {}
        for kind in self.alphas:
            w = self.alphas[kind].detach().softmax(-1).cpu()
            nodes = []
            for k in range(self.spec.steps):
                candidates = []
                for j in range(k + 2):
                    row = w[edge_index(k, j)]
                    best = max(allowed, key=lambda i: row[i].item())
                    candidates.append((row[best].item(), j, prims[best]))
                top = sorted(candidates, key=lambda c: -c[0])[:2]
                nodes.append([[op, j] for _, j, op in top])
            if param_free_cap >= 0 and weighted:
                _cap_param_free(nodes, w, prims, weighted, param_free_cap)
            cells[kind] = tuple(tuple((op, j) for op, j in node) for node in nodes)
        return Genotype.from_cells(cells, range(2, self.spec.steps + 2))

    def derived_modules(self, genotype: Genotype) -> list[nn.Module]:
        """The modules the derived network runs: stem, preprocessing, kept ops,
        growth branches (they run under every plan), classifier."""
        modules: list[nn.Module] = [self.stem, self.classifier]
        for cell, key in zip(self.cells, self._plan_keys):
            modules += [cell.preprocess0, cell.preprocess1, *cell.branches]
            nodes = self.genotype_nodes(genotype, key)
            modules += [cell.edges[e].ops[i] for e, i in _edge_ops(self.spec, nodes)]
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
        norms = [
            m
            for mod in self.derived_modules(genotype)
            for m in mod.modules()
            if isinstance(m, nn.BatchNorm2d)
        ]
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


def _refuse_foreign_cells(spec: ArchSpec, genotype: Genotype) -> None:
    """A genotype listing an own cell that ``spec`` does not have belongs to another network."""
    extra = set(genotype.cell_names) - set(spec.alpha_keys)
    if extra:
        raise ValueError(
            f"genotype describes {', '.join(sorted(extra))}, which this network does not have "
            f"as cells with their own alphas (it has {', '.join(spec.alpha_keys)})"
        )


def _cell_name(spec: ArchSpec, genotype: Genotype, index: int) -> str:
    """The genotype's cell that cell ``index`` runs: its own, else that of its type (see
    ``genotype_nodes``)."""
    key = spec.alpha_key(index)
    if key in genotype.cell_names:
        return key
    return "reduce" if spec.cells[index].reduction else "normal"


def _edge_ops(spec: ArchSpec, nodes: Sequence[Node]) -> Iterator[tuple[int, int]]:
    """(edge index, op index) of every input of ``nodes``, node by node, in their order."""
    for k, node in enumerate(nodes):
        for op, j in node:
            yield edge_index(k, j), spec.primitives.index(op)


def _kept_ops(spec: ArchSpec, genotype: Genotype, index: int) -> dict[int, set[int]]:
    """Edge index -> the op indices ``genotype`` runs there, in cell ``index``."""
    keep: dict[int, set[int]] = {}
    for e, i in _edge_ops(spec, genotype.cell(_cell_name(spec, genotype, index))):
        keep.setdefault(e, set()).add(i)
    return keep


def build_on(spec: ArchSpec, device: torch.device | str) -> SearchNetwork:
    """``SearchNetwork(spec)`` with every tensor created on ``device`` (no CPU copy to
    allocate and move). On the default device (the CPU) it is built without a device
    context: its Python hook on each of the supernet's thousands of tensor creations made
    building 1.2-1.3x slower there (the default digits supernet 54.5 -> 42.3 ms, the
    DARTS-like one 541 -> 450 ms; AMD EPYC, 1 thread, medians of 15 interleaved)."""
    if torch.device(device) == torch.get_default_device():
        return SearchNetwork(spec)
    with torch.device(device):
        return SearchNetwork(spec)


class DerivedNetwork(nn.Module):
    """A genotype run on the supernet's own modules (a view, not a copy)."""

    def __init__(self, supernet: SearchNetwork, genotype: Genotype) -> None:
        super().__init__()
        self.supernet, self.genotype = supernet, genotype
        self._plans = supernet.genotype_plans(genotype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.supernet(x, self._plans)


def _unused_ops(supernet: SearchNetwork, genotype: Genotype) -> list[tuple[nn.ModuleList, int]]:
    """(edge.ops, index) of every edge op the genotype does not run."""
    kept = {id(m) for m in supernet.derived_modules(genotype)}
    return [
        (edge.ops, i)
        for cell in supernet.cells
        for edge in cell.edges
        for i, op in enumerate(edge.ops)
        if id(op) not in kept
    ]


@contextmanager
def exported(supernet: SearchNetwork, genotype: Genotype) -> Iterator[DerivedNetwork]:
    """The derived network for saving, without a copy: for the time of the block the
    supernet itself, in eval mode, with every unused op swapped for an empty
    placeholder (what :func:`extract` copies, at a tenth of the time). Restored
    afterwards, even on an error; use the result only inside the block, on a
    supernet nothing else trains meanwhile."""
    unused = _unused_ops(supernet, genotype)
    saved = [ops[i] for ops, i in unused]
    training = supernet.training
    try:
        for ops, i in unused:
            ops[i] = nn.Identity()
        yield DerivedNetwork(supernet, genotype).eval()
    finally:
        for (ops, i), op in zip(unused, saved):
            ops[i] = op
        supernet.train(training)


def extract(supernet: SearchNetwork, genotype: Genotype) -> DerivedNetwork:
    """A standalone copy of the derived network (for export; training uses the view).

    Only what the genotype runs is copied: every edge op it does not keep becomes
    an empty placeholder, so the export holds the derived network's weights, not
    the whole supernet's (a fraction of the size, and of the time to copy and save).
    """
    # deepcopy takes these placeholders as the copies of the unused ops
    memo: dict[int, Any] = {id(ops[i]): nn.Identity() for ops, i in _unused_ops(supernet, genotype)}
    clone = copy.deepcopy(supernet, memo).cpu()
    return DerivedNetwork(clone, genotype).eval()


ALPHAS_PREFIX = "supernet.alphas."  # state-dict keys of the alphas, which no export keeps


def derived_state(supernet: SearchNetwork, genotype: Genotype) -> dict[str, torch.Tensor]:
    """The derived network's tensors, on the CPU, without the alphas: what
    :func:`standalone` loads. Plain tensors only, so that they save in a format that
    holds no code (safetensors, or a ``torch.save`` that ``weights_only`` loads)."""
    with exported(supernet, genotype) as net:
        return {
            k: v.detach().to("cpu", copy=True).contiguous()
            for k, v in net.state_dict().items()
            if not k.startswith(ALPHAS_PREFIX)
        }


def standalone(spec: ArchSpec, genotype: Genotype) -> DerivedNetwork:
    """A new derived network built from asolab's own modules, the spec and the genotype:
    the supernet's modules, every op the genotype does not run an empty placeholder,
    no alphas (so ``parameters()`` counts what ``count_derived`` counts). Its weights are
    random until :func:`derived_state`'s tensors are loaded into it (``strict=True``)."""
    net = SearchNetwork(spec, only=genotype)
    derived = DerivedNetwork(net, genotype)  # the plans need the alphas' keys, once
    net.alphas = nn.ParameterDict()
    return derived.eval()


def _cap_param_free(
    nodes: list[list[list]], w: torch.Tensor, prims: tuple[str, ...], weighted: list[int], cap: int
) -> None:
    """Swap parameter-free ops of kept edges (``[op, input]`` per node, in place)
    for the edge's strongest weighted op until at most ``cap`` remain, cheapest
    swap (smallest loss of softmax weight) first."""
    swaps = []
    for k, node in enumerate(nodes):
        for entry in node:
            op, j = entry
            if op in PARAMETER_FREE:
                row = w[edge_index(k, j)]
                best = max(weighted, key=lambda i: row[i].item())
                cost = row[prims.index(op)].item() - row[best].item()
                swaps.append((cost, entry, prims[best]))
    swaps.sort(key=lambda s: s[0])
    for _, entry, op in swaps[: max(0, len(swaps) - cap)]:
        entry[0] = op

"""Cells: DARTS-style search cells whose edges hold every candidate op.

A cell has two inputs (the outputs of the two previous cells), ``steps``
intermediate nodes each fed by all earlier states, and outputs the
concatenation of its intermediate nodes. What runs on each edge is decided by a
*plan* passed to ``forward``: for every edge, a list of ``(op_index, weight)``
choices (``weight`` None = run the op unscaled), or ``None`` to drop the edge.
One mechanism thus serves hard Gumbel sampling (one op per edge, only that op
runs), a derived genotype (two edges per node) and the DARTS continuous
relaxation (every op, softmax-weighted).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from .ops import OPS, FactorizedReduce, ReLUConvBN, build_op
from .spec import edge_stride

Choice = tuple[int, torch.Tensor | None]


@dataclass(frozen=True)
class Switched:
    """A plan whose one op per edge is chosen on the device: ``choices[e]`` names edge
    ``e``'s op, and ``run(edge, choice, x, stride)`` runs it (``space/switched.py``)."""

    choices: torch.Tensor
    run: Callable[..., torch.Tensor]


Plan = Sequence[Sequence[Choice] | None] | Switched


def edge_index(node: int, input_: int) -> int:
    """Position of edge (node, input) in a cell's flat edge list."""
    return node * (node + 3) // 2 + input_


class MixedOp(nn.Module):
    """All candidate operations of one edge."""

    def __init__(
        self,
        channels: int,
        stride: int,
        primitives: Sequence[str],
        keep: Collection[int] | None = None,
    ) -> None:
        super().__init__()
        # affine=False in the supernet, as in DARTS: the scale is carried by the alphas.
        # ``keep``: the op indices to build; the others are empty placeholders.
        self.ops = nn.ModuleList(
            build_op(p, channels, stride) if keep is None or i in keep else nn.Identity()
            for i, p in enumerate(primitives)
        )

    def forward(self, x: torch.Tensor, choices: Sequence[Choice]) -> torch.Tensor:
        out = None
        for index, weight in choices:
            y = self.ops[index](x)
            if weight is not None:
                y = y * weight
            out = y if out is None else out + y
        return out


class SearchCell(nn.Module):
    """A normal or reduction cell of the supernet."""

    def __init__(
        self,
        steps: int,
        c_prev_prev: int,
        c_prev: int,
        channels: int,
        reduction: bool,
        reduction_prev: bool,
        primitives: Sequence[str],
        branches: Sequence[tuple[int, int, str]] = (),
        keep: dict[int, set[int]] | None = None,
    ) -> None:
        super().__init__()
        self.steps, self.reduction = steps, reduction
        self.preprocess0 = (
            FactorizedReduce(c_prev_prev, channels, affine=False)
            if reduction_prev
            else ReLUConvBN(c_prev_prev, channels, 1, 1, 0, affine=False)
        )
        self.preprocess1 = ReLUConvBN(c_prev, channels, 1, 1, 0, affine=False)
        # ``keep``: edge index -> the op indices to build there (None: every op of every edge)
        self.edges = nn.ModuleList(
            MixedOp(
                channels,
                edge_stride(reduction, j),
                primitives,
                None if keep is None else keep.get(edge_index(k, j), set()),
            )
            for k in range(steps)
            for j in range(k + 2)
        )
        # Growth branches: (node, input, op) paths that always run, each with its own
        # op module and a gate that starts at zero, so adding one preserves the function.
        self.branch_specs = tuple((int(k), int(j), str(op)) for k, j, op in branches)
        for k, j, op in self.branch_specs:
            if not (0 <= k < steps and 0 <= j < k + 2) or op not in OPS:
                raise ValueError(
                    f"branch ({k}, {j}, {op!r}) does not fit a cell with {steps} nodes"
                )
        self.branches = nn.ModuleList(
            build_op(op, channels, edge_stride(reduction, j)) for _, j, op in self.branch_specs
        )
        self.branch_gates = nn.ParameterList(
            nn.Parameter(torch.zeros(1)) for _ in self.branch_specs
        )

    @property
    def out_channels(self) -> int:
        return self.steps * self.preprocess1[1].out_channels

    def forward(self, s0: torch.Tensor, s1: torch.Tensor, plan: Plan) -> torch.Tensor:
        states = [self.preprocess0(s0), self.preprocess1(s1)]
        for k in range(self.steps):
            node = None
            for j in range(k + 2):
                e = edge_index(k, j)
                if isinstance(plan, Switched):
                    stride = edge_stride(self.reduction, j)
                    y = plan.run(self.edges[e], plan.choices[e], states[j], stride)
                elif plan[e]:
                    y = self.edges[e](states[j], plan[e])
                else:
                    continue
                node = y if node is None else node + y
            if node is None:
                raise ValueError(f"plan leaves node {k} of a cell without an input edge")
            for b, (bk, j, _) in enumerate(self.branch_specs):
                if bk == k:
                    node = node + self.branch_gates[b] * self.branches[b](states[j])
            states.append(node)
        return torch.cat(states[2:], dim=1)

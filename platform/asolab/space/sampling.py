"""Path sampling over the supernet's alphas: hard Gumbel-softmax and fair paths.

The supernet (:mod:`asolab.space.network`) draws one op per edge with these;
mutation (:mod:`asolab.evolution.mutation`) uses the same Gumbel step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gumbel_softmax_st(
    logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Straight-through hard Gumbel-softmax over the last dimension.

    Returns ``(hard, index)``: ``hard`` is exactly one-hot in value (so callers
    must not softmax it again) and carries the soft sample's gradient. ``index``
    is the Gumbel-max draw argmax(logits + g): op ``o`` with probability
    softmax(logits)_o whatever ``temperature`` is, which shapes the gradient alone
    (docs/concepts.md, "Temperature").
    The noise is drawn like ``logits`` (same device and dtype).
    """
    gumbels = -torch.empty_like(logits).exponential_().log()
    soft = ((logits + gumbels) / temperature).softmax(-1)
    index = soft.argmax(-1)
    hard = torch.zeros_like(soft).scatter_(-1, index.unsqueeze(-1), 1.0)
    return hard - soft.detach() + soft, index


class FairPaths:
    """Strictly fair paths for W-training (``search.w_sampling = "fair"``).

    On every edge of every alpha matrix the trainable ops are drawn without
    replacement, so each is trained exactly once in every round of K steps
    (K = the ops that have weights to train), whatever the alphas say: an op
    the alphas do not favour yet is not starved of updates, which otherwise
    makes it look worse in alpha-training and so sampled even less (FairNAS's
    argument). Use one instance per W-training phase: the rounds restart there,
    so a run resumed at a phase boundary draws what the uninterrupted run drew
    (the permutations come from torch's global generator, which checkpoints hold).
    """

    def __init__(self, trainable: Sequence[int]) -> None:
        if not trainable:
            raise ValueError("fair path sampling needs at least one op with weights")
        self.trainable = list(trainable)
        self._rounds: dict[tuple[str, int], list[int]] = {}

    def draw(self, key: str, edges: int) -> list[int]:
        """One op index per edge of alpha matrix ``key``."""
        picks = []
        for edge in range(edges):
            left = self._rounds.get((key, edge))
            if not left:
                order = torch.randperm(len(self.trainable)).tolist()
                left = self._rounds[(key, edge)] = [self.trainable[i] for i in order]
            picks.append(left.pop())
        return picks

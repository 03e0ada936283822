"""Growth policy: when the mutation phase grows the network, how, and how much.

The transforms live in :mod:`asolab.evolution.morphism`; this module decides.

* kind per cycle (``growth.policy``): ``none`` never grows; ``widen``,
  ``deepen``, ``branch`` always grow that way; ``cycle`` rotates
  widen -> deepen -> branch by cycle index; ``plateau`` grows only when the
  best validation accuracy of the last ``plateau_patience`` finished cycles did
  not beat the best before them, with the kind ``cycle`` would pick.
* amount, from mutation strength ``s``: ``max(1, round(3 * s))`` growth steps
  per mutation phase; each widening multiplies a cell's per-node channels by
  ``1 + s`` (rounded, at least one more channel; rounded up to even where
  FactorizedReduce halves them).
* cap: a step that would take the supernet's weights past
  ``growth.max_params`` (0 = no cap) is not taken, and the phase stops growing.

Where a step applies is drawn from torch's global generator (seeded and
checkpointed), so runs and resumes are reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..config import GrowthConfig
from ..space.cells import edge_index
from ..space.network import SearchNetwork
from ..space.ops import NONE
from . import morphism
from .morphism import Morph

KINDS = ("widen", "deepen", "branch")
Policy = Callable[[GrowthConfig, int, Sequence[float]], str | None]


def stalled(val_history: Sequence[float], patience: int) -> bool:
    """True when the last ``patience`` cycles did not beat the best accuracy before them."""
    if len(val_history) <= patience:
        return False
    return max(val_history[-patience:]) <= max(val_history[:-patience])


def _always(kind: str) -> Policy:
    return lambda cfg, cycle, val_history: kind


def _rotate(cfg: GrowthConfig, cycle: int, val_history: Sequence[float]) -> str | None:
    return KINDS[cycle % len(KINDS)]


def _plateau(cfg: GrowthConfig, cycle: int, val_history: Sequence[float]) -> str | None:
    return _rotate(cfg, cycle, val_history) if stalled(val_history, cfg.plateau_patience) else None


# growth.policy -> the growth kind of a cycle's mutation phase (None: no growth). The one
# list of policies: the config's growth.policy accepts exactly these names.
POLICIES: dict[str, Policy] = {
    "none": lambda cfg, cycle, val_history: None,
    **{kind: _always(kind) for kind in KINDS},
    "cycle": _rotate,
    "plateau": _plateau,
}
# The policies that may widen: widening rewrites each op's layers by rules written for the
# built-in ops (evolution/morphism.py), so an op set with another op cannot take them.
WIDENING: tuple[str, ...] = ("widen", "cycle", "plateau")


def growth_kind(cfg: GrowthConfig, cycle: int, val_history: Sequence[float]) -> str | None:
    """The growth kind of this cycle's mutation phase, or None."""
    if cfg.policy not in POLICIES:
        raise ValueError(f"unknown growth policy {cfg.policy!r}")
    return POLICIES[cfg.policy](cfg, cycle, val_history)


def growth_steps(strength: float) -> int:
    """Growth steps one mutation phase may take."""
    return max(1, round(3 * strength))


def widened_channels(channels: int, strength: float, even: bool) -> int:
    """``channels * (1 + s)`` rounded, at least one more; even when ``even``."""
    new = max(channels + 1, round(channels * (1 + strength)))
    if even:
        new += new % 2
    return new


def _randint(n: int) -> int:
    return int(torch.randint(n, ()).item())


def propose(net: SearchNetwork, kind: str, strength: float) -> Morph:
    """One growth step of ``kind`` at a random admissible place."""
    spec = net.spec
    if kind == "widen":
        candidates = [i for i, c in enumerate(spec.cells) if not c.residual]
        index = candidates[_randint(len(candidates))]
        c = spec.cells[index].channels
        even = c % 2 == 0
        return morphism.widen_cell(net, index, widened_channels(c, strength, even))
    if kind == "deepen":
        positions = morphism.deepen_positions(spec)
        if not positions:
            raise ValueError(
                "no position admits an identity cell (stem or cell widths not divisible by steps)"
            )
        return morphism.deepen(net, positions[_randint(len(positions))])
    if kind == "branch":
        return _propose_branch(net)
    raise ValueError(f"unknown growth kind {kind!r}")


def _propose_branch(net: SearchNetwork) -> Morph:
    """A random (cell, node, input); the op is the edge's strongest non-none op by
    its alphas that this edge has no branch of yet."""
    spec = net.spec
    ops = [i for i, p in enumerate(spec.primitives) if p != NONE]
    edges = [
        (c, k, j) for c in range(len(spec.cells)) for k in range(spec.steps) for j in range(k + 2)
    ]
    for n in torch.randperm(len(edges)).tolist():
        c, k, j = edges[n]
        cs = spec.cells[c]
        taken = {op for bk, bj, op in cs.branches if (bk, bj) == (k, j)}
        row = net.alphas[spec.alpha_key(c)][edge_index(k, j)].detach()
        free = [i for i in ops if spec.primitives[i] not in taken]
        if free:
            best = max(free, key=lambda i: row[i].item())
            return morphism.add_branch(net, c, k, j, spec.primitives[best])
    raise ValueError("every edge already has a branch of every op")


def within_cap(morph: Morph, max_params: int) -> bool:
    return max_params <= 0 or morph.net.num_weights() <= max_params


def plan_steps(
    cfg: GrowthConfig, strength: float, cycle: int, val_history: Sequence[float]
) -> list[str]:
    """The growth kinds this mutation phase tries, in order (empty: no growth)."""
    kind = growth_kind(cfg, cycle, val_history)
    return [] if kind is None else [kind] * growth_steps(strength)


def preservation_error(before: torch.Tensor, after: torch.Tensor) -> float:
    err = (after - before).abs().max().item() if before.numel() else 0.0
    return err if math.isfinite(err) else float("inf")

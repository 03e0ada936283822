"""How the mutation phase reads a genotype off the supernet (``search.selection``).

``alpha`` is the DARTS rule (:meth:`SearchNetwork.derive`): per edge the op
with the largest alpha. When the alphas end near uniform, that choice is
decided by noise. ``perturbation`` decides by the supernet's own validation
accuracy instead (DARTS-PT, Wang et al., ICLR 2021), on the supernet as ASO-SE
trains it: one op per edge, drawn from the alphas' softmax.

For each alpha matrix (``normal``, ``reduce``, then cells with their own
alphas) and each of its edges, in that fixed order, and each op ``o`` with
weights (never ``none``):

* ``acc(e, o)``: the mean validation accuracy, over a fixed set of sampled
  paths (drawn once per cycle by a generator seeded with the run's seed), of
  each path with edge ``e`` set to ``o``, on the first
  ``search.selection_images`` validation images;
* the sampled supernet's accuracy at ``e`` is ``sum_o p_o acc(e, o)`` (``p``:
  the edge's softmax over those ops, the probability a path runs ``o``), and
  with ``o`` masked ``sum_{o' != o} p_o' acc(e, o') / (1 - p_o)``;
* ``drop(e, o)`` is the first minus the second: how much the supernet loses
  when ``o`` can no longer run on ``e``.

Each edge takes the op whose masking drops the accuracy most; each node keeps
the two inputs whose chosen op drops it most (the edges that matter most),
ties to the lower index; a cap on parameter-free ops (``search.param_free_cap``)
swaps the kept parameter-free ops whose swap costs the least drop for their
edge's best op with weights. Everything is recorded per cycle (the drops and
accuracies per op per edge, and the choice): a researcher can see why an op was
chosen. Only the validation split is read; the test split never.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..config import ExperimentConfig
from ..data import Batches, Split
from ..space.cells import edge_index
from ..space.genotype import Genotype
from ..space.network import SearchNetwork
from ..space.ops import PARAMETER_FREE

SELECTIONS = ("alpha", "perturbation")  # search.selection reads its choices from here

# Alphas whose mean entropy is at least this share of a uniform choice's have barely
# moved: with 8 ops, 0.99 is one op at about 1.7x each other's probability on every edge.
UNDECIDED = 0.99


def alphas_in_words(entropy: float, steps: int) -> str:
    """The alphas at a run's end: "entropy 0.9999 of uniform after 15 steps: undecided"
    (the last word where their entropy is at least ``UNDECIDED``)."""
    words = f"entropy {entropy:.4f} of uniform after {steps:,} steps"
    return words + (": undecided" if entropy >= UNDECIDED else "")


def undecided_alphas(entropy: float, steps: int) -> str:
    """A line for a run whose alphas trained (``steps`` > 0) yet ended near uniform
    (``entropy``, :meth:`SearchNetwork.alpha_entropy`, at least ``UNDECIDED``): the
    largest alpha per edge is then decided by small differences. "" otherwise. Adam
    moves an alpha by about ``search.alpha_lr`` a step, so few steps at a small
    rate leave them where they started."""
    if steps <= 0 or entropy < UNDECIDED:
        return ""
    return (
        f"alphas near uniform after {steps:,} alpha-training steps (Adam moves each by about "
        "search.alpha_lr a step): the largest alpha per edge is decided by small differences. "
        "More steps (search.alpha_epochs) or a larger search.alpha_lr move them; "
        'search.selection = "perturbation" does not read them: docs/baselines.md'
    )


@dataclass(frozen=True)
class EdgeDrops:
    """One edge's measurement: per op its accuracy and the drop of masking it."""

    cell: str  # the alpha key: normal, reduce, cellN
    node: int
    input: int
    accuracy: dict[str, float]
    drop: dict[str, float]
    chosen: str
    kept: bool = False  # one of its node's two inputs in the selected genotype


def _paths(net: SearchNetwork, ops: list[int], count: int, seed: int) -> list[dict[str, list[int]]]:
    """``count`` paths (an op index per edge per alpha key) drawn from the alphas' softmax
    over ``ops`` by a generator of its own: the run's random streams are left as they are."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        path = {}
        for key, a in net.alphas.items():
            p = a.detach().float().cpu()[:, ops].softmax(-1)
            draws = torch.multinomial(p, 1, generator=gen).flatten().tolist()
            path[key] = [ops[d] for d in draws]
        out.append(path)
    return out


def _plans(path: dict[str, list[int]]) -> dict[str, list]:
    return {key: [[(i, None)] for i in ops] for key, ops in path.items()}


@torch.no_grad()
def _accuracy(net: SearchNetwork, batches: list[tuple[torch.Tensor, torch.Tensor]], path) -> float:
    plans = _plans(path)
    correct = sum((net(x, plans)[: len(y)].argmax(1) == y).sum().item() for x, y in batches)
    return correct / max(1, sum(len(y) for _, y in batches))


def _edges(net: SearchNetwork) -> Iterator[tuple[str, int, int]]:
    """(alpha key, node, input) of every edge, in the fixed order of the measurement."""
    for key in net.alphas:
        for k in range(net.spec.steps):
            for j in range(k + 2):
                yield key, k, j


def measure_drops(
    net: SearchNetwork,
    val: Split,
    *,
    images: int,
    paths: int,
    seed: int,
    batch_size: int,
    pad_to: int | None = None,
) -> list[EdgeDrops]:
    """The drop of masking each op on each edge of the sampled supernet (see the module);
    ``pad_to``: what a smaller batch is padded to, as the run's evaluation pads
    (:func:`~asolab.data.eval_pad`)."""
    prims = net.spec.primitives
    ops = [i for i, p in enumerate(prims) if p != "none"]
    batches = list(Batches(val.head(images), batch_size, pad_to=pad_to))
    drawn = _paths(net, ops, paths, seed)
    was_training = net.training
    net.eval()
    try:
        base = [_accuracy(net, batches, p) for p in drawn]
        out = []
        for key, k, j in _edges(net):
            e = edge_index(k, j)
            acc = {}
            for o in ops:
                runs = []
                for path, b in zip(drawn, base):
                    if path[key][e] == o:
                        runs.append(b)  # the path runs o there already
                    else:
                        forced = {**path, key: [*path[key][:e], o, *path[key][e + 1 :]]}
                        runs.append(_accuracy(net, batches, forced))
                acc[prims[o]] = sum(runs) / len(runs)
            prob = net.alphas[key].detach().float().cpu()[e, ops].softmax(-1).tolist()
            p = dict(zip((prims[o] for o in ops), prob))
            full = sum(p[o] * acc[o] for o in acc)
            drop = {
                o: full - sum(p[q] * acc[q] for q in acc if q != o) / max(1e-12, 1 - p[o])
                for o in acc
            }
            chosen = max(acc, key=lambda o: (drop[o], -prims.index(o)))
            out.append(EdgeDrops(key, k, j, acc, drop, chosen))
    finally:
        net.train(was_training)
    return out


def _node_inputs(drops: list[EdgeDrops]) -> list[EdgeDrops]:
    """The two edges of a node whose chosen op matters most (ties: lower input)."""
    return sorted(drops, key=lambda d: (-d.drop[d.chosen], d.input))[:2]


def _cap(nodes: list[list[list]], drops: dict, cap: int, prims: tuple[str, ...]) -> None:
    """Swap kept parameter-free ops (``[op, input]`` per node, in place) for their edge's
    best op with weights, cheapest swap (smallest loss of drop) first, until ``cap`` remain."""
    swaps = []
    for k, node in enumerate(nodes):
        for entry in node:
            op, j = entry
            d = drops[(k, j)].drop
            weighted = [o for o in d if o not in PARAMETER_FREE]
            if op in PARAMETER_FREE and weighted:
                best = max(weighted, key=lambda o: (d[o], -prims.index(o)))
                swaps.append((d[op] - d[best], entry, best))
    swaps.sort(key=lambda s: s[0])
    for _, entry, op in swaps[: max(0, len(swaps) - cap)]:
        entry[0] = op


def select(
    net: SearchNetwork,
    val: Split,
    *,
    images: int,
    paths: int,
    seed: int,
    batch_size: int,
    param_free_cap: int = -1,
    pad_to: int | None = None,
) -> tuple[Genotype, list[EdgeDrops]]:
    """The genotype perturbation-based selection reads off the supernet, and the
    measurement it rests on (every edge's drops, ``kept`` set on the chosen inputs)."""
    measured = measure_drops(
        net, val, images=images, paths=paths, seed=seed, batch_size=batch_size, pad_to=pad_to
    )
    by_key: dict[str, dict[tuple[int, int], EdgeDrops]] = {}
    for d in measured:
        by_key.setdefault(d.cell, {})[(d.node, d.input)] = d
    cells, kept = {}, set()
    for key, drops in by_key.items():
        nodes = []
        for k in range(net.spec.steps):
            best = _node_inputs([drops[(k, j)] for j in range(k + 2)])
            nodes.append([[d.chosen, d.input] for d in best])
            kept |= {(key, k, d.input) for d in best}
        if param_free_cap >= 0:
            _cap(nodes, drops, param_free_cap, net.spec.primitives)
        cells[key] = tuple(tuple((op, j) for op, j in node) for node in nodes)
    genotype = Genotype.from_cells(cells, range(2, net.spec.steps + 2))
    marked = [
        EdgeDrops(**{**asdict(d), "kept": (d.cell, d.node, d.input) in kept}) for d in measured
    ]
    return genotype, marked


def selection_record(
    cycle: int, genotype: Genotype, drops: list[EdgeDrops], settings: dict[str, Any]
) -> dict[str, Any]:
    """The per-cycle artifact: the settings, the selected genotype, every edge's drops."""
    return {
        "cycle": cycle,
        "selection": "perturbation",
        **settings,
        "genotype": str(genotype),
        "edges": [asdict(d) for d in drops],
    }


def select_genotype(
    net: SearchNetwork, val: Split, cfg: ExperimentConfig, cycle: int, pad_to: int | None = None
) -> tuple[Genotype, dict[str, Any] | None]:
    """The mutation phase's genotype before its edits, read off the supernet ``net`` by
    ``cfg.search.selection`` (``val``: the validation split; ``cycle``: the cycle, for the
    record; ``pad_to``: as the run's evaluation pads), and the per-cycle record (None for
    "alpha")."""
    s = cfg.search
    if s.selection == "alpha":
        return net.derive(s.param_free_cap), None
    settings = {
        "images": min(s.selection_images, len(val)),
        "paths": s.selection_paths,
        "seed": cfg.seed,
    }
    genotype, drops = select(
        net,
        val,
        batch_size=cfg.data.eval_batch_size,
        param_free_cap=s.param_free_cap,
        pad_to=pad_to,
        **settings,
    )
    return genotype, selection_record(cycle, genotype, drops, settings)

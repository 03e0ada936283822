"""Edges switched on the device: a sampled W-step whose launches do not depend on the
path (``speed.sampled_graphs``).

A sampled W-step at the DARTS-like size launches about 2,400 small kernels, and an
H100 sat 86% idle running them one by one (bench/README.md, "On a GPU"). A CUDA
graph replays a captured sequence with one launch, but the sampled path, and with
it the sequence, changes every step. Here every candidate op of an edge is a branch
of a ``torch.cond`` taken when the edge's choice, a tensor on the device, names it:
one sequence serves every path, and torch captures the branches as CUDA graph
conditional nodes (``torch.compile`` with ``backend="cudagraphs"``). Each edge is
compiled alone (:class:`SwitchedEdges`): a trace serves every edge of the same
shapes, stride and op types (5 traces for the DARTS-like size's 112 edges).

What the eager step does, the switched one does:

- BatchNorm in a branch writes no buffer (a branch may not mutate its inputs): it
  normalises with the batch's statistics and returns their mean and unbiased
  variance; after the branches, each op's running statistics move towards them with
  weight ``momentum`` if it was drawn and 0 if not (:func:`switched_edge`);
- the ops the path did not draw get gradients of zeros from their branch; the step
  sets them to None (:meth:`SwitchedNetwork.drop_undrawn`), so clipping, weight decay
  and momentum see exactly the eager step's gradients.

On the CPU one step gives the eager step's loss, weights, momentum and running
statistics to rounding (``tests/test_switched.py``). Only the built-in ops have a
branch form (their ``train_forward`` with another BatchNorm function); a network
with any other op, or with a BatchNorm averaging cumulatively, runs eagerly
(:func:`unswitchable` says why).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cells import MixedOp, Switched
from .network import Plans, SearchNetwork
from .ops import DilConv, FactorizedReduce, Identity, Pool, SepConv

# the ops with a branch form, and their BatchNorms in the order train_forward calls them
# (that of ``modules()`` for each of these)
BRANCH_OPS = (SepConv, DilConv, Pool, FactorizedReduce, Identity)


def _norms(op: nn.Module) -> list[nn.BatchNorm2d]:
    return [m for m in op.modules() if isinstance(m, nn.BatchNorm2d)]


def pure_forward(op: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``op``'s training pass writing no buffer: its output, and for each of its
    BatchNorms (in :func:`_norms` order) the batch's mean and unbiased variance."""
    stats: list[torch.Tensor] = []

    def batch_norm(bn: nn.BatchNorm2d, h: torch.Tensor) -> torch.Tensor:
        var, mean = torch.var_mean(h.detach().float(), dim=(0, 2, 3), correction=1)
        stats.extend((mean, var))
        return F.batch_norm(h, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)

    y = op.train_forward(x, batch_norm)
    return (y.clone() if y is x else y), stats  # a branch may not return its input


def switched_edge(
    edge: MixedOp, choice: torch.Tensor, x: torch.Tensor, stride: int, ops: tuple[int, ...]
) -> torch.Tensor:
    """The edge's op ``choice`` (a 0-d device tensor) names among ``ops``: one
    ``torch.cond`` per op, its other branch zeros, the outputs summed (a chain of nested
    conds traced five times slower); then the chosen op's BatchNorm statistics blended
    into its running ones, the other ops' left as they are (weight 0)."""
    norms = {i: _norms(edge.ops[i]) for i in ops}
    width = 2 * max(len(n) for n in norms.values())
    c = x.shape[1]
    # both branches must return the same strides: the output takes the input's layout
    layout = torch.contiguous_format
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        layout = torch.channels_last

    def branch(i: int) -> Callable:
        def run(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y, stats = pure_forward(edge.ops[i], h)
            stats += [y.new_zeros(c, dtype=torch.float32)] * (width - len(stats))
            # and the same dtype: under autocast a convolution's output is the autocast
            # dtype, the input's may be float32 (a growth gate's product)
            y = y.to(x.dtype).contiguous(memory_format=layout)
            return y, torch.stack(stats)

        return run

    def zeros(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # (torch 2.11 traced empty(memory_format=...).zero_() as contiguous)
        y = torch.zeros_like(h[:, :, ::stride, ::stride], memory_format=layout)
        return y, h.new_zeros(width, c, dtype=torch.float32)

    picked = {i: choice == i for i in ops}
    out = stats = None
    for i in ops:
        y, st = torch.cond(picked[i], branch(i), zeros, (x,))
        out = y if out is None else out + y
        stats = st if stats is None else stats + st
    stats = stats.detach()
    for i in ops:
        weight = picked[i].float()
        for b, bn in enumerate(norms[i]):
            bn.running_mean.lerp_(stats[2 * b], weight * bn.momentum)
            bn.running_var.lerp_(stats[2 * b + 1], weight * bn.momentum)
    return out


# whether this torch captures a torch.cond as a CUDA graph conditional node
CONDITIONAL_NODES = hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node")


def ungraphable(device: torch.device) -> str | None:
    """Why this torch cannot replay switched edges as CUDA graphs on ``device``, or None.

    A branch taken by a device tensor is captured as a CUDA graph conditional node,
    which torch has from 2.12 (2.11 has none): without them capturing a
    ``torch.cond`` reads its predicate on the host and the capture fails (seen on an
    H100 with torch 2.11, bench/README.md "On a GPU"). Off CUDA there are no graphs to
    capture."""
    if device.type != "cuda" or CONDITIONAL_NODES:
        return None
    return (
        f"torch {torch.__version__} cannot capture a torch.cond in a CUDA graph "
        "(conditional nodes: torch 2.12 and later)"
    )


def unswitchable(net: SearchNetwork) -> str | None:
    """Why ``net``'s edges cannot be switched on the device, or None if they can."""
    ops = net.trainable_ops()
    for c, cell in enumerate(net.cells):
        for e, edge in enumerate(cell.edges):
            for i in ops:
                op = edge.ops[i]
                if type(op) not in BRANCH_OPS:
                    where = f"{type(op).__name__}, cell {c} edge {e}"
                    return f"op {net.spec.primitives[i]!r} ({where}) has no branch form"
                for bn in _norms(op):
                    if bn.momentum is None or not bn.track_running_stats:
                        return f"a BatchNorm of op {net.spec.primitives[i]!r} averages cumulatively"
    return None


# Guards are checked at every edge's call, 112 a step at the DARTS-like size: with every
# op module's attributes guarded a call cost 170 us of the host (2-core Xeon), without
# those or the globals' 62 us. Neither can change what an edge computes here: its modules
# are built-in ops of one structure per input shape and stride (both still guarded),
# trained in one mode; the globals are this module's functions. (torch 2.8 and later.)
_GUARD_FILTERS = [
    f
    for name in ("skip_guard_on_all_nn_modules_unsafe", "skip_guard_on_globals_unsafe")
    if (f := getattr(torch.compiler, name, None)) is not None
]


def _fewer_guards(entries: list) -> list[bool]:
    keep = [f(entries) for f in _GUARD_FILTERS]
    return [all(k) for k in zip(*keep)]


class SwitchedEdges:
    """:func:`switched_edge` compiled once per edge shape: with ``backend="cudagraphs"``
    on CUDA (the branches conditional nodes), ``"aot_eager"`` elsewhere (the same step
    without graphs, for checking). :meth:`bind` gives a network's steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        backend = "cudagraphs" if device.type == "cuda" else "aot_eager"
        # shapes fixed: a new shape is a new trace, not a dynamic one
        options = {"guard_filter_fn": _fewer_guards} if _GUARD_FILTERS else None
        self.run = torch.compile(switched_edge, backend=backend, dynamic=False, options=options)

    def bind(self, net: SearchNetwork) -> SwitchedNetwork:
        return SwitchedNetwork(net, self.run, self.device)


class SwitchedNetwork:
    """``net``'s W-steps with its edges switched on the device, for as long as ``net``
    keeps its modules (a W-training phase: growth happens between phases)."""

    def __init__(self, net: SearchNetwork, run: Callable, device: torch.device) -> None:
        self.device = device
        ops = tuple(net.trainable_ops())
        self.run = functools.partial(run, ops=ops)
        # (alpha key, edge, each op's parameters), listed once per phase: walking
        # every op's modules each step cost 14 ms at the DARTS-like size (2-core Xeon)
        self._owned = [
            (net.spec.alpha_key(c), e, [tuple(op.parameters()) for op in edge.ops])
            for c, cell in enumerate(net.cells)
            for e, edge in enumerate(cell.edges)
        ]

    def plans(self, plans: Plans) -> dict[str, Switched]:
        """``plans`` (one op per edge, drawn on the host) as device choices."""
        out = {}
        for key, plan in plans.items():
            index = [choices[0][0] for choices in plan]  # type: ignore[index]
            out[key] = Switched(torch.tensor(index, device=self.device), self.run)
        return out

    def drop_undrawn(self, plans: Plans) -> None:
        """Set the gradients of the ops ``plans`` did not draw to None, as the eager step
        leaves them (their branches gave zeros)."""
        for key, e, per_op in self._owned:
            drawn = plans[key][e][0][0]  # type: ignore[index]
            for i, params in enumerate(per_op):
                if i != drawn:
                    for p in params:
                        p.grad = None

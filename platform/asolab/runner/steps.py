"""One training step of each kind, as functions of exactly what they use.

The runner's phases call these, and ``bench/step_cost.py`` counts and times them
on their own: the weight step (sampled supernet path, or a fixed network), the
alpha step, and the optimizers both are built with.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn

from ..config import SearchConfig
from ..space.network import Plans, SearchNetwork
from ..space.switched import SwitchedNetwork
from .speed import Speed


def optimizers(
    net: SearchNetwork, s: SearchConfig, foreach: bool | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """SGD on the weights and Adam on the alphas, as a run keeps them for its whole length.

    ``foreach`` None is torch's choice per device: multi-tensor kernels on CUDA (a
    handful of launches per step instead of several per parameter), a loop elsewhere
    (``bench/step_cost.py`` counts with True, what a GPU runs)."""
    weight_opt = torch.optim.SGD(
        net.weight_parameters(),
        lr=s.weight_lr,
        momentum=s.weight_momentum,
        weight_decay=s.weight_decay,
        foreach=foreach,
    )
    alpha_opt = torch.optim.Adam(
        net.alpha_parameters(),
        lr=s.alpha_lr,
        betas=(0.5, 0.999),
        weight_decay=s.alpha_weight_decay,
        foreach=foreach,
    )
    return with_momentum_buffers(weight_opt), alpha_opt


def steps_taken(opt: torch.optim.Optimizer) -> int:
    """How many steps ``opt`` (Adam, or any optimizer that counts them in its state)
    has taken: its most-stepped parameter's count, resumes included (the count is
    checkpointed with the optimizer); 0 before the first step."""
    counts = [int(s["step"]) for s in opt.state.values() if "step" in s]
    return max(counts, default=0)


def with_momentum_buffers(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``opt``, each of whose parameters without a momentum buffer given a zero one
    (SGD with momentum and no dampening; any other optimizer is left as it is).

    Why: SGD makes a parameter's buffer at its first gradient, and its multi-tensor step
    (CUDA's default) falls back to a loop over every parameter, two kernels each, when
    any parameter of the step has none. A sampled W-step meets such a parameter until
    every op of every edge has been sampled once, and again after each growth. The
    first update is the same: with no dampening, ``0 * momentum + g`` is ``g``, the
    gradient SGD would have copied."""
    if not isinstance(opt, torch.optim.SGD):
        return opt
    for group in opt.param_groups:
        if not group["momentum"] or group["dampening"]:
            continue
        for p in group["params"]:
            state = opt.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return opt


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    groups = opt.param_groups
    return groups[0]["params"] if len(groups) == 1 else [p for g in groups for p in g["params"]]


def weight_step(
    net: nn.Module,
    speed: Speed,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    plans: Plans | None,
    max_norm: float,
    switched: SwitchedNetwork | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step of the weights: ``net(x, plans)`` on the supernet, ``net(x)`` on a
    fixed network (``plans`` None); with ``switched``, the supernet's edges switched on
    the device (``speed.sampled_graphs``). Returns ``(loss, correct)`` as device tensors."""
    args, after_backward = (), None
    if plans is not None and switched is None:
        args = (plans,)
    elif plans is not None:
        args = (switched.plans(plans),)
        after_backward = functools.partial(switched.drop_undrawn, plans)  # as eager leaves them
    loss, logits = speed.forward_loss(net, x, y, *args)
    clip = _params(opt) if math.isfinite(max_norm) else []  # inf: no norm to compute
    speed.step(loss, opt, clip, max_norm, after_backward)
    return loss.detach(), (logits.argmax(1) == y).sum()


def alpha_step(
    net: SearchNetwork,
    speed: Speed,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    tau: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Adam step of the alphas along a straight-through Gumbel sample."""
    plans = net.sample_plans(tau, differentiable=True)  # fp32, outside autocast
    loss, logits = speed.forward_loss(net, x, y, plans)
    speed.step(loss, opt)
    return loss.detach(), (logits.argmax(1) == y).sum()

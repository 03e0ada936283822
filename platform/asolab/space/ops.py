"""Candidate operations: ``PRIMITIVES`` and the ``OPS`` registry.

Every factory has one signature, ``OPS[name](channels, stride, affine)``, and
returns a module mapping ``(N, C, H, W)`` to ``(N, C, H/stride, W/stride)``.
The built-in ones are the DARTS operations, in the order of ``PRIMITIVES``, the
default search space. ``OPS`` is the one list of operations: ``space.primitives``
accepts its names, which include the ops of installed packages (entry-point group
``asolab.ops``) and those registered in code (:func:`register_op`). A factory
that is not built in is tried once, when it is first used, on a small input at
both strides, and refused by name when its output has the wrong shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..plugins import PluginError, Registry, qualname

# Training steps call the built-in ops' submodules functionally (``_conv``, ``_bn``):
# a search network's step is bound by the host, and each module call and
# BatchNorm's bookkeeping cost more there than the kernel they launch on a GPU.
# The modules stay as they are (state-dict names, growth's rules, hooks); eval mode
# runs them as modules, so forward hooks (FLOPs, memory probes) see every leaf.
# Each built-in op's training pass is ``train_forward(x, bn)``, ``bn`` the BatchNorm
# function: ``_bn`` in a step, one that writes no buffer where a step's graph may not
# (``space/switched.py``, W-training with ``speed.sampled_graphs``).

BatchNormFn = Callable[[nn.BatchNorm2d, torch.Tensor], torch.Tensor]


def _conv(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` without the module call."""
    if conv.padding_mode != "zeros":
        return conv(x)
    return F.conv2d(
        x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups
    )


def _bn(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """``bn(x)`` in training mode without the module call and without counting batches:
    ``num_batches_tracked`` only matters when ``momentum`` is None (a cumulative
    average, as BatchNorm recalibration uses), and then the module runs as it is."""
    if bn.momentum is None or not (bn.training and bn.track_running_stats):
        return bn(x)
    return F.batch_norm(
        x, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, bn.momentum, bn.eps
    )


class ReLUConvBN(nn.Sequential):
    """ReLU -> Conv -> BN, the building block of preprocessing and stems."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, padding: int, affine: bool = True
    ) -> None:
        super().__init__(
            nn.ReLU(inplace=False),
            nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(c_out, affine=affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.train_forward(x) if self.training else super().forward(x)

    def train_forward(self, x: torch.Tensor, bn: BatchNormFn = _bn) -> torch.Tensor:
        _, conv, norm = self
        return bn(norm, _conv(conv, F.relu(x)))


class DilConv(nn.Sequential):
    """ReLU -> depthwise dilated conv -> pointwise conv -> BN."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int,
        padding: int,
        dilation: int,
        affine: bool = True,
    ) -> None:
        super().__init__(
            nn.ReLU(inplace=False),
            nn.Conv2d(
                c_in,
                c_in,
                kernel,
                stride=stride,
                padding=padding,
                dilation=dilation,
                groups=c_in,
                bias=False,
            ),
            nn.Conv2d(c_in, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out, affine=affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.train_forward(x) if self.training else super().forward(x)

    def train_forward(self, x: torch.Tensor, bn: BatchNormFn = _bn) -> torch.Tensor:
        _, depthwise, pointwise, norm = self
        return bn(norm, _conv(pointwise, _conv(depthwise, F.relu(x))))


class SepConv(nn.Sequential):
    """Two stacked dilation-1 ``DilConv`` blocks, the first one strided (as in DARTS)."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, padding: int, affine: bool = True
    ) -> None:
        super().__init__(
            DilConv(c_in, c_in, kernel, stride, padding, 1, affine),
            DilConv(c_in, c_out, kernel, 1, padding, 1, affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.train_forward(x) if self.training else super().forward(x)

    def train_forward(self, x: torch.Tensor, bn: BatchNormFn = _bn) -> torch.Tensor:
        first, second = self
        return DilConv.train_forward(second, DilConv.train_forward(first, x, bn), bn)


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def train_forward(self, x: torch.Tensor, bn: BatchNormFn = _bn) -> torch.Tensor:
        return x


class Zero(nn.Module):
    """The ``none`` operation: zeros of the output shape, no parameters."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            return x.mul(0.0)
        return x[:, :, :: self.stride, :: self.stride].mul(0.0)


class FactorizedReduce(nn.Module):
    """Halve the resolution with two offset 1x1 strided convolutions, concatenated."""

    def __init__(self, c_in: int, c_out: int, affine: bool = True) -> None:
        super().__init__()
        if c_out % 2:
            raise ValueError(f"FactorizedReduce needs an even channel count, got {c_out}")
        self.relu = nn.ReLU(inplace=False)
        self.conv_1 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.conv_2 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.train_forward(x)
        x = self.relu(x)
        # The second path looks at odd pixels; padding keeps odd sizes aligned.
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(shifted)], dim=1))

    def train_forward(self, x: torch.Tensor, bn: BatchNormFn = _bn) -> torch.Tensor:
        x = F.relu(x)
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return bn(self.bn, torch.cat([_conv(self.conv_1, x), _conv(self.conv_2, shifted)], dim=1))


class Pool(nn.Module):
    """3x3 max or average pooling followed by BN (needed to tame scale in a supernet)."""

    def __init__(self, kind: str, channels: int, stride: int, affine: bool) -> None:
        super().__init__()
        self.pool = (
            nn.MaxPool2d(3, stride=stride, padding=1)
            if kind == "max"
            else nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)
        )
        self.bn = nn.BatchNorm2d(channels, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.train_forward(x) if self.training else self.bn(self.pool(x))

    def train_forward(self, x: torch.Tensor, bn: BatchNormFn = _bn) -> torch.Tensor:
        return bn(self.bn, self.pool(x))


OpFactory = Callable[[int, int, bool], nn.Module]

NONE = "none"  # the op that cuts an edge: zero output, no weights, never trained

BUILTIN_OPS: dict[str, OpFactory] = {
    NONE: lambda c, stride, affine: Zero(stride),
    "max_pool_3x3": lambda c, stride, affine: Pool("max", c, stride, affine),
    "avg_pool_3x3": lambda c, stride, affine: Pool("avg", c, stride, affine),
    "skip_connect": lambda c, stride, affine: (
        Identity() if stride == 1 else FactorizedReduce(c, c, affine)
    ),
    "sep_conv_3x3": lambda c, stride, affine: SepConv(c, c, 3, stride, 1, affine),
    "sep_conv_5x5": lambda c, stride, affine: SepConv(c, c, 5, stride, 2, affine),
    "dil_conv_3x3": lambda c, stride, affine: DilConv(c, c, 3, stride, 2, 2, affine),
    "dil_conv_5x5": lambda c, stride, affine: DilConv(c, c, 5, stride, 4, 2, affine),
}

PRIMITIVES: tuple[str, ...] = tuple(BUILTIN_OPS)
GROUP = "asolab.ops"
_NAME = re.compile(r"[a-z][a-z0-9_]*")  # what a genotype string can hold (Genotype.parse)


def _checked(name: str, factory: Any) -> OpFactory:
    """``factory`` if it builds a module of the right output shape, else PluginError."""
    where = f"op {name!r} ({qualname(factory)})"
    if not _NAME.fullmatch(name):
        raise PluginError(
            f"op name {name!r} is not valid; use lower-case letters, digits and _ (as in "
            "sep_conv_3x3), so that genotype strings can hold it"
        )
    if not callable(factory):
        raise PluginError(f"{where} is a {type(factory).__name__}, not a factory")
    c, x = 4, torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    for stride in (1, 2):
        want = (2, c, 8 // stride, 8 // stride)
        try:
            module = factory(c, stride, False)
            if not isinstance(module, nn.Module):
                raise TypeError(f"it returns a {type(module).__name__}, not a torch.nn.Module")
            with torch.no_grad():
                got = tuple(module.eval()(x).shape)
        except Exception as exc:  # a plugin's code can fail in any way; name the op
            raise PluginError(
                f"{where} fails at factory({c}, stride={stride}, affine=False) on an input of "
                f"shape {tuple(x.shape)}: {type(exc).__name__}: {exc}"
            ) from None
        if got != want:
            raise PluginError(
                f"{where} returns shape {got} for an input of shape {tuple(x.shape)} at "
                f"stride {stride}; an op must return {want}: (N, C, H/stride, W/stride)"
            )
    return factory


OPS: Registry[OpFactory] = Registry("op", GROUP, BUILTIN_OPS, _checked)


def build_op(name: str, channels: int, stride: int, affine: bool = False) -> nn.Module:
    """``OPS[name](channels, stride, affine)``; a plugin's op is also run once on a small
    input at that width, so that one that builds or runs only at some widths fails
    here, in one line naming it and the width (the registration probe builds it at 4
    channels; a run builds it at every width of its cells), not mid-training."""
    key = (name, id(OPS[name]), channels, stride, affine)
    if OPS.builtin(name) or key in _PROBED:
        return OPS[name](channels, stride, affine)
    where = f"op {name!r} ({OPS.origin(name)})"
    x = torch.zeros(2, channels, 8, 8)
    want = (2, channels, 8 // stride, 8 // stride)
    try:
        module = OPS[name](channels, stride, affine)
        training = module.training
        with torch.no_grad():
            got = tuple(module.eval()(x).shape)
        module.train(training)
    except Exception as exc:  # a plugin's code can fail in any way; name the op and width
        raise PluginError(
            f"{where} fails at factory({channels}, stride={stride}, affine={affine}), a width "
            f"this run's cells use: {type(exc).__name__}: {exc}"
        ) from None
    if got != want:
        raise PluginError(
            f"{where} returns shape {got} at {channels} channels and stride {stride}; an op "
            f"must return {want}: (N, C, H/stride, W/stride)"
        )
    _PROBED.add(key)
    return module


_PROBED: set[tuple[str, int, int, int, bool]] = set()  # plugin ops run once at these widths


def load_ops(names: Iterable[str]) -> None:
    """Import every op of ``names`` now (a plugin's module loads on first use): one that
    fails to import is a PluginError naming it, before a study's trials each fail on it."""
    for name in names:
        OPS[name]


def register_op(name: str, factory: OpFactory) -> None:
    """Make ``name`` a valid entry of ``space.primitives`` in this process.

    ``factory(channels, stride, affine)`` returns a module mapping ``(N, C, H, W)`` to
    ``(N, C, H/stride, W/stride)``; it is checked on a small input now.
    """
    OPS.register(name, factory, qualname(factory))


# The ops a DARTS-style search collapses to when its alphas decide early: no
# spatial filter to train, so they win the supernet's first epochs. A reducing
# skip_connect carries a 1x1 factorized reduction but is counted with them, as
# in the literature (``search.param_free_cap``).
PARAMETER_FREE: frozenset[str] = frozenset({"skip_connect", "max_pool_3x3", "avg_pool_3x3"})

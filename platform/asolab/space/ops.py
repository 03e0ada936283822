"""Candidate operations: ``PRIMITIVES`` and the ``OPS`` registry.

Every factory has one signature, ``OPS[name](channels, stride, affine)``, and
returns a module mapping ``(N, C, H, W)`` to ``(N, C, H/stride, W/stride)``.
These are the DARTS operations; an experiment chooses a subset of them.
``OPS`` is the one list of operations: ``space.primitives`` accepts its names,
and its order is ``PRIMITIVES``, the default search space.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn


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


class SepConv(nn.Sequential):
    """Two stacked dilation-1 ``DilConv`` blocks, the first one strided (as in DARTS)."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, padding: int, affine: bool = True
    ) -> None:
        super().__init__(
            DilConv(c_in, c_in, kernel, stride, padding, 1, affine),
            DilConv(c_in, c_out, kernel, 1, padding, 1, affine),
        )


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
        x = self.relu(x)
        # The second path looks at odd pixels; padding keeps odd sizes aligned.
        shifted = nn.functional.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(shifted)], dim=1))


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
        return self.bn(self.pool(x))


OpFactory = Callable[[int, int, bool], nn.Module]

NONE = "none"  # the op that cuts an edge: zero output, no weights, never trained

OPS: dict[str, OpFactory] = {
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

PRIMITIVES: tuple[str, ...] = tuple(OPS)

# The ops a DARTS-style search collapses to when its alphas decide early: no
# spatial filter to train, so they win the supernet's first epochs. A reducing
# skip_connect carries a 1x1 factorized reduction but is counted with them, as
# in the literature (``search.param_free_cap``).
PARAMETER_FREE: frozenset[str] = frozenset({"skip_connect", "max_pool_3x3", "avg_pool_3x3"})

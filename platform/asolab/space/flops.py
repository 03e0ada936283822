"""How much a derived network computes: multiply-adds of one forward pass.

Counted by forward hooks on one input image run along the genotype on a
supernet built from the spec: every convolution adds (output elements) x
(input channels per group) x (kernel area), the classifier its weight count.
BatchNorm, pooling, additions and activations are left out, as the NAS
literature's "FLOPs" (which are multiply-adds) leave them out. The count
depends on the spec, the genotype and the image size, not on the weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .genotype import Genotype
from .network import SearchNetwork
from .spec import ArchSpec


def network_size(spec: ArchSpec, genotype: Genotype, image_size: int) -> tuple[int, int]:
    """Parameters and multiply-adds of one ``image_size`` x ``image_size`` image through
    ``genotype`` on a network of shape ``spec`` (growth branches and residual cells
    included); the parameters are those the runner counts for the derived network."""
    net = SearchNetwork(spec, only=genotype).eval()  # the genotype's ops alone
    total = 0

    def conv(module: nn.Conv2d, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        kernel = module.kernel_size[0] * module.kernel_size[1]
        total += output.numel() * (module.in_channels // module.groups) * kernel

    def linear(module: nn.Linear, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        total += output.numel() * module.in_features

    hooks = [
        m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else linear)
        for m in net.modules()
        if isinstance(m, (nn.Conv2d, nn.Linear))
    ]
    try:
        with torch.no_grad():
            net(
                torch.zeros(1, spec.in_channels, image_size, image_size),
                net.genotype_plans(genotype),
            )
    finally:
        for h in hooks:
            h.remove()
    return net.count_derived(genotype), total

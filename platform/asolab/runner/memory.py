"""Memory: statistics (process RSS and its peak; CUDA allocated and peak on GPU),
and whether a supernet fits before it is allocated (:func:`check_fits`)."""

from __future__ import annotations

import functools
import resource
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
import torch
import torch.nn as nn

from ..config import ConfigError
from ..errors import first_line
from ..space.ops import NONE
from ..space.spec import edge_stride, halved

if TYPE_CHECKING:  # pragma: no cover
    from ..space.spec import ArchSpec

_MB = 1024.0 * 1024.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process since it started."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / _MB if sys.platform == "darwin" else peak / 1024.0


def memory_stats(device: torch.device) -> dict[str, float]:
    stats = {"rss_mb": psutil.Process().memory_info().rss / _MB, "peak_rss_mb": peak_rss_mb()}
    if device.type == "cuda":
        stats["cuda_allocated_mb"] = torch.cuda.memory_allocated(device) / _MB
        stats["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / _MB
        # what the process held from the GPU at most (tensors and the allocator's cache; the
        # CUDA context aside): the share of the GPU a study worker beside it cannot have
        stats["cuda_peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / _MB
    return stats


# --------------------------------------------------------------------------- fitting in memory

_GIB = 1024.0**3
FLOAT_BYTES = 4  # float32 weights and activations
# Per weight: the weight, its gradient and SGD's momentum buffer.
WEIGHT_COPIES = 3
# Saved activations, plus their gradients alive during the backward pass.
ACTIVATION_COPIES = 2


class MemoryLimitError(ConfigError):
    """A run that would not fit in memory (estimated before allocating, or a CUDA
    out-of-memory error), phrased as one line naming the keys to lower."""


@dataclass(frozen=True)
class MemoryEstimate:
    """What a supernet needs while it trains, in bytes (an estimate, float32)."""

    params: int
    weight_bytes: int  # weights, gradients, momentum
    activation_bytes: int  # one training step at the batch size

    @property
    def total(self) -> int:
        return self.weight_bytes + self.activation_bytes


def _leaf_elements(module: nn.Module, shape: tuple[int, ...]) -> int:
    """Elements of every leaf module's output for one input of ``shape``: what autograd
    keeps for the backward pass, roughly."""
    total = 0

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    leaves = [m for m in module.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            module.eval()(torch.zeros(shape))
    finally:
        for h in handles:
            h.remove()
    return total


# Edge operations keep every intermediate tensor at the edge's channel count, so their
# activations are measured at this many channels (a real forward, tiny) and scaled.
_PROBE_CHANNELS = 4


@functools.lru_cache(maxsize=1024)
def _op_elements(name: str, channels: int, stride: int, height: int) -> int:
    """Leaf output elements of edge operation ``name`` for one image of ``height``."""
    from ..space.ops import OPS

    # Building and running the probe draws from torch's global generator; the run is
    # seeded before this and the cache makes only a process's first estimate draw, so
    # without a fork the same seed would give other weights to every later run.
    with torch.random.fork_rng(devices=[]):
        op = OPS[name](_PROBE_CHANNELS, stride, False)
        elements = _leaf_elements(op, (1, _PROBE_CHANNELS, height, height))
    return elements * channels // _PROBE_CHANNELS


@functools.lru_cache(maxsize=64)  # a study's trials and a run's retries share their spec
def _supernet_params(spec: ArchSpec) -> int:
    """The supernet's parameter count (alphas included), from the network itself built on
    the meta device: nothing allocated, and no second account of its modules."""
    from ..space.network import build_on

    return sum(p.numel() for p in build_on(spec, "meta").parameters())


def _preprocess_elements(c_in: int, c: int, height: int, reduce: bool) -> int:
    """Leaf output elements per image of a cell's input preprocessing: ReLU-Conv1x1-BN,
    or FactorizedReduce (ReLU, two strided 1x1 convs of c/2, BN)."""
    h = halved(height) if reduce else height
    return c_in * height**2 + 2 * c * h**2


def estimate_supernet(spec: ArchSpec, batch_size: int, image_size: int) -> MemoryEstimate:
    """Memory to train the supernet of ``spec`` at ``batch_size``, without allocating it.

    Parameters are the network's own, built on the meta device; activations follow
    the stack's geometry (``spec.inputs``) and assume the heaviest operation on every
    edge, since a W-training step runs one sampled operation per edge.
    """
    prims = [p for p in spec.primitives if p != NONE]
    stem = spec.stem_channels
    params = _supernet_params(spec)
    elements = 2 * stem * spec.stem_size(image_size) ** 2
    for cs, into in zip(spec.cells, spec.inputs(image_size), strict=False):
        c, h_p = cs.channels, into.h_prev
        h_out = halved(h_p) if cs.reduction else h_p
        elements += _preprocess_elements(into.c_prev_prev, c, into.h_prev_prev, into.reduction_prev)
        elements += _preprocess_elements(into.c_prev, c, h_p, False)
        for k in range(spec.steps):
            for j in range(k + 2):
                stride = edge_stride(cs.reduction, j)
                h_in = h_p if stride == 2 else h_out
                elements += max(_op_elements(p, c, stride, h_in) for p in prims)
        for _k, j, op in cs.branches:
            stride = edge_stride(cs.reduction, j)
            elements += _op_elements(op, c, stride, h_p if stride == 2 else h_out)
        elements += 2 * spec.steps * c * h_out**2  # node sums and the concatenated output
    return MemoryEstimate(
        params=params,
        weight_bytes=WEIGHT_COPIES * FLOAT_BYTES * params,
        activation_bytes=ACTIVATION_COPIES * FLOAT_BYTES * elements * batch_size,
    )


def available_bytes(device: torch.device) -> int:
    """Memory a new supernet may take on ``device``: free GPU memory, else available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


_LOWER = "lower space.init_channels, space.layers, space.steps or data.batch_size"


def check_fits(
    spec: ArchSpec, batch_size: int, image_size: int, device: torch.device
) -> MemoryEstimate:
    """Refuse (MemoryLimitError, one line) a supernet that would not fit in memory:
    better than the kernel's OOM killer, which ends the run with no message."""
    est = estimate_supernet(spec, batch_size, image_size)
    gib = {k: f"{v / _GIB:.1f} GiB" for k, v in vars(est).items() if k.endswith("_bytes")}
    what = (
        f"{est.params / 1e6:,.1f} M parameters: {gib['weight_bytes']} with gradients and momentum; "
        f"activations at data.batch_size={batch_size}: {gib['activation_bytes']}"
    )
    ram = int(psutil.virtual_memory().available)
    if device.type == "cuda":  # built on the GPU directly (runner/speed.py build_network)
        free = available_bytes(device)
        if est.total > free:
            raise MemoryLimitError(
                f"the supernet needs about {est.total / _GIB:.1f} GiB on {device} ({what}) but "
                f"{free / _GIB:.1f} GiB of GPU memory is free; {_LOWER}"
            )
    elif device.type == "cpu" and est.total > ram:  # MPS has no free-memory query: torch reports
        raise MemoryLimitError(
            f"the supernet needs about {est.total / _GIB:.1f} GiB ({what}) but "
            f"{ram / _GIB:.1f} GiB "
            f"of RAM is available; {_LOWER}"
        )
    return est


def out_of_memory(
    exc: BaseException,
    device: torch.device,
    batch_size: int,
    estimate: MemoryEstimate | None = None,
) -> MemoryLimitError:
    """A CUDA (or other accelerator) out-of-memory error as one line naming the memory
    needed (``estimate``, and the peak in use when it struck) and the knobs that
    lower it; frees the cache, so that the next run in this process (a study's next
    trial) starts clean."""
    needed = ""
    if estimate is not None:
        needed = f"; the supernet needs about {estimate.total / _GIB:.2f} GiB (estimate)"
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / _GIB
        needed += f", {peak:.2f} GiB were in use at the peak"
        torch.cuda.empty_cache()
    first = first_line(exc) or type(exc).__name__
    return MemoryLimitError(
        f"out of memory on {device} at data.batch_size={batch_size} ({first[:200]}){needed}; "
        f"{_LOWER}, or set speed.autocast = 'bf16'"
    )

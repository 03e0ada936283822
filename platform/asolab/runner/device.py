"""The torch device a run uses, from the config's ``device`` setting.

Shared by the runner and the study workers (which load each data set once per
device); a device this machine lacks is a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from ..config import ConfigError

if TYPE_CHECKING:
    from ..space.spec import ArchSpec


def normalise_device(device: torch.device | str) -> torch.device:
    """``device`` with its index: ``cuda`` means ``cuda:<current index>``, as every tensor
    made there reports it (torch compares ``cuda`` and ``cuda:0`` as different devices).
    Without a driver (tests on a fake CUDA device) the current index is 0."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return device


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA, then MPS, then the CPU; an unavailable device is a config error.
    A CUDA device comes back with its index (:func:`normalise_device`), the one the run
    records and compares tensors against."""
    if name == "auto":
        if torch.cuda.is_available():
            return normalise_device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device = {name!r} but CUDA is not available here; use device = 'cpu' or 'auto'"
            )
        check_cuda_index(name, torch.cuda.device_count())
    if name == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
        raise ConfigError(
            "device = 'mps' but MPS is not available here; use device = 'cpu' or 'auto'"
        )
    return normalise_device(name)


def check_cuda_index(name: str, count: int) -> None:
    """Refuse ``cuda:N`` when the machine has only ``count`` CUDA devices.

    torch would accept the name and fail at the first tensor moved there, with
    an error that does not name the setting.
    """
    _, _, index = name.partition(":")
    if index and not index.isdigit():
        raise ConfigError(f"device = {name!r} is not valid; write cuda or cuda:N")
    if index and int(index) >= count:
        have = f"cuda:0 to cuda:{count - 1}" if count > 1 else "cuda:0" if count == 1 else "none"
        raise ConfigError(
            f"device = {name!r} but this machine has {count} CUDA device(s) ({have}); use device "
            "= 'cuda' or one of those"
        )


# oneDNN's channels-last CPU kernels corrupted the heap (aborts, segmentation faults in
# the backward pass) on an AVX2 machine (AMD EPYC without AVX-512; torch 2.14.1, oneDNN
# 3.12) whenever the first cell had fewer channels than one AVX2 register holds floats, at
# one thread: init_channels 2-6 crashed every time, 8 and 16 never. Disabling oneDNN, or
# capping it at AVX, also avoided it. Networks that small keep the plain layout on the CPU.
CPU_CHANNELS_LAST_MIN = 8


def memory_format(channels_last: bool, device: torch.device, spec: ArchSpec) -> torch.memory_format:
    """The layout of the weights of a network of ``spec`` on ``device``
    (``speed.channels_last``). Convolutions and pooling follow their weights' layout, so
    the activations need no conversion. On the CPU a network whose narrowest cell has
    fewer than ``CPU_CHANNELS_LAST_MIN`` channels stays contiguous (see above)."""
    narrowest = min((c.channels for c in spec.cells), default=spec.stem_channels)
    tiny = device.type == "cpu" and narrowest < CPU_CHANNELS_LAST_MIN
    return torch.channels_last if channels_last and not tiny else torch.contiguous_format


def describe_device(device: torch.device) -> dict[str, str]:
    """What a run records about its device: for a GPU its name, its index as the
    machine numbers it (``CUDA_VISIBLE_DEVICES`` maps a worker's ``cuda:0`` to it) and
    its memory; the visible-devices setting whenever one is set."""
    info = {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        info["cuda_visible_devices"] = visible
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        ids = [v.strip() for v in (visible or "").split(",") if v.strip()]
        info["gpu_name"] = props.name
        info["gpu_index"] = ids[index] if index < len(ids) else str(index)
        info["gpu_memory_gib"] = f"{props.total_memory / 2**30:.1f}"
    return info

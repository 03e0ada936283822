"""A CUDA device for placement tests on a machine without one.

``on_device()`` yields the device the placement tests run on and the context
they run in. With ``ASOLAB_TEST_DEVICE=cuda`` (or ``cuda:N``) it is the real GPU
and a plain context. Otherwise it is torch's ``FakeTensorMode`` for CUDA
tensors only: every tensor created on (or moved to) ``cuda`` is a fake one
(shape, dtype and device, no values), and forward passes on them raise when a
tensor on another device meets them (``FakeTensorDeviceMismatchError``, or
"weight is on cpu, different from other tensors on cuda:0"), as a real GPU would.

Why not plain ``FakeTensorMode``: it fakes the CPU tensors too, and asolab keeps
host-side bookkeeping (growth's channel mappings, shuffling orders, random
picks) on the CPU, where its values are read. Here CPU work stays real, so the
code runs unchanged; only what touches the device is faked. Fake tensors have
no values: where code reads one off the device (``.tolist()`` of a sampled op
index, ``.item()``), the mode answers with a fixed valid value (index ``i``
gets ``i mod`` the op count, a scalar is 1), so the placement is checked, not the numbers.
Backward does not run on fake CUDA tensors without a driver: the tests step
optimizers only on a real device.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

REAL_DEVICE = os.environ.get("ASOLAB_TEST_DEVICE", "")
# Host memory cannot be pinned without a driver; pinning is a no-op under the fake mode.
_PIN = {torch.ops.aten._pin_memory.default, torch.ops.aten.is_pinned.default}


class _CudaOnlyFake(TorchDispatchMode):
    """Sends to the fake mode below it every op that touches or creates a CUDA tensor;
    runs every other op for real, with the fake mode out of the way."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        device = kwargs.get("device")
        if func in _PIN:
            return args[0] if func is not torch.ops.aten.is_pinned.default else True
        if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            return 1.0 if args[0].dtype.is_floating_point else 1  # no value: see the module doc
        if any(isinstance(a, FakeTensor) for a in flat) or (
            device is not None and torch.device(device).type == "cuda"
        ):
            return func(*args, **kwargs)
        with unset_fake_temporarily():
            return func(*args, **kwargs)


def _nested(shape: list[int], start: int, modulo: int):
    if not shape:
        return start % modulo
    step = 1
    for d in shape[1:]:
        step *= d
    return [_nested(shape[1:], start + k * step, modulo) for k in range(shape[0])]


@contextlib.contextmanager
def _values(modulo: int) -> Iterator[None]:
    """Fixed stand-ins for the values a fake tensor does not have."""
    saved, load = FakeTensor.tolist, torch.load
    FakeTensor.tolist = lambda self: _nested(list(self.shape), 0, modulo)

    def real_load(*args, **kwargs):
        # torch.load makes fake tensors when a fake mode is active; asolab loads
        # checkpoints to the CPU (map_location) and copies them onto the device.
        with unset_fake_temporarily():
            return load(*args, **kwargs)

    torch.load = real_load
    try:
        yield
    finally:
        FakeTensor.tolist, torch.load = saved, load


def is_fake() -> bool:
    return not REAL_DEVICE


@contextlib.contextmanager
def on_device(index: int | None = None, modulo: int = 8) -> Iterator[torch.device]:
    """The device the placement tests check, and the mode it needs (see the module doc).
    ``index`` None: the device as a config names it, ``cuda`` with no index, as on a GPU
    (``ASOLAB_TEST_DEVICE=cuda``), while every tensor made there reports ``cuda:0``: the
    tests must compare normalised devices (``asolab.runner.device.normalise_device``), as
    they must on a real GPU, where ``cuda:0 != cuda``. ``modulo``: the op count of the
    space under test (sampled indices stay valid)."""
    if REAL_DEVICE:
        yield torch.device(REAL_DEVICE if index is None else f"cuda:{index}")
        return
    with FakeTensorMode(allow_non_fake_inputs=True), _CudaOnlyFake(), _values(modulo):
        yield torch.device("cuda") if index is None else torch.device("cuda", index)

"""One GPU per study worker: which device each ``--workers`` process sees.

Worker ``i`` of ``K`` gets GPU ``i mod N`` of the ``N`` GPUs on offer (the
``--gpus`` list, else the ids in this process's ``CUDA_VISIBLE_DEVICES``,
else every GPU CUDA counts), through ``CUDA_VISIBLE_DEVICES`` in the
environment it starts with: set before the worker's torch starts, so the worker
sees exactly one device, as ``cuda:0``. More workers than GPUs share them
round-robin; no GPU leaves the environment as it is (CPU runs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..config import ConfigError

GPU_ENV = "CUDA_VISIBLE_DEVICES"


def parse_gpus(text: str) -> list[str]:
    """``--gpus 0,1,3`` -> ["0", "1", "3"] (ids or GPU UUIDs, as CUDA_VISIBLE_DEVICES takes)."""
    ids = [g.strip() for g in text.split(",")]
    if not all(ids):
        raise ConfigError(f"--gpus {text!r}: give GPU ids separated by commas, e.g. --gpus 0,1")
    return ids


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs on offer: ``CUDA_VISIBLE_DEVICES``'s ids where it is set, else every GPU
    CUDA counts (none on a machine without CUDA)."""
    environ = os.environ if environ is None else environ
    if GPU_ENV in environ:
        ids = [g.strip() for g in environ[GPU_ENV].split(",") if g.strip()]
        # CUDA stops at the first invalid id; "-1" is the usual way to hide every GPU
        return ids[: ids.index("-1")] if "-1" in ids else ids
    import torch  # here: counting needs torch, assigning does not

    return [str(i) for i in range(torch.cuda.device_count())]


def assign_gpus(workers: int, gpus: Sequence[str]) -> list[str | None]:
    """The GPU of each of ``workers`` workers: round-robin over ``gpus`` (None: no GPU)."""
    return [gpus[i % len(gpus)] if gpus else None for i in range(workers)]


def worker_env(environ: Mapping[str, str], gpu: str | None) -> dict[str, str]:
    """The environment a worker starts with: ``environ`` with its one GPU visible."""
    env = dict(environ)
    if gpu is not None:
        env[GPU_ENV] = gpu
    return env

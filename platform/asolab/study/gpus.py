"""One GPU per study worker: which device each ``--workers`` process sees.

Worker ``i`` of ``K`` gets GPU ``i mod N`` of the ``N`` GPUs on offer (the
``--gpus`` list, else the ids in this process's ``CUDA_VISIBLE_DEVICES``,
else every GPU CUDA counts), through ``CUDA_VISIBLE_DEVICES`` in the
environment it starts with: set before the worker's torch starts, so the worker
sees exactly one device, as ``cuda:0``. More workers than GPUs share them
round-robin; no GPU leaves the environment as it is (CPU runs).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence

from ..config import ConfigError

GPU_ENV = "CUDA_VISIBLE_DEVICES"
log = logging.getLogger(__name__)


# What CUDA_VISIBLE_DEVICES takes: an index, or a GPU's or MIG instance's UUID
_GPU_ID = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")


def parse_gpus(text: str) -> list[str]:
    """``--gpus 0,1,3`` -> ["0", "1", "3"] (ids or GPU UUIDs, as CUDA_VISIBLE_DEVICES takes)."""
    ids = [g.strip() for g in text.split(",")]
    if not all(ids):
        raise ConfigError(f"--gpus {text!r}: give GPU ids separated by commas, e.g. --gpus 0,1")
    bad = [g for g in ids if not _GPU_ID.fullmatch(g)]
    if bad:
        raise ConfigError(
            f"--gpus {text!r}: {bad[0]!r} is not a GPU id; give indices (--gpus 0,1) or GPU "
            "UUIDs (GPU-..., as nvidia-smi -L lists them)"
        )
    return ids


def study_gpus(text: str, device: str, workers: int) -> list[str]:
    """The GPUs a study's workers share: ``--gpus`` checked (``text``; "" = the visible
    ones). Naming GPUs where CUDA sees none is refused (the runs would silently train
    on the CPU while recording the GPU ids), unless the experiment says
    ``device = "cpu"``: the CPU on purpose, said in a warning. One worker's GPU is
    made visible in this process (CUDA reads it when torch first touches the GPU,
    which counting them does)."""
    if not text:
        return visible_gpus()
    ids = parse_gpus(text)
    before = os.environ.get(GPU_ENV)
    if workers == 1:
        os.environ[GPU_ENV] = ids[0]
    if device == "cpu":
        log.warning("--gpus %s with device = 'cpu': the runs train on the CPU", text)
        return ids
    import torch

    if torch.cuda.device_count() == 0:
        if before is None:
            os.environ.pop(GPU_ENV, None)
        else:
            os.environ[GPU_ENV] = before
        raise ConfigError(
            f"--gpus {text}: no GPU is visible here (CUDA counts none"
            + (f" with CUDA_VISIBLE_DEVICES={ids[0]}" if workers == 1 else "")
            + "); drop --gpus, or run on the CPU on purpose with --set device=cpu"
        )
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

"""Memory statistics: process RSS and its peak; CUDA allocated and peak on GPU."""

from __future__ import annotations

import resource
import sys

import psutil
import torch

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
    return stats

"""Temperature schedules for the Gumbel-softmax sampler.

Schedules are pure functions of run progress ``p`` in [0, 1]: they start at
``initial_temperature`` and reach ``min_temperature`` once ``p`` reaches
``anneal_fraction``, then stay there. Each is monotone non-increasing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..config import TemperatureConfig


def _annealed(progress: float, cfg: TemperatureConfig) -> float:
    return min(1.0, max(0.0, progress) / cfg.anneal_fraction)


def exponential(progress: float, cfg: TemperatureConfig) -> float:
    """Geometric interpolation: tau = tau0 * (tau_min / tau0) ** q."""
    q = _annealed(progress, cfg)
    return cfg.initial_temperature * (cfg.min_temperature / cfg.initial_temperature) ** q


def cosine(progress: float, cfg: TemperatureConfig) -> float:
    q = _annealed(progress, cfg)
    return cfg.min_temperature + 0.5 * (cfg.initial_temperature - cfg.min_temperature) * (
        1 + math.cos(math.pi * q)
    )


def linear(progress: float, cfg: TemperatureConfig) -> float:
    q = _annealed(progress, cfg)
    return cfg.initial_temperature + (cfg.min_temperature - cfg.initial_temperature) * q


def constant(progress: float, cfg: TemperatureConfig) -> float:
    return cfg.initial_temperature


SCHEDULES: dict[str, Callable[[float, TemperatureConfig], float]] = {
    "exponential": exponential,
    "cosine": cosine,
    "linear": linear,
    "constant": constant,
}


def temperature(progress: float, cfg: TemperatureConfig) -> float:
    """The temperature at run progress ``progress`` under ``cfg.schedule``."""
    return SCHEDULES[cfg.schedule](progress, cfg)

"""The run's schedule: its epochs, the temperature and the learning rate at the
current position."""

from __future__ import annotations

import math

from ..evolution.temperature import temperature as temperature_at
from .parts import Part
from .phases import search_epochs


class Schedule(Part):
    """Epoch counts and the schedules read at the runner's position (a Runner part)."""

    reads = frozenset({"cfg", "state"})

    @property
    def search_epochs(self) -> int:
        return search_epochs(self.cfg.search)

    @property
    def total_epochs(self) -> int:
        return self.search_epochs + self.cfg.search.final_epochs

    @property
    def weight_epochs(self) -> int:
        """Weight epochs the learning-rate schedule is laid out on (search.final_epochs
        for the final stage, whatever a budget fits)."""
        return search_epochs(self.cfg.search, weights_only=True) + self.cfg.search.final_epochs

    @property
    def final_epochs(self) -> int:
        """The final stage's epochs: search.final_epochs, or as many of them as fit
        search.budget_minutes once the stage's first epoch has fitted them."""
        return self.state.final_epochs or self.cfg.search.final_epochs

    def temperature(self) -> float:
        progress = min(1.0, self.state.position.global_epoch / max(1, self.search_epochs - 1))
        return temperature_at(progress, self.cfg.temperature)

    def weight_lr(self) -> float:
        s = self.cfg.search
        q = min(1.0, self._schedule_epoch() / max(1, self.weight_epochs))
        return s.weight_lr_min + 0.5 * (s.weight_lr - s.weight_lr_min) * (1 + math.cos(math.pi * q))

    def _schedule_epoch(self) -> float:
        """Where the cosine schedule is, in weight epochs. A final stage fitted to fewer
        epochs than search.final_epochs is stretched over the same part of the schedule,
        so that its last epoch still anneals to weight_lr_min."""
        done = self.state.position.weight_epoch
        nominal = self.cfg.search.final_epochs
        search = self.weight_epochs - nominal
        if done <= search or self.final_epochs == nominal:
            return done
        return search + (done - search) * nominal / self.final_epochs

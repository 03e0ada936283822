"""What a run has done and found: its position in the loop, the state a
checkpoint saves beside weights and optimizers, and the result of a finished run."""

from __future__ import annotations

import types
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

from ..space.genotype import Genotype
from .events import GrowthEvent
from .phases import FINAL_DONE, PHASES, cycle_epochs, search_epochs


@dataclass
class Position:
    """Where the loop is: the next phase to run and the epoch counters."""

    cycle: int = 0
    phase: int = (
        0  # index into PHASES; cycle == cycles means the final stage (phase 0 or FINAL_DONE)
    )
    global_epoch: int = 0  # every training epoch so far (the MLflow step)
    weight_epoch: int = 0  # epochs that trained weights (drives the LR schedule)
    stage_epoch: int = 0  # final-stage epochs done (a checkpoint inside the final stage)


def epochs_done(position: Position, search: Any) -> tuple[int, int] | None:
    """``(global_epoch, weight_epoch)`` that a run with ``search`` settings has done
    when it is at ``position``; None if it never is there (a phase or cycle out of
    range, a final-stage epoch outside the final stage)."""
    s, p = search, position
    if not 0 <= p.cycle <= s.cycles:
        return None
    if p.cycle < s.cycles:
        if not 0 <= p.phase < len(PHASES) or p.stage_epoch != 0:
            return None
        # the epochs of the cycle's phases before p.phase (the warm-up is part of cycle
        # 0's first phase, so it is done at every position but the run's start)
        before = PHASES[: p.phase]
        warmup = s.warmup_epochs if (p.cycle, p.phase) != (0, 0) else 0
        done = warmup + p.cycle * cycle_epochs(s) + sum(ph.epochs(s) for ph in before)
        weights = (
            warmup
            + p.cycle * cycle_epochs(s, weights_only=True)
            + sum(ph.epochs(s) for ph in before if ph.trains_weights)
        )
        return done, weights
    search_done, weights_done = search_epochs(s), search_epochs(s, weights_only=True)
    if p.phase == FINAL_DONE and p.stage_epoch == 0:
        return search_done + s.final_epochs, weights_done + s.final_epochs
    if p.phase == 0 and 0 <= p.stage_epoch < max(1, s.final_epochs):
        return search_done + p.stage_epoch, weights_done + p.stage_epoch
    return None


@dataclass
class RunState:
    """What a run has done and found so far, beyond weights, optimizers and RNGs.

    Saved in every checkpoint, field by field under the field's name, and read
    back the same way: a field added here is checkpointed and restored with
    nothing else to change. Its annotations say how each field is stored.
    """

    position: Position = field(default_factory=Position)
    genotype: Genotype | None = None  # the genotype retrained in the current cycle
    derived: Genotype | None = None  # what the alphas said before mutation
    cycle_val_acc: list[float] = field(default_factory=list)
    cycle_genotypes: list[Genotype] = field(
        default_factory=list
    )  # each cycle's, as evaluated at its end
    # What the current cycle's mutation did; kept (and checkpointed) until the
    # cycle ends, where CycleEnd carries it to observers.
    cycle_edits: int = 0
    cycle_growth: list[GrowthEvent] = field(default_factory=list)
    # The final stage's epochs once fitted to search.budget_minutes (0: not fitted).
    final_epochs: int = 0

    # Fields added after checkpoints were first written: an older checkpoint lacks them
    # and restores them at their defaults (any other missing field is a broken checkpoint).
    ADDED_LATER: ClassVar[frozenset[str]] = frozenset({"final_epochs"})

    def to_dict(self) -> dict[str, Any]:
        """Plain data: genotypes as JSON text ("" for none), dataclasses as dicts."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RunState:
        hints = get_type_hints(cls)
        return cls(
            **{
                f.name: _typed(hints[f.name], state[f.name])
                for f in fields(cls)
                if f.name in state or f.name not in cls.ADDED_LATER
            }
        )


def _plain(value: Any) -> Any:
    if isinstance(value, Genotype):
        return value.to_json()
    if value is None:
        return ""  # an Optional[Genotype] not set yet
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return asdict(value) if is_dataclass(value) else value


def _typed(hint: Any, value: Any) -> Any:
    """The inverse of :func:`_plain` for a field annotated ``hint``."""
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        return [_typed(item, v) for v in value]
    if get_origin(hint) in (Union, types.UnionType):  # Optional[X] or X | None
        return _typed(get_args(hint)[0], value) if value != "" else None
    if hint is Genotype:
        return Genotype.from_json(value)
    if is_dataclass(hint):
        return hint(**value)
    return hint(value)


@dataclass
class RunResult:
    """What a finished run produced."""

    genotype: Genotype
    val_acc: float
    test_acc: float
    derived_params: int
    supernet_params: int
    seconds: float
    cycle_val_acc: list[float] = field(default_factory=list)
    final_epochs: int = 0  # the final stage's epochs (fitted to search.budget_minutes if set)
    # how far the alphas moved by the run's end (SearchNetwork.alpha_entropy: 1, not at all)
    alpha_entropy: float = 1.0

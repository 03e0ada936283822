"""The cycle's phases: the one table that the loop, the epoch counts, the learning-rate
schedule, checkpoints, resume, the progress bars, the run description, the recorded
``phase_index`` metric and the control arms read.

A new phase is a row here, the Runner method that runs it (in the part it belongs
to), and, when it has epochs of its own, their field in config/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Phase:
    """One phase of a cycle: its name (in checkpoints, tags and events), the name of
    the Runner method that runs it (looked up on the runner, so subclasses override
    it), its title on a progress bar, the ``search.*`` field that holds its epochs per
    cycle (None: it has none), whether those epochs train the weights (they then
    advance the learning-rate schedule), and its word in the run description's budget.
    """

    name: str
    method: str
    title: str
    epochs_field: str | None = None
    trains_weights: bool = False
    short: str = ""
    # search.warmup_epochs belong to this phase's first run (cycle 0)
    takes_warmup: bool = False

    def run(self, runner: Any) -> None:
        getattr(runner, self.method)()

    def epochs(self, search: Any, cycle: int = 1) -> int:
        """The epochs this phase runs in ``cycle`` under ``search`` (the config's section)."""
        own = getattr(search, self.epochs_field) if self.epochs_field else 0
        return own + (search.warmup_epochs if self.takes_warmup and cycle == 0 else 0)


W_TRAIN, ALPHA, MUTATE, RETRAIN = "w_train", "alpha", "mutate", "retrain"
# The stage after the last cycle: the final network's epochs, then the evaluation.
FINAL = "final"
EVALUATION = "evaluation"  # what a run resumed after its final stage does next

# The cycle's phases in order.
PHASES: tuple[Phase, ...] = (
    Phase(W_TRAIN, "w_train", "W-training", "w_epochs", True, "W", takes_warmup=True),
    Phase(ALPHA, "alpha_train", "alpha-training", "alpha_epochs", False, "alpha"),
    Phase(MUTATE, "mutate_phase", "mutation"),
    Phase(RETRAIN, "retrain_cycle", "W-retraining", "retrain_epochs", True, "retrain"),
)
# The final stage: after the last cycle, run by the Runner's end (not the cycle loop).
FINAL_STAGE = Phase(FINAL, "_finish", "final training", "final_epochs", True, "final")
FINAL_TITLE = FINAL_STAGE.title
# Position.phase in the final stage (cycle == search.cycles): 0 before the final
# stage, FINAL_DONE once the final network is trained and checkpointed, so that
# a resume from that checkpoint goes straight to the evaluation.
FINAL_DONE = 1

# The search.* fields of the cycle's epochs, in phase order (the compare table's columns).
EPOCH_FIELDS: tuple[str, ...] = tuple(p.epochs_field for p in PHASES if p.epochs_field)
BY_NAME: dict[str, Phase] = {p.name: p for p in (*PHASES, FINAL_STAGE)}
# phase -> its title, and its index: the cycle's phases in order, then the final stage
PHASE_TITLES: dict[str, str] = {name: p.title for name, p in BY_NAME.items()}
PHASE_INDEX: dict[str, int] = {name: i for i, name in enumerate(BY_NAME)}


def cycle_epochs(search: Any, *, weights_only: bool = False) -> int:
    """The epochs of one cycle (after cycle 0's warm-up), or those that train weights."""
    return sum(p.epochs(search) for p in PHASES if p.trains_weights or not weights_only)


def search_epochs(search: Any, *, weights_only: bool = False) -> int:
    """The epochs of all cycles, the warm-up included (or those that train weights)."""
    return search.warmup_epochs + search.cycles * cycle_epochs(search, weights_only=weights_only)

"""The cycle's phases: the one table that the loop, checkpoints, resume, the
progress bars, the recorded ``phase_index`` metric and the control arms read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Phase:
    """One phase of a cycle: its name (in checkpoints, tags and events), the name of
    the Runner method that runs it (looked up on the runner, so subclasses override
    it) and its title on a progress bar."""

    name: str
    method: str
    title: str

    def run(self, runner: Any) -> None:
        getattr(runner, self.method)()


W_TRAIN, ALPHA, MUTATE, RETRAIN = "w_train", "alpha", "mutate", "retrain"
# The stage after the last cycle: the final network's epochs, then the evaluation.
FINAL = "final"
EVALUATION = "evaluation"  # what a run resumed after its final stage does next

# The cycle's phases in order.
PHASES: tuple[Phase, ...] = (
    Phase(W_TRAIN, "w_train", "W-training"),
    Phase(ALPHA, "alpha_train", "alpha-training"),
    Phase(MUTATE, "mutate_phase", "mutation"),
    Phase(RETRAIN, "retrain_cycle", "W-retraining"),
)
FINAL_TITLE = "final training"
# Position.phase in the final stage (cycle == search.cycles): 0 before the final
# stage, FINAL_DONE once the final network is trained and checkpointed, so that
# a resume from that checkpoint goes straight to the evaluation.
FINAL_DONE = 1

# phase -> its title, and its index: the cycle's phases in order, then the final stage
PHASE_TITLES: dict[str, str] = {**{p.name: p.title for p in PHASES}, FINAL: FINAL_TITLE}
PHASE_INDEX: dict[str, int] = {name: i for i, name in enumerate(PHASE_TITLES)}

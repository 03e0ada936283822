"""Events the runner emits, and the observer protocol that receives them.

The runner records nothing itself: trackers (MLflow), reporters (Optuna),
progress bars and tests are observers. An observer implements any subset of
the ``on_*`` methods of :class:`Observer`; an exception raised by an observer
(for example Optuna's ``TrialPruned``) stops the run and reaches the caller
after ``on_run_interrupted`` has been sent to every observer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import ExperimentConfig
from ..space.genotype import Genotype


@dataclass(frozen=True)
class RunStart:
    config: ExperimentConfig
    data: dict[str, Any]
    device: str
    arch: dict[str, Any]
    # when resuming: the checkpoint's position (cycle, phase, global_epoch, weight_epoch)
    # and "next", the name of what runs first (a phase, "final" or "evaluation")
    resumed_from: dict[str, Any] | None = None
    total_epochs: int = 0
    # how config.threads was chosen: "auto" (the rule of asolab/threads.py), "set"
    # (the config asked for it) or "resumed" (the count the run started with)
    threads_source: str = "set"
    # the final stage's epoch count once search.budget_minutes has fitted it (a run
    # resumed after that); 0: not fitted (yet), search.final_epochs holds
    final_epochs: int = 0
    # the device in more words (runner/device.py describe_device: GPU name, index, memory)
    device_info: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EpochEnd:
    phase: str  # w_train | alpha | retrain | final
    cycle: int
    epoch: int  # epoch within the phase
    global_epoch: int  # MLflow step: counts every training epoch of the run
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    temperature: float
    lrs: dict[str, float]
    seconds: float
    images_per_sec: float
    threads: int = 1  # the torch threads the epoch used (decided once per run)
    # percent of the epoch's training loop in which its GPU ran kernels (runner/gpubusy.py);
    # None off CUDA, where the driver gives no figure, or for an epoch under one sample period
    gpu_busy: float | None = None


@dataclass(frozen=True)
class MutationEvent:
    """The mutation phase's op edits: the genotype before and after them."""

    cycle: int
    before: Genotype
    after: Genotype
    edits: tuple[Any, ...]  # evolution.mutation.Edit, one per changed edge
    temperature: float
    strength: float
    # search.selection = "perturbation": the measurement the genotype rests on
    # (evolution/selection.py's selection_record); None with "alpha"
    selection: dict[str, Any] | None = None


@dataclass(frozen=True)
class GrowthEvent:
    cycle: int
    kind: str  # widen | deepen | branch
    where: str
    params_before: int
    params_after: int
    preservation_error: float
    val_acc_before: float = float("nan")
    val_acc_after: float = float("nan")
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CycleEnd:
    """The end of a cycle, with everything an observer records per cycle.

    It repeats what the cycle's mutation did (``mutation_edits``, ``growth``):
    the runner keeps those in its checkpoint, so an observer that starts after
    a resume in mid-cycle still sees them without having seen the mutation.
    """

    cycle: int
    genotype: Genotype  # the (mutated) genotype that was retrained this cycle
    supernet_params: int
    derived_params: int
    memory: dict[str, float]
    val_acc: float
    val_loss: float
    global_epoch: int
    mutation_edits: int = 0  # how many edits this cycle's mutation made
    growth: tuple[GrowthEvent, ...] = ()  # this cycle's growth steps, in order
    alpha_entropy: float = 1.0  # SearchNetwork.alpha_entropy() at the cycle's end


@dataclass(frozen=True)
class CheckpointSaved:
    path: str
    cycle: int  # the cycle the phase belonged to (search.cycles for the final stage)
    phase: str  # the phase just finished: w_train | alpha | mutate | retrain | final
    global_epoch: int
    stage_epoch: int = 0  # > 0: taken inside the final stage, after this many of its epochs
    # Whether the store should get it now: a cycle's end, the final stage, or the first
    # once the last due one is search.checkpoint_minutes old. The others are kept
    # locally and matter only if the run is interrupted before the next one.
    due: bool = True


@dataclass(frozen=True)
class FinalPlan:
    """The final stage's length, fitted to ``search.budget_minutes`` after its first epoch."""

    epochs: int  # the final stage's epochs, the first included
    most: int  # search.final_epochs: the most it may have
    budget_minutes: float
    seconds_per_epoch: float  # what the first epoch took, its validation pass included
    minutes_left: float  # of the budget after the first epoch, the evaluation's share kept back


@dataclass(frozen=True)
class RunEnd:
    genotype: Genotype
    derived_params: int
    supernet_params: int
    val_acc: float
    val_loss: float
    test_acc: float
    test_loss: float
    seconds: float
    memory: dict[str, float]
    global_epoch: int
    # The trained supernet (a live reference, not a copy), so that observers can
    # export the final network with asolab.space.network.extract(supernet, genotype).
    supernet: Any = field(default=None, repr=False, compare=False)
    # how raw images become the network's input (asolab.data.preprocessing): a saved
    # model carries it, so that it predicts raw images
    preprocessing: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # GPU busy per phase over this process's epochs, then "all" (runner/gpubusy.py's
    # GpuBusy.summary); empty off CUDA
    gpu_busy: dict[str, float] = field(default_factory=dict)
    # speed.deterministic: the ops that had no deterministic kernel (torch warned of each)
    nondeterministic: tuple[str, ...] = ()
    # the supernet's alphas at the run's end: SearchNetwork.alpha_entropy() (1: never
    # moved) and the Adam steps they took over the whole run (0: no alpha-training)
    alpha_entropy: float = 1.0
    alpha_steps: int = 0


@dataclass(frozen=True)
class RunInterrupted:
    error: BaseException
    global_epoch: int


class Observer:
    """Base observer: every hook is a no-op; override what you need."""

    def on_run_start(self, event: RunStart) -> None: ...
    def on_epoch_end(self, event: EpochEnd) -> None: ...
    def on_mutation(self, event: MutationEvent) -> None: ...
    def on_growth(self, event: GrowthEvent) -> None: ...
    def on_cycle_end(self, event: CycleEnd) -> None: ...
    def on_checkpoint(self, event: CheckpointSaved) -> None: ...
    def on_final_plan(self, event: FinalPlan) -> None: ...
    def on_run_end(self, event: RunEnd) -> None: ...
    def on_run_interrupted(self, event: RunInterrupted) -> None: ...

    def checkpoint_stamp(self) -> dict[str, str]:
        """What this observer writes into every checkpoint's stamp (the tracker: its run id)."""
        return {}


def _kept(kind: str) -> Callable[[Recorder, Any], None]:
    """A Recorder hook: keeps its event as ``(kind, event)``."""

    def hook(self: Recorder, event: Any) -> None:
        self.events.append((kind, event))

    return hook


class Recorder(Observer):
    """Keeps every event in order as ``(kind, event)`` (handy for tests and notebooks)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    on_run_start = _kept("run_start")
    on_epoch_end = _kept("epoch_end")
    on_mutation = _kept("mutation")
    on_growth = _kept("growth")
    on_cycle_end = _kept("cycle_end")
    on_checkpoint = _kept("checkpoint")
    on_final_plan = _kept("final_plan")
    on_run_end = _kept("run_end")
    on_run_interrupted = _kept("run_interrupted")

    def of(self, kind: str) -> list[Any]:
        return [e for k, e in self.events if k == kind]

"""The ASO-SE cycle loop.

A run is ``search.cycles`` cycles of four phases, then optional final epochs
and an evaluation:

1. ``w_train``  supernet weights on the train split; one op per edge sampled by
   hard Gumbel-softmax (no gradient to the alphas, which stay frozen), or in
   fair rounds (``search.w_sampling``);
2. ``alpha``    alphas on the validation split with Adam, straight-through
   Gumbel-softmax; weights frozen (``requires_grad`` off, so no weight
   gradients are even computed);
3. ``mutate``   derive the genotype from the alphas, apply alpha-guided op
   edits, then growth where ``growth.policy`` asks for it: function-preserving
   widen / deepen / branch steps that replace ``net``, ``spec`` and both
   optimizers (state carried over) -- see evolution/growth.py;
4. ``retrain``  the derived, mutated network trains on the train split. It is a
   view of the supernet, so the weights it improves are the supernet's own.

One SGD optimizer (weights) and one Adam optimizer (alphas) live for the whole
run, so momentum and Adam moments survive phases and cycles. When a checkpoint
folder is given, a checkpoint is written after every phase, after a final-stage
epoch once the last due one is ``search.checkpoint_minutes`` old, and after the
final stage (the final network chosen and trained), before the evaluation.
Observers upload only the due ones at once: those of a cycle's end, of the
final stage, and the first after ``search.checkpoint_minutes`` (0: all).
"""

from __future__ import annotations

import logging
import math
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

import torch
import torch.nn.functional as F

from .. import threads as cpu_threads
from ..config import ExperimentConfig, from_dict
from ..data import Batches, DataBundle, Split, load_data
from ..evolution import growth, morphism
from ..evolution.mutation import mutate
from ..evolution.sampling import FairPaths
from ..evolution.sampling import temperature as temperature_at
from ..space.genotype import Genotype
from ..space.network import Plans, SearchNetwork
from ..space.spec import ArchSpec
from . import checkpoint as ckpt
from .device import memory_format, resolve_device
from .events import (
    CheckpointSaved,
    CycleEnd,
    EpochEnd,
    FinalPlan,
    GrowthEvent,
    MutationEvent,
    Observer,
    RunEnd,
    RunInterrupted,
    RunStart,
)
from .memory import check_fits, memory_stats, out_of_memory

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
# Position.phase in the final stage (cycle == search.cycles): 0 before the final
# stage, FINAL_DONE once the final network is trained and checkpointed, so that
# a resume from that checkpoint goes straight to the evaluation.
FINAL_DONE = 1


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
    cycle_epochs = (s.w_epochs + s.alpha_epochs + s.retrain_epochs, s.w_epochs + s.retrain_epochs)
    if not 0 <= p.cycle <= s.cycles:
        return None
    if p.cycle < s.cycles:
        if not 0 <= p.phase < len(PHASES) or p.stage_epoch != 0:
            return None
        # (epochs, trains weights) of the phases before p.phase; the warm-up is part
        # of cycle 0's w_train
        before = [(s.w_epochs, 1), (s.alpha_epochs, 0), (0, 1)][: p.phase]
        warmup = s.warmup_epochs if (p.cycle, p.phase) != (0, 0) else 0
        done = warmup + p.cycle * cycle_epochs[0] + sum(e for e, _ in before)
        weights = warmup + p.cycle * cycle_epochs[1] + sum(e * w for e, w in before)
        return done, weights
    search_done = s.warmup_epochs + s.cycles * cycle_epochs[0]
    weights_done = s.warmup_epochs + s.cycles * cycle_epochs[1]
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


class Runner:
    """Runs ASO-SE cycles for one experiment config and emits events to observers."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        observers: Iterable[Observer] = (),
        *,
        checkpoint_dir: str | Path | None = None,
        data: DataBundle | None = None,
        spec: ArchSpec | None = None,
    ) -> None:
        self.device = resolve_device(cfg.device)
        # The thread count changes the numbers (sums split across threads), so it is
        # decided once, here, and kept for the whole run: "auto" takes what the rule gives
        # now (written into the config: MLflow params, checkpoint; a resume reuses it).
        threads = cpu_threads.acquire(cfg.threads)
        self.threads_source = "set" if cfg.threads else "auto"
        if not cfg.threads:
            cfg = cfg.replace(threads=threads)
        self.cfg = cfg
        self._layout = memory_format(cfg.speed.channels_last)
        self.observers = list(observers)
        torch.manual_seed(cfg.seed)
        self.data = data if data is not None else load_data(cfg.data, cfg.seed, self.device)
        self.spec = spec or ArchSpec.from_config(
            cfg.space, self.data.in_channels, self.data.num_classes
        )
        # Before allocating: a supernet too big for this machine is one line, not the OOM killer.
        check_fits(self.spec, cfg.data.batch_size, self.data.image_size, self.device)
        try:
            self.net = SearchNetwork(self.spec).to(self.device, memory_format=self._layout)
        except torch.cuda.OutOfMemoryError as exc:
            raise out_of_memory(exc, self.device, cfg.data.batch_size) from None
        s = cfg.search
        self.weight_opt = torch.optim.SGD(
            self.net.weight_parameters(),
            lr=s.weight_lr,
            momentum=s.weight_momentum,
            weight_decay=s.weight_decay,
        )
        self.alpha_opt = torch.optim.Adam(
            self.net.alpha_parameters(),
            lr=s.alpha_lr,
            betas=(0.5, 0.999),
            weight_decay=s.alpha_weight_decay,
        )
        self.shuffle = torch.Generator().manual_seed(cfg.seed)
        self.state = RunState()
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._resumed_from: dict[str, Any] | None = None
        self._elapsed = 0.0  # seconds of the run before this process (restored on resume)
        self._started = time.perf_counter()
        self._last_checkpoint = time.perf_counter()

    # ------------------------------------------------------------------ schedule

    @property
    def search_epochs(self) -> int:
        s = self.cfg.search
        return s.warmup_epochs + s.cycles * (s.w_epochs + s.alpha_epochs + s.retrain_epochs)

    @property
    def total_epochs(self) -> int:
        return self.search_epochs + self.cfg.search.final_epochs

    @property
    def weight_epochs(self) -> int:
        """Weight epochs the learning-rate schedule is laid out on (search.final_epochs
        for the final stage, whatever a budget fits)."""
        s = self.cfg.search
        return s.warmup_epochs + s.cycles * (s.w_epochs + s.retrain_epochs) + s.final_epochs

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

    # ------------------------------------------------------------------ events

    def emit(self, hook: str, event: Any) -> None:
        for obs in self.observers:
            getattr(obs, hook)(event)

    # ------------------------------------------------------------------ steps

    def _weight_step(
        self, x: torch.Tensor, y: torch.Tensor, plans: Plans
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x, plans)
        loss = F.cross_entropy(logits, y)
        self.weight_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.weight_parameters(), self.cfg.search.grad_clip)
        self.weight_opt.step()
        return loss.detach(), (logits.argmax(1) == y).sum()

    def _alpha_step(
        self, x: torch.Tensor, y: torch.Tensor, tau: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x, self.net.sample_plans(tau, differentiable=True))
        loss = F.cross_entropy(logits, y)
        self.alpha_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.alpha_opt.step()
        return loss.detach(), (logits.argmax(1) == y).sum()

    @torch.no_grad()
    def evaluate(self, split: Split, genotype: Genotype) -> tuple[float, float]:
        """Loss and accuracy of ``genotype`` (run on the supernet) over ``split``."""
        self.net.eval()
        plans = self.net.genotype_plans(genotype)
        loss_sum, correct = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        for x, y in Batches(split, self.cfg.data.eval_batch_size):
            logits = self.net(x, plans)
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
        n = max(1, len(split))
        return loss_sum.item() / n, correct.item() / n

    # ------------------------------------------------------------------ epochs and phases

    def _epoch(
        self,
        phase: str,
        epoch: int,
        split: Split,
        step: Callable,
        eval_genotype: Callable[[], Genotype],
        trains_weights: bool = True,
    ) -> None:
        tau = self.temperature()
        if trains_weights:
            for group in self.weight_opt.param_groups:
                group["lr"] = self.weight_lr()
        self.net.train()
        start = time.perf_counter()
        loss_sum, correct, seen = (
            torch.zeros((), device=self.device),
            torch.zeros((), device=self.device),
            0,
        )
        # Augment only what trains weights; alphas see the validation data as it is.
        augmentation = self.data.augmentation if trains_weights else None
        for x, y in Batches(split, self.cfg.data.batch_size, self.shuffle, augmentation):
            loss, hits = step(x, y, tau)
            loss_sum += loss * len(y)
            correct += hits
            seen += len(y)
        seconds = time.perf_counter() - start
        if not math.isfinite(loss_sum.item()):
            raise FloatingPointError(
                f"{phase} loss became {loss_sum.item()} in cycle {self.state.position.cycle}; "
                "lower search.weight_lr or search.alpha_lr"
            )
        val_loss, val_acc = self.evaluate(self.data.val, eval_genotype())
        self.emit(
            "on_epoch_end",
            EpochEnd(
                phase=phase,
                cycle=self.state.position.cycle,
                epoch=epoch,
                global_epoch=self.state.position.global_epoch,
                train_loss=loss_sum.item() / max(1, seen),
                train_acc=correct.item() / max(1, seen),
                val_loss=val_loss,
                val_acc=val_acc,
                temperature=tau,
                lrs={
                    "weight_lr": self.weight_opt.param_groups[0]["lr"],
                    "alpha_lr": self.alpha_opt.param_groups[0]["lr"],
                },
                seconds=seconds,
                images_per_sec=seen / max(seconds, 1e-9),
                threads=torch.get_num_threads(),
            ),
        )
        self.state.position.global_epoch += 1
        self.state.position.weight_epoch += int(trains_weights)

    def _calibrate(self, genotype: Genotype) -> Genotype:
        """Re-estimate BatchNorm statistics along ``genotype`` on a few training batches."""
        n = self.cfg.search.calibration_batches
        if n:
            batches = Batches(
                self.data.train.head(n * self.cfg.data.batch_size), self.cfg.data.batch_size
            )
            self.net.recalibrate_batchnorm(genotype, (x for x, _ in batches))
        return genotype

    def _derive_calibrated(self) -> Genotype:
        return self._calibrate(self.net.derive(self.cfg.search.param_free_cap))

    def _w_train(self) -> None:
        # Fair rounds restart with each phase, so a resume at its boundary repeats them.
        fair = FairPaths(self.net.trainable_ops()) if self.cfg.search.w_sampling == "fair" else None

        def step(x, y, tau):
            if fair is not None:
                return self._weight_step(x, y, self.net.fair_plans(fair))
            return self._weight_step(x, y, self.net.sample_plans(tau, differentiable=False))

        epochs = self.cfg.search.w_epochs + (
            self.cfg.search.warmup_epochs if self.state.position.cycle == 0 else 0
        )
        for e in range(epochs):
            self._epoch("w_train", e, self.data.train, step, self._derive_calibrated)

    def _alpha_train(self) -> None:
        weights = self.net.weight_parameters()
        for p in weights:
            p.requires_grad_(False)
        try:
            for e in range(self.cfg.search.alpha_epochs):
                self._epoch(
                    "alpha",
                    e,
                    self.data.val,
                    self._alpha_step,
                    self._derive_calibrated,
                    trains_weights=False,
                )
        finally:
            for p in weights:
                p.requires_grad_(True)

    def _mutate(self) -> None:
        tau = self.temperature()
        cap = self.cfg.search.param_free_cap
        self.state.derived = self.net.derive(cap)
        alphas = {k: v.detach() for k, v in self.net.alphas.items()}
        self.state.genotype, edits = mutate(
            self.state.derived, alphas, self.spec.primitives, self.cfg.mutation.strength, tau, cap
        )
        self.state.cycle_edits, self.state.cycle_growth = len(edits), []
        self._calibrate(self.state.genotype)
        self.emit(
            "on_mutation",
            MutationEvent(
                self.state.position.cycle,
                self.state.derived,
                self.state.genotype,
                tuple(edits),
                tau,
                self.cfg.mutation.strength,
            ),
        )
        self._grow()

    @torch.no_grad()
    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        assert self.state.genotype is not None
        self.net.eval()
        return self.net(x, self.net.genotype_plans(self.state.genotype))

    def _grow(self) -> None:
        """The growth steps of this mutation phase (evolution/growth.py decides
        which); each is function-preserving and reported as a GrowthEvent."""
        strength = self.cfg.mutation.strength
        kinds = growth.plan_steps(
            self.cfg.growth, strength, self.state.position.cycle, self.state.cycle_val_acc
        )
        if not kinds:
            return
        assert self.state.genotype is not None
        probe = self.data.val.head(self.cfg.data.eval_batch_size).x  # fixed batch: the split's head
        acc = self.evaluate(self.data.val, self.state.genotype)[1]
        for kind in kinds:
            before = self._logits(probe)
            try:
                morph = growth.propose(self.net, kind, strength)
            except ValueError as exc:
                # A warning, not info: the user asked for growth and does not get it.
                log.warning("cycle %d: growth %s skipped: %s", self.state.position.cycle, kind, exc)
                break
            if not growth.within_cap(morph, self.cfg.growth.max_params):
                log.warning(
                    "cycle %d: growth %s at %s skipped: it would exceed growth.max_params = %d",
                    self.state.position.cycle,
                    kind,
                    morph.where,
                    self.cfg.growth.max_params,
                )
                break
            params_before = self.net.num_weights()
            self._adopt(morph)
            error = growth.preservation_error(before, self._logits(probe))
            acc_after = self.evaluate(self.data.val, self.state.genotype)[1]
            event = GrowthEvent(
                cycle=self.state.position.cycle,
                kind=morph.kind,
                where=morph.where,
                params_before=params_before,
                params_after=self.net.num_weights(),
                preservation_error=error,
                val_acc_before=acc,
                val_acc_after=acc_after,
                details={**morph.details, "spec": self.spec.to_dict()},
            )
            self.state.cycle_growth.append(event)
            self.emit("on_growth", event)
            acc = acc_after

    def _adopt(self, morph: morphism.Morph) -> None:
        """Make a grown network the run's: net, spec and both optimizers, with
        the state of every surviving parameter carried over (a deepened cell's
        alphas join the alpha optimizer), and the genotypes the run holds
        expressed on the grown network (deepen renumbers own-alpha cells)."""
        old = self.net
        # New modules (a wider op, a new cell) take the run's layout; .to keeps the
        # parameter objects, so the optimizers' remapping below still finds them.
        self.net, self.spec = morph.net.to(memory_format=self._layout), morph.spec
        self.weight_opt = morphism.remap_optimizer(
            self.weight_opt, old, self.net.weight_parameters(), morph
        )
        self.alpha_opt = morphism.remap_optimizer(
            self.alpha_opt, old, self.net.alpha_parameters(), morph
        )
        self.state.genotype = (
            morph.carry(self.state.genotype) if self.state.genotype is not None else None
        )
        self.state.derived = (
            morph.carry(self.state.derived) if self.state.derived is not None else None
        )
        # Earlier cycles' genotypes are candidates for the final network, run on this one.
        self.state.cycle_genotypes = [morph.carry(g) for g in self.state.cycle_genotypes]

    def _genotype_step(self) -> Callable:
        """A weight step along the current genotype's path (W-retraining, final stage)."""
        assert self.state.genotype is not None
        plans = self.net.genotype_plans(self.state.genotype)
        return lambda x, y, tau: self._weight_step(x, y, plans)

    def _retrain(self, phase: str, epochs: int, split: Split) -> None:
        step = self._genotype_step()
        for e in range(epochs):
            self._epoch(phase, e, split, step, lambda: self.state.genotype)

    def _end_cycle(self) -> None:
        assert self.state.genotype is not None and self.state.derived is not None
        val_loss, val_acc = self.evaluate(self.data.val, self.state.genotype)
        self.state.cycle_val_acc.append(val_acc)
        self.state.cycle_genotypes.append(self.state.genotype)
        self.emit(
            "on_cycle_end",
            CycleEnd(
                cycle=self.state.position.cycle,
                genotype=self.state.genotype,
                derived_genotype=self.state.derived,
                supernet_params=self.net.num_weights(),
                derived_params=self.net.count_derived(self.state.genotype),
                memory=memory_stats(self.device),
                val_acc=val_acc,
                val_loss=val_loss,
                global_epoch=self.state.position.global_epoch,
                mutation_edits=self.state.cycle_edits,
                growth=tuple(self.state.cycle_growth),
                alpha_entropy=self.net.alpha_entropy(),
            ),
        )

    def _retrain_cycle(self) -> None:
        self._retrain("retrain", self.cfg.search.retrain_epochs, self.data.train)
        self._end_cycle()

    # ------------------------------------------------------------------ run

    def run(self) -> RunResult:
        """Run (or continue) the whole experiment; observers see every step."""
        self._started = time.perf_counter()
        try:
            # Inside the try: an observer that fails on the start (after the tracker
            # created its run) must still see on_run_interrupted and close that run.
            self.emit(
                "on_run_start",
                RunStart(
                    config=self.cfg,
                    data=self.data.summary(),
                    device=str(self.device),
                    arch=self.spec.to_dict(),
                    resumed_from=self._resumed_from,
                    total_epochs=self.total_epochs,
                    threads_source=self.threads_source,
                    final_epochs=self.state.final_epochs,
                ),
            )
            while self.state.position.cycle < self.cfg.search.cycles:
                self._next_phase()
            result = self._finish()
        except (
            torch.cuda.OutOfMemoryError
        ) as exc:  # CUDA (or another accelerator) ran out: a user error
            error = out_of_memory(exc, self.device, self.cfg.data.batch_size)
            self.emit("on_run_interrupted", RunInterrupted(error, self.state.position.global_epoch))
            raise error from None
        except BaseException as exc:
            self._emit_interrupted(RunInterrupted(exc, self.state.position.global_epoch))
            raise
        return result

    def _emit_interrupted(self, event: RunInterrupted) -> None:
        """Tell every observer, even when one of them fails: a progress bar whose terminal is
        gone must not keep the tracker from closing the run. The first failure is logged."""
        for obs in self.observers:
            try:
                obs.on_run_interrupted(event)
            except Exception:
                log.exception("observer %s failed on the interrupted run", type(obs).__name__)

    def _next_phase(self) -> None:
        """Run the phase at the current position, advance, checkpoint."""
        cycle, phase = self.state.position.cycle, PHASES[self.state.position.phase]
        phase.run(self)
        if self.state.position.phase + 1 < len(PHASES):
            self.state.position.phase += 1
        else:
            self.state.position.cycle, self.state.position.phase = self.state.position.cycle + 1, 0
        # Every phase end is saved locally; it is *due* (the tracker uploads it at once)
        # at a cycle's end, or once the last due one is search.checkpoint_minutes old.
        # Uploads and their metric batches dominated what tracking cost a short run. The
        # others reach the store only if the run is interrupted; after a kill -9 the
        # resume replays the phases after the last due one exactly (the checkpoint holds
        # every random state), so only work is at stake, never the result.
        due = self.state.position.phase == 0 or self._checkpoint_due()
        self.save_checkpoint(phase.name, cycle, due=due)  # the cycle the phase belonged to

    def _checkpoint_due(self) -> bool:
        """Whether the last due checkpoint is ``search.checkpoint_minutes`` old."""
        every = 60 * self.cfg.search.checkpoint_minutes
        return time.perf_counter() - self._last_checkpoint >= every

    def _final_genotype(self) -> Genotype:
        """The network the final epochs train and the run reports (search.final_genotype)."""
        assert self.state.genotype is not None
        choice = self.cfg.search.final_genotype
        if choice == "derived":
            return self._derive_calibrated()
        if choice == "best" and self.state.cycle_genotypes:
            # Mutation explores: the last cycle's edits may have made things worse, and
            # its new ops have had only one retraining. Ties go to the later cycle.
            best = max(
                range(len(self.state.cycle_val_acc)), key=lambda i: (self.state.cycle_val_acc[i], i)
            )
            if self.state.cycle_genotypes[best] != self.state.genotype:
                log.info("final network: cycle %d's genotype (best validation accuracy)", best)
                return self._calibrate(self.state.cycle_genotypes[best])
        return self.state.genotype

    def _fresh_weights(self) -> None:
        """search.final_weights = "fresh": every weight (BatchNorm statistics included)
        initialised anew from the run's RNG and the momentum dropped, so the final stage
        trains the chosen genotype from scratch; the alphas are kept (they chose it)."""
        for m in self.net.modules():
            if m is not self.net and hasattr(m, "reset_parameters"):
                m.reset_parameters()
        self.weight_opt.state.clear()

    def _train_final(self) -> None:
        """The final epochs on the whole training split. The stage is most of a long
        run, so it also checkpoints between epochs, whenever the last checkpoint is
        ``search.checkpoint_minutes`` old: a kill then costs at most that plus one epoch.
        With ``search.budget_minutes``, the first epoch's time fits the stage's length."""
        step = self._genotype_step()
        while (e := self.state.position.stage_epoch) < self.final_epochs:
            start = time.perf_counter()
            self._epoch("final", e, self.data.full_train, step, lambda: self.state.genotype)
            self.state.position.stage_epoch = e + 1
            if e == 0 and self.cfg.search.budget_minutes and not self.state.final_epochs:
                self._fit_final(time.perf_counter() - start)
            if e + 1 < self.final_epochs and self._checkpoint_due():
                self.save_checkpoint("final", self.state.position.cycle)
        self.state.position.stage_epoch = 0

    def _fit_final(self, epoch_seconds: float) -> None:
        """Fit the final stage to what is left of ``search.budget_minutes``: as many
        epochs like the first as fit, keeping back the evaluation's share (val and test
        images at the training cost per image: inference is cheaper, and the rest pays
        for the last checkpoint and uploads). Fixed once, and checkpointed, so that the
        schedule and a resume repeat exactly; only the count depends on the machine."""
        s = self.cfg.search
        evaluated = len(self.data.val) + len(self.data.test)
        reserve = epoch_seconds * evaluated / max(1, len(self.data.full_train))
        left = 60 * s.budget_minutes - self._seconds() - reserve
        self.state.final_epochs = min(s.final_epochs, 1 + max(0, int(left // epoch_seconds)))
        if self.state.final_epochs < s.final_epochs:
            log.info(
                "final stage: %d of %d epochs fit the %g-minute budget (%.0f s per epoch)",
                self.state.final_epochs,
                s.final_epochs,
                s.budget_minutes,
                epoch_seconds,
            )
        self.emit(
            "on_final_plan",
            FinalPlan(
                self.state.final_epochs, s.final_epochs, s.budget_minutes, epoch_seconds, left / 60
            ),
        )

    def _finish(self) -> RunResult:
        """The final stage (choose the final network, train it), its checkpoint, the evaluation."""
        if self.state.position.phase != FINAL_DONE:
            if (
                self.state.position.stage_epoch == 0
            ):  # else resumed inside the stage: the network is chosen
                self.state.genotype = self._final_genotype()
                if self.cfg.search.final_weights == "fresh":
                    self._fresh_weights()
            self._train_final()
            self.state.position.phase = FINAL_DONE
            # The stored checkpoint then holds the trained final network, and a run
            # killed during the evaluation resumes without training again.
            self.save_checkpoint("final", self.state.position.cycle)
        assert self.state.genotype is not None
        val_loss, val_acc = self.evaluate(self.data.val, self.state.genotype)
        test_loss, test_acc = self.evaluate(self.data.test, self.state.genotype)
        seconds = self._seconds()
        end = RunEnd(
            genotype=self.state.genotype,
            derived_params=self.net.count_derived(self.state.genotype),
            supernet_params=self.net.num_weights(),
            val_acc=val_acc,
            val_loss=val_loss,
            test_acc=test_acc,
            test_loss=test_loss,
            seconds=seconds,
            memory=memory_stats(self.device),
            global_epoch=self.state.position.global_epoch,
            supernet=self.net,
        )
        self.emit("on_run_end", end)
        return RunResult(
            self.state.genotype,
            val_acc,
            test_acc,
            end.derived_params,
            end.supernet_params,
            seconds,
            list(self.state.cycle_val_acc),
            self.final_epochs,
        )

    def _seconds(self) -> float:
        """Wall time of the run so far, the processes before a resume included."""
        return self._elapsed + time.perf_counter() - self._started

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a checkpoint holds: plain data and tensors only (it loads with
        weights_only)."""
        return {
            "config": self.cfg.to_dict(),
            "spec": self.spec.to_dict(),
            "model": self.net.state_dict(),
            "weight_opt": self.weight_opt.state_dict(),
            "alpha_opt": self.alpha_opt.state_dict(),
            **self.state.to_dict(),
            "seconds": self._seconds(),
            "rng": ckpt.rng_state(),
            "shuffle_rng": self.shuffle.get_state(),
            ckpt.STAMP: self._stamp(),
        }

    def _stamp(self) -> dict[str, str]:
        """Whose checkpoint this is: the config's hash and what observers add (a run id)."""
        stamp = {"config_hash": ckpt.config_hash(self.cfg.to_dict())}
        for obs in self.observers:
            stamp.update(getattr(obs, "checkpoint_stamp", dict)())
        return stamp

    def save_checkpoint(self, phase: str, cycle: int, due: bool = True) -> Path | None:
        """Write the checkpoint after ``phase`` of ``cycle`` and tell the observers
        (``due``: see ``CheckpointSaved.due``)."""
        if self.checkpoint_dir is None:
            return None
        path = ckpt.save(self.checkpoint_state(), self.checkpoint_dir / CHECKPOINT_NAME)
        if due:
            self._last_checkpoint = time.perf_counter()
        self.emit(
            "on_checkpoint",
            CheckpointSaved(
                str(path),
                cycle,
                phase,
                self.state.position.global_epoch,
                self.state.position.stage_epoch,
                due,
            ),
        )
        return path

    @classmethod
    def epochs_at(cls, position: Position, search: Any) -> tuple[int, int] | None:
        """``(global_epoch, weight_epoch)`` this kind of run has done at ``position``
        (None where it never is): what a checkpoint's position is checked against."""
        return epochs_done(position, search)

    @classmethod
    def resume(
        cls,
        path: str | Path,
        observers: Iterable[Observer] = (),
        *,
        checkpoint_dir: str | Path | None = None,
        data: DataBundle | None = None,
        threads: int = 0,
        label: str | None = None,
        owner: tuple[str, str] | None = None,
    ) -> Runner:
        """Rebuild a runner from a checkpoint (at its saved, possibly grown, size).

        The run continues with the thread count it started with (its config holds
        it), unless ``threads`` forces another one, which changes the numbers from
        there on. A checkpoint that reads but lacks a part, whose weights do not fit
        its architecture spec, or whose position its run never reaches, is a
        :class:`CheckpointError`, like a corrupt one. ``label`` names the checkpoint
        in those errors (default: ``checkpoint <path>``). ``owner`` is ``(run id, config
        hash)`` of the run that resumes: a checkpoint of another run is refused.
        """
        label = label or f"checkpoint {path}"
        state = ckpt.load(path, label)
        if owner is not None:
            ckpt.check_owner(state, owner[0], label, owner[1])
        with ckpt.restoring(path, label):
            saved = state["config"]
            if "speed" not in saved:
                # Saved before the [speed] section existed: those runs trained in the
                # default layout, and must go on in it to repeat exactly.
                saved = {**saved, "speed": {"channels_last": False}}
            cfg = from_dict(saved, source=label)
            spec = ArchSpec.from_dict(state["spec"])
            position = Position(**state["position"])
            # A final stage fitted to search.budget_minutes ends where its fitted count says.
            fitted = int(state.get("final_epochs", 0))
            search = replace(cfg.search, final_epochs=fitted) if fitted else cfg.search
        ckpt.check_position(position, cls.epochs_at(position, search), label)
        source = "resumed" if cfg.threads else "auto"
        if threads and threads != cfg.threads:
            log.warning(
                "resuming with %d threads instead of the run's %d: the run will not repeat exactly",
                threads,
                cfg.threads,
            )
            cfg, source = cfg.replace(threads=threads), "set"
        runner = cls(cfg, observers, checkpoint_dir=checkpoint_dir, data=data, spec=spec)
        runner.threads_source = source
        with ckpt.restoring(path, label):
            runner._restore(state)
        return runner

    def _restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's state into this runner (built from the same config and spec)."""
        self.net.load_state_dict(state["model"])
        self.weight_opt.load_state_dict(state["weight_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.state = RunState.from_dict(state)
        self._elapsed = float(state["seconds"])
        ckpt.set_rng_state(state["rng"])
        self.shuffle.set_state(state["shuffle_rng"])
        self._resumed_from = {**state["position"], "next": self._next_name()}

    def _next_name(self) -> str:
        """What runs next from the current position: a phase, "final" or "evaluation"."""
        p = self.state.position
        if p.cycle < self.cfg.search.cycles:
            return PHASES[p.phase].name
        return "evaluation" if p.phase == FINAL_DONE else "final"


@dataclass(frozen=True)
class Phase:
    """One phase of a cycle: its name (in checkpoints, tags and events) and the name of
    the Runner method that runs it (looked up on the runner, so subclasses override it)."""

    name: str
    method: str

    def run(self, runner: Runner) -> None:
        getattr(runner, self.method)()


# The cycle's phases in order: the one table the loop, checkpoints and resume read.
PHASES: tuple[Phase, ...] = (
    Phase("w_train", "_w_train"),
    Phase("alpha", "_alpha_train"),
    Phase("mutate", "_mutate"),
    Phase("retrain", "_retrain_cycle"),
)

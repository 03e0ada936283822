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
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from .. import threads as cpu_threads
from ..config import ExperimentConfig
from ..data import DataBundle, load_data
from ..space.spec import ArchSpec
from . import steps
from .device import describe_device, memory_format, resolve_device
from .events import CycleEnd, Observer, RunInterrupted, RunStart
from .final import FinalStage
from .gpubusy import GpuBusy
from .memory import check_fits, estimate_supernet, memory_stats, out_of_memory
from .mutating import Mutating
from .parts import shared_names
from .phases import BY_NAME, PHASES, RETRAIN
from .resume import Checkpointing
from .schedule import Schedule
from .speed import Determinism, Speed, build_network
from .state import RunResult, RunState
from .training import Training

log = logging.getLogger(__name__)


class Runner(Schedule, Training, Mutating, FinalStage, Checkpointing):
    """Runs ASO-SE cycles for one experiment config and emits events to observers.

    Its parts live beside this module, one job each: ``schedule`` (epochs,
    temperature, learning rate), ``training`` (steps, epochs, the training
    phases), ``mutating`` (mutation and growth), ``final`` (the final stage),
    ``resume`` (checkpoints); ``state`` holds what a checkpoint saves. What the parts
    share is declared once, in ``parts.Shared``; each part names the attributes it
    reads and writes. The Runner builds them all.
    """

    writes = shared_names()

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
        self.observers = list(observers)
        torch.manual_seed(cfg.seed)
        self.data = data if data is not None else load_data(cfg.data, cfg.seed, self.device)
        self.spec = spec or ArchSpec.from_config(
            cfg.space, self.data.in_channels, self.data.num_classes
        )
        self._layout = memory_format(cfg.speed.channels_last, self.device, self.spec)
        # Before allocating: a supernet too big for this machine is one line, not the OOM killer.
        check_fits(self.spec, cfg.data.batch_size, self.data.image_size, self.device)
        try:
            self.net = build_network(self.spec, self.device, self._layout)
        except torch.cuda.OutOfMemoryError as exc:
            raise out_of_memory(exc, self.device, cfg.data.batch_size) from None
        self.weight_opt, self.alpha_opt = steps.optimizers(self.net, cfg.search)
        self.shuffle = torch.Generator().manual_seed(cfg.seed)
        self.speed = Speed(cfg.speed, self.device, cfg.data.batch_size)
        self.speed.watch(self.net)
        self.gpu_busy: GpuBusy | None = None  # opened by run(): a runner may never run
        self.determinism = Determinism(cfg.speed.deterministic)  # applied by run()
        self.state = RunState()
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._resumed_from: dict[str, Any] | None = None
        self._elapsed = 0.0  # seconds of the run before this process (restored on resume)
        self._started = time.perf_counter()
        self._last_checkpoint = time.perf_counter()

    def emit(self, hook: str, event: Any) -> None:
        for obs in self.observers:
            getattr(obs, hook)(event)

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

    def retrain_cycle(self) -> None:
        self.retrain(RETRAIN, BY_NAME[RETRAIN].epochs(self.cfg.search), self.data.train)
        self._end_cycle()

    def run(self) -> RunResult:
        """Run (or continue) the whole experiment; observers see every step."""
        self._started = time.perf_counter()
        if self.gpu_busy is None:  # else given one (a test's, reading its own samples)
            self.gpu_busy = GpuBusy.open(self.device)
        self.determinism.apply()
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
                    device_info=describe_device(self.device),
                ),
            )
            while self.state.position.cycle < self.cfg.search.cycles:
                self.next_phase()
            result = self._finish()
        except (
            torch.cuda.OutOfMemoryError
        ) as exc:  # CUDA (or another accelerator) ran out: a user error
            batch = self.cfg.data.batch_size
            estimate = estimate_supernet(self.spec, batch, self.data.image_size)
            error = out_of_memory(exc, self.device, batch, estimate)
            self.emit("on_run_interrupted", RunInterrupted(error, self.state.position.global_epoch))
            raise error from None
        except BaseException as exc:
            self._emit_interrupted(RunInterrupted(exc, self.state.position.global_epoch))
            raise
        finally:
            self.determinism.restore()
            if self.gpu_busy is not None:
                self.gpu_busy.close()
        return result

    def _emit_interrupted(self, event: RunInterrupted) -> None:
        """Tell every observer, even when one of them fails: a progress bar whose terminal is
        gone must not keep the tracker from closing the run. Each failure is logged."""
        for obs in self.observers:
            try:
                obs.on_run_interrupted(event)
            except Exception:
                log.exception("observer %s failed on the interrupted run", type(obs).__name__)

    def next_phase(self) -> None:
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

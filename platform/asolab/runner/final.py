"""The final stage: choose the final network, train it (fitted to a time
budget when one is set), checkpoint it, evaluate it."""

from __future__ import annotations

import logging
import time

from ..data import preprocessing
from ..space.genotype import Genotype
from . import steps
from .events import FinalPlan, RunEnd
from .memory import memory_stats
from .parts import Part
from .phases import FINAL, FINAL_DONE
from .state import RunResult

log = logging.getLogger(__name__)


class FinalStage(Part):
    """The final stage and the run's end (a Runner part)."""

    reads = frozenset(
        {"_elapsed", "_started", "alpha_opt", "cfg", "data", "determinism", "device", "gpu_busy"}
        | {"net", "state", "weight_opt"}
    )

    def choose_final_genotype(self) -> Genotype:
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
                return self.calibrate(self.state.cycle_genotypes[best])
        return self.state.genotype

    def fresh_weights(self) -> None:
        """search.final_weights = "fresh": every weight (BatchNorm statistics included)
        initialised anew from the run's RNG and the momentum dropped, so the final stage
        trains the chosen genotype from scratch; the alphas are kept (they chose it)."""
        for m in self.net.modules():
            if m is not self.net and hasattr(m, "reset_parameters"):
                m.reset_parameters()
        self.weight_opt.state.clear()
        steps.with_momentum_buffers(self.weight_opt)

    def _train_final(self) -> None:
        """The final epochs on the whole training split. The stage is most of a long
        run, so it also checkpoints between epochs, whenever the last checkpoint is
        ``search.checkpoint_minutes`` old: a kill then costs at most that plus one epoch.
        With ``search.budget_minutes``, the first epoch's time fits the stage's length."""
        step = self._genotype_step()
        while (e := self.state.position.stage_epoch) < self.final_epochs:
            start = time.perf_counter()
            self._epoch(FINAL, e, self.data.full_train, step, lambda: self.state.genotype)
            self.state.position.stage_epoch = e + 1
            if e == 0 and self.cfg.search.budget_minutes and not self.state.final_epochs:
                self._fit_final(time.perf_counter() - start)
            if e + 1 < self.final_epochs and self._checkpoint_due():
                self.save_checkpoint(FINAL, self.state.position.cycle)
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
                self.state.genotype = self.choose_final_genotype()
                if self.cfg.search.final_weights == "fresh":
                    self.fresh_weights()
            self._train_final()
            self.state.position.phase = FINAL_DONE
            # The stored checkpoint then holds the trained final network, and a run
            # killed during the evaluation resumes without training again.
            self.save_checkpoint(FINAL, self.state.position.cycle)
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
            preprocessing=preprocessing(self.data),
            gpu_busy=self.gpu_busy.summary() if self.gpu_busy is not None else {},
            nondeterministic=tuple(self.determinism.unmet),
            alpha_entropy=self.net.alpha_entropy(),
            alpha_steps=steps.steps_taken(self.alpha_opt),
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
            end.alpha_entropy,
        )

    def _seconds(self) -> float:
        """Wall time of the run so far, the processes before a resume included."""
        return self._elapsed + time.perf_counter() - self._started

"""Training steps and epochs: the weight and alpha steps, the epoch loop, the
evaluation, BatchNorm recalibration, and the training phases built from them."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Batches, Split, eval_pad
from ..space.fixed import FixedNetwork
from ..space.genotype import Genotype
from ..space.network import Plans
from ..space.sampling import FairPaths
from ..space.switched import SwitchedNetwork
from . import steps
from .events import EpochEnd
from .parts import Part
from .phases import ALPHA, BY_NAME, W_TRAIN

# traces of one switched edge function a run may keep (speed.sampled_graphs): 5 edge
# shapes at the DARTS-like size, and each widen or deepen may add some
RECOMPILES = 64


class Training(Part):
    """Steps, epochs and the training phases (a Runner part)."""

    reads = frozenset(
        {"alpha_opt", "cfg", "data", "device", "gpu_busy", "net", "shuffle", "speed", "state"}
        | {"weight_opt"}
    )

    def weight_step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        plans: Plans | None,
        net: nn.Module | None = None,
        switched: SwitchedNetwork | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A weight step of the supernet along ``plans`` (its edges switched on the device
        by ``switched``), or of ``net`` (a fixed network)."""
        return steps.weight_step(
            self.net if net is None else net,
            self.speed,
            self.weight_opt,
            x,
            y,
            plans,
            self.cfg.search.grad_clip,
            switched,
        )

    def alpha_step(
        self, x: torch.Tensor, y: torch.Tensor, tau: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return steps.alpha_step(self.net, self.speed, self.alpha_opt, x, y, tau)

    def eval_pad_to(self) -> int | None:
        """What a pass in eval mode pads a smaller batch to on this run's device (None: no
        padding): :func:`~asolab.data.eval_pad` of the run's data and evaluation batch."""
        return eval_pad(self.data, self.cfg.data.eval_batch_size, self.speed.device)

    @torch.no_grad()
    def evaluate(self, split: Split, genotype: Genotype) -> tuple[float, float]:
        """Loss and accuracy of ``genotype`` (run on the supernet) over ``split``."""
        self.net.eval()
        plans = self.net.genotype_plans(genotype)
        loss_sum, correct = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        for x, y in Batches(split, self.cfg.data.eval_batch_size, pad_to=self.eval_pad_to()):
            with self.speed.autocast():
                logits = self.net(x, plans)[: len(y)].float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
        n = max(1, len(split))
        return loss_sum.item() / n, correct.item() / n

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
        busy = self.gpu_busy.mark() if self.gpu_busy is not None else 0
        start = time.perf_counter()
        zero = functools.partial(torch.zeros, (), device=self.device)
        loss_sum, correct, seen = zero(), zero(), 0
        # Augment only what trains weights; alphas see the validation data as it is.
        augmentation = self.data.augmentation if trains_weights else None
        size, drop_last = self.cfg.data.batch_size, self.cfg.data.drop_last
        for x, y in Batches(split, size, self.shuffle, augmentation, drop_last):
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
        gpu_busy = self._gpu_busy(phase, busy, seconds)  # .item() waited for the GPU
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
                gpu_busy=gpu_busy,
            ),
        )
        self.state.position.global_epoch += 1
        self.state.position.weight_epoch += int(trains_weights)

    def _gpu_busy(self, phase: str, mark: int, seconds: float) -> float | None:
        """The GPU's busy percent since ``mark``, kept for the run's summary."""
        if self.gpu_busy is None:
            return None
        percent = self.gpu_busy.since(mark)
        if percent is not None:
            self.gpu_busy.record(phase, percent, seconds)
        return percent

    def calibrate(self, genotype: Genotype) -> Genotype:
        """Re-estimate BatchNorm statistics along ``genotype`` on a few training batches
        (whole ones under ``data.drop_last``, as training saw them)."""
        n = self.cfg.search.calibration_batches
        size, drop_last = self.cfg.data.batch_size, self.cfg.data.drop_last
        if n:
            batches = Batches(self.data.train.head(n * size), size, drop_last=drop_last)
            self.net.recalibrate_batchnorm(genotype, (x for x, _ in batches))
        return genotype

    def _derive_calibrated(self) -> Genotype:
        return self.calibrate(self.net.derive(self.cfg.search.param_free_cap))

    def w_train(self) -> None:
        # Fair rounds restart with each phase, so a resume at its boundary repeats them.
        fair = FairPaths(self.net.trainable_ops()) if self.cfg.search.w_sampling == "fair" else None

        logits = self.net.path_logits()  # the alphas are frozen here: one host copy
        switched = self.speed.switched(self.net)  # speed.sampled_graphs

        def step(x, y, tau):
            if fair is not None:
                return self.weight_step(x, y, self.net.fair_plans(fair), switched=switched)
            return self.weight_step(x, y, self.net.sample_path(logits, tau), switched=switched)

        epochs = BY_NAME[W_TRAIN].epochs(self.cfg.search, self.state.position.cycle)
        # a trace per edge shape: growth adds shapes over a run, past torch's 8 a function
        traces = contextlib.nullcontext()
        if switched is not None:
            traces = torch._dynamo.config.patch(recompile_limit=RECOMPILES)
        with traces:
            for e in range(epochs):
                self._epoch(W_TRAIN, e, self.data.train, step, self._derive_calibrated)

    def alpha_train(self) -> None:
        weights = self.net.weight_parameters()
        for p in weights:
            p.requires_grad_(False)
        try:
            for e in range(BY_NAME[ALPHA].epochs(self.cfg.search)):
                self._epoch(
                    ALPHA,
                    e,
                    self.data.val,
                    self.alpha_step,
                    self._derive_calibrated,
                    trains_weights=False,
                )
        finally:
            for p in weights:
                p.requires_grad_(True)

    def _genotype_step(self) -> Callable:
        """A weight step of the current genotype's network (W-retraining, final stage):
        its modules wired once (:class:`FixedNetwork`, the supernet's own weights),
        compiled as ``speed.compile`` says."""
        assert self.state.genotype is not None
        fixed = self.speed.compiled(FixedNetwork(self.net, self.state.genotype))
        return lambda x, y, tau: self.weight_step(x, y, None, fixed)

    def retrain(self, phase: str, epochs: int, split: Split) -> None:
        step = self._genotype_step()
        for e in range(epochs):
            self._epoch(phase, e, split, step, lambda: self.state.genotype)

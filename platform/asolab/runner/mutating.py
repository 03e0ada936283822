"""The mutation phase: alpha-guided edits, then growth steps, each adopted by
the run with its optimizers' state carried over."""

from __future__ import annotations

import logging

import torch

from ..data import Batches
from ..evolution import growth, morphism
from ..evolution.mutation import mutate
from ..evolution.selection import select_genotype
from . import steps
from .events import GrowthEvent, MutationEvent
from .parts import Part
from .speed import with_layout

log = logging.getLogger(__name__)


class Mutating(Part):
    """Mutation and growth adoption (a Runner part)."""

    reads = frozenset({"_layout", "cfg", "data", "speed", "state"})
    writes = frozenset({"alpha_opt", "net", "spec", "weight_opt"})

    def mutate_phase(self) -> None:
        tau = self.temperature()
        cap = self.cfg.search.param_free_cap
        self.state.derived, selection = select_genotype(
            self.net, self.data.val, self.cfg, self.state.position.cycle, self.eval_pad_to()
        )
        alphas = {k: v.detach() for k, v in self.net.alphas.items()}
        self.state.genotype, edits = mutate(
            self.state.derived, alphas, self.spec.primitives, self.cfg.mutation.strength, tau, cap
        )
        self.state.cycle_edits, self.state.cycle_growth = len(edits), []
        self.calibrate(self.state.genotype)
        self.emit(
            "on_mutation",
            MutationEvent(
                self.state.position.cycle,
                self.state.derived,
                self.state.genotype,
                tuple(edits),
                tau,
                self.cfg.mutation.strength,
                selection,
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
        # a fixed batch, the split's head, as evaluation pads it (its first n rows are it)
        size = self.cfg.data.eval_batch_size
        ((probe, labels),) = Batches(self.data.val.head(size), size, pad_to=self.eval_pad_to())
        n = len(labels)
        acc = self.evaluate(self.data.val, self.state.genotype)[1]
        for kind in kinds:
            before = self._logits(probe)[:n]
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
            error = growth.preservation_error(before, self._logits(probe)[:n])
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
        # parameter objects, so the optimizers' remapping below still finds them. The grown
        # network is a new module: it gets the run's cuDNN timing hook as the first did.
        self.net = self.speed.watch(with_layout(morph.net, self._layout))
        self.spec = morph.spec
        self.weight_opt = steps.with_momentum_buffers(
            morphism.remap_optimizer(self.weight_opt, old, self.net.weight_parameters(), morph)
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

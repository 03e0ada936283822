"""Checkpoints: what one holds, when one is due, and rebuilding a runner from one."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import from_dict
from ..data import DataBundle
from ..space.spec import ArchSpec
from . import checkpoint as ckpt
from . import steps
from .events import CheckpointSaved, Observer
from .parts import Part
from .phases import EVALUATION, FINAL, FINAL_DONE, PHASES
from .state import Position, RunState, epochs_done

if TYPE_CHECKING:  # pragma: no cover
    from .cycle import Runner

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"


class Checkpointing(Part):
    """Checkpoint, resume and restore (a Runner part)."""

    reads = frozenset(
        {
            "alpha_opt",
            "cfg",
            "checkpoint_dir",
            "net",
            "observers",
            "shuffle",
            "spec",
            "speed",
            "weight_opt",
        }
    )
    writes = frozenset({"_elapsed", "_last_checkpoint", "_resumed_from", "state", "threads_source"})

    def _checkpoint_due(self) -> bool:
        """Whether the last due checkpoint is ``search.checkpoint_minutes`` old."""
        every = 60 * self.cfg.search.checkpoint_minutes
        return time.perf_counter() - self._last_checkpoint >= every

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
            "grad_scaler": self.speed.scaler.state_dict(),
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
        steps.with_momentum_buffers(self.weight_opt)  # older checkpoints: some lack them
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.state = RunState.from_dict(state)
        self._elapsed = float(state["seconds"])
        ckpt.set_rng_state(state["rng"])
        self.shuffle.set_state(state["shuffle_rng"])
        if state.get("grad_scaler"):  # fp16 runs only; older checkpoints lack it
            self.speed.scaler.load_state_dict(state["grad_scaler"])
        self._resumed_from = {**state["position"], "next": self._next_name()}

    def _next_name(self) -> str:
        """What runs next from the current position: a phase, "final" or "evaluation"."""
        p = self.state.position
        if p.cycle < self.cfg.search.cycles:
            return PHASES[p.phase].name
        return EVALUATION if p.phase == FINAL_DONE else FINAL

"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the architecture spec (so a grown network is rebuilt at its
grown size), the supernet's weights and alphas, both optimizers' states, the
genotype being retrained, the loop position, what the current cycle's
mutation did, and the RNG states. It loads with ``weights_only=True``: no
pickled code runs when a checkpoint is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..errors import first_line

# 2: the mutation's edits and growth events of the current cycle, the run's
# seconds, and a checkpoint after the final stage.
FORMAT = 2


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or of another format."""


def save(state: dict[str, Any], path: str | Path) -> Path:
    """Write atomically: a crash mid-write never leaves a half checkpoint behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"format": FORMAT, **state}, tmp)
    os.replace(tmp, path)
    return path


def load(path: str | Path, label: str | None = None) -> dict[str, Any]:
    """Read a checkpoint; ``label`` names it in errors (default: ``checkpoint <path>``).

    Only one checkpoint per run is kept (each replaces the last), so an unreadable
    one leaves nothing earlier to fall back on: the errors say so."""
    path = Path(path)
    what = label or f"checkpoint {path}"
    if not path.exists():
        raise CheckpointError(f"{what} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated/garbled files
        raise CheckpointError(
            f"{what} is corrupt or not an asolab checkpoint ({type(exc).__name__}); "
            "it is the only one kept, so the run cannot continue: start a new run"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{what} has an unknown format; it was not written by this asolab version; "
            "start a new run"
        )
    return state


@contextmanager
def restoring(path: str | Path, label: str | None = None) -> Iterator[None]:
    """Turn what restoring a readable but incomplete or mismatched checkpoint
    raises (a missing key, weights that do not fit the spec, ...) into a
    one-line :class:`CheckpointError` (``label`` names the checkpoint, as in :func:`load`)."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        first = first_line(exc)[:200]
        raise CheckpointError(
            f"{label or f'checkpoint {path}'} is incomplete or from another asolab version "
            f"({type(exc).__name__}: {first}); start a new run"
        ) from None


def check_position(position: Any, expected: tuple[int, int] | None, label: str) -> None:
    """Refuse a checkpoint whose loop position cannot occur in its own run.

    ``expected`` is ``(global_epoch, weight_epoch)`` that a run of the
    checkpoint's config has done by ``position`` (None: no such position).
    Resuming from anything else would skip or repeat epochs, and the run would
    end with steps missing from its metrics.
    """
    if expected is None or (position.global_epoch, position.weight_epoch) != expected:
        where = (
            f"cycle {position.cycle}, phase {position.phase}, epoch {position.global_epoch}, "
            f"weight epoch {position.weight_epoch}, final-stage epoch {position.stage_epoch}"
        )
        raise CheckpointError(
            f"{label} holds a position its run cannot reach ({where}); it is damaged or edited; "
            "start a new run"
        )


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

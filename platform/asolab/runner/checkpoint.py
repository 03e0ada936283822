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


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated/garbled files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not an asolab checkpoint ({type(exc).__name__}); "
            "resume from an earlier checkpoint or start a new run"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has an unknown format; it was not written by this asolab version; start a new run"
        )
    return state


@contextmanager
def restoring(path: str | Path) -> Iterator[None]:
    """Turn what restoring a readable but incomplete or mismatched checkpoint
    raises (a missing key, weights that do not fit the spec, ...) into a
    one-line :class:`CheckpointError`."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise CheckpointError(
            f"checkpoint {path} is incomplete or from another asolab version "
            f"({type(exc).__name__}: {first}); start a new run"
        ) from None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

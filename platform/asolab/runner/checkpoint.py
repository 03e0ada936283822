"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the architecture spec (so a grown network is rebuilt at its
grown size), the supernet's weights and alphas, both optimizers' states, the
genotype being retrained, the loop position, what the current cycle's
mutation did, and the RNG states. It loads with ``weights_only=True``: no
pickled code runs when a checkpoint is read.

It also carries a stamp: what its observers say it belongs to (the tracker's run
id) and the hash of its config, so that a resume can refuse a checkpoint of
another run that was put in its place (:func:`check_owner`).

On disk, the state's tensors are packed into one flat tensor per dtype,
each tensor's place taken by a small marker (:func:`pack`): ``torch.save`` pickles
every tensor through Python, so a supernet's several hundred small tensors made a
save and a load cost 2-4 times what the packed form does (bench/checkpoint_io.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .. import threads
from ..errors import first_line

# 2: the mutation's edits and growth events of the current cycle, the run's
# seconds, and a checkpoint after the final stage. 3: tensors packed (:func:`pack`).
FORMAT = 3
# Formats this version reads: 2 is 3 without the packing.
READABLE = (2, 3)
# Where a packed checkpoint keeps its flat tensors, and the key of a tensor's marker.
PACKED = "packed_tensors"
_MARK = "packed_tensor"


# Under this key: {"run_id": ..., "config_hash": ...} (absent in checkpoints of older versions).
STAMP = "stamp"
# Settings a resume may change without the run becoming another one.
_UNHASHED = ("threads", "tracking")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, of another format or of another run, or it
    cannot be written."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint cannot be written (a full or read-only disk); the run can go on later."""


def config_hash(config: dict[str, Any]) -> str:
    """A short hash of a config's dict (:meth:`ExperimentConfig.to_dict`), leaving out
    what a resume may change (the thread count, where it is tracked)."""
    kept = {k: v for k, v in config.items() if k not in _UNHASHED}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save(state: dict[str, Any], path: str | Path) -> Path:
    """Write atomically: a crash mid-write never leaves a half checkpoint behind.
    A full or read-only disk is a one-line :class:`CheckpointError`."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**pack(state), "format": FORMAT}, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch says "file write failed", no errno
        tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(
            f"cannot write the checkpoint {path} ({_why(exc, path.parent)}); free space there "
            "(local checkpoints go to TMPDIR) or set TMPDIR to a folder with room"
        ) from None
    return path


def pack(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each tensor replaced by a marker ``{"packed_tensor": i}`` and the
    tensors' values, flattened and joined per dtype on the host, under :data:`PACKED`
    with each one's group, shape and strides. Lossless: :func:`unpack` gives back equal
    tensors with the same strides (a channels-last weight stays channels-last)."""
    tensors: list[torch.Tensor] = []
    skeleton = _replace(state, tensors)
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    index = []
    for t in tensors:
        group = groups.setdefault(t.dtype, [])
        index.append([list(groups).index(t.dtype), list(t.shape), _strides(t)])
        # joined on the host, as torch.save copies them there anyway: a run near its
        # GPU's memory limit must not need a second copy of its state on the device
        group.append(t.detach().reshape(-1).cpu())
    flat = [torch.cat(parts) for parts in groups.values()]
    return {**skeleton, PACKED: {"flat": flat, "index": index}}


def _strides(t: torch.Tensor) -> list[int]:
    """The strides to restore ``t`` with: its own where its memory is one dense block in
    either layout, else plain contiguous ones (an expanded or sliced view)."""
    last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    return list((t if t.is_contiguous() or last else t.contiguous()).stride())


def _replace(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {_MARK: len(tensors) - 1}
    if isinstance(obj, dict):
        return {k: _replace(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace(v, tensors) for v in obj)
    return obj


def unpack(state: Any) -> Any:
    """The state :func:`pack` was given (a checkpoint without :data:`PACKED` as it is)."""
    if not isinstance(state, dict) or PACKED not in state:
        return state
    packed = state.pop(PACKED)
    offsets = [0] * len(packed["flat"])
    tensors = []
    for group, shape, stride in packed["index"]:
        flat, start = packed["flat"][group], offsets[group]
        n = math.prod(shape)
        offsets[group] = start + n
        values = flat[start : start + n].view(shape)  # past the group's end: too few to view
        tensors.append(torch.empty_strided(shape, stride, dtype=flat.dtype).copy_(values))
    return _restore(state, tensors)


def _restore(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _MARK in obj:
            return tensors[obj[_MARK]]
        return {k: _restore(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_restore(v, tensors) for v in obj)
    return obj


def _why(exc: BaseException, folder: Path) -> str:
    if isinstance(exc, OSError) and exc.errno not in (None, errno.ENOSPC):
        return exc.strerror or type(exc).__name__
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = -1
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or 0 <= free < 1 << 20:
        return "the disk is full"
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0][:200] if first else ''}"


def check_owner(state: dict[str, Any], run_id: str, label: str, run_config: str = "") -> None:
    """Refuse a checkpoint stamped with another run's id, or whose config is not the
    run's (``run_config``: the hash the run recorded at its start, '' if unknown) or
    not the one its stamp was made for (an edited file). Checkpoints of older
    versions have no stamp and are checked against ``run_config`` only."""
    stamp = state.get(STAMP) or {}
    owner = stamp.get("run_id")
    if owner and owner != run_id:
        raise CheckpointError(
            f"{label} belongs to run {owner}, not to run {run_id}; it was copied or moved "
            f"there: put run {run_id}'s own checkpoint back, or resume run {owner} instead"
        )
    held = config_hash(state["config"]) if isinstance(state.get("config"), dict) else ""
    if run_config and held and held != run_config:
        raise CheckpointError(
            f"{label} holds another run's config (hash {held}, the run recorded {run_config}); "
            "it was copied there: put the run's own checkpoint back, or start a new run"
        )
    recorded = stamp.get("config_hash")
    if recorded and held and recorded != held:
        raise CheckpointError(
            f"{label} holds a config other than the one it was written with; it is damaged "
            "or edited; start a new run"
        )


def load(path: str | Path, label: str | None = None) -> dict[str, Any]:
    """Read a checkpoint; ``label`` names it in errors (default: ``checkpoint <path>``).

    Only one checkpoint per run is kept (each replaces the last), so an unreadable
    one leaves nothing earlier to fall back on: the errors say so."""
    path = Path(path)
    what = label or f"checkpoint {path}"
    if not path.exists():
        raise CheckpointError(f"{what} does not exist")
    try:
        state = unpack(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as exc:  # torch raises several types for truncated/garbled files
        raise CheckpointError(
            f"{what} is corrupt or not an asolab checkpoint ({type(exc).__name__}); "
            "it is the only one kept, so the run cannot continue: start a new run"
        ) from None
    if not isinstance(state, dict) or state.get("format") not in READABLE:
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


# A local checkpoint folder names its process in this file: {"pid": ..., "started": ...}.
OWNER_FILE = "owner.json"
LOCAL_PREFIX = "asolab-run-"
# A folder of an older version (no owner file) untouched this long is left over.
_ORPHAN_SECONDS = 24 * 3600


@contextmanager
def local_folder(prefix: str = LOCAL_PREFIX) -> Iterator[Path]:
    """A temporary folder for a run's local checkpoints, removed when the block ends in
    any way (an error, Ctrl-C, SIGTERM). A SIGKILL leaves it behind: so every new one first
    removes the folders of processes that are gone (:func:`remove_stale`)."""
    remove_stale()
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        pid = os.getpid()
        (folder / OWNER_FILE).write_text(json.dumps({"pid": pid, "started": threads.started(pid)}))
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale(root: Path | None = None) -> list[Path]:
    """Remove the local checkpoint folders (``asolab-*`` in the temp folder) of processes
    that no longer run; returns what it removed. A reused pid does not keep one alive: its
    start time must match too."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for folder in root.glob("asolab-*-*"):
        if folder.is_dir() and _left_over(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _left_over(folder: Path) -> bool:
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
        pid, started = int(owner["pid"]), owner.get("started")
    except FileNotFoundError:
        if not folder.name.startswith(LOCAL_PREFIX):
            return False  # not a run's folder (a study's, a report's): not ours to judge
        try:  # an older version's run folder: left over once nothing touched it for a day
            return time.time() - folder.stat().st_mtime > _ORPHAN_SECONDS
        except OSError:
            return False
    except (OSError, ValueError, KeyError, TypeError):
        return False  # being written, or someone else's: leave it
    now = threads.started(pid)
    return now is None or (started is not None and abs(now - float(started)) > 1.0)

"""What the Runner's parts share, declared in one place.

The Runner (runner/cycle.py) is put together from parts, one job each:
``Schedule``, ``Training``, ``Mutating``, ``FinalStage``, ``Checkpointing``.
They work on one run, so they share its state: the attributes annotated on
:class:`Shared` below, and nothing else. Each part says, in its ``reads`` and
``writes``, which of them it uses; ``writes`` are the ones it assigns (a
grown network replaces ``net``, ``spec`` and both optimizers; a restore
replaces ``state``). What a checkpoint saves of the run's progress is one more
typed object, :class:`~asolab.runner.state.RunState` (``state``), whose fields
any part that reads ``state`` may update.

``tests/test_architecture.py`` reads every part's source and fails when a part
assigns an attribute it does not declare in ``writes``, uses one it declares in
neither, or declares one that :class:`Shared` does not annotate.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..config import ExperimentConfig
    from ..data import DataBundle
    from ..space.network import SearchNetwork
    from ..space.spec import ArchSpec
    from .events import Observer
    from .gpubusy import GpuBusy
    from .speed import Determinism, Speed
    from .state import RunState


class Shared:
    """The run's state that the Runner's parts share (set by ``Runner.__init__``)."""

    cfg: ExperimentConfig  # the run's config (threads decided: never 0 here)
    device: torch.device
    observers: list[Observer]
    data: DataBundle  # train / val / test / full_train splits on the device
    spec: ArchSpec  # the network's shape; replaced when the network grows
    net: SearchNetwork  # the supernet; replaced when it grows
    weight_opt: torch.optim.Optimizer  # SGD over the weights, for the whole run
    alpha_opt: torch.optim.Optimizer  # Adam over the alphas, for the whole run
    shuffle: torch.Generator  # the batches' order (checkpointed)
    speed: Speed  # precision and the gradient scaler
    # the GPU's utilization per epoch while run() runs (None: not measured)
    gpu_busy: GpuBusy | None
    # speed.deterministic while run() runs, and the ops that had no deterministic kernel
    determinism: Determinism
    state: RunState  # the run's progress and findings (checkpointed field by field)
    checkpoint_dir: Path | None  # where checkpoints go (None: none are written)
    threads_source: str  # how cfg.threads was chosen: "auto", "set" or "resumed"
    _layout: torch.memory_format  # the memory format new modules take
    _resumed_from: dict[str, Any] | None  # the checkpoint's position on a resume
    _elapsed: float  # seconds of the run before this process (restored on resume)
    _started: float  # perf_counter() when this process started the run
    _last_checkpoint: float  # perf_counter() of the last due checkpoint

    def emit(self, hook: str, event: Any) -> None:
        """Send ``event`` to every observer's ``hook`` (the Runner implements it)."""
        raise NotImplementedError


class Part(Shared):
    """A part of the Runner: the shared attributes it reads and those it assigns."""

    reads: ClassVar[frozenset[str]] = frozenset()
    writes: ClassVar[frozenset[str]] = frozenset()


def shared_names() -> frozenset[str]:
    """The names :class:`Shared` declares (what any part may declare it uses)."""
    return frozenset(Shared.__annotations__)

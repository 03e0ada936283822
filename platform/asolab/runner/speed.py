"""GPU speed switches (``[speed]``): mixed precision, cuDNN autotuning, module placement.

One :class:`Speed` per run holds what the training steps need: the autocast
context for the network's forward pass, the gradient scaler for fp16, and the
loss, always computed in fp32. The Gumbel sampling and the alpha softmax run
outside the autocast region (callers sample their plans before
:meth:`Speed.forward_loss`), so the architecture's probabilities keep full
precision whatever the weights run in.

On the CPU everything here is a no-op except ``autocast = "bf16"``, which
torch supports there (oneDNN bf16 kernels; slower than fp32 on CPUs without
AVX-512 BF16/AMX, so only worth it on those). ``fp16`` needs CUDA: elsewhere it
falls back to fp32 with a warning.

cuDNN autotuning (``speed.cudnn_benchmark``) picks the fastest convolution
algorithm per input shape on first sight, so the first step after a growth step
pays for timing the new shapes. Measured on an H100 at the DARTS-like size
(``bench/gpu_steps.py``, growth section): the first step after a widen cost 2.5
steady steps with autotuning and 1.0 without, after a deepen 2.75 and 1.1; but
the steady step after the deepen took 48 ms with it and 68 ms without. So it
stays on in every phase: a growth costs under 3 steady steps and is paid once.
But a short run meets most of its shapes once: on an H100 the default digits run
took 41 s in a fresh process and 5-8 s when run again in the same one. Of the
155 input shapes it convolves forward, 31 come in full training batches; the
rest are evaluation (the whole split at once), an epoch's last batch and probes.
``speed.cudnn_benchmark_scope`` says which are timed: ``all``, ``training``
(full batches of training steps; the rest take cuDNN's heuristics) or ``final``
(the final stage's full batches only). ``bench/gpu_check.py`` runs the three
side by side, each in a fresh process.

``speed.compile`` compiles the fixed network of W-retraining and the final
stage (:class:`~asolab.space.fixed.FixedNetwork`); the supernet's sampled steps
change path every step and run eagerly. ``speed.cuda_graphs`` (CUDA only, opt-in)
replays the fixed network's forward and backward as CUDA graphs instead
(:mod:`asolab.runner.graphs`); with ``speed.compile`` on, it is compiled, not graphed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import SpeedConfig
from ..space.network import SearchNetwork, build_on
from ..space.spec import ArchSpec
from .graphs import CudaGraphs, Graphed

log = logging.getLogger(__name__)

# speed.compile: torch.compile's mode per setting (None: eager)
COMPILE_MODES: dict[str, str | None] = {
    "off": None,
    "default": "default",
    "reduce-overhead": "reduce-overhead",
}

# speed.autocast: the forward pass's dtype under torch.autocast (None: fp32, no autocast).
AUTOCAST: dict[str, torch.dtype | None] = {
    "off": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


# speed.cudnn_benchmark_scope: the steps whose convolutions cuDNN times (the rest use its
# heuristics), with speed.cudnn_benchmark on
BENCHMARK_SCOPES: dict[str, str] = {
    "all": "every convolution, wherever it runs",
    "training": "training steps of full batches",
    "final": "the final stage's training steps of full batches",
}


def build_network(
    spec: ArchSpec, device: torch.device, layout: torch.memory_format
) -> SearchNetwork:
    """The supernet built directly on ``device``: no CPU copy to allocate and move,
    and every module (stem, cells, alphas, buffers) created where the run computes."""
    return with_layout(build_on(spec, device), layout)


def with_layout(net: nn.Module, layout: torch.memory_format) -> nn.Module:
    """``net`` with its 4-D weights in ``layout``, the parameter objects kept (optimizers
    that hold them stay valid), as ``Module.to(memory_format=...)`` does, without its
    parameter swap, which fails on fake device tensors."""
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 4:
                p.data = p.data.to(memory_format=layout)
    return net


class Speed:
    """The run's precision and kernel settings on its device."""

    def __init__(
        self, cfg: SpeedConfig, device: torch.device, batch_size: int | None = None
    ) -> None:
        """``batch_size``: the run's training batch, the one ``cudnn_benchmark_scope``'s
        ``training`` and ``final`` time (None: every batch a training step sees)."""
        self.device = device
        dtype = AUTOCAST[cfg.autocast]
        if dtype is torch.float16 and device.type != "cuda":
            log.warning("speed.autocast = 'fp16' needs CUDA; running in fp32 on %s", device)
            dtype = None
        if dtype is not None and device.type not in ("cuda", "cpu"):
            log.warning("speed.autocast = %r is not supported on %s; fp32", cfg.autocast, device)
            dtype = None
        self.dtype = dtype
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range.
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
        self.compile_mode = COMPILE_MODES[cfg.compile]
        # CUDA graphs need CUDA; elsewhere the setting changes nothing
        self.graphs = CudaGraphs() if cfg.cuda_graphs and device.type == "cuda" else None
        # cuDNN's timing: for every convolution (scope "all"), or only inside timed_steps,
        # for full training batches (scope "training" from the start, "final" from
        # enter_final_stage); off CUDA nothing here touches cuDNN's switch
        self._scope = cfg.cudnn_benchmark_scope
        self._tunes = device.type == "cuda" and cfg.cudnn_benchmark
        self._timed_batch = batch_size
        self._timing = self._tunes and self._scope == "training"  # timed_steps times now
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = self._tunes and self._scope == "all"

    def enter_final_stage(self) -> None:
        """The final stage starts: with ``cudnn_benchmark_scope = "final"`` its full
        training batches are timed from here on."""
        if self._scope == "final":
            self._timing = self._tunes

    @contextlib.contextmanager
    def timed_steps(self, batch: int) -> Iterator[None]:
        """A training step of ``batch`` images: under it cuDNN times new convolution shapes
        where ``cudnn_benchmark_scope`` says so (a no-op under scope ``all`` and off CUDA)."""
        if not self._timing or self._timed_batch not in (None, batch):
            yield
            return
        torch.backends.cudnn.benchmark = True
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark = False

    def compiled(self, net: nn.Module) -> nn.Module:
        """``net`` compiled as ``speed.compile`` says, or else run through CUDA graphs as
        ``speed.cuda_graphs`` says (the same parameters either way, so optimizers and
        checkpoints see no difference), or ``net`` itself."""
        if self.compile_mode is None:
            return net if self.graphs is None else Graphed(net, self.graphs)
        mode = self.compile_mode
        if mode == "reduce-overhead" and self.device.type != "cuda":
            mode = "default"  # CUDA graphs are what it adds; elsewhere plain compile
        return torch.compile(net, mode=mode)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's precision (a no-op with ``autocast = "off"``)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        # a CUDA graph cannot hold autocast's cache of cast weights
        cache = self.graphs is None
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=cache)

    def forward_loss(
        self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, *args: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, logits)``: the forward pass under autocast, the loss in fp32."""
        with self.autocast():
            logits = net(x, *args)
        logits = logits.float()
        return F.cross_entropy(logits, y), logits

    def step(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        clip: Sequence[torch.Tensor] = (),
        max_norm: float = 0.0,
    ) -> None:
        """Backward and optimizer step, scaled for fp16 (gradients unscaled before clipping)."""
        optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if clip:
            self.scaler.unscale_(optimizer)
            # the optimizer's kernel choice: multi-tensor norms where its update is too
            foreach = optimizer.defaults.get("foreach")
            torch.nn.utils.clip_grad_norm_(clip, max_norm, foreach=foreach)
        self.scaler.step(optimizer)
        self.scaler.update()

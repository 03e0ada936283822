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
the steady step after the deepen took 48 ms with it and 68 ms without. So the
training batches are timed in every phase: a growth costs under 3 steady steps.
But a short run meets most of its shapes once: on an H100 the default digits run
took 41 s in a fresh process and 5-8 s when run again in the same one. At its 8x8
images a step is bound by the host (the GPU 3-5% busy), so the timing bought no step
speed and cost 10 s of its training loops, and a deepen's first step 25 steady steps
instead of 2: the digits experiment turns it off (30 s against 45 s in a fresh
process, 2026-11-28).

cuDNN keeps one plan per operation and shape for the whole process, whether it
was timed or taken from its heuristics (``benchmark`` is not in torch's cache
key): a shape's first sight decides. So the scope is a rule on shapes, which
the batch size is part of. ``speed.cudnn_benchmark_scope = "full-batch"`` (the
default) times convolutions of ``data.batch_size`` images, wherever they first
run, and leaves the rest to the heuristics: evaluation chunks, an epoch's last
batch, probes. The switch is set at each network's forward pass, from its
batch, and stays for that pass's backward. In the default digits run that times
92 of the 271 plans (forward, backward-data, backward-filter) and every one of
the 56,555 convolutions of full training batches runs a timed plan, as with
``"all"``, which times every plan (``bench/cudnn_plans.py``, a model of the
cache on the CPU). ``bench/gpu_check.py`` runs the scopes and
autotuning off side by side, each in a fresh process.

``speed.compile`` compiles the fixed network of W-retraining and the final
stage (:class:`~asolab.space.fixed.FixedNetwork`); the supernet's sampled steps
change path every step and run eagerly, unless ``speed.sampled_graphs`` switches
W-training's edges on the device (:mod:`asolab.space.switched`, opt-in).
``speed.cuda_graphs`` (CUDA only, opt-in) replays the fixed network's forward and
backward as CUDA graphs instead
(:mod:`asolab.runner.graphs`); with ``speed.compile`` on, it is compiled, not graphed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import SpeedConfig
from ..space.network import SearchNetwork, build_on
from ..space.spec import ArchSpec
from ..space.switched import SwitchedEdges, SwitchedNetwork, ungraphable, unswitchable
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


# speed.cudnn_benchmark_scope: which convolutions cuDNN times (the rest take its
# heuristics), with speed.cudnn_benchmark on
BENCHMARK_SCOPES: dict[str, str] = {
    "full-batch": "convolutions of full training batches, wherever they first run",
    "all": "every convolution",
}


def _time_if_full(full_batch: int, _net: nn.Module, args: tuple) -> None:
    """cuDNN times this forward pass's new shapes (and its backward's) only for a full batch."""
    torch.backends.cudnn.benchmark = len(args[0]) == full_batch


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


# cuBLAS's deterministic workspace (torch's reproducibility notes): read when cuBLAS first
# runs in the process, so a process's first run decides it
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
POOL_BACKWARD = "adaptive_avg_pool2d_backward_cuda"  # the classifier's global pooling
NO_KERNEL = " does not have a deterministic implementation"  # torch's words for one


class Determinism:
    """``speed.deterministic`` for a run: torch's deterministic algorithms, warning (not
    failing) on an op that has none, and cuDNN's deterministic algorithms. They are the
    process's, so every run sets them, on or off, with :meth:`apply` (a study worker's
    next trial must not inherit the last one's), and :meth:`restore` puts back what was
    there. ``unmet`` lists the ops that warned: those the run could not make
    deterministic."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.unmet: list[str] = []
        self._before: tuple[bool, bool, bool] | None = None
        self._filter = None
        self._show = warnings.showwarning

    def apply(self) -> None:
        """Set torch's switches for the run (and, when on, watch its warnings)."""
        on = self.on
        self._before = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic,
        )
        self._show = warnings.showwarning
        if on:
            os.environ.setdefault(*CUBLAS_WORKSPACE)
            # torch flags this backward on CUDA for its atomic adds, but the network pools to
            # 1x1 (space/network.py), so each input element gets exactly one: deterministic
            warnings.filterwarnings("ignore", message=POOL_BACKWARD + NO_KERNEL)
            self._filter = warnings.filters[0]
            warnings.showwarning = self._seen
        torch.use_deterministic_algorithms(on, warn_only=on)
        torch.backends.cudnn.deterministic = on

    def _seen(self, message, category, filename, lineno, file=None, line=None) -> None:
        """Note an op torch warned of, then show the warning as it would have been."""
        text = str(message)
        if NO_KERNEL in text and (op := text.split(NO_KERNEL)[0]) not in self.unmet:
            self.unmet.append(op)
        self._show(message, category, filename, lineno, file, line)

    def restore(self) -> None:
        """Put torch's switches and the warnings as they were before :meth:`apply`."""
        if self._before is None:
            return
        torch.use_deterministic_algorithms(self._before[0], warn_only=self._before[1])
        torch.backends.cudnn.deterministic = self._before[2]
        self._before = None
        if self._filter in warnings.filters:  # others' filters, added meanwhile, stay
            warnings.filters.remove(self._filter)
        if warnings.showwarning == self._seen:
            warnings.showwarning = self._show


class Speed:
    """The run's precision and kernel settings on its device."""

    def __init__(
        self, cfg: SpeedConfig, device: torch.device, batch_size: int | None = None
    ) -> None:
        """``batch_size``: the run's training batch, the one ``cudnn_benchmark_scope =
        "full-batch"`` times (None: every convolution is timed, as under ``"all"``)."""
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
        self._switched = self._switched_edges(cfg.sampled_graphs, device)
        self._refused: set[str] = set()  # why a network was not switched, said once each
        # cuDNN's timing: on for good (scope "all"), or set per forward pass by watch()'s
        # hook from its batch (scope "full-batch"); off CUDA nothing here touches the switch
        tunes = device.type == "cuda" and cfg.cudnn_benchmark and not cfg.deterministic
        per_batch = tunes and cfg.cudnn_benchmark_scope == "full-batch"
        self._timed_batch = batch_size if per_batch else None  # None: watch() adds no hook
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = tunes and self._timed_batch is None

    def watch(self, net: nn.Module) -> nn.Module:
        """``net``, whose forward passes set cuDNN's timing from their batch where
        ``cudnn_benchmark_scope = "full-batch"`` says so: on for ``batch_size`` images,
        off for any other number. The switch stays as set for that pass's backward."""
        if self._timed_batch is not None:
            # a function of the batch size alone: copies and pickles of net stay plain
            net.register_forward_pre_hook(functools.partial(_time_if_full, self._timed_batch))
        return net

    def compiled(self, net: nn.Module) -> nn.Module:
        """``net`` compiled as ``speed.compile`` says, or else run through CUDA graphs as
        ``speed.cuda_graphs`` says (the same parameters either way, so optimizers and
        checkpoints see no difference), or ``net`` itself; :meth:`watch`-ed either way."""
        if self.compile_mode is None:
            return self.watch(net if self.graphs is None else Graphed(net, self.graphs))
        mode = self.compile_mode
        if mode == "reduce-overhead" and self.device.type != "cuda":
            mode = "default"  # CUDA graphs are what it adds; elsewhere plain compile
        # the hook on the compiled wrapper runs eagerly, before the compiled forward
        return self.watch(torch.compile(net, mode=mode))

    @staticmethod
    def _switched_edges(wanted: bool, device: torch.device) -> SwitchedEdges | None:
        """The compiled edge function ``speed.sampled_graphs`` asks for, or None where it
        is off or this torch cannot capture it on ``device`` (a warning says so)."""
        if not wanted:
            return None
        if (why := ungraphable(device)) is not None:
            log.warning("speed.sampled_graphs: W-training runs eagerly: %s", why)
            return None
        if device.type != "cuda":
            log.warning(
                "speed.sampled_graphs: no CUDA graphs on %s; the switched W-step runs "
                "compiled without them, slower than the eager one",
                device,
            )
        return SwitchedEdges(device)

    def switched(self, net: SearchNetwork) -> SwitchedNetwork | None:
        """``net``'s W-steps with its edges switched on the device, as
        ``speed.sampled_graphs`` says (for one W-training phase: bind again after a
        growth): None where it is off, or where ``net`` has an op without a branch form
        (a warning names it, once)."""
        if self._switched is None:
            return None
        why = unswitchable(net)
        if why is None:
            return self._switched.bind(net)
        if why not in self._refused:
            self._refused.add(why)
            log.warning("speed.sampled_graphs: W-training runs eagerly: %s", why)
        return None

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
        after_backward: Callable[[], None] | None = None,
    ) -> None:
        """Backward and optimizer step, scaled for fp16 (gradients unscaled before clipping);
        ``after_backward`` runs between the two."""
        optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if after_backward is not None:
            after_backward()
        if clip:
            self.scaler.unscale_(optimizer)
            # the optimizer's kernel choice: multi-tensor norms where its update is too
            foreach = optimizer.defaults.get("foreach")
            torch.nn.utils.clip_grad_norm_(clip, max_norm, foreach=foreach)
        self.scaler.step(optimizer)
        self.scaler.update()

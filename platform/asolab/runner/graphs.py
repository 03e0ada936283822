"""CUDA graphs for the fixed phases' steps (``speed.cuda_graphs``): one launch per pass.

A training step of a small network on a GPU is bound by the host: at the
DARTS-like size W-retraining's step dispatches about 1,600 small kernels, and the
H100 sat 87% idle (bench/README.md, "On a GPU"). A CUDA graph replays a captured
sequence of kernels with one launch. :class:`CudaGraphs` captures a module's
forward and backward pass as a graph pair (``torch.cuda.make_graphed_callables``)
the first time it is called in a training step, at that input's shape, and
replays it from then on. The runner graphs the fixed network of W-retraining and
the final stage whole (:class:`Graphed`): one pair per genotype and phase.

Measured on an H100 (bench/README.md, "On a GPU"): W-retraining's step 4.6x at
the DARTS-like size, the digits run's fixed phases 2.4x. It is opt-in: at the
CIFAR-like shape (batch 256) one capture failed ("operation not permitted when
stream is capturing"); the phase went on eagerly, as below, but that process's
later CUDA random numbers failed ("Offset increment outside graph capture"). The
cause is not established; torch warned that a parameter's gradient accumulator
lived on another stream than the capture.

The supernet's sampled steps stay eager: their path changes every step, and a
pair per candidate op (measured on an H100: 0.91x the eager step, 4.5x its
memory) does not pay.

What stays eager: evaluation and anything under ``torch.no_grad`` (as
``make_graphed_callables`` would), a batch of another shape than the captured one
(an epoch's last, smaller batch), a module with frozen weights, and a module
whose capture fails (a warning names it once). A module whose parameters or
buffers were replaced or moved is captured anew at its next call.

A step does not walk the module's tree to notice that: at the DARTS-like size
the walk cost 2.4 ms per step on a 2-core AMD EPYC, a fifth of a graphed step's
12.8 ms on the H100 (``bench/step_cost.py`` measures both). Each module's
tensors are listed once, with the submodule and name each is registered under
(:class:`_Slots`); a step checks that each is still there and still in the same
memory, and torch's registration hooks mark every list stale when a parameter,
buffer or submodule is set anywhere.

Before each capture the garbage collector runs, so that a pair from an earlier
phase over the same parameters is gone: on the H100 the failed capture followed
one such pair (the hypothesis in :func:`capture_pair`; the placement tests check
two captures in a row on a GPU).

Capturing runs the module three times first (torch's warm-up); the BatchNorm
statistics those runs move are put back, so a step computes what the eager step
computes, to floating-point reordering.
"""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

log = logging.getLogger(__name__)

Capture = Callable[[nn.Module, torch.Tensor, tuple[nn.Parameter, ...]], Callable[..., object]]


def capture_pair(
    module: nn.Module, x: torch.Tensor, params: tuple[nn.Parameter, ...]
) -> Callable[..., object]:
    """``module``'s forward and backward at ``x``'s shape as a CUDA graph pair.

    The parameters are passed as the graph's inputs (the tensors themselves: the
    graph reads them in place, and its backward returns their gradients), not taken
    from the module, so the returned callable holds no reference to ``module``."""
    sample = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    sample.copy_(x).requires_grad_(x.requires_grad)
    # An earlier pair over the same parameters (the last phase's network) is freed only by
    # a cyclic collection (torch's graphed Function class is a cycle), and until then its
    # autograd graph keeps those parameters' gradient accumulators on that capture's
    # stream: this capture's backward would then wait on a foreign stream, which a
    # capture forbids (torch warns "AccumulateGrad node's stream does not match").
    gc.collect()
    return torch.cuda.make_graphed_callables(
        lambda inp, *_: module(inp), (sample, *params), allow_unused_input=True
    )


# Bumped whenever a parameter, buffer or submodule is set on any module (torch's global
# registration hooks): a new one in a graphed module's tree makes its _Slots stale.
_registrations = [0]


def _registered(*_: object) -> None:
    _registrations[0] += 1


for _register in (
    torch.nn.modules.module.register_module_parameter_registration_hook,
    torch.nn.modules.module.register_module_buffer_registration_hook,
    torch.nn.modules.module.register_module_module_registration_hook,
):
    _register(_registered)


@dataclass
class _Slots:
    """A module's parameters (in ``parameters()``' order) and buffers, each with the
    submodule and name it is registered under, listed once instead of at every step."""

    registrations: int  # _registrations when listed
    params: tuple[nn.Parameter, ...]
    # (the submodule's own dict of parameters or buffers, the name, the tensor): read
    # directly, as torch's Module does, because getattr through Module.__getattr__ made
    # the check 0.43 ms a step at the DARTS-like size against 0.07 ms this way
    slots: tuple[tuple[dict[str, torch.Tensor | None], str, torch.Tensor], ...]

    @classmethod
    def of(cls, module: nn.Module) -> _Slots:
        slots = tuple(
            (store, name, t)
            for sub in module.modules()
            for store in (sub._parameters, sub._buffers)
            for name, t in store.items()
            if t is not None
        )
        return cls(_registrations[0], tuple(module.parameters()), slots)

    def current(self) -> bool:
        """Nothing set since the listing, and every tensor still where it was registered
        (``Module.to`` replaces buffers, and parameters under torch's overwrite rule,
        without the registration hooks)."""
        return self.registrations == _registrations[0] and all(
            store.get(name) is t for store, name, t in self.slots
        )

    def state(self) -> tuple[int, ...]:
        """Where the tensors' data live (``p.data = ...`` moves it, unannounced)."""
        return tuple([t.data_ptr() for _, _, t in self.slots])


@dataclass
class _Entry:
    state: tuple[int, ...]  # where the module's parameters and buffers live
    shape: tuple[object, ...]  # the captured input's shape, strides, dtype, grad, autocast
    replay: Callable[..., object]


def _signature(x: torch.Tensor) -> tuple[object, ...]:
    return (tuple(x.shape), x.stride(), x.dtype, x.requires_grad, torch.is_autocast_enabled())


class CudaGraphs:
    """Graph pairs of modules, each captured at the first input it meets in training.

    Call it as ``graphs(module, x)`` in place of ``module(x)``. ``capture`` makes a
    pair (:func:`capture_pair`; the tests give a CPU stand-in to check the rules)."""

    def __init__(self, capture: Capture = capture_pair) -> None:
        self._capture = capture
        self._entries: weakref.WeakKeyDictionary[nn.Module, _Entry] = weakref.WeakKeyDictionary()
        self._slots: weakref.WeakKeyDictionary[nn.Module, _Slots] = weakref.WeakKeyDictionary()
        self._refused: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self.captures = 0  # pairs captured so far (the bench reports it)
        self.failures = 0  # captures that failed (each module then runs eagerly)

    def __call__(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not (module.training and torch.is_grad_enabled()) or module in self._refused:
            return module(x)
        slots = self._listed(module)
        params = slots.params
        if not slots.slots or any(not p.requires_grad for p in params):
            return module(x)  # frozen weights, or no kernels of its own (identity, none)
        state, shape = slots.state(), _signature(x)
        entry = self._entries.get(module)
        if entry is not None and entry.state == state:
            if entry.shape != shape:
                return module(x)  # another batch shape: eager, the captured pair kept
            return entry.replay(x, *params)
        entry = self._new_entry(module, x, params, state, shape)
        return module(x) if entry is None else entry.replay(x, *params)

    def _listed(self, module: nn.Module) -> _Slots:
        slots = self._slots.get(module)
        if slots is None or not slots.current():
            slots = self._slots[module] = _Slots.of(module)
        return slots

    def _new_entry(
        self,
        module: nn.Module,
        x: torch.Tensor,
        params: tuple[nn.Parameter, ...],
        state: tuple[int, ...],
        shape: tuple[object, ...],
    ) -> _Entry | None:
        self._entries.pop(module, None)  # the stale pair's memory goes first
        buffers = [b.clone() for b in module.buffers()]
        try:
            replay = self._capture(module, x, params)
        except Exception as exc:  # a module that cannot be captured runs eagerly, named once
            # On the H100 the process's later CUDA random numbers then failed (a study
            # worker's next trial would): say so, and what avoids it
            log.warning(
                "speed.cuda_graphs: %s runs without a CUDA graph: %s: %s (this process "
                "may fail to draw CUDA random numbers later; set speed.cuda_graphs = false)",
                type(module).__name__,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            self._refused.add(module)
            self.failures += 1
            return None
        finally:
            with torch.no_grad():  # the warm-up's BatchNorm updates are not the run's
                for b, saved in zip(module.buffers(), buffers):
                    b.copy_(saved)
        self.captures += 1
        entry = _Entry(state, shape, replay)
        self._entries[module] = entry
        return entry


class Graphed(nn.Module):
    """``net`` run through ``graphs`` (a fixed network, captured whole): same
    parameters, so optimizers, checkpoints and the logged model see ``net`` only."""

    def __init__(self, net: nn.Module, graphs: CudaGraphs) -> None:
        super().__init__()
        self.net = net
        self._graphs = graphs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._graphs(self.net, x)

"""Training steps on a GPU: images/s, kernels per step and GPU busy, one section each.

    python bench/gpu_steps.py --device cuda --out DIR       # every section, JSON + table
    PYTHONPATH=OLD/platform python bench/gpu_steps.py ...    # the same on an older checkout
    python bench/gpu_steps.py --device cpu --smoke          # CI: tiny sizes on the CPU

Sections (``bench/gpu_check.py`` runs them too; each records its figures or its error):

- ``w_step``: the sampled W-step at the DARTS-like size (8 cells, 4 nodes, 16 channels,
  3x32x32) at batch 64 and 256 (and at 64 in the contiguous layout): ms per step,
  images/s, CUDA kernels per step and GPU busy (kernel time over wall time), both from
  ``torch.profiler``;
- ``alpha_step``: the alpha step, same figures at batch 64;
- ``retrain``: the fixed network's step (W-retraining, final stage) with
  ``speed.compile`` off, default and reduce-overhead: compile seconds, steady ms per
  step, and an epoch of 2,560 images with the compile paid in it;
- ``growth``: the first step after widen and deepen against the steady ones, cuDNN
  autotuning on and off;
- ``workers``: aggregate W-step images/s of 1, 2 and 4 processes sharing the GPU;
- ``graphed``: W-retraining's step with ``speed.cuda_graphs`` on and off, and how
  closely the two agree (``gpu_check.py``'s section of that name);
- ``default_run``: the README's ``asolab run`` (digits) on the device, wall seconds;
- ``op_costs``: microseconds per call of each op a W-step launches most, forward and
  forward + backward, both layouts, with alternatives (``gpu_check.py``'s section);
- ``cond_graph``: two cells' edges as ``torch.cond`` branches, a CUDA graph per cell
  whatever path is drawn, against the eager step (``gpu_check.py``'s section).

``--budget-s`` skips a section whose estimate would not fit in what is left.
Works on older checkouts (no ``runner/steps.py``): the "before" of a before/after pair.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import step_cost as sc
import torch
import torch.nn.functional as F

from asolab import config
from asolab.evolution import morphism

ROOT = Path(__file__).resolve().parents[1]
# rough seconds per section on an H100 (for --budget-s)
ESTIMATE = {
    "w_step": 35,
    "alpha_step": 10,
    "retrain": 120,
    "growth": 20,
    "workers": 90,
    "default_run": 90,
    "profile": 20,
    "graphed": 60,
    "op_costs": 20,
    "cond_graph": 60,
}


def sync(device: torch.device) -> None:
    """Wait for the device (timings include its work)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# gpu_check --smoke (CI): every timing without warm-up, over blocks of one call, so the
# same code runs in seconds; the figures then mean nothing
QUICK = False


def timed(fn: Callable[[], object], device: torch.device, steps: int, warmup: int) -> float:
    """Median seconds per call over blocks of ``steps`` calls (device work included)."""
    if QUICK:
        steps, warmup = 1, 0
    for _ in range(warmup):
        fn()
    sync(device)
    blocks = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        blocks.append((time.perf_counter() - start) / steps)
    return statistics.median(blocks)


def first_calls(fn: Callable[[], object], device: torch.device, calls: int) -> tuple[list, float]:
    """``fn``'s results over its first ``calls`` calls, and their seconds (device work
    included): what compiling, capturing or cuDNN's first sight of a shape costs."""
    sync(device)
    start = time.perf_counter()
    results = [fn() for _ in range(calls)]
    sync(device)
    return results, time.perf_counter() - start


def profiled(fn: Callable[[], object], device: torch.device, steps: int = 5) -> dict:
    """CUDA kernels per step and GPU busy (kernel time / wall time) from torch.profiler."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e6  # µs -> s
    return {"kernels_per_step": len(kernels) / steps, "gpu_busy": busy / wall}


def _setup(
    device: torch.device,
    batch: int,
    layout: torch.memory_format | None = None,
    overrides: dict | None = None,
):
    """The DARTS-like network as a run builds it on ``device`` (channels-last on CUDA),
    with ``overrides`` on top of the DARTS-like settings."""
    if layout is None:
        layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    return sc.setup({**sc.DARTS_LIKE, **(overrides or {})}, 32, batch, device, layout=layout)


def _sampler(net) -> Callable[[], dict]:
    """W-training's path per step, as the runner draws it (older code: on the device)."""
    if hasattr(net, "path_logits"):
        logits = net.path_logits()  # once per W-training phase
        return lambda: net.sample_path(logits, 1.0)
    return lambda: net.sample_plans(1.0, False)


def w_step_section(device: torch.device, batches: tuple[int, ...], steps: int) -> dict:
    """The sampled W-step per batch size, as a run lays it out; on CUDA also the first
    batch size in the contiguous layout: channels-last BatchNorm launches more kernels
    (a zeroed semaphore, statistics, transform, running statistics: 84 µs of host time
    a call on the H100, under cProfile), which a step bound by the host may pay for."""
    out = {}
    runs = [(batch, None, f"batch_{batch}") for batch in batches]
    if device.type == "cuda" and not QUICK:
        runs.append((batches[0], torch.contiguous_format, f"batch_{batches[0]}_contiguous"))
    for batch, layout, name in runs:
        cfg, net, wopt, _, speed, x, y = _setup(device, batch, layout)
        clip = cfg.search.grad_clip
        sample = _sampler(net)
        fn = lambda: sc.steps.weight_step(net, speed, wopt, x, y, sample(), clip)  # noqa: E731, B023 (used at once)
        seconds = timed(fn, device, steps, warmup=10)
        out[name] = {
            "ms_per_step": 1e3 * seconds,
            "images_per_s": batch / seconds,
            **profiled(fn, device),
        }
    return out


def _graphs_run(device: torch.device, batch: int, graphs: bool, steps: int) -> dict:
    """W-retraining's step with ``speed.cuda_graphs`` on or off: 5 steps (the capture
    paid in them), then the steady step; the losses and the weights for the equivalence."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    overrides = {"speed.cuda_graphs": str(graphs).lower()}
    cfg, net, wopt, _, speed, x, y = _setup(device, batch, overrides=overrides)
    clip = cfg.search.grad_clip
    model = speed.compiled(sc.FixedNetwork(net, net.derive()))
    fn = lambda: sc.steps.weight_step(model, speed, wopt, x, y, None, clip)  # noqa: E731
    results, first = first_calls(fn, device, 5)
    losses = [loss for loss, *_ in results]
    weights = [t.detach().float().cpu() for t in net.state_dict().values()]
    seconds = timed(fn, device, steps, warmup=3)
    out = {
        "first_5_steps_s": first,
        "ms_per_step": 1e3 * seconds,
        "images_per_s": batch / seconds,
        **profiled(fn, device),
        "captures": speed.graphs.captures if speed.graphs is not None else 0,
    }
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return {**out, "_losses": [loss.item() for loss in losses], "_weights": weights}


def graphed_section(device: torch.device, batch: int, steps: int) -> dict:
    """``speed.cuda_graphs`` at the DARTS-like size: W-retraining's step of the fixed
    network replayed as a CUDA graph pair against the eager step, in one process: ms per
    step, images/s, kernels and GPU busy, the first 5 steps (the capture paid in them),
    peak memory, and the equivalence: the largest loss difference over 5 steps from the
    same start and the largest weight difference relative to the weights' scale."""
    eager = _graphs_run(device, batch, False, steps)
    graph = _graphs_run(device, batch, True, steps)
    scale = max(w.abs().max().item() for w in eager["_weights"] if w.numel()) or 1.0
    return {
        "off": {k: v for k, v in eager.items() if not k.startswith("_")},
        "on": {k: v for k, v in graph.items() if not k.startswith("_")},
        "speedup": eager["ms_per_step"] / graph["ms_per_step"],
        "max_loss_diff": max(
            abs(a - b) for a, b in zip(eager["_losses"], graph["_losses"], strict=True)
        ),
        "max_weight_diff_rel": max(
            (a - b).abs().max().item() / scale
            for a, b in zip(eager["_weights"], graph["_weights"], strict=True)
            if a.numel()
        ),
    }


def profile_section(device: torch.device, batch: int, out: str) -> dict:
    """Where a W-step's host time goes: cProfile's top functions by own time, and the
    CUDA kernels per step by name (written to ``profile.txt`` in ``out``)."""
    import cProfile
    import io
    import pstats
    from collections import Counter

    cfg, net, wopt, _, speed, x, y = _setup(device, batch)
    clip, sample = cfg.search.grad_clip, _sampler(net)
    fn = lambda: sc.steps.weight_step(net, speed, wopt, x, y, sample(), clip)  # noqa: E731
    timed(fn, device, 5, warmup=10)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        fn()
    sync(device)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    kernels: Counter[str] = Counter()
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as p:
            fn()
            sync(device)
        for e in p.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name[:90]] += 1
    report = text.getvalue() + "\nkernels per step by name:\n"
    report += "\n".join(f"{n:6d} {name}" for name, n in kernels.most_common(25))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"profile_{'before' if sc.BEFORE else 'after'}.txt").write_text(report)
    return {"kernel_kinds": len(kernels), "top_kernels": dict(kernels.most_common(6))}


def alpha_section(device: torch.device, batch: int, steps: int) -> dict:
    cfg, net, _, aopt, speed, x, y = _setup(device, batch)
    for p in net.weight_parameters():
        p.requires_grad_(False)
    fn = lambda: sc.steps.alpha_step(net, speed, aopt, x, y, 1.0)  # noqa: E731, B023 (used at once)
    seconds = timed(fn, device, steps, warmup=5)
    return {"ms_per_step": 1e3 * seconds, "images_per_s": batch / seconds, **profiled(fn, device)}


def retrain_section(device: torch.device, batch: int, epoch_images: int, modes) -> dict:
    """The fixed network's step per ``speed.compile`` mode; an epoch pays the compile."""
    out = {}
    for mode in modes:
        cfg, net, wopt, _, speed, x, y = _setup(device, batch)
        genotype = net.derive()
        fixed = sc._retrain_net(net, genotype)
        if not sc.BEFORE:
            from asolab.runner.speed import Speed

            speed = Speed(config.SpeedConfig(compile=mode, cuda_graphs=False), device)
            fixed = speed.compiled(fixed)
        elif mode != "off":
            continue
        clip = cfg.search.grad_clip
        fn = lambda: sc.steps.weight_step(fixed, speed, wopt, x, y, None, clip)  # noqa: E731, B023 (used at once)
        _, first = first_calls(fn, device, 3)  # compile (and CUDA-graph recording) here
        seconds = timed(fn, device, 20, warmup=2)
        per_epoch = epoch_images // batch
        out[mode] = {
            "first_3_steps_s": first,
            "ms_per_step": 1e3 * seconds,
            "images_per_s": batch / seconds,
            "epoch_s_with_compile": first + (per_epoch - 3) * seconds,
            **profiled(fn, device),
        }
    return out


def growth_section(device: torch.device, batch: int) -> dict:
    """First step after each growth kind against the steady ones, autotuning on and off."""
    out = {}
    for bench_on in (True, False):
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = bench_on
        cfg, net, _, _, speed, x, y = _setup(device, batch)
        for kind, grow in (
            ("widen", lambda n: morphism.widen_cell(n, 0, 2 * n.spec.cells[0].channels)),
            ("deepen", lambda n: morphism.deepen(n, morphism.deepen_positions(n.spec)[0])),
        ):
            net = grow(net).net
            wopt, _ = sc._optimizers(net, cfg, None)
            clip = cfg.search.grad_clip
            plans = net.sample_plans(1.0, False)
            fn = lambda n=net, o=wopt, p=plans: sc.steps.weight_step(n, speed, o, x, y, p, clip)  # noqa: E731, B023 (used at once)
            _, first = first_calls(fn, device, 1)
            steady = timed(fn, device, 5, warmup=1)
            out[f"{kind}_autotune_{'on' if bench_on else 'off'}"] = {
                "first_step_s": first,
                "steady_step_s": steady,
                "first_over_steady": first / steady,
            }
    return out


def pointwise_as_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A 1x1 convolution as one matrix multiply over the channels-last view (N,H,W,C) of
    ``x``: no copy in that layout, and cuBLAS, not cuDNN, with the convolution's weight."""
    return F.linear(x.permute(0, 2, 3, 1), weight.flatten(1)).permute(0, 3, 1, 2)


def _weight(device: torch.device, *shape: int) -> torch.Tensor:
    """A small random weight on ``device`` that requires gradients, as a step's do."""
    return torch.randn(*shape, device=device).mul_(0.1).requires_grad_()


def _op_kinds(channels: int, device: torch.device) -> dict[str, Callable]:
    """The ops a W-step launches most, as the search network calls them in a training
    step (``space/ops.py``: functional calls, BatchNorm without affine parameters), each
    a function of the input; their weights require gradients as in a step."""
    weight = functools.partial(_weight, device)
    c = channels
    pw, dw3, dw5 = weight(c, c, 1, 1), weight(c, 1, 3, 3), weight(c, 1, 5, 5)
    mean, var = torch.zeros(c, device=device), torch.ones(c, device=device)
    return {
        "relu": F.relu,
        "add": lambda x: x + x,
        "conv_1x1": lambda x: F.conv2d(x, pw),
        "conv_1x1_as_matmul": lambda x: pointwise_as_matmul(x, pw),
        "dw_conv_3x3": lambda x: F.conv2d(x, dw3, padding=1, groups=c),
        "dw_conv_5x5": lambda x: F.conv2d(x, dw5, padding=2, groups=c),
        "dw_conv_3x3_dilated": lambda x: F.conv2d(x, dw3, padding=2, dilation=2, groups=c),
        "batch_norm": lambda x: F.batch_norm(x, mean, var, None, None, True, 0.1, 1e-5),
        # without running statistics: the statistics and normalisation kernels only
        "batch_norm_no_running": lambda x: F.batch_norm(x, None, None, training=True),
        "max_pool_3x3": lambda x: F.max_pool2d(x, 3, 1, 1),
        "avg_pool_3x3": lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
    }


def op_costs_section(
    device: torch.device, batch: int, channels: int, image: int, calls: int
) -> dict:
    """Where a host-bound step's time goes, op by op: microseconds per call of each op a
    W-step launches most (:func:`_op_kinds`), forward (autograd recording, as in a step)
    and forward + backward, in each layout, at the DARTS-like first cell's shape
    (``batch`` x ``channels`` x ``image`` x ``image``); CUDA kernels per call and GPU busy
    from the profiler. A step bound by the host costs about the sum of its ops' figures,
    so the table says which op to make cheaper and whether an alternative is: the
    pointwise convolution as a matrix multiply, BatchNorm in the other layout or without
    running statistics. ``floor_us``: one elementwise op on one number, the cost of any
    op on this host. ``matmul_max_diff``: the matrix multiply against the convolution,
    outputs and gradients, relative (TF32 convolutions on a GPU differ more)."""
    one = torch.zeros(1, device=device)
    out: dict = {"floor_us": 1e6 * timed(lambda: one.add(1), device, calls, warmup=5)}
    for layout in (torch.channels_last, torch.contiguous_format):
        name = "channels_last" if layout is torch.channels_last else "contiguous"
        x = torch.randn(batch, channels, image, image, device=device)
        x = x.contiguous(memory_format=layout).requires_grad_()
        for op, fn in _op_kinds(channels, device).items():
            if op == "conv_1x1_as_matmul" and layout is not torch.channels_last:
                continue  # the permuted view is not contiguous there: linear would copy
            grad = torch.ones_like(fn(x))

            def both(fn=fn, x=x, grad=grad) -> None:
                x.grad = None
                fn(x).backward(grad)

            out[f"{op} {name}"] = {
                "forward_us": 1e6 * timed(lambda fn=fn, x=x: fn(x), device, calls, warmup=5),
                "forward_backward_us": 1e6 * timed(both, device, calls, warmup=5),
                **profiled(both, device),
            }
    out["matmul_max_diff"] = _matmul_diff(batch, channels, image, device)
    return out


CONVOLUTIONS = ("conv_1x1", "dw_conv_3x3", "dw_conv_5x5", "dw_conv_3x3_dilated")


def first_sight_section(device: torch.device, channels: int, image: int, shapes: int) -> dict:
    """What a convolution's first sight of a shape costs, per layout, kind and cuDNN
    timing: milliseconds of a forward + backward at ``shapes`` new batch sizes, the first
    call against the second at the same shape, after one call at another shape (kernels
    loaded). A short run meets most of its shapes once (254 plans in the default digits
    run), so this is what a fresh process pays per plan. On CUDA, channels-last sends
    depthwise convolutions to cuDNN and contiguous fp32 ones to torch's own kernel."""
    before = torch.backends.cudnn.benchmark
    out: dict = {}
    batch = 97  # sizes no other section uses: every one a new shape
    try:
        for timing in (False, True):
            torch.backends.cudnn.benchmark = timing
            for layout in (torch.channels_last, torch.contiguous_format):
                name = "channels_last" if layout is torch.channels_last else "contiguous"
                ops = _op_kinds(channels, device)
                for op in CONVOLUTIONS:
                    firsts, seconds = [], []
                    for b in range(batch, batch + shapes + 1):
                        x = torch.randn(b, channels, image, image, device=device)
                        x = x.contiguous(memory_format=layout).requires_grad_()
                        calls = [_once(ops[op], x, device) for _ in range(2)]
                        if b > batch:  # the first size loads the kernels
                            firsts.append(calls[0])
                            seconds.append(calls[1])
                    batch += shapes + 1
                    key = f"{op} {name} {'timed' if timing else 'heuristic'}"
                    out[key] = {
                        "first_ms": 1e3 * statistics.median(firsts),
                        "second_ms": 1e3 * statistics.median(seconds),
                    }
    finally:
        torch.backends.cudnn.benchmark = before
    return out


def _once(fn: Callable, x: torch.Tensor, device: torch.device) -> float:
    """Seconds of one forward + backward of ``fn`` at ``x``, the device's work included."""
    sync(device)
    start = time.perf_counter()
    fn(x).sum().backward()
    sync(device)
    return time.perf_counter() - start


def _matmul_diff(batch: int, channels: int, image: int, device: torch.device) -> float:
    """Largest difference between a pointwise convolution and its matrix multiply, over
    the outputs, the input gradients and the weight gradients from one input, each
    relative to the convolution's largest value."""
    x = torch.randn(batch, channels, image, image, device=device)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    weight = torch.randn(channels, channels, 1, 1, device=device).requires_grad_()
    results = []
    for fn in (F.conv2d, pointwise_as_matmul):
        y = fn(x, weight)
        results.append((y.detach(), *torch.autograd.grad(y, (x, weight), torch.ones_like(y))))
    return max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(*results, strict=True))


def _candidates(dw: torch.Tensor, pw: torch.Tensor) -> list[Callable]:
    """An edge's three candidate ops: a separable convolution, max pooling and skip, with
    BatchNorm without running statistics (``torch.cond`` cannot update those inside a
    branch). A branch may not return its input itself, hence skip's copy."""

    def norm(x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, None, None, training=True)

    def sep(x: torch.Tensor) -> torch.Tensor:
        return norm(F.conv2d(F.conv2d(F.relu(x), dw, padding=1, groups=x.shape[1]), pw))

    return [sep, lambda x: norm(F.max_pool2d(x, 3, 1, 1)), lambda x: x.clone()]


def cond_cell(x: torch.Tensor, index: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    """A cell of edges in a chain, each edge's op chosen by ``index`` on the device with
    ``torch.cond``; its weights are arguments, so one compiled cell serves every cell of
    the same shapes (a depthwise and a pointwise weight an edge)."""
    for e in range(len(weights) // 2):
        first, second, third = _candidates(weights[2 * e], weights[2 * e + 1])
        i = index[e]

        def rest(h, i=i, second=second, third=third):
            return torch.cond(i == 1, second, third, (h,))

        x = x + torch.cond(i == 0, first, rest, (x,))
    return x


def eager_cell(x: torch.Tensor, path: list[int], *weights: torch.Tensor) -> torch.Tensor:
    """The same cell as a step runs it today: the drawn op of each edge, chosen on the host."""
    for e, k in enumerate(path):
        x = x + _candidates(weights[2 * e], weights[2 * e + 1])[k](x)
    return x


def _compile_counts() -> dict[str, int]:
    """torch.compile's counters the conditional sections report, under their names there:
    graphs traced, graphs cudagraphs declined to capture, and the inputs a replay copies
    into the graph's own buffers (summed over recordings)."""
    from torch._dynamo.utils import counters

    return {
        "compiles": counters["stats"]["unique_graphs"],
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "inputs_copied": counters["inductor"]["cudagraph_recorded_non_static_inputs"],
    }


def _counts_since(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in _compile_counts().items()}


def cond_graph_section(
    device: torch.device, batch: int, channels: int, image: int, edges: int, steps: int
) -> dict:
    """Whether one CUDA graph per cell can run a sampled step whatever path is drawn: two
    cells of ``edges`` edges (:func:`cond_cell`), their choices a device tensor and their
    candidate ops ``torch.cond`` branches, one cell function compiled with
    ``backend="cudagraphs"`` (torch captures the branches as conditional nodes) and
    called for both cells, against the eager step that runs the drawn ops
    (:func:`eager_cell`). A fresh path every step for both. Figures: ms per step,
    kernels and GPU busy, the compile and capture paid in the first 3 steps, and the
    largest loss and gradient differences over 3 paths (the unsampled ops' zero
    gradients against none); :func:`_compile_counts` (``cudagraph_skips``: then the
    compiled function ran without graphs, and the log says why; ``compiles`` 1: the
    second cell reused the first's trace).

    ``cond_graph_static`` compiles it again with the weights marked as fixed addresses
    (``torch._dynamo.mark_static_address``, as a module's parameters are): no copies,
    but one recording per cell, since the two cells' weights live apart. Off CUDA it
    runs without graphs: the equality still holds, the times mean nothing."""

    def cell_weights() -> list[torch.Tensor]:  # a depthwise and a pointwise weight an edge
        c, w = channels, functools.partial(_weight, device)
        return [t for _ in range(edges) for t in (w(c, 1, 3, 3), w(c, c, 1, 1))]

    cells = [cell_weights(), cell_weights()]
    weights = [w for cell in cells for w in cell]
    # the block's input requires gradients, as a cell's does (and a path of skips then
    # still has a backward pass)
    x = torch.randn(batch, channels, image, image, device=device, requires_grad=True)
    draw = torch.Generator().manual_seed(0)

    def block(cell_fn: Callable, choices) -> torch.Tensor:
        """The two cells' loss, each cell given its slice of ``choices`` (a host path for
        the eager cell, a device index for the conditional one)."""
        h = x
        for c, cell in enumerate(cells):
            h = cell_fn(h, choices[c * edges : (c + 1) * edges], *cell)
        return h.square().mean()

    def clear() -> None:
        for w in (x, *weights):
            w.grad = None

    def eager_step() -> None:
        block(eager_cell, torch.randint(0, 3, (2 * edges,), generator=draw).tolist()).backward()
        clear()

    def compiled_variant(static: bool) -> tuple[dict, Callable]:
        """The conditional cell compiled afresh: its figures, and its loss function."""
        torch._dynamo.reset()
        for w in weights if static else ():
            torch._dynamo.mark_static_address(w)
        before = _compile_counts()
        conditional = functools.partial(block, torch.compile(cond_cell, backend="cudagraphs"))

        def cond_step() -> None:
            conditional(torch.randint(0, 3, (2 * edges,), device=device)).backward()
            clear()

        _, first = first_calls(cond_step, device, 3)
        figures = {
            "ms_per_step": 1e3 * timed(cond_step, device, steps, warmup=3),
            **profiled(cond_step, device),
            "first_3_steps_s": first,
            **_counts_since(before),
        }
        return figures, conditional

    out = {"eager": {"ms_per_step": 1e3 * timed(eager_step, device, steps, warmup=3)}}
    out["eager"].update(profiled(eager_step, device))
    loss_diff, grad_diff = 0.0, 0.0
    for name, static in (("cond_graph", False), ("cond_graph_static", True)):
        out[name], conditional = compiled_variant(static)
        for path in torch.randint(0, 3, (3 if not static else 1, 2 * edges), generator=draw):
            a = block(eager_cell, path.tolist())
            ga = torch.autograd.grad(a, weights, allow_unused=True, materialize_grads=True)
            b = conditional(path.to(device))
            gb = torch.autograd.grad(b, weights)
            loss_diff = max(loss_diff, (a - b).abs().item())
            scale = max(g.abs().max().item() for g in ga) or 1.0
            grad_diff = max(
                grad_diff, *((g - h).abs().max().item() / scale for g, h in zip(ga, gb))
            )
    return {
        "edges_per_cell": edges,
        "cells": len(cells),
        "compiles": out["cond_graph"]["compiles"],
        "cudagraph_skips": out["cond_graph"]["cudagraph_skips"],
        **out,
        "speedup": out["eager"]["ms_per_step"] / out["cond_graph"]["ms_per_step"],
        "speedup_static": out["eager"]["ms_per_step"] / out["cond_graph_static"]["ms_per_step"],
        "first_3_steps_s": out["cond_graph"]["first_3_steps_s"],
        "max_loss_diff": loss_diff,
        "max_grad_diff_rel": grad_diff,
    }


def largest_rel_diff(pairs) -> float:
    """The largest difference over pairs of tensors (floating ones; a first tensor with
    infinities, as 'none''s -inf mask, left out), relative to the first ones' largest value."""
    pairs = [(a.float(), b.float()) for a, b in pairs if a.is_floating_point()]
    pairs = [(a, b) for a, b in pairs if torch.isfinite(a).all()]
    scale = max((a.abs().max().item() for a, _ in pairs), default=0.0) or 1.0
    return max(((a - b).abs().max().item() for a, b in pairs), default=0.0) / scale


def _differences(net, twin, opt, twin_opt) -> dict:
    """Largest differences between two networks and their SGD states, each relative to the
    first one's largest value: weights, BatchNorm running statistics, momentum buffers."""

    momentum = [
        (opt.state[p]["momentum_buffer"], twin_opt.state[q]["momentum_buffer"])
        for p, q in zip(net.weight_parameters(), twin.weight_parameters())
    ]
    return {
        "weight_diff_rel": largest_rel_diff(zip(net.parameters(), twin.parameters())),
        "running_stats_diff_rel": largest_rel_diff(zip(net.buffers(), twin.buffers())),
        "momentum_diff_rel": largest_rel_diff(momentum),
    }


def switched_section(
    device: torch.device,
    batch: int,
    layers: int,
    nodes: int,
    timed_steps: int,
    per_edge: bool = False,
    layout: torch.memory_format | None = None,
    primitives: tuple[str, ...] = (),
) -> dict:
    """The product's sampled W-step against the same step with every edge switched on the
    device (a ``space.cells.Switched`` plan of ``space.switched.switched_edge``), the
    network compiled whole with ``backend="cudagraphs"`` (the branches conditional nodes),
    at the DARTS-like size cut to
    ``layers`` cells of ``nodes`` nodes. ``per_edge``: the product's step with
    ``speed.sampled_graphs`` (``space.switched.SwitchedEdges``: only the edge is compiled,
    a graph pair per edge, the sums between them eager), so one trace serves every edge
    of a shape and stride: at the whole DARTS-like size 5 traces for 112 edges, where
    compiling the network whole traces every edge (on a 2-core Intel Xeon 6 s an edge,
    ten minutes for that size). ``layout``: the network's (default :func:`_setup`'s:
    channels-last on CUDA). ``primitives``: the op set (default the eight built-in ops;
    gpu_check --smoke names three, a third of the tracing). The switched step sets the
    gradients of the ops the host's path did not draw to None before clipping and SGD, so
    it moves what the product's step moves. Figures: ms per step, kernels and GPU busy of
    both; the compile and capture in its first 3 steps; the graphs traced and skipped and
    the inputs copied per replay (:func:`_compile_counts`); and from one start, one step
    of each along the same path: the loss, the weights, the BatchNorm running statistics
    and the momentum buffers, their largest relative differences."""
    import copy

    from asolab.space.switched import SwitchedEdges, SwitchedNetwork, switched_edge

    overrides = {"space.layers": layers, "space.steps": nodes}
    if primitives:
        overrides["space.primitives"] = list(primitives)
    cfg, net, wopt, _, speed, x, y = _setup(device, batch, layout, overrides)
    clip = cfg.search.grad_clip
    twin = copy.deepcopy(net)
    # setup's optimizer has a momentum buffer per parameter already (steps.optimizers)
    twin_opt = sc.steps.with_momentum_buffers(type(wopt)(twin.weight_parameters(), **wopt.defaults))
    sample = _sampler(net)
    if per_edge:  # the product's step: each edge compiled alone
        step_net, edges = twin, SwitchedEdges(device).bind(twin)
    else:  # the network compiled whole, the uncompiled edge function traced inline
        step_net = torch.compile(twin, backend="cudagraphs")
        edges = SwitchedNetwork(twin, switched_edge, device)
    before = _compile_counts()

    def switched_step(plans) -> torch.Tensor:
        return sc.steps.weight_step(step_net, speed, twin_opt, x, y, plans, clip, edges)[0]

    # one step of each from one start, along one path: the equivalence
    path = sample()
    eager_loss = sc.steps.weight_step(net, speed, wopt, x, y, path, clip)[0]
    start = time.perf_counter()
    switched_loss = switched_step(path)
    sync(device)
    out = {"cells": len(net.cells), "edges": sum(len(c.edges) for c in net.cells)}
    out["loss_diff"] = (eager_loss - switched_loss).abs().item()
    out.update(_differences(net, twin, wopt, twin_opt))
    for _ in range(2):
        switched_step(sample())
    sync(device)
    first = time.perf_counter() - start
    eager = lambda: sc.steps.weight_step(net, speed, wopt, x, y, sample(), clip)  # noqa: E731
    switched = lambda: switched_step(sample())  # noqa: E731
    for name, fn in (("eager", eager), ("switched", switched)):
        seconds = timed(fn, device, timed_steps, warmup=3)
        out[name] = {
            "ms_per_step": 1e3 * seconds,
            "images_per_s": batch / seconds,
            **profiled(fn, device),
        }
    out["speedup"] = out["eager"]["ms_per_step"] / out["switched"]["ms_per_step"]
    out["first_3_steps_s"] = first
    out.update(_counts_since(before))
    return out


def worker(device: torch.device, batch: int, seconds: float) -> None:
    """One of several processes on one GPU: W-steps for ``seconds``; prints images/s."""
    cfg, net, wopt, _, speed, x, y = _setup(device, batch)
    clip, sample = cfg.search.grad_clip, _sampler(net)
    fn = lambda: sc.steps.weight_step(net, speed, wopt, x, y, sample(), clip)  # noqa: E731, B023 (used at once)
    for _ in range(1 if QUICK else 10):
        fn()
    sync(device)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    sync(device)
    print(json.dumps({"images_per_s": n * batch / (time.perf_counter() - start)}), flush=True)


def workers_section(
    device: torch.device, counts, batch: int, seconds: float, in_process: bool = False
) -> dict:
    """``n`` worker processes at once for each ``n`` of ``counts``. ``in_process``
    (gpu_check --smoke, one worker): the worker's command line runs in this process and
    its printed line is read back alike, without a fresh process's ~7 s of imports."""
    out = {}
    for n in counts:
        argv = ["--worker", "--device", str(device)]
        argv += ["--batch", str(batch), "--seconds", str(seconds)] + (["--smoke"] if QUICK else [])
        if in_process:
            if n != 1:
                raise ValueError(f"in_process runs one worker, not {n}")
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                main(argv)
            outs = [printed.getvalue()]
        else:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True, env=env
                )
                for _ in range(n)
            ]
            outs = [p.communicate()[0] for p in procs]
        rates = [json.loads(o.strip().splitlines()[-1])["images_per_s"] for o in outs]
        out[f"{n}_workers"] = {"images_per_s": sum(rates), "per_worker": rates}
    return out


def default_run_section(device: torch.device, smoke: bool) -> dict:
    """The README's first command's run on the device (tracked, in an empty folder)."""
    overrides = ["--set", f"device={device}"]
    if smoke:
        overrides += ["--set", "search.cycles=1", "--set", "search.final_epochs=0"]
        overrides += ["--set", "data.train_subset=64", "--set", "space.init_channels=4"]
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "asolab.cli", "run", *overrides, "--quiet"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"asolab run exited {proc.returncode}: {proc.stderr[-800:]}")
    return {"command_s": seconds, "tail": proc.stdout.strip().splitlines()[-3:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--sections", default=",".join(ESTIMATE), help="comma-separated")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip what would not fit")
    ap.add_argument("--out", default="", help="write steps.json here")
    ap.add_argument(
        "--compile-modes", default="off,default,reduce-overhead", help="retrain's speed.compile"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=64, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    smoke = args.smoke
    if smoke:  # the DARTS-like size stays; only repeats and batches shrink
        sc.DARTS_LIKE = {**sc.DARTS_LIKE, "space.layers": 3, "space.steps": 2}
        global QUICK
        QUICK = True
    if args.worker:
        worker(device, args.batch, args.seconds)
        return 0
    sections: dict[str, Callable[[], dict]] = {
        "w_step": lambda: w_step_section(device, (2,) if smoke else (64, 256), 2 if smoke else 20),
        "alpha_step": lambda: alpha_section(device, 2 if smoke else 64, 2 if smoke else 20),
        "retrain": lambda: retrain_section(
            device,
            2 if smoke else 64,
            8 if smoke else 2560,
            ("off",) if smoke else tuple(args.compile_modes.split(",")),
        ),
        "growth": lambda: growth_section(device, 2 if smoke else 64),
        "workers": lambda: workers_section(
            device, (1, 2) if smoke else (1, 2, 4), 2 if smoke else 64, 2.0 if smoke else 12.0
        ),
        "default_run": lambda: default_run_section(device, smoke),
        "profile": lambda: profile_section(device, 2 if smoke else 64, args.out),
        "graphed": lambda: graphed_section(device, 2 if smoke else 64, 2 if smoke else 20),
        "op_costs": lambda: op_costs_section(
            device, *((2, 4, 8, 1) if smoke else (64, 16, 32, 30))
        ),
        "cond_graph": lambda: cond_graph_section(
            device, *((2, 4, 8, 2, 1) if smoke else (64, 16, 32, 14, 20))
        ),
    }
    wanted = [s for s in args.sections.split(",") if s]
    report: dict = {"before": sc.BEFORE, "device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    start = time.perf_counter()
    for name in wanted:
        left = args.budget_s - (time.perf_counter() - start)
        if not smoke and ESTIMATE[name] > left:
            report[name] = {
                "status": "skipped",
                "error": f"needs ~{ESTIMATE[name]} s, {left:.0f} left",
            }
            continue
        t0 = time.perf_counter()
        try:
            report[name] = {"status": "ok", **sections[name]()}
        except Exception as exc:  # one section's failure does not stop the others
            report[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[-1500:]}
        report[name]["seconds"] = time.perf_counter() - t0
        print(f"{name}: {json.dumps(report[name], default=str)}", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tag = "before" if sc.BEFORE else "after"
        (Path(args.out) / f"steps_{tag}.json").write_text(json.dumps(report, indent=2) + "\n")
    failed = [n for n in wanted if report.get(n, {}).get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

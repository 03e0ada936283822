"""One prepared check of asolab on a GPU: one command, one Markdown + JSON report.

    python bench/gpu_check.py                      # on a CUDA machine: its 560 s budget, ~9.5 min
    python bench/gpu_check.py --smoke --device cpu # CI: every section at a tiny size
    python bench/gpu_prepare.py                    # for a bare GPU machine with no network

Sections (each records its figures, or the error that stopped it):

1. ``device_tests``  the suite's placement tests on the real device
   (``ASOLAB_TEST_DEVICE=<device> pytest -m device``);
2. ``digits``        a digits run: images/s per phase and of the final network
   (training and inference), seconds per phase's loops and outside them, GPU
   utilisation sampled with nvidia-smi during W-training, peak CUDA memory;
   (the digits experiment turns cuDNN's timing off);
   ``digits_autotune_on`` the same with ``speed.cudnn_benchmark = true`` (the
   schema's default, timing the full batches' shapes); ``digits_autotune_all`` with
   ``speed.cudnn_benchmark_scope = "all"`` too; ``digits_autotune_limit3`` with
   timing on and at most 3 algorithms a shape
   (``torch.backends.cudnn.benchmark_limit``, torch's default 10);
   ``digits_contiguous`` the same with ``speed.channels_last = false`` (on the H100 a
   W-step's channels-last BatchNorm zero-filled 231 counters besides its own kernels);
   ``digits_graphs_on`` the same with ``speed.cuda_graphs = true``;
   ``digits_drop_last`` the same with ``data.drop_last = true``: every training step
   on a whole batch, about half the convolution shapes (254 against 116, counted on
   the CPU), so half the first sights;
   ``graphs_sequence`` the digits, Fashion-MNIST and CIFAR-like runs in one process
   with ``speed.cuda_graphs = true``, as a study worker runs trials: captures failed,
   and whether CUDA random numbers still work after each (what keeps it opt-in);
   ``digits_profile`` the default run under cProfile, the functions by own time (what
   a fresh process's first sight of each shape costs);
   ``first_sight`` what a convolution's first sight of a shape costs (ms, first call
   against the second), per layout, kind (pointwise, depthwise 3x3, 5x5, dilated) and
   cuDNN timing on or off: channels-last sends depthwise convolutions to cuDNN;
   ``digits_sampled_graphs`` the same with ``speed.sampled_graphs = true`` (what the
   default run would take with the switched W-step, its compiling paid);
3. ``steps``         the DARTS-like size (``bench/gpu_steps.py``): the sampled W-step at
   batch 64 and 256 (and 64 contiguous), the alpha step and eager W-retraining, each
   with CUDA kernels per step and GPU busy from torch.profiler;
   ``op_costs`` the ops a W-step launches most, one by one at its first cell's shape:
   microseconds per call forward and forward + backward, in both layouts, with the
   alternatives (the pointwise convolution as a matrix multiply, BatchNorm without
   running statistics) and the host's floor per op: where a host-bound step's time goes;
   ``switched_step`` the product's sampled W-step against the same step with each edge's
   op chosen on the device (a ``torch.cond`` per candidate op, BatchNorm statistics
   blended in outside the branches, the undrawn ops' gradients dropped from the host's
   path), the network compiled whole with ``backend="cudagraphs"``, at the DARTS-like
   first cell (14 edges): ms per step, kernels, compile seconds, and one step of each
   from one start (loss, weights, running statistics, momentum);
   ``switched_edges`` the same at the whole DARTS-like size (8 cells, 112 edges, the
   issue's W-step target), each edge compiled alone: one trace per edge shape and stride
   (5), a graph pair per edge, the sums between them eager;
   ``cond_graph`` whether a CUDA graph per cell can run a sampled step whatever path is
   drawn: two cells of 14 edges whose choices are a device tensor and whose ops are
   ``torch.cond`` branches, one cell function compiled with ``backend="cudagraphs"``
   (conditional nodes) for both, against the eager step of the drawn ops: ms per step,
   compile seconds, equality; again with the weights marked static (no input copies);
4. ``cifar_shape``   a run at a CIFAR-like shape (3x32x32, 10 classes, batch 256) on
   random images the check writes as ``data.name = "arrays"``: GPU utilisation during
   W-training against the 50% target (its mean, and after the first epoch, whose first
   sight of each shape a 3-epoch run's mean is mostly of: on the H100 its W-loops took
   13.8 s where the median epoch ran 1.0 s), images/s, peak memory (accuracy means
   nothing);
   ``cifar_shape_autotune_off`` the same with ``speed.cudnn_benchmark = false``: the
   first epoch without cuDNN's timing, the steady ones with its heuristics' kernels;
   ``cifar_shape_limit3`` the same with cuDNN's timing trying at most 3 algorithms a
   shape: on digits that cut the W-loops from 24.8 to 16.5 s (2026-11-28); here it says
   whether the steady epochs keep timing's kernels while the first epoch costs less;
   ``cifar_shape_graphs_on`` the same with ``speed.cuda_graphs = true``;
   ``cifar_shape_deterministic`` the same with ``speed.deterministic = true``: what
   deterministic kernels cost, and which ops had none (``nondeterministic``);
   ``cifar_shape_sampled_graphs`` the same with ``speed.sampled_graphs = true`` (the
   W-step of ``switched_edges`` in a run: GPU busy in W-training against the target);
5. ``graphed``       ``speed.cuda_graphs`` at the DARTS-like size, batch 64: W-retraining's
   step replayed as a CUDA graph pair against the eager step in the same process: ms
   per step, the first 5 steps (capture paid), kernels, GPU busy, peak memory, and the
   largest loss and weight differences after 5 steps from the same start (on the CPU
   the setting changes nothing: the same code runs eagerly);
   ``compile_default`` and ``compile_reduce_overhead``: W-retraining with
   ``speed.compile`` so set, the compile paid in an epoch of 2,560 images (CUDA only;
   on the last H100 "default" had not compiled after 170 s, so they run last among
   the new figures, within what the budget has left);
6. ``growth``        widen, deepen and branch on the device, each with max |delta logits|
   and its first training step against the steady ones (cuDNN re-benchmarks new shapes);
   ``growth_autotune_off`` the same with ``speed.cudnn_benchmark = false``;
7. ``fashion``       a short Fashion-MNIST run (28x28, dataset-fashion-mnist, or the
   copy ``--fashion-dir`` names), same figures;
8. ``study``         a 2-worker study on one GPU (both workers given the same device);
9. ``variants``      W-training images/s at the CIFAR-like shape: eager fp32 vs
   ``speed.autocast = "bf16"`` vs ``speed.channels_last``, interleaved;
10. ``workers``      aggregate W-step images/s of 1, 2 and 4 processes on one GPU.

They run in the order of the list above, the issue's targets first (the default
run's time, the W-step, GPU busy at the CIFAR-like shape), except that
``cifar_shape_autotune_off``, ``cifar_shape_limit3``, ``cifar_shape_sampled_graphs``,
``digits_sampled_graphs``,
``growth`` and
``growth_autotune_off`` come right after ``cifar_shape``;
``switched_step`` (the network compiled whole, for comparison) after ``growth``; and
``cond_graph`` (``switched_step``'s toy), then ``digits_autotune_limit3`` and
``cifar_shape_deterministic`` (levers) after ``cifar_shape_graphs_on``. On CUDA the
sections of ``torch.cond`` graphs (``switched_*``, ``cond_graph``, ``*_sampled_graphs``)
are skipped where torch has no conditional nodes
(before 2.12: on an H100 with 2.11 each capture failed). ``--budget-s`` skips a section
whose estimate no longer fits (a
10-minute call), so what was measured before comes last. A section in
a fresh process is stopped when the budget runs out, and the report is rewritten after
every section: a call cut short still leaves what it finished.

The report lands in ``--out`` (default ``bench/results/gpu_check``) as
``report.md`` and ``report.json``; the Markdown is printed too, and opens with the
digits runs side by side (seconds, and images/s per phase).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import gpu_steps
import numpy as np
import torch
from _common import interleaved, table

from asolab import config
from asolab.evolution import growth
from asolab.runner import Runner
from asolab.runner.device import describe_device, memory_format, resolve_device
from asolab.runner.events import Recorder
from asolab.runner.gpubusy import source_text
from asolab.runner.speed import Speed, build_network
from asolab.space.spec import ArchSpec
from asolab.space.switched import CONDITIONAL_NODES, ungraphable

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check"


class GpuSampler:
    """``nvidia-smi`` utilisation and memory, sampled every ``interval`` seconds in a thread."""

    def __init__(self, index: str, interval: float = 0.2) -> None:
        self.index, self.interval = index, interval
        self.samples: list[tuple[float, float, float]] = []  # (time, util %, memory MiB)
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"]
        while not self._stop.wait(self.interval):
            out = subprocess.run([*query, "-i", self.index], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip():
                util, mem = (v.strip().split()[0] for v in out.stdout.split(","))
                self.samples.append((time.perf_counter(), float(util), float(mem)))

    def __enter__(self) -> GpuSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join()

    def _inside(self, windows: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
        return [s for s in self.samples if any(a <= s[0] <= b for a, b in windows)]

    def during(
        self, windows: list[tuple[float, float]], loops: list[tuple[float, float]] = ()
    ) -> dict[str, float] | str:
        """Utilisation and memory over the samples inside ``windows``; and, from
        ``loops`` (each epoch's training loop, as timed), the mean over the loops after
        the first: the steady figure, without the first epoch's first sight of each
        shape (cuDNN's plans, kernel loading), which a short run's mean is mostly of."""
        inside = self._inside(windows)
        if not self.available:
            return "n/a (no nvidia-smi)"
        if not inside:
            return "n/a (no sample inside W-training)"
        out = {
            "util_mean_pct": statistics.mean(s[1] for s in inside),
            "util_max_pct": max(s[1] for s in inside),
            "memory_max_mib": max(s[2] for s in inside),
            "samples": len(inside),
        }
        per_loop = [[s[1] for s in self._inside([w])] for w in loops]
        out["util_mean_pct_per_epoch"] = [statistics.mean(u) if u else None for u in per_loop]
        steady = [u for samples in per_loop[1:] for u in samples]
        if steady:
            out["util_mean_pct_after_first_epoch"] = statistics.mean(steady)
            out["samples_after_first_epoch"] = len(steady)
        return out


class PhaseTimes(Recorder):
    """Epoch events with the wall-clock window each epoch's training loop ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.loops: dict[str, list[tuple[float, float]]] = {}

    def on_epoch_end(self, event) -> None:
        super().on_epoch_end(event)
        now = time.perf_counter()
        # EpochEnd comes after the epoch's evaluation; its loop took event.seconds, ending
        # now as far as a window can tell (late by the evaluation, short on a GPU)
        self.loops.setdefault(event.phase, []).append((now - event.seconds, now))

    def windows(self, phase: str) -> list[tuple[float, float]]:
        """``phase``'s loops, each from a second before it: nvidia-smi's figure is the
        busy share of its last sample period."""
        return [(start - 1.0, end) for start, end in self.loops.get(phase, [])]


def _gpu_index(device: torch.device) -> str:
    info = describe_device(device)
    return info.get("gpu_index", "0")


def untracked(device: torch.device, overrides: list[str]) -> config.ExperimentConfig:
    """The default experiment with ``overrides``, on ``device``, not tracked."""
    return config.load(None, ["tracking.enabled=false", f"device={device}", *overrides])


def run_section(device: torch.device, overrides: list[str], repeats: int = 10) -> dict:
    """One asolab run: images/s per phase and of the final network (``repeats`` timed
    batches after 2 warm-up ones; none under --smoke), utilisation, peak memory."""
    cfg = untracked(device, overrides)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rec = PhaseTimes()
    start = time.perf_counter()
    with GpuSampler(_gpu_index(device)) as sampler:
        runner = Runner(cfg, [rec])
        result = runner.run()
    seconds = time.perf_counter() - start
    phases: dict[str, list[float]] = {}
    loops: dict[str, float] = {}
    for e in rec.of("epoch_end"):
        phases.setdefault(e.phase, []).append(e.images_per_sec)
        loops[e.phase] = loops.get(e.phase, 0.0) + e.seconds
    net = runner.net.eval()
    plans = net.genotype_plans(result.genotype)
    x = runner.data.val.x[: cfg.data.eval_batch_size]
    with torch.no_grad():

        def infer() -> None:
            with runner.speed.autocast():
                net(x, plans)
            gpu_steps.sync(device)

        per_batch = interleaved({"final": infer}, repeats=repeats, warmup=2 if repeats > 1 else 0)[
            "final"
        ]
    return {
        "seconds": seconds,
        "val_acc": result.val_acc,
        "test_acc": result.test_acc,
        "images_per_sec": {p: statistics.median(v) for p, v in phases.items()},
        # where the run's seconds went: each phase's training loops, and the rest (data,
        # building, evaluation, calibration, mutation, growth, checkpoints)
        "loop_seconds": loops,
        "other_seconds": seconds - sum(loops.values()),
        "final_inference_images_per_sec": len(x) / per_batch,
        "gpu_during_w_train": sampler.during(rec.windows("w_train"), rec.loops.get("w_train", [])),
        # the run's own figure (runner/gpubusy.py: NVML's samples over each loop), to set
        # beside nvidia-smi's per epoch above; and its summary per phase
        "run_gpu_busy_w_train_per_epoch": [
            e.gpu_busy for e in rec.of("epoch_end") if e.phase == "w_train"
        ],
        "run_gpu_busy": rec.of("run_end")[-1].gpu_busy,
        # speed.deterministic: the ops torch warned have no deterministic kernel
        "nondeterministic": list(rec.of("run_end")[-1].nondeterministic),
        "peak_cuda_memory_mib": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        # speed.cuda_graphs: pairs captured, and captures that failed (then eager)
        "cuda_graphs": (
            {"captures": graphs.captures, "failures": graphs.failures}
            if (graphs := runner.speed.graphs) is not None
            else "off"
        ),
    }


def cifar_npz(workdir: Path, train: int, test: int) -> Path:
    """Random uint8 images at CIFAR-10's shape (3x32x32, 10 classes, balanced labels): the
    shape and batch set the GPU's load, the content does not."""
    g = np.random.default_rng(0)
    path = workdir / "cifar_shape.npz"
    np.savez(
        path,
        x_train=g.integers(0, 256, (train, 3, 32, 32), dtype=np.uint8),
        y_train=np.arange(train) % 10,
        x_test=g.integers(0, 256, (test, 3, 32, 32), dtype=np.uint8),
        y_test=np.arange(test) % 10,
    )
    return path


def cifar_overrides(overrides: list[str], shape: tuple, workdir: Path) -> list[str]:
    """A run's settings on random CIFAR-shaped arrays, written to ``workdir``."""
    return ["data.name=arrays", f"data.path={cifar_npz(workdir, *shape)}", *overrides]


def cifar_section(
    device: torch.device, overrides: list[str], shape: tuple, workdir: Path, repeats: int = 10
):
    """``run_section`` on random CIFAR-shaped arrays: W-training's GPU utilisation at batch
    256 is the figure (the target: at least 50%), after the first epoch too."""
    return run_section(device, cifar_overrides(overrides, shape, workdir), repeats)


def graphs_sequence_section(
    device: torch.device, runs: dict[str, list[str]], repeats: int = 10
) -> dict:
    """``runs`` one after another in this process with ``speed.cuda_graphs = true``, as a
    study worker runs its trials: per run, the graph pairs captured and failed, and
    whether the device's random numbers still work after it. On the first H100 a capture
    failed at the CIFAR-like shape after other runs in its process, and that process's
    CUDA random numbers failed from then on: what keeps the setting opt-in."""
    out: dict[str, dict] = {}
    for name, overrides in runs.items():
        try:
            figures = run_section(device, [*overrides, "speed.cuda_graphs=true"], repeats)
            out[name] = {"seconds": figures["seconds"], "cuda_graphs": figures["cuda_graphs"]}
        except Exception as exc:  # recorded: the question is whether later runs still work
            out[name] = {"error": str(exc)[:500]}
        try:
            torch.randn(4, device=device).sum().item()
            out[name]["random_numbers"] = "ok"
        except Exception as exc:
            out[name]["random_numbers"] = str(exc)[:300]
    return out


def profile_section(device: torch.device, overrides: list[str], top: int = 30) -> dict:
    """One untracked run under cProfile: where a fresh process's seconds go (first sight
    of each shape: cuDNN's plans, kernel loading), as the ``top`` functions by their own
    time: ``[function, calls, own s, cumulative s]``. cProfile slows Python code, not the
    calls that wait on the device or the driver."""
    import cProfile
    import pstats

    cfg = untracked(device, overrides)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    Runner(cfg).run()
    profile.disable()
    seconds = time.perf_counter() - start
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, _, own, cumulative, _)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {
        "seconds_profiled": seconds,
        "top_own_time": [
            [f"{Path(f).name}:{line}({fn})", calls, round(own, 3), round(cum, 3)]
            for (f, line, fn), (_, calls, own, cum, _) in rows
        ],
    }


def growth_section(
    device: torch.device, init_channels: int, steps: int = 4, autotune: bool = True
) -> dict:
    """Each growth kind on the device: the function it preserves, as max |delta logits|,
    and its first step against the steady ones with cuDNN's autotuning on or off."""
    cfg = config.load(None, [f"space.init_channels={init_channels}"])
    torch.manual_seed(0)
    spec = ArchSpec.from_config(cfg.space, 1, 10)
    net = build_network(spec, device, memory_format(True, device, spec))
    x = torch.randn(64, 1, 8, 8, device=device)
    # the network trained before any growth: its first step is the process's first sight
    # of every shape (on the H100 a widen measured first cost 3.3 s, 505 steady steps)
    out = {"before": _first_steps(net.train(), net.derive(), x, device, steps, autotune)}
    for kind in growth.KINDS:
        net.eval()
        genotype = net.derive()
        with torch.no_grad():
            before = net(x, net.genotype_plans(genotype))
            morph = growth.propose(net, kind, 1.0)
            after = morph.net.eval()(x, morph.net.genotype_plans(morph.carry(genotype)))
        params = [p for p in morph.net.parameters()]
        out[kind] = {
            "where": morph.where,
            "max_abs_delta_logits": growth.preservation_error(before, after),
            "on_device": all(p.device.type == device.type for p in params),
            **_first_steps(morph.net.train(), morph.carry(genotype), x, device, steps, autotune),
        }
        net = morph.net
    return out


def _first_steps(
    net, genotype, x: torch.Tensor, device: torch.device, steps: int, autotune: bool
) -> dict[str, float]:
    """The first training step of a grown network against the steady ones: new
    convolution shapes are timed by cuDNN's autotuning on first sight."""
    speed = Speed(config.SpeedConfig(cudnn_benchmark=autotune), device)
    opt = torch.optim.SGD(net.weight_parameters(), lr=0.01)
    y = torch.zeros(len(x), dtype=torch.long, device=device)
    plans = net.genotype_plans(genotype)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, _ = speed.forward_loss(net, x, y, plans)
        speed.step(loss, opt)
        gpu_steps.sync(device)
        seconds.append(time.perf_counter() - start)
    return {"first_step_s": seconds[0], "steady_step_s": statistics.median(seconds[1:])}


STUDY = """
experiment = "digits"
n_trials = {trials}
seed = 0
[overrides]
device = "{device}"
threads = 1
space.init_channels = 4
search.cycles = 1
search.w_epochs = 1
search.alpha_epochs = 1
search.retrain_epochs = 1
search.final_epochs = 0
data.train_subset = {subset}
[sampler]
name = "random"
[pruner]
name = "none"
[params.mutation.strength]
low = 0.0
high = 1.0
"""


def study_section(
    device: torch.device,
    workdir: Path,
    trials: int,
    subset: int,
    log_models: bool = True,
    workers: int = 2,
) -> dict:
    """``asolab study --workers 2`` with both workers on the one GPU (``--gpus I,I``). The
    workers are processes of their own; the parent that starts them runs in this one (its
    imports are paid already), its output captured as a subprocess's would be. --smoke
    runs one worker, which is this process: two fresh workers cost some 35 s of CPU in
    imports alone, and tests/test_study.py covers ``--workers 2`` on the CPU already."""
    from asolab import cli

    file = workdir / "gpu_check_study.toml"
    text = STUDY.format(trials=trials, device=device, subset=subset)
    if not log_models:  # --smoke: the model's MLflow flavour is not what this section checks
        text = text.replace("[sampler]", "tracking.log_models = false\n[sampler]")
    file.write_text(text)
    gpu = _gpu_index(device) if device.type == "cuda" and workers > 1 else ""
    argv = [
        *("study", str(file), "--workers", str(workers)),
        *("--storage", str(workdir / "optuna.log")),
        *("--tracking-uri", f"sqlite:///{workdir / 'mlflow.db'}"),
        *(["--gpus", f"{gpu},{gpu}"] if gpu else []),
    ]
    start = time.perf_counter()
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        code = cli.main(argv)
    seconds = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"study exited {code}: {captured.getvalue().strip()[-500:]}")
    from mlflow import MlflowClient

    from asolab.tracking import layout as L

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = [r for r in client.search_runs(ids) if r.data.tags.get(L.TAG_RUN_KIND) == L.KIND_RUN]
    devices = sorted(
        {
            f"{r.data.tags.get(L.TAG_DEVICE)} "
            f"{r.data.tags.get(L.TAG_DEVICE_INFO + 'gpu_name', '')}".strip()
            for r in runs
        }
    )
    return {"seconds": seconds, "trial_runs": len(runs), "devices": devices}


def variants_section(
    device: torch.device, init_channels: int, batch: int, repeats: int, warmup: int = 3
) -> dict:
    """W-training steps per second, eager fp32 vs bf16 autocast vs channels-last."""
    variants = {
        "eager": {"channels_last": False, "autocast": "off"},
        "bf16": {"channels_last": False, "autocast": "bf16"},
        "channels_last": {"channels_last": True, "autocast": "off"},
    }
    cfg = config.load(None, [f"space.init_channels={init_channels}"])
    spec = ArchSpec.from_config(cfg.space, 3, 10)  # the CIFAR-like shape of cifar_shape
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    steps: dict[str, Callable[[], None]] = {}
    for name, speed_cfg in variants.items():
        torch.manual_seed(0)
        net = build_network(spec, device, memory_format(speed_cfg["channels_last"], device, spec))
        speed = Speed(config.SpeedConfig(**speed_cfg), device)
        opt = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)

        def step(net=net, speed=speed, opt=opt) -> None:
            loss, _ = speed.forward_loss(net, x, y, net.sample_plans(1.0, differentiable=False))
            speed.step(loss, opt, net.weight_parameters(), 5.0)
            gpu_steps.sync(device)

        steps[name] = step
    seconds = interleaved(steps, repeats=repeats, warmup=warmup)
    return {name: {"images_per_sec": batch / s} for name, s in seconds.items()}


# cuDNN's timing on, as the schema's default has it (the digits experiment turns it off)
TIMED = ["speed.cudnn_benchmark=true"]

# rough seconds per section on an H100, for --budget-s
ESTIMATE_S = {
    # 39 and 46 s on the H100 (2026-11-27); since then GPU busy (6 s) and two deterministic runs
    "device_tests": 65,
    "digits": 45,
    "digits_autotune_on": 45,
    "digits_autotune_all": 45,
    "digits_autotune_limit3": 45,
    "digits_contiguous": 45,
    "digits_graphs_on": 45,
    "digits_drop_last": 40,
    "cifar_shape_graphs_on": 40,
    "cifar_shape_sampled_graphs": 45,
    "digits_sampled_graphs": 60,
    "digits_profile": 55,
    "first_sight": 30,
    "graphs_sequence": 80,
    "fashion": 70,
    "cifar_shape": 30,
    "cifar_shape_autotune_off": 30,
    "cifar_shape_limit3": 30,
    "cifar_shape_deterministic": 30,
    "growth": 15,
    "growth_autotune_off": 15,
    "study": 60,
    "variants": 20,
    "steps": 120,
    "op_costs": 20,
    "switched_step": 90,
    "switched_edges": 100,
    "cond_graph": 75,
    "graphed": 30,
    # tried with whatever is left: how long compiling takes is the figure
    "compile_default": 60,
    "compile_reduce_overhead": 60,
    "workers": 90,
}


def steps_section(device: torch.device, smoke: bool) -> dict:
    """The DARTS-like size's steps (bench/gpu_steps.py), kernels and GPU busy with them."""
    return {
        "w_step": gpu_steps.w_step_section(
            device, (2,) if smoke else (64, 256), 2 if smoke else 20
        ),
        "alpha_step": gpu_steps.alpha_section(device, 2 if smoke else 64, 2 if smoke else 20),
        "retrain": gpu_steps.retrain_section(
            device, 2 if smoke else 64, 8 if smoke else 2560, ("off",)
        ),
    }


def device_tests(device: torch.device, smoke: bool) -> dict:
    """The suite's placement tests on this device."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "device",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
    ]
    # the placement tests use no fixture of tests/conftest.py, whose MLflow store template
    # is most of a short run's time
    cmd += ["--noconftest", str(ROOT / "tests" / "test_device_placement.py")]
    env = {**os.environ, "ASOLAB_TEST_DEVICE": str(device)}
    if smoke:  # CI: enough to see the switch and the file work
        cmd += ["-k", "gumbel or data_batches"]
        # and only the plugins the suite's options name: hypothesis, anyio, benchmark and
        # cov, loaded from their entry points, are half of a 2-test run's CPU
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        cmd += ["-p", "xdist", "-p", "timeout"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if proc.returncode != 0:
        raise RuntimeError(f"device tests failed: {last}\n{proc.stdout[-3000:]}")
    return {"seconds": time.perf_counter() - start, "summary": last}


def sizes(smoke: bool) -> dict:
    if smoke:
        tiny = ["threads=1", "space.init_channels=4", "search.cycles=1", "search.w_epochs=1"]
        tiny += ["search.alpha_epochs=1", "search.retrain_epochs=1", "search.final_epochs=1"]
        return {
            "digits": [*tiny, "data.train_subset=96"],
            "fashion": [
                "data.name=fashion_mnist",
                *tiny,
                "data.train_subset=64",
                "space.stem_stride=2",
                "search.final_epochs=0",  # its final stage trains on all 54000 images
            ],
            "cifar_shape": (tiny + ["data.batch_size=16", "search.final_epochs=0"], (64, 20)),
            "infer_repeats": 1,  # and no warm-up
            "op_costs": (2, 4, 8, 1),  # batch, channels, image, calls
            "first_sight": (4, 8, 1),  # channels, image, new shapes per kind
            "switched_step": (2, 1, 1, 1),  # batch, cells, nodes, steps
            "switched_edges": (2, 1, 1, 1, True),  # and per edge
            # the switched sections' op set: zeros, identity and a convolution branch
            # trace in a third of the eight ops' time (CI's CPU; a GPU runs all eight)
            "switched_primitives": ("none", "skip_connect", "sep_conv_3x3"),
            "cond_graph": (2, 4, 8, 2, 1),  # batch, channels, image, edges, steps
            "growth": (4, 2),  # channels; steps: the first and one steady
            "study": (2, 64, False, 1),  # no MLflow model logged; one worker, in-process
            "variants": (4, 16, 1, 0),  # one interleaved repeat, no warm-up
            "workers": ((1,), 2, 0.2, True),  # one worker, in this process
        }
    return {
        "digits": [],  # the shipped default experiment, on the GPU
        "fashion": [
            "data.name=fashion_mnist",
            "space.init_channels=16",
            "space.stem_stride=2",
            "data.train_subset=10000",
            "data.batch_size=128",
            "search.cycles=2",
            "search.final_epochs=2",
        ],
        "cifar_shape": (
            ["data.batch_size=256", "space.init_channels=16", "search.cycles=1"]
            + ["search.warmup_epochs=0", "search.w_epochs=3", "search.final_epochs=1"],
            (12800, 2000),  # 40 W-training batches of 256 per epoch
        ),
        "infer_repeats": 10,
        "op_costs": (64, 16, 32, 30),  # the DARTS-like first cell's shape
        "first_sight": (16, 32, 3),
        "switched_step": (64, 1, 4, 20),  # the DARTS-like first cell: 14 edges, 16 channels
        "switched_edges": (64, 8, 4, 20, True),  # the DARTS-like size: 112 edges
        "switched_primitives": (),  # the eight built-in ops
        "cond_graph": (64, 16, 32, 14, 20),  # cells of 14 edges at that shape
        "growth": (16, 4),
        "study": (4, 300),
        "variants": (16, 256, 20),
        "workers": ((1, 2, 4), 64, 12.0),
    }


def digits_runs(sections: dict) -> list[str]:
    """The default digits run under each setting, one row each: the figures that choose
    ``speed.cudnn_benchmark``'s scope (and say whether the default run fits its 20 s)."""
    runs = {n: s for n, s in sections.items() if n.startswith("digits") and "images_per_sec" in s}
    if not runs:
        return []
    phases = ("w_train", "alpha", "retrain", "final")
    rows = [
        [n, f"{s['seconds']:.1f}", f"{s['other_seconds']:.1f}"]
        + [f"{s['images_per_sec'].get(p, 0):.0f}" for p in phases]
        for n, s in runs.items()
    ]
    head = ["run", "s", "outside loops s", *(f"{p} img/s" for p in phases)]
    return ["## digits runs side by side", "", "```", table(head, rows), "```", ""]


def op_costs_table(section: dict) -> str:
    """The op_costs section as a table: one row per op and layout, microseconds per call
    (kernels and GPU busy from the profiler, on CUDA only)."""
    rows = []
    for name, v in section.items():
        if isinstance(v, dict):
            kernels = f"{v['kernels_per_step']:.1f}" if "kernels_per_step" in v else "-"
            busy = f"{100 * v['gpu_busy']:.0f}%" if "gpu_busy" in v else "-"
            times = [f"{v['forward_us']:.0f}", f"{v['forward_backward_us']:.0f}"]
            rows.append([name, *times, kernels, busy])
    head = ["op, layout", "forward us", "fwd+bwd us", "kernels fwd+bwd", "GPU busy"]
    return (
        f"{table(head, rows)}\n"
        f"floor: {section['floor_us']:.1f} us a call (one elementwise op on one number)\n"
        f"1x1 as matmul against the convolution: {section['matmul_max_diff']:.1e} (relative)"
    )


def markdown(report: dict) -> str:
    lines = [
        f"# asolab GPU check: {report['device']} ({report['device_info'] or 'no GPU'})",
        "",
        f"torch {report['torch']}, {report['when']}, {report['seconds']:.0f} s in all"
        + (" (smoke sizes)" if report["smoke"] else "")
        + ("" if report.get("bytecode_written", True) else "; no bytecode written")
        + f"; CUDA {report.get('cuda_version')}, conditional nodes "
        + ("yes" if report.get("conditional_nodes") else "no")
        + (f"; GPU busy from {report['gpu_busy_source']}" if "gpu_busy_source" in report else ""),
        "",
        *digits_runs(report["sections"]),
    ]
    for name, section in report["sections"].items():
        lines.append(
            f"## {name} ({section.get('status')}, {section.get('seconds_total', 0):.1f} s)"
        )
        lines.append("")
        if section["status"] != "ok":
            lines += ["```", section.get("error", ""), "```", ""]
            continue
        body = {k: v for k, v in section.items() if k not in ("status", "seconds_total")}
        if name == "op_costs":
            lines += ["```", op_costs_table(body), "```", ""]
            continue
        if name == "variants":
            rows = [(k, v["images_per_sec"]) for k, v in body.items()]
            lines += ["```", table(["variant", "W-train images/s"], rows), "```", ""]
            continue
        lines += ["```", json.dumps(body, indent=2, default=str), "```", ""]
    return "\n".join(lines)


# the runs, each in a fresh process on a GPU: in one process only the first run paid for
# cuDNN's timing and loading of every kernel (on an H100 the default run took 41 s first,
# then 5-8 s), so side-by-side figures from one process compare unlike things
FRESH = frozenset(
    {"digits", "digits_autotune_on", "digits_autotune_all", "digits_autotune_limit3"}
    | {"digits_contiguous", "digits_graphs_on", "digits_drop_last", "fashion"}
    | {"compile_default", "compile_reduce_overhead", "cond_graph", "switched_step"}
    | {"switched_edges"}
    | {"cifar_shape", "cifar_shape_graphs_on", "cifar_shape_sampled_graphs"}
    | {"cifar_shape_autotune_off", "cifar_shape_deterministic", "cifar_shape_limit3"}
    | {"digits_sampled_graphs", "digits_profile", "growth", "growth_autotune_off"}
    | {"graphs_sequence"}
)


# sections skipped off CUDA: runs that differ from another section's only by a setting
# that changes nothing there (speed.cuda_graphs, cuDNN's timing, scope and limit) or whose
# question is a GPU's (the layout's BatchNorm kernels; bench/final_speed.py weighs
# layouts on the CPU; data.drop_last's shapes, which only a GPU pays for; tests cover
# the setting), and torch.compile's, minutes of CI on 2 cores
# (tests/test_step_cost.py compiles W-retraining's network)
CUDA_ONLY = frozenset(
    {"digits_graphs_on", "cifar_shape_graphs_on", "cifar_shape_sampled_graphs"}
    | {"cifar_shape_autotune_off", "cifar_shape_deterministic", "cifar_shape_limit3"}
    | {
        "digits_sampled_graphs",
        "digits_autotune_all",
        "digits_autotune_limit3",
        "digits_contiguous",
        "digits_drop_last",
    }
    | {"compile_default", "compile_reduce_overhead", "graphs_sequence"}
)


# sections whose question is a CUDA graph of torch.cond branches: on CUDA they need
# conditional nodes (torch 2.12; with torch 2.11 on an H100 each capture failed)
CONDITIONAL = frozenset(
    {"switched_edges", "switched_step", "cond_graph"}
    | {"cifar_shape_sampled_graphs", "digits_sampled_graphs"}
)


def why_skipped(
    name: str, device: torch.device, skip: set[str], left_s: float | None
) -> str | None:
    """Why section ``name`` does not run here, or None: named in ``--skip``, a question
    for CUDA off it, CUDA graphs of ``torch.cond`` on a torch without conditional
    nodes, or more than the ``left_s`` seconds the budget has left (None: no budget)."""
    if name in skip:
        return "--skip"
    if name in CUDA_ONLY and device.type != "cuda":
        return "needs CUDA"
    if name in CONDITIONAL and (why := ungraphable(device)) is not None:
        return why
    if left_s is not None and ESTIMATE_S.get(name, 30) > left_s:
        return f"{left_s:.0f} s left"
    return None


def with_benchmark_limit(limit: int, section: Callable[[], dict]) -> dict:
    """``section``'s figures with cuDNN timing at most ``limit`` algorithms per shape."""
    before = torch.backends.cudnn.benchmark_limit
    torch.backends.cudnn.benchmark_limit = limit
    try:
        return {**section(), "cudnn_benchmark_limit": limit}
    finally:
        torch.backends.cudnn.benchmark_limit = before


def fresh_section(name: str, argv: list[str] | None, deadline_s: float) -> dict:
    """Section ``name`` run by this script in a fresh process, stopped after ``deadline_s``;
    its figures as it wrote them."""
    args = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, __file__, *args, "--same-process", "--out", out, "--budget-s", "1e9"]
        cmd += ["--skip", ",".join(n for n in ESTIMATE_S if n != name)]
        # a session of its own: a stop takes its children too (compile workers, nvidia-smi)
        pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
        with subprocess.Popen(cmd, start_new_session=True, **pipes) as proc:
            try:
                _, err = proc.communicate(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                stop = f"stopped after {deadline_s:.0f} s, what the budget had left"
                raise RuntimeError(stop) from None
        report = Path(out) / "report.json"
        if not report.exists():
            raise RuntimeError(f"exit {proc.returncode}: {err[-1500:]}")
        section = json.loads(report.read_text())["sections"][name]
    if section["status"] != "ok":
        raise RuntimeError(section.get("error", "failed"))
    return {k: v for k, v in section.items() if k not in ("status", "seconds_total")}


def write_report(out: Path, report: dict, seconds: float) -> str:
    """``report.json`` and ``report.md`` in ``out`` as they stand; the Markdown."""
    report["seconds"] = seconds
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = markdown(report)
    (out / "report.md").write_text(text + "\n")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for report.md and report.json")
    p.add_argument("--skip", default="", help="sections to skip, comma-separated")
    p.add_argument(
        "--budget-s", type=float, default=560.0, help="skip what would not fit in this many s"
    )
    p.add_argument(
        "--fashion-dir",
        default="",
        help="Fashion-MNIST's idx files (default: Debian's dataset-fashion-mnist; "
        "bench/gpu_prepare.py writes a copy for a machine without it)",
    )
    p.add_argument(
        "--same-process",
        action="store_true",
        help="run every section in this process (by default on a GPU each run section "
        "gets a fresh one, so that each pays its own first sight of every shape)",
    )
    return p.parse_args(argv)


def section_table(
    device: torch.device, args: argparse.Namespace, size: dict, workdir: Path
) -> dict[str, Callable[[], dict]]:
    """Every section by name, in the order they run, each a function giving its figures."""
    repeats = size["infer_repeats"]
    fashion_dir = [f"data.data_dir={args.fashion_dir}"] if args.fashion_dir else []

    def digits_with(*settings: str) -> Callable[[], dict]:
        """The default digits run with ``settings`` more."""
        return lambda: run_section(device, [*size["digits"], *settings], repeats)

    def cifar_with(setting: str) -> Callable[[], dict]:
        """The CIFAR-like run with one setting more."""
        settings, sizes = size["cifar_shape"]
        return lambda: cifar_section(device, [*settings, setting], sizes, workdir, repeats)

    return {
        "device_tests": lambda: device_tests(device, args.smoke),
        "digits": digits_with(),
        # the same run with cuDNN's autotuning, which the digits experiment turns off (a
        # short run meets most convolution shapes once: 45 s on an H100 against 30 s)
        "digits_autotune_on": digits_with(*TIMED),
        # cuDNN times every shape, not only the full batches'
        "digits_autotune_all": digits_with(*TIMED, "speed.cudnn_benchmark_scope=all"),
        # the same run in the contiguous layout: other BatchNorm and convolution kernels
        "digits_contiguous": digits_with("speed.channels_last=false"),
        # the same run without each epoch's last, smaller batch: half the shapes to meet
        "digits_drop_last": digits_with("data.drop_last=true"),
        # the same run with CUDA graphs of the fixed phases (opt-in)
        "digits_graphs_on": digits_with("speed.cuda_graphs=true"),
        # runs in one process with CUDA graphs, as a study worker has them: whether a
        # capture fails and leaves the process's random numbers broken (the H100 once did)
        "graphs_sequence": lambda: graphs_sequence_section(
            device,
            {
                "digits": size["digits"],
                "fashion": [*size["fashion"], *fashion_dir],
                "cifar_shape": cifar_overrides(*size["cifar_shape"], workdir),
            },
            repeats,
        ),
        # the default run under cProfile: what a fresh process's first sight costs
        "digits_profile": lambda: profile_section(device, size["digits"]),
        # a convolution's first sight of a shape, per layout, kind and cuDNN timing
        "first_sight": lambda: gpu_steps.first_sight_section(device, *size["first_sight"]),
        "steps": lambda: steps_section(device, args.smoke),
        "op_costs": lambda: gpu_steps.op_costs_section(device, *size["op_costs"]),
        # the W-step target's size first: the lever the product would ship
        # channels-last everywhere (CUDA's layout): the branches must agree on strides
        "switched_edges": lambda: gpu_steps.switched_section(
            device,
            *size["switched_edges"],
            layout=torch.channels_last,
            primitives=size["switched_primitives"],
        ),
        "cifar_shape": lambda: cifar_section(device, *size["cifar_shape"], workdir, repeats),
        # its first epoch's first sight without cuDNN's timing, against its steady epochs
        "cifar_shape_autotune_off": cifar_with("speed.cudnn_benchmark=false"),
        # timing with fewer algorithms a shape: a cheaper first epoch, the same kernels?
        "cifar_shape_limit3": lambda: with_benchmark_limit(
            3, lambda: cifar_section(device, *size["cifar_shape"], workdir, repeats)
        ),
        # W-training's edges switched on the device, in a run (a lever for GPU busy)
        "cifar_shape_sampled_graphs": cifar_with("speed.sampled_graphs=true"),
        # the default run with it: whether compiling pays back within a short run
        "digits_sampled_graphs": digits_with("speed.sampled_graphs=true"),
        # after a growth, cuDNN meets new shapes (its scope decides which it times)
        "growth": lambda: growth_section(device, *size["growth"]),
        # the same without cuDNN's autotuning: what a growth costs when nothing is timed
        "growth_autotune_off": lambda: growth_section(device, *size["growth"], autotune=False),
        # the switched step with the network compiled whole: one graph against a pair an edge
        "switched_step": lambda: gpu_steps.switched_section(
            device, *size["switched_step"], primitives=size["switched_primitives"]
        ),
        "cifar_shape_graphs_on": cifar_with("speed.cuda_graphs=true"),
        # the toy of switched_step (copied vs static weights, one trace for two cells)
        "cond_graph": lambda: gpu_steps.cond_graph_section(device, *size["cond_graph"]),
        # fewer algorithms timed a shape: a cheaper first sight, perhaps slower kernels
        # (a lever, not a target's figure: it runs once the targets' sections have)
        "digits_autotune_limit3": lambda: with_benchmark_limit(3, digits_with(*TIMED)),
        # speed.deterministic's cost: deterministic kernels, cuDNN's timing off (a setting
        # to weigh, not a target's figure)
        "cifar_shape_deterministic": cifar_with("speed.deterministic=true"),
        # W-retraining's step as a CUDA graph pair against the eager one
        "graphed": lambda: gpu_steps.graphed_section(
            device, 2 if args.smoke else 64, 2 if args.smoke else 20
        ),
        "compile_default": lambda: gpu_steps.retrain_section(device, 64, 2560, ("default",)),
        "compile_reduce_overhead": lambda: gpu_steps.retrain_section(
            device, 64, 2560, ("reduce-overhead",)
        ),
        "fashion": lambda: run_section(device, [*size["fashion"], *fashion_dir], repeats),
        "study": lambda: study_section(device, workdir, *size["study"]),
        "variants": lambda: variants_section(device, *size["variants"]),
        "workers": lambda: gpu_steps.workers_section(device, *size["workers"]),
    }


def header(device: torch.device, smoke: bool) -> dict:
    """The report's machine and software, its sections to come."""
    return {
        "device": str(device),
        "device_info": describe_device(device),
        "torch": torch.__version__,
        # false: each fresh process compiles the modules it imports again (gpu_prepare.py)
        "bytecode_written": not sys.dont_write_bytecode,
        # whether this torch can capture torch.cond as CUDA graph conditional nodes (what
        # switched_step and cond_graph try; the CUDA toolkit must be 12.4 or newer as well)
        "cuda_version": torch.version.cuda,
        "conditional_nodes": CONDITIONAL_NODES,
        # where a run's own GPU busy figure comes from (runner/gpubusy.py), or why none
        "gpu_busy_source": source_text(device),
        "smoke": smoke,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "sections": {},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    size = sizes(args.smoke)
    skip = {s for s in args.skip.split(",") if s}
    start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="asolab-gpu-check-"))
    out = Path(args.out)
    sections = section_table(device, args, size, workdir)
    report = header(device, args.smoke)
    gpu_steps.QUICK = args.smoke
    if args.smoke:  # the DARTS-like size's steps at three cells, two nodes: the same code, tiny
        gpu_steps.sc.DARTS_LIKE = {**gpu_steps.sc.DARTS_LIKE, "space.layers": 3, "space.steps": 2}
    try:
        for name, fn in sections.items():
            left = args.budget_s - (time.perf_counter() - start)
            why = why_skipped(name, device, skip, None if args.smoke else left)
            if why is not None:
                report["sections"][name] = {"status": "skipped", "error": why}
                continue
            t0 = time.perf_counter()
            try:
                fresh = name in FRESH and device.type == "cuda" and not args.same_process
                figures = fresh_section(name, argv, max(left, 1.0)) if fresh else fn()
                section = {"status": "ok", **figures}
            except Exception as exc:  # recorded in the report: one section does not stop the rest
                section = {"status": "failed", "error": f"{exc}\n{traceback.format_exc()[-2000:]}"}
            section["seconds_total"] = time.perf_counter() - t0
            report["sections"][name] = section
            print(f"{name}: {section['status']} ({section['seconds_total']:.1f} s)", flush=True)
            write_report(out, report, time.perf_counter() - start)
    finally:
        gpu_steps.QUICK = False
        shutil.rmtree(workdir, ignore_errors=True)
    text = write_report(out, report, time.perf_counter() - start)
    print(text)
    print(f"report: {out / 'report.md'} and {out / 'report.json'}")
    failed = [n for n, s in report["sections"].items() if s["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

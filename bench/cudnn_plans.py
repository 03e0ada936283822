"""cuDNN's plans in a run, per ``speed.cudnn_benchmark_scope``: which ones it times.

    python bench/cudnn_plans.py            # the default digits run, once per scope (~1 min each)
    python bench/cudnn_plans.py --scopes off --set data.drop_last=true   # with a setting
    python bench/cudnn_plans.py --smoke    # CI: a tiny run

torch keeps one cuDNN plan per operation (forward, backward-data, backward-filter)
and shapes for the whole process, timed or taken from cuDNN's heuristics as
``torch.backends.cudnn.benchmark`` said when the shape was first seen: the switch
is not in the cache's key (``run_single_conv`` in torch's
``aten/src/ATen/native/cudnn/Conv_v8.cpp``). So on a GPU the first sight of a
shape decides, for good, and a short run meets most of its shapes once.

This models that cache on the CPU: the run's ``Speed`` is told it runs on CUDA
(so that it sets the switch, which the CPU's kernels ignore), and a dispatch mode
records each convolution's plan and the switch at its first sight. Per scope it
prints the plans, those timed, and the convolutions that ran a timed plan: those of
full training batches (gradients on, or backward) and the rest. Counts, not
timings: the same on every machine. The plans per batch size follow the table
(an epoch's last, smaller batch makes plans of its own: ``data.drop_last``). The
last line is the headline.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import table
from torch.utils._python_dispatch import TorchDispatchMode

from asolab import config
from asolab.runner import Runner
from asolab.runner.speed import Speed

# the tiny run of --smoke (and of tests/test_speed.py): 2 full batches of 32 and a last
# one of 16; evaluation in full batches too, and a widen, whose evaluation meets the
# grown cell's shapes before W-retraining's steps do
TINY = ["threads=1", "space.init_channels=4", "search.cycles=1", "search.final_epochs=0"]
TINY += ["search.w_epochs=1", "search.alpha_epochs=1", "search.retrain_epochs=1"]
TINY += ["data.train_subset=80", "data.batch_size=32", "data.eval_batch_size=32"]
TINY += ["growth.policy=widen"]

SCOPES = {
    "all": config.SpeedConfig(cudnn_benchmark_scope="all"),
    "full-batch": config.SpeedConfig(cudnn_benchmark_scope="full-batch"),
    "off": config.SpeedConfig(cudnn_benchmark=False),
}


class PlanCache(TorchDispatchMode):
    """cuDNN's plan cache as torch keeps it: one plan per operation and shapes, timed or
    taken from the heuristics as ``torch.backends.cudnn.benchmark`` said at its first
    sight. ``calls``: per convolution, (of a full batch, its plan timed, in a training
    step: gradients on, or a backward pass)."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch
        self.timed: dict[tuple, bool] = {}
        self.calls: list[tuple[bool, bool, bool]] = []

    def _see(self, op: str, x: torch.Tensor, w: torch.Tensor, conv: tuple) -> None:
        # torch's key also holds the layout the convolution runs in; one run runs in one
        # (strides are not it: a 1-channel batch's differ between a slice and a gather)
        key = (op, tuple(x.shape), tuple(w.shape), conv)
        timed = self.timed.setdefault(key, torch.backends.cudnn.benchmark)
        training = torch.is_grad_enabled() or op != "forward"
        self.calls.append((len(x) == self.batch, timed, training))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        aten = torch.ops.aten
        if func is aten.convolution.default:
            x, w, _bias, *conv = args
            self._see("forward", x, w, tuple(map(str, conv)))
        elif func is aten.convolution_backward.default:
            _grad, x, w, _bias_sizes, *conv, mask = args
            for op, wanted in zip(("data", "filter"), mask[:2]):
                if wanted:
                    self._see(op, x, w, tuple(map(str, conv)))
        return func(*args, **(kwargs or {}))


def plans_seen(speed: config.SpeedConfig, overrides: list[str]) -> PlanCache:
    """A CPU run of the default experiment with ``overrides``, its Speed told it runs on
    CUDA, through :class:`PlanCache`."""
    cfg = config.load(None, ["device=cpu", "tracking.enabled=false", *overrides])
    runner = Runner(cfg)
    runner.speed = Speed(speed, torch.device("cuda"), cfg.data.batch_size)
    runner.speed.watch(runner.net)
    cache = PlanCache(cfg.data.batch_size)
    before = torch.backends.cudnn.benchmark
    try:
        with cache:
            runner.run()
    finally:
        torch.backends.cudnn.benchmark = before
    return cache


def summary(cache: PlanCache) -> dict[str, int]:
    """The counts a row prints."""

    def calls(full_training: bool, timed: bool) -> int:
        return sum(
            (full and training) == full_training and t == timed for full, t, training in cache.calls
        )

    return {
        "plans": len(cache.timed),
        "timed": sum(cache.timed.values()),
        "training_timed": calls(True, True),
        "training_heuristic": calls(True, False),
        "other_timed": calls(False, True),
        "other_heuristic": calls(False, False),
    }


def by_batch(cache: PlanCache) -> dict[int, int]:
    """Plans per batch size (a key's input shape starts with it)."""
    sizes = [key[1][0] for key in cache.timed]
    return {n: sizes.count(n) for n in sorted(set(sizes))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run (CI)")
    ap.add_argument("--scopes", default=",".join(SCOPES), help=f"of {', '.join(SCOPES)}")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override")
    args = ap.parse_args(argv)
    if unknown := set(args.scopes.split(",")) - set(SCOPES):
        ap.error(f"--scopes: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SCOPES)}")
    overrides = [*(TINY if args.smoke else ["threads=1"]), *args.set]
    caches = {name: plans_seen(SCOPES[name], overrides) for name in args.scopes.split(",")}
    counts = {name: summary(cache) for name, cache in caches.items()}
    head = ["scope", "plans", "timed", "full training: timed", "heuristic"]
    head += ["other: timed", "heuristic"]
    print(table(head, [[name, *c.values()] for name, c in counts.items()]))
    for name, cache in caches.items():
        sizes = ", ".join(f"{n}: {k}" for n, k in by_batch(cache).items())
        print(f"{name}: plans per batch size {sizes}")
    what = " (smoke run)" if args.smoke else " (the default digits run)"
    what += f" with {' '.join(args.set)}" if args.set else ""
    if {"all", "full-batch"} <= set(counts):
        every, full = counts["all"], counts["full-batch"]
        print(
            f"full-batch times {full['timed']} of {full['plans']} plans ('all' "
            f"{every['timed']}); {full['training_timed']} of "
            f"{full['training_timed'] + full['training_heuristic']} full training-batch "
            "convolutions run a timed plan" + what
        )
    else:
        print(", ".join(f"{n}: {c['plans']} plans" for n, c in counts.items()) + what)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What one training step costs the host: dispatched ops and host time per step.

    python bench/step_cost.py                 # counts at the DARTS-like size, host-time ratio
    python bench/step_cost.py --write         # also rewrite bench/results/step_ops.json
    python bench/step_cost.py --smoke         # CI: tiny repeats

On a GPU a search network's step is bound by the host (``../shared/gpu``: the H100
sat 82-91% idle), so the figures that matter are host-side and measurable here:

1. **Dispatched aten ops per step** at the DARTS-like size (8 cells, 4 nodes,
   16 channels, 3x32x32, batch 64; the CPU stands in for the device), counted with a
   dispatch mode: the sampled W-step, the alpha step, and the retraining step (the
   derived network). Each op is at least one kernel launch on a GPU. Split into
   compute ops and views/allocations (no kernel). ``tests/test_step_cost.py`` fails
   when a count grows past ``bench/results/step_ops.json``.
2. **Host time per step at a tiny shape** (batch 2, 8x8 images, 1 thread: arithmetic
   negligible): the runner's sampled W-step against a plain ``nn.Module`` of the same
   sampled ops (:class:`~asolab.space.fixed.FixedNetwork` of the path, a plain SGD
   step), interleaved in one run. The ratio is the supernet's overhead.
3. **``speed.cuda_graphs``' bookkeeping per step** of the DARTS-like fixed network
   (a replay that does nothing): the check that its parameters and buffers are still
   the captured ones, against the walk of the module tree it replaced, interleaved.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import cpu_model, interleaved, table
from torch.utils._python_dispatch import TorchDispatchMode

from asolab import config

try:
    from asolab.runner import steps
    from asolab.space.fixed import FixedNetwork

    BEFORE = False
except ImportError:  # an older checkout (PYTHONPATH=<it>/platform): the "before" run
    BEFORE, steps = True, None
    # the plain module of the comparison is this tree's, built on the older modules
    _spec = importlib.util.spec_from_file_location(
        "asolab.space.fixed", Path(__file__).parents[1] / "platform/asolab/space/fixed.py"
    )
    _fixed_module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_fixed_module)
    FixedNetwork = _fixed_module.FixedNetwork
from asolab.runner.speed import Speed, build_network
from asolab.space.genotype import Genotype
from asolab.space.spec import ArchSpec

ROOT = Path(__file__).resolve().parents[1]
OPS_FILE = ROOT / "bench" / "results" / "step_ops.json"
# DARTS' search network at its published size, on CIFAR-shaped input
DARTS_LIKE = {"space.layers": 8, "space.steps": 4, "space.init_channels": 16}
# what tests/test_step_cost.py counts (3 cells, 2 nodes, 4 channels, 3x8x8, batch 2): cheap
SMALL = ({"space.layers": 3, "space.steps": 2, "space.init_channels": 4}, 2, 8)
NO_KERNEL = (
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "expand",
    "detach",
    "alias",
    "select",
    "slice",
    "unsqueeze",
    "squeeze",
    "permute",
    "as_strided",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "_reshape_alias",
    "reshape",
    "split",
    "unbind",
    "_to_copy_noop",
)


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while active, by name (overload dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def summary(self) -> dict[str, int]:
        total = sum(self.ops.values())
        views = sum(n for name, n in self.ops.items() if name in NO_KERNEL)
        return {"total": total, "compute": total - views}


class _Before:
    """The steps as the runner took them before ``runner/steps.py`` (``--before``: the
    same measurement of an older checkout, ``PYTHONPATH=<it>/platform``)."""

    @staticmethod
    def weight_step(net, speed, opt, x, y, plans, max_norm):
        if plans is None:  # the derived network was a view: the supernet along plans
            net, plans = net
        loss, logits = speed.forward_loss(net, x, y, plans)
        speed.step(loss, opt, net.weight_parameters(), max_norm)
        return loss.detach(), (logits.argmax(1) == y).sum()

    @staticmethod
    def alpha_step(net, speed, opt, x, y, tau):
        plans = net.sample_plans(tau, differentiable=True)
        loss, logits = speed.forward_loss(net, x, y, plans)
        speed.step(loss, opt)
        return loss.detach(), (logits.argmax(1) == y).sum()


def _retrain_net(net, genotype):
    """What W-retraining runs: before, the supernet along the genotype's plans."""
    return (net, net.genotype_plans(genotype)) if BEFORE else FixedNetwork(net, genotype)


def _optimizers(net, cfg, foreach):
    if hasattr(steps, "optimizers"):
        return steps.optimizers(net, cfg.search, foreach=foreach)
    s = cfg.search  # the layout before runner/steps.py, for a side-by-side run of both
    return (
        torch.optim.SGD(
            net.weight_parameters(),
            lr=s.weight_lr,
            momentum=s.weight_momentum,
            weight_decay=s.weight_decay,
            foreach=foreach,
        ),
        torch.optim.Adam(
            net.alpha_parameters(),
            lr=s.alpha_lr,
            betas=(0.5, 0.999),
            weight_decay=s.alpha_weight_decay,
            foreach=foreach,
        ),
    )


def setup(
    overrides: dict,
    image: int,
    batch: int,
    device: torch.device,
    foreach=None,
    layout: torch.memory_format = torch.contiguous_format,
):
    """The network, its optimizers and speed switches as a run builds them, and a batch."""
    cfg = config.load(None, [f"{k}={v}" for k, v in overrides.items()])
    spec = ArchSpec.from_config(cfg.space, 3, 10)
    torch.manual_seed(0)
    net = build_network(spec, device, layout)
    weight_opt, alpha_opt = _optimizers(net, cfg, foreach)
    speed = Speed(cfg.speed, device)
    x = torch.randn(batch, 3, image, image, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return cfg, net, weight_opt, alpha_opt, speed, x, y


def path_genotype(net, plans) -> Genotype:
    """The sampled path as a genotype: every edge with its one sampled op."""
    prims, spec = net.spec.primitives, net.spec
    cells = {}
    for key, plan in plans.items():
        edges = iter(plan)
        cells[key] = tuple(
            tuple((prims[next(edges)[0][0]], j) for j in range(k + 2)) for k in range(spec.steps)
        )
    concat = tuple(range(2, spec.steps + 2))
    return Genotype(cells["normal"], concat, cells["reduce"], concat)


def count_steps(
    overrides: dict = DARTS_LIKE, batch: int = 64, image: int = 32
) -> dict[str, dict[str, int]]:
    """Aten ops per step (by default at the DARTS-like size), on the CPU with the
    optimizer's multi-tensor kernels (a GPU's default), after warm-up steps (momentum
    buffers made). The counts do not depend on the batch size."""
    device = torch.device("cpu")
    cfg, net, wopt, aopt, speed, x, y = setup(overrides, image, batch, device, foreach=True)
    clip = cfg.search.grad_clip
    fixed = _retrain_net(net, net.derive())
    kinds = {
        "w_step": lambda: steps.weight_step(
            net, speed, wopt, x, y, net.sample_plans(1.0, False), clip
        ),
        "alpha_step": lambda: steps.alpha_step(net, speed, aopt, x, y, 1.0),
        "retrain_step": lambda: steps.weight_step(fixed, speed, wopt, x, y, None, clip),
    }
    out = {}
    for name, fn in kinds.items():
        for p in net.weight_parameters():
            p.requires_grad_(name != "alpha_step")  # alpha-training freezes the weights
        for _ in range(3 if name == "w_step" else 1):
            fn()
        torch.manual_seed(1)  # the same path for every count
        counter = OpCounter()
        with counter:
            fn()
        out[name] = {**counter.summary(), "top": dict(counter.ops.most_common(10))}
    for p in net.weight_parameters():
        p.requires_grad_(True)
    return out


def host_ratio(image: int, batch: int, repeats: int) -> dict[str, float]:
    """Seconds per W-step on the CPU: the runner's sampled step (a fresh path every step)
    against a plain module of one sampled path (the same ops, the same count), interleaved."""
    torch.set_num_threads(1)
    cfg, net, wopt, _, speed, x, y = setup(DARTS_LIKE, image, batch, torch.device("cpu"))
    plans = net.sample_plans(1.0, False)
    plain = FixedNetwork(net, path_genotype(net, plans))
    if hasattr(net, "path_logits"):
        logits = net.path_logits()  # the runner's W-training phase takes this copy once
        sample = lambda: net.sample_path(logits, 1.0)  # noqa: E731
    else:
        sample = lambda: net.sample_plans(1.0, False)  # noqa: E731
    clip = cfg.search.grad_clip
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9, weight_decay=3e-4)

    def sampled() -> None:
        steps.weight_step(net, speed, wopt, x, y, sample(), clip)

    def plain_step() -> None:
        plain_opt.zero_grad(set_to_none=True)
        F.cross_entropy(plain(x), y).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), clip)
        plain_opt.step()

    secs = interleaved({"sampled": sampled, "plain": plain_step}, repeats=repeats, warmup=5)
    return {
        "sampled_ms": 1e3 * secs["sampled"],
        "plain_ms": 1e3 * secs["plain"],
        "ratio": secs["sampled"] / secs["plain"],
    }


def graphs_bookkeeping(repeats: int, overrides: dict = DARTS_LIKE) -> dict[str, float]:
    """Seconds per fixed-network call spent by :class:`~asolab.runner.graphs.CudaGraphs`
    outside its replay (the capture and the replay do nothing here), against one walk of
    the module's parameters and buffers, which it did at every step before."""
    from asolab.runner.graphs import CudaGraphs

    torch.set_num_threads(1)
    _, net, _, _, _, x, _ = setup(overrides, 8, 2, torch.device("cpu"))
    fixed = FixedNetwork(net, net.derive())
    graphs = CudaGraphs(lambda module, inp, params: lambda inp, *ps: inp)

    def walk() -> None:  # what each step did before: the parameters, then every pointer
        tuple(fixed.parameters())
        tuple(t.data_ptr() for t in (*fixed.parameters(), *fixed.buffers()))

    secs = interleaved({"check": lambda: graphs(fixed, x), "walk": walk}, repeats, warmup=5)
    return {"check_ms": 1e3 * secs["check"], "walk_ms": 1e3 * secs["walk"]}


if steps is None:
    steps = _Before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="few repeats (CI)")
    ap.add_argument("--write", action="store_true", help=f"rewrite {OPS_FILE.name}")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    counts = count_steps()
    rows = [(k, v["total"], v["compute"]) for k, v in counts.items()]
    print("aten ops per step, DARTS-like size (8 cells, 4 nodes, 16 ch, 3x32x32, batch 64):")
    print(table(("step", "ops", "compute ops"), rows))
    for k, v in counts.items():
        print(f"  {k}: {v['top']}")
    repeats = 3 if args.smoke else 40
    machine = f"{cpu_model()}, 1 thread, load {os.getloadavg()[0]:.1f}"
    r = host_ratio(8, 2, repeats)
    print(
        f"W-step at a tiny shape, batch 2, 3x8x8 ({machine}): sampled {r['sampled_ms']:.2f} ms, "
        f"plain module {r['plain_ms']:.2f} ms, ratio {r['ratio']:.2f}x"
    )
    if not BEFORE:
        g = graphs_bookkeeping(repeats)
        print(
            f"speed.cuda_graphs' check per fixed-network step, DARTS-like size ({machine}): "
            f"{g['check_ms']:.3f} ms, the module walk it replaced {g['walk_ms']:.3f} ms, "
            f"{g['walk_ms'] / g['check_ms']:.1f}x less"
        )
    if args.write:
        OPS_FILE.parent.mkdir(parents=True, exist_ok=True)
        data = {
            size: {k: {"total": v["total"], "compute": v["compute"]} for k, v in c.items()}
            for size, c in (("darts_like", counts), ("small", count_steps(*SMALL)))
        }
        OPS_FILE.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {OPS_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

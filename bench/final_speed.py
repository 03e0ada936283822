"""Final training speed: the final network's training step, eager vs the candidate switches.

    python bench/final_speed.py                 # the Fashion-MNIST experiment's network shape
    python bench/final_speed.py --smoke         # a seconds-long check (the test suite runs it)

The network the final epochs train (a derived genotype run on the supernet, as
``Runner`` trains it: forward, cross-entropy, backward, gradient clipping, SGD)
at the shape of ``experiments/fashion_mnist.toml`` (``init_channels`` 12, 3
cells, 2 nodes, batch 128, 1x28x28 images; random images, since speed does not
depend on them). Variants, interleaved in one process, medians over repeats:
eager, channels-last, bf16 autocast, and ``space.stem_stride = 2`` (channels-last,
the same weights, every cell at half the side). FLOPs per step are counted, per
variant, with
``torch.utils.flop_counter`` (convolutions and matrix products, forward and
backward); achieved GFLOP/s is that over the step time, set against the CPU's
fp32 peak given by ``--peak-gflops`` (default: 2 cores x 2.45 GHz x 32 FLOP per
cycle, AVX2 with two FMA units, this machine). The headline (last line) is each
variant's speed-up over eager and eager's share of the peak.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

from _common import interleaved, machine, table, use_threads  # first: sets OpenMP's wait policy

# isort: split
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from asolab.config import SpaceConfig
from asolab.space import ArchSpec, Genotype, SearchNetwork

VARIANTS = ("eager", "channels-last", "bf16 autocast", "stride-2 stem")
CHANNELS_LAST = ("channels-last", "stride-2 stem")


def step_fn(net: SearchNetwork, plans, x: torch.Tensor, y: torch.Tensor, variant: str):
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    if variant in CHANNELS_LAST:
        x = x.contiguous(memory_format=torch.channels_last)

    def step() -> None:
        ctx = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if variant == "bf16 autocast"
            else nullcontext()
        )
        with ctx:
            loss = F.cross_entropy(net(x, plans), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        opt.step()

    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", type=int, default=12)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=28, help="image side (1 channel)")
    ap.add_argument("--steps", type=int, default=4, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = asolab's auto rule)")
    ap.add_argument("--peak-gflops", type=float, default=2 * 2.45 * 32, help="the CPU's fp32 peak")
    ap.add_argument(
        "--genotype",
        default="",
        help="the genotype to train (canonical string, e.g. a run's asolab.genotype tag; "
        "default: the one derived from the untrained supernet)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.channels, args.batch, args.steps, args.repeats = 4, 8, 1, 1
    use_threads(args.threads)
    torch.manual_seed(0)
    spaces = {
        stride: SpaceConfig(init_channels=args.channels, layers=args.layers, stem_stride=stride)
        for stride in (1, 2)
    }
    x = torch.randn(args.batch, 1, args.size, args.size)
    y = torch.randint(0, 10, (args.batch,))
    fns, flops = {}, {}
    for variant in VARIANTS:
        torch.manual_seed(0)  # every variant trains the same network from the same weights
        space = spaces[2 if variant == "stride-2 stem" else 1]
        net = SearchNetwork(ArchSpec.from_config(space, 1, 10))
        if variant in CHANNELS_LAST:
            net = net.to(memory_format=torch.channels_last)
        net.train()
        genotype = Genotype.parse(args.genotype) if args.genotype else net.derive()
        plans = net.genotype_plans(genotype)
        step = step_fn(net, plans, x, y, variant)
        counter = FlopCounterMode(display=False)
        with counter:
            step()
        flops[variant] = counter.get_total_flops()

        def run(step=step) -> None:
            for _ in range(args.steps):
                step()

        fns[variant] = run
    seconds = interleaved(fns, args.repeats)
    images = args.steps * args.batch
    rows = []
    for variant in VARIANTS:
        per_step = seconds[variant] / args.steps
        rows.append(
            [
                variant,
                images / seconds[variant],
                f"{seconds['eager'] / seconds[variant]:.2f}x",
                flops[variant] / 1e9,
                flops[variant] / per_step / 1e9,
            ]
        )
    print(
        f"# final network training step, init_channels {args.channels}, {args.layers} cells, "
        f"batch {args.batch}, "
        f"1x{args.size}x{args.size}; {machine()}"
    )
    print(table(["variant", "img/s", "vs eager", "GFLOP/step", "GFLOP/s"], rows))
    eager_share = 100 * flops["eager"] / (seconds["eager"] / args.steps) / 1e9 / args.peak_gflops
    print(
        "final training speed-up over eager: "
        + ", ".join(f"{v} {seconds['eager'] / seconds[v]:.2f}x" for v in VARIANTS[1:])
        + f"; eager reaches {eager_share:.1f}% of the {args.peak_gflops:.0f} GFLOP/s fp32 peak"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

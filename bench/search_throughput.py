"""Search throughput: hard Gumbel path sampling vs the DARTS continuous relaxation.

    python bench/search_throughput.py                  # digits, default supernet, batch 64
    python bench/search_throughput.py --data fashion_mnist
    python bench/search_throughput.py --smoke          # a seconds-long check

Same supernet, batch and data for both. A *W step* trains the supernet weights
(alphas frozen): sampling runs one op per edge (never ``none``), the relaxation
runs every op of every edge weighted by softmax(alphas). An *alpha step* trains
the alphas (weights frozen, no weight gradients): straight-through hard
Gumbel-softmax vs the relaxation. Variants run interleaved in one process; each
figure is the median over repeats. The headline (last line) is the speed-up of
path sampling over the relaxation; the target is at least 5x with 8 ops.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from _common import interleaved, machine, table
from asolab.config import DataConfig, SpaceConfig
from asolab.data import Batches, load_data
from asolab.space import ArchSpec, SearchNetwork


def build(args: argparse.Namespace):
    torch.manual_seed(0)
    data = load_data(DataConfig(name=args.data, train_subset=args.batch * args.steps), seed=0)
    space = SpaceConfig(init_channels=args.channels, layers=args.layers)
    net = SearchNetwork(ArchSpec.from_config(space, data.in_channels, data.num_classes))
    batches = list(Batches(data.train, args.batch))[: args.steps]
    return net, batches


def step_functions(net: SearchNetwork, batches, tau: float):
    w_opt = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)
    a_opt = torch.optim.Adam(net.alpha_parameters(), lr=3e-3)
    weights = net.weight_parameters()
    net.train()

    def w_epoch(continuous: bool):
        def run():
            for x, y in batches:
                if continuous:
                    with torch.no_grad():  # alphas are frozen during W-training
                        plans = net.continuous_plans()
                else:
                    plans = net.sample_plans(tau, differentiable=False)
                loss = F.cross_entropy(net(x, plans), y)
                w_opt.zero_grad(set_to_none=True)
                loss.backward()
                w_opt.step()
        return run

    def alpha_epoch(continuous: bool):
        def run():
            for p in weights:
                p.requires_grad_(False)
            try:
                for x, y in batches:
                    plans = net.continuous_plans() if continuous else net.sample_plans(tau, differentiable=True)
                    loss = F.cross_entropy(net(x, plans), y)
                    a_opt.zero_grad(set_to_none=True)
                    loss.backward()
                    a_opt.step()
            finally:
                for p in weights:
                    p.requires_grad_(True)
        return run

    return {
        "W sampled": w_epoch(False),
        "W continuous": w_epoch(True),
        "alpha sampled": alpha_epoch(False),
        "alpha continuous": alpha_epoch(True),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="digits", choices=("digits", "fashion_mnist"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--channels", type=int, default=16, help="space.init_channels")
    ap.add_argument("--layers", type=int, default=3, help="space.layers")
    ap.add_argument("--tau", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.steps, args.repeats, args.channels = 8, 1, 1, 4
    if args.threads:
        torch.set_num_threads(args.threads)
    net, batches = build(args)
    seconds = interleaved(step_functions(net, batches, args.tau), args.repeats)
    images = sum(len(y) for _, y in batches)
    ips = {name: images / s for name, s in seconds.items()}
    n_ops = len(net.spec.primitives)
    print(f"# {args.data}, batch {args.batch}, init_channels {args.channels}, {args.layers} cells, {n_ops} ops; {machine()}")
    w_ratio = ips["W sampled"] / ips["W continuous"]
    a_ratio = ips["alpha sampled"] / ips["alpha continuous"]
    print(table(
        ["step", "sampled img/s", "continuous img/s", "speed-up"],
        [["W-training", ips["W sampled"], ips["W continuous"], f"{w_ratio:.2f}x"],
         ["alpha-training", ips["alpha sampled"], ips["alpha continuous"], f"{a_ratio:.2f}x"]],
    ))
    print(f"path sampling speed-up over the continuous relaxation ({n_ops} ops): "
          f"W-training {w_ratio:.2f}x, alpha-training {a_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

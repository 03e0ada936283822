"""Speed paths on the CPU: torch.compile and channels-last for the derived network.

    python bench/speed_paths.py                       # digits, default supernet's derived network
    python bench/speed_paths.py --data fashion_mnist
    python bench/speed_paths.py --smoke               # tiny; torch.compile rows are skipped

The derived network (a genotype run on the supernet's modules, what
W-retraining and the final epochs train) in four variants -- eager,
channels-last, torch.compile, torch.compile + channels-last -- for inference
(eval, no_grad, ``data.eval_batch_size``) and a training step (forward,
backward, SGD; ``data.batch_size``). Variants run interleaved in one process;
figures are medians. Compilation happens in the warm-up, outside the timing,
and its one-off cost is reported. If torch.compile fails here (no C++
compiler, unsupported platform), the rows say so. The headline (last line) is
the best variant's speed-up over eager for each.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from _common import interleaved, machine, table

from asolab.config import DataConfig, SpaceConfig
from asolab.data import Batches, load_data
from asolab.space import ArchSpec, SearchNetwork
from asolab.space.network import DerivedNetwork


def variants(
    net: DerivedNetwork, compile_: bool
) -> dict[str, tuple[torch.nn.Module | None, bool, str]]:
    """name -> (module or None when unavailable, channels_last, note)."""
    out: dict[str, tuple[torch.nn.Module | None, bool, str]] = {
        "eager": (net, False, ""),
        "channels-last": (copy.deepcopy(net).to(memory_format=torch.channels_last), True, ""),
    }
    for name, cl in (("compile", False), ("compile + channels-last", True)):
        if not compile_:
            out[name] = (None, cl, "skipped")
            continue
        base = copy.deepcopy(net)
        if cl:
            base = base.to(memory_format=torch.channels_last)
        out[name] = (torch.compile(base), cl, "")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="digits", choices=("digits", "fashion_mnist"))
    ap.add_argument("--channels", type=int, default=16, help="space.init_channels")
    ap.add_argument("--batch", type=int, default=64, help="training batch")
    ap.add_argument("--eval-batch", type=int, default=512, help="inference batch")
    ap.add_argument("--steps", type=int, default=8, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny sizes, no torch.compile (for the test suite)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.channels, args.batch, args.eval_batch, args.steps, args.repeats, args.no_compile = (
            4,
            8,
            16,
            2,  # 16 training images: no fewer than the classes
            1,
            True,
        )
    torch.manual_seed(0)
    data = load_data(DataConfig(name=args.data, train_subset=args.batch * args.steps), seed=0)
    supernet = SearchNetwork(
        ArchSpec.from_config(
            SpaceConfig(init_channels=args.channels), data.in_channels, data.num_classes
        )
    )
    net = DerivedNetwork(supernet, supernet.derive())
    batches = list(Batches(data.train, args.batch))[: args.steps]
    probe = data.val.x[: args.eval_batch]
    rows, fns, notes = [], {}, {}
    for name, (model, cl, note) in variants(net, not args.no_compile).items():
        notes[name] = note
        if model is None:
            continue
        fmt = torch.channels_last if cl else torch.contiguous_format
        xs = [(x.contiguous(memory_format=fmt), y) for x, y in batches]
        px = probe.contiguous(memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def infer(model=model, px=px):
            model.eval()
            with torch.no_grad():
                for _ in range(args.steps):
                    model(px)

        def train(model=model, xs=xs, opt=opt):
            model.train()
            for x, y in xs:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        if name.startswith("compile"):
            start = time.perf_counter()
            try:  # compile happens on first call; do it here to catch failures and time it
                infer()
                train()
            except Exception as exc:  # noqa: BLE001 - any compiler failure is a result to report
                notes[name] = (
                    f"failed: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:80] if str(exc) else ''}"
                )
                continue
            notes[name] = f"compiled in {time.perf_counter() - start:.0f} s"
        fns[f"{name}|infer"], fns[f"{name}|train"] = infer, train
    seconds = interleaved(fns, args.repeats)
    infer_imgs, train_imgs = args.steps * len(probe), sum(len(y) for _, y in batches)
    best = {"infer": ("eager", 1.0), "train": ("eager", 1.0)}
    for name, note in notes.items():
        if f"{name}|infer" not in seconds:
            rows.append([name, "-", "-", "-", "-", note or "unavailable"])
            continue
        ratios = {}
        for kind in ("infer", "train"):
            ratios[kind] = seconds[f"eager|{kind}"] / seconds[f"{name}|{kind}"]
            if ratios[kind] > best[kind][1]:
                best[kind] = (name, ratios[kind])
        rows.append(
            [
                name,
                infer_imgs / seconds[f"{name}|infer"],
                f"{ratios['infer']:.2f}x",
                train_imgs / seconds[f"{name}|train"],
                f"{ratios['train']:.2f}x",
                note,
            ]
        )
    print(
        f"# derived network, {args.data}, init_channels {args.channels}, "
        f"inference batch {len(probe)}, "
        f"training batch {args.batch}; {machine()}"
    )
    print(
        table(["variant", "inference img/s", "vs eager", "train img/s", "vs eager", "note"], rows)
    )
    print(
        f"best over eager: inference {best['infer'][1]:.2f}x ({best['infer'][0]}), "
        f"training step {best['train'][1]:.2f}x ({best['train'][0]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What writing and reading a checkpoint costs: packed (asolab's format 3) against a
plain ``torch.save`` of the same state (format 2), side by side in one run.

    python bench/checkpoint_io.py            # the default experiment and the DARTS-like size
    python bench/checkpoint_io.py --smoke    # CI: the smallest supernet, few repeats

A run writes a checkpoint after every phase and reads one on every resume. The state is
a supernet's ``state_dict``, both optimizers' states, the RNG states and plain data:
several hundred to several thousand small tensors. ``torch.save`` pickles each tensor
through Python; the packed form joins them into one flat tensor per dtype first
(``asolab.runner.checkpoint.pack``). The state measured is a runner's own
``checkpoint_state()`` after one weight step, so every momentum buffer is in it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
from _common import cpu_model, interleaved, machine, table

from asolab import config
from asolab.data import load_data
from asolab.runner import Runner
from asolab.runner import checkpoint as ckpt

SIZES = {
    "smallest (4 ch, 5 cells, 1 node)": {"space.init_channels": 4, "space.steps": 1},
    "default experiment (digits)": {},
    "DARTS-like (8 cells, 4 nodes, 16 ch)": {
        "space.layers": 8,
        "space.steps": 4,
        "space.init_channels": 16,
    },
}


def state_after_one_step(overrides: dict) -> dict:
    """A runner's checkpoint state after one weight step on 64 digits."""
    cfg = config.load(None, {"threads": 1, "data.train_subset": 64, **overrides})
    runner = Runner(cfg, data=load_data(cfg.data, cfg.seed))
    batch = runner.data.train.head(cfg.data.batch_size)
    plans = runner.net.sample_path(runner.net.path_logits(), cfg.temperature.initial_temperature)
    runner.weight_step(batch.x, batch.y, plans)
    return runner.checkpoint_state()


def measure(state: dict, folder: Path, repeats: int) -> dict[str, float]:
    plain, packed = folder / "plain.pt", folder / "packed.pt"
    torch.save({"format": 2, **state}, plain)
    ckpt.save(state, packed)
    times = interleaved(
        {
            "save plain": lambda: torch.save({"format": 2, **state}, plain),
            "save packed": lambda: ckpt.save(state, packed),
            "load plain": lambda: ckpt.load(plain),
            "load packed": lambda: ckpt.load(packed),
        },
        repeats,
    )
    times["tensors"] = len(ckpt.pack(state)[ckpt.PACKED]["index"])
    times["MB"] = os.path.getsize(packed) / 2**20
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the smallest size, 3 repeats")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = dict(list(SIZES.items())[:1]) if args.smoke else SIZES
    repeats = 3 if args.smoke else args.repeats
    print(f"# checkpoint write and read, ms (median of {repeats}, interleaved)")
    print(f"# {cpu_model()}; {machine()}; load {os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="asolab-ckpt-") as tmp:
        for name, overrides in sizes.items():
            t = measure(state_after_one_step(overrides), Path(tmp), repeats)
            rows.append(
                [
                    name,
                    str(t["tensors"]),
                    f"{t['MB']:.1f}",
                    1e3 * t["save plain"],
                    1e3 * t["save packed"],
                    f"{t['save plain'] / t['save packed']:.2f}x",
                    1e3 * t["load plain"],
                    1e3 * t["load packed"],
                    f"{t['load plain'] / t['load packed']:.2f}x",
                ]
            )
    header = ["size", "tensors", "MB", "save", "packed", "ratio", "load", "packed", "ratio"]
    print(table(header, rows))
    last = rows[-1]
    size = last[0].split(" (")[0]
    print(f"packed checkpoint over torch.save at the {size} size: save {last[5]}, load {last[8]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

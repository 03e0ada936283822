"""Concurrency: how much slower an asolab process gets when others share its cores.

    python bench/concurrency.py                 # alone, 2 and 3 at once; auto vs torch's default
    python bench/concurrency.py --steps 40      # a longer workload
    python bench/concurrency.py --smoke         # a seconds-long check (the test suite runs it)

The workload is a fixed number of training steps of the default digits
supernet (batch 64, one sampled W-step and one W-retraining step of the derived
network per step), run in fresh processes, each timed from a common start
signal after its set-up. Thread settings compared:

* ``auto``: what asolab does by default -- ``OMP_WAIT_POLICY=PASSIVE`` set before
  torch loads when other asolab processes run, and the thread count of
  asolab/threads.py (usable cores minus the threads other asolab processes took;
  a private registry here), decided once at the start as a run decides it;
* ``torch``: torch's defaults, as before -- all cores, spinning OpenMP waits;
* ``1``: one thread each, spinning waits.

For every setting: the median time of one process alone (alone runs of all
settings interleaved, ``--alone-repeats`` times), then K processes at once
(each process's time; the slowdown is the slowest over the alone median).
The headline (last line) is the ``auto`` slowdown at 2 and 3 at once (targets
~2.2x and ~3.3x on 2 cores) and what ``auto`` costs a process alone against
torch's default (target at most +3%). Record ``uptime`` with the figures: the
ratios only mean something when nothing else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = ("auto", "torch", "1")


def _env(setting: str, registry: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env["ASOLAB_THREADS_DIR"] = str(registry)
    # The workers import the asolab this process imported (a checkout's, not another install).
    import asolab

    package_root = str(Path(asolab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def worker(setting: str, steps: int, channels: int, sync: Path, index: int) -> None:
    """One process of the workload; prints {"threads", "seconds"} as JSON."""
    from asolab import threads

    if setting == "auto":
        threads.prepare_environment()
    import torch
    import torch.nn.functional as F

    from asolab.config import DataConfig, SpaceConfig
    from asolab.data import Batches, load_data
    from asolab.space import ArchSpec, SearchNetwork

    chosen = None
    if setting == "auto":
        chosen = threads.acquire(0)  # as a run does: once, from the others running now
    elif setting != "torch":
        torch.set_num_threads(int(setting))
    torch.manual_seed(index)
    data = load_data(DataConfig(name="digits", train_subset=64 * 4), seed=0)
    net = SearchNetwork(
        ArchSpec.from_config(
            SpaceConfig(init_channels=channels), data.in_channels, data.num_classes
        )
    )
    opt = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)
    batches = list(Batches(data.train, 64))
    derived = net.genotype_plans(net.derive())

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        for plans in (net.sample_plans(1.0, differentiable=False), derived):
            loss = F.cross_entropy(net(x, plans), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    step(0)  # warm-up
    (sync / f"ready-{index}").touch()
    while not (sync / "go").exists():
        time.sleep(0.005)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    print(
        json.dumps(
            {
                # the count the timed steps used (fixed for the whole workload, as in a run)
                "threads": chosen or torch.get_num_threads(),
                "seconds": time.perf_counter() - start,
            }
        ),
        flush=True,
    )


def together(setting: str, k: int, args: argparse.Namespace) -> list[dict]:
    """Run ``k`` workload processes at once; their results."""
    with tempfile.TemporaryDirectory(prefix="asolab-concurrency-") as tmp:
        sync, registry = Path(tmp) / "sync", Path(tmp) / "registry"
        sync.mkdir()
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            setting,
            "--steps",
            str(args.steps),
            "--channels",
            str(args.channels),
        ]
        procs = [
            subprocess.Popen(
                [*cmd, "--sync", str(sync), "--index", str(i)],
                env=_env(setting, registry),
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(k)
        ]
        while len(list(sync.glob("ready-*"))) < k:
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError("a workload process failed")
            time.sleep(0.01)
        (sync / "go").touch()
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("a workload process failed")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="training steps each process times")
    ap.add_argument("--channels", type=int, default=16, help="space.init_channels")
    ap.add_argument(
        "--settings", default=",".join(SETTINGS), help="comma-separated, of auto, torch, 1"
    )
    ap.add_argument("--concurrent", default="2,3", help="how many processes at once")
    ap.add_argument("--alone-repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sync", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.channels, Path(args.sync), args.index)
        return 0
    if args.smoke:
        args.steps, args.channels, args.settings, args.concurrent, args.alone_repeats = (
            1,
            4,
            "auto",
            "2",
            1,
        )
    settings = args.settings.split(",")
    ks = [int(k) for k in args.concurrent.split(",")]
    alone: dict[str, list[float]] = {s: [] for s in settings}
    threads_alone: dict[str, int] = {}
    for _ in range(args.alone_repeats):  # interleaved, so a drift in load hits every setting alike
        for s in settings:
            (r,) = together(s, 1, args)
            print(f"# alone, {s}: {r['threads']} threads, {r['seconds']:.2f} s", flush=True)
            alone[s].append(r["seconds"])
            threads_alone[s] = r["threads"]
    base = {s: statistics.median(v) for s, v in alone.items()}
    rows, slow = [], {}
    for s in settings:
        rows.append([s, "1", str(threads_alone[s]), f"{base[s]:.2f}", "1.00x"])
        for k in ks:
            results = together(s, k, args)
            print(
                f"# {k} at once, {s}: "
                + ", ".join(f"{r['threads']} threads {r['seconds']:.2f} s" for r in results),
                flush=True,
            )
            worst = max(r["seconds"] for r in results)
            slow[(s, k)] = worst / base[s]
            rows.append(
                [
                    s,
                    str(k),
                    "+".join(str(r["threads"]) for r in results),
                    " ".join(f"{r['seconds']:.2f}" for r in results),
                    f"{slow[(s, k)]:.2f}x",
                ]
            )
    from _common import table

    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    print(
        f"# {args.steps} steps (sampled W-step + retraining step), digits, "
        f"init_channels {args.channels}, batch 64; "
        f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} "
        f"usable cores; load average after: {' '.join(f'{x:.2f}' for x in load)}"
    )
    print(table(["setting", "at once", "threads", "seconds each", "slowdown"], rows))
    parts = [f"{k} at once {slow[('auto', k)]:.2f}x" for k in ks if ("auto", k) in slow]
    cost = (
        f"; alone vs torch's default {100 * (base['auto'] / base['torch'] - 1):+.1f}%"
        if "torch" in base and "auto" in base
        else ""
    )
    print(f"auto threads, slowdown against alone: {', '.join(parts)}{cost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

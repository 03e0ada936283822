"""Search quality: the ASO-SE network vs baselines trained for the same budget.

    python bench/search_quality.py                               # digits + Fashion-MNIST, seeds 0,1,2
    python bench/search_quality.py --datasets digits --seeds 0,1,2
    python bench/search_quality.py --datasets fashion_mnist --quick
    python bench/search_quality.py --smoke
    python bench/search_quality.py --datasets fashion_mnist --json fashion.json --report       # what is recorded so far
    python bench/search_quality.py --datasets fashion_mnist --seeds 2 --arms initial --json fashion.json  # one arm
    python bench/search_quality.py --datasets fashion_mnist --json fashion.json   # again after an interruption: goes on
    python bench/search_quality.py --datasets fashion_mnist --seeds 0 --threads 1 --json fashion.json &
    python bench/search_quality.py --datasets fashion_mnist --seeds 1 --threads 1 --json fashion.json   # 2 cores, 2 seeds at once

Per data set and seed, four arms:

* ``aso-se``   a full run of the experiment (experiments/<data set>.toml);
* ``aso-arch`` the genotype that ASO-SE run ended with, trained from scratch
  like the baselines: the architecture's quality without the search's
  weight sharing (the standard NAS protocol of re-training the result);
* ``random``   a random genotype of the same space whose derived parameter
  count is within 10% of the ASO-SE network's (genotypes are drawn until one
  fits; the closest of 5000 draws otherwise);
* ``initial``  the genotype derive() reads from the freshly initialised
  alphas of the same seed (search without evolution).

"Same training epochs" means: each baseline trains its fixed genotype from
scratch (same seed, so the same initial weights for the ops it shares) for
exactly the ASO-SE run's weight epochs, epoch by epoch in the same places --
the W-training and W-retraining epochs of every cycle on the search split
(``data.train_subset``), then ``search.final_epochs`` on the whole training
split -- with the same SGD settings and cosine learning-rate schedule.
Alpha epochs train no weights and are skipped (the baselines have no
alphas). All arms are evaluated on the same test split. The headline (last
line) is ASO-SE's mean test-accuracy margin over each baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from _common import machine, table
from asolab.config import ExperimentConfig, load, parse_override
from asolab.data import load_data
from asolab.runner import Runner
from asolab.runner.cycle import CHECKPOINT_NAME
from asolab.space.genotype import CELL_TYPES, Genotype

ARMS = ("aso-se", "aso-arch", "random", "initial")  # as tables list them; run_seed runs aso-arch last
BASELINES = ("random", "initial")
QUICK = {
    "digits": {"search.cycles": 2, "search.final_epochs": 5, "space.init_channels": 8},
    "fashion_mnist": {
        "space.init_channels": 8, "data.train_subset": 2000, "data.val_fraction": 0.05, "search.cycles": 2,
        "search.w_epochs": 1, "search.alpha_epochs": 1, "search.retrain_epochs": 1, "search.final_epochs": 2,
    },
}
QUICK_FULL_TRAIN = {"fashion_mnist": 4000}  # --quick caps the final epochs' training split too
SMOKE = {
    "space.init_channels": 4, "search.cycles": 1, "search.w_epochs": 1, "search.alpha_epochs": 1,
    "search.retrain_epochs": 1, "search.final_epochs": 1, "data.train_subset": 64, "data.val_fraction": 0.05,
    "threads": 1,
}


class FixedGenotypeRunner(Runner):
    """A runner whose genotype never changes: W-training trains the genotype's
    path instead of sampled ones, alpha-training and mutation do nothing. The
    epoch layout, LR schedule, BN recalibration and evaluation are the runner's."""

    def __init__(self, cfg: ExperimentConfig, observers=(), *, genotype: Optional[Genotype] = None, **kwargs) -> None:
        super().__init__(cfg, observers, **kwargs)  # Runner.resume() builds it this way, then restores the genotype
        self.genotype = self.derived = genotype if genotype is not None else self.net.derive()

    def _w_train(self) -> None:
        epochs = self.cfg.search.w_epochs + (self.cfg.search.warmup_epochs if self.position.cycle == 0 else 0)
        self._retrain("w_train", epochs, self.data.train)

    def _alpha_train(self) -> None:
        pass

    def _mutate(self) -> None:
        pass

    def _final_genotype(self) -> Genotype:
        return self.genotype


def random_genotype(rng: random.Random, primitives: tuple[str, ...], steps: int) -> Genotype:
    ops = [p for p in primitives if p != "none"]
    cells = {kind: tuple(tuple((rng.choice(ops), j) for j in rng.sample(range(k + 2), 2)) for k in range(steps)) for kind in CELL_TYPES}
    concat = tuple(range(2, steps + 2))
    return Genotype(normal=cells["normal"], normal_concat=concat, reduce=cells["reduce"], reduce_concat=concat)


def matched_random(runner: Runner, target: int, seed: int, tolerance: float = 0.10, tries: int = 5000) -> tuple[Genotype, int]:
    """A random genotype whose derived parameter count is within ``tolerance`` of ``target``."""
    rng = random.Random(1000 + seed)
    best: Optional[tuple[float, Genotype, int]] = None
    for _ in range(tries):
        g = random_genotype(rng, runner.spec.primitives, runner.spec.steps)
        n = runner.net.count_derived(g)
        gap = abs(n - target) / target
        if best is None or gap < best[0]:
            best = (gap, g, n)
        if gap <= tolerance:
            break
    assert best is not None
    return best[1], best[2]


def run_seed(
    cfg: ExperimentConfig, full_train_cap: int, done: dict[str, dict], save: Callable[[dict], None],
    arms: tuple[str, ...] = ARMS, checkpoints: Optional[Path] = None,
) -> list[dict]:
    """The arms of one data set and seed. Arms in ``done`` (from an earlier,
    interrupted invocation with the same sizes) are taken as they are; of the
    others, those in ``arms`` run, and each one's record goes to ``save`` as
    soon as it ends. With ``checkpoints`` (a folder), every arm checkpoints as
    ``asolab run`` does, and an arm killed midway resumes from its checkpoint."""
    needs_aso_se = {"random", "aso-arch"} & set(arms)
    if needs_aso_se and "aso-se" not in done and "aso-se" not in arms:
        raise SystemExit(f"search_quality: error: {cfg.data.name} seed {cfg.seed}: the {' and '.join(sorted(needs_aso_se))} "
                         "arm needs this seed's aso-se arm (its parameter count and genotype); run that first "
                         "(--arms aso-se) into the same --json file")
    data = load_data(cfg.data, cfg.seed, "cpu" if cfg.device == "auto" else cfg.device)
    if full_train_cap:
        data.full_train = data.full_train.head(full_train_cap)
    results: dict[str, dict] = {}

    def record(arm: str, make: Callable[..., Runner]) -> None:
        if arm in done:
            results[arm] = r = done[arm]
            print(f"  {r['dataset']} seed {r['seed']} {arm:<8} test {r['test_acc']:.4f} (recorded earlier)", flush=True)
            return
        if arm not in arms:
            return
        folder = checkpoints / f"{cfg.data.name}-seed{cfg.seed}-{arm}" if checkpoints else None
        if folder and (folder / CHECKPOINT_NAME).exists():
            runner = (Runner if arm == "aso-se" else FixedGenotypeRunner).resume(folder / CHECKPOINT_NAME, checkpoint_dir=folder, data=data)
            print(f"  {cfg.data.name} seed {cfg.seed} {arm:<8} resumed from its checkpoint: {runner._next_name()}, "
                  f"epoch {runner.state.position.global_epoch}", flush=True)
        else:
            runner = make(checkpoint_dir=folder)
        res = runner.run()
        results[arm] = r = {
            "dataset": cfg.data.name, "seed": cfg.seed, "arm": arm, "test_acc": res.test_acc, "val_acc": res.val_acc,
            "params": res.derived_params, "seconds": res.seconds, "genotype": str(res.genotype),
            "weight_epochs": runner.weight_epochs, "threads": torch.get_num_threads(),
        }
        save(r)
        if folder:
            shutil.rmtree(folder)
        print(f"  {r['dataset']} seed {r['seed']} {arm:<8} test {r['test_acc']:.4f} val {r['val_acc']:.4f} "
              f"params {r['params']} {r['seconds']:.0f} s", flush=True)

    def initial_arm(**kw) -> Runner:
        return FixedGenotypeRunner(cfg, data=data, **kw)

    record("aso-se", lambda **kw: Runner(cfg, data=data, **kw))
    if "aso-se" not in results:  # not asked for: only the arm that needs no ASO-SE run can go on
        record("initial", initial_arm)
        return [results[arm] for arm in ARMS if arm in results]

    def random_arm(**kw) -> Runner:
        base = FixedGenotypeRunner(cfg, data=data)  # seeded: derive() reads the fresh alphas of this seed
        genotype, _ = matched_random(base, results["aso-se"]["params"], cfg.seed)
        return FixedGenotypeRunner(cfg, genotype=genotype, data=data, **kw)

    # The two baselines the comparison is about first; the diagnostic arm last.
    record("random", random_arm)
    record("initial", initial_arm)
    # On the fresh, ungrown network: cells that growth inserted (and their own cells in the
    # genotype) are left out, like every other kind of growth.
    found = dataclasses.replace(Genotype.parse(results["aso-se"]["genotype"]), own_cells=())
    record("aso-arch", lambda **kw: FixedGenotypeRunner(cfg, genotype=found, data=data, **kw))
    return [results[arm] for arm in ARMS if arm in results]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s sidecar lock file, so that several
    processes (one per seed) can record arms into one results file."""
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_results(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def append_result(path: Path, record: dict) -> None:
    """Add one arm to the results file: re-read under the lock (another process
    may have added arms since), then replace the file atomically."""
    with locked(path):
        records = read_results(path) + [record]
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(records, indent=1))
        os.replace(tmp, path)


def checkpoints_for(results: Path, sizes: str) -> Path:
    """Where the arms in progress of a results file checkpoint (one folder per
    sizes, one per arm inside), so that a killed arm resumes midway."""
    return results.with_name(f"{results.stem}.checkpoints") / hashlib.sha1(sizes.encode()).hexdigest()[:10]


def summary(results: list[dict]) -> list[list[object]]:
    rows = []
    for name in dict.fromkeys(r["dataset"] for r in results):
        for arm in ARMS:
            rs = [r for r in results if r["dataset"] == name and r["arm"] == arm]
            if not rs:
                continue
            accs = [100 * r["test_acc"] for r in rs]
            std = statistics.stdev(accs) if len(accs) > 1 else 0.0
            rows.append([
                name, arm, len(rs), f"{statistics.mean(accs):.2f} ± {std:.2f}",
                f"{statistics.mean(r['params'] for r in rs):.0f}", f"{statistics.mean(r['seconds'] for r in rs):.0f}",
                rs[0]["weight_epochs"],
            ])
    return rows


def headline(results: list[dict]) -> str:
    parts = []
    for name in dict.fromkeys(r["dataset"] for r in results):
        acc = {arm: [100 * r["test_acc"] for r in results if r["dataset"] == name and r["arm"] == arm] for arm in ARMS}
        if not acc["aso-se"]:
            continue
        m = statistics.mean(acc["aso-se"])
        margins = ", ".join(f"{m - statistics.mean(acc[a]):+.2f} vs {a}" for a in BASELINES if acc[a])
        if acc["aso-arch"]:
            margins += f"; its genotype from scratch {statistics.mean(acc['aso-arch']):.2f}%"
        parts.append(f"{name} {m:.2f}% ({margins or 'no baseline recorded yet'})")
    return "ASO-SE mean test accuracy and margin in points: " + ("; ".join(parts) or "no aso-se arm recorded")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="digits,fashion_mnist", help="comma-separated; each runs experiments/<name>.toml")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--quick", action="store_true", help="reduced sizes (fewer cycles, smaller supernet, capped splits)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--json", default="", help="write every arm's figures to this file as it ends; run again "
                    "with the same file and sizes to go on where an interrupted run stopped (several processes "
                    "may share one file)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default); on 2 cores, "
                    "two processes of one thread each (one seed each) get more done than one of two threads")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms to run (default all); e.g. a second "
                    "process runs 'initial' of a seed while the first runs its aso-se arm")
    ap.add_argument("--report", action="store_true", help="print the table of the arms recorded in --json so far; train nothing")
    args = ap.parse_args(argv)
    if args.report and not args.json:
        ap.error("--report reads the arms recorded in a results file: give it with --json FILE")
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = tuple(a.strip() for a in args.arms.split(","))
    if unknown := sorted(set(arms) - set(ARMS)):
        ap.error(f"--arms: unknown arm {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    sizes = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes += "".join(f" --set {o}" for o in args.overrides)
    path = Path(args.json) if args.json else None
    checkpoints = checkpoints_for(path, sizes) if path else None
    saved = read_results(path) if path else []
    if saved:
        print(f"# {args.json}: {len(saved)} arms recorded earlier; those with sizes {sizes!r} are reused", flush=True)

    def save(record: dict) -> None:
        if path:
            append_result(path, {**record, "sizes": sizes})

    if args.threads:
        torch.set_num_threads(args.threads)
    results: list[dict] = []
    print(f"# {machine()}", flush=True)
    for name in args.datasets.split(","):
        sets = {"device": "cpu", "tracking.enabled": False}
        if args.quick:
            sets.update(QUICK.get(name, {}))
        if args.smoke:
            sets.update(SMOKE)
        cap = QUICK_FULL_TRAIN.get(name, 0) if args.quick else (256 if args.smoke else 0)
        sets.update(parse_override(o) for o in args.overrides)
        if args.threads:
            sets["threads"] = args.threads
        base_cfg = load(name, sets)
        for seed in seeds:
            done = {r["arm"]: r for r in saved if (r["dataset"], r["seed"], r.get("sizes")) == (base_cfg.data.name, seed, sizes)}
            if args.report:
                results += [done[arm] for arm in ARMS if arm in done]
                print(f"  {name} seed {seed}: " + (", ".join(f"{arm} {100 * done[arm]['test_acc']:.2f}%" for arm in ARMS if arm in done) or "nothing recorded"))
                continue
            results += run_seed(base_cfg.replace(seed=seed), cap, done, save, arms, checkpoints)
    print(table(["data set", "arm", "seeds", "test acc % (mean ± std)", "params", "wall s", "weight epochs"], summary(results)))
    print(headline(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

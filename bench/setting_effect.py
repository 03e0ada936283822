"""A setting's effect on an experiment's accuracy: the same seeds with and without it.

    python bench/setting_effect.py --set data.drop_last=true --seeds 0,1,2,3,4,5,6,7 \\
        --json bench/results/drop_last_digits.json      # resumable: finished runs are kept
    python bench/setting_effect.py --json bench/results/drop_last_digits.json --report
    python bench/setting_effect.py --smoke

Each seed runs the experiment (default: the default one, digits) twice, untracked
and with 1 thread: as it is, and with the ``--set`` overrides. Per metric (final
validation and test accuracy, in points, the run's seconds, and how far its alphas
moved: their entropy of a uniform choice's at the end, 1 = not at all) it reports both
arms' means and standard deviations and the mean paired difference with its 95%
confidence interval (``asolab compare``'s paired t). Use it before a setting that
changes the method becomes an experiment's default: the question is whether the
interval holds zero. Seconds compare only within one call on a quiet machine.
Every run is appended to ``--json`` as it ends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _common import SMOKE_SEARCH, cpu_model, table

from asolab import config
from asolab.compare.arms import paired_ci
from asolab.config import DEFAULT_EXPERIMENT
from asolab.runner import Runner
from asolab.runner.events import Recorder

# metric -> (unit scale, decimals printed); alpha_entropy is absent from older files
METRICS = {"val_acc": (100.0, 2), "test_acc": (100.0, 2), "seconds": (1.0, 2)}
METRICS["alpha_entropy"] = (1.0, 4)
UNTRACKED = ["threads=1", "tracking.enabled=false"]


def run_one(experiment: str, overrides: list[str], seed: int, sizes: list[str]) -> dict:
    """One untracked run of ``experiment`` at ``seed`` with ``sizes`` and ``overrides``."""
    cfg = config.load(experiment, [*UNTRACKED, *sizes, f"seed={seed}", *overrides])
    recorder = Recorder()
    result = Runner(cfg, [recorder]).run()
    (end,) = recorder.of("run_end")
    return {
        "val_acc": result.val_acc,
        "test_acc": result.test_acc,
        "seconds": result.seconds,
        "alpha_entropy": end.alpha_entropy,
    }


def read(path: Path | None) -> list[dict]:
    """The runs recorded so far (none without a file)."""
    return json.loads(path.read_text()) if path and path.exists() else []


def comparison(records: list[dict], experiment: str, sizes: list[str], setting: list[str]):
    """The records of one comparison: its experiment, sizes and setting."""
    key = (experiment, sizes, setting)
    return [r for r in records if (r["experiment"], r["sizes"], r["setting"]) == key]


def analyse(records: list[dict], setting: list[str]) -> dict[str, dict[str, float]]:
    """Per metric: both arms' mean and std and the paired difference's mean and 95% CI,
    over the seeds that have both arms."""
    arms = {
        (r["seed"], bool(r["overrides"])): r for r in records if r["overrides"] in ([], setting)
    }
    seeds = sorted({s for s, on in arms if (s, not on) in arms})
    out: dict[str, dict[str, float]] = {}
    for metric, (scale, _) in METRICS.items():
        if not all(metric in arms[(s, on)] for s in seeds for on in (False, True)):
            continue  # a metric the file's runs did not record
        off = [scale * arms[(s, False)][metric] for s in seeds]
        on = [scale * arms[(s, True)][metric] for s in seeds]
        diffs = [b - a for a, b in zip(off, on)]
        low, high = paired_ci(diffs)
        (off_mean, off_std), (on_mean, on_std) = _mean_std(off), _mean_std(on)
        out[metric] = {
            "seeds": len(seeds),
            "off_mean": off_mean,
            "off_std": off_std,
            "on_mean": on_mean,
            "on_std": on_std,
            "diff": _mean_std(diffs)[0],
            "ci_low": low,
            "ci_high": high,
        }
    return out


def _mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN where there are too few values)."""
    mean = statistics.mean(xs) if xs else float("nan")
    return mean, statistics.stdev(xs) if len(xs) > 1 else float("nan")


def report(records: list[dict], setting: list[str]) -> str:
    a = analyse(records, setting)
    rows = [_row(metric, s, METRICS[metric][1]) for metric, s in a.items()]
    head = ["metric (points, s)", "seeds", "without", f"with {' '.join(setting)}"]
    head += ["paired diff [95% CI]"]
    lines = [table(head, rows)]
    held = [m for m in ("val_acc", "test_acc") if a[m]["ci_low"] <= 0 <= a[m]["ci_high"]]
    lines.append(
        f"{' '.join(setting)}: the 95% interval holds zero for "
        f"{', '.join(held) or 'neither accuracy'} ({a['val_acc']['seeds']} paired seeds)"
    )
    return "\n".join(lines)


def _row(metric: str, s: dict[str, float], d: int) -> list:
    """A metric's row: arms as mean ± std, the paired difference and its interval."""
    return [
        metric,
        s["seeds"],
        f"{s['off_mean']:.{d}f} ± {s['off_std']:.{d}f}",
        f"{s['on_mean']:.{d}f} ± {s['on_std']:.{d}f}",
        f"{s['diff']:+.{d}f} [{s['ci_low']:+.{d}f}, {s['ci_high']:+.{d}f}]",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the setting")
    ap.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="experiment name or file")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--json", type=Path, default=None, help="append runs here, resume from it")
    ap.add_argument("--report", action="store_true", help="report the --json file, run nothing")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = ap.parse_args(argv)
    records = read(args.json)
    setting = args.set or (records[-1]["setting"] if records else [])
    if not setting:
        ap.error("--set KEY=VALUE: the setting to weigh (or --report with a --json file)")
    config.load(args.experiment, setting)  # a bad setting fails here, before any run
    sizes = [f"{k}={v}" for k, v in SMOKE_SEARCH.items()] if args.smoke else []
    sizes += ["data.train_subset=100", "search.final_epochs=0"] if args.smoke else []
    if not args.report:
        print(f"machine: {cpu_model()}; each run untracked, on 1 thread", flush=True)
        same = comparison(records, args.experiment, sizes, setting)
        done = {(r["seed"], bool(r["overrides"])) for r in same}
        for seed in (int(s) for s in args.seeds.split(",")):
            for overrides in ([], setting):
                if (seed, bool(overrides)) in done:
                    continue
                record = {"experiment": args.experiment, "sizes": sizes, "seed": seed}
                record |= {"setting": setting, "overrides": overrides}
                record |= run_one(args.experiment, overrides, seed, sizes)
                records.append(record)
                if args.json:
                    args.json.write_text(json.dumps(records, indent=1) + "\n")
                print(json.dumps(record), flush=True)
    print(report(comparison(records, args.experiment, sizes, setting), setting))
    return 0


if __name__ == "__main__":
    sys.exit(main())

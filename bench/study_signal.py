"""Study signal: do the knobs a study tunes move its objective more than the seed does?

    python bench/study_signal.py --json bench/results/study_signal_digits.json   # resumable
    python bench/study_signal.py --json bench/results/study_signal_digits.json --report
    python bench/study_signal.py --study temperature_mutation --seeds 0,1,2,3,4 --settings cold,hot
    python bench/study_signal.py --smoke

Each knob setting (``temperature.*`` and ``mutation.strength``, spanning the
ranges of studies/temperature_mutation.toml) runs the study's trial config
(its base experiment plus its [overrides]) with several seeds; the figure of
a run is the study's objective, the final validation accuracy (the test
split is recorded beside it, never analysed). Between-knob variation against
within-knob (seed) variation is summarised by a one-way ANOVA (F, p) and by
the ratio of the standard deviation of the knob means to the seed standard
deviation; the same ratio for an objective averaged over n seeds is
``std(knob means) / (seed std / sqrt(n))``. Every run is appended to the
``--json`` file as it ends; run again with the same file to go on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch
from _common import SMOKE_SEARCH, machine, table

from asolab.runner import Runner
from asolab.study.config import load_study

# Knob settings spanning the study's ranges: its enqueued default, the two
# corners (cold / no mutation, hot / full mutation) and one mid point.
SETTINGS: dict[str, dict[str, float]] = {
    "default": {
        "temperature.initial_temperature": 5.0,
        "temperature.min_temperature": 0.5,
        "temperature.anneal_fraction": 0.8,
        "mutation.strength": 0.25,
    },
    "cold": {
        "temperature.initial_temperature": 0.5,
        "temperature.min_temperature": 0.01,
        "temperature.anneal_fraction": 0.2,
        "mutation.strength": 0.0,
    },
    "hot": {
        "temperature.initial_temperature": 20.0,
        "temperature.min_temperature": 20.0,
        "temperature.anneal_fraction": 1.0,
        "mutation.strength": 1.0,
    },
    "mid": {
        "temperature.initial_temperature": 2.0,
        "temperature.min_temperature": 1.0,
        "temperature.anneal_fraction": 0.5,
        "mutation.strength": 0.6,
    },
}
SMOKE = {**SMOKE_SEARCH, "search.final_epochs": 0, "data.train_subset": 64}


def read_results(path: Path | None) -> list[dict]:
    return json.loads(path.read_text()) if path and path.exists() else []


def append_result(path: Path, record: dict) -> None:
    """Add one run to the results file, atomically (a kill loses at most the run in progress)."""
    records = read_results(path) + [record]
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records, indent=1))
    os.replace(tmp, path)


def run_one(base, setting: str, seed: int, sizes: str, threads: int) -> dict:
    knobs = SETTINGS[setting]
    cfg = base.replace(
        **knobs, seed=seed, threads=threads, device="cpu", **{"tracking.enabled": False}
    )
    res = Runner(cfg).run()
    return {
        "setting": setting,
        "seed": seed,
        "sizes": sizes,
        **knobs,
        "val_acc": res.val_acc,
        "cycle_val_acc": res.cycle_val_acc,
        "test_acc": res.test_acc,  # reported only: never part of the analysis
        "params": res.derived_params,
        "seconds": res.seconds,
        "threads": torch.get_num_threads(),
    }


def analyse(records: list[dict]) -> dict:
    """Between-knob against within-knob (seed) variation of the final validation accuracy."""
    from scipy.stats import f_oneway

    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(r["setting"], []).append(100 * r["val_acc"])
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    out: dict = {
        "settings": {
            k: {"n": len(v), "mean": statistics.mean(v), "std": statistics.stdev(v)}
            for k, v in groups.items()
        }
    }
    if len(groups) < 2:
        return out
    means = [statistics.mean(v) for v in groups.values()]
    # pooled within-setting standard deviation: the seed noise of one run
    dof = sum(len(v) - 1 for v in groups.values())
    seed_std = math.sqrt(sum((len(v) - 1) * statistics.variance(v) for v in groups.values()) / dof)
    f, p = f_oneway(*groups.values())
    between = statistics.stdev(means)
    n = min(len(v) for v in groups.values())
    out.update(
        {
            "anova_f": float(f),
            "anova_p": float(p),
            "std_of_knob_means": between,
            "seed_std": seed_std,
            "signal_to_noise": between / seed_std if seed_std else math.inf,
            "signal_to_noise_mean_of_n_seeds": {
                k: between / (seed_std / math.sqrt(k)) for k in (1, 2, 3, n)
            },
            "range_of_knob_means": max(means) - min(means),
        }
    )
    return out


def print_report(records: list[dict]) -> None:
    a = analyse(records)
    rows = [[k, s["n"], f"{s['mean']:.2f} ± {s['std']:.2f}"] for k, s in a["settings"].items()]
    print(table(["setting", "seeds", "final val acc % (mean ± std)"], rows))
    if "anova_f" in a:
        snr = ", ".join(
            f"{k} seed{'s' if k > 1 else ''} {v:.2f}"
            for k, v in a["signal_to_noise_mean_of_n_seeds"].items()
        )
        print(
            f"one-way ANOVA over settings: F = {a['anova_f']:.2f}, p = {a['anova_p']:.3g}; "
            f"std of setting means {a['std_of_knob_means']:.2f} points, "
            f"seed std {a['seed_std']:.2f} points, "
            f"range of means {a['range_of_knob_means']:.2f} points"
        )
        print(
            "signal / noise (std of setting means / std of the objective) "
            f"for an objective averaged over: {snr}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--study", default="temperature_mutation", help="study file whose trial config runs"
    )
    ap.add_argument(
        "--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}"
    )
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument(
        "--json", default="", help="append each run here as it ends; run again to go on"
    )
    ap.add_argument(
        "--report", action="store_true", help="analyse what --json holds; train nothing"
    )
    args = ap.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",")]
    if unknown := sorted(set(settings) - set(SETTINGS)):
        ap.error(
            f"--settings: unknown setting {', '.join(unknown)}; choose from {', '.join(SETTINGS)}"
        )
    seeds = [int(s) for s in args.seeds.split(",")]
    path = Path(args.json) if args.json else None
    sizes = "smoke" if args.smoke else "study"
    study = load_study(args.study)
    base = study.base.replace(**SMOKE) if args.smoke else study.base
    records = [r for r in read_results(path) if r.get("sizes") == sizes]
    if not args.report:
        torch.set_num_threads(args.threads)
        print(f"# {machine()}; study {study.name}: {dict(study.overrides)}", flush=True)
        for (
            seed
        ) in seeds:  # seed-major: an interrupted measurement has every setting at a few seeds
            for setting in settings:
                if any((r["setting"], r["seed"]) == (setting, seed) for r in records):
                    continue
                r = run_one(base, setting, seed, sizes, args.threads)
                records.append(r)
                if path:
                    append_result(path, r)
                print(
                    f"  {setting:<8} seed {seed}  val {100 * r['val_acc']:.2f}%  "
                    f"{r['seconds']:.0f} s",
                    flush=True,
                )
    print_report([r for r in records if r["setting"] in settings])
    return 0


if __name__ == "__main__":
    sys.exit(main())

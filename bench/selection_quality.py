"""Selection quality: does perturbation-based selection beat the alphas, and random?

    python bench/selection_quality.py --seeds 0,1,2,3,4 --threads 1     # train (resumable)
    python bench/selection_quality.py --seeds 0,1,2,3,4 --report        # the figures so far
    python bench/selection_quality.py --smoke --datasets digits --seeds 0,1 --tracking-uri ...

A thin driver over bench/search_quality.py and ``asolab rank``. For each
``search.selection`` ("alpha", "perturbation") it trains, at the reduced size
below plus any --set, the search's set: an ASO-SE run per seed and its
``random-final`` arm (a random genotype of the same size trained for the same
final epochs), in the MLflow experiment search_quality.py names for those
settings; then ranks each ASO-SE run's supernet (``asolab rank``: the
supernet's Kendall tau beside parameter count's). Every step keeps what is
finished: the same command goes on where an interrupted one stopped.

The report pairs the runs by seed: perturbation minus alpha, and each
selection minus its random-final arm, raw and with size taken out (the fit of
accuracy on log2 parameters across every run of both sets), in points with
95% paired-t intervals; and per selection the mean supernet tau, parameter
count's tau and their difference. Test accuracy is reported, never used to
choose anything.
"""

from __future__ import annotations

import argparse
import math
import os

import pandas as pd
import search_quality
from _common import run_resumable
from mlflow.tracking import MlflowClient

from asolab.baseline.ranking import rank_run
from asolab.compare.arms import arm_runs, paired_ci
from asolab.compare.select import load_selection
from asolab.compare.sizefit import residuals
from asolab.config import parse_override
from asolab.tracking import layout as L
from asolab.tracking import resolve_tracking_uri
from asolab.tracking.store import open_store

SELECTIONS = ("alpha", "perturbation")
ARM = "random-final"
# One run in about 10 minutes on one thread of these 2 cores (docs/baselines.md, "To
# measure"): the shipped search (3 cycles on a 5000-image split) and 4 final epochs on the
# whole training split instead of a 57-minute budget.
REDUCED = ("search.budget_minutes=0", "search.final_epochs=4")
# --smoke: perturbation selection measures each op's masking on one path of 32 images
SMOKE = ("search.selection_images=32", "search.selection_paths=1")
SMOKE_RANK = {"samples": 2, "epochs": 1}
RANK = {"samples": 6, "epochs": 2}


def overrides(selection: str, extra: list[str], smoke: bool) -> list[str]:
    """The --set list of one selection's set (its order names the experiment)."""
    return [*(SMOKE if smoke else REDUCED), *extra, f"search.selection={selection}"]


def experiment(dataset: str, sets: list[str], smoke: bool) -> str:
    sizes = ("smoke" if smoke else "full") + "".join(f"-{o}" for o in sets)
    return search_quality.experiment_name(dataset, sizes)


def rank_set(uri: str, source: str, seeds: list[int], threads: int, smoke: bool) -> None:
    """Rank every ASO-SE run of the set on ``seeds`` that has not been ranked yet."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_run(source).info.experiment_id
    runs = client.search_runs(
        [exp], f"tags.`{L.TAG_BASELINE_OF}` = '{source}' and tags.`{L.TAG_ARM}` = 'aso-se'"
    )
    for r in sorted(runs, key=lambda r: int(r.data.params.get("seed", 0))):
        if int(r.data.params.get("seed", -1)) not in seeds:
            continue  # another process's seeds
        if (
            L.RANKING_TAU_MINUS_PARAMS in r.data.metrics
            or "ranking_kendall_tau_all" in r.data.metrics
        ):
            continue
        figures = rank_run(
            uri,
            r.info.run_id,
            **(SMOKE_RANK if smoke else RANK),
            overrides={"threads": threads} if threads else None,
        )
        print(
            f"  ranked {r.info.run_name}: supernet tau {figures['ranking_kendall_tau_all']:+.3f}, "
            f"parameters {figures.get(L.RANKING_PARAMS_KENDALL_TAU, math.nan):+.3f}",
            flush=True,
        )


def _mean_ci(values: list[float], scale: float = 100.0) -> str:
    """Mean and 95% paired-t interval of ``values`` times ``scale`` (points: 100)."""
    if not values:
        return "-"
    low, high = paired_ci(values)
    mean = sum(values) / len(values)
    ci = "" if math.isnan(low) else f" (95% CI {scale * low:+.2f} .. {scale * high:+.2f})"
    return f"{scale * mean:+.2f}{ci} over {len(values)} seed(s)"


def _pairs(by: pd.Series, a: tuple, b: tuple) -> list[float]:
    """Per seed, ``by[a] - by[b]`` (``by`` indexed by selection, arm, seed), where both exist."""
    out = []
    for s in sorted({s for *_, s in by.index}):
        if (*a, s) in by.index and (*b, s) in by.index:
            x, y = by[(*a, s)], by[(*b, s)]
            if not (math.isnan(x) or math.isnan(y)):
                out.append(float(x - y))
    return out


CSV_COLUMNS = ["selection", "arm", "seed", "run_id", "val_acc", "test_acc", "params", "minutes"]
CSV_COLUMNS += ["ranking_kendall_tau_all", L.RANKING_PARAMS_KENDALL_TAU]


def report(uri: str, sources: dict[str, str], csv: str = "") -> list[str]:
    """The paired figures of the sets recorded so far (see the module docstring); with
    ``csv``, every run's row (selection, arm, seed, accuracies, size, taus) written there."""
    runs = set_runs(uri, sources)
    if csv:
        runs.sort_values(["seed", "selection", "arm"])[CSV_COLUMNS].to_csv(csv, index=False)
    return figures(runs, list(sources))


def set_runs(uri: str, sources: dict[str, str]) -> pd.DataFrame:
    """One row per run of each selection's set, with its supernet and parameter taus."""
    frames = []
    for selection, source in sources.items():
        records = load_selection(uri, baseline=[source]).records
        frame = arm_runs(records).assign(selection=selection)
        ranks = {r.run_id: r.metrics for r in records}
        for name in ("ranking_kendall_tau_all", L.RANKING_PARAMS_KENDALL_TAU):
            frame[name] = [ranks[rid].get(name, math.nan) for rid in frame["run_id"]]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def figures(runs: pd.DataFrame, selections: list[str]) -> list[str]:
    """The report's lines from the runs' rows (``set_runs``, or the committed CSV)."""
    runs = runs.copy()
    lines = []
    for metric in ("test_acc", "val_acc"):
        res, (slope, _, r, n) = residuals(runs, "params", metric)
        runs[f"{metric}_res"] = res
        lines.append(
            f"{metric}: fit on log2 parameters across {n} runs: "
            f"{100 * slope:+.2f} points per doubling, r {r:.2f}"
        )
        for column, how in ((metric, "raw"), (f"{metric}_res", "size taken out")):
            by = runs.set_index(["selection", "arm", "seed"])[column]

            aso = L.ARM_ASO_SE
            lines.append(
                f"  {how:>14}: perturbation - alpha "
                f"{_mean_ci(_pairs(by, ('perturbation', aso), ('alpha', aso)))}; "
                + "; ".join(
                    f"{sel} - its {ARM} {_mean_ci(_pairs(by, (sel, aso), (sel, ARM)))}"
                    for sel in selections
                )
            )
    for selection in selections:
        mine = runs[(runs["selection"] == selection) & (runs["arm"] == L.ARM_ASO_SE)]
        tau = mine["ranking_kendall_tau_all"].dropna()
        params = mine[L.RANKING_PARAMS_KENDALL_TAU].dropna()
        gap = (mine["ranking_kendall_tau_all"] - mine[L.RANKING_PARAMS_KENDALL_TAU]).dropna()
        lines.append(
            f"ranking, {selection}: supernet tau {tau.mean():+.3f} over {len(tau)} run(s), "
            f"parameter count's {params.mean():+.3f}; supernet minus parameters "
            f"{_mean_ci(list(gap), scale=1.0)}"
        )
    lines.append("per seed: test % (val %) and parameters, per selection and arm")
    for seed, mine in runs.groupby("seed"):
        cells = [
            f"{r['selection']} {r['arm']} {100 * r['test_acc']:.2f} ({100 * r['val_acc']:.2f}) "
            f"{r['params'] / 1000:.1f}k"
            for _, r in mine.sort_values(["selection", "arm"]).iterrows()
        ]
        lines.append(f"  seed {seed}: " + " | ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--datasets", default="fashion_mnist", help="one data set (experiments/<name>.toml)"
    )
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated; the first is the source")
    ap.add_argument(
        "--selections",
        default=",".join(SELECTIONS),
        help="which sets to train (comma-separated): one process per selection makes the "
        "two source runs side by side",
    )
    ap.add_argument(
        "--source-seed",
        type=int,
        default=None,
        help="the seed whose ASO-SE runs are the sources (default: the first of --seeds); "
        "a second process on other seeds names the same one",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process (0: auto)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    ap.add_argument("--tracking-uri", default="", help="MLflow store (default: mlruns/)")
    ap.add_argument("--report", action="store_true", help="print the figures so far; train nothing")
    ap.add_argument("--no-rank", action="store_true", help="skip the ranking diagnostic")
    ap.add_argument("--csv", default="", help="also write every run's row to this CSV file")
    args = ap.parse_args(argv)
    for o in args.sets:
        parse_override(o)  # a malformed --set fails before anything trains
    chosen = args.selections.split(",")
    if unknown := [s for s in chosen if s not in SELECTIONS]:
        ap.error(f"--selections: unknown {unknown[0]!r}; choose from {', '.join(SELECTIONS)}")
    uri = resolve_tracking_uri(args.tracking_uri)
    open_store(uri)  # processes started side by side on a new store: one builds its tables
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=uri)
    seeds = [int(s) for s in args.seeds.split(",")]
    seed = seeds[0] if args.source_seed is None else args.source_seed
    sources = {}
    for selection in chosen:
        sets = overrides(selection, args.sets, args.smoke)
        common = ["--datasets", args.datasets, "--seeds", args.seeds, "--arms", ARM]
        common += ["--source-seed", str(seed)]
        common += [x for o in sets for x in ("--set", o)]
        common += ["--tracking-uri", uri] + (["--smoke"] if args.smoke else [])
        common += ["--threads", str(args.threads)] if args.threads else []
        if not args.report:
            print(f"# selection {selection}", flush=True)
            search_quality.main(common)
        source = search_quality.find_source(
            client, experiment(args.datasets, sets, args.smoke), seed
        )
        if source is None:
            print(f"selection {selection}: no source run yet (seed {seed})")
            continue
        if not args.report and not args.no_rank:
            rank_set(uri, source, seeds, args.threads, args.smoke)
        sources[selection] = source
    if sources:
        print("\n".join(report(uri, sources, args.csv)), flush=True)
    return 0


if __name__ == "__main__":
    run_resumable(
        main,
        "selection_quality: stopped; the same command continues it",
    )

"""Search quality: the ASO-SE network vs its control arms trained for the same budget.

    python bench/search_quality.py --datasets digits --seeds 0,1,2         # tracked runs in mlruns/
    python bench/search_quality.py --datasets fashion_mnist --quick --threads 1
    python bench/search_quality.py --datasets fashion_mnist --report       # the arm view so far
    python bench/search_quality.py --smoke --tracking-uri sqlite:////tmp/sq/mlflow.db

A thin driver of ``asolab baseline`` and the arm view of ``asolab compare``.
Per data set, the ASO-SE run of the first seed (experiments/<data set>.toml,
sizes from --quick / --smoke / --set) is the source; ``asolab baseline`` then
gives every seed an ASO-SE run and the control arms (asolab/baseline/arms.py):

* ``scratch``  the genotype the ASO-SE run ended with, trained from scratch;
* ``random``   a random genotype with the ASO-SE network's parameter count (±10%);
* ``initial``  the genotype derive() reads from the fresh alphas (no evolution);

each with the same config, seed and weight-training budget, all recorded in
MLflow (experiment ``search-quality-<data set>-<sizes>``), so the same
comparison is ``asolab compare --baseline RUN_ID``. Run again with the same
arguments to go on where an interrupted invocation stopped: finished runs are
kept, a killed one resumes from its checkpoint. Processes on disjoint
```--seeds`` may share a store: the source run first, then e.g. ``--seeds 0,1,2`` and
``--seeds 3,4 --source-seed 0`` side by side.
The headline (last line) is ASO-SE's mean paired test-accuracy margin over
each arm with its 95% confidence interval; test accuracy is reported, never
used to choose anything.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile

import torch
from _common import SMOKE_SEARCH, machine, run_resumable

from asolab.baseline.cli import add_arms, parse_arms
from asolab.baseline.run import run_set
from asolab.compare.arms import (
    arm_lines,
    arm_runs,
    arm_seed_lines,
    arm_seed_table,
    arm_summary,
)
from asolab.compare.select import load_selection
from asolab.config import ConfigError, load, parse_override
from asolab.options import add_set, add_threads, add_tracking_uri
from asolab.runner import Runner
from asolab.tracking import MlflowTracker, resolve_tracking_uri
from asolab.tracking import layout as L
from asolab.tracking.store import open_store

QUICK = {
    "digits": {"search.cycles": 2, "search.final_epochs": 5, "space.init_channels": 8},
    "fashion_mnist": {
        "space.init_channels": 8,
        "data.train_subset": 2000,
        "data.val_fraction": 0.05,
        "search.cycles": 2,
        "search.w_epochs": 1,
        "search.alpha_epochs": 1,
        "search.retrain_epochs": 1,
        "search.final_epochs": 2,
    },
}
SMOKE = {
    **SMOKE_SEARCH,
    "search.final_epochs": 1,
    # the final epoch on the whole training split (~1150 digits) in 5 steps rather than 18
    "data.batch_size": 256,
    "data.train_subset": 64,
    "data.val_fraction": 0.05,
    "tracking.log_models": False,
}


def experiment_name(dataset: str, sizes: str) -> str:
    """The MLflow experiment of one data set at one set of sizes."""
    return f"search-quality-{dataset}-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', sizes)}"


def find_source(client, experiment: str, seed: int) -> str | None:
    """The finished ASO-SE source run of ``seed`` in ``experiment`` (None if there is none yet)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        f"tags.`{L.TAG_ARM}` = '{L.ARM_ASO_SE}' and params.seed = '{seed}'",
        order_by=["attributes.start_time ASC"],
    )
    for r in runs:  # the source tags itself as its own baseline set
        if (
            r.info.status == "FINISHED"
            and r.data.tags.get(L.TAG_BASELINE_OF, r.info.run_id) == r.info.run_id
        ):
            return r.info.run_id
    return None


def source_run(uri: str, cfg, experiment: str) -> str:
    """The source run of ``cfg`` (its seed), trained and tracked if it is not in the store."""
    from mlflow.tracking import MlflowClient

    found = find_source(MlflowClient(tracking_uri=uri), experiment, cfg.seed)
    if found:
        print(f"  seed {cfg.seed} aso-se   run {found} (recorded earlier)", flush=True)
        return found
    tracker = MlflowTracker(
        tracking_uri=uri,
        experiment=experiment,
        tags={L.TAG_ARM: L.ARM_ASO_SE},
        run_name=f"{cfg.data.name}-aso-se-seed{cfg.seed}",
        log_models=cfg.tracking.log_models,
    )
    # checkpointed into the run, as `asolab run` does: `asolab rank` needs the supernet
    with tempfile.TemporaryDirectory(prefix="search-quality-") as work:
        Runner(cfg, [tracker], checkpoint_dir=work).run()
    return tracker.run_id or ""


def headline(summary) -> str:
    parts = []
    for _, r in summary[
        (summary["metric"] == "test_acc") & (summary["arm"] != L.ARM_ASO_SE)
    ].iterrows():
        ci = (
            ""
            if r["ci95_low"] != r["ci95_low"]
            else f" [{100 * r['ci95_low']:+.2f}, {100 * r['ci95_high']:+.2f}]"
        )
        parts.append(f"{100 * r['diff_mean']:+.2f}{ci} vs {r['arm']}")
    return ", ".join(parts) or "no control arm recorded yet"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--datasets",
        default="digits,fashion_mnist",
        help="comma-separated; each runs experiments/<name>.toml",
    )
    ap.add_argument(
        "--seeds",
        default="0,1,2",
        help="comma-separated seeds; the first one's ASO-SE run is the source",
    )
    ap.add_argument(
        "--source-seed",
        type=int,
        default=None,
        help="the seed whose ASO-SE run is the source "
        "(default: the first of --seeds); a second process on other seeds names the same one",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes (fewer cycles, smaller supernet, capped search split)",
    )
    add_set(ap)
    add_arms(ap)
    add_threads(ap, help="torch CPU threads (0 = torch's default)")
    add_tracking_uri(ap)
    ap.add_argument(
        "--report",
        action="store_true",
        help="print the arm view of what the store holds; train nothing",
    )
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        arms = parse_arms(args.arms)
    except ConfigError as e:
        ap.error(str(e))
    sizes = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes += "".join(f"-{o}" for o in args.overrides)
    uri = resolve_tracking_uri(args.tracking_uri)
    open_store(uri)  # processes started side by side on a new store: one builds its tables
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {machine()}; store {uri}", flush=True)
    for name in args.datasets.split(","):
        sets = {
            "device": "cpu",
            **(QUICK.get(name, {}) if args.quick else {}),
            **(SMOKE if args.smoke else {}),
        }
        sets.update(parse_override(o) for o in args.overrides)
        if args.threads:
            sets["threads"] = args.threads
        source_seed = seeds[0] if args.source_seed is None else args.source_seed
        cfg = load(name, sets).replace(seed=source_seed)
        experiment = experiment_name(cfg.data.name, sizes)
        if args.report:
            from mlflow.tracking import MlflowClient

            source = find_source(MlflowClient(tracking_uri=uri), experiment, source_seed)
            if source is None:
                print(f"{name}: no ASO-SE run of seed {source_seed} in experiment {experiment}")
                continue
        else:
            print(f"{name} ({experiment}):", flush=True)
            source = source_run(uri, cfg, experiment)
            overrides = {"threads": args.threads} if args.threads else {}
            run_set(
                uri,
                source,
                arms,
                seeds,
                overrides=overrides,
                on_done=lambda r: print(r.line(), flush=True),
            )
        runs = arm_runs(load_selection(uri, baseline=[source]).records)
        summary = arm_summary(runs)
        print("\n".join(arm_lines(summary) + arm_seed_lines(arm_seed_table(runs))))
        print(
            f"{name}: ASO-SE test accuracy minus each arm, points, 95% CI: {headline(summary)}; "
            f"the same view: asolab compare --baseline {source}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    run_resumable(
        main,
        "search_quality: stopped; the same command continues it (finished runs are kept, "
        "the stopped one resumes from its checkpoint)",
    )

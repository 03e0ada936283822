"""``asolab compare``: put the genotypes of many runs side by side (terminal, CSV, HTML)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from typing import TYPE_CHECKING, TextIO

from ..errors import first_line
from ..options import add_tracking_uri
from ..runner.phases import EPOCH_FIELDS
from ..tracking import layout as L

if TYPE_CHECKING:  # pandas loads on use, so `asolab --help` stays fast
    import pandas as pd

    from .analysis import Comparison
    from .select import RunRecord, Selection

# The terminal shows the report's columns (compare.select.COLUMNS) but these wide ones;
# the CSV and the report keep them.
_WIDE = ("anneal_fraction", "warmup_epochs", *EPOCH_FIELDS)
_WIDE += ("final_epochs",)
_WIDE += ("genotype", "status", "experiment_id", "device", "alpha_entropy")
# Short headers keep the table within a terminal's width; the CSV and report keep the full names.
_SHORT = {
    "run_id": "id",
    "schedule": "sched",
    "initial_temperature": "tau0",
    "min_temperature": "tau_min",
    "mutation_strength": "strength",
    "peak_rss_mb": "peak_mb",
    "run_minutes": "wall_min",
}
SHOWN_ROWS = 10  # rows of the terminal table without --all: the best by validation accuracy


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare the genotypes of recorded runs (table, diffs, clusters, HTML report)",
        description="Select runs from the MLflow store and compare their final genotypes. "
        "With no selection, every run of every experiment is compared.",
    )
    _selection_options(p)
    _output_options(p)
    add_tracking_uri(p)
    p.set_defaults(func=cmd_compare)


def _selection_options(p: argparse.ArgumentParser) -> None:
    """Which runs: experiments, run ids, a filter, a study, baseline sets, the top K."""
    p.add_argument(
        "--experiment",
        "-e",
        action="append",
        default=[],
        metavar="NAME",
        help="an MLflow experiment (repeatable)",
    )
    p.add_argument(
        "--run",
        "-r",
        dest="runs",
        action="append",
        default=[],
        metavar="RUN_ID",
        help="a run: its id, an id prefix or its name (repeatable)",
    )
    p.add_argument(
        "--filter",
        default="",
        metavar="EXPR",
        help="MLflow search expression, e.g. \"params.seed = '1' and metrics.test_acc > 0.5\"",
    )
    p.add_argument("--study", default="", metavar="NAME", help="the trial runs of an Optuna study")
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="RUN_ID",
        help=(
            "an ASO-SE run (id, id prefix or name) and its control arms (made by "
            "'asolab baseline RUN_ID'); repeatable"
        ),
    )
    p.add_argument(
        "--top",
        type=int,
        default=None,
        metavar="K",
        help=(
            "compare the K best runs by --by, K >= 1 (runs without a genotype take no place); "
            "without --top every selected run is compared"
        ),
    )
    p.add_argument(
        "--by",
        default=L.FINAL_VAL_ACC,
        metavar="METRIC",
        help=f"metric for --top (default {L.FINAL_VAL_ACC}; highest first)",
    )
    p.add_argument(
        "--ascending", action="store_true", help="for --top: lowest first (losses, parameters)"
    )


def _output_options(p: argparse.ArgumentParser) -> None:
    """What to show and write: a diff, evolutions, CSV, the HTML report, its MLflow run."""
    p.add_argument(
        "--diff",
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="print the edge-by-edge diff of two selected runs (id, id prefix or run name)",
    )
    p.add_argument(
        "--evolution",
        action="store_true",
        help="print each run's genotype per cycle and the distance between cycles",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help=(
            f"print every run's row (else the {SHOWN_ROWS} best by validation accuracy), the "
            "distinct genotypes, the differences from the best run and the op frequencies"
        ),
    )
    p.add_argument("--csv", metavar="PATH", help="write the runs table as CSV")
    p.add_argument("--report", metavar="DIR", help="write an HTML report, DIR/index.html")
    p.add_argument(
        "--log-to-mlflow",
        action="store_true",
        help="attach the report to a comparison run in --comparison-experiment",
    )
    p.add_argument(
        "--comparison-experiment",
        default="asolab-comparisons",
        metavar="NAME",
        help="experiment for --log-to-mlflow (default asolab-comparisons)",
    )


def cmd_compare(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from .analysis import analyse
    from .select import CompareError, load_selection

    out = out or sys.stdout
    _check_outputs(args)
    selection = load_selection(
        args.tracking_uri or None,
        experiments=args.experiment,
        run_ids=args.runs,
        filter_string=args.filter,
        study=args.study,
        top=args.top or 0,
        by=args.by,
        ascending=args.ascending,
        baseline=args.baseline,
    )
    if not selection.records and not selection.skipped:
        raise CompareError(
            f"no runs match the selection ({selection.description}) in {selection.tracking_uri}"
        )
    # Resolve --diff before printing anything: an unknown or ambiguous run is an error, not a
    # late surprise.
    diff_pair = [selection.record(ref) for ref in args.diff] if args.diff else None
    want_evolution = bool(args.evolution or args.report or args.log_to_mlflow)
    comparison = analyse(selection, with_evolution=want_evolution)
    print(
        f"{len(selection.records)} runs compared ({selection.description}); store "
        f"{selection.tracking_uri}",
        file=out,
    )
    _print_data_sets(comparison, args.all, out)
    if diff_pair:
        _print_diff(*diff_pair, out)
    if args.evolution:
        _print_evolutions(comparison, out)
    _print_arms_and_rankings(comparison, out)
    if selection.skipped:
        print(f"\nskipped {len(selection.skipped)} run(s):", file=out)
        for s in selection.skipped:
            print(f"  {s}", file=out)
    if args.csv:
        _write_csv(comparison, args.csv, out)
    if args.report or args.log_to_mlflow:
        _write_report(comparison, args, out)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Before reading any run: a place that cannot be written costs seconds, not a comparison."""
    from .select import CompareError

    if args.top is not None and args.top < 1:
        raise CompareError(
            f"--top must be >= 1 (got {args.top}); leave --top out to compare every selected run"
        )
    if args.csv:
        check_writable(args.csv, "--csv", CompareError, folder=False)
    if args.report:
        check_writable(args.report, "--report", CompareError, folder=True)
    if args.log_to_mlflow and not args.comparison_experiment.strip():
        raise CompareError("--comparison-experiment must not be empty (default asolab-comparisons)")


def _print_data_sets(comparison: Comparison, every: bool, out: TextIO) -> None:
    """The summary and table of each data set's runs, apart (runs on different data share
    no best run and no Pareto front), with one line saying so."""
    from .analysis import analyse

    groups = comparison.selection.by_data_set()
    if len(groups) > 1:
        print(data_sets_line(groups), file=out)
    for name, group in groups.items():
        part = comparison if len(groups) == 1 else analyse(group, with_evolution=False)
        if len(groups) > 1:
            print(f"\n== data set {name}: {len(group.records)} run(s) ==", file=out)
        _print_table(part, out, every=every)
    if groups and not every:
        print(
            "\n(--all: every row, the distinct genotypes, the differences from the best run "
            "and the op frequencies)",
            file=out,
        )


def data_sets_line(groups: dict[str, Selection]) -> str:
    """The line that says the runs are on several data sets, and that each is apart."""
    counts = ", ".join(f"{name} {len(g.records)}" for name, g in groups.items())
    return (
        f"{len(groups)} data sets ({counts}): each is compared apart, with its own table, "
        "best run and Pareto front; runs on different data do not rank against each other"
    )


def summary_lines(comparison: Comparison) -> list[str]:
    """What a comparison comes to: its best run, its Pareto front, how many genotypes."""
    from ..baseline.pareto import pareto_front

    t = comparison.table
    out = []
    if t["val_acc"].notna().any():
        best = t.loc[t["val_acc"].idxmax()]
        params = "" if pd_isna(best["params"]) else f", {int(best['params']):,} params"
        test = "" if pd_isna(best["test_acc"]) else f", test_acc {best['test_acc']:.4f}"
        out.append(
            f"best run: {best['run_name']} ({best['experiment']}): val_acc "
            f"{best['val_acc']:.4f}{test}{params}"
        )
        points = [
            (float("nan") if pd_isna(p) else float(p), float(a))
            for p, a in zip(t["params"], t["val_acc"])
        ]
        front = [t.iloc[k] for k in pareto_front(points)]
        if front:
            out.append(
                "Pareto front (val_acc against params): "
                + ", ".join(
                    f"{r['run_name']} ({r['val_acc']:.4f}, {int(r['params']):,})" for r in front
                )
            )
    out.append(f"{len(comparison.clusters)} distinct genotype(s) among {len(t)} run(s)")
    from ..evolution.selection import UNDECIDED  # on use: torch stays out of --help

    undecided = int((t["alpha_entropy"] >= UNDECIDED).sum())
    if undecided:
        out.append(
            f"alphas near uniform (entropy >= {UNDECIDED} of uniform) in {undecided} of "
            f"{len(t)} run(s): the largest alpha per edge was decided by small differences "
            'there (docs/baselines.md, "How far a run\'s alphas moved")'
        )
    return out


def pd_isna(value: object) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def _print_table(comparison: Comparison, out: TextIO, every: bool = True) -> None:
    """The summary, the runs (the best few unless ``every``), the warnings; with ``every``
    the distinct genotypes, the diffs from the best run and the op frequencies too."""
    from .report import budget_warning, notices

    for line in summary_lines(comparison):
        print(line, file=out)
    print("", file=out)
    table = comparison.table
    if not every and len(table) > SHOWN_ROWS:
        table = table.sort_values("val_acc", ascending=False, na_position="last")
        table = table.head(SHOWN_ROWS)
    print(terminal_table(table, comparison.clusters), file=out)
    if len(table) < len(comparison.table):
        print(f"... and {len(comparison.table) - len(table)} more run(s) (--all)", file=out)
    budgets = budget_warning(comparison.table)
    for level, title, sentence in notices(comparison, budgets):  # as the HTML report says
        print(f"\n{level}: {title[0].lower()}{title[1:]}. {sentence}", file=out)
    if every:
        _print_details(comparison, bool(budgets), out)


def _print_details(comparison: Comparison, budgets: bool, out: TextIO) -> None:
    """The distinct genotypes, the diffs from the best run, the op frequencies."""
    print(f"\n{len(comparison.clusters)} distinct genotypes:", file=out)
    for _, c in comparison.clusters.iterrows():
        print(
            f"  [{c['cluster']}] {c['runs']} run(s): {c['run_names']}\n      {c['genotype']}",
            file=out,
        )
    if comparison.diffs:
        ref = comparison.diffs[0].reference
        across = " (by val acc across different budgets)" if budgets else ""
        print(
            f"\ndifferences from the best run {ref.run_name} ({ref.experiment}){across}:",
            file=out,
        )
        for d in comparison.diffs:
            print(f"  {d.other.run_name} ({d.other.experiment}): distance {d.distance}", file=out)
            for line in d.lines:
                print(f"    {line}", file=out)
    print("\noperation frequencies (edges):", file=out)
    print(comparison.op_frequencies.to_string(), file=out)


def _print_diff(a: RunRecord, b: RunRecord, out: TextIO) -> None:
    from ..space.genotype import distance
    from .analysis import diff_lines

    lines = diff_lines(a.genotype, b.genotype)
    print(
        f"\ndiff {a.run_name} -> {b.run_name}: distance {distance(a.genotype, b.genotype)}",
        file=out,
    )
    for line in lines or ["(identical genotypes)"]:
        print(f"  {line}", file=out)


def _print_evolutions(comparison: Comparison, out: TextIO) -> None:
    for r in comparison.selection.records:
        df = comparison.evolutions.get(r.run_id)
        print(f"\nevolution of {r.run_name} ({r.experiment}):", file=out)
        if df is None or df.empty:
            print("  (no genotypes/cycle_NNN.json artifacts)", file=out)
            continue
        for _, row in df.iterrows():
            acc = "" if math.isnan(row["val_acc"]) else f" val_acc {row['val_acc']:.4f}"
            print(
                f"  cycle {row['cycle']}: distance {row['distance_prev']}{acc}  {row['genotype']}",
                file=out,
            )
            if row["changes"]:
                print(f"      {row['changes']}", file=out)


def _print_arms_and_rankings(comparison: Comparison, out: TextIO) -> None:
    from .arms import arm_lines, arm_seed_lines

    if comparison.arms is not None:
        print("\ncontrol arms (asolab baseline):", file=out)
        for line in arm_lines(comparison.arms) + arm_seed_lines(comparison.arm_seeds):
            print(f"  {line}", file=out)
    if comparison.rankings is None:
        return
    from ..baseline.ranking import lead_text, p_text, proxy_text
    from ..baseline.sizerank import compare_text

    print(
        "\nranking diagnostic (asolab rank): Kendall tau (two-sided p) / Spearman rho, "
        "one-shot vs stand-alone val acc",
        file=out,
    )
    for _, r in comparison.rankings.iterrows():
        groups = (
            f"{name} {r[L.RANKING_KENDALL_TAU + s]:+.3f}{p_text(r[L.RANKING_KENDALL_P + s])} / "
            f"{r[L.RANKING_SPEARMAN_RHO + s]:+.3f}"
            for s, name in L.RANKING_GROUPS
        )
        proxy = r[L.RANKING_PROXY_TAU]
        reliability = (
            ""
            if math.isnan(proxy)
            else f"; proxy seed vs seed {proxy:+.3f}{p_text(r[L.RANKING_PROXY_P])}"
        )
        lead = lead_text(r)
        lead = f"; alphas lead {lead}" if lead else ""
        lead += compare_text(r)  # parameter count as the ranking baseline
        print(
            f"  {r['run_name']} ({proxy_text(r)}): " + ", ".join(groups) + reliability + lead,
            file=out,
        )


def _write_csv(comparison: Comparison, csv: str, out: TextIO) -> None:
    from .select import CompareError

    try:
        comparison.table.to_csv(csv, index=False)
    except OSError as exc:
        raise CompareError(f"--csv {csv}: cannot write it ({exc.strerror or exc})") from None
    print(f"\ntable written to {csv}", file=out)
    if comparison.arms is not None:
        arms_csv = arms_csv_path(csv)
        comparison.arms.to_csv(arms_csv, index=False)
        seeds_csv = arms_csv_path(csv, "arm_seeds")
        comparison.arm_seeds.to_csv(seeds_csv, index=False)
        print(f"arm view written to {arms_csv}, its per-seed table to {seeds_csv}", file=out)


def _write_report(comparison: Comparison, args: argparse.Namespace, out: TextIO) -> None:
    """The HTML report into --report, and/or attached to a comparison run in MLflow."""
    from .report import log_to_mlflow, write_report
    from .select import CompareError

    with tempfile.TemporaryDirectory(prefix="asolab-report-") as tmp:
        directory = args.report or tmp
        try:
            page = write_report(
                comparison,
                directory,
                title=f"asolab compare: {comparison.selection.description}",
            )
        except OSError as exc:
            raise CompareError(
                f"--report {directory}: cannot write the report ({exc.strerror or exc})"
            ) from None
        if args.report:
            print(f"report written to {page}", file=out)
        if not args.log_to_mlflow:
            return
        from mlflow.exceptions import MlflowException

        try:
            rid = log_to_mlflow(comparison, directory, args.comparison_experiment)
        except MlflowException as exc:
            raise CompareError(
                f"--log-to-mlflow: the store refused the comparison run ({first_line(exc)})"
            ) from None
        print(
            f"report logged to run {rid} in experiment {args.comparison_experiment} "
            "(artifacts: report/index.html)",
            file=out,
        )


def check_writable(path: str, flag: str, error: type[Exception], folder: bool) -> None:
    """Raise ``error`` (one line) unless ``path`` can be written: a file whose folder
    exists and is writable, or (``folder``) a folder that exists or can be made."""
    p = os.path.abspath(path)
    if not folder and os.path.isdir(p):
        raise error(
            f"{flag} {path}: is a directory; give a file name such as "
            f"{os.path.join(path, 'runs.csv')}"
        )
    if folder and os.path.exists(p) and not os.path.isdir(p):
        raise error(f"{flag} {path}: is a file; give a folder for the report")
    target = p if folder and os.path.isdir(p) else os.path.dirname(p)
    if not folder and not os.path.isdir(target):
        raise error(
            f"{flag} {path}: folder {target} does not exist; create it or choose another path"
        )
    while folder and not os.path.exists(
        target
    ):  # the report makes missing folders: check the first that exists
        target = os.path.dirname(target)
    if not os.path.isdir(target) or not os.access(target, os.W_OK):
        raise error(f"{flag} {path}: {target} is not a writable folder; choose another path")


def arms_csv_path(csv: str, part: str = "arms") -> str:
    """Where ``--csv PATH`` writes a part of the arm view: beside PATH, ``<stem>_<part>.csv``."""
    root, ext = os.path.splitext(csv)
    return f"{root}_{part}{ext or '.csv'}"


def terminal_table(table: pd.DataFrame, clusters: pd.DataFrame) -> str:
    """The runs table for a terminal: short headers, an id prefix, a cluster number instead of
    the genotype."""
    cluster_of = {g: c for g, c in zip(clusters["genotype"], clusters["cluster"])}
    t = table.assign(
        cluster=table["genotype"].map(cluster_of), run_id=table["run_id"].map(L.short_id)
    )
    from .select import COLUMNS

    shown = [c for c in (*COLUMNS, "cluster") if c not in _WIDE and c in t.columns]
    t = t[shown].rename(columns=_SHORT)
    return t.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.4g}")

"""The arm view of a comparison: ASO-SE against its control arms.

Runs that ``asolab baseline`` made carry an arm tag and the ASO-SE run (same
seed) they control for. Per arm: mean and standard deviation of the final
validation and test accuracy; per control run, the paired difference
ASO-SE minus the arm (positive: the search won); per arm, the mean paired
difference with a 95% paired-t confidence interval. The per-seed table puts
each ASO-SE run beside its control runs (accuracies, final parameter count,
minutes of training). Test accuracy is reported here, never used to choose
anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from ..tracking import layout as L
from .select import RunRecord
from .sizefit import SIZE_MEASURES, adjusted, adjusted_lines, ahead_text, size_columns

# an arm column -> the run metrics it reads, first found
ARM_METRICS = (("test_acc", (L.TEST_ACC,)), ("val_acc", (L.FINAL_VAL_ACC,)))
ARM_COLUMNS = (
    "arm",
    "metric",
    "runs",
    "mean",
    "std",
    "pairs",
    "diff_mean",
    "ci95_low",
    "ci95_high",
    "per_seed_diff",
)
# beside each paired difference: the same with size taken out (compare/sizefit.py)
ARM_COLUMNS += tuple(c for m, _ in SIZE_MEASURES for c in size_columns(m))


def has_arms(records: Sequence[RunRecord]) -> bool:
    return any(L.TAG_ARM in r.tags for r in records)


def arm_runs(
    records: Sequence[RunRecord], flops: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """One row per run with an arm: arm, seed, the run it controls for, the two accuracies,
    the final network's parameters and (from ``flops``, by run id) multiply-adds."""
    flops = flops or {}
    rows = []
    for r in records:
        arm = r.tags.get(L.TAG_ARM)
        if arm is None:
            continue
        rows.append(
            {
                "arm": arm,
                "seed": r.param("seed", int),
                "run_id": r.run_id,
                "run_name": r.run_name,
                "controls": r.tags.get(L.TAG_CONTROLS, ""),
                "baseline_of": r.tags.get(L.TAG_BASELINE_OF, ""),
                **{name: r.metric(*sources) for name, sources in ARM_METRICS},
                "params": r.metric(L.FINAL_PARAMS),
                "flops": flops.get(r.run_id, math.nan),
                "minutes": r.metric(L.RUN_SECONDS) / 60,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "arm",
            "seed",
            "run_id",
            "run_name",
            "controls",
            "baseline_of",
            *(m for m, _ in ARM_METRICS),
            "params",
            "flops",
            "minutes",
        ],
    )


def paired_ci(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Paired-t confidence interval of the mean of ``diffs`` (NaN with fewer than two)."""
    from scipy.stats import t

    n = len(diffs)
    if n < 2:
        return math.nan, math.nan
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def _order(arms: Sequence[str]) -> list[str]:
    from ..baseline.arms import ARMS

    known = [L.ARM_ASO_SE, *ARMS]
    return sorted(set(arms), key=lambda a: (known.index(a) if a in known else len(known), a))


def arm_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per arm and metric: mean ± std, and the paired difference to ASO-SE with its 95% CI."""
    rows = []
    by_id = runs.set_index("run_id")
    for arm in _order(runs["arm"].tolist()):
        mine = runs[runs["arm"] == arm]
        for metric, _ in ARM_METRICS:
            values = [v for v in mine[metric] if not math.isnan(v)]
            diffs: list[tuple[int, float]] = []
            if arm != L.ARM_ASO_SE:
                for _, r in mine.iterrows():
                    if r["controls"] in by_id.index and not math.isnan(r[metric]):
                        diffs.append(
                            (r["seed"], float(by_id.loc[r["controls"], metric]) - r[metric])
                        )
            d = [x for _, x in diffs]
            low, high = paired_ci(d)
            rows.append(
                {
                    "arm": arm,
                    "metric": metric,
                    "runs": len(values),
                    "mean": sum(values) / len(values) if values else math.nan,
                    "std": float(pd.Series(values).std()) if len(values) > 1 else math.nan,
                    "pairs": len(d),
                    "diff_mean": sum(d) / len(d) if d else math.nan,
                    "ci95_low": low,
                    "ci95_high": high,
                    "per_seed_diff": " ".join(f"s{s}:{100 * x:+.2f}" for s, x in sorted(diffs)),
                }
                | {
                    k: v
                    for m, _ in SIZE_MEASURES
                    for k, v in adjusted(runs, arm, metric, m).items()
                }
            )
    return pd.DataFrame(rows, columns=list(ARM_COLUMNS))


def arm_lines(summary: pd.DataFrame) -> list[str]:
    """The arm view for a terminal, in percentage points."""

    def pct(v: float) -> str:
        return "-" if math.isnan(v) else f"{100 * v:.2f}"

    lines = []
    width = max([8, *(len(a) for a in summary["arm"])])  # 8: the built-in arms' column
    for metric, _ in ARM_METRICS:
        lines.append(
            f"{metric} by arm (mean ± std %, ASO-SE minus arm in points, paired over seeds):"
        )
        rows = summary[summary["metric"] == metric]
        stats = [f"{pct(r['mean'])} ± {pct(r['std'])}" for _, r in rows.iterrows()]
        stat_width = max(map(len, stats), default=0)  # a one-seed arm's std is "-"
        for (_, r), stat in zip(rows.iterrows(), stats):
            text = f"  {r['arm']:<{width}} {r['runs']} run(s)  {stat:<{stat_width}}"
            if r["arm"] != L.ARM_ASO_SE:
                ci = (
                    ""
                    if math.isnan(r["ci95_low"])
                    else f", 95% CI [{100 * r['ci95_low']:+.2f}, {100 * r['ci95_high']:+.2f}]"
                )
                diff = "-" if math.isnan(r["diff_mean"]) else f"{100 * r['diff_mean']:+.2f}"
                text += (
                    f"   ASO-SE - {r['arm']}: {diff} over {r['pairs']} pair(s){ci}  "
                    f"{r['per_seed_diff']}"
                )
            lines.append(text)
        lines += adjusted_lines(summary, metric)
    ahead = ahead_text(summary)
    if ahead:
        lines.append(ahead)
    return lines


SEED_FIELDS = ("test_acc", "val_acc", "params", "minutes")  # per arm in the per-seed table


def arm_seed_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per ASO-SE run: its seed and, per arm, the figures of the run of that arm.

    A control run joins the row of the ASO-SE run it controls for, so a row holds one
    seed's pairs; a control whose ASO-SE run is not selected still gets its row.
    Columns: ``seed``, ``aso_se_run``, then ``<arm> <field>`` for each arm and field
    of :data:`SEED_FIELDS`, arms in the arm view's order.
    """
    arms = _order(runs["arm"].tolist())
    rows: dict[str, dict] = {}
    for _, r in runs.iterrows():
        key = r["run_id"] if r["arm"] == L.ARM_ASO_SE else r["controls"]
        row = rows.setdefault(key, {"seed": r["seed"], "aso_se_run": key})
        for field in SEED_FIELDS:
            row.setdefault(f"{r['arm']} {field}", r[field])
    columns = ["seed", "aso_se_run", *(f"{a} {f}" for a in arms for f in SEED_FIELDS)]
    table = pd.DataFrame(list(rows.values()), columns=columns)
    return table.sort_values(["seed", "aso_se_run"], kind="stable").reset_index(drop=True)


def arm_seed_display(table: pd.DataFrame) -> pd.DataFrame:
    """The per-seed table as text cells: per arm "test (val) params minutes", "-" if none."""
    arms = [c[: -len(" test_acc")] for c in table.columns if c.endswith(" test_acc")]

    def cell(row: pd.Series, arm: str) -> str:
        test, val, params, minutes = (row[f"{arm} {f}"] for f in SEED_FIELDS)
        if pd.isna(test):
            return "-"
        text = f"{100 * test:.2f}" + ("" if pd.isna(val) else f" ({100 * val:.2f})")
        text += "" if pd.isna(params) else f" {params / 1000:.1f}k"
        return text + ("" if pd.isna(minutes) else f" {minutes:.0f}m")

    rows = [
        {"seed": str(row["seed"]), "aso-se run": L.short_id(str(row["aso_se_run"]))}
        | {arm: cell(row, arm) for arm in arms}
        for _, row in table.iterrows()
    ]
    return pd.DataFrame(rows, columns=["seed", "aso-se run", *arms])


def arm_seed_lines(table: pd.DataFrame) -> list[str]:
    """The per-seed table for a terminal: test % (val %), parameters and minutes per arm."""
    display = arm_seed_display(table)
    widths = [max([len(c), *map(len, display[c])]) for c in display.columns]
    lines = ["per seed: test % (val %), final parameters, minutes of training"]
    for cells in [list(display.columns), *display.itertuples(index=False)]:
        lines.append("  " + "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip())
    return lines

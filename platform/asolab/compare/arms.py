"""The arm view of a comparison: ASO-SE against its control arms.

Runs that ``asolab baseline`` made carry an arm tag and the ASO-SE run (same
seed) they control for. Per arm: mean and standard deviation of the final
validation and test accuracy; per control run, the paired difference
ASO-SE minus the arm (positive: the search won); per arm, the mean paired
difference with a 95% paired-t confidence interval. Test accuracy is
reported here, never used to choose anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from ..tracking import layout as L
from .select import RunRecord

ARM_METRICS = (("test_acc", ("test_acc",)), ("val_acc", ("final_val_acc",)))
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


def has_arms(records: Sequence[RunRecord]) -> bool:
    return any(L.TAG_ARM in r.tags for r in records)


def arm_runs(records: Sequence[RunRecord]) -> pd.DataFrame:
    """One row per run with an arm: arm, seed, the run it controls for, the two accuracies."""
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
    return lines


def arm_view(records: Sequence[RunRecord]) -> pd.DataFrame | None:
    """The arm summary of ``records``, or None when no run has an arm."""
    if not has_arms(records):
        return None
    return arm_summary(arm_runs(records))

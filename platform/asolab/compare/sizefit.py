"""Size taken out of the arm view: is any arm ahead once bigger networks are allowed for?

Over the runs of the arm view, accuracy often follows the final network's size
more than the arm that made it. So accuracy is fitted on the base-2 logarithm
of a size measure (the parameter count, and the multiply-adds of one forward
pass, counted once per genotype) by least squares across every run shown; a
run's residual is its accuracy minus the fit's value at its size. The
size-adjusted paired difference of a control run is the ASO-SE run's residual
minus its own (the same seed's pair, as the raw difference), with a 95%
paired-t interval over seeds. The fit's slope (points per doubling) and its
Pearson r say how much size explains. Test accuracy is reported, never used to
select anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..space.genotype import Genotype
from ..tracking import layout as L

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from .select import RunRecord

# size measure -> how the lines name it
SIZE_MEASURES = (("params", "parameters"), ("flops", "multiply-adds"))
SIZE_COLUMNS = ("adj_{m}_diff_mean", "adj_{m}_ci95_low", "adj_{m}_ci95_high")
SIZE_COLUMNS += ("adj_{m}_mean_residual", "adj_{m}_slope", "adj_{m}_r", "adj_{m}_runs")
MIN_FIT_RUNS = 3  # a line through two points leaves no residual to compare


def size_columns(measure: str) -> list[str]:
    """The arm summary's columns for one size measure."""
    return [c.format(m=measure) for c in SIZE_COLUMNS]


def fit_on_log_size(size: Sequence[float], acc: Sequence[float]) -> tuple[float, float, float]:
    """Least squares of ``acc`` on ``log2(size)``: (slope per doubling, intercept, Pearson r);
    NaNs when fewer than MIN_FIT_RUNS points or the sizes are all equal."""
    x = np.log2(np.asarray(size, dtype=float))
    y = np.asarray(acc, dtype=float)
    if len(x) < MIN_FIT_RUNS or np.ptp(x) == 0:
        return math.nan, math.nan, math.nan
    slope, intercept = np.polyfit(x, y, 1)
    r = float(np.corrcoef(x, y)[0, 1]) if np.ptp(y) > 0 else math.nan
    return float(slope), float(intercept), r


def residuals(runs: pd.DataFrame, measure: str, metric: str) -> tuple[pd.Series, tuple]:
    """Each run's residual from the fit of ``metric`` on log2 ``measure`` (NaN for a run
    without either), and the fit (slope, intercept, r, runs fitted)."""
    if measure not in runs or metric not in runs:  # runs recorded without that figure
        return pd.Series(math.nan, index=runs.index), (math.nan, math.nan, math.nan, 0)
    ok = runs[measure].notna() & runs[metric].notna() & (runs[measure] > 0)
    slope, intercept, r = fit_on_log_size(runs.loc[ok, measure], runs.loc[ok, metric])
    res = pd.Series(math.nan, index=runs.index)
    if not math.isnan(slope):
        res[ok] = runs.loc[ok, metric] - (intercept + slope * np.log2(runs.loc[ok, measure]))
    return res, (slope, intercept, r, int(ok.sum()))


def adjusted(runs: pd.DataFrame, arm: str, metric: str, measure: str) -> dict[str, float]:
    """The size-adjusted figures of ``arm`` for the summary row (metric, arm)."""
    from .arms import paired_ci

    res, (slope, _, r, n) = residuals(runs, measure, metric)
    by_id = dict(zip(runs["run_id"], res))
    mine = runs["arm"] == arm
    diffs = []
    if arm != L.ARM_ASO_SE:
        for rid, controls in zip(runs.loc[mine, "run_id"], runs.loc[mine, "controls"]):
            pair = by_id.get(controls, math.nan) - by_id[rid]
            if not math.isnan(pair):
                diffs.append(pair)
    low, high = paired_ci(diffs)
    values = size_columns(measure)
    figures = (
        sum(diffs) / len(diffs) if diffs else math.nan,
        low,
        high,
        float(res[mine].mean()) if res[mine].notna().any() else math.nan,
        slope,
        r,
        float(n),
    )
    return dict(zip(values, figures))


def _pts(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:+.2f}"


def adjusted_lines(summary: pd.DataFrame, metric: str) -> list[str]:
    """Per size measure with a fit: the fit, and per arm its mean residual and the
    size-adjusted difference ASO-SE minus the arm with its 95% interval."""
    rows = summary[summary["metric"] == metric]
    width = max([8, *(len(a) for a in rows["arm"])])
    lines = []
    for measure, name in SIZE_MEASURES:
        diff, low, high, mean_res, slope, r, n = size_columns(measure)
        if rows.empty or rows[slope].isna().all():
            continue
        first = rows.iloc[0]
        lines.append(
            f"{metric} after a fit on log2 {name} across {int(first[n])} runs: "
            f"{100 * first[slope]:+.2f} points per doubling, r {first[r]:.2f}; "
            "mean residual per arm, ASO-SE minus arm with size taken out:"
        )
        for _, row in rows.iterrows():
            text = f"  {row['arm']:<{width}} residual {_pts(row[mean_res])}"
            if row["arm"] != L.ARM_ASO_SE and not math.isnan(row[diff]):
                ci = (
                    ""
                    if math.isnan(row[low])
                    else f", 95% CI [{_pts(row[low])}, {_pts(row[high])}]"
                )
                text += f"   ASO-SE - {row['arm']}: {_pts(row[diff])}{ci}"
            lines.append(text)
    return lines


def ahead_text(summary: pd.DataFrame, measure: str = "params") -> str | None:
    """One line: is any arm ahead once size is taken out (by the fit on ``measure``)?
    An arm is ahead of the other when the 95% interval of the size-adjusted difference
    excludes zero. None when no metric has a fit."""
    diff, low, high = size_columns(measure)[:3]
    name = dict(SIZE_MEASURES)[measure]
    parts = []
    for metric in summary["metric"].unique():
        rows = summary[(summary["metric"] == metric) & summary[low].notna()]
        if rows.empty:
            continue
        ahead = []
        for _, row in rows.iterrows():
            if row[low] > 0:
                ahead.append(f"ASO-SE ahead of {row['arm']} by {_pts(row[diff])}")
            elif row[high] < 0:
                ahead.append(f"{row['arm']} ahead of ASO-SE by {_pts(-row[diff])}")
        parts.append(f"{metric}: " + ("; ".join(ahead) if ahead else "no arm ahead"))
    if not parts:
        return None
    return (
        f"once size is taken out (fit on log2 {name}; ahead = 95% interval above zero): "
        + ", ".join(parts)
    )


def run_info_flops(text: str | None, genotype: Genotype, params: float) -> float:
    """Multiply-adds of the final network from a run's run_info.json text and its final
    genotype; NaN when the run has none, or when the recorded spec is not the final
    network's (a run that grew records the spec it started with: its parameter count
    then differs from the run's ``params``)."""
    from ..space.flops import network_size
    from ..space.spec import ArchSpec

    if not text:
        return math.nan
    try:
        info = json.loads(text)
        spec = ArchSpec.from_dict(info["arch"])
        counted, flops = network_size(spec, genotype, int(info["data"]["image_size"]))
    except (KeyError, TypeError, ValueError, RuntimeError):
        return math.nan
    return float(flops) if math.isnan(params) or counted == int(params) else math.nan


def flops_by_run(client: MlflowClient, records: Sequence[RunRecord]) -> dict[str, float]:
    """Multiply-adds of each arm run's final network, counted once per (spec, genotype)."""
    from ..tracking.runs import read_artifact

    cache: dict[tuple, float] = {}
    out = {}
    for r in records:
        if L.TAG_ARM not in r.tags:
            continue
        text = read_artifact(client, r.run_id, L.RUN_INFO_ARTIFACT)
        key = (text, r.genotype.canonical, r.metric(L.FINAL_PARAMS))
        if key not in cache:
            cache[key] = run_info_flops(text, r.genotype, r.metric(L.FINAL_PARAMS))
        out[r.run_id] = cache[key]
    return out

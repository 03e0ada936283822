"""The Pareto view of a comparison: accuracy against parameters for every run shown
(by arm where runs carry one, else by experiment; ASO-SE runs highlighted) and, in a
panel of their own, the genotypes that ranking diagnostics trained alone.

The front goes through validation accuracy; test accuracy is plotted, marked, never
used to draw or choose anything (:mod:`asolab.baseline.pareto`).
"""

from __future__ import annotations

import math

from ..baseline.pareto import Point, pareto_front, pareto_png, ranking_points
from ..tracking import layout as L
from .analysis import Comparison, labels

PARETO_FILE = "pareto.png"  # beside the report's index.html


def run_points(comparison: Comparison) -> list[Point]:
    """Every run with a parameter count: its final validation and test accuracy; an
    ASO-SE run (a search, not a control arm) highlighted."""
    points = []
    arms = any(L.TAG_ARM in r.tags for r in comparison.records)
    for name, r in zip(labels(comparison.records), comparison.records):
        arm = r.tags.get(L.TAG_ARM, "")
        points.append(
            Point(
                r.metric(L.FINAL_PARAMS),
                r.metric(L.FINAL_VAL_ACC),
                r.metric(L.TEST_ACC),
                group=(arm or L.ARM_ASO_SE) if arms else r.experiment,
                highlight=arm in ("", L.ARM_ASO_SE),
                label=name,
            )
        )
    return points


def data_set_points(comparison: Comparison) -> dict[str, list[Point]]:
    """The runs' points by data set (runs on different data share no front)."""
    out: dict[str, list[Point]] = {}
    for r, point in zip(comparison.records, run_points(comparison)):
        out.setdefault(r.data_set, []).append(point)
    return dict(sorted(out.items()))


def panels(comparison: Comparison) -> list[tuple[str, list[Point]]]:
    """The runs' panel (one per data set), then one of the ranked genotypes when any
    run has them."""
    by_data = data_set_points(comparison)
    if len(by_data) > 1:
        out = [(f"runs on {name}: final networks", pts) for name, pts in by_data.items()]
    else:
        out = [("runs: final networks", run_points(comparison))]
    ranked = [p for pairs in comparison.ranking_pairs.values() for p in ranking_points(pairs)]
    if any(not math.isnan(p.params) for p in ranked):
        out.append(("ranked genotypes: short stand-alone training", ranked))
    return out


def front_labels(points: list[Point]) -> list[str]:
    """The labels of the points on the validation front, smallest first."""
    return [points[k].label for k in pareto_front([(p.params, p.val_acc) for p in points])]


def pareto_html(comparison: Comparison, img) -> list[str]:
    """The report's section: the picture (``img(png, alt)`` makes the tag) and the runs
    on the front; nothing when no run has a parameter count."""
    png = pareto_png(panels(comparison))
    if png is None:
        return []
    import html

    by_data = data_set_points(comparison)
    fronts = [
        (f"{name}: " if len(by_data) > 1 else "") + (", ".join(front_labels(pts)) or "–")
        for name, pts in by_data.items()
    ]

    return [
        "<h2>Accuracy against size (Pareto view)</h2>",
        "<p>Validation accuracy (o) and, marked, test accuracy (x) against parameters. The "
        "black step line is the Pareto front through validation accuracy: no network shown "
        "has fewer parameters and a higher validation accuracy than a point on it. ASO-SE "
        "runs (and genotypes sampled from the alphas) are drawn large with a black edge. "
        "Ranked genotypes trained only briefly, so they have a panel and a front of their own."
        "</p>",
        img(png, "accuracy against parameters, Pareto front"),
        *(
            [f"<p>{len(by_data)} data sets: each has its own panel and front.</p>"]
            if len(by_data) > 1
            else []
        ),
        "<p>On the runs' front: " + html.escape("; ".join(fronts) or "–") + "</p>",
    ]

"""Accuracy against size: the Pareto view of runs, arms and ranked genotypes.

A network is on the Pareto front when no other shown network has at most its
parameters and at least its validation accuracy, one of them strictly. The
front is drawn through validation accuracy only; test accuracy is plotted,
marked, never used to draw or choose anything. Short stand-alone trainings
(``asolab rank``) and full runs have different budgets, so each panel has its
own front.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One network on the plot."""

    params: float
    val_acc: float
    test_acc: float = math.nan  # plotted marked (x), never on the front
    group: str = ""  # an arm, or "alphas" / "random" for ranked genotypes
    highlight: bool = False  # ASO-SE runs, and the genotypes sampled from the alphas
    label: str = ""


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated (size, accuracy) points, smallest size first: fewer
    parameters and higher accuracy are better; points with a NaN never count."""
    ok = [k for k, (s, a) in enumerate(points) if not (math.isnan(s) or math.isnan(a))]
    front = []
    for k in ok:
        s, a = points[k]
        dominated = any(
            points[j][0] <= s and points[j][1] >= a and (points[j][0] < s or points[j][1] > a)
            for j in ok
            if j != k
        )
        if not dominated:
            front.append(k)
    return sorted(front, key=lambda k: (points[k][0], -points[k][1]))


def pareto_png(panels: Sequence[tuple[str, Sequence[Point]]]) -> bytes | None:
    """One panel per (title, points): validation accuracy (o) and test accuracy (x)
    against parameters (log scale), the validation front as a step line, highlighted
    points drawn large with a black edge. None when no panel has a point."""
    panels = [
        (t, [p for p in pts if p.params > 0 and not math.isnan(p.val_acc)]) for t, pts in panels
    ]
    panels = [(t, pts) for t, pts in panels if pts]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(7.4 * len(panels), 4.2), squeeze=False)
    for ax, (title, pts) in zip(axes[0], panels):
        _draw_panel(ax, title, pts, plt.get_cmap("tab10"))
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _draw_panel(ax, title: str, pts: Sequence[Point], cmap) -> None:
    """One panel of :func:`pareto_png`: the groups' points, then the front."""
    groups = list(dict.fromkeys(p.group for p in pts))
    for g, group in enumerate(groups):
        mine = [p for p in pts if p.group == group]
        colour = cmap(g % 10)
        label = f"{group} (val)"
        for hl in (False, True):
            chosen = [p for p in mine if p.highlight == hl]
            if not chosen:
                continue
            style = {"s": 70, "edgecolors": "black", "linewidths": 1.2} if hl else {"s": 26}
            ax.scatter(
                [p.params for p in chosen],
                [p.val_acc for p in chosen],
                color=colour,
                marker="o",
                label=label,
                zorder=3,
                **style,
            )
            label = None  # one legend entry per group
        tests = [p for p in mine if not math.isnan(p.test_acc)]
        if tests:
            ax.scatter(
                [p.params for p in tests],
                [p.test_acc for p in tests],
                color=colour,
                marker="x",
                s=30,
                label=f"{group} (test, marked)",
                zorder=2,
            )
    front = [pts[k] for k in pareto_front([(p.params, p.val_acc) for p in pts])]
    ax.step(
        [p.params for p in front],
        [p.val_acc for p in front],
        where="post",
        color="black",
        linewidth=1,
        label="Pareto front (val)",
        zorder=1,
    )
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))


def ranking_points(pairs: Sequence[dict]) -> list[Point]:
    """The ranked genotypes (records of a ranking's pairs.json) as points: stand-alone
    validation accuracy against parameters; those from the alphas highlighted."""
    return [
        Point(
            float(p.get("params") or math.nan),
            float(p["standalone_val_acc"]),
            group="sampled from alphas" if p["source"] == "alphas" else "random",
            highlight=p["source"] == "alphas",
            label=p["genotype"],
        )
        for p in pairs
    ]


def log_png(client, run_id: str, png: bytes | None, artifact_path: str) -> None:
    """Record ``png`` (when there is one) in run ``run_id`` at ``artifact_path``."""
    if png is None:
        return
    import tempfile
    from pathlib import Path

    folder, _, name = artifact_path.rpartition("/")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(png)
        client.log_artifact(run_id, str(path), folder or None)

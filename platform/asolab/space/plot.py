"""Pictures of genotypes: the normal and reduction cells, and the cells with
their own alphas, as small DAGs (PNG).

Drawn with matplotlib alone (no graphviz binary), so it works on any machine.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure  # a bare Figure renders with Agg: never needs a screen or pyplot
from matplotlib.patches import FancyArrowPatch

from .genotype import Genotype

_COLOURS = {
    "sep_conv_3x3": "#1f77b4", "sep_conv_5x5": "#17becf", "dil_conv_3x3": "#2ca02c", "dil_conv_5x5": "#98df8a",
    "max_pool_3x3": "#d62728", "avg_pool_3x3": "#ff9896", "skip_connect": "#7f7f7f", "none": "#cccccc",
}


def _draw_cell(fig: Figure, box: tuple[float, float, float, float], nodes, concat, title: str) -> None:
    """Draw one cell's DAG into ``box`` = (left, bottom, width, height) in figure coordinates.

    Drawn straight onto the figure, without an Axes: an Axes builds ticks and searches
    for a title place on every draw even when hidden, which nearly doubled the cost of a picture.
    """
    n = len(nodes)
    left, bottom, width, height = box
    x_lo, x_hi, y_lo, y_hi = -0.6, n + 1.6, -1.6, 1.6

    def at(x: float, y: float) -> tuple[float, float]:
        return left + width * (x - x_lo) / (x_hi - x_lo), bottom + height * (y - y_lo) / (y_hi - y_lo)

    pos = {0: (0.0, 1.0), 1: (0.0, -1.0)}
    for k in range(n):
        pos[k + 2] = (1.0 + k, 0.6 * ((-1) ** k))
    pos["out"] = (n + 1.0, 0.0)
    labels = {0: "c_{k-2}", 1: "c_{k-1}", "out": "c_{k}"}

    def arrow(a, b, **style) -> None:
        fig.add_artist(FancyArrowPatch(at(*pos[a]), at(*pos[b]), transform=fig.transFigure, shrinkA=12, shrinkB=12, mutation_scale=10, **style))

    for k, node in enumerate(nodes):
        for op, j in node:
            colour = _COLOURS.get(op, "black")
            arrow(j, k + 2, arrowstyle="->", color=colour, lw=1.6, connectionstyle="arc3,rad=0.15")
            (x0, y0), (x1, y1) = pos[j], pos[k + 2]
            fig.text(*at((x0 + x1) / 2, (y0 + y1) / 2 + 0.12), op, fontsize=7, ha="center", color=colour)
    for c in concat:
        arrow(c, "out", arrowstyle="->", color="#444444", lw=0.8, ls="--")
    for key, (x, y) in pos.items():
        colour = "#fde0b0" if key in (0, 1) else "#cfe8ff" if key != "out" else "#d9f2d0"
        label = labels.get(key, str(key - 2) if isinstance(key, int) else key)
        fig.text(*at(x, y), label, ha="center", va="center", fontsize=8, bbox=dict(boxstyle="round", fc=colour, ec="#555555"))
    fig.text(left + width / 2, bottom + height, title, ha="center", va="bottom", fontsize=10)


def genotype_figure(genotype: Genotype, title: str = "") -> Figure:
    """A figure with the cells side by side: normal, reduction, then each own cell."""
    panels = [(f"{kind} cell", genotype.cell(kind), genotype.concat(kind)) for kind in genotype.cell_names]
    n = max(len(nodes) for _, nodes, _ in panels)
    # A bare Figure, not pyplot: no global figure registry (trackers draw on their own thread).
    fig = Figure(figsize=(1.1 * (n + 2) * len(panels), 3.0))
    top = 0.80 if title else 0.88
    width = 0.96 / len(panels)
    for i, (name, nodes, concat) in enumerate(panels):
        _draw_cell(fig, (0.02 + i * width, 0.02, width, top - 0.02), nodes, concat, name)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def genotype_png(genotype: Genotype, title: str = "") -> bytes:
    """PNG bytes of :func:`genotype_figure`."""
    buf = io.BytesIO()
    genotype_figure(genotype, title).savefig(buf, format="png", dpi=110, pil_kwargs={"compress_level": 1})  # fast zlib: less encode time for ~7% more bytes
    return buf.getvalue()

"""Pictures of genotypes: the normal and reduction cells, and the cells with
their own alphas, as small DAGs (PNG).

Drawn with matplotlib alone (no graphviz binary), so it works on any machine.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure  # a bare Figure renders with Agg: never needs a screen or pyplot

from .genotype import CELL_TYPES, Genotype

_COLOURS = {
    "sep_conv_3x3": "#1f77b4", "sep_conv_5x5": "#17becf", "dil_conv_3x3": "#2ca02c", "dil_conv_5x5": "#98df8a",
    "max_pool_3x3": "#d62728", "avg_pool_3x3": "#ff9896", "skip_connect": "#7f7f7f", "none": "#cccccc",
}


def _draw_cell(ax, genotype: Genotype, kind: str) -> None:
    nodes = genotype.cell(kind)
    n = len(nodes)
    pos = {0: (0.0, 1.0), 1: (0.0, -1.0)}
    for k in range(n):
        pos[k + 2] = (1.0 + k, 0.6 * ((-1) ** k))
    pos["out"] = (n + 1.0, 0.0)
    labels = {0: "c_{k-2}", 1: "c_{k-1}", "out": "c_{k}"}
    for k, node in enumerate(nodes):
        for op, j in node:
            (x0, y0), (x1, y1) = pos[j], pos[k + 2]
            colour = _COLOURS.get(op, "black")
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color=colour, lw=1.6, shrinkA=12, shrinkB=12, connectionstyle="arc3,rad=0.15"))
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, op, fontsize=7, ha="center", color=colour)
    for c in genotype.concat(kind):
        (x0, y0), (x1, y1) = pos[c], pos["out"]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color="#444444", lw=0.8, ls="--", shrinkA=12, shrinkB=12))
    for key, (x, y) in pos.items():
        colour = "#fde0b0" if key in (0, 1) else "#cfe8ff" if key != "out" else "#d9f2d0"
        ax.text(x, y, labels.get(key, str(key - 2) if isinstance(key, int) else key), ha="center", va="center", fontsize=8, bbox=dict(boxstyle="round", fc=colour, ec="#555555"))
    ax.set_title(f"{kind} cell" if kind in CELL_TYPES else f"{kind} (own alphas)", fontsize=10)
    ax.set_xlim(-0.6, n + 1.6)
    ax.set_ylim(-1.6, 1.6)
    ax.axis("off")


def genotype_figure(genotype: Genotype, title: str = "") -> Figure:
    """A figure with the normal and the reduction cell side by side, then the
    own-alpha cells two per row."""
    kinds = genotype.cell_names
    n = max(len(genotype.cell(kind)) for kind in kinds)
    rows = (len(kinds) + 1) // 2
    # A bare Figure, not pyplot: no global figure registry (trackers draw on their own
    # thread), and fixed margins instead of tight_layout, which would draw it twice.
    # Margins are in figure fractions: keep the title band and spacing ~0.3 inch high.
    height = 3.0 * rows
    fig = Figure(figsize=(2.2 * (n + 2), height))
    axes = fig.subplots(rows, 2, squeeze=False).flatten()
    for ax, kind in zip(axes, kinds):
        _draw_cell(ax, genotype, kind)
    for ax in axes[len(kinds):]:
        ax.axis("off")  # an odd number of cells leaves the last slot empty
    if title:
        fig.suptitle(title, fontsize=10)
    top = 1 - (0.54 if title else 0.3) / height
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02 / rows, top=top, wspace=0.05, hspace=0.3)
    return fig


def genotype_png(genotype: Genotype, title: str = "") -> bytes:
    """PNG bytes of :func:`genotype_figure`."""
    buf = io.BytesIO()
    genotype_figure(genotype, title).savefig(buf, format="png", dpi=110)
    return buf.getvalue()

"""Pictures of genotypes: every cell (normal, reduction, and each cell with its
own alphas) as a small DAG, in one PNG.

Graphviz's ``dot`` lays the cells out when it is installed (Debian: ``apt install
graphviz``), the way the field draws DARTS cells: inputs on the left, the output
on the right, one box per cell. ``dot`` places every edge label as a node of its
own, so labels never overlap each other, the arrows or the states, and the
drawing is sized to its contents, so nothing is clipped. A picture costs one
``dot`` process (about 30 ms), once per cycle. Without ``dot``, Pillow draws the
same content by hand placement (about 15 ms; labels may crowd on dense cells), and
says so: one warning per process, and :func:`drawing_note` for the run's record.

``cell_layout`` decides what goes where (plain data, so tests can read what a
picture shows); ``genotype_dot`` writes it as DOT; ``genotype_png`` renders it.
Colours are from the Okabe-Ito colour-blind-safe palette, darkened where needed
for text contrast on white.
"""

from __future__ import annotations

import html
import io
import logging
import math
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from functools import cache

from PIL import Image, ImageDraw, ImageFont

from .genotype import Genotype
from .ops import NONE

log = logging.getLogger(__name__)

# What a run records (and the log says once) when the pictures are Pillow's fallback.
NO_DOT_NOTE = (
    "cell pictures drawn by Pillow: graphviz's dot is not installed, so edge labels may "
    "overlap on dense cells; install graphviz (apt install graphviz, brew install graphviz "
    "or conda install graphviz) for laid-out pictures"
)

# Okabe-Ito hues, darkened to at least 4.5:1 contrast on white (labels are drawn in them).
_COLOURS = {
    "sep_conv_3x3": "#0072B2",
    "sep_conv_5x5": "#004F7C",
    "dil_conv_3x3": "#00785A",
    "dil_conv_5x5": "#00513C",
    "max_pool_3x3": "#B24A00",
    "avg_pool_3x3": "#A0327A",
    "skip_connect": "#505050",
    NONE: "#767676",
}
_INPUT, _NODE, _OUTPUT = "#F6D9A0", "#CDE6F7", "#C9EBDD"  # pale fills behind black text
# state labels: c_{k-2} and c_{k-1} (the two previous cells' outputs), 0..n-1, c_{k} (the output)
_IN2, _IN1, _OUT = ("c", "k-2"), ("c", "k-1"), ("c", "k")
_SCALE = 2  # drawn at twice the size, then halved: Pillow's lines are not antialiased
_PANEL_W, _HEIGHT, _TITLE_H = (
    121,
    330,
    34,
)  # pixels per column of a panel, picture height, title band


@dataclass(frozen=True)
class NodeBox:
    """A state of the cell: a label in a coloured box at ``(x, y)`` (cell units)."""

    key: str
    label: str
    x: float
    y: float
    colour: str


@dataclass(frozen=True)
class EdgeLine:
    """An arrow between two states; ``label`` is the op (empty for the output concat)."""

    source: str
    target: str
    label: str
    colour: str
    dashed: bool = False


@dataclass(frozen=True)
class Panel:
    """One cell's picture: its title, states and edges."""

    title: str
    nodes: tuple[NodeBox, ...]
    edges: tuple[EdgeLine, ...]
    columns: int  # width in node columns: inputs, the cell's nodes, output


def cell_layout(genotype: Genotype) -> list[Panel]:
    """What the picture shows, one panel per cell in ``genotype.cell_names`` order."""
    panels = []
    for kind in genotype.cell_names:
        nodes, concat = genotype.cell(kind), genotype.concat(kind)
        boxes = [
            NodeBox("0", "c[k-2]", 0.0, 1.0, _INPUT),
            NodeBox("1", "c[k-1]", 0.0, -1.0, _INPUT),
        ]
        boxes += [
            NodeBox(str(k + 2), str(k), 1.0 + k, 0.6 * (-1) ** k, _NODE) for k in range(len(nodes))
        ]
        boxes.append(NodeBox("out", "c[k]", len(nodes) + 1.0, 0.0, _OUTPUT))
        edges = [
            EdgeLine(str(j), str(k + 2), op, _COLOURS.get(op, "#000000"))
            for k, node in enumerate(nodes)
            for op, j in node
        ]
        edges += [EdgeLine(str(c), "out", "", "#444444", dashed=True) for c in concat]
        panels.append(Panel(f"{kind} cell", tuple(boxes), tuple(edges), len(nodes) + 2))
    return panels


@cache
def _font(pixels: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=pixels)


def _bezier(p0, p1, bend: float, steps: int = 24) -> list[tuple[float, float]]:
    """Points of a quadratic curve from p0 to p1 bowed sideways by ``bend`` of its length."""
    (x0, y0), (x1, y1) = p0, p1
    cx, cy = (x0 + x1) / 2 + bend * (y1 - y0), (y0 + y1) / 2 - bend * (x1 - x0)
    pts = []
    for i in range(steps + 1):
        t = i / steps
        a, b, c = (1 - t) ** 2, 2 * t * (1 - t), t * t
        pts.append((a * x0 + b * cx + c * x1, a * y0 + b * cy + c * y1))
    return pts


def _trim(pts: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """Drop the points within ``start`` of the first point and within ``end`` of the last."""
    (xa, ya), (xb, yb) = pts[0], pts[-1]
    kept = [p for p in pts if math.dist(p, (xa, ya)) >= start and math.dist(p, (xb, yb)) >= end]
    return kept if len(kept) >= 2 else [pts[len(pts) // 2 - 1], pts[len(pts) // 2]]


def _arrow(draw: ImageDraw.ImageDraw, pts, colour: str, width: int, dashed: bool) -> None:
    if dashed:
        dash, gap = 7 * _SCALE, 4 * _SCALE
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        length = math.dist(pts[0], pts[-1]) or 1.0
        for s in range(0, int(length), dash + gap):
            e = min(s + dash, length)
            draw.line(
                [
                    (x0 + (x1 - x0) * s / length, y0 + (y1 - y0) * s / length),
                    (x0 + (x1 - x0) * e / length, y0 + (y1 - y0) * e / length),
                ],
                fill=colour,
                width=width,
            )
    else:
        draw.line(pts, fill=colour, width=width, joint="curve")
    (xa, ya), (xb, yb) = pts[-2], pts[-1]
    angle, size = math.atan2(yb - ya, xb - xa), 6 * _SCALE
    left = (xb - size * math.cos(angle - 0.45), yb - size * math.sin(angle - 0.45))
    right = (xb - size * math.cos(angle + 0.45), yb - size * math.sin(angle + 0.45))
    draw.polygon([(xb, yb), left, right], fill=colour)


def _draw_panel(
    draw: ImageDraw.ImageDraw, panel: Panel, box: tuple[float, float, float, float]
) -> None:
    left, top, width, height = box
    lo, hi = -0.6, panel.columns - 0.4  # the x range of the cell, in node columns

    def at(x: float, y: float) -> tuple[float, float]:
        return left + width * (x - lo) / (hi - lo), top + height * (1.6 - y) / 3.2

    where = {n.key: at(n.x, n.y) for n in panel.nodes}
    small, label_font = _font(11 * _SCALE), _font(12 * _SCALE)
    shrink = 17 * _SCALE  # arrows stop short of the boxes they join
    for e in panel.edges:
        if e.dashed:
            pts = _trim([where[e.source], where[e.target]], shrink, shrink)
        else:
            pts = _trim(_bezier(where[e.source], where[e.target], 0.15), shrink, shrink)
        _arrow(draw, pts, e.colour, (1 if e.dashed else 2) * _SCALE, e.dashed)
    for e in panel.edges:
        if e.label:
            mx, my = _bezier(where[e.source], where[e.target], 0.15, steps=2)[1]
            draw.text((mx, my - 9 * _SCALE), e.label, font=small, fill=e.colour, anchor="mm")
    for n in panel.nodes:
        x, y = where[n.key]
        x0, y0, x1, y1 = draw.textbbox((x, y), n.label, font=label_font, anchor="mm")
        pad = 4 * _SCALE
        draw.rounded_rectangle(
            (x0 - pad, y0 - pad, x1 + pad, y1 + pad),
            radius=5 * _SCALE,
            fill=n.colour,
            outline="#555555",
            width=_SCALE,
        )
        draw.text((x, y), n.label, font=label_font, fill="#000000", anchor="mm")
    draw.text(
        (left + width / 2, top - 14 * _SCALE),
        panel.title,
        font=_font(15 * _SCALE),
        fill="#000000",
        anchor="mm",
    )


def _pillow_png(genotype: Genotype, title: str = "") -> bytes:
    """The hand-placed picture, for machines without graphviz."""
    panels = cell_layout(genotype)
    columns = max(p.columns for p in panels)
    width, height = _PANEL_W * columns * len(panels) * _SCALE, _HEIGHT * _SCALE
    lines = textwrap.wrap(title, width=max(20, width // (8 * _SCALE))) if title else []
    title_h = _TITLE_H + 18 * max(len(lines) - 1, 0)
    height += 18 * max(len(lines) - 1, 0) * _SCALE
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    top = (title_h + 30) * _SCALE if lines else 30 * _SCALE
    for i, line in enumerate(lines):  # wrapped, so a long title is never cut at the right
        draw.text(
            (width / 2, (_TITLE_H / 2 + 18 * i) * _SCALE),
            line,
            font=_font(14 * _SCALE),
            fill="#000000",
            anchor="mm",
        )
    panel_w = width * 0.96 / len(panels)
    for i, panel in enumerate(panels):
        _draw_panel(
            draw, panel, (width * 0.02 + i * panel_w, top, panel_w, height - top - 8 * _SCALE)
        )
    buf = io.BytesIO()
    image.reduce(_SCALE).save(
        buf, format="PNG", compress_level=1
    )  # fast zlib: these pictures are small anyway
    return buf.getvalue()


# ---------------------------------------------------------------- graphviz

_FONT = "DejaVu Sans"  # Debian's default sans font; graphviz falls back to its own if missing
_STATE_LABEL = {"c[k-2]": _IN2, "c[k-1]": _IN1, "c[k]": _OUT}


def _state_label(text: str) -> str:
    """A state's HTML-like label: c<sub>k-1</sub> for the cell's inputs and output."""
    if text in _STATE_LABEL:
        base, sub = _STATE_LABEL[text]
        return f"<{base}<SUB>{sub}</SUB>>"
    return f"<{html.escape(text)}>"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def genotype_dot(genotype: Genotype, title: str = "") -> str:
    """The DOT source of the picture: one box (cluster) per cell, stacked top to bottom,
    each cell drawn left to right from its two inputs to its output."""
    out = [
        "digraph genotype {",
        f"  graph [rankdir=LR, newrank=true, fontname={_quote(_FONT)}, fontsize=16, "
        "nodesep=0.25, ranksep=0.45,"
        ' pad=0.2, bgcolor="white", labelloc=t, labeljust=c];',
        f'  node [shape=box, style="rounded,filled", fontname={_quote(_FONT)}, fontsize=14, '
        "penwidth=1.2, height=0.4];",
        f"  edge [fontname={_quote(_FONT)}, fontsize=12, penwidth=1.6, arrowsize=0.8];",
    ]
    if title:
        out.append(f"  label={_quote(chr(10).join(textwrap.wrap(title, 90)))};")
    # rankdir=LR stacks unconnected clusters bottom-up: emit them last-first, normal ends on top
    for i, panel in reversed(list(enumerate(cell_layout(genotype)))):
        out += [
            f"  subgraph cluster_{i} {{",
            f'    label={_quote(panel.title)}; style=rounded; color="#888888";',
        ]
        for n in panel.nodes:
            out.append(
                f'    "{i}_{n.key}" [label={_state_label(n.label)}, fillcolor="{n.colour}"];'
            )
        for e in panel.edges:
            attrs = f'color="{e.colour}"'
            if e.dashed:
                attrs += ", style=dashed, penwidth=1.0"
            else:
                attrs += f', label={_quote(e.label)}, fontcolor="{e.colour}"'
            out.append(f'    "{i}_{e.source}" -> "{i}_{e.target}" [{attrs}];')
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def run_dot(source: str, fmt: str, dpi: int = 96) -> bytes:
    """``dot -T<fmt>`` on ``source``; CalledProcessError if dot fails, OSError if absent."""
    done = subprocess.run(
        ["dot", f"-T{fmt}", f"-Gdpi={dpi}"],
        input=source.encode(),
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def has_dot() -> bool:
    return shutil.which("dot") is not None


def drawing_note() -> str:
    """One line for a run's record when its pictures are Pillow's fallback ('' with dot)."""
    return "" if has_dot() else NO_DOT_NOTE


@cache
def _warn_no_dot() -> None:
    log.warning(NO_DOT_NOTE)


def genotype_png(genotype: Genotype, title: str = "") -> bytes:
    """PNG bytes of every cell of ``genotype``, under an optional title: graphviz's
    layout when ``dot`` is installed, else Pillow's hand placement (said once)."""
    if has_dot():
        return run_dot(genotype_dot(genotype, title), "png")
    _warn_no_dot()
    return _pillow_png(genotype, title)


def thumbnail_png(png: bytes, height: int = 40) -> bytes:
    """A strip ``height`` pixels tall of a cell picture: its cells (the bands between
    white rows, the title's band left out) side by side, scaled down. It is what fits in
    the few lines the MLflow UI shows of a run's description before "Show more"."""
    import numpy as np

    image = Image.open(io.BytesIO(png)).convert("RGB")
    ink = (np.asarray(image) < 245).any(axis=(1, 2))  # rows that hold anything but white
    bands, start = [], None
    for y, inked in enumerate([*ink, False]):
        if inked and start is None:
            start = y
        elif not inked and start is not None:
            bands.append((start, y))
            start = None
    cells = [b for b in bands if b[1] - b[0] > 40] or bands or [(0, image.height)]
    parts = []
    for top, bottom in cells:
        cols = np.flatnonzero((np.asarray(image)[top:bottom] < 245).any(axis=(0, 2)))
        parts.append(image.crop((int(cols[0]), top, int(cols[-1]) + 1, bottom)))
    tall = max(p.height for p in parts)
    strip = Image.new("RGB", (sum(p.width for p in parts) + 8 * len(parts), tall), "white")
    x = 0
    for p in parts:
        strip.paste(p, (x, (tall - p.height) // 2))
        x += p.width + 8
    width = max(1, round(strip.width * height / strip.height))
    out = io.BytesIO()
    strip.resize((width, height), Image.Resampling.LANCZOS).save(out, "PNG")
    return out.getvalue()

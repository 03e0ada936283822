"""The comparison report: one self-contained HTML page (plus the table as CSV).

Self-contained means it opens anywhere, offline and from the MLflow UI's
artifact view: images are inlined as base64 PNG data URIs, the style sheet is
inline, and the page loads no script, font or style from the network.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # never needs a screen
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402

from ..baseline.pareto import pareto_png  # noqa: E402
from ..runner.phases import EPOCH_FIELDS  # noqa: E402
from ..space.genotype import Genotype  # noqa: E402
from ..space.plot import genotype_png  # noqa: E402
from ..tracking import layout as L  # noqa: E402
from ..tracking.browse import DEFAULT_UI, run_url  # noqa: E402
from ..tracking.layout import RANKING_PARAMS_KENDALL_TAU, RANKING_TAU_MINUS_PARAMS  # noqa: E402
from .analysis import Comparison, labels  # noqa: E402
from .datanotes import data_warning  # noqa: E402
from .opsets import op_set_warning  # noqa: E402
from .paretoview import PARETO_FILE, panels, pareto_html  # noqa: E402
from .select import BUDGET_COLUMNS, VAL_ACC_METRICS  # noqa: E402
from .settings import settings_warning  # noqa: E402

log = logging.getLogger(__name__)

REPORT_FILE = "index.html"
TABLE_FILE = "runs.csv"
ARMS_FILE = "arms.csv"  # the arm view, when runs carry arm tags
ARM_SEEDS_FILE = "arm_seeds.csv"  # its per-seed table
MAX_CELL_PICTURES = 12  # distinct genotypes drawn; the clusters table lists them all

# Fits a 1400 px window without horizontal scrolling: the runs table shows a genotype's
# cluster number (the clusters table spells it out), genotypes break between ops, never
# inside one, and wide tables use a smaller font.
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.2em; color: #222; max-width: 1360px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 3px 5px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; white-space: nowrap; }
td { overflow-wrap: break-word; }
code, .geno { font-family: ui-monospace, monospace; font-size: 0.85em; }
.geno .cell { margin: 0 0 2px 0; } .geno .tok { white-space: nowrap; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.3em 0; }
.muted { color: #777; } .skipped { color: #a33; }
.warning { background: #fff4d6; border: 2px solid #b26b00; padding: 0.6em 0.9em; margin: 1em 0; }
.note { background: #eef3fb; border: 1px solid #4a6fa5; padding: 0.6em 0.9em; margin: 1em 0; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; max-width: 100%; }
figcaption { font-size: 0.8em; }
"""

# the runs table's columns on the page: (table column, header)
_PAGE_COLUMNS = (
    ("run_name", "run"),
    ("experiment", "experiment"),
    ("dataset", "data"),
    ("seed", "seed"),
    ("schedule", "schedule"),
    ("initial_temperature", "τ start"),
    ("min_temperature", "τ min"),
    ("anneal_fraction", "anneal"),
    ("mutation_strength", "mutation"),
    ("cycles", "cycles"),
    ("warmup_epochs", "warm-up ep."),
    ("epochs", "epochs W/α/re"),
    ("final_epochs", "final ep."),
    ("cluster", "genotype"),
    ("params", "params"),
    ("peak_rss_mb", "peak MB"),
    ("run_minutes", "wall min"),
    ("device", "device"),
    ("val_acc", "val acc"),
    ("test_acc", "test acc"),
    ("status", "status"),
)


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _fig_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{png_data_uri(png)}">'


def genotype_html(canonical: str) -> str:
    """A canonical genotype, one line per cell, breaking between ops and never inside one."""
    cells = []
    for cell in canonical.split(" ; "):
        toks = cell.replace(" -> ", " → ").split(" ")
        spans = " ".join(f'<span class="tok">{html.escape(t)}</span>' for t in toks)
        cells.append(f'<div class="cell">{spans}</div>')
    return '<div class="geno">' + "".join(cells) + "</div>"


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def budget_differences(table: pd.DataFrame) -> dict[str, list]:
    """The budget columns whose values differ between the compared runs: column -> values."""
    out = {}
    for col in BUDGET_COLUMNS:
        values = sorted({int(v) for v in table[col].dropna()}) if col in table else []
        if len(values) > 1:
            out[col] = values
    return out


def budget_warning(table: pd.DataFrame) -> str:
    """One sentence when the compared runs trained for different budgets ('' otherwise):
    the HTML report and the terminal say the same."""
    budgets = budget_differences(table)
    if not budgets:
        return ""
    what = "; ".join(f"{c} {', '.join(map(str, v))}" for c, v in budgets.items())
    return (
        f"The compared runs did not train for the same number of epochs ({what}): accuracies "
        "are not like for like, and the best run may only have trained longer."
    )


def runs_table_html(comparison: Comparison, ui: str) -> str:
    """The runs table: every run linked to its MLflow page, every tuned parameter and the budget."""
    t = comparison.table
    if t.empty:
        return '<p class="muted">(none)</p>'
    cluster_of = dict(zip(comparison.clusters["genotype"], comparison.clusters["cluster"]))
    # the device where the runs differ in it (a study over CPUs and GPUs of two kinds)
    columns = [(c, h) for c, h in _PAGE_COLUMNS if c != "device" or t["device"].nunique() > 1]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in columns)
    rows = []
    for _, r in t.iterrows():
        cells = []
        for col, _ in columns:
            if col == "run_name":
                url = run_url(ui, r["experiment_id"], r["run_id"]) if r["experiment_id"] else ""
                name = html.escape(str(r["run_name"] or L.short_id(r["run_id"])))
                link = f'<a class="run" href="{html.escape(url)}">{name}</a>' if url else name
                cells.append(f"<td>{link}</td>")
            elif col == "epochs":
                epochs = "/".join(_fmt(r[c]) for c in EPOCH_FIELDS)
                cells.append(f'<td class="num">{epochs}</td>')
            elif col == "cluster":
                c = cluster_of.get(r["genotype"])
                link = f'<a href="#cluster-{c}">#{c}</a>' if c is not None else "–"
                cells.append(f'<td class="num">{link}</td>')
            else:
                v = r[col]
                num = isinstance(v, (int, float, np.integer)) and not isinstance(v, bool)
                cells.append(f'<td class="num">{_fmt(v)}</td>' if num else f"<td>{_fmt(v)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    body = "".join(rows)
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _clusters_html(clusters: pd.DataFrame) -> str:
    if clusters.empty:
        return '<p class="muted">(none)</p>'
    cols = [c for c in clusters.columns if c != "genotype"]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols) + "<th>genotype</th>"
    rows = []
    for _, r in clusters.iterrows():
        cells = "".join(f"<td>{_fmt(r[c])}</td>" for c in cols)
        geno = genotype_html(str(r["genotype"]))
        rows.append(f'<tr id="cluster-{r["cluster"]}">{cells}<td>{geno}</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"


def _frame_html(df: pd.DataFrame, index: bool = False) -> str:
    if df.empty:
        return '<p class="muted">(none)</p>'
    if "genotype" in df.columns:  # canonical strings: broken between ops, never inside one
        df = df.copy()
        for col in df.columns:
            if df[col].dtype == object:
                show = genotype_html if col == "genotype" else (lambda v: html.escape(str(v)))
                df[col] = [show(v) for v in df[col]]
        return df.to_html(
            index=index, escape=False, na_rep="–", float_format=lambda v: f"{v:.4g}", border=0
        )
    return df.to_html(
        index=index, escape=True, na_rep="–", float_format=lambda v: f"{v:.4g}", border=0
    )


# ---------------------------------------------------------------------- plots


def _experiment_colours(experiments: Iterable[str]) -> dict[str, str]:
    cmap = plt.get_cmap("tab10")
    return {
        e: matplotlib.colors.to_hex(cmap(k % 10)) for k, e in enumerate(sorted(set(experiments)))
    }


def scatter_png(table: pd.DataFrame, x: str, xlabel: str, title: str) -> bytes | None:
    """Validation (o) and test (x) accuracy against column ``x``, coloured by experiment."""
    data = table.dropna(subset=[x])
    if data.empty:
        return None
    colours = _experiment_colours(data["experiment"])
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for exp, group in data.groupby("experiment", sort=True):
        xs = group[x].astype(float)
        ax.scatter(
            xs, group["val_acc"].astype(float), color=colours[exp], marker="o", label=f"{exp} (val)"
        )
        ax.scatter(
            xs,
            group["test_acc"].astype(float),
            color=colours[exp],
            marker="x",
            label=f"{exp} (test)",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _fig_png(fig)


def op_frequency_png(freq: pd.DataFrame) -> bytes | None:
    """Grouped bars: how often each op appears in normal and reduction cells
    (and in the cells with their own alphas, when there are any)."""
    if freq.empty or freq["total"].sum() == 0:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.8))
    kinds = [k for k in freq.columns if k != "total"]
    freq[kinds].plot.bar(ax=ax, color=["#1f77b4", "#d62728", "#2ca02c"][: len(kinds)])
    ax.set_ylabel("edges")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("")
    ax.set_title("operation frequency across the selected runs", fontsize=10)
    ax.tick_params(axis="x", labelrotation=35)
    plt.setp(ax.get_xticklabels(), ha="right")
    return _fig_png(fig)


def evolution_png(comparison: Comparison) -> bytes | None:
    """Edit distance from the previous cycle's genotype, per run."""
    frames = [
        (lab, comparison.evolutions.get(r.run_id))
        for lab, r in zip(labels(comparison.records), comparison.records)
    ]
    frames = [(lab, df) for lab, df in frames if df is not None and len(df) > 1]
    if not frames:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for lab, df in frames:
        ax.plot(df["cycle"], df["distance_prev"], marker="o", label=lab)
    ax.set_xlabel("cycle")
    ax.set_ylabel("distance from previous cycle")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("genotype change per cycle", fontsize=10)
    ax.grid(alpha=0.3)
    if len(frames) <= 12:
        ax.legend(fontsize=7)
    return _fig_png(fig)


# ---------------------------------------------------------------------- page


def ui_base(tracking_uri: str) -> str:
    """Where run links point: the tracking server itself, else ``asolab ui``'s default address."""
    remote = tracking_uri.startswith(("http://", "https://"))
    return tracking_uri.rstrip("/") if remote else DEFAULT_UI


def render_html(
    comparison: Comparison, title: str = "asolab genotype comparison", ui: str = ""
) -> str:
    """The whole report page as a string; run names link to ``ui`` (default: :func:`ui_base`)."""
    sel = comparison.selection
    budgets = budget_warning(comparison.table)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(comparison.records)} runs compared ({html.escape(sel.description)}); "
        f"store <code>{html.escape(sel.tracking_uri)}</code>.</p>",
        *_skipped_html(comparison),
        *_warnings_html(comparison, budgets),
        *_runs_html(comparison, ui or ui_base(sel.tracking_uri)),
        *_arms_html(comparison),
        *_ranking_html(comparison),
        *pareto_html(comparison, _img),
        *_accuracy_html(comparison),
        *_clusters_section_html(comparison),
        *_diffs_html(comparison, budgets),
        "<h2>Distances</h2>",
        "<p>Genotype distance: edge positions (cell, node, input) whose ops differ, plus one "
        "per cell whose concat list differs.</p>",
        _frame_html(comparison.distances, index=True),
        *_op_frequencies_html(comparison),
        *_evolutions_html(comparison),
        "</body></html>",
    ]
    return "\n".join(parts)


def _skipped_html(comparison: Comparison) -> list[str]:
    skipped = comparison.selection.skipped
    if not skipped:
        return []
    return [
        f'<p class="skipped">Skipped {len(skipped)} run(s):</p><ul class="skipped">',
        *(f"<li><code>{html.escape(str(s))}</code></li>" for s in skipped),
        "</ul>",
    ]


def notices(comparison: Comparison, budgets: str) -> list[tuple[str, str, str]]:
    """The sentences under the runs table, the terminal's and the report's alike, each
    ``(level, title, sentence)`` that has something to say, in order: the runs trained
    for different budgets (``budgets``: "best" may only have trained longer), searched
    different op sets (genotypes differ by what they could choose), were made with other
    settings besides the table's knobs, or recorded data notes (splits that measure less
    than their figures suggest)."""
    found = [
        ("warning", "Different budgets", budgets),
        ("warning", "Different op sets", op_set_warning(comparison.records)),
        ("note", "Other settings differ", settings_warning(comparison.records)),
        ("warning", "Data notes", data_warning(comparison.records)),
    ]
    return [notice for notice in found if notice[2]]


def _warnings_html(comparison: Comparison, budgets: str) -> list[str]:
    """The :func:`notices`, highlighted by level."""
    return [
        f'<p class="{level}"><b>{title}.</b> {html.escape(sentence)}</p>'
        for level, title, sentence in notices(comparison, budgets)
    ]


def _runs_html(comparison: Comparison, ui: str) -> list[str]:
    host = html.escape(ui.split("://", 1)[-1])  # no scheme: the page names no address it loads
    return [
        "<h2>Runs</h2>",
        f'<p class="muted">Run names open the run in the MLflow UI at {host} (start it with '
        "<code>asolab ui</code>); genotype numbers link to the clusters below.</p>",
        runs_table_html(comparison, ui),
    ]


def _accuracy_html(comparison: Comparison) -> list[str]:
    t = comparison.table
    parts = ["<h2>Accuracy</h2>"]
    for x, xlabel, name in (
        ("params", "parameters of the final network", "accuracy vs parameters"),
        ("initial_temperature", "initial Gumbel temperature", "accuracy vs initial temperature"),
        ("mutation_strength", "mutation strength", "accuracy vs mutation strength"),
    ):
        png = scatter_png(t, x, xlabel, name) if not t.empty else None
        if png:
            parts.append(
                f"<figure>{_img(png, name)}<figcaption>{html.escape(name)}: o validation, x "
                "test</figcaption></figure>"
            )
    return parts


def _clusters_section_html(comparison: Comparison) -> list[str]:
    parts = [
        "<h2>Genotype clusters</h2>",
        "<p>Runs whose final genotypes have the same canonical form.</p>",
        _clusters_html(comparison.clusters),
    ]
    for _, row in comparison.clusters.head(MAX_CELL_PICTURES).iterrows():
        caption = f"cluster {row['cluster']}: {row['runs']} run(s) — {row['run_names']}"
        png = genotype_png(Genotype.parse(row["genotype"]), f"cluster {row['cluster']}")
        parts.append(
            f"<figure>{_img(png, caption)}<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    if len(comparison.clusters) > MAX_CELL_PICTURES:
        parts.append(
            f'<p class="muted">{len(comparison.clusters) - MAX_CELL_PICTURES} more genotypes '
            "not drawn.</p>"
        )
    return parts


def _diffs_html(comparison: Comparison, budgets: str) -> list[str]:
    parts = ["<h2>Differences from the best run</h2>"]
    if not comparison.diffs:
        return [*parts, '<p class="muted">All compared runs share one genotype.</p>']
    ref = comparison.diffs[0].reference
    parts.append(
        f"<p>Reference: <b>{html.escape(ref.run_name)}</b> ({html.escape(ref.experiment)}, "
        f"val acc {ref.metric(*VAL_ACC_METRICS):.4g})<br>"
        f"{genotype_html(ref.genotype.canonical)}</p>"
    )
    if budgets:
        parts.append(
            '<p class="warning">"Best" is by validation accuracy across different budgets '
            "(see above).</p>"
        )
    for d in comparison.diffs:
        parts.append(
            f"<h3>{html.escape(d.other.run_name)} ({html.escape(d.other.experiment)}) — "
            f"distance {d.distance}</h3><ul>"
        )
        parts += [f"<li><code>{html.escape(line)}</code></li>" for line in d.lines]
        parts.append("</ul>")
    return parts


def _op_frequencies_html(comparison: Comparison) -> list[str]:
    parts = ["<h2>Operation frequencies</h2>"]
    png = op_frequency_png(comparison.op_frequencies)
    if png:
        parts.append(_img(png, "operation frequencies"))
    parts.append(_frame_html(comparison.op_frequencies, index=True))
    return parts


def _evolutions_html(comparison: Comparison) -> list[str]:
    if not comparison.evolutions:
        return []
    parts = ["<h2>Evolution within runs</h2>"]
    png = evolution_png(comparison)
    if png:
        parts.append(_img(png, "genotype change per cycle"))
    for lab, r in zip(labels(comparison.records), comparison.records):
        df = comparison.evolutions.get(r.run_id)
        if df is None:
            continue
        parts.append(f"<h3>{html.escape(lab)} ({html.escape(r.experiment)})</h3>")
        parts.append(_frame_html(df))
    return parts


def _arms_html(comparison: Comparison) -> list[str]:
    """The arm view: mean ± std per arm, paired differences to ASO-SE with 95% CIs."""
    if comparison.arms is None:
        return []
    from .arms import arm_lines, arm_seed_display

    return [
        "<h2>Control arms</h2>",
        "<p>Runs made by <code>asolab baseline</code>: each control arm trains a fixed genotype "
        "with the ASO-SE run's seed, for its weight-training budget (an arm ending in "
        "<code>-final</code>: for its final epochs only). Differences are ASO-SE minus the "
        "arm, paired by seed, with a 95% paired-t confidence interval; test accuracy is "
        "reported, never used to select.</p>",
        "<pre>" + html.escape("\n".join(arm_lines(comparison.arms))) + "</pre>",
        _frame_html(page_arms(comparison.arms)),
        "<h3>Per seed</h3>",
        "<p>Each ASO-SE run beside its control runs: test accuracy % (validation %), the final "
        "network's parameters and the minutes each run trained; - where a seed has no run of "
        "the arm.</p>",
        _frame_html(arm_seed_display(comparison.arm_seeds)),
    ]


def page_arms(arms: pd.DataFrame) -> pd.DataFrame:
    """The arm table as the page shows it: beside each paired difference the one with size
    (log2 parameters) taken out; the other fit figures are in the lines above it and in
    arms.csv."""
    from .sizefit import SIZE_MEASURES, size_columns

    shown = size_columns("params")[:3]
    hidden = [c for m, _ in SIZE_MEASURES for c in size_columns(m) if c not in shown]
    return arms.drop(columns=[c for c in hidden if c in arms.columns])


def ranking_display(rankings: pd.DataFrame) -> pd.DataFrame:
    """The ranking figures as the report shows them: per run and genotype group, Kendall's
    tau with its two-sided p-value in brackets, and Spearman's rho, two decimals each; and,
    where any run measured it, the stand-alone proxy's tau between two of its seeds."""
    from ..baseline.ranking import lead_text, p_text, proxy_text

    def fig(v: float) -> str:
        return "–" if math.isnan(v) else f"{v:+.2f}"

    rows = []
    for _, r in rankings.iterrows():
        row = {
            "run": r["run_name"],
            "genotypes": _fmt(r[L.RANKING_GENOTYPES]),
            "proxy": proxy_text(r).removeprefix("stand-alone "),
        }
        for (s, _), group in zip(L.RANKING_GROUPS, ("from alphas", "random", "all")):
            tau, p = r[L.RANKING_KENDALL_TAU + s], r[L.RANKING_KENDALL_P + s]
            row[f"{group}: tau (p)"] = fig(tau) + p_text(p).replace("p ", "")
            row[f"{group}: rho"] = fig(r[L.RANKING_SPEARMAN_RHO + s])
        if rankings[L.RANKING_PROXY_TAU].notna().any():
            # the stand-alone proxy against itself (two seeds): the ceiling for the taus above
            tau, p = r[L.RANKING_PROXY_TAU], r[L.RANKING_PROXY_P]
            row["proxy seed vs seed: tau (p)"] = fig(tau) + p_text(p).replace("p ", "")
        if rankings[L.RANKING_ALPHAS_LEAD].notna().any():
            # do the alphas gather on genotypes that train better alone than random ones?
            row["alphas lead, stand-alone"] = lead_text(r).replace("points ", "") or "–"
        if rankings.get(RANKING_PARAMS_KENDALL_TAU, pd.Series(dtype=float)).notna().any():
            # the simplest proxy: does the supernet rank better than counting parameters?
            row["parameters: tau"] = fig(r[RANKING_PARAMS_KENDALL_TAU])
            row["supernet − parameters"] = fig(r[RANKING_TAU_MINUS_PARAMS])
        rows.append(row)
    return pd.DataFrame(rows)


def _ranking_html(comparison: Comparison) -> list[str]:
    """The ranking diagnostic: figures per run and a scatter of its pairs."""
    if comparison.rankings is None:
        return []
    from ..baseline.ranking import scatter_png

    parts = [
        "<h2>Ranking diagnostic</h2>",
        "<p>Recorded by <code>asolab rank</code>: genotypes sampled from the final alphas (and "
        "random ones), their one-shot validation accuracy on the supernet against their "
        "validation accuracy after a short stand-alone training; Kendall's tau and Spearman's "
        "rho. With two stand-alone seeds, the proxy's tau between them is the most a one-shot "
        "tau can show. The alphas' lead is how much better (in points of stand-alone "
        "accuracy) the genotypes from the alphas train than the random ones.</p>",
        _frame_html(ranking_display(comparison.rankings)),
    ]
    for rid, pairs in comparison.ranking_pairs.items():
        name = next((r.run_name for r in comparison.records if r.run_id == rid), L.short_id(rid))
        png = scatter_png(pairs, f"{name}: one-shot vs stand-alone")
        if png:
            parts.append(
                f"<figure>{_img(png, name)}<figcaption>{html.escape(name)}: one point per genotype"
                "</figcaption></figure>"
            )
    return parts


def write_report(
    comparison: Comparison, directory: str | Path, title: str = "asolab genotype comparison"
) -> Path:
    """Write ``index.html`` and ``runs.csv`` into ``directory``; returns the page's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    page = out / REPORT_FILE
    page.write_text(render_html(comparison, title), encoding="utf-8")
    comparison.table.to_csv(out / TABLE_FILE, index=False)
    png = pareto_png(panels(comparison))
    if png:
        (out / PARETO_FILE).write_bytes(png)
    if comparison.arms is not None:
        comparison.arms.to_csv(out / ARMS_FILE, index=False)
        comparison.arm_seeds.to_csv(out / ARM_SEEDS_FILE, index=False)
    log.info("wrote comparison report %s", page)
    return page


def log_to_mlflow(
    comparison: Comparison, directory: str | Path, experiment: str = "asolab-comparisons"
) -> str:
    """Attach a written report to a new comparison run in ``experiment``; returns its run id.

    The run is tagged so that later comparisons never select it.
    """
    from mlflow.tracking import MlflowClient

    from ..tracking.store import ensure_experiment

    uri = comparison.selection.tracking_uri
    client = MlflowClient(tracking_uri=uri)
    exp_id = ensure_experiment(client, uri, experiment)
    run = client.create_run(
        exp_id,
        run_name=f"compare {len(comparison.records)} runs",
        tags={L.TAG_RUN_KIND: L.KIND_COMPARISON, L.TAG_NOTE: comparison.selection.description},
    )
    rid = run.info.run_id
    try:
        selection, run_ids = L.COMPARISON_PARAMS
        client.log_param(rid, selection, comparison.selection.description[:500])
        client.log_param(rid, run_ids, ",".join(r.run_id for r in comparison.records)[:6000])
        runs, skipped, distinct, best_val_acc = L.COMPARISON_METRICS
        client.log_metric(rid, runs, len(comparison.records))
        client.log_metric(rid, skipped, len(comparison.selection.skipped))
        client.log_metric(rid, distinct, len(comparison.clusters))
        best = comparison.table["val_acc"].max() if not comparison.table.empty else math.nan
        if not math.isnan(best):
            client.log_metric(rid, best_val_acc, float(best))
        client.log_artifacts(rid, str(directory), L.REPORT_DIR)
    except BaseException:
        client.set_terminated(rid, "FAILED")
        raise
    client.set_terminated(rid, "FINISHED")
    return rid

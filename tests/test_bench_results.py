"""bench/results/ holds what reproduces the published tables and nothing else: no
checkpoints or models, under 5 MB, and the committed store still prints the table
that README.md and bench/README.md quote. bench/README.md holds current figures only,
under 30 KB, and no link into it (or between the docs) names a heading that is gone."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STORE = RESULTS / "fashion_mnist_stride2"
BENCH_README = ROOT / "bench" / "README.md"


def _tracked_files() -> list[Path]:
    """The files git tracks under bench/results (every file there outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "bench/results"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in RESULTS.rglob("*") if p.is_file()]
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_bench_results_hold_no_checkpoints_or_models_and_stay_under_5_mb():
    files = _tracked_files()
    assert files, "bench/results is empty"
    heavy = [f for f in files if f.suffix in {".pt", ".pth", ".ckpt"} or "models" in f.parts]
    assert not heavy, heavy[:5]
    assert sum(f.stat().st_size for f in files) < 5_000_000


def test_the_committed_store_prints_the_published_per_seed_table(tmp_path, monkeypatch, capsys):
    from asolab.cli import main

    # A copy, so that MLflow never writes to the committed file; its artifact paths are
    # relative to the repository root, hence the working directory.
    db = tmp_path / "mlflow.db"
    shutil.copyfile(STORE / "mlflow.db", db)
    monkeypatch.chdir(ROOT)
    assert main(["compare", "--baseline", "04dd1de7", "--tracking-uri", f"sqlite:///{db}"]) == 0
    out = capsys.readouterr().out
    assert "aso-se        5 run(s)  91.78 ± 0.95" in out
    assert "ASO-SE - random-final: -0.11 over 5 pair(s), 95% CI [-1.08, +0.87]" in out
    assert "ASO-SE - initial-final: +0.60 over 5 pair(s), 95% CI [-1.10, +2.30]" in out
    seeds = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    rows = {r[0]: r for r in seeds if len(r) > 2 and len(r[1]) == 8}
    assert rows["0"][1:4] == ["04dd1de7", "92.77", "(92.60)"]
    assert rows["2"][-4:] == ["90.03", "(90.70)", "7.8k", "15m"]


def test_the_committed_selection_rows_print_the_published_figures():
    """bench/results/selection_fashion_mnist.csv holds every run of the selection
    measurement; its report lines are the ones bench/README.md quotes."""
    import pandas as pd
    from bench_scripts import bench_module

    rows = pd.read_csv(RESULTS / "selection_fashion_mnist.csv")
    lines = bench_module("selection_quality").figures(rows, ["alpha", "perturbation"])
    readme = (ROOT / "bench" / "README.md").read_text()
    for line in lines:
        assert line in readme, line
    assert not rows["test_acc"].isna().all()


@pytest.mark.parametrize(
    "name, setting, quoted",
    [
        ("drop_last_digits", "data.drop_last=true", ("val_acc", "test_acc")),
        ("alpha_lr_digits", "search.alpha_lr=0.3", ("test_acc", "alpha_entropy")),
    ],
)
def test_the_committed_setting_runs_print_the_published_figures(name, setting, quoted):
    """bench/results/NAME.json holds every run of a setting_effect.py comparison;
    bench/README.md quotes its lines as the script prints them."""
    import json

    from bench_scripts import bench_module

    records = json.loads((RESULTS / f"{name}.json").read_text())
    assert {r["seed"] for r in records} == set(range(8)) and len(records) == 16
    lines = bench_module("setting_effect").report(records, [setting]).splitlines()
    readme = BENCH_README.read_text()
    rows = [line for line in lines if line.split()[:1] and line.split()[0] in quoted]
    assert len(rows) == len(quoted)
    for line in rows:
        assert line in readme, line


def test_the_committed_temperature_runs_give_the_figures_concepts_quotes():
    """bench/results/temperature_digits.json holds every run of the temperature comparison
    (tau held at 20 against the shipped schedule); docs/concepts.md quotes its paired
    differences as setting_effect.py computes them."""
    import json

    from bench_scripts import bench_module

    records = json.loads((RESULTS / "temperature_digits.json").read_text())
    assert {r["seed"] for r in records} == set(range(8)) and len(records) == 16
    a = bench_module("setting_effect").analyse(records, records[-1]["setting"])
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    flat = " ".join(concepts.split())
    for metric in ("val_acc", "test_acc"):
        m = a[metric]
        quoted = f"{m['diff']:+.2f} points (95% CI {m['ci_low']:+.2f} .. {m['ci_high']:+.2f})"
        assert quoted in flat, (metric, quoted)


def test_the_committed_gpu_reports_print_the_published_gpu_figures():
    """bench/README.md's "On a GPU" tables are what bench/gpu_figures.py prints from the
    committed H100 reports, line for line."""
    from bench_scripts import bench_module

    lines = bench_module("gpu_figures").figures(RESULTS / "gpu_h100_2026-11-26")
    readme = BENCH_README.read_text()
    for line in lines:
        assert line in readme.splitlines(), line
    assert "| digits | 1,997 | 152 | 6,672 | 8,568 |" in "\n".join(lines)
    assert "device_tests: failed: 12 failed, 1 passed, 1 skipped in 26.72s" in lines
    # a later call's variants of a run (a setting more) get rows of their own, after the runs
    rows = bench_module("gpu_figures").run_rows(
        bench_module("gpu_figures").load(RESULTS / "gpu_h100_2026-11-28")[1]
    )
    names = [row.split(" | ")[0].lstrip("| ") for row in rows[2:]]
    assert names[:2] == ["digits", "cifar_shape"]
    assert {"digits_autotune_all", "digits_autotune_limit3", "cifar_shape_graphs_on"} <= set(names)
    # and where their seconds went, as the call's README tabulated it by hand
    lines = bench_module("gpu_figures").figures(RESULTS / "gpu_h100_2026-11-28")
    assert "| digits_autotune_off | 30.1 | 6.3 | 14.4 | 4.0 | 1.7 | 3.7 | 98.6% |" in lines


def test_bench_readme_holds_current_figures_only_under_30_kb():
    # Superseded figures go (git keeps them); the GPU section keeps a place for the
    # figures after the host-work changes.
    readme = BENCH_README.read_text()
    assert len(readme.encode()) <= 30_000, f"bench/README.md is {len(readme.encode())} bytes"
    assert "### After the host-work changes" in readme


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped,
    spaces turned into hyphens, a repeated heading numbered."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _dangling_links(pages: list[Path]) -> list[str]:
    dangling = []
    for page in pages:
        name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
        for target in _LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (
                anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text())
            ):
                dangling.append(f"{name}: {target}")
    return dangling


def test_no_link_between_the_docs_dangles(tmp_path):
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), BENCH_README]
    assert _dangling_links(pages) == []
    # and the check finds what it looks for: a heading that is gone, a missing page
    page = tmp_path / "page.md"
    page.write_text(
        "# A — b.py\n\n## A\n\n## A\n\n```\n# not a heading\n```\n\n"
        "[x](#a--bpy) [y](#a-1) [z](#gone) [v](#not-a-heading) [w](nowhere.md)\n"
    )
    assert _dangling_links([page]) == [
        "page.md: #gone",
        "page.md: #not-a-heading",
        "page.md: nowhere.md",
    ]

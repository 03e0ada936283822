"""bench/results/ holds what reproduces the published tables and nothing else: no
checkpoints or models, under 5 MB, and the committed store still prints the table
that README.md and bench/README.md quote."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STORE = RESULTS / "fashion_mnist_stride2"


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

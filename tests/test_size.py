"""Size taken out of comparisons: the fit of accuracy on log-size in the arm view, the
FLOP counter, parameter count as a ranking baseline, and the Pareto view."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from asolab.baseline.pareto import pareto_front
from asolab.cli import main
from asolab.compare.sizefit import fit_on_log_size
from asolab.space.flops import network_size
from asolab.space.genotype import Genotype
from asolab.space.spec import ArchSpec, CellSpec
from asolab.tracking import layout as L
from asolab.tracking.store import artifact_root

GENOTYPE = Genotype.parse(
    "normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ; "
    "reduce: max_pool_3x3(0) max_pool_3x3(1) | max_pool_3x3(0) skip_connect(2) -> 2,3"
)
SLOPE = 0.02  # planted: two points of accuracy per doubling of the parameter count
ARMS = ("scratch-final", "random-final")


def _planted_store(tmp_path, seeds: int = 5) -> tuple[str, str]:
    """A real MLflow store holding an arm view whose accuracy is size alone: accuracy =
    0.70 + SLOPE * log2(params) + noise, the ASO-SE runs twice the size of their controls.
    Returns (uri, the seed-0 ASO-SE run's id)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("planted", artifact_location=(artifact_root(uri) / "p").as_uri())
    rng = random.Random(3)
    source = ""

    def run(name, arm, seed, params, controls=""):
        acc = 0.70 + SLOPE * math.log2(params) + rng.gauss(0, 0.002)
        tags = {L.TAG_ARM: arm, L.TAG_CONTROLS: controls, L.TAG_BASELINE_OF: source or "x"}
        rid = client.create_run(exp, run_name=name, tags=tags).info.run_id
        client.log_param(rid, "seed", str(seed))
        client.log_text(rid, GENOTYPE.to_json(), L.FINAL_GENOTYPE_ARTIFACT)
        for key, value in ((L.TEST_ACC, acc), (L.FINAL_VAL_ACC, acc + 0.001)):
            client.log_metric(rid, key, value)
        client.log_metric(rid, L.FINAL_PARAMS, params)
        client.set_terminated(rid, "FINISHED")
        return rid

    for seed in range(seeds):
        big = rng.randrange(20_000, 40_000)
        aso = run(f"aso-{seed}", L.ARM_ASO_SE, seed, big)
        if seed == 0:
            source = aso
            client.set_tag(aso, L.TAG_BASELINE_OF, aso)
        else:
            client.set_tag(aso, L.TAG_BASELINE_OF, source)
        for k, arm in enumerate(ARMS):
            small = big // (2 + k) + rng.randrange(-500, 500)
            rid = run(f"{arm}-{seed}", arm, seed, small, controls=aso)
            client.set_tag(rid, L.TAG_BASELINE_OF, source)
    return uri, source


def test_fit_on_log_size_recovers_a_planted_slope_and_needs_three_sizes():
    sizes = [1000, 2000, 4000, 8000]
    slope, intercept, r = fit_on_log_size(sizes, [0.5 + 0.03 * math.log2(s) for s in sizes])
    assert (
        slope == pytest.approx(0.03) and intercept == pytest.approx(0.5) and r == pytest.approx(1)
    )
    assert all(math.isnan(v) for v in fit_on_log_size([1000, 2000], [0.5, 0.6]))
    assert all(math.isnan(v) for v in fit_on_log_size([1000] * 4, [0.5, 0.6, 0.7, 0.8]))


def test_arm_view_takes_a_planted_size_effect_out(tmp_path, capsys):
    """The ASO-SE runs are bigger, so raw differences favour them clearly; accuracy is size
    alone, so once size is taken out no arm is ahead, and the fit recovers the slope."""
    uri, source = _planted_store(tmp_path)
    csv = tmp_path / "runs.csv"
    assert main(["compare", "--baseline", source, "--tracking-uri", uri, "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    arms = pd.read_csv(tmp_path / "runs_arms.csv")
    test = arms[(arms["metric"] == "test_acc") & arms["arm"].isin(ARMS)].set_index("arm")
    assert (test["ci95_low"] > 0.01).all()  # raw: ASO-SE "wins" by its size
    assert test["adj_params_slope"].iloc[0] == pytest.approx(SLOPE, abs=0.002)
    assert test["adj_params_r"].iloc[0] > 0.95
    assert (test["adj_params_ci95_low"] < 0).all() and (test["adj_params_ci95_high"] > 0).all()
    assert (test["adj_params_diff_mean"].abs() < 0.004).all()
    assert test["adj_params_runs"].iloc[0] == 15
    assert "points per doubling, r" in out
    assert "once size is taken out (fit on log2 parameters" in out
    verdict = next(line for line in out.splitlines() if "once size is taken out" in line)
    assert "test_acc: no arm ahead" in verdict and "ASO-SE ahead" not in verdict


def test_flops_of_a_one_cell_network_counted_by_hand():
    """Stem 3x3 conv (1 -> 6 channels), two 1x1 preprocessing convs (6 -> 4), skip
    connections (no multiply-adds), a classifier (4 -> 10), on 8x8 images."""
    prims = ("skip_connect", "sep_conv_3x3")
    spec = ArchSpec(1, 10, prims, steps=1, stem_channels=6, cells=(CellSpec(4),))
    g = Genotype(
        normal=((("skip_connect", 0), ("skip_connect", 1)),),
        normal_concat=(2,),
        reduce=((("skip_connect", 0), ("skip_connect", 1)),),
        reduce_concat=(2,),
    )
    params, flops = network_size(spec, g, 8)
    assert flops == 64 * 6 * 9 + 2 * 64 * 4 * 6 + 4 * 10
    conv = g.replace_op("normal", 0, 0, "sep_conv_3x3")
    params_conv, flops_conv = network_size(spec, conv, 8)
    # sep_conv_3x3 = twice (depthwise 3x3 + pointwise 1x1) on 4 channels at 8x8
    assert flops_conv - flops == 2 * (64 * 4 * 9 + 64 * 4 * 4)
    assert params_conv > params
    assert network_size(spec, g, 16)[1] - 40 == 4 * (flops - 40)  # convs scale with the area
    assert np.isfinite(flops)


# ------------------------------------------------------------------ Pareto front


def test_pareto_front_is_exactly_the_non_dominated_set():
    rng = random.Random(7)
    for _ in range(50):
        pts = [(float(rng.randrange(1, 30)), rng.randrange(0, 20) / 20) for _ in range(15)]
        pts.append((math.nan, 0.99))  # a run without a size is never on the front
        front = set(pareto_front(pts))
        for k, (s, a) in enumerate(pts[:-1]):
            dominated = any(s2 <= s and a2 >= a and (s2, a2) != (s, a) for s2, a2 in pts[:-1])
            assert (k in front) == (not dominated), (k, pts[k])
        assert len(pts) - 1 not in front
    assert pareto_front([(1.0, 0.5), (2.0, 0.9), (3.0, 0.7)]) == [0, 1]


# ------------------------------------------------------------------ parameter count in rank


def test_rank_puts_parameter_count_beside_the_supernet_and_draws_a_pareto_view(tmp_path, capsys):
    from scipy.stats import kendalltau

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = {
        "threads": 1,
        "space.init_channels": 4,
        "search.cycles": 1,
        "search.w_epochs": 1,
        "search.alpha_epochs": 1,
        "search.retrain_epochs": 1,
        "search.final_epochs": 0,
        "data.train_subset": 64,  # one W-step an epoch
        "tracking.log_models": "false",
        "tracking.tracking_uri": uri,
    }
    argv = ["run", "--quiet"] + [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    assert main(argv) == 0
    source = capsys.readouterr().out.split("(run ")[-1].split(")")[0]
    rank = ["rank", source, "--samples", "3", "--epochs", "1", "--threads", "1", "--quiet"]
    assert main([*rank, "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "parameter count" in out and "multiply-adds" in out
    client = MlflowClient(tracking_uri=uri)
    metrics = client.get_run(source).data.metrics
    local = client.download_artifacts(source, L.RANKING_PAIRS_ARTIFACT, str(tmp_path))
    pairs = json.loads(open(local).read())["pairs"]
    assert all(p["params"] > 0 and p["flops"] > p["params"] for p in pairs)
    acc = [p["standalone_val_acc"] for p in pairs]
    expected = kendalltau([p["params"] for p in pairs], acc).statistic
    if math.isnan(expected):
        assert L.RANKING_PARAMS_KENDALL_TAU not in metrics
    else:
        assert metrics[L.RANKING_PARAMS_KENDALL_TAU] == pytest.approx(expected)
        gap = metrics["ranking_kendall_tau_all"] - metrics[L.RANKING_PARAMS_KENDALL_TAU]
        assert metrics[L.RANKING_TAU_MINUS_PARAMS] == pytest.approx(gap)
        better = "better than" if gap > 0 else "no better than"
        assert f"the supernet ranks {better} counting parameters" in out
    listed = [a.path for a in client.list_artifacts(source, L.RANKING_DIR)]
    assert L.RANKING_PARETO_ARTIFACT in listed
    png = client.download_artifacts(source, L.RANKING_PARETO_ARTIFACT, str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # compare shows the baseline beside the supernet's figures, and the Pareto view
    report = tmp_path / "report"
    assert main(["compare", "--run", source, "--tracking-uri", uri, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    if not math.isnan(expected):
        assert "; parameters tau" in out and "supernet minus parameters" in out
    page = (report / "index.html").read_text()
    assert "Accuracy against size (Pareto view)" in page
    assert "ranked genotypes: short stand-alone training" in str(panels_titles(uri, source))
    assert (report / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def panels_titles(uri: str, run_id: str) -> list[str]:
    from asolab.compare.analysis import analyse
    from asolab.compare.paretoview import panels
    from asolab.compare.select import load_selection

    comparison = analyse(load_selection(uri, run_ids=[run_id]))
    return [title for title, _ in panels(comparison)]

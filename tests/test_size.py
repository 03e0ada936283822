"""Size taken out of comparisons: the fit of accuracy on log-size in the arm view, the
FLOP counter, parameter count as a ranking baseline, and the Pareto view."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

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

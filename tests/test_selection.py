"""Perturbation-based selection (search.selection = "perturbation"): a planted op that
alone carries the signal is chosen whatever the alphas say; the measurement is recorded
per cycle; the test split is never read; "alpha" stays the default and unchanged."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from conftest import ONE_CYCLE, TINY
from layout_check import undeclared
from mlflow.tracking import MlflowClient

from asolab import config
from asolab.data import load_data
from asolab.evolution.selection import measure_drops, select
from asolab.runner import Runner
from asolab.runner.events import Recorder
from asolab.space.cells import edge_index
from asolab.tracking import layout as L
from asolab.tracking.mlflow_tracker import MlflowTracker

PRIMS = ("sep_conv_3x3", "dil_conv_3x3", "sep_conv_5x5")
PLANTED = "dil_conv_3x3"
ONE_CELL = {
    **TINY,
    "search.cycles": 1,
    "search.w_epochs": 4,
    "search.weight_lr": 0.1,
    "space.init_channels": 16,  # 4 channels in one cell learn too slowly to tell ops apart
    "search.alpha_epochs": 0,
    "search.retrain_epochs": 0,
    "data.train_subset": 600,
    "space.layers": 1,  # one normal cell
    "space.steps": 1,  # one node: edges (0, 0) and (0, 1)
    "space.primitives": list(PRIMS),
}


def _planted_supernet(tiny_cfg):
    """A supernet trained briefly, then cut so that only PLANTED on edge (0, 1) carries the
    input to the classifier: every op of edge (0, 0) and the other ops of edge (0, 1) get
    zero weights and zero BatchNorm means, so they output zeros. The alphas favour another
    op on that edge."""
    cfg = tiny_cfg.replace(**{k: v for k, v in ONE_CELL.items() if k != "space.primitives"})
    cfg = cfg.replace(**{"space.primitives": PRIMS})
    runner = Runner(cfg, data=dataclasses.replace(load_data(cfg.data, cfg.seed), test=None))
    runner.next_phase()  # W-training
    cell = runner.net.cells[0]
    with torch.no_grad():
        for (node, inp), keep in (((0, 0), None), ((0, 1), PRIMS.index(PLANTED))):
            for i, op in enumerate(cell.edges[edge_index(node, inp)].ops):
                if i != keep:
                    for p in op.parameters():
                        p.zero_()
                    for bn in op.modules():
                        if isinstance(bn, torch.nn.BatchNorm2d):
                            bn.running_mean.zero_()
        alphas = runner.net.alphas["normal"]
        alphas.zero_()
        alphas[edge_index(0, 1), PRIMS.index("sep_conv_5x5")] = 0.5  # the alphas' pick
    return runner


def test_perturbation_picks_the_planted_op_that_the_alphas_do_not(tiny_cfg):
    runner = _planted_supernet(tiny_cfg)
    alpha_ops = {op for op, j in runner.net.derive().normal[0] if j == 1}
    assert alpha_ops == {"sep_conv_5x5"}
    settings = {"images": 200, "paths": 3, "seed": 0, "batch_size": 100}
    genotype, drops = select(runner.net, runner.data.val, **settings)
    edge = next(d for d in drops if (d.cell, d.node, d.input) == ("normal", 0, 1))
    assert edge.chosen == PLANTED
    others = [edge.drop[o] for o in PRIMS if o != PLANTED]
    assert edge.drop[PLANTED] > 0.02 and max(others) < 0  # masking the others only helps
    # clearly: the planted op's paths beat the others' by over ten points
    assert edge.accuracy[PLANTED] > max(edge.accuracy[o] for o in PRIMS if o != PLANTED) + 0.1
    assert (PLANTED, 1) in genotype.normal[0]
    # every op of the dead edge reads the same: masking any of them changes nothing
    dead = next(d for d in drops if (d.cell, d.node, d.input) == ("normal", 0, 0))
    assert max(dead.drop.values()) - min(dead.drop.values()) < 1e-9
    # a fixed subset, paths and seed: measuring again gives the very same figures
    again = measure_drops(runner.net, runner.data.val, **settings)
    assert [d.drop for d in again] == [d.drop for d in drops]
    # in batches of 64 the last is 8 images; padded to 64 with zero images (as evaluation
    # pads on CUDA: one batch shape) every path's accuracy is the unpadded one
    smaller, sizes = {**settings, "batch_size": 64}, set()
    hook = runner.net.register_forward_pre_hook(lambda _, args: sizes.add(len(args[0])))
    padded = measure_drops(runner.net, runner.data.val, **smaller, pad_to=64)
    assert sizes == {64}
    unpadded = measure_drops(runner.net, runner.data.val, **smaller)
    assert sizes == {64, 8}
    hook.remove()
    assert [d.accuracy for d in padded] == [d.accuracy for d in unpadded]


def test_perturbation_leaves_the_runs_random_streams_alone(tiny_cfg):
    runner = _planted_supernet(tiny_cfg)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    select(runner.net, runner.data.val, images=50, paths=2, seed=1, batch_size=50)
    assert torch.equal(torch.rand(3), expected)


def test_selection_is_recorded_per_cycle_and_alpha_stays_the_default(tmp_path):
    assert config.load(None, {}).search.selection == "alpha"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config.load(
        None,
        {
            **TINY,
            "search.cycles": 2,
            "data.train_subset": 150,
            "search.selection": "perturbation",
            "search.selection_images": 64,
            "search.selection_paths": 2,
            "tracking.enabled": True,
            "tracking.log_models": False,
        },
    )
    tracker = MlflowTracker(tracking_uri=uri, experiment="sel", log_models=False)
    recorder = Recorder()
    Runner(cfg, [tracker, recorder]).run()
    mutations = recorder.of("mutation")
    assert len(mutations) == 2 and all(m.selection is not None for m in mutations)
    client = MlflowClient(tracking_uri=uri)
    for m in mutations:
        path = L.selection_artifact(m.cycle)
        local = client.download_artifacts(tracker.run_id, path, str(tmp_path))
        record = json.loads(open(local).read())
        assert record["cycle"] == m.cycle and record["images"] == 64 and record["paths"] == 2
        assert record["genotype"] == str(m.before)  # the genotype mutation started from
        edges = record["edges"]
        steps = cfg.space.steps
        assert len(edges) == 2 * sum(k + 2 for k in range(steps))  # every edge, both cells
        for e in edges:
            assert set(e["drop"]) == set(e["accuracy"]) and "none" not in e["drop"]
            assert e["chosen"] == max(e["drop"], key=e["drop"].get)
        assert sum(e["kept"] for e in edges) == 2 * 2 * steps  # two inputs per node
    assert undeclared(client, tracker.run_id, cfg.flat()) == []


def test_perturbation_selection_never_reads_the_test_split(tiny_cfg):
    cfg = tiny_cfg.replace(
        **{"search.cycles": 1, "data.train_subset": 100, "search.selection": "perturbation"}
    )
    recorder = Recorder()
    runner = Runner(cfg, [recorder], data=dataclasses.replace(load_data(cfg.data, 0), test=None))
    for _ in range(4):  # the search without its final evaluation (which reports the test split)
        runner.next_phase()
    (mutation,) = recorder.of("mutation")
    assert mutation.selection["genotype"] == str(mutation.before)


def test_selection_quality_driver_pairs_both_selections_and_ranks(capsys, tmp_path):
    """bench/selection_quality.py (smoke sizes, digits): both selections' sets and ranks are
    recorded; a second invocation with --report trains nothing and prints the pairs."""
    from bench_scripts import bench_module

    module = bench_module("selection_quality")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["--smoke", "--datasets", "digits", "--seeds", "0,1", "--threads", "1"]
    args += ["--tracking-uri", uri]
    assert module.main(args) == 0
    out = capsys.readouterr().out
    assert out.count("  ranked ") == 4  # two ASO-SE runs per selection
    assert module.main([*args, "--report"]) == 0
    report = capsys.readouterr().out
    assert "  ranked " not in report and "# selection" not in report
    assert "perturbation - alpha" in report and "size taken out" in report
    assert "ranking, perturbation: supernet tau" in report
    assert "per seed: test % (val %) and parameters" in report
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"params.`search.selection` = 'perturbation' and tags.`{L.TAG_ARM}` = 'aso-se'",
    )
    assert len(runs) == 2
    listed = [a.path for a in client.list_artifacts(runs[0].info.run_id, L.SELECTION_DIR)]
    assert L.selection_artifact(0) in listed
    # one selection's set alone (the two source runs side by side): the other is not reported
    assert module.main([*args, "--report", "--selections", "alpha"]) == 0
    assert "ranking, alpha: supernet tau" in (alone := capsys.readouterr().out)
    assert "ranking, perturbation" not in alone
    with pytest.raises(SystemExit):
        module.main([*args, "--selections", "alpha,darts"])
    # every run's row, for the published per-seed table
    assert module.main([*args, "--report", "--csv", str(tmp_path / "runs.csv")]) == 0
    table = pd.read_csv(tmp_path / "runs.csv")
    assert len(table) == 8  # 2 selections x 2 seeds x (ASO-SE, random-final)
    assert set(table["arm"]) == {L.ARM_ASO_SE, "random-final"}
    aso = table[table["arm"] == L.ARM_ASO_SE]
    assert aso["ranking_kendall_tau_all"].notna().all() and (table["params"] > 0).all()


def test_a_run_says_how_far_its_alphas_moved_and_when_they_decide_nothing():
    """The run's end carries the alphas' entropy and the Adam steps they took; the summary
    shows both, and where they ended near uniform after training (the shipped rate and
    few steps), a line says the largest alpha is decided by small differences and what
    moves them. A rate that moves them gets the row without that line; the run
    description carries the row too."""
    from asolab.evolution.selection import UNDECIDED
    from asolab.progress import summary_table
    from asolab.tracking.describe import describe_run

    ends = {}
    small = {**ONE_CYCLE, "tracking.enabled": False, "data.train_subset": 32}
    for lr in (3e-3, 1.0):
        cfg = config.load(None, {**small, "search.alpha_lr": lr})
        recorder = Recorder()
        Runner(cfg, [recorder]).run()
        (ends[lr],) = recorder.of("run_end")
    batches = -(-len(load_data(cfg.data, cfg.seed).val) // cfg.data.batch_size)
    assert {end.alpha_steps for end in ends.values()} == {batches}  # 1 cycle, 1 alpha epoch

    slow, fast = ends[3e-3], ends[1.0]
    assert slow.alpha_entropy >= UNDECIDED > fast.alpha_entropy
    lines = summary_table(slow).splitlines()
    row = f"entropy {slow.alpha_entropy:.4f} of uniform after {batches} steps: undecided"
    assert lines[[line.split()[0] for line in lines].index("alphas")].split(None, 1)[1] == row
    assert lines[-1].startswith(f"alphas near uniform after {batches} alpha-training steps")
    assert "search.alpha_lr" in lines[-1] and "docs/baselines.md" in lines[-1]
    lines = summary_table(fast).splitlines()
    assert f"alphas{' ' * 22}entropy {fast.alpha_entropy:.4f} of uniform after" in "\n".join(lines)
    assert not any(line.startswith("alphas near uniform") for line in lines)
    assert not any("undecided" in line for line in lines)
    note = describe_run(slow, "0" * 32, cfg, "digits", 0)
    assert row in note

    # a run whose alphas never trained (search.alpha_epochs = 0, a control arm) says
    # nothing of them
    never = dataclasses.replace(slow, alpha_entropy=1.0, alpha_steps=0)
    assert "alphas" not in summary_table(never) + describe_run(never, "0" * 32, cfg, "digits", 0)

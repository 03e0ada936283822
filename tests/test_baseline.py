"""Control arms (asolab baseline), the arm view of compare, and the ranking diagnostic
(asolab rank), end to end on digits with tracked runs in a temporary SQLite store."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shlex

import pandas as pd
import pytest
import torch
from conftest import TINY
from mlflow.tracking import MlflowClient

from asolab import cli, config
from asolab.baseline.arms import (
    PARAM_TOLERANCE,
    FinalOnlyRunner,
    FixedGenotypeRunner,
    matched_random,
    random_genotype,
)
from asolab.baseline.ranking import (
    Pair,
    alphas_lead,
    correlations,
    lead_text,
    lead_warning,
    measure,
    p_text,
    proxy_warning,
    sample_genotype,
)
from asolab.baseline.run import run_set
from asolab.compare.arms import (
    arm_lines,
    arm_seed_lines,
    arm_seed_table,
    arm_summary,
    paired_ci,
)
from asolab.data import load_data
from asolab.runner import Runner
from asolab.runner.events import Observer, Recorder
from asolab.space import PRIMITIVES
from asolab.tracking import layout as L

SMALL = {
    **TINY,
    "search.cycles": 1,
    "data.train_subset": 150,
    "search.final_epochs": 0,
    "tracking.enabled": True,
    "tracking.log_models": False,
}


def _sets(values: dict) -> list[str]:
    return [
        x
        for k, v in values.items()
        for x in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")
    ]


def _source(uri: str, capsys, **extra) -> str:
    """A tracked ASO-SE run in store ``uri``; returns its run id."""
    assert (
        cli.main(["run", "--quiet", *_sets({**SMALL, **extra, "tracking.tracking_uri": uri})]) == 0
    )
    out = capsys.readouterr().out
    return out.split("(run ")[-1].split(")")[0]


def _set_runs(client: MlflowClient, source: str) -> list:
    exp = client.get_run(source).info.experiment_id
    return client.search_runs([exp], f"tags.`{L.TAG_BASELINE_OF}` = '{source}'")


def _weight_epochs(client: MlflowClient, run_id: str) -> list[float]:
    """The phase of every epoch that trained weights (alpha epochs left out)."""
    phases = [
        m.value
        for m in sorted(client.get_metric_history(run_id, "phase_index"), key=lambda m: m.step)
    ]
    return [p for p in phases if p != L.PHASE_INDEX["alpha"]]


def test_baseline_arms_are_tracked_runs_with_the_same_budget(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys)
    base = ["baseline", source, "--threads", "1", "--quiet", "--tracking-uri", uri]
    assert cli.main(base) == 0
    # the short id that the tables print names the source run too
    short = ["baseline", source[:8], "--threads", "1", "--quiet", "--tracking-uri", uri]
    assert cli.main([*short, "--seeds", "1", "--arms", "initial"]) == 0
    out = capsys.readouterr().out
    client = MlflowClient(tracking_uri=uri)
    runs = {
        (r.data.tags[L.TAG_ARM], int(r.data.params["seed"])): r for r in _set_runs(client, source)
    }
    assert set(runs) == {
        ("aso-se", 0),
        ("scratch", 0),
        ("random", 0),
        ("initial", 0),
        ("aso-se", 1),
        ("initial", 1),
    }
    assert all(r.info.status == "FINISHED" for r in runs.values())
    aso = runs[("aso-se", 0)]
    assert aso.info.run_id == source and "seed 0 aso-se" in out and "(recorded earlier)" in out
    for (arm, seed), r in runs.items():
        # the same config but the seed, the same weight-training epochs in the same places
        same = {k: v for k, v in r.data.params.items() if k != "seed"}
        assert same == {k: v for k, v in aso.data.params.items() if k != "seed"}
        assert _weight_epochs(client, r.info.run_id) == _weight_epochs(client, source)
        if arm != "aso-se":
            assert r.data.tags[L.TAG_CONTROLS] == runs[("aso-se", seed)].info.run_id
    assert (
        runs[("scratch", 0)].data.tags[L.TAG_FINAL_GENOTYPE] == aso.data.tags[L.TAG_FINAL_GENOTYPE]
    )
    gap = abs(
        runs[("random", 0)].data.metrics["final_params"] / aso.data.metrics["final_params"] - 1
    )
    assert gap <= PARAM_TOLERANCE

    # compare: the arm view in the terminal, the CSV and the report
    csv, report = tmp_path / "runs.csv", tmp_path / "report"
    assert (
        cli.main(
            [
                "compare",
                "--baseline",
                source[:8],
                "--tracking-uri",
                uri,
                "--csv",
                str(csv),
                "--report",
                str(report),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ASO-SE - random:" in out and "ASO-SE - initial:" in out and "over 2 pair(s)" in out
    arms = pd.read_csv(tmp_path / "runs_arms.csv")
    assert set(arms["arm"]) == {"aso-se", "scratch", "random", "initial"}
    initial = arms[(arms["arm"] == "initial") & (arms["metric"] == "test_acc")].iloc[0]
    want = [
        runs[("aso-se", s)].data.metrics["test_acc"] - runs[("initial", s)].data.metrics["test_acc"]
        for s in (0, 1)
    ]
    assert initial["pairs"] == 2 and initial["diff_mean"] == pytest.approx(sum(want) / 2)
    assert set(pd.read_csv(csv)["arm"]) == {"aso-se", "scratch", "random", "initial"}
    # the per-seed table: each ASO-SE run's row holds the figures of its own control runs
    seeds = pd.read_csv(tmp_path / "runs_arm_seeds.csv").set_index("seed")
    for (arm, seed), r in runs.items():
        assert seeds.loc[seed, f"{arm} test_acc"] == pytest.approx(r.data.metrics["test_acc"])
        assert seeds.loc[seed, f"{arm} params"] == r.data.metrics["final_params"]
    assert math.isnan(seeds.loc[1, "scratch test_acc"])  # seed 1 trained no scratch arm
    row = next(line for line in out.splitlines() if line.strip().startswith(f"0     {source[:8]}"))
    assert f"{100 * aso.data.metrics['test_acc']:.2f}" in row
    page = (report / "index.html").read_text()
    assert "Control arms" in page and (report / "arms.csv").exists()
    assert "Per seed" in page and (report / "arm_seeds.csv").exists()

    # a third invocation finds everything and trains nothing
    before = len(_set_runs(client, source))
    assert cli.main(base) == 0
    assert len(_set_runs(client, source)) == before


def test_arms_of_a_budgeted_run_train_as_many_final_epochs_as_it_did(tmp_path, capsys):
    """search.budget_minutes fitted the source's final stage (one epoch of at most 3, the
    count recorded as a param); its control arms train that many, not a fit of their own."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys, **{"search.final_epochs": 3, "search.budget_minutes": 0.0001})
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(source).data.params[L.PARAM_FINAL_EPOCHS_FITTED] == "1"
    assert (
        "1 final epoch (of at most 3, fitted to 0.0001 minutes)"
        in (client.get_run(source).data.tags["mlflow.note.content"])
    )
    base = ["baseline", source, "--threads", "1", "--quiet", "--tracking-uri", uri]
    assert cli.main([*base, "--arms", "initial"]) == 0
    (arm,) = [r for r in _set_runs(client, source) if r.data.tags[L.TAG_ARM] == "initial"]
    assert _weight_epochs(client, arm.info.run_id) == _weight_epochs(client, source)
    assert arm.data.params[L.PARAM_FINAL_EPOCHS_FITTED] == "1"  # compare shows the same
    assert _weight_epochs(client, source).count(L.PHASE_INDEX["final"]) == 1
    # compare shows the epochs the run trained, not the most it could have
    csv = tmp_path / "runs.csv"
    assert cli.main(["compare", "--tracking-uri", uri, "--run", source, "--csv", str(csv)]) == 0
    assert pd.read_csv(csv)["final_epochs"].tolist() == [1]


def test_an_arm_given_the_final_epochs_does_not_fit_its_own(tiny_cfg):
    cfg = tiny_cfg.replace(
        **{"search.cycles": 1, "search.final_epochs": 3, "search.budget_minutes": 600.0}
    )
    rec = Recorder()
    result = FixedGenotypeRunner(cfg, [rec], final_epochs=2).run()
    assert [e.phase for e in rec.of("epoch_end")].count("final") == 2
    assert rec.of("final_plan") == [] and result.final_epochs == 2


def test_an_arm_keeps_its_weights_when_its_source_starts_the_final_stage_fresh(tiny_cfg):
    """search.final_weights is the search's hand-over; an arm of a source with "fresh"
    still trains its genotype through all its weight epochs, like one with "inherit"."""
    cfg = tiny_cfg.replace(**{"search.cycles": 1, "search.final_epochs": 1})
    kept = FixedGenotypeRunner(cfg).run()
    fresh = FixedGenotypeRunner(cfg.replace(**{"search.final_weights": "fresh"})).run()
    assert (fresh.val_acc, fresh.test_acc) == (kept.val_acc, kept.test_acc)


def test_a_final_arm_trains_only_the_final_epochs_on_their_schedule(tiny_cfg):
    """random-final's runner trains the final stage alone, with the learning rates
    the full arm's final epochs have; the search's epochs pass untrained."""
    cfg = tiny_cfg.replace(**{"search.final_epochs": 2, "search.warmup_epochs": 1})
    full, final = Recorder(), Recorder()
    FixedGenotypeRunner(cfg, [full]).run()
    result = FinalOnlyRunner(cfg, [final]).run()
    assert {e.phase for e in full.of("epoch_end")} == {"w_train", "retrain", "final"}
    assert [e.phase for e in final.of("epoch_end")] == ["final", "final"]

    def final_epochs(rec):
        return [(e.global_epoch, e.lrs["weight_lr"]) for e in rec.of("epoch_end")][-2:]

    assert final_epochs(final) == final_epochs(full)
    assert final_epochs(final)[0][1] < cfg.search.weight_lr  # mid-schedule, not a restart
    assert len(final.of("cycle_end")) == cfg.search.cycles and result.final_epochs == 2


class _KillAtCycleEnd(Observer):
    """Stops the run like Ctrl-C as its first cycle ends (inside the W-retraining phase)."""

    def on_cycle_end(self, event) -> None:
        raise KeyboardInterrupt


def test_final_arm_is_paired_with_the_same_random_genotype_and_resumes_as_one(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys, **{"search.cycles": 2, "search.final_epochs": 1})
    with pytest.raises(KeyboardInterrupt):
        run_set(uri, source, ["random-final"], observers=lambda: [_KillAtCycleEnd()])
    out = {r.arm: r for r in run_set(uri, source, ["random", "random-final"])}
    client = MlflowClient(tracking_uri=uri)
    full, final = (client.get_run(out[a].run_id) for a in ("random", "random-final"))
    assert final.data.tags[L.TAG_RESUMED] == "1"  # resumed as a final-only run, not a full one
    assert _weight_epochs(client, final.info.run_id) == [L.PHASE_INDEX["final"]]
    assert _weight_epochs(client, full.info.run_id) == _weight_epochs(client, source)
    assert final.data.tags[L.TAG_FINAL_GENOTYPE] == full.data.tags[L.TAG_FINAL_GENOTYPE]
    assert final.data.tags[L.TAG_CONTROLS] == source
    assert out["random-final"].test_acc != out["random"].test_acc


class _KillRetrain(Observer):
    """Stops the run like Ctrl-C in its W-retraining epoch (after its first checkpoints)."""

    def on_epoch_end(self, event) -> None:
        if event.phase == "retrain":
            raise KeyboardInterrupt


def test_baseline_resumes_a_killed_arm_from_its_checkpoint(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys)
    with pytest.raises(KeyboardInterrupt):
        run_set(uri, source, ["initial"], observers=lambda: [_KillRetrain()])
    client = MlflowClient(tracking_uri=uri)
    (killed,) = [r for r in _set_runs(client, source) if r.data.tags[L.TAG_ARM] == "initial"]
    assert killed.info.status != "FINISHED"
    (again,) = [r for r in run_set(uri, source, ["initial"]) if r.arm == "initial"]
    assert again.run_id == killed.info.run_id and again.trained
    resumed = client.get_run(again.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags[L.TAG_RESUMED] == "1"
    assert _weight_epochs(client, again.run_id) == _weight_epochs(client, source)


def test_baseline_bad_input_is_one_line(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys)
    cases = [
        (["baseline", source, "--arms", "scratch,bogus"], "unknown arm 'bogus'"),
        (["baseline", "0123456789abcdef", "--tracking-uri", uri], "not found"),
        (["baseline", source, "--seeds", "0,x", "--tracking-uri", uri], "--seeds"),
        (["rank", source, "--samples", "1", "--tracking-uri", uri], "--samples must be at least 2"),
        (
            ["rank", source, "--standalone-seeds", "0", "--tracking-uri", uri],
            "--standalone-seeds must be at least 1",
        ),
    ]
    for argv, words in cases:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("asolab: error: ") and words in err[0]
    assert (
        cli.main(
            [
                "baseline",
                source,
                "--arms",
                "initial",
                "--threads",
                "1",
                "--quiet",
                "--tracking-uri",
                uri,
            ]
        )
        == 0
    )
    client = MlflowClient(tracking_uri=uri)
    (control,) = [r for r in _set_runs(client, source) if r.data.tags[L.TAG_ARM] == "initial"]
    assert cli.main(["baseline", control.info.run_id, "--tracking-uri", uri]) == 2
    assert "control arm" in capsys.readouterr().err


def test_paired_difference_and_its_confidence_interval():
    rows = [("aso-se", s, f"a{s}", "", acc) for s, acc in enumerate((0.92, 0.95, 0.90))]
    rows += [("random", s, f"r{s}", f"a{s}", acc) for s, acc in enumerate((0.90, 0.91, 0.87))]
    runs = pd.DataFrame(
        [
            {"arm": a, "seed": s, "run_id": i, "controls": c, "test_acc": v, "val_acc": v}
            for a, s, i, c, v in rows
        ]
    )
    random_row = arm_summary(runs).query("arm == 'random' and metric == 'test_acc'").iloc[0]
    assert random_row["pairs"] == 3 and random_row["diff_mean"] == pytest.approx(0.03)
    half = 4.302653 * 0.01 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert (random_row["ci95_low"], random_row["ci95_high"]) == pytest.approx(
        (0.03 - half, 0.03 + half)
    )
    assert random_row["per_seed_diff"] == "s0:+2.00 s1:+4.00 s2:+3.00"
    assert all(math.isnan(v) for v in paired_ci([0.1]))
    # the terminal view keeps its columns when an arm name is longer than the others
    runs = pd.concat([runs, runs[runs["arm"] == "random"].assign(arm="random-final")])
    lines = [line for line in arm_lines(arm_summary(runs)) if "run(s)" in line]
    assert len(lines) == 6 and len({line.index("run(s)") for line in lines}) == 1
    # ... and when an arm has one seed, whose std prints as "-"
    one = runs[(runs["arm"] != "initial") | (runs["seed"] == 0)]
    one = pd.concat([one, runs[runs["arm"] == "random"].head(1).assign(arm="initial")])
    lines = [line for line in arm_lines(arm_summary(one)) if "ASO-SE - " in line]
    assert any(" ± -" in line for line in lines)
    assert len(lines) == 6 and len({line.index("ASO-SE - ") for line in lines}) == 1


def test_per_seed_table_pairs_each_control_with_its_aso_se_run():
    rows = [("aso-se", 0, "a0", "", 0.92), ("aso-se", 1, "a1", "", 0.95)]
    rows += [("random-final", 1, "r1", "a1", 0.91), ("random-final", 0, "r0", "a0", 0.90)]
    rows += [("initial", 1, "i1", "a1", 0.87), ("scratch", 2, "s2", "a2", 0.93)]  # a2 not selected
    runs = pd.DataFrame(
        [
            {"arm": a, "seed": s, "run_id": i, "controls": c, "test_acc": v, "val_acc": v - 0.01}
            | {"params": 1000 * (s + 1), "minutes": 10.0 * (s + 1)}
            for a, s, i, c, v in rows
        ]
    )
    table = arm_seed_table(runs)
    assert list(table["aso_se_run"]) == ["a0", "a1", "a2"]
    assert [c for c in table.columns if c.endswith("test_acc")] == [
        "aso-se test_acc",
        "scratch test_acc",
        "initial test_acc",
        "random-final test_acc",
    ]
    assert table.loc[0, "random-final test_acc"] == 0.90 and table.loc[1, "initial params"] == 2000
    assert math.isnan(table.loc[2, "aso-se test_acc"]) and table.loc[2, "scratch test_acc"] == 0.93
    lines = arm_seed_lines(table)
    assert lines[2].split()[:5] == ["0", "a0", "92.00", "(91.00)", "1.0k"]
    # seed 0 has no scratch and no initial run
    assert "90.00 (89.00) 1.0k 10m" in lines[2] and lines[2].count(" - ") == 2
    # every column starts where its header starts
    head = lines[1]
    for arm in ("scratch", "random-final"):
        assert lines[4][head.index(arm) :].startswith("93.00" if arm == "scratch" else "-")


def test_sampled_genotypes_follow_the_alphas(tiny_cfg, digits):
    runner = Runner(tiny_cfg, data=digits)
    with torch.no_grad():
        for a in runner.net.alphas.values():
            a.normal_(0, 0.1)
    rng = random.Random(0)
    samples = [sample_genotype(runner.net, rng) for _ in range(30)]
    for g in samples:
        for cell in (g.normal, g.reduce):
            for node in cell:
                assert len({j for _, j in node}) == 2 and all(op != "none" for op, _ in node)
    assert len({g.canonical for g in samples}) > 1  # flat alphas: samples differ
    with torch.no_grad():  # sharp alphas: every sample is the derived genotype
        for a in runner.net.alphas.values():
            a.mul_(1e4)
    derived = runner.net.derive()
    assert all(sample_genotype(runner.net, rng).canonical == derived.canonical for _ in range(5))


def test_ranking_never_reads_the_test_split(tiny_cfg):
    cfg = tiny_cfg.replace(**{"search.cycles": 1, "data.train_subset": 100})
    runner = Runner(cfg, data=dataclasses.replace(load_data(cfg.data, cfg.seed), test=None))
    for _ in range(4):
        # the search without its final evaluation (which reports the test split)
        runner.next_phase()
    pairs = measure(runner, samples=2, epochs=1, seed=0)
    assert sorted(p.source for p in pairs) == ["alphas", "alphas", "random", "random"]
    assert all(0 <= p.one_shot_val_acc <= 1 and 0 <= p.standalone_val_acc <= 1 for p in pairs)


def test_rank_records_figures_pairs_and_plot(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys, **{"search.final_epochs": 0, "data.train_subset": 300})
    argv = [
        "rank",
        source,
        "--samples",
        "3",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--standalone-seeds",
        "2",
        "--quiet",
        "--tracking-uri",
        uri,
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Kendall tau" in out and "(p: two-sided" in out and "proxy (seed vs seed)" in out
    client = MlflowClient(tracking_uri=uri)
    metrics = client.get_run(source).data.metrics
    assert metrics["ranking_genotypes"] == 6
    # the proxy's size is recorded with its figures, and printed
    assert metrics["ranking_standalone_epochs"] == 1 and metrics["ranking_standalone_seeds"] == 2
    assert "stand-alone 1 epoch x 2 seeds" in out
    sizes = {"ranking_genotypes", "ranking_standalone_epochs", "ranking_standalone_seeds"}
    # the lead's interval (Welch's t on 3 + 3 genotypes) may reach beyond +-1
    interval = {"ranking_alphas_lead_low", "ranking_alphas_lead_high"}
    interval.add(L.RANKING_TAU_MINUS_PARAMS)  # a difference of two taus: within [-2, 2]
    # recorded unless undefined (tied accuracies)
    for name in set(L.RANKING_METRICS) - sizes - interval:
        assert name not in metrics or -1 <= metrics[name] <= 1
    local = client.download_artifacts(source, L.RANKING_PAIRS_ARTIFACT, str(tmp_path))
    with open(local) as f:
        pairs = json.load(f)["pairs"]
    assert sorted(p["source"] for p in pairs) == ["alphas"] * 3 + ["random"] * 3
    # two stand-alone seeds per genotype; the pair's stand-alone accuracy is their mean,
    # and the seeds do train differently
    assert all(len(p["standalone_by_seed"]) == 2 for p in pairs)
    for p in pairs:
        assert p["standalone_val_acc"] == pytest.approx(sum(p["standalone_by_seed"]) / 2)
    assert any(p["standalone_by_seed"][0] != p["standalone_by_seed"][1] for p in pairs)
    # the alphas' lead is the difference of the groups' stand-alone means, and printed
    means = [
        sum(p["standalone_val_acc"] for p in pairs if p["source"] == s) / 3
        for s in ("alphas", "random")
    ]
    assert metrics["ranking_standalone_mean"] == pytest.approx(means[0])
    assert metrics["ranking_alphas_lead"] == pytest.approx(means[0] - means[1])
    assert "stand-alone val acc, mean: from alphas" in out
    assert 0 < metrics["ranking_alpha_entropy"] <= 1  # tiny runs barely move their alphas
    assert L.RANKING_PLOT_ARTIFACT in [a.path for a in client.list_artifacts(source, L.RANKING_DIR)]
    assert (
        cli.main(
            ["compare", "--run", source, "--tracking-uri", uri, "--report", str(tmp_path / "r")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ranking diagnostic" in out and "proxy seed vs seed" in out
    assert "(stand-alone 1 epoch x 2 seeds)" in out
    assert "alphas lead" in out
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Ranking diagnostic" in page and "one point per genotype" in page
    assert "proxy seed vs seed: tau (p)" in page
    assert "1 epoch x 2 seeds" in page
    assert "alphas lead, stand-alone" in page


def test_ranking_figures_carry_kendalls_p_value():
    """A perfect ranking of 8 genotypes is far beyond chance; a shuffled one is not;
    the p-value is logged beside each tau and printed after it."""

    def pairs(source, standalone):
        return [Pair(source, f"g{i}", i / 10, acc) for i, acc in enumerate(standalone)]

    figures = correlations(
        pairs("alphas", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
        + pairs("random", [0.5, 0.1, 0.8, 0.3, 0.2, 0.7, 0.4, 0.6])
    )
    assert figures["ranking_kendall_tau"] == pytest.approx(1.0)
    assert figures["ranking_kendall_p"] < 0.001  # exact: 2 / 8! = 5e-5
    assert abs(figures["ranking_kendall_tau_random"]) < 0.3
    assert figures["ranking_kendall_p_random"] > 0.3
    assert 0 <= figures["ranking_kendall_p_all"] <= 1
    assert {f"ranking_kendall_p{s}" for s in ("", "_random", "_all")} <= set(L.RANKING_METRICS)
    assert p_text(figures["ranking_kendall_p_random"]).startswith(" (p 0.")
    assert p_text(math.nan) == ""  # an undefined tau (tied accuracies) has no p either


def test_ranking_measures_the_stand_alone_proxy_against_itself():
    """With two stand-alone seeds, the proxy's reliability is tau between them over all
    genotypes; with one seed there is no such figure."""

    def pairs(first, second):
        return [
            Pair("alphas" if i % 2 else "random", f"g{i}", i / 10, (a + b) / 2, (a, b))
            for i, (a, b) in enumerate(zip(first, second))
        ]

    agree = correlations(pairs([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]))
    assert agree["ranking_proxy_kendall_tau"] == pytest.approx(1.0)
    assert agree["ranking_proxy_kendall_p"] < 0.01
    reverse = correlations(pairs([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]))
    assert reverse["ranking_proxy_kendall_tau"] == pytest.approx(-1.0)
    assert {"ranking_proxy_kendall_tau", "ranking_proxy_kendall_p"} <= set(L.RANKING_METRICS)
    one_seed = [Pair("alphas", f"g{i}", i / 10, i / 10) for i in range(4)]
    assert "ranking_proxy_kendall_tau" not in correlations(one_seed)
    # asolab rank warns when the proxy is no better than chance against itself
    assert proxy_warning(agree) is None
    assert "raise --epochs" in proxy_warning(reverse)
    assert "raise --epochs" in proxy_warning(
        {"ranking_proxy_kendall_tau": 0.3, "ranking_proxy_kendall_p": 0.2}
    )
    assert proxy_warning(correlations(one_seed)) is None


def test_random_arm_draws_from_the_capped_space_the_search_derives_in():
    """With search.param_free_cap the random genotypes (the random arm's and rank's)
    keep every cell within the cap, as the search's own genotypes do."""
    rng = random.Random(0)
    free = [random_genotype(rng, PRIMITIVES, 2).most_param_free() for _ in range(200)]
    assert max(free) >= 2  # the uncapped space has cells of pools and skips
    rng = random.Random(0)
    assert all(random_genotype(rng, PRIMITIVES, 2, 0).most_param_free() == 0 for _ in range(200))
    cfg = config.load(None, {**TINY, "search.param_free_cap": 1})
    probe = FixedGenotypeRunner(cfg)
    target = probe.net.count_derived(probe.net.derive())
    drawn, n = matched_random(probe, target, seed=0)
    assert drawn.most_param_free() <= 1 and abs(n / target - 1) <= PARAM_TOLERANCE
    # the initial arm: derive() of the fresh alphas under the same cap
    assert FixedGenotypeRunner(config.load(None, TINY)).state.genotype.most_param_free() >= 1
    assert (
        FixedGenotypeRunner(
            cfg.replace(**{"search.param_free_cap": 0})
        ).state.genotype.most_param_free()
        == 0
    )
    only_free = ("none", "skip_connect", "max_pool_3x3")
    with pytest.raises(config.ConfigError, match="param_free_cap"):
        random_genotype(random.Random(0), only_free, 2, 0)


def test_ranking_measures_the_alphas_lead_over_random_genotypes():
    """The lead is the alphas' mean stand-alone accuracy minus the random genotypes', with
    Welch's 95% interval; rank warns when the interval reaches zero, and the lead is
    undefined while a group has a single genotype (alphas that have converged)."""

    def pairs(alphas, random_):
        return [Pair("alphas", f"a{i}", 0.5, a) for i, a in enumerate(alphas)] + [
            Pair("random", f"r{i}", 0.5, r) for i, r in enumerate(random_)
        ]

    ahead = alphas_lead(pairs([0.80, 0.82, 0.84, 0.83], [0.70, 0.72, 0.74, 0.71]))
    assert ahead["ranking_standalone_mean"] == pytest.approx(0.8225)
    assert ahead["ranking_alphas_lead"] == pytest.approx(0.8225 - 0.7175)
    assert 0 < ahead["ranking_alphas_lead_low"] < 0.105 < ahead["ranking_alphas_lead_high"]
    assert lead_text(ahead) == "+10.50 points (95% CI " + (
        f"{100 * ahead['ranking_alphas_lead_low']:+.2f} .. "
        f"{100 * ahead['ranking_alphas_lead_high']:+.2f})"
    )
    assert lead_warning(ahead) is None
    level = alphas_lead(pairs([0.80, 0.82, 0.79, 0.81], [0.81, 0.79, 0.82, 0.80]))
    assert level["ranking_alphas_lead_low"] < 0 < level["ranking_alphas_lead_high"]
    assert "search.alpha_lr" in lead_warning(level)
    assert "entropy is 0.98 of uniform" in lead_warning(level | {"ranking_alpha_entropy": 0.98})
    converged = alphas_lead(pairs([0.80], [0.81, 0.79]))
    assert converged["ranking_standalone_mean"] == pytest.approx(0.80)
    assert math.isnan(converged["ranking_alphas_lead"]) and lead_text(converged) == ""
    assert lead_warning(converged) is None
    assert set(ahead) <= set(L.RANKING_METRICS)


def test_fixed_genotype_runner_keeps_its_genotype(tiny_cfg):
    tiny_cfg = tiny_cfg.replace(**{"search.cycles": 1})
    digits = load_data(tiny_cfg.data, tiny_cfg.seed)
    runner = Runner(tiny_cfg, data=digits)
    found = runner.net.derive()
    fixed = FixedGenotypeRunner(tiny_cfg, data=digits)
    result = fixed.run()
    assert result.genotype.canonical == found.canonical  # same seed: the same initial alphas


def test_sigterm_stops_baseline_like_ctrl_c_and_the_same_command_continues(
    tmp_path, capsys, monkeypatch
):
    """SIGTERM (a scheduler's time limit) while an arm trains: the arm ends KILLED,
    `asolab baseline` exits 143 printing the command that continues, and that command
    resumes the same run from its checkpoint."""
    import os
    import signal

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = _source(uri, capsys)
    capsys.readouterr()

    class Terminate(Observer):
        epochs = 0

        def on_epoch_end(self, event):
            Terminate.epochs += 1
            if Terminate.epochs == 2:  # after the first phase's checkpoint
                os.kill(os.getpid(), signal.SIGTERM)

    init = Runner.__init__

    def with_terminate(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.observers.append(Terminate())

    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached the test's handler: baseline left it unhandled")

    monkeypatch.setattr(Runner, "__init__", with_terminate)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        argv = ["baseline", source, "--arms", "initial", "--threads", "1", "--quiet"]
        rc = cli.main([*argv, "--tracking-uri", uri])
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    assert rc == 143, err
    client = MlflowClient(tracking_uri=uri)
    (killed,) = [r for r in _set_runs(client, source) if r.data.tags[L.TAG_ARM] == "initial"]
    assert killed.info.status == "KILLED"
    again = shlex.split(err.split("continues it")[1].split(": ", 1)[1].splitlines()[0])
    assert again[:2] == ["asolab", "baseline"] and uri in again
    monkeypatch.undo()
    assert cli.main(again[1:]) == 0
    resumed = client.get_run(killed.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags[L.TAG_RESUMED] == "1"
    assert _weight_epochs(client, killed.info.run_id) == _weight_epochs(client, source)


def test_set_run_lines_keep_their_columns_for_every_arm():
    from asolab.baseline.arms import ARMS
    from asolab.baseline.run import SetRun

    lines = [SetRun(a, 0, "f" * 32, 0.9, 0.9, 123, True).line() for a in ("aso-se", *ARMS)]
    assert len({line.index(" run ") for line in lines}) == 1
    assert lines[0].endswith("(trained)")

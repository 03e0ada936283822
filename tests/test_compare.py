"""asolab compare on a real MLflow store filled by real tiny digits runs.

One SQLite store per module: two experiments, several seeds, recorded by the
MLflow tracker exactly as ``asolab run`` records them, plus one failed run that
never logged a genotype.
"""

from __future__ import annotations

import html
import itertools
import random
import re
import struct
import zlib
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY
from layout_check import undeclared
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

import asolab
from asolab import config
from asolab.cli import main
from asolab.compare.analysis import (
    analyse,
    diff_frame,
    diff_lines,
    evolution,
    load_evolution,
    op_frequencies,
    val_acc_by_cycle,
)
from asolab.compare.report import write_report
from asolab.compare.select import COLUMNS, CompareError, RunRecord, Selection, load_selection
from asolab.runner import Runner
from asolab.runner.events import Recorder
from asolab.space.genotype import Genotype, distance
from asolab.space.ops import PRIMITIVES
from asolab.tracking import layout
from asolab.tracking.mlflow_tracker import MlflowTracker
from asolab.tracking.store import artifact_root

# One worker builds the module's store of recorded runs (--dist loadgroup), not both.
pytestmark = pytest.mark.xdist_group("compare")

EXPERIMENTS = {
    # experiment -> (seeds, initial temperature, mutation strength)
    "cmp-alpha": ((0, 1, 2), 5.0, 0.25),
    "cmp-beta": ((0, 1), 2.0, 0.5),
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Record the runs once; returns
    (uri, {run_id: (experiment, seed, RunEnd, [CycleEnd])}, failed_run_id)."""
    root = tmp_path_factory.mktemp("compare-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    runs = {}
    for exp, (seeds, tau0, strength) in EXPERIMENTS.items():
        for seed in seeds:
            cfg = config.load(
                None,
                {
                    **TINY,
                    "data.train_subset": 64,  # one W-step an epoch: the records are the point
                    "seed": seed,
                    "tracking.enabled": True,
                    "tracking.log_models": False,
                    "temperature.initial_temperature": tau0,
                    "mutation.strength": strength,
                },
            )
            recorder = Recorder()
            tracker = MlflowTracker(tracking_uri=uri, experiment=exp, log_models=False)
            Runner(cfg, [tracker, recorder]).run()
            runs[tracker.run_id] = (exp, seed, recorder.of("run_end")[-1], recorder.of("cycle_end"))
    # A run that failed before it recorded any genotype (no artifact, no genotype tag).
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_experiment_by_name("cmp-alpha").experiment_id
    failed = client.create_run(
        exp_id, run_name="crashed-early", tags={layout.TAG_DATASET: "digits"}
    )
    client.log_param(failed.info.run_id, "seed", "7")
    client.set_terminated(failed.info.run_id, "FAILED")
    return uri, runs, failed.info.run_id


def _g(text: str) -> Genotype:
    return Genotype.parse(text)


BASE = _g(
    "normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ; "
    "reduce: max_pool_3x3(0) max_pool_3x3(1) | max_pool_3x3(0) skip_connect(2) -> 2,3"
)


def _genotype_run(client, exp_id, name, genotype=None, metrics=None, tags=None):
    """A finished run recorded by hand: a final genotype artifact (unless None), metrics
    and tags."""
    run_id = client.create_run(exp_id, run_name=name, tags=tags or {}).info.run_id
    if genotype is not None:
        client.log_text(run_id, genotype.to_json(), layout.FINAL_GENOTYPE_ARTIFACT)
    for key, value in (metrics or {}).items():
        client.log_metric(run_id, key, value)
    client.set_terminated(run_id, "FINISHED" if genotype is not None else "FAILED")
    return run_id


def _create_experiment(client, uri, name):
    """A new experiment whose artifacts go beside the store's database: without an
    artifact location MLflow would put them in ./mlruns, the project's own folder."""
    return client.create_experiment(name, artifact_location=(artifact_root(uri) / name).as_uri())


@pytest.fixture
def scratch_experiment(store):
    """A fresh experiment in the shared store, deleted afterwards so other tests never see
    its runs."""
    uri = store[0]
    client = MlflowClient(tracking_uri=uri)
    made = []

    def make(name):
        made.append(_create_experiment(client, uri, name))
        return made[-1]

    yield client, make
    for exp_id in made:
        client.delete_experiment(exp_id)


# ------------------------------------------------------------------ genotype analysis (no store)


def test_diff_lists_exactly_the_changed_edges():
    other = _g(
        "normal: sep_conv_5x5(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ; "
        "reduce: max_pool_3x3(0) max_pool_3x3(1) | max_pool_3x3(1) skip_connect(2) -> 2,3"
    )
    frame = diff_frame(BASE, other)
    assert frame.to_dict("records") == [
        {
            "cell": "normal",
            "node": 0,
            "input": 0,
            "before": "sep_conv_3x3",
            "after": "sep_conv_5x5",
        },
        {"cell": "reduce", "node": 1, "input": 0, "before": "max_pool_3x3", "after": "-"},
        {"cell": "reduce", "node": 1, "input": 1, "before": "-", "after": "max_pool_3x3"},
    ]
    assert diff_lines(BASE, other) == [
        "normal node 0 input 0: sep_conv_3x3 -> sep_conv_5x5",
        "reduce node 1 input 0: max_pool_3x3 -> -",
        "reduce node 1 input 1: - -> max_pool_3x3",
    ]
    assert distance(BASE, other) == 3
    assert diff_frame(BASE, BASE).empty and diff_lines(BASE, BASE) == []
    concat = _g(str(BASE).replace("-> 2,3 ;", "-> 3 ;"))
    assert diff_lines(BASE, concat) == ["normal concat: 2,3 -> 3"]
    assert distance(BASE, concat) == 1


def _random_genotype(rng: random.Random, steps: int = 2) -> Genotype:
    ops = [p for p in PRIMITIVES if p != "none"]

    def cell():
        return [[(rng.choice(ops), i) for i in rng.sample(range(k + 2), 2)] for k in range(steps)]

    return Genotype(cell(), (2, 3), cell(), rng.choice([(2, 3), (3,)]))


def test_distance_is_a_metric_on_a_sample():
    rng = random.Random(0)
    sample = [_random_genotype(rng) for _ in range(14)] + [
        BASE,
        BASE.replace_op("normal", 0, 0, "avg_pool_3x3"),
    ]
    for a in sample:
        assert distance(a, a) == 0
        assert distance(a, Genotype.parse(str(a))) == 0
    for a, b in itertools.combinations(sample, 2):
        assert distance(a, b) == distance(b, a)
        assert (distance(a, b) == 0) == (a == b)
    for a, b, c in itertools.permutations(sample, 3):
        assert distance(a, c) <= distance(a, b) + distance(b, c)
    assert (
        max(distance(a, b) for a, b in itertools.combinations(sample, 2)) > 2
    )  # the sample is not trivial


def _with_own_cells(rng: random.Random, g: Genotype) -> Genotype:
    """``g`` with up to two more own cells, at indices from a small range so that samples
    share some."""
    cells = [
        (i, _random_genotype(rng).normal, rng.choice([(2, 3), (3,)]))
        for i in rng.sample(range(5, 8), rng.randint(1, 2))
    ]
    return Genotype(
        g.normal, g.normal_concat, g.reduce, g.reduce_concat, g.own_cells + tuple(cells)
    )


def test_own_cells_in_diffs_distances_and_op_frequencies():
    own = _g(
        str(BASE)
        + " ; cell3: skip_connect(0) sep_conv_3x3(1) | skip_connect(0) skip_connect(2) -> 2,3"
    )
    edited = own.replace_op("cell3", 1, 2, "avg_pool_3x3")
    assert diff_lines(own, edited) == ["cell3 node 1 input 2: skip_connect -> avg_pool_3x3"]
    assert diff_lines(BASE, own)[-1] == "cell3 concat: - -> 2,3" and distance(BASE, own) == 5
    rng = random.Random(1)
    base = _random_genotype(rng)
    sample = [own, edited, BASE, base] + [
        _with_own_cells(rng, g) for g in (base, base, base, base, BASE, own)
    ]
    for a, b, c in itertools.permutations(sample, 3):
        assert distance(a, c) <= distance(a, b) + distance(b, c)
        assert (distance(a, b) == 0) == (a == b)
    freq = op_frequencies([own, edited])
    assert list(freq.columns) == ["normal", "reduce", "own", "total"]
    assert freq.loc["skip_connect", "own"] == 5 and freq.loc["avg_pool_3x3", "own"] == 1
    assert int(freq["total"].sum()) == own.num_edges + edited.num_edges
    assert list(op_frequencies([BASE]).columns) == [
        "normal",
        "reduce",
        "total",
    ]  # unchanged without own cells


def test_op_frequencies_and_clusters_count_edges_and_runs():
    freq = op_frequencies([BASE, BASE.replace_op("normal", 0, 0, "avg_pool_3x3")])
    assert freq.loc["sep_conv_3x3", "normal"] == 3 and freq.loc["max_pool_3x3", "reduce"] == 6
    assert freq.loc["avg_pool_3x3", "normal"] == 1 and freq.loc["avg_pool_3x3", "reduce"] == 0
    assert int(freq["total"].sum()) == 2 * BASE.num_edges
    assert "none" not in freq.index


def test_evolution_distances_between_consecutive_cycles():
    g1 = BASE.replace_op("normal", 0, 0, "avg_pool_3x3")
    g2 = g1.replace_op("reduce", 1, 2, "sep_conv_5x5")
    df = evolution([(0, BASE), (1, g1), (2, g2), (3, g2)], {0: 0.1, 1: 0.2, 2: 0.3})
    assert df["distance_prev"].tolist() == [0, 1, 1, 0]
    assert df["changes"].iloc[1] == "normal node 0 input 0: sep_conv_3x3 -> avg_pool_3x3"
    assert df["val_acc"].iloc[:3].tolist() == [0.1, 0.2, 0.3] and pd.isna(df["val_acc"].iloc[3])
    # A cycle whose genotype is missing takes no other cycle's accuracy with it.
    gap = evolution([(0, BASE), (2, g2)], {0: 0.1, 1: 0.2, 2: 0.3})
    assert gap["val_acc"].tolist() == [0.1, 0.3]


def _metrics(name, step_values):
    return [Metric(name, float(v), 1000 + k, step) for k, (step, v) in enumerate(step_values)]


def test_cycle_val_acc_is_matched_to_cycles_by_step():
    """The tracker logs cycle_val_acc one step past the cycle's last epoch; the epoch metric
    `cycle` says whose."""
    epochs = _metrics("cycle", [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)])
    accs = _metrics("cycle_val_acc", [(2, 0.5), (4, 0.6), (6, 0.7)])
    assert val_acc_by_cycle(accs, epochs) == {0: 0.5, 1: 0.6, 2: 0.7}
    # A cycle without epochs logs no value (its step is not new): the next cycle keeps its own
    # number.
    epochs = _metrics("cycle", [(0, 0), (1, 0), (2, 2), (3, 2)])
    assert val_acc_by_cycle(_metrics("cycle_val_acc", [(2, 0.5), (4, 0.7)]), epochs) == {
        0: 0.5,
        2: 0.7,
    }
    # Final epochs after the last cycle (cycle = cycles) carry no cycle_val_acc.
    epochs = _metrics("cycle", [(0, 0), (1, 1), (2, 2), (3, 2)])
    assert val_acc_by_cycle(_metrics("cycle_val_acc", [(1, 0.5), (2, 0.6)]), epochs) == {
        0: 0.5,
        1: 0.6,
    }
    # Without a `cycle` history, the k-th value by step is cycle k.
    assert val_acc_by_cycle(_metrics("cycle_val_acc", [(9, 0.7), (3, 0.5)]), []) == {0: 0.5, 1: 0.7}


# ---------------------------------------------------------------------- on the recorded store


def test_table_has_one_row_per_run_matching_the_records(store):
    uri, runs, failed = store
    selection = load_selection(uri)
    table = selection.table()
    assert list(table.columns) == list(COLUMNS)
    assert sorted(table["run_id"]) == sorted(runs)
    client = MlflowClient(tracking_uri=uri)
    for _, row in table.iterrows():
        exp, seed, end, cycle_ends = runs[row["run_id"]]
        run = client.get_run(row["run_id"])
        seeds, tau0, strength = EXPERIMENTS[exp]
        # against what the runner itself produced
        assert row["experiment"] == exp and row["seed"] == seed and row["dataset"] == "digits"
        assert row["initial_temperature"] == tau0 and row["mutation_strength"] == strength
        assert row["cycles"] == TINY["search.cycles"] == len(cycle_ends)
        assert Genotype.parse(row["genotype"]) == end.genotype
        assert row["params"] == end.derived_params
        assert row["val_acc"] == pytest.approx(end.val_acc) and row["test_acc"] == pytest.approx(
            end.test_acc
        )
        assert row["peak_rss_mb"] == pytest.approx(end.memory["peak_rss_mb"])
        # how far its alphas moved, as its last cycle logged it and its end reported it
        assert row["alpha_entropy"] == pytest.approx(end.alpha_entropy) and end.alpha_steps
        # what it cost, and where: its wall time, on the CPU
        assert row["run_minutes"] == pytest.approx(run.data.metrics["run_seconds"] / 60, abs=0.005)
        assert (
            run.data.metrics["run_seconds"] == pytest.approx(end.seconds) and row["device"] == "cpu"
        )
        # against the run's own record in MLflow
        assert row["run_name"] == run.info.run_name
        assert row["test_acc"] == pytest.approx(run.data.metrics["test_acc"])
        assert row["status"] == "FINISHED"
    assert [s.run_id for s in selection.skipped] == [failed]
    assert "no genotypes/final.json artifact" in selection.skipped[0].reason


def test_selection_by_experiment_filter_top_and_run(store):
    uri, runs, failed = store
    beta = load_selection(uri, experiments=["cmp-beta"]).table()
    assert set(beta["experiment"]) == {"cmp-beta"} and len(beta) == 2
    seed0 = load_selection(uri, filter_string="params.seed = '0'").table()
    assert sorted(seed0["experiment"]) == ["cmp-alpha", "cmp-beta"] and set(seed0["seed"]) == {0}
    top = load_selection(uri, top=2, by="test_acc").table()
    best_two = sorted((e.test_acc for _, _, e, _ in runs.values()), reverse=True)[:2]
    assert sorted(top["test_acc"], reverse=True) == pytest.approx(best_two)
    one = next(iter(runs))
    picked = load_selection(uri, run_ids=[one, failed])
    assert [r.run_id for r in picked.records] == [one] and [s.run_id for s in picked.skipped] == [
        failed
    ]


def test_top_by_a_metric_no_run_has_is_an_error(store, capsys):
    """A misspelt --by would rank every run as missing and compare arbitrary ones."""
    uri, runs, _ = store
    with pytest.raises(
        CompareError,
        match=r"--by 'test_ac': no selected run has this metric \(did you mean 'test_acc'\?\)",
    ):
        load_selection(uri, top=2, by="test_ac")
    assert main(["compare", "--tracking-uri", uri, "--top", "2", "--by", "no_such_metric"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "asolab: error: --by 'no_such_metric': no selected run has this metric"
    )
    listed = err[0].split("the selected runs have: ")[1].split(", ")
    assert {"final_val_acc", "test_acc", "cycle_val_acc"} <= set(listed)
    # The same metric is fine without --top (it is only used for ranking).
    assert len(load_selection(uri, by="no_such_metric").records) == len(runs)


def test_top_counts_only_runs_with_a_genotype(store, scratch_experiment):
    """--top K compares K runs even when better-ranked runs have no genotype to compare."""
    uri, runs, _ = store
    client, make = scratch_experiment
    exp_id = make("cmp-top")
    high = _genotype_run(client, exp_id, "best-but-no-genotype", metrics={"test_acc": 2.0})
    low = _genotype_run(client, exp_id, "worst-and-no-genotype", metrics={"test_acc": -1.0})
    sel = load_selection(uri, experiments=["cmp-beta", "cmp-top"], top=2, by="test_acc")
    beta = sorted((e.test_acc for exp, _, e, _ in runs.values() if exp == "cmp-beta"), reverse=True)
    assert [r.metric("test_acc") for r in sel.records] == pytest.approx(beta[:2])
    # Skipped: the run ranked above the compared ones, not the one ranked below them.
    assert [s.run_id for s in sel.skipped] == [high] and low not in str(sel.skipped)
    lowest = load_selection(
        uri, experiments=["cmp-beta", "cmp-top"], top=1, by="test_acc", ascending=True
    )
    assert [r.metric("test_acc") for r in lowest.records] == pytest.approx([beta[-1]])
    assert [s.run_id for s in lowest.skipped] == [low]


def test_the_final_genotype_comes_from_its_tag_unless_the_tag_may_be_cut_short(
    store, scratch_experiment
):
    """The final-genotype tag comes with the run, so it is read first (no artifact request);
    the artifact decides where the tag is as long as the tracker's cap (it may be cut
    short) or does not parse. Each run here holds a different genotype in each place."""
    from asolab.tracking.runs import final_genotype

    client, make = scratch_experiment
    exp_id = make("cmp-final-tag")
    other = _g(str(BASE).replace("sep_conv_3x3(0)", "dil_conv_5x5(0)", 1))
    capped = str(other).ljust(layout.MAX_TAG_LENGTH)  # parses, but may have been cut short
    cases = {
        str(other): other,  # a whole tag: read, the artifact not needed
        capped: BASE,
        "normal: not a genotype": BASE,
    }
    for tag, expected in cases.items():
        run_id = _genotype_run(
            client, exp_id, "tagged", BASE, tags={layout.TAG_FINAL_GENOTYPE: tag}
        )
        assert final_genotype(client, client.get_run(run_id)) == expected, tag[:40]
    # a tag that does not parse, and no artifact: the tag's error
    bare = _genotype_run(client, exp_id, "bad-tag", tags={layout.TAG_FINAL_GENOTYPE: "x"})
    with pytest.raises(ValueError, match="tag asolab.final_genotype does not parse"):
        final_genotype(client, client.get_run(bare))


def test_unknown_experiment_is_a_clear_error(store, capsys):
    uri, _, _ = store
    with pytest.raises(
        CompareError, match=r"'nope' not found.*; known experiments: Default, cmp-alpha, cmp-beta$"
    ):
        load_selection(uri, experiments=["nope"])
    assert main(["compare", "--tracking-uri", uri, "--experiment", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("asolab: error: experiment 'nope' not found")
    assert "cmp-alpha, cmp-beta" in err[0]
    assert main(["compare", "--tracking-uri", uri, "--filter", "params.seed ==== 1"]) == 2
    assert "not a valid MLflow search expression" in capsys.readouterr().err


def test_clusters_group_identical_genotypes(store):
    uri, runs, _ = store
    comparison = analyse(load_selection(uri), with_evolution=False)
    expected = {}
    for _, _, end, _ in runs.values():
        expected[end.genotype.canonical] = expected.get(end.genotype.canonical, 0) + 1
    got = dict(zip(comparison.clusters["genotype"], comparison.clusters["runs"]))
    assert got == expected
    assert comparison.clusters["runs"].is_monotonic_decreasing
    assert comparison.distances.shape == (len(runs), len(runs))
    assert (pd.Series(comparison.distances.values.diagonal()) == 0).all()
    freq = comparison.op_frequencies
    assert int(freq["total"].sum()) == sum(e.genotype.num_edges for _, _, e, _ in runs.values())
    for d in comparison.diffs:
        assert d.distance == distance(d.reference.genotype, d.other.genotype) > 0


def test_evolution_reads_every_cycle_genotype(store):
    uri, runs, _ = store
    client = MlflowClient(tracking_uri=uri)
    run_id, (_, _, _, cycle_ends) = next(iter(runs.items()))
    df = load_evolution(client, run_id)
    assert df["cycle"].tolist() == [c.cycle for c in cycle_ends]
    assert [Genotype.parse(g) for g in df["genotype"]] == [c.genotype for c in cycle_ends]
    expected = [0] + [distance(a.genotype, b.genotype) for a, b in zip(cycle_ends, cycle_ends[1:])]
    assert df["distance_prev"].tolist() == expected
    assert df["val_acc"].tolist() == pytest.approx([c.val_acc for c in cycle_ends])


def test_evolution_keeps_accuracies_on_their_cycles_when_a_cycle_artifact_is_corrupt(
    store, scratch_experiment, tmp_path
):
    """A copy of a real run whose cycle_000.json is garbage: cycle 1 still shows cycle 1's
    accuracy."""
    uri, runs, _ = store
    client, make = scratch_experiment
    differing = [
        (rid, ends) for rid, (_, _, _, ends) in runs.items() if ends[0].val_acc != ends[1].val_acc
    ]
    assert differing, (
        "every run scored the same in cycles 0 and 1: the test could not tell them apart"
    )
    source, cycle_ends = differing[0]
    copy = client.create_run(make("cmp-corrupt"), run_name="corrupt-cycle-0").info.run_id
    history = client.get_metric_history(source, "cycle_val_acc") + client.get_metric_history(
        source, "cycle"
    )
    client.log_batch(copy, metrics=history)
    local = Path(client.download_artifacts(source, layout.GENOTYPE_DIR, str(tmp_path)))
    for cycle in range(len(cycle_ends)):
        text = (
            "{not json"
            if cycle == 0
            else (local / Path(layout.genotype_artifact(cycle)).name).read_text()
        )
        client.log_text(copy, text, layout.genotype_artifact(cycle))
    client.set_terminated(copy)

    df = load_evolution(client, copy)
    assert df["cycle"].tolist() == [c.cycle for c in cycle_ends[1:]]
    assert df["val_acc"].tolist() == pytest.approx([c.val_acc for c in cycle_ends[1:]])


def _png_ok(data: bytes) -> bool:
    """A structurally valid PNG: signature, IHDR first, every chunk's CRC right, IEND last."""
    if not data.startswith(PNG_SIGNATURE):
        return False
    pos, kinds = len(PNG_SIGNATURE), []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            return False
        kinds.append(kind)
        pos += 12 + length
    return kinds[0] == b"IHDR" and kinds[-1] == b"IEND"


_NETWORK = (
    # any non-inline attribute target
    r"""\b(?:src|href|srcset|action|poster|data)\s*=\s*["']?\s*(?!data:|#)[^\s"'>]+""",
    r"""url\(\s*["']?\s*(?!data:)""",  # CSS url(...) other than a data URI
    r"@import",  # CSS import
    r"https?://|//[a-z0-9.-]+\.[a-z]{2,}",  # any absolute or protocol-relative address
    r"<script|<link|<iframe|<object|<embed",  # elements that load something
)


def _network_references(page: str) -> list[str]:
    """Everything in an HTML page that could load something from outside it."""
    return [m.group(0) for pattern in _NETWORK for m in re.finditer(pattern, page, re.I)]


def test_network_reference_check_catches_each_kind():
    inline = (
        '<img alt="x" src="data:image/png;base64,AAAA">'
        "<style>td { background: url(data:image/png;base64,AA) }</style>"
    )
    assert _network_references(inline) == []
    for leak in (
        '<img src="cells.png">',
        "<a href='//cdn.example.org/x'>",
        '<style>@import "theme.css";</style>',
        "<style>body { background: url('bg.png') }</style>",
        "<p>see https://example.org</p>",
        "<script>1</script>",
    ):
        assert _network_references(leak), leak


def test_cli_report_csv_and_mlflow_logging(store, tmp_path, capsys):
    import base64

    uri, runs, failed = store
    report, csv = tmp_path / "report", tmp_path / "runs.csv"
    rc = main(
        [
            "compare",
            "--tracking-uri",
            uri,
            "--report",
            str(report),
            "--csv",
            str(csv),
            "--log-to-mlflow",
            "--evolution",
            "--all",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert f"{len(runs)} runs compared" in out and "skipped 1 run(s)" in out and failed in out
    assert "distinct genotypes" in out and "evolution of" in out
    table = pd.read_csv(csv)
    assert sorted(table["run_id"]) == sorted(runs)
    # the tiny runs' alphas barely moved (a few steps at the shipped rate): the summary says so
    assert (table["alpha_entropy"] >= 0.99).all()
    assert (
        f"alphas near uniform (entropy >= 0.99 of uniform) in {len(runs)} of {len(runs)} run(s)"
        in out
    )

    page = (report / "index.html").read_text()
    # Run names are links to the MLflow UI (navigation, which loads nothing into the page);
    # every run has one, and nothing else refers outside the page.
    run_links = re.findall(r'<a class="run" href="([^"]+)"', page)
    assert len(run_links) == len(runs) and all("/#/experiments/" in u for u in run_links)
    assert sorted(u.split("/runs/")[1].split("?")[0] for u in run_links) == sorted(runs)
    assert _network_references(re.sub(r'<a class="run" href="[^"]+"', "<a", page)) == []
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    # 3 accuracy plots + op frequencies + evolution + the Pareto view + one picture per
    # distinct genotype
    n_genotypes = len({e.genotype.canonical for _, _, e, _ in runs.values()})
    assert len(images) == 6 + n_genotypes
    assert "Accuracy against size (Pareto view)" in page and (report / "pareto.png").exists()
    assert all(_png_ok(base64.b64decode(b)) for b in images)
    assert not re.search(r'<img[^>]+src="(?!data:image/png;base64,)', page)
    for run_id in runs:
        assert run_id in page
    assert failed in page

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("asolab-comparisons")
    assert exp is not None
    [comparison_run] = client.search_runs([exp.experiment_id])
    assert comparison_run.data.metrics["runs"] == len(runs)
    assert undeclared(client, comparison_run.info.run_id) == []  # every name in tracking/layout.py
    assert {a.path for a in client.list_artifacts(comparison_run.info.run_id, "report")} >= {
        "report/index.html",
        "report/runs.csv",
    }
    # The comparison run itself is never selected by a later comparison.
    again = load_selection(uri)
    assert comparison_run.info.run_id not in {r.run_id for r in again.records} | {
        s.run_id for s in again.skipped
    }


def test_cli_diff_of_two_runs(store, capsys):
    uri, runs, _ = store
    (a, (_, _, ea, _)), (b, (_, _, eb, _)) = list(runs.items())[:2]
    assert (
        main(["compare", "--tracking-uri", uri, "--run", a, "--run", b, "--diff", a[:10], b]) == 0
    )
    out = capsys.readouterr().out
    assert f"distance {distance(ea.genotype, eb.genotype)}" in out
    for line in diff_lines(ea.genotype, eb.genotype):
        assert line in out


def test_what_a_run_cost_and_where_it_ran_are_columns(store, scratch_experiment, tmp_path):
    """Each run's wall time in minutes, and its device: the GPU's name, or cpu. The page
    shows the device only where the compared runs differ in it."""
    uri, runs, _ = store
    client, make = scratch_experiment
    source, (_, _, end, _) = next(iter(runs.items()))
    gpu_tags = {layout.TAG_DEVICE: "cuda:0", layout.TAG_DEVICE_INFO + "gpu_name": "NVIDIA H200"}
    gpu = _genotype_run(
        client, make("cmp-gpu"), "on-gpu", end.genotype, {"run_seconds": 600.0}, gpu_tags
    )
    comparison = analyse(load_selection(uri, run_ids=[source, gpu]))
    rows = comparison.table.set_index("run_id")
    assert rows.loc[source, "device"] == "cpu" and rows.loc[gpu, "device"] == "NVIDIA H200"
    assert rows.loc[gpu, "run_minutes"] == 10.0
    page = write_report(comparison, tmp_path / "mixed").read_text()
    assert "<th>device</th>" in page and "<td>NVIDIA H200</td>" in page
    alone = write_report(analyse(load_selection(uri, run_ids=[source])), tmp_path / "cpu")
    assert "<th>device</th>" not in alone.read_text()


def test_write_report_with_a_single_genotype(store, scratch_experiment, tmp_path):
    """Edge case: when every compared run found the same genotype, analyse() finds no diffs
    and the page says so."""
    uri, runs, _ = store
    client, make = scratch_experiment
    source, (_, _, end, _) = next(iter(runs.items()))
    exp_id = make("cmp-twins")
    twin = _genotype_run(
        client, exp_id, "twin", end.genotype, {"final_val_acc": end.val_acc + 0.01}
    )
    comparison = analyse(load_selection(uri, run_ids=[source, twin]))
    assert comparison.diffs == [] and comparison.clusters["runs"].tolist() == [2]
    page = write_report(comparison, tmp_path / "same").read_text()
    assert "All compared runs share one genotype" in page

    # One run with another genotype: the page shows its diff instead.
    other = BASE if BASE != end.genotype else BASE.replace_op("normal", 0, 0, "avg_pool_3x3")
    odd = _genotype_run(client, exp_id, "odd", other, {"final_val_acc": 0.0})
    comparison = analyse(load_selection(uri, run_ids=[source, twin, odd]))
    page = write_report(comparison, tmp_path / "different").read_text()
    assert "All compared runs share one genotype" not in page
    assert [d.other.run_id for d in comparison.diffs] == [odd]
    assert all(html.escape(line) in page for line in diff_lines(end.genotype, other))


def test_study_selects_its_trial_runs_not_the_parent(store):
    """A study's parent run (no genotype) only groups trials: --study compares the trials."""
    uri, runs, _ = store
    client = MlflowClient(tracking_uri=uri)
    exp_id = _create_experiment(client, uri, "cmp-study")
    try:
        parent = client.create_run(exp_id, run_name="study-parent", tags={layout.TAG_STUDY: "s1"})
        trials = []
        for k, (_, _, end, _) in enumerate(list(runs.values())[:2]):
            t = client.create_run(
                exp_id,
                run_name=f"trial-{k}",
                tags={
                    layout.TAG_STUDY: "s1",
                    layout.TAG_TRIAL: str(k),
                    "mlflow.parentRunId": parent.info.run_id,
                },
            )
            client.log_text(t.info.run_id, end.genotype.to_json(), layout.FINAL_GENOTYPE_ARTIFACT)
            client.log_metric(t.info.run_id, "final_val_acc", end.val_acc)
            client.set_terminated(t.info.run_id)
            trials.append((t.info.run_id, end.genotype))
        client.set_terminated(parent.info.run_id)
        sel = load_selection(uri, study="s1")
        assert sorted((r.run_id, r.genotype) for r in sel.records) == sorted(trials)
        assert sel.skipped == []
        with pytest.raises(CompareError, match="no runs tagged asolab.study='s2'"):
            load_selection(uri, study="s2")
    finally:
        client.delete_experiment(exp_id)


def test_study_parent_runs_are_not_compared_unless_named(store, scratch_experiment):
    """A study's parent run (made by the study module itself) groups trials and has no genotype."""
    from asolab.study.config import StudyTrackingConfig, load_study
    from asolab.study.report import ensure_parent_run

    uri, runs, failed = store
    client, make = scratch_experiment
    exp_id = make("cmp-parent")
    cfg = load_study(None).replace(
        name="cmp-s", tracking=StudyTrackingConfig(experiment="cmp-parent")
    )
    parent = ensure_parent_run(uri, cfg, "cmp-s", "sqlite:///optuna.db")
    client.set_terminated(parent)
    _, _, end, _ = next(iter(runs.values()))
    trial = _genotype_run(
        client,
        exp_id,
        "trial-0",
        end.genotype,
        tags={layout.TAG_STUDY: "cmp-s", layout.TAG_TRIAL: "0"},
    )

    def seen(sel):
        return {r.run_id for r in sel.records} | {s.run_id for s in sel.skipped}

    everything = load_selection(uri)
    assert trial in seen(everything) and parent not in seen(everything)
    assert [s.run_id for s in everything.skipped] == [failed]
    assert seen(load_selection(uri, experiments=["cmp-parent"])) == {trial}
    assert seen(load_selection(uri, study="cmp-s")) == {trial}
    named = load_selection(uri, run_ids=[parent, trial])
    assert [r.run_id for r in named.records] == [trial] and [s.run_id for s in named.skipped] == [
        parent
    ]


def _terminal_rows(out: str) -> list[dict[str, str]]:
    """The runs table printed by `asolab compare`: from its header line (after the summary
    that leads) up to the blank line."""
    lines = out.splitlines()
    lines = lines[next(k for k, line in enumerate(lines) if line.split()[:1] == ["run_name"]) :]
    table = lines[: lines.index("")]
    header = table[0].split()
    return [dict(zip(header, line.split(), strict=True)) for line in table[1:]]


def test_terminal_table_shows_run_id_and_temperature_settings(store, capsys):
    uri, runs, _ = store
    client = MlflowClient(tracking_uri=uri)
    assert main(["compare", "--tracking-uri", uri]) == 0
    rows = _terminal_rows(capsys.readouterr().out)
    assert len(rows) == len(runs)
    for row in rows:
        [run_id] = [r for r in runs if r.startswith(row["id"])]
        params = client.get_run(run_id).data.params
        assert len(row["id"]) == 8 and row["run_name"] == client.get_run(run_id).info.run_name
        assert row["sched"] == params["temperature.schedule"]
        assert float(row["tau0"]) == pytest.approx(
            float(params["temperature.initial_temperature"]), rel=1e-3
        )
        assert float(row["tau_min"]) == pytest.approx(
            float(params["temperature.min_temperature"]), rel=1e-3
        )
        assert float(row["strength"]) == pytest.approx(float(params["mutation.strength"]), rel=1e-3)
    assert sorted(row["id"] for row in rows) == sorted(r[:8] for r in runs)


def test_ambiguous_run_reference_is_an_error_listing_the_matches():
    twin_a = RunRecord("abc1" + "0" * 28, "alpha", "exp", "FINISHED", {}, {}, {}, BASE)
    twin_b = RunRecord("abc2" + "0" * 28, "beta", "exp", "FINISHED", {}, {}, {}, BASE)
    sel = Selection("sqlite:///nowhere.db", [twin_a, twin_b])
    with pytest.raises(
        CompareError,
        match=(
            r"'abc' is ambiguous: it matches 2 selected runs: "
            r"abc10+ \(alpha, exp\), abc20+ \(beta, exp\)"
        ),
    ):
        sel.record("abc")
    assert (
        sel.record("abc2") is twin_b
        and sel.record("alpha") is twin_a
        and sel.record(twin_b.run_id) is twin_b
    )
    with pytest.raises(CompareError, match="'abd' is not among the selected runs"):
        sel.record("abd")


def test_cli_diff_with_an_ambiguous_run_name_is_one_error_line(store, scratch_experiment, capsys):
    uri, runs, _ = store
    client, make = scratch_experiment
    exp_id = make("cmp-names")
    _, _, end, _ = next(iter(runs.values()))
    same_name = [_genotype_run(client, exp_id, "same-name", end.genotype) for _ in range(2)]
    assert (
        main(
            [
                "compare",
                "--tracking-uri",
                uri,
                "--experiment",
                "cmp-names",
                "--diff",
                "same-name",
                same_name[0],
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "asolab: error: run 'same-name' is ambiguous: it matches 2 selected runs"
    )
    assert all(run_id in err[0] for run_id in same_name)
    assert captured.out == ""  # resolved before anything is printed


def test_warm_up_is_part_of_the_budget_and_the_ranking_table_reads_tau_with_its_p():
    """A run with a warm-up did not train like one without: the table carries the warm-up
    (0 for runs recorded before it existed) and the report's budget check names it; the
    report shows each Kendall tau with its p-value, two decimals."""
    from asolab.compare.analysis import ranking_table
    from asolab.compare.report import budget_differences, ranking_display

    common = {"search.cycles": "3", "search.w_epochs": "2", "search.final_epochs": "0"}
    older = RunRecord("a" * 32, "older", "exp", "FINISHED", common, {}, {}, BASE)
    ranked = {f"ranking_kendall_tau{s}": 0.5 for s in ("", "_random", "_all")}
    ranked |= {f"ranking_spearman_rho{s}": 0.6 for s in ("", "_random", "_all")}
    ranked |= {"ranking_kendall_p": 0.1234, "ranking_genotypes": 16.0}
    warm = RunRecord(
        "b" * 32,
        "warm",
        "exp",
        "FINISHED",
        {**common, "search.warmup_epochs": "12"},
        {},
        ranked,
        BASE,
    )
    table = Selection("sqlite:///unused.db", [older, warm]).table()
    assert table["warmup_epochs"].tolist() == [0, 12]
    assert budget_differences(table) == {"warmup_epochs": [0, 12]}

    shown = ranking_display(ranking_table([older, warm]))
    assert shown["run"].tolist() == ["warm"]
    row = shown.iloc[0]
    assert row["genotypes"] == "16"
    assert row["from alphas: tau (p)"] == "+0.50 (0.12)"
    assert row["random: tau (p)"] == "+0.50"  # a run ranked before p-values were logged
    assert row["all: rho"] == "+0.60"
    assert row["proxy"] == "size not recorded"  # ranked before the proxy's size was logged
    assert "proxy seed vs seed: tau (p)" not in shown  # nobody measured the proxy
    assert "alphas lead, stand-alone" not in shown  # ... nor the alphas' lead


def test_terminal_compare_warns_of_different_budgets_as_the_report_does(
    store, scratch_experiment, tmp_path, capsys
):
    """A 15-final-epoch run ranked "best" against 0-final-epoch trials: the terminal says
    the budgets differ, with the same sentence as the HTML report."""
    uri, _, _ = store
    client, make = scratch_experiment
    exp_id = make("cmp-budget")
    other = _g(
        BASE.canonical.replace("sep_conv_3x3(0) skip_connect(1)", "skip_connect(0) skip_connect(1)")
    )
    runs = (("long", "15", 0.9, BASE), ("short-a", "0", 0.5, other), ("short-b", "0", 0.6, other))
    for name, final, acc, genotype in runs:
        run_id = _genotype_run(client, exp_id, name, genotype, metrics={"final_val_acc": acc})
        client.log_param(run_id, "search.final_epochs", final)
    report = tmp_path / "report"
    argv = ["compare", "--tracking-uri", uri, "--experiment", "cmp-budget"]
    assert main([*argv, "--report", str(report), "--all"]) == 0
    out = capsys.readouterr().out
    assert "warning: different budgets." in out and "(final_epochs 0, 15)" in out, out
    assert "differences from the best run long (cmp-budget) (by val acc across different" in out
    page = html.unescape((report / "index.html").read_text())
    sentence = out.split("warning: different budgets. ", 1)[1].splitlines()[0]
    assert sentence in page

    assert main(["compare", "--tracking-uri", uri, "--experiment", "cmp-alpha"]) == 0
    assert "different budgets" not in capsys.readouterr().out  # one budget: no warning


def test_compare_names_the_other_settings_that_differ_as_the_report_does(
    store, scratch_experiment, tmp_path, capsys
):
    """Runs made with another setting besides the table's knobs (data.drop_last, a
    learning rate; one run from before data.drop_last existed): the terminal and the HTML
    report name each setting and its values, never the thread count or where a run was
    recorded, and runs made alike get no note."""
    uri, _, _ = store
    client, make = scratch_experiment
    exp_id = make("cmp-settings")
    runs = (
        ("a", {"data.drop_last": "False", "search.weight_lr": "0.05", "threads": "2"}),
        ("b", {"data.drop_last": "True", "search.weight_lr": "0.05", "threads": "1"}),
        ("c", {"search.weight_lr": "0.025", "tracking.experiment": "elsewhere"}),
        ("d", {"data.drop_last": "False", "search.weight_lr": "0.05", "threads": "1"}),
    )
    ids = {}
    for name, params in runs:
        ids[name] = _genotype_run(client, exp_id, name, BASE, metrics={"final_val_acc": 0.5})
        for key, value in params.items():
            client.log_param(ids[name], key, value)
    report = tmp_path / "report"
    argv = ["compare", "--tracking-uri", uri, "--experiment", "cmp-settings"]
    assert main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("note: other settings differ.")]
    assert line.endswith(
        "the compared runs differ in data.drop_last (unset) | False | True; "
        "search.weight_lr 0.025 | 0.05."
    ), line
    page = html.unescape((report / "index.html").read_text())
    assert "<b>Other settings differ.</b> " + line.split("differ. ", 1)[1] in page
    alike = ["compare", "--tracking-uri", uri, "--run", ids["a"], "--run", ids["d"]]
    assert main(alike) == 0  # the thread count apart, made alike
    assert "2 runs compared" in (out := capsys.readouterr().out) and "other settings" not in out


def test_compare_names_the_runs_whose_splits_lack_a_class_or_hold_copies(
    store, scratch_experiment, tmp_path, capsys, caplog
):
    """Runs that recorded a data note of what their figures measure (a validation split
    without a class, test images copied from training) are named under the table and in
    the report, by note; a layout note is how images were read, and is left out."""
    uri, _, _ = store
    client, make = scratch_experiment
    exp_id = make("cmp-data-notes")
    notes = {
        "a": {"missing_validation": "the validation split ... (rare)", "layout": "read as"},
        "b": {"missing_validation": "the validation split ... (rare, rarer)"},
        "c": {"copies_test": "2 of the 12 test images ..."},
        "d": {},
    }
    for name, tags in notes.items():
        run_id = _genotype_run(client, exp_id, name, BASE, metrics={"final_val_acc": 0.5})
        for key, value in tags.items():
            client.set_tag(run_id, f"asolab.data_note.{key}", value)
    report = tmp_path / "report"
    argv = ["compare", "--tracking-uri", uri, "--experiment", "cmp-data-notes"]
    assert main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("warning: data notes.")]
    assert line == (
        "warning: data notes. The validation split (alpha-training, selection) lacks classes: "
        "a, b; test images are copies of training images: c (each run's description says "
        "which and how many)."
    ), line
    page = html.unescape((report / "index.html").read_text())
    assert "<b>Data notes.</b> " + line.split("notes. ", 1)[1] in page
    # the Python API's table says the same
    with caplog.at_level("WARNING", logger="asolab.api"):
        table = asolab.runs("cmp-data-notes", tracking_uri=uri)
    assert len(table) == 4
    assert [r.getMessage() for r in caplog.records] == [line.split("notes. ", 1)[1]]


def test_the_settings_note_names_eight_settings_and_four_values_and_counts_the_rest():
    from asolab.compare.select import RunRecord
    from asolab.compare.settings import settings_warning

    def record(value: str) -> RunRecord:
        params = {f"search.knob_{i:02d}": value for i in range(10)}
        return RunRecord("id" + value, value, "e", "FINISHED", params, {}, {}, BASE)

    sentence = settings_warning([record("1"), record("2")])
    assert sentence.count("search.knob_") == 8 and sentence.endswith("knob_07 1 | 2; and 2 more.")
    assert settings_warning([record("1"), record("1")]) == ""
    # a study's tuned setting: its values in numeric order, the first three of many
    trials = [record(v) for v in ("0.1", "0.05", "10", "0.2", "0.3")]
    assert "knob_00 0.05 | 0.1 | 0.2 | ... (5 values);" in settings_warning(trials)


def test_runs_on_different_data_sets_are_compared_apart(
    store, scratch_experiment, capsys, tmp_path
):
    """Folder, .npz and digits runs: a table, a best run and a Pareto front per data set,
    and one line saying so; without --all the output leads with the summary and stays short."""
    uri, _, _ = store
    client, make = scratch_experiment
    exp_id = make("cmp-data")
    other = _g(
        BASE.canonical.replace("sep_conv_3x3(0) skip_connect(1)", "skip_connect(0) skip_connect(1)")
    )
    runs = (
        ("d-big", "digits", {}, 0.9, 900, BASE),
        ("d-small", "digits", {}, 0.8, 300, other),
        ("d-worse", "digits", {}, 0.7, 600, other),
        ("f-one", "folder", {"data.data_dir": "/data/shapes"}, 0.5, 500, BASE),
        ("a-one", "arrays", {"data.path": "/data/my_set.npz"}, 0.95, 400, other),
    )
    for name, data, params, acc, size, genotype in runs:
        metrics = {"final_val_acc": acc, "final_params": size, "test_acc": acc - 0.01}
        run_id = _genotype_run(
            client, exp_id, name, genotype, metrics, tags={"asolab.dataset": data}
        )
        for key, value in {"data.name": data, **params}.items():
            client.log_param(run_id, key, value)
    report = tmp_path / "report"
    argv = ["compare", "--tracking-uri", uri, "--experiment", "cmp-data"]
    assert main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    page = html.unescape((report / "index.html").read_text())
    assert "3 data sets: each has its own panel and front." in page
    assert "On the runs' front: digits: d-small, d-big; folder-shapes: f-one; my_set: a-one" in page
    assert "3 data sets (digits 3, folder-shapes 1, my_set 1): each is compared apart" in out
    digits = out.split("== data set digits: 3 run(s) ==")[1].split("== data set")[0]
    assert "best run: d-big (cmp-data): val_acc 0.9000, test_acc 0.8900, 900 params" in digits
    assert "Pareto front (val_acc against params): d-small (0.8000, 300), d-big" in digits
    assert "d-worse" in digits and "a-one" not in digits  # the .npz run is not digits' best
    npz = out.split("== data set my_set: 1 run(s) ==")[1]
    assert "best run: a-one" in npz and "d-big" not in npz.split("(--all")[0]
    assert "distinct genotypes:" not in out and "operation frequencies" not in out
    assert main(["compare", "--tracking-uri", uri, "--experiment", "cmp-data", "--all"]) == 0
    every = capsys.readouterr().out
    assert every.count("operation frequencies") == 3 and every.count("distinct genotypes:") == 3


def test_compare_into_a_pipe_whose_reader_closed_ends_without_a_traceback(
    store, monkeypatch, capsys
):
    """``asolab compare | head``: once the reader is gone, the command stops quietly with
    status 141, as a tool the closed pipe killed."""
    import os
    import sys

    uri, _, _ = store
    read, write = os.pipe()
    os.close(read)
    # line-buffered: each line is written at once, as a long output meets the pipe midway
    with open(write, "w", buffering=1) as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert main(["compare", "--tracking-uri", uri]) == 141
    assert capsys.readouterr().err == ""

"""Smoke tests of the benchmarks in bench/: each runs at a tiny size and prints
its table with the headline last. No timing is asserted (speed lives in bench/)."""

from __future__ import annotations

import sys
import time

import processes
import pytest
from bench_scripts import BENCH, bench_module


def _run(capsys, name: str, argv: list[str]) -> list[str]:
    assert bench_module(name).main(argv) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_search_throughput(capsys):
    lines = _run(capsys, "search_throughput", ["--smoke"])
    assert lines[1].split()[:2] == ["step", "sampled"]
    assert lines[2].startswith("W-training") and lines[3].startswith("alpha-training")
    assert lines[-1].startswith("path sampling speed-up over the continuous relaxation (8 ops)")


def test_data_pipeline(capsys):
    lines = _run(capsys, "data_pipeline", ["--smoke", "--datasets", "digits"])
    assert lines[1].startswith("data set") and lines[2].startswith("digits")
    assert lines[-1].startswith("data pipeline share of W-training time")


def test_checkpoint_io(capsys):
    lines = _run(capsys, "checkpoint_io", ["--smoke"])
    assert lines[2].split()[:3] == ["size", "tensors", "MB"] and lines[3].startswith("smallest")
    assert lines[-1].startswith("packed checkpoint over torch.save at the smallest size: save ")


def test_memory_reads_rss_every_cycle(capsys):
    lines = _run(capsys, "memory", ["--smoke", "--skip-default"])
    cycles = [line for line in lines if "-cycle run, no growth" in line and " cycle " in line]
    assert len(cycles) == 3
    assert any("peak RSS" in line for line in lines)
    assert lines[-1].startswith("RSS growth from cycle 2 to cycle 3")


def test_speed_paths(capsys):
    lines = _run(capsys, "speed_paths", ["--smoke"])
    names = [line.split("  ")[0].strip() for line in lines[2:6]]
    assert names == ["eager", "channels-last", "compile", "compile + channels-last"]
    assert lines[-1].startswith("best over eager: inference")


def test_search_quality_records_its_arms_in_mlflow(capsys, tmp_path):
    """The driver makes a source ASO-SE run and its control arms as tracked runs; a second
    invocation trains nothing and prints the same arm view from the store."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "--smoke",
        "--datasets",
        "digits",
        "--seeds",
        "0",
        "--threads",
        "1",
        "--tracking-uri",
        uri,
    ]
    lines = _run(capsys, "search_quality", args)
    trained = [line.split() for line in lines if line.startswith("  seed 0 ")]
    assert {t[2] for t in trained} == {"aso-se", "scratch", "random", "initial"}
    assert (
        lines[-1].startswith("digits: ASO-SE test accuracy minus each arm")
        and "vs random" in lines[-1]
    )
    lines = _run(capsys, "search_quality", args + ["--report"])
    assert not any(line.startswith("  seed 0 ") for line in lines)  # --report trains nothing
    assert "per seed: test % (val %), final parameters, minutes of training" in lines
    assert lines[-1].startswith("digits: ASO-SE test accuracy minus each arm")
    with pytest.raises(SystemExit):
        bench_module("search_quality").main(args + ["--arms", "initial,bogus"])


def test_search_quality_arm_view_names_the_arm_ahead_once_size_is_taken_out():
    """The line the drivers print under the arm table (compare/sizefit.ahead_text), with an
    interval above zero, one below and one across it: the smoke runs' figures are too
    noisy to say which of these they reach."""
    import pandas as pd

    from asolab.compare.sizefit import ahead_text, size_columns

    diff, low, high = size_columns("params")[:3]
    summary = pd.DataFrame(
        {
            "metric": ["test_acc"] * 3,
            "arm": ["random", "scratch", "initial"],
            diff: [0.05, -0.04, 0.0],
            low: [0.01, -0.07, -0.02],
            high: [0.09, -0.01, 0.02],
        }
    )
    line = ahead_text(summary)
    assert "ASO-SE ahead of random by +5.00" in line and "scratch ahead of ASO-SE by +4.00" in line
    assert "initial" not in line


def test_study_signal_smoke(capsys, tmp_path):
    out = tmp_path / "signal.json"
    args = ["--smoke", "--settings", "cold,hot", "--seeds", "0,1", "--json", str(out)]
    lines = _run(capsys, "study_signal", args)
    import json

    records = json.loads(out.read_text())
    assert sorted((r["setting"], r["seed"]) for r in records) == [
        ("cold", 0),
        ("cold", 1),
        ("hot", 0),
        ("hot", 1),
    ]
    assert all(0 <= r["val_acc"] <= 1 for r in records)
    assert any(line.startswith("one-way ANOVA over settings: F = ") for line in lines)
    # again with the same file: every run is recorded, nothing trains
    lines = _run(capsys, "study_signal", args)
    assert not [line for line in lines if " seed " in line and line.rstrip().endswith(" s")]
    assert len(json.loads(out.read_text())) == 4


def test_study_signal_analysis():
    a = bench_module("study_signal").analyse(
        [
            {"setting": k, "val_acc": v}
            for k, vs in (("a", (0.90, 0.92)), ("b", (0.80, 0.82)))
            for v in vs
        ]
    )
    assert a["seed_std"] == pytest.approx(100 * 0.01414, rel=1e-3)
    assert a["std_of_knob_means"] == pytest.approx(100 * 0.0707, rel=1e-3)
    assert a["anova_f"] == pytest.approx(50.0) and a["anova_p"] < 0.05


def test_setting_effect_smoke(capsys, tmp_path):
    """bench/setting_effect.py --smoke: both arms per seed recorded, the paired report,
    and a second call with the same file trains nothing."""
    import json

    out = tmp_path / "effect.json"
    args = ["--smoke", "--set", "data.drop_last=true", "--seeds", "0,1", "--json", str(out)]
    lines = _run(capsys, "setting_effect", args)
    records = json.loads(out.read_text())
    assert sorted((r["seed"], tuple(r["overrides"])) for r in records) == [
        (0, ()),
        (0, ("data.drop_last=true",)),
        (1, ()),
        (1, ("data.drop_last=true",)),
    ]
    assert lines[-5].split()[:2] == ["val_acc", "2"]
    assert lines[-2].split()[:2] == ["alpha_entropy", "2"]  # how far the alphas moved
    assert all(0 < r["alpha_entropy"] <= 1 for r in records)
    assert lines[-1].startswith("data.drop_last=true: the 95% interval holds zero for ")
    again = _run(capsys, "setting_effect", ["--smoke", "--json", str(out), "--report"])
    assert again == lines[-6:] and len(json.loads(out.read_text())) == 4


def test_setting_effect_analysis():
    """Paired differences per seed: a constant shift has a zero-width interval at it."""
    on = ["x=1"]
    records = [
        {"seed": s, "setting": on, "overrides": o, "val_acc": v, "test_acc": v, "seconds": 1.0}
        for s, base in enumerate((0.90, 0.80, 0.85))
        for o, v in (([], base), (on, base + 0.01))
    ]
    a = bench_module("setting_effect").analyse(records, on)
    assert a["val_acc"]["seeds"] == 3 and a["val_acc"]["diff"] == pytest.approx(1.0)
    assert a["val_acc"]["ci_low"] == pytest.approx(1.0) == pytest.approx(a["val_acc"]["ci_high"])
    assert a["val_acc"]["off_mean"] == pytest.approx(85.0) and a["seconds"]["diff"] == 0


def test_tracking_overhead(capsys):
    lines = _run(capsys, "tracking_overhead", ["--tiny", "--repeats", "2"])
    assert (
        lines[-1].startswith("tracking overhead:") and "median of 2 interleaved pairs" in lines[-1]
    )
    pairs = [line.split() for line in lines if line[:1].isdigit()]
    assert [p[0] for p in pairs] == ["0", "1"] and all(
        float(p[1]) > 0 and float(p[2]) > 0 for p in pairs
    )


def test_search_throughput_neuroexapt_shaped_cycle(capsys):
    lines = _run(capsys, "search_throughput", ["--cycle", "--smoke", "--threads", "1"])
    assert lines[1].split()[:3] == ["shape", "layout", "W-step"]
    rows = [line.split() for line in lines[2:4]]
    assert [r[2] for r in rows] == ["contiguous", "channels-last"]
    assert all(r[:2] == ["L5", "3x8x8"] for r in rows)
    assert all(float(v) > 0 for r in rows for v in r[3:])


def test_search_throughput_compares_with_neuroexapt_per_image():
    """NeuroExapt's W-step figure is one batch of 64 and its W-retraining figure 256 images;
    asolab's are per 256 images: the same time per image reads 1.00x, a 4x slower one 0.25x."""
    bench = bench_module("search_throughput")
    (w_s, w_n), (r_s, r_n) = bench.NEUROEXAPT["W-step"], bench.NEUROEXAPT["W-retrain"]
    assert (w_n, r_n) == (64, 256)
    line = bench.vs_neuroexapt({"W-step": w_s * 256 / w_n, "W-retrain": 4 * r_s * 256 / r_n})
    assert "W-step 96.4 vs 96.4 ms/image (6.17 s per 64): 1.00x" in line
    assert "W-retrain 75.0 vs 18.8 ms/image (4.8 s per 256): 0.25x" in line


def test_final_speed(capsys):
    lines = _run(capsys, "final_speed", ["--smoke", "--threads", "1"])
    assert [line.split()[0] for line in lines[2:5]] == ["eager", "channels-last", "bf16"]
    assert (
        lines[-1].startswith("final training speed-up over eager:")
        and "GFLOP/s fp32 peak" in lines[-1]
    )


def test_concurrency(capsys):
    lines = _run(capsys, "concurrency", ["--smoke"])
    assert lines[-1].startswith("auto threads, slowdown against alone: 2 at once")
    rows = [line.split() for line in lines if line.startswith("auto ")][:2]  # the table's rows
    assert [r[1] for r in rows] == ["1", "2"] and rows[1][2].count("+") == 1


@pytest.mark.parametrize(
    "name",
    [
        "concurrency",
        "final_speed",
        "search_throughput",
        "data_pipeline",
        "memory",
        "speed_paths",
        "search_quality",
        "tracking_overhead",
        "study_signal",
        "exit_cost",
        "split_coverage",
    ],
)
def test_every_benchmark_documents_itself(name):
    assert bench_module(name).__doc__.strip()


def test_split_coverage_counts_the_splits_lacking_a_class(capsys):
    """bench/split_coverage.py: on digits cut to a long tail, random carves leave classes
    out of the validation split and the search subset; carves per class leave the search
    subset whole, and the validation split short only of the class too rare to reach it."""
    lines = _run(capsys, "split_coverage", ["--seeds", "3"])
    rows = {(r[0], r[1]): (r[2], r[3]) for r in (line.split() for line in lines[3:])}
    assert len(rows) == 6 and rows[("random", "validation")][0] != "0/3"
    assert rows[("stratified", "search")] == rows[("stratified", "test")] == ("0/3", "0")
    # a class of two images: one in the test split, one left in training, none here
    assert rows[("stratified", "validation")] == ("3/3", "3")


def test_exit_cost(capsys):
    """bench/exit_cost.py --smoke: both exits of a bad command, with the same status (2)."""
    lines = _run(capsys, "exit_cost", ["--smoke"])
    assert lines[0].startswith("a bad command, exit status 2;")
    assert [line.split()[0] for line in lines[3:5]] == ["console", "full"]
    assert lines[-1].startswith("the console script's exit saves") and "(smoke run)" in lines[-1]


def test_growth_digits(capsys):
    lines = _run(capsys, "growth_digits", ["--smoke"])
    assert lines[0].split()[:3] == ["cycle", "kind", "where"]
    kinds = [line.split()[1] for line in lines[1:-1]]
    assert kinds and set(kinds) <= {"widen", "deepen", "branch"}
    assert lines[-1].startswith("supernet params")


def test_cudnn_plans(capsys):
    """bench/cudnn_plans.py --smoke: a row per scope; "all" times every plan, autotuning
    off none, and full-batch some, with every full training batch on a timed plan."""
    lines = _run(capsys, "cudnn_plans", ["--smoke"])
    rows = {r.split()[0]: [int(v) for v in r.split()[1:]] for r in lines[1:4]}
    assert set(rows) == {"all", "full-batch", "off"}
    plans = rows["all"][0]
    assert rows["all"][1] == plans and rows["off"][1] == 0 < rows["full-batch"][1] < plans
    assert rows["full-batch"][3] == 0 < rows["full-batch"][2]  # no training call on heuristics
    assert lines[-1].startswith("full-batch times") and lines[-1].endswith("(smoke run)")
    # 80 training images in batches of 32 end in one of 16; the test split, evaluated in
    # batches of 32 too, ends in one of 7, which evaluation pads to 32 on CUDA
    sizes = lambda line: [int(n.split(":")[0]) for n in line.split("size ")[1].split(", ")]  # noqa: E731
    assert sizes(next(r for r in lines if r.startswith("off: plans per"))) == [16, 32]
    # data.drop_last: training in whole batches only, so fewer plans
    lines = _run(capsys, "cudnn_plans", ["--smoke", "--scopes", "off", "--set=data.drop_last=true"])
    whole = int(lines[1].split()[1])
    assert sizes(lines[-2]) == [32] and whole < rows["off"][0]
    assert lines[-1] == f"off: {whole} plans (smoke run) with data.drop_last=true"


@pytest.mark.slow
def test_gpu_check_smoke_on_the_cpu(capsys, tmp_path):
    """bench/gpu_check.py --smoke --device cpu: every section runs and the report is written."""
    import json

    fashion = tmp_path / "fashion-mnist"  # the cut copy a bare GPU machine is given
    bench_module("gpu_prepare").fashion_subset(fashion, 300, 200)  # CPU-sized evaluation
    argv = ["--smoke", "--device", "cpu", "--out", str(tmp_path), "--fashion-dir", str(fashion)]
    lines = _run(capsys, "gpu_check", argv)
    report = json.loads((tmp_path / "report.json").read_text())
    sections = report["sections"]
    assert {n: s["status"] for n, s in sections.items()} == {
        **dict.fromkeys(
            ["device_tests", "digits", "digits_autotune_on", "digits_profile", "fashion"]
            + ["cifar_shape", "first_sight"]
            + ["growth", "study", "variants", "steps", "op_costs", "cond_graph", "graphed"]
            + ["workers", "switched_step", "switched_edges", "growth_autotune_off"],
            "ok",
        ),
        # gpu_check's CUDA_ONLY: runs that would repeat another off CUDA or ask a GPU's
        # question
        **dict.fromkeys(
            ["digits_graphs_on", "cifar_shape_graphs_on", "cifar_shape_sampled_graphs"]
            + ["cifar_shape_autotune_off", "cifar_shape_deterministic", "cifar_shape_limit3"]
            + [
                "digits_sampled_graphs",
                "digits_autotune_all",
                "digits_autotune_limit3",
                "digits_contiguous",
                "digits_drop_last",
            ]
            # and torch.compile's minutes would be CI's (tests/test_step_cost.py compiles)
            + ["compile_default", "compile_reduce_overhead", "graphs_sequence"],
            "skipped",
        ),
    }
    steps = sections["steps"]
    assert (
        steps["w_step"]["batch_2"]["images_per_s"] > 0
        and steps["retrain"]["off"]["ms_per_step"] > 0
    )
    assert sections["workers"]["1_workers"]["images_per_s"] > 0
    # every op a W-step launches most, in both layouts (the matrix multiply in one), and
    # the pointwise convolution's matrix multiply computes what the convolution does
    ops = sections["op_costs"]
    assert len([k for k in ops if k.endswith(" contiguous")]) == 10
    assert ops["conv_1x1_as_matmul channels_last"]["forward_backward_us"] > 0
    assert "conv_1x1_as_matmul contiguous" not in ops and ops["floor_us"] > 0
    assert ops["matmul_max_diff"] < 1e-5
    # the torch.cond cells compute the eager path's loss and gradients (off CUDA the
    # same compiled function, without graphs), and the second cell reuses the first's trace
    cond = sections["cond_graph"]
    assert cond["max_loss_diff"] == 0 and cond["max_grad_diff_rel"] == 0, cond
    assert (cond["cells"], cond["edges_per_cell"], cond["compiles"]) == (2, 2, 1), cond
    assert cond["cond_graph"]["ms_per_step"] > 0
    assert cond["cudagraph_skips"] > 0  # no CUDA graph captured off CUDA, and it says so
    # compiled again with its weights marked static: traced once more, the same numbers
    assert cond["cond_graph_static"]["compiles"] == 1 and cond["speedup_static"] > 0, cond
    # the W-step with every edge switched on the device moves what the product's step moves:
    # the same loss, weights and momentum, running statistics to rounding; one trace
    switched = sections["switched_step"]
    assert switched["loss_diff"] < 1e-6 and switched["weight_diff_rel"] < 1e-6, switched
    assert switched["momentum_diff_rel"] < 1e-6 and switched["running_stats_diff_rel"] < 1e-5
    assert (switched["edges"], switched["compiles"]) == (2, 1) and switched["speedup"] > 0
    # each edge compiled alone, channels-last (a branch of zeros must take the op's
    # strides): the same step, both edges (one shape) from one trace; the momentum (one
    # step's gradients) to the rounding of channels-last kernels (2e-5 seen)
    per_edge = sections["switched_edges"]
    assert per_edge["loss_diff"] < 1e-6 and per_edge["weight_diff_rel"] < 1e-6, per_edge
    assert per_edge["momentum_diff_rel"] < 1e-4 and per_edge["running_stats_diff_rel"] < 1e-5
    assert (per_edge["edges"], per_edge["compiles"]) == (2, 1) and per_edge["speedup"] > 0
    # on the CPU speed.cuda_graphs changes nothing: the same eager steps, the same numbers
    graphed = sections["graphed"]
    assert graphed["on"]["captures"] == 0 and graphed["on"]["ms_per_step"] > 0, graphed
    assert graphed["max_loss_diff"] == 0 and graphed["max_weight_diff_rel"] == 0
    assert sections["cifar_shape"]["images_per_sec"]["w_train"] > 0
    assert "passed" in sections["device_tests"]["summary"]
    digits = sections["digits"]
    assert set(digits["images_per_sec"]) >= {"w_train", "alpha", "retrain"}
    assert set(digits["loop_seconds"]) == set(digits["images_per_sec"])
    assert 0 < digits["other_seconds"] < digits["seconds"]
    # each convolution kind's first sight of a shape, per layout and cuDNN timing
    sight = sections["first_sight"]
    assert len([k for k in sight if k != "status" and k != "seconds_total"]) == 16
    assert sight["dw_conv_5x5 contiguous heuristic"]["first_ms"] > 0
    # the default run's functions by own time, cProfile's: convolutions among them
    profiled = sections["digits_profile"]["top_own_time"]
    assert len(profiled) == 30 and any("conv2d" in row[0] for row in profiled)
    for growth in (sections["growth"], sections["growth_autotune_off"]):
        # the network trains before its first growth: the process's first sight apart
        assert growth["before"]["first_step_s"] > 0 < growth["before"]["steady_step_s"]
        for kind in ("widen", "deepen", "branch"):
            assert growth[kind]["max_abs_delta_logits"] < 1e-4 and growth[kind]["on_device"]
            assert growth[kind]["first_step_s"] > 0 and growth[kind]["steady_step_s"] > 0
    assert sections["study"]["trial_runs"] == 2
    assert set(sections["variants"]) >= {"eager", "bf16", "channels_last"}
    assert all(sections["variants"][v]["images_per_sec"] > 0 for v in ("eager", "bf16"))
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# asolab GPU check: cpu")
    # the digits runs side by side, one row each (the scoped ones need CUDA)
    side = md.split("## digits runs side by side")[1].split("## ")[0]
    assert [r.split()[0] for r in side.splitlines() if r.startswith("digits")] == [
        "digits",
        "digits_autotune_on",
    ]
    assert "conv_1x1_as_matmul channels_last" in md.split("## op_costs")[1].split("## ")[0]
    assert lines[-1].startswith("report: ")
    import torch

    # the CUDA-only sequence of runs with graphs in one process: each run's captures (none
    # off CUDA) and the device's random numbers after it
    check = bench_module("gpu_check")
    tiny = check.sizes(True)["digits"]
    sequence = check.graphs_sequence_section(torch.device("cpu"), {"a": tiny, "b": tiny}, 1)
    assert sequence["b"]["cuda_graphs"] == "off" and sequence["b"]["seconds"] > 0, sequence
    assert [r["random_numbers"] for r in sequence.values()] == ["ok", "ok"]
    # the CUDA-only limit section's wrapper: the limit holds inside and is put back
    limit = torch.backends.cudnn.benchmark_limit
    inside = check.with_benchmark_limit(3, lambda: {"limit": torch.backends.cudnn.benchmark_limit})
    assert inside == {"limit": 3, "cudnn_benchmark_limit": 3} != {"limit": limit}
    assert torch.backends.cudnn.benchmark_limit == limit


def test_gpu_check_stops_a_fresh_section_when_the_budget_runs_out():
    """A section in a fresh process (on a GPU) past what the budget has left is stopped,
    with its children, and recorded as such: the call still returns what it finished."""
    import time

    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="stopped after 1 s, what the budget had left"):
        bench_module("gpu_check").fresh_section("digits", ["--smoke", "--device", "cpu"], 1.0)
    assert time.perf_counter() - start < 10


def test_gpu_check_busy_after_the_first_epoch_leaves_out_its_first_sight():
    """GPU busy during W-training: the mean over every epoch's samples, and the steady
    mean over the epochs after the first, whose first sight of each shape a short run's
    mean is mostly of (nvidia-smi's samples as a run on an H100 would give them)."""
    sampler = bench_module("gpu_check").GpuSampler("0")
    sampler.available = True  # the samples below stand for nvidia-smi's
    # a first epoch of 10 s at 5% busy, then two of 1.5 s at 60%; samples every 0.5 s
    loops = [(0.0, 10.0), (10.2, 11.7), (11.9, 13.4)]
    busy = [(t / 2, 5.0 if t / 2 <= 10.0 else 60.0, 900.0) for t in range(1, 27)]
    sampler.samples = busy
    windows = [(a - 1.0, b) for a, b in loops]
    figures = sampler.during(windows, loops)
    assert figures["util_mean_pct"] < 20 and figures["util_max_pct"] == 60
    assert figures["util_mean_pct_after_first_epoch"] == 60.0
    assert figures["samples_after_first_epoch"] == 6
    assert figures["util_mean_pct_per_epoch"] == [5.0, 60.0, 60.0]
    # without the loops (an older caller): the mean alone, as before
    assert "util_mean_pct_after_first_epoch" not in sampler.during(windows)


def test_gpu_check_skips_the_torch_cond_graphs_where_torch_cannot_capture_them(monkeypatch):
    """On CUDA with a torch before 2.12 (the lent H100s' 2.11) the sections whose question is
    a CUDA graph of torch.cond branches are skipped, saying why, not failed after minutes;
    off CUDA they run (without graphs), and the other reasons keep their order."""
    import torch

    from asolab.space import switched

    check = bench_module("gpu_check")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(switched, "CONDITIONAL_NODES", False)
    for name in check.CONDITIONAL:
        assert "conditional nodes: torch 2.12" in check.why_skipped(name, cuda, set(), 1e9)
        assert check.why_skipped(name, cuda, {name}, 1e9) == "--skip"
    assert check.why_skipped("switched_edges", cpu, set(), None) is None
    assert check.why_skipped("cifar_shape_sampled_graphs", cpu, set(), None) == "needs CUDA"
    assert check.why_skipped("digits", cuda, set(), 1e9) is None
    assert check.why_skipped("digits", cuda, set(), 10.0) == "10 s left"
    monkeypatch.setattr(switched, "CONDITIONAL_NODES", True)
    assert check.why_skipped("switched_edges", cuda, set(), 1e9) is None
    # every section has an estimate (a fresh process skips all the others by that list)
    args = check.parse_args(["--smoke", "--device", "cpu"])
    table = check.section_table(cpu, args, check.sizes(True), BENCH / "unused")
    assert set(table) == set(check.ESTIMATE_S)
    assert check.FRESH | check.CUDA_ONLY | check.CONDITIONAL <= set(table)


def test_gpu_prepare_cuts_fashion_mnist_and_names_what_to_carry(tmp_path):
    """The cut copy holds the first N training images byte for byte and the whole test
    split, in the format the loader reads; the wheels the image has are not carried."""
    import gzip

    import numpy as np

    from asolab.data.builtin import FASHION_MNIST_DIR, _read_idx

    prep = bench_module("gpu_prepare")
    prep.fashion_subset(tmp_path, 123)
    full = _read_idx(FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz")
    cut = _read_idx(tmp_path / "train-images-idx3-ubyte.gz")
    assert cut.shape == (123, 28, 28) and np.array_equal(cut, full[:123])
    assert _read_idx(tmp_path / "train-labels-idx1-ubyte.gz").shape == (123,)
    assert _read_idx(tmp_path / "t10k-images-idx3-ubyte.gz").shape == (10000, 28, 28)
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz") as f:
        assert len(f.read()) == 16 + 123 * 28 * 28  # no bytes past the new count
    prep.fashion_subset(tmp_path / "cut", 5, 7)  # the test split cut too (the CPU's smoke)
    assert _read_idx(tmp_path / "cut" / "t10k-labels-idx1-ubyte.gz").shape == (7,)
    assert prep.normalise("Flask_Cors-6.0.5-py3-none-any.whl") == "flask-cors"
    assert prep.normalise("mlflow_skinny-3.17.2-py3-none-any.whl") == "mlflow-skinny"
    assert {"torch", "numpy", "pandas"} <= prep.DEVICE_HAS and "mlflow" not in prep.DEVICE_HAS
    cmd = prep.device_command(BENCH.parent / ".gpu")
    assert "--no-index" in cmd and ".gpu/whl/*.whl" in cmd and "--out $OUT" in cmd
    assert "--fashion-dir .gpu/fashion-mnist" in cmd and len(cmd) < 2000  # the tool's limit
    assert f"--skip {','.join(prep.MEASURED)} " in cmd
    assert set(prep.MEASURED) <= set(bench_module("gpu_check").ESTIMATE_S)  # its own names
    # what is still open runs: the layouts' and graphs' digits runs, first sight, growth, and
    # the device tests (the GPU busy meter, memory on the GPU, deterministic runs)
    open_questions = {"digits_contiguous", "digits_graphs_on", "digits_drop_last", "device_tests"}
    assert not {*open_questions, "first_sight", "growth"} & set(prep.MEASURED)
    # fresh processes import compiled modules, as after a user's pip install
    assert cmd.index("unset PYTHONDONTWRITEBYTECODE") < cmd.index("gpu_check.py")


_BENCH_AT = """
import runpy, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import search_quality  # mlflow, torch and asolab imported before the common start
sync, index, script, argv = Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
(sync / f"ready-{index}").touch()
while not (sync / "go").exists():
    time.sleep(0.001)
sys.argv = [script, *argv]
runpy.run_path(script, run_name="__main__")
"""


def test_drivers_started_side_by_side_on_a_new_store_all_open_it(tmp_path):
    """The documented way to use both cores is two drivers at once on one new store; MLflow
    builds a new SQLite store's tables with no lock between processes, so without the
    store's lock one of them failed with "Online migration expected to match one row".
    The drivers are forked from the preloaded server of tests/processes.py: four processes
    racing on one SQLite file, without four interpreters importing torch and MLflow."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--smoke", "--datasets", "digits", "--seeds", "0", "--report", "--tracking-uri", uri]
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [
        processes.Popen(
            [sys.executable, "-c", _BENCH_AT, str(BENCH), str(sync), str(i)]
            + [str(BENCH / f"{name}.py"), *argv],
            stdout=processes.PIPE,
            stderr=processes.STDOUT,
        )
        for i, name in enumerate(("search_quality", "selection_quality") * 2)
    ]
    # all start at once, as soon as every process has imported its libraries
    deadline = time.time() + 180
    while len(list(sync.glob("ready-*"))) < len(procs) and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # one died while importing: its output says why
        time.sleep(0.01)
    (sync / "go").touch()
    outs = [(p.wait(timeout=180), p.communicate()[0].decode()) for p in procs]
    assert [rc for rc, _ in outs] == [0, 0, 0, 0], "\n".join(out[-600:] for _, out in outs)

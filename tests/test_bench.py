"""Smoke tests of the benchmarks in bench/: each runs at a tiny size and prints
its table with the headline last. No timing is asserted (speed lives in bench/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(capsys, name: str, argv: list[str]) -> list[str]:
    assert _module(name).main(argv) == 0
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


def test_search_quality_has_four_arms(capsys, tmp_path):
    import json

    out = tmp_path / "q.json"
    lines = _run(capsys, "search_quality", ["--smoke", "--datasets", "digits", "--seeds", "0", "--json", str(out)])
    assert [line.split()[:2] for line in lines if line.startswith("digits ")] == [
        ["digits", "aso-se"], ["digits", "aso-arch"], ["digits", "random"], ["digits", "initial"]]
    assert lines[-1].startswith("ASO-SE mean test accuracy and margin in points: digits")
    runs = {r["arm"]: r for r in json.loads(out.read_text())}
    assert runs["aso-arch"]["genotype"] == runs["aso-se"]["genotype"]  # the search's result, retrained from scratch
    assert runs["aso-arch"]["weight_epochs"] == runs["aso-se"]["weight_epochs"]

    # Interrupted after two arms: the same command goes on with the other two.
    first = json.loads(out.read_text())
    out.write_text(json.dumps(first[:2]))
    lines = _run(capsys, "search_quality", ["--smoke", "--datasets", "digits", "--seeds", "0", "--json", str(out)])
    assert sum("(recorded earlier)" in line for line in lines) == 2
    again = json.loads(out.read_text())
    # The arms run in this order: the baselines before the diagnostic aso-arch arm.
    assert [r["arm"] for r in again] == ["aso-se", "random", "initial", "aso-arch"] and again[:2] == first[:2]
    assert again[2:] == [{**r, "seconds": again[2 + i]["seconds"]} for i, r in enumerate(first[2:])]  # same figures again

    # --report shows what is recorded and trains nothing (seed 1 has no arms).
    lines = _run(capsys, "search_quality", ["--smoke", "--datasets", "digits", "--seeds", "0,1", "--json", str(out), "--report"])
    assert [line.strip() for line in lines if "seed 1:" in line] == ["digits seed 1: nothing recorded"]
    assert [line.split()[:3] for line in lines if line.startswith("digits ")][0] == ["digits", "aso-se", "1"]
    assert json.loads(out.read_text()) == again


def test_search_quality_random_genotype_matches_budget():
    q = _module("search_quality")
    from asolab import config
    from asolab.runner import Runner

    runner = Runner(config.load(None, {"space.init_channels": 4, "tracking.enabled": False, "data.train_subset": 64}))
    target = runner.net.count_derived(runner.net.derive())
    genotype, params = q.matched_random(runner, target, seed=0)
    assert abs(params - target) <= 0.10 * target
    assert runner.net.count_derived(genotype) == params


def test_search_quality_runs_chosen_arms(capsys, tmp_path):
    """--arms splits one seed across processes; an arm that needs the seed's
    ASO-SE run refuses to start without it, naming what to run first."""
    import json

    out = tmp_path / "q.json"
    args = ["--smoke", "--datasets", "digits", "--seeds", "0", "--json", str(out)]
    with pytest.raises(SystemExit, match="random arm needs this seed's aso-se arm"):
        _module("search_quality").main(args + ["--arms", "initial,random"])
    assert not out.exists()
    with pytest.raises(SystemExit):
        _module("search_quality").main(args + ["--arms", "initial,bogus"])
    assert "unknown arm bogus" in capsys.readouterr().err
    _run(capsys, "search_quality", args + ["--arms", "initial"])
    assert [r["arm"] for r in json.loads(out.read_text())] == ["initial"]
    _run(capsys, "search_quality", args + ["--arms", "aso-se,aso-arch"])
    assert [r["arm"] for r in json.loads(out.read_text())] == ["initial", "aso-se", "aso-arch"]


def test_search_quality_resumes_a_killed_arm_from_its_checkpoint(capsys, tmp_path):
    """An arm killed midway (here: right after its first phase's checkpoint)
    resumes from that checkpoint on the next invocation and records the figures
    of an uninterrupted run; its checkpoints go once it is recorded."""
    import json

    from asolab.runner.events import Observer

    q = _module("search_quality")
    args = ["--smoke", "--datasets", "digits", "--seeds", "0", "--arms", "initial"]
    _run(capsys, "search_quality", args + ["--json", str(tmp_path / "whole.json")])
    (whole,) = json.loads((tmp_path / "whole.json").read_text())

    class Killed(Exception):
        pass

    class KillAtFirstCheckpoint(Observer):
        def on_checkpoint(self, event):
            raise Killed

    out = tmp_path / "q.json"
    folder = q.checkpoints_for(out, "smoke") / "digits-seed0-initial"
    cfg = q.load("digits", {**q.SMOKE, "device": "cpu", "tracking.enabled": False})
    data = q.load_data(cfg.data, cfg.seed, "cpu")
    data.full_train = data.full_train.head(256)  # as --smoke caps it
    with pytest.raises(Killed):
        q.FixedGenotypeRunner(cfg, [KillAtFirstCheckpoint()], data=data, checkpoint_dir=folder).run()
    assert (folder / "checkpoint.pt").exists()

    lines = _run(capsys, "search_quality", args + ["--json", str(out)])
    assert any("initial  resumed from its checkpoint: alpha, epoch 1" in line for line in lines), lines
    (resumed,) = json.loads(out.read_text())
    assert (resumed["test_acc"], resumed["val_acc"], resumed["genotype"]) == (whole["test_acc"], whole["val_acc"], whole["genotype"])
    assert not folder.exists()


def _append_arms(path: str, worker: int, count: int) -> None:
    q = _module("search_quality")
    for i in range(count):
        q.append_result(Path(path), {"worker": worker, "i": i})


def test_search_quality_processes_share_one_results_file(tmp_path):
    """Seeds run in parallel processes record into one file: no arm is lost to a
    read-modify-write race, and the file is valid JSON throughout."""
    import json
    import multiprocessing

    out = tmp_path / "results.json"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_append_arms, args=(str(out), w, 25)) for w in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    records = json.loads(out.read_text())
    assert sorted((r["worker"], r["i"]) for r in records) == [(w, i) for w in range(3) for i in range(25)]
    assert not list(tmp_path.glob("*.tmp"))


def test_tracking_overhead(capsys):
    lines = _run(capsys, "tracking_overhead", ["--tiny", "--repeats", "2"])
    assert lines[-1].startswith("tracking overhead:") and "median of 2 interleaved pairs" in lines[-1]
    pairs = [line.split() for line in lines if line[:1].isdigit()]
    assert [p[0] for p in pairs] == ["0", "1"] and all(float(p[1]) > 0 and float(p[2]) > 0 for p in pairs)


def test_search_throughput_neuroexapt_shaped_cycle(capsys):
    lines = _run(capsys, "search_throughput", ["--cycle", "--smoke", "--threads", "1"])
    assert lines[1].split()[:2] == ["shape", "W-step"] and lines[2].startswith("L5 3x8x8")
    assert all(float(v) > 0 for v in lines[2].split()[2:])


def test_final_speed(capsys):
    lines = _run(capsys, "final_speed", ["--smoke", "--threads", "1"])
    assert [line.split()[0] for line in lines[2:5]] == ["eager", "channels-last", "bf16"]
    assert lines[-1].startswith("final training speed-up over eager:") and "GFLOP/s fp32 peak" in lines[-1]


def test_concurrency(capsys):
    lines = _run(capsys, "concurrency", ["--smoke"])
    assert lines[-1].startswith("auto threads, slowdown against alone: 2 at once")
    rows = [line.split() for line in lines if line.startswith("auto ")][:2]  # the table's rows
    assert [r[1] for r in rows] == ["1", "2"] and rows[1][2].count("+") == 1


@pytest.mark.parametrize("name", ["concurrency", "final_speed", "search_throughput", "data_pipeline", "memory", "speed_paths", "search_quality", "tracking_overhead"])
def test_every_benchmark_documents_itself(name):
    assert _module(name).__doc__.strip()


def test_growth_digits(capsys):
    lines = _run(capsys, "growth_digits", ["--smoke"])
    assert lines[0].split()[:3] == ["cycle", "kind", "where"]
    kinds = [line.split()[1] for line in lines[1:-1]]
    assert kinds and set(kinds) <= {"widen", "deepen", "branch"}
    assert lines[-1].startswith("supernet params")

"""Bad input to every command ends in one line, ``asolab: error: ...``, and exit status 2:
no traceback, no minutes of retries, nothing added to a database that is not asolab's.

The cases run ``main()`` in this process; none of them trains a network.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from asolab.cli import main
from asolab.config import load
from asolab.runner import Runner
from asolab.runner.memory import MemoryLimitError, check_fits, estimate_supernet
from asolab.space.spec import ArchSpec

ROOT = Path(__file__).resolve().parents[1]
DEAD = "127.0.0.1:9"  # the discard port: nothing listens there
TINY_STUDY = """
experiment = "digits"
n_trials = 1
[overrides]
threads = 1
search.cycles = 1
space.init_channels = 4
data.train_subset = 200
[objective]
metrics = ["val_acc"]
[params.mutation.strength]
low = 0.0
high = 1.0
"""


@pytest.fixture(scope="module")
def ok_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An MLflow store that works, made once (making one takes seconds): ``{S}`` in a case."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the bad files the cases name (``{T}`` in a case)."""
    (tmp_path / "binary.toml").write_bytes(b"\x00\xff\xfe\x01 binary")
    (tmp_path / "broken.toml").write_text("seed = 1\n[space\n")
    (tmp_path / "data_number.toml").write_text("data = 3\n")
    (tmp_path / "seed_text.toml").write_text('seed = "zero"\n')
    (tmp_path / "no_base.toml").write_text('experiment = "nope"\n')
    (tmp_path / "tiny_study.toml").write_text(TINY_STUDY)
    (tmp_path / "not_a_db.db").write_text("hello\n")
    (tmp_path / "a_file").write_text("x\n")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "garbage.log").write_bytes(b"\x00\x01garbage\xff\n")
    con = sqlite3.connect(tmp_path / "other.db")  # someone else's database
    con.execute("CREATE TABLE people (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def run_main(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's errors
        rc = exc.code
    return rc, capsys.readouterr().err.strip()


OK_STORE = "{S}"
STUDY = ["study", "{T}/tiny_study.toml", "--tracking-uri", OK_STORE, "--storage", "{T}/j.log"]
COMPARE = ["compare", "--tracking-uri", OK_STORE]
UI = ["ui", "--tracking-uri", OK_STORE]

CASES = {
    # asolab run: files, keys, values, stores
    "run a directory": (["run", str(ROOT / "experiments")], "is a directory"),
    "run binary bytes": (["run", "{T}/binary.toml"], "not a text file"),
    "run broken TOML": (["run", "{T}/broken.toml"], "not valid TOML"),
    "run unknown name": (["run", "no_such_experiment"], "known experiments"),
    "run a table given a number": (["run", "{T}/data_number.toml"], "'data' must be a table"),
    "run seed as text": (["run", "{T}/seed_text.toml"], "seed must be an integer"),
    "run seed too big": (["run", "--set", "seed=99999999999999999999"], "9223372036854775807"),
    "run seed negative": (["run", "--set", "seed=-1"], "out of range"),
    "run split_seed too big": (
        ["run", "--set", "data.split_seed=99999999999999999999"],
        "data.split_seed",
    ),
    "run --set without =": (["run", "--set", "seed"], "expected section.key=value"),
    "run unknown section": (["run", "--set", "foo.bar=1"], "unknown key 'foo'"),
    "run section as value": (["run", "--set", "space=3"], "must be a table"),
    "run no primitives": (["run", "--set", "space.primitives=[]"], "at least one"),
    "run only none": (["run", "--set", 'space.primitives=["none"]'], "besides 'none'"),
    "run cap without weighted ops": (
        ["run", "--set", "search.param_free_cap=1", "--set", 'space.primitives=["skip_connect"]'],
        "param_free_cap needs an operation with weights",
    ),
    "run cap below -1": (["run", "--set", "search.param_free_cap=-2"], "param_free_cap"),
    "run unknown device": (["run", "--set", "device=tpu"], "cuda:N"),
    "run unknown data set": (["run", "--set", "data.name=imagenet"], "data.name"),
    "run batch size 0": (["run", "--set", "data.batch_size=0"], "data.batch_size"),
    "run one training image": (
        ["run", "--no-track", "--set", "data.train_subset=1"],
        "data.train_subset = 1 keeps 1 of the",
    ),
    "run float for int": (["run", "--set", "search.cycles=1.5"], "integer"),
    "run infinite learning rate": (["run", "--set", "search.weight_lr=inf"], "finite"),
    "run clip -inf": (["run", "--set", "search.grad_clip=-inf"], "finite"),
    "run min above initial temperature": (
        ["run", "--set", "temperature.min_temperature=10"],
        "must not exceed",
    ),
    "run unknown flag": (["run", "--bogus"], "unrecognized arguments"),
    "run --resume without tracking": (["run", "--resume", "abc", "--no-track"], "drop --no-track"),
    "run store in a missing place": (
        ["run", "--set", "tracking.tracking_uri=sqlite:///{T}/a_file/m.db"],
        "cannot create",
    ),
    "run store is a directory": (
        ["run", "--set", "tracking.tracking_uri=sqlite:///{T}/a_dir"],
        "is a directory",
    ),
    "run store not a database": (
        ["run", "--set", "tracking.tracking_uri=sqlite:///{T}/not_a_db.db"],
        "not an SQLite",
    ),
    "run store of someone else": (
        ["run", "--set", "tracking.tracking_uri=sqlite:///{T}/other.db"],
        "something else",
    ),
    "run old file store": (
        ["run", "--set", "tracking.tracking_uri=file:///tmp/x"],
        "old file store",
    ),
    "run unknown URI scheme": (["run", "--set", "tracking.tracking_uri=bogus://x"], "bogus"),
    "run dead server": (["run", "--set", f"tracking.tracking_uri=http://{DEAD}"], "not reachable"),
    "run dead database": (
        ["run", "--set", f"tracking.tracking_uri=postgresql://u:pw@{DEAD}/x"],
        "cannot be reached",
    ),
    "run supernet too big": (
        [
            "run",
            "--set",
            "space.init_channels=1024",
            "--set",
            "space.layers=3",  # the meta-device estimate builds 64 cells in a minute of CPU
            "--set",
            "data.batch_size=65536",
            "--set",
            "tracking.tracking_uri={S}",
        ],
        "space.init_channels",
    ),
    # asolab study
    "study a directory": (["study", str(ROOT / "studies")], "is a directory"),
    "study binary bytes": (["study", "{T}/binary.toml"], "not a text file"),
    "study broken TOML": (["study", "{T}/broken.toml"], "not valid TOML"),
    "study unknown name": (["study", "no_such_study"], "known studies"),
    "study unknown base experiment": (["study", "{T}/no_base.toml"], "'nope' not found"),
    "study negative trials": ([*STUDY, "--n-trials", "-1"], "--n-trials"),
    "study negative timeout": ([*STUDY, "--timeout", "-1"], "--timeout"),
    "study no workers": ([*STUDY, "--workers", "0"], "--workers"),
    "study trials not a number": ([*STUDY, "--n-trials", "abc"], "invalid int value"),
    "study negative seed": ([*STUDY, "--seed", "-5"], "--seed"),
    "study unknown flag": ([*STUDY, "--bogus"], "study: unrecognized arguments: --bogus"),
    "study --set without =": ([*STUDY, "--set", "seed"], "expected section.key=value"),
    "study --set out of range": ([*STUDY, "--set", "search.cycles=0"], "search.cycles"),
    "study --set unknown key": ([*STUDY, "--set", "search.nope=1"], "unknown key"),
    "study --set a tuned key": ([*STUDY, "--set", "mutation.strength=0.5"], "the study tunes"),
    "study --set a study key": ([*STUDY, "--set", "objective.seeds=1"], "a key of the study file"),
    "study name with a quote": ([*STUDY, "--study-name", 'bad"name'], "--study-name"),
    "study unknown storage": ([*STUDY[:-2], "--storage", "bogus://x"], "not supported"),
    "study dead database": (
        [*STUDY[:-2], "--storage", f"postgresql://u:pw@{DEAD}/x"],
        "cannot be reached",
    ),
    "study storage not a database": (
        [*STUDY[:-2], "--storage", "sqlite:///{T}/not_a_db.db"],
        "not an SQLite",
    ),
    "study storage of someone else": (
        [*STUDY[:-2], "--storage", "sqlite:///{T}/other.db"],
        "something else",
    ),
    "study journal in a missing place": (
        [*STUDY[:-2], "--storage", "{T}/a_file/j.log"],
        "cannot be opened",
    ),
    "study dead tracking server": ([*STUDY[:3], f"http://{DEAD}", *STUDY[4:]], "not reachable"),
    "study tracking store of someone else": (
        [*STUDY[:3], "sqlite:///{T}/other.db", *STUDY[4:]],
        "something else",
    ),
    # asolab compare
    "compare CSV into a missing folder": (
        [*COMPARE, "--csv", "/nonexistent/x.csv"],
        "does not exist",
    ),
    "compare CSV onto a directory": ([*COMPARE, "--csv", "{T}/a_dir"], "is a directory"),
    "compare report under a file": (
        [*COMPARE, "--report", "{T}/a_file/report"],
        "not a writable folder",
    ),
    "compare report onto a file": ([*COMPARE, "--report", "{T}/a_file"], "is a file"),
    "compare store not a database": (
        ["compare", "--tracking-uri", "sqlite:///{T}/not_a_db.db"],
        "not an SQLite",
    ),
    "compare store of someone else": (
        ["compare", "--tracking-uri", "sqlite:///{T}/other.db"],
        "something else",
    ),
    "compare missing store": (
        ["compare", "--tracking-uri", "sqlite:///{T}/none.db"],
        "no MLflow store",
    ),
    "compare dead server": (["compare", "--tracking-uri", f"http://{DEAD}"], "not reachable"),
    "compare dead database": (
        ["compare", "--tracking-uri", f"postgresql://u:pw@{DEAD}/x"],
        "cannot be reached",
    ),
    "compare old file store": (["compare", "--tracking-uri", "file:///tmp"], "old file store"),
    "compare negative top": ([*COMPARE, "--top", "-1"], "--top"),
    "compare top 0": ([*COMPARE, "--top", "0"], "leave --top out to compare every"),
    "compare top not a number": ([*COMPARE, "--top", "x"], "invalid int value"),
    # asolab ui
    "ui port too big": ([*UI, "--port", "70000"], "1-65535"),
    "ui port negative": ([*UI, "--port", "-1"], "1-65535"),
    "ui port not a number": ([*UI, "--port", "abc"], "invalid int value"),
    "ui no workers": ([*UI, "--workers", "0"], "--workers must be >= 1"),
    "ui unknown host": ([*UI, "--host", "999.1.1.1"], "--host"),
    "ui store not a database": (
        ["ui", "--tracking-uri", "sqlite:///{T}/not_a_db.db"],
        "not an SQLite",
    ),
    "ui store of someone else": (
        ["ui", "--tracking-uri", "sqlite:///{T}/other.db"],
        "something else",
    ),
    "ui dead server": (["ui", "--tracking-uri", f"http://{DEAD}"], "not reachable"),
    "ui store in a missing place": (
        ["ui", "--tracking-uri", "sqlite:///{T}/a_file/m.db"],
        "cannot create",
    ),
}


@pytest.mark.parametrize("argv, words", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_error_line_and_status_2(argv, words, place, ok_store, capsys):
    argv = [a.replace("{T}", str(place)).replace("{S}", ok_store) for a in argv]
    started = time.monotonic()
    rc, err = run_main(argv, capsys)
    assert rc == 2, err
    assert err.startswith("asolab: error: ") and "\n" not in err, err
    assert not err.startswith("asolab: error: asolab"), err  # one prefix, not two
    assert "Traceback" not in err and words in err, err
    assert time.monotonic() - started < 30, (
        "unreachable stores fail fast, without minutes of retries"
    )
    # Someone else's database is refused, never given MLflow's or Optuna's tables.
    con = sqlite3.connect(place / "other.db")
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == [
        "people"
    ]
    con.close()


def test_ui_on_a_port_in_use_is_one_line(ok_store, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, err = run_main(["ui", "--tracking-uri", ok_store, "--port", str(port)], capsys)
    assert rc == 2 and err.startswith("asolab: error: ") and "\n" not in err, err
    assert f"127.0.0.1:{port}" in err and "--port" in err


def test_memory_estimate_counts_every_parameter_of_the_supernet():
    from asolab.space.network import SearchNetwork

    cfg = load(None, {"space.init_channels": 6, "space.layers": 5, "space.steps": 3})
    spec = ArchSpec.from_config(cfg.space, 1, 10)
    est = estimate_supernet(spec, 32, 8)
    assert est.params == sum(p.numel() for p in SearchNetwork(spec).parameters())
    assert estimate_supernet(spec, 64, 8).activation_bytes == 2 * est.activation_bytes


def test_memory_estimate_follows_the_stem_stride():
    """A stride-2 stem keeps every parameter and about a quarter of the activations."""
    from asolab.space.network import SearchNetwork

    one, two = (
        ArchSpec.from_config(load(None, {"space.stem_stride": s}).space, 1, 10) for s in (1, 2)
    )
    e1, e2 = estimate_supernet(one, 32, 28), estimate_supernet(two, 32, 28)
    assert e2.params == e1.params == sum(p.numel() for p in SearchNetwork(two).parameters())
    assert 0.2 < e2.activation_bytes / e1.activation_bytes < 0.3


def test_a_supernet_that_cannot_fit_is_refused_before_it_is_allocated():
    # terabytes at the widest channels and the largest batch; a shallow stack, since the
    # estimate builds the supernet on the meta device (64 cells of 8 nodes: a minute of CPU)
    cfg = load(None, {"space.init_channels": 1024, "space.layers": 3, "space.steps": 2})
    spec = ArchSpec.from_config(cfg.space, 1, 10)
    with pytest.raises(MemoryLimitError, match="data.batch_size"):
        check_fits(spec, 65536, 8, torch.device("cpu"))
    assert (
        check_fits(ArchSpec.from_config(load().space, 1, 10), 64, 8, torch.device("cpu")).total
        < 2**30
    )


def test_out_of_memory_during_a_run_ends_it_failed_with_one_line(
    place, ok_store, capsys, monkeypatch
):
    """What torch raises when CUDA runs out (raised here where a CPU-only machine cannot run
    out of GPU memory): the run ends FAILED in MLflow and the command in one line."""

    def out_of_memory(self):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)")

    monkeypatch.setattr(Runner, "w_train", out_of_memory)
    store = ok_store
    rc, err = run_main(
        [
            "run",
            "--quiet",
            "--set",
            "threads=1",
            "--set",
            "space.init_channels=4",
            "--set",
            "data.train_subset=200",
            "--set",
            f"tracking.tracking_uri={store}",
        ],
        capsys,
    )
    assert rc == 2 and err.startswith("asolab: error: out of memory") and "\n" not in err, err
    assert "data.batch_size" in err
    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert "out of memory" in run.data.tags["asolab.error"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_out_of_memory_ends_the_run_failed(place, capsys):
    torch.cuda.set_per_process_memory_fraction(0.001)  # a real CUDA OOM on the first big tensor
    try:
        rc, err = run_main(
            [
                "run",
                "--quiet",
                "--no-track",
                "--set",
                "device=cuda",
                "--set",
                "threads=1",
                "--set",
                "data.batch_size=4096",
                "--set",
                "data.train_subset=0",
            ],
            capsys,
        )
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert rc == 2 and "out of memory" in err and "\n" not in err, err


@pytest.mark.slow
def test_a_trial_that_cannot_fit_fails_and_the_study_goes_on(tmp_path):
    import optuna
    from optuna.trial import TrialState

    from asolab.study import load_study, run_study

    (tmp_path / "tiny.toml").write_text(
        'seed = 0\ndevice = "cpu"\nthreads = 1\n[data]\ntrain_subset = 200\n'
        "[space]\ninit_channels = 4\nlayers = 3\nsteps = 2\n"
        "[search]\ncycles = 1\nw_epochs = 1\nalpha_epochs = 1\nretrain_epochs = 1\n"
        "final_epochs = 0\n"
        "[tracking]\nlog_models = false\n"
    )
    # Too big by its batch's activations (terabytes at the widest channels), not by a deep
    # stack: the estimate builds the supernet on the meta device, and 64 cells of 8 nodes
    # took it a minute of CPU.
    (tmp_path / "big.toml").write_text(
        'experiment = "tiny.toml"\nn_trials = 2\n[sampler]\nname = "random"\n'
        '[pruner]\nname = "none"\n'
        "[params.space.init_channels]\nchoices = [1024, 4]\n"
        "[params.data.batch_size]\nchoices = [65536, 64]\n"
        '[[enqueue]]\n"space.init_channels" = 1024\n"data.batch_size" = 65536\n'
        '[[enqueue]]\n"space.init_channels" = 4\n"data.batch_size" = 64\n'
    )
    journal = tmp_path / "optuna-journal.log"
    run_study(
        load_study(tmp_path / "big.toml"),
        storage_url=str(journal),
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    trials = optuna.load_study(study_name="big", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "MemoryLimitError" in trials[0].user_attrs["asolab.error"]
    assert "space.init_channels" in trials[0].user_attrs["asolab.error"]

"""A study across "machines" sharing a real PostgreSQL Optuna storage.

The fixture starts a throwaway PostgreSQL server (initdb + pg_ctl, on a free
port of 127.0.0.1, its data and socket in a temporary directory; as the
``postgres`` user when the tests run as root, since PostgreSQL refuses root)
and creates a database for the study. Two independent ``asolab study``
processes then share it, as two machines would: same study name and storage,
each its own ``--seed``, one MLflow store. Skipped, with the reason, where the
PostgreSQL server binaries or a PostgreSQL driver are missing (``.ci/run``
installs the server; the ``test`` extra installs psycopg).

The "machines" are forked from the preloaded server of tests/processes.py: separate
processes, pids and connections, as the tests need, without each re-importing torch,
MLflow and Optuna.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import processes
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState
from test_study import TINY_EXPERIMENT  # the same tiny digits run as the other study tests

from asolab.config import ConfigError
from asolab.study.config import StorageConfig
from asolab.study.report import TAG_STORAGE, TAG_STUDY_PARENT
from asolab.study.storage import ATTR_MLFLOW_RUN, ATTR_OWNER, make_storage
from asolab.tracking.layout import TAG_STUDY, TAG_TRIAL, TAG_TRIAL_STATE

PASSWORD = "s3cret-pw"


def _pg_scheme() -> str | None:
    """The URL scheme for an installed PostgreSQL driver: plain ``postgresql://`` (as the
    docs/scaling-out.md writes it) when SQLAlchemy's default driver for it is installed
    (psycopg 3 since SQLAlchemy 2.1, psycopg2 before), else the scheme naming the driver
    that is."""
    from sqlalchemy.dialects import postgresql

    for driver, scheme in (
        (postgresql.dialect.driver, "postgresql"),
        ("psycopg", "postgresql+psycopg"),
        ("psycopg2", "postgresql+psycopg2"),
    ):
        if importlib.util.find_spec(driver) is not None:
            return scheme
    return None


def _pg_bindir() -> Path | None:
    """The newest PostgreSQL server binaries: Debian's /usr/lib/postgresql/N/bin, else PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


@dataclass(frozen=True)
class Postgres:
    url: str  # postgresql://asolab:PASSWORD@127.0.0.1:PORT/optuna


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL server with an empty ``optuna`` database; stopped and removed
    afterwards."""
    scheme = _pg_scheme()
    if scheme is None:
        pytest.skip("no PostgreSQL driver for SQLAlchemy (pip install 'psycopg[binary]')")
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl) not found (apt-get install postgresql)"
        )
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        runuser = shutil.which("runuser")
        try:
            pg_user = pwd.getpwnam("postgres")
        except KeyError:
            pg_user = None
        if runuser is None or pg_user is None:
            pytest.skip("running as root, and no 'postgres' user or runuser to start PostgreSQL as")
        as_user = [runuser, "-u", "postgres", "--"]

    root = Path(
        tempfile.mkdtemp(prefix="asolab-pg-")
    )  # short: the socket path must fit in 107 bytes
    if as_user:
        os.chown(root, pg_user.pw_uid, pg_user.pw_gid)
    data, log_file, pwfile = root / "data", root / "server.log", root / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    if as_user:
        os.chown(pwfile, pg_user.pw_uid, pg_user.pw_gid)

    def pg(tool: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            as_user + [str(bindir / tool), *args], capture_output=True, text=True, timeout=120
        )

    started = False
    try:
        init = pg(
            "initdb",
            "-D",
            str(data),
            "-U",
            "asolab",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        assert init.returncode == 0, f"initdb failed:\n{init.stdout}\n{init.stderr}"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        # fsync off: the data dies with the test anyway
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -F -c full_page_writes=off"
        start = pg(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(data), "-l", str(log_file), "-o", options
        )
        started = True
        server_log = log_file.read_text() if log_file.exists() else ""
        assert start.returncode == 0, (
            f"pg_ctl start failed:\n{start.stdout}\n{start.stderr}\n{server_log}"
        )
        created = subprocess.run(
            [
                str(bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "asolab",
                "optuna",
            ],
            env={**os.environ, "PGPASSWORD": PASSWORD},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, f"createdb failed:\n{created.stderr}"
        yield Postgres(f"{scheme}://asolab:{PASSWORD}@127.0.0.1:{port}/optuna")
    finally:
        if started:
            pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(data))
        shutil.rmtree(root, ignore_errors=True)


def wait_for_parent_run(db: Path, proc: processes.Popen, timeout: float = 120) -> None:
    """Until the first machine has created the study's parent run (read-only: creates nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the first invocation ended early:\n{proc.communicate()[0]}"
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    if con.execute(
                        "SELECT 1 FROM tags WHERE key = ? AND value = 'true'", (TAG_STUDY_PARENT,)
                    ).fetchone():
                        return
            except sqlite3.OperationalError:  # schema still being created, or locked
                pass
        time.sleep(0.2)
    raise AssertionError("the first invocation created no parent run")


@pytest.mark.slow
def test_two_machines_share_a_postgresql_study(tmp_path: Path, postgres: Postgres) -> None:
    n_trials = 6
    (tmp_path / "tiny.toml").write_text(TINY_EXPERIMENT)
    file = tmp_path / "pg.toml"
    file.write_text(
        'name = "pg"\nexperiment = "tiny.toml"\n'
        + textwrap.dedent(f"""
        n_trials = {n_trials}
        [overrides]
        data.train_subset = 150
        [sampler]
        name = "random"
        [pruner]
        name = "none"
        [storage]
        heartbeat_interval = 1      # Optuna's heartbeat in PostgreSQL beats while the trials run
        grace_period = 60
        [params.temperature.initial_temperature]
        low = 0.5
        high = 10.0
        log = true
        [params.mutation.strength]
        low = 0.0
        high = 1.0
        """)
    )
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    env = {**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "false", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)

    def machine(seed: int) -> processes.Popen:
        cmd = [
            sys.executable,
            "-m",
            "asolab.cli",
            "study",
            str(file),
            "--storage",
            postgres.url,
            "--tracking-uri",
            uri,
            "--seed",
            str(seed),
        ]
        return processes.Popen(
            cmd, cwd=tmp_path, env=env, stdout=processes.PIPE, stderr=processes.STDOUT, text=True
        )

    # As docs/scaling-out.md says: the first machine creates the study and its parent run, then the
    # other machine joins while the first is still running trials.
    first = machine(1)
    try:
        wait_for_parent_run(db, first)
        second = machine(2)
        try:
            outs = [p.communicate(timeout=300)[0] for p in (first, second)]
        finally:
            second.kill()
    finally:
        first.kill()
    for p, out in zip((first, second), outs):
        assert p.returncode == 0, out
        assert (
            "study pg:" in out
            and f"storage {postgres.url.split(':')[0]}://asolab:***@127.0.0.1" in out
        ), out
        assert PASSWORD not in out

    study = optuna.load_study(study_name="pg", storage=postgres.url)
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= n_trials, [(t.number, t.state.name) for t in trials]
    assert len(trials) <= n_trials + 2, "concurrent machines overshoot by a trial or two at most"
    numbers = [t.number for t in trials]
    assert len(set(numbers)) == len(numbers) == len(trials)

    # Both processes ran trials, and their samplers (seeds 1 and 2) proposed different points.
    by_owner: dict[str, list] = {}
    for t in complete:
        by_owner.setdefault(t.user_attrs[ATTR_OWNER], []).append(t)
    assert len(by_owner) == 2, (
        "both machines ran trials: "
        f"{sorted((t.number, t.user_attrs[ATTR_OWNER]) for t in complete)}"
    )
    points = [tuple(sorted(t.params.items())) for t in complete]
    assert len(set(points)) == len(points), points
    first_a, first_b = (min(ts, key=lambda t: t.number) for ts in by_owner.values())
    assert first_a.params != first_b.params

    # One parent run, reused by both machines; one child run per trial under it.
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("study-pg")
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = 'pg'")
    parents = [r for r in runs if r.data.tags.get(TAG_STUDY_PARENT) == "true"]
    assert len(parents) == 1, "both machines use the one parent run"
    parent = parents[0]
    assert (
        PASSWORD not in parent.data.tags[TAG_STORAGE]
        and "asolab:***@" in parent.data.tags[TAG_STORAGE]
    )
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1, "every other run of the study is a child of the parent"
    by_trial = {int(r.data.tags[TAG_TRIAL]): r for r in children}
    assert sorted(by_trial) == sorted(numbers) and len(children) == len(trials)
    for t in complete:
        run = by_trial[t.number]
        assert run.info.run_id == t.user_attrs[ATTR_MLFLOW_RUN]
        assert run.data.tags[TAG_TRIAL_STATE] == "COMPLETE"
        assert run.data.metrics["objective.val_acc"] == pytest.approx(t.value)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["trials.complete"] == len(complete)


def test_storage_errors_mask_the_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    for url in (
        f"postgresql://optuna:{PASSWORD}@127.0.0.1:{closed}/optuna",
        f"ftp://optuna:{PASSWORD}@host/x",
    ):
        with pytest.raises(ConfigError) as err:
            make_storage(url, StorageConfig())
        assert PASSWORD not in str(err.value) and "optuna:***@" in str(err.value), err.value


def test_machines_opening_an_empty_database_at_once_all_get_the_storage(postgres: Postgres) -> None:
    """Optuna creates its tables on first open; processes that race to do so all end up with
    the storage."""
    script = textwrap.dedent(f"""
        import sys, time
        from asolab.study.config import StorageConfig
        from asolab.study.storage import make_storage
        while time.time() < float(sys.argv[1]):  # start together
            time.sleep(0.001)
        make_storage({postgres.url!r}, StorageConfig())
        print("opened")
        """)
    processes.warm()  # the server has imported asolab: the children start in milliseconds
    go = time.time() + 2
    procs = [
        processes.Popen(
            [sys.executable, "-c", script, str(go)],
            stdout=processes.PIPE,
            stderr=processes.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)
    assert all("opened" in out for out in outputs)

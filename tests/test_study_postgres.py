"""A real PostgreSQL Optuna storage: the server the multi-machine tests share.

The fixture starts a throwaway PostgreSQL server (initdb + pg_ctl, on a free
port of 127.0.0.1, its data and socket in a temporary directory; as the
``postgres`` user when the tests run as root, since PostgreSQL refuses root)
and creates a database for the study. Skipped, with the reason, where the
PostgreSQL server binaries or a PostgreSQL driver are missing (``.ci/run``
installs the server; the ``test`` extra installs psycopg). Here: machines opening
an empty database at once, and a storage URL's password masked in errors. Two
``asolab study`` machines sharing one study on it, each its own ``--seed``, are
tests/test_scaling_rehearsal.py.

The racing "machines" are forked from the preloaded server of tests/processes.py:
separate processes, pids and connections, as the tests need, without each
re-importing torch, MLflow and Optuna.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import processes
import pytest

from asolab.config import ConfigError
from asolab.study.config import StorageConfig
from asolab.study.storage import make_storage

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

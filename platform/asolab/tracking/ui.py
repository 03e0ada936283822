"""``asolab ui``: the MLflow UI on the project's tracking store.

Starts ``mlflow server`` as a child process on ``127.0.0.1`` (the store holds
file paths of this machine; expose it deliberately with ``--host``). On any
other address the server's Host-header check (MLflow's guard against DNS
rebinding) stays on: it accepts the host itself, or the names ``--allowed-hosts``
gives, never ``*`` on its own, and a one-line warning says the UI is open. It prints
the addresses of the experiments' runs tables in the UI's model-training view
(see :mod:`asolab.tracking.browse`), and stops the server on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .browse import refresh_view, runs_url, tag_experiment
from .store import TrackingError, artifact_root, check_reachable, resolve_tracking_uri, sqlite_path

log = logging.getLogger(__name__)


def add_ui(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="browse runs in the MLflow UI (serves the local tracking store)")
    p.add_argument("--port", type=int, default=5000, help="port to listen on (default 5000)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument(
        "--allowed-hosts",
        default="",
        metavar="HOST[:PORT],...",
        help=(
            "with a --host other than 127.0.0.1: the host names browsers use to reach the UI "
            "(default: the --host address itself; required for 0.0.0.0)"
        ),
    )
    p.add_argument(
        "--tracking-uri",
        default="",
        help="store to serve (default: MLFLOW_TRACKING_URI, else mlruns/mlflow.db)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help=(
            "server worker processes (default 1: one browser needs no more, and each "
            "extra one adds seconds of start-up; MLflow's own default is 4)"
        ),
    )
    p.add_argument(
        "--verbose",
        dest="server_log",
        action="store_true",
        help=(
            "show the MLflow server's own messages and access log here (default: they go to "
            "ui.log beside the store)"
        ),
    )
    p.set_defaults(func=cmd_ui)


def server_log(uri: str) -> Path:
    """Where the MLflow server's messages go, its access log among them (a line per request,
    hundreds a minute while a page is open): ``ui.log`` beside the store's database."""
    path = sqlite_path(uri)
    return (Path(path).parent if path else Path(".")) / "ui.log"


LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def allowed_hosts(host: str, port: int, given: str = "") -> str:
    """The ``--allowed-hosts`` the server gets ('' on loopback: MLflow's default then
    accepts only local names). Never ``*`` alone, which would accept any Host header
    and let a web page on another site drive the UI through DNS rebinding."""
    given = ",".join(h.strip() for h in given.split(",") if h.strip())
    if given == "*":
        raise TrackingError(
            "--allowed-hosts '*' would turn off the UI's protection against DNS rebinding; "
            f"name the hosts browsers use (e.g. --allowed-hosts {socket.gethostname()}:{port})"
        )
    if given or host in LOOPBACK:
        return given
    if host in WILDCARDS:
        raise TrackingError(
            f"--host {host or repr(host)} serves every address of this machine: name the hosts "
            f"browsers will use with --allowed-hosts (e.g. --allowed-hosts "
            f"{socket.gethostname()}:{port})"
        )
    return f"{host}:{port},{host}"


def server_command(
    uri: str, host: str, port: int, workers: int = 1, allowed: str = ""
) -> list[str]:
    """The ``mlflow server`` command line that serves ``uri`` (``allowed``: see
    :func:`allowed_hosts`).

    One worker by default: each uvicorn worker imports all of MLflow, so on 2 cores
    the server answers after ~12 s with one and ~36 s with MLflow's default four,
    and one worker's thread pool already serves a browser's parallel requests."""
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    root = artifact_root(uri)
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        cmd += ["--default-artifact-root", root.as_uri()]
    if allowed:
        cmd += ["--allowed-hosts", allowed]
    return cmd


def server_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``environ`` (default ``os.environ``) with MLflow's job
    execution off unless the user set ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` themselves.

    MLflow 3 starts its GenAI job runners (a job runner and seven huey consumers, each
    importing MLflow) whenever huey is installed; asolab runs no MLflow jobs, and on 2
    cores those processes took 20-35 s of CPU beside the UI's own ~18 s, most of it
    before the UI's first answer."""
    env = dict(os.environ if environ is None else environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def check_port(host: str, port: int) -> None:
    """One line, before the server starts, for a port out of range or already taken:
    mlflow server would print a traceback from its worker and still exit with status 0."""
    if not 1 <= port <= 65535:
        raise TrackingError(f"--port {port} is not a TCP port; give one in 1-65535 (default 5000)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TrackingError(
            f"--host {host!r} is not an address of this machine ({exc.strerror})"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(address)
        except OSError as exc:
            raise TrackingError(
                f"cannot serve on {host}:{port} ({exc.strerror}); choose another --port or --host"
            ) from None


def cmd_ui(args: argparse.Namespace) -> int:
    uri = resolve_tracking_uri(args.tracking_uri)
    if sqlite_path(uri) is None:
        # A remote tracking server already has its own UI.
        check_reachable(uri)
        print(f"runs are on the tracking server {uri}; open it in a browser")
        return 0
    if args.workers < 1:
        raise TrackingError(f"--workers must be >= 1 (got {args.workers})")
    allowed = allowed_hosts(args.host, args.port, args.allowed_hosts)
    check_port(args.host, args.port)  # first: it costs nothing
    check_reachable(uri)
    if args.host not in LOOPBACK:
        print(
            f"asolab: warning: the UI on {args.host}:{args.port} has no login: whoever reaches "
            f"it as {allowed} can read and change every run in {uri}",
            file=sys.stderr,
        )
    # Its own process group: mlflow server starts uvicorn workers, and stopping must reach them too.
    shown = getattr(args, "server_log", False) or getattr(args, "verbose", False)
    logfile = server_log(uri)
    sink = None if shown else open(logfile, "ab")  # noqa: SIM115 (closed when the server ends)
    try:
        proc = subprocess.Popen(
            server_command(uri, args.host, args.port, args.workers, allowed),
            start_new_session=True,
            env=server_env(),
            stdout=sink,
            stderr=sink,
        )
    finally:
        if sink is not None:
            sink.close()  # the server holds its own copy

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    base = f"http://{args.host}:{args.port}"
    print(f"MLflow UI for {uri}: {runs_url(base)}  (Ctrl-C stops it)", flush=True)
    if not shown:
        print(f"  the server's messages and access log: {logfile} (--verbose shows them here)")
    for name, exp_id in _experiments(uri):
        print(f"  {name}: {runs_url(base, exp_id)}", flush=True)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_group(proc)
    if code != 0:
        where = "above" if shown else f"in {logfile}"
        raise TrackingError(
            f"mlflow server stopped with exit status {code} (its messages are {where})"
        )
    return 0


def _experiments(uri: str, limit: int = 8) -> list[tuple[str, str]]:
    """(name, id) of the store's most recently updated experiments, each tagged for the
    UI's model-training view and asolab's runs-table columns if it was not yet."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = []
    for exp in client.search_experiments(max_results=limit, order_by=["last_update_time DESC"]):
        if exp.name == "Default" and not client.search_runs([exp.experiment_id], max_results=1):
            continue
        tag_experiment(client, exp.experiment_id, exp.name, exp.tags)
        refresh_view(client, exp.experiment_id)
        found.append((exp.name, exp.experiment_id))
    return found


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue

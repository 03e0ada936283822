"""An ``mlflow server`` the tests start: its own process group, a log file, its URL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ports import free_port


@contextlib.contextmanager
def start_mlflow_server(backend_uri: str, folder: Path) -> Iterator[str]:
    """``mlflow server`` on ``backend_uri`` with proxied artifacts under ``folder``, up
    and answering ``/health``; yields its URL and stops it (and its workers) after."""
    port = free_port()
    log_path = folder / "mlflow-server.log"
    log = open(log_path, "w")  # noqa: SIM115 (closed below)
    cmd = [
        *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)),
        *("--backend-store-uri", backend_uri),
        *("--artifacts-destination", str(folder / "artifacts"), "--workers", "1"),
    ]
    # no background job runners (MLflow's GenAI jobs): four processes fewer on small machines
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not start in 120 s"
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()

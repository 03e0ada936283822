"""tests/processes.py: children forked from a preloaded server behave, to a test, like
``subprocess`` children of a fresh interpreter (exit status, signals, pipes, env, cwd,
atexit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import processes

PY = sys.executable


def test_exit_statuses_are_the_interpreters():
    assert processes.run([PY, "-c", "pass"]).returncode == 0
    assert processes.run([PY, "-c", "import sys; sys.exit(3)"]).returncode == 3
    done = processes.run([PY, "-c", "raise SystemExit('bad')"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (1, "bad\n")
    done = processes.run([PY, "-c", "1/0"], capture_output=True, text=True)
    assert done.returncode == 1 and "ZeroDivisionError" in done.stderr
    assert processes.run([PY, "-c", "raise KeyboardInterrupt"]).returncode == -signal.SIGINT


def test_a_signal_gives_minus_its_number_and_sigterm_default_applies():
    proc = processes.Popen(
        [PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], stdout=processes.PIPE
    )
    assert proc.stdout.readline() == b"up\n" and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    proc.stdout.close()
    proc = processes.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        proc.wait(timeout=0.1)
        raise AssertionError("it ended")
    except subprocess.TimeoutExpired:
        pass
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL and proc.returncode == -9


def test_output_of_the_child_and_its_own_child_comes_through_one_pipe():
    code = (
        "import subprocess, sys; print('child', sys.argv[1:], flush=True); "
        "subprocess.run([sys.executable, '-c', "
        "'import sys; sys.stderr.write(\"grandchild\\\\n\")'])"
    )
    proc = processes.Popen(
        [PY, "-c", code, "a", "b"], stdout=processes.PIPE, stderr=processes.STDOUT, text=True
    )
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (0, None)
    assert out == "child ['a', 'b']\ngrandchild\n"


def test_env_cwd_session_stdin_and_atexit_apply(tmp_path):
    code = (
        "import atexit, os, sys, tempfile; "
        "atexit.register(lambda: print('atexit', flush=True)); "
        "print(os.environ.get('ONLY_HERE'), os.environ.get('HOME'), os.getcwd(), "
        "tempfile.gettempdir(), os.getsid(0) == os.getpid(), sys.stdin.read().strip())"
    )
    (tmp_path / "t").mkdir()
    env = {"ONLY_HERE": "yes", "TMPDIR": str(tmp_path / "t")}
    done = processes.run(
        [PY, "-c", code],
        env=env,
        cwd=tmp_path,
        input="fed",
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"yes None {tmp_path} {tmp_path / 't'} True fed", "atexit"]
    assert "ONLY_HERE" not in os.environ


def test_python_m_runs_the_module_as_main(tmp_path):
    done = processes.run([PY, "-m", "asolab.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("usage: asolab"), done.stderr
    assert done.stderr == ""
    done = processes.run([PY, "-m", "asolab.cli", "nonesuch"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_each_child_has_its_own_lease_token():
    """The lease token is made when asolab.tracking.lease is imported, once per process:
    two children of the server that imported it must not share it (two resumers of one
    run would both win)."""
    code = "from asolab.tracking import lease; print(lease.TOKEN)"
    tokens = {processes.run([PY, "-c", code], capture_output=True, text=True).stdout for _ in "ab"}
    assert len(tokens) == 2 and "" not in tokens


def test_a_forked_child_of_a_process_that_holds_a_lease_has_its_own_token_and_no_lease(
    tmp_path,
):
    """multiprocessing forks on Linux: a researcher's pool of asolab.run calls, forked from
    one notebook, must not share the lease token (two resumers of one run would both win
    the contest) nor think they hold their parent's run."""
    from asolab.tracking import lease

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lease.take(uri, "run-of-the-parent")
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the parent's exit code
            os.write(write, f"{lease.TOKEN} {sorted(lease._HELD)}".encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        token, held = os.read(read, 4096).decode().split(" ", 1)
        os.close(read)
        assert token != lease.TOKEN and held == "[]"
        assert "run-of-the-parent" in lease._HELD  # the parent's lease is still its own
    finally:
        lease.release(uri, "run-of-the-parent")

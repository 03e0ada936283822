"""`asolab run` on bad input: one line `asolab: error: ...` on stderr, exit status 2,
nothing recorded."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from asolab.cli import main


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "search.cycles=abc"], ["search.cycles", "integer", "[1, 1000]"]),
        (["--set", "mutation.strength=2"], ["mutation.strength", "out of range", "[0.0, 1.0]"]),
        (["--set", "search.weight_lr=nan"], ["search.weight_lr", "finite"]),
        (["--set", "search.cyclez=3"], ["search.cyclez", "unknown key", "cycles"]),
        (["no_such_experiment"], ["no_such_experiment", "known experiments", "digits"]),
        (
            ["--set", "data.name=fashion_mnist", "--set", "data.data_dir=/nonexistent"],
            ["fashion_mnist", "/nonexistent", "apt-get install"],
        ),
        (
            ["--set", "data.name=cifar10", "--set", "data.data_dir=/nonexistent"],
            ["cifar10", "download = true"],
        ),
    ],
)
def test_bad_run_input_is_one_error_line_and_status_2(args, words, capsys, tmp_path):
    store = tmp_path / "mlflow.db"
    rc = main(["run", "--quiet", "--set", f"tracking.tracking_uri=sqlite:///{store}", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("asolab: error: ") and "\n" not in err, err
    for word in words:
        assert word in err, (word, err)
    if store.exists():  # the store may have been opened to check it; no run was started in it
        client = MlflowClient(f"sqlite:///{store}")
        experiments = [e.experiment_id for e in client.search_experiments()]
        assert client.search_runs(experiments) == []


def test_browse_hint_names_a_store_that_asolab_ui_would_not_find(monkeypatch):
    from asolab.cli import ui_command
    from asolab.tracking.store import default_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert ui_command(default_tracking_uri()) == "asolab ui"
    assert (
        ui_command("sqlite:////tmp/my store/mlflow.db")
        == "asolab ui --tracking-uri 'sqlite:////tmp/my store/mlflow.db'"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert ui_command("http://127.0.0.1:5000") == "asolab ui"


def test_help_loads_no_torch_nor_mlflow():
    """``asolab --help`` (and a command's help that lists no registries) answers at
    once: torch, mlflow and pandas load only with the commands that need them."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from asolab.cli import main\n"
        "for argv in (['--help'], ['compare', '--help'], ['ui', '--help'], ['study', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('torch', 'mlflow', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
    assert "usage: asolab" in out.stdout


_CONSOLE = """
import atexit, sys
from asolab import cli

class Teardown:
    def __del__(self):
        print("teardown", flush=True)

keep = Teardown()  # freed by the interpreter's teardown only

def command(argv=None):
    atexit.register(print, "handler", flush=True)  # as a library registers one mid-command
    print("output")  # block-buffered into the pipe: only the exit flushes it
    {last}

cli.main = command
cli.console()
"""


@pytest.mark.parametrize(
    "last, status, out",
    [
        ("return 3", 3, ["output", "handler"]),
        ("raise SystemExit(0)", 0, ["output", "handler"]),  # argparse's --help and --version
        # an uncaught exception exits as Python does, its traceback printed
        ("raise RuntimeError('bug')", 1, ["output", "handler", "teardown"]),
    ],
)
def test_the_asolab_command_ends_after_every_exit_handler_without_the_teardown(last, status, out):
    """The console script (``asolab``) flushes the output and runs every exit handler
    registered during the command, then ends without freeing the interpreter's objects
    (1.7 s after a tiny run: bench/exit_cost.py), with the command's status."""
    import subprocess
    import sys

    code = _CONSOLE.format(last=last)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert proc.stdout.split() == out, proc.stdout
    assert ("RuntimeError: bug" in proc.stderr) == (status == 1), proc.stderr[-2000:]


def test_python_m_asolab_is_the_asolab_command():
    """``python -m asolab`` (how study workers start) is the console script: same parser,
    same exit (a usage error: one line, status 2)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "asolab", "nonesuch"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("asolab: error: argument command: invalid choice: 'nonesuch'")
    code = (
        "import runpy, asolab.cli as c\n"
        "c.console = lambda: print('console')\n"
        "runpy.run_module('asolab')"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        == "console\n"
    )


def test_every_commands_help_reads_as_written(capsys):
    """Each command's ``--help`` as a user sees it: argparse %-formats help strings but
    not descriptions, so a "%%" written for one shows doubled in the other."""
    import argparse

    from asolab.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) >= {"run", "study", "ui", "compare", "baseline", "rank"}
    for name, sub in commands.choices.items():
        text = sub.format_help()
        assert "%%" not in text and "%(" not in text, name
    assert "+-10%)" in commands.choices["baseline"].format_help()

"""What a run shows while it runs: progress from Python (a terminal, a notebook)."""

from __future__ import annotations

from conftest import ONE_CYCLE

import asolab
from asolab import progress

SMALL = {**ONE_CYCLE, "data.train_subset": 100}


def test_a_run_from_python_shows_progress_and_its_summary_and_is_silent_when_asked(capsys):
    asolab.run("digits", SMALL, track=False, progress=True)
    out, err = capsys.readouterr()
    assert out == ""  # bars, lines and the summary on stderr, as tqdm writes
    assert "asolab: digits on digits (" in err  # the banner
    assert "W-training 1: 100%" in err and "alpha-training 1: 100%" in err  # the bars
    for row in ("final genotype", "validation accuracy", "test accuracy", "wall time (s)"):
        assert row in err, err
    asolab.run("digits", SMALL, track=False, progress=False)
    assert capsys.readouterr() == ("", "")


def test_progress_is_on_by_default_where_a_terminal_or_a_notebook_looks(monkeypatch):
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Tty())
    assert progress.attached() == "terminal"
    monkeypatch.setattr("sys.stderr", open("/dev/null", "w"))
    assert progress.attached() == ""

    class ZMQInteractiveShell:  # what a Jupyter kernel's get_ipython() returns
        pass

    class IPython:
        @staticmethod
        def get_ipython():
            return ZMQInteractiveShell()

    monkeypatch.setitem(__import__("sys").modules, "IPython", IPython)
    assert progress.attached() == "notebook"
    from tqdm.auto import tqdm as auto

    assert progress.ProgressObserver(notebook=True)._bars is auto

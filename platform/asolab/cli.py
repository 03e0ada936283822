"""Command line: ``asolab run | study | compare | ui | baseline | rank``.

Every known failure (bad config, missing data set, corrupt checkpoint,
unreachable tracking server, a diverging loss) ends with one line on stderr,
``asolab: error: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from . import threads as _threads
from .options import add_quiet, add_set

# Before anything imports torch: OpenMP reads its wait policy once, when torch loads it.
_threads.prepare_environment()

from .api import forced_threads, resume_command
from .baseline.cli import add_baseline as _add_baseline
from .baseline.cli import add_rank as _add_rank
from .compare.cli import add_parser as _add_compare
from .config import DEFAULT_EXPERIMENT, ConfigError
from .interrupt import RunStopped, Terminated
from .plugins import PluginError
from .study.cli import add_parser as _add_study
from .tracking.store import TrackingError

log = logging.getLogger("asolab")

# FloatingPointError: the runner's "loss became nan" (lower a learning rate), not a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    TrackingError,
    FloatingPointError,
    PluginError,
)
# ... and these, named by module: their modules import torch, which the CLI loads only
# for the commands that need it (``asolab --help`` stays fast); an error of one can only
# come from a module that is loaded.
LAZY_USER_ERRORS = (
    ("asolab.data.core", "DataError"),
    ("asolab.runner.checkpoint", "CheckpointError"),
)


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors that are the user's to fix: one line and exit status 2."""
    loaded = (sys.modules.get(module) for module, _ in LAZY_USER_ERRORS)
    return USER_ERRORS + tuple(
        getattr(m, name) for m, (_, name) in zip(loaded, LAZY_USER_ERRORS) if m is not None
    )


_forced_threads = forced_threads  # the name tests and scripts know

__all__ = ["main", "resume_command"]


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run ASO-SE evolution cycles for an experiment file")
    p.add_argument(
        "file",
        nargs="?",
        help=(
            "experiment TOML (default: experiments/digits.toml); a bare name looks in experiments/"
        ),
    )
    add_set(p)
    add_quiet(p)
    p.add_argument(
        "--no-track",
        action="store_true",
        help="do not record the run in MLflow (same as --set tracking.enabled=false)",
    )
    p.add_argument(
        "--experiment",
        default=None,
        metavar="NAME",
        help="MLflow experiment (default: tracking.experiment, else the file's name)",
    )
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID",
        help=(
            "continue this MLflow run (its id, an id prefix or its name) from its last "
            "checkpoint (give the FILE / tracking URI it was started with; the run keeps its "
            "own config)"
        ),
    )
    p.add_argument(
        "--force",
        action="store_true",
        help=(
            "with --resume: resume even though the run's lease says another machine's process "
            "still runs it (only when that process is really gone)"
        ),
    )
    p.set_defaults(func=cmd_run)
    plain_help = p.format_help
    # The registries are read when help is asked for, not when the parser is built
    # (reading plugins' entry points costs time every other command would pay).
    p.format_help = lambda: plain_help() + "\n" + registered_names() + "\n"  # type: ignore[method-assign]


def registered_names() -> str:
    """The values ``data.name`` and ``space.primitives`` take here, plugins marked."""
    from .data import REGISTRY
    from .space.ops import OPS

    def listed(registry) -> str:
        names = []
        for name in registry:
            origin = registry.origin(name)
            names.append(name if origin.kind == "built-in" else f"{name} ({origin})")
        return ", ".join(names)

    return (
        f"data sets (data.name): {listed(REGISTRY)}\n"
        f"ops (space.primitives): {listed(OPS)}\n"
        "plugins add more: docs/python-api.md#plugins"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from . import api
    from .progress import ProgressObserver, summary_table
    from .runner.events import Recorder

    if args.resume is not None and not args.resume.strip():
        raise ConfigError("--resume needs the id of the MLflow run to continue (it was empty)")
    recorder = Recorder()
    try:
        result = api.run(
            args.file or DEFAULT_EXPERIMENT,
            args.overrides,
            track=not args.no_track,
            mlflow_experiment=args.experiment,
            resume=args.resume,
            observers=[ProgressObserver(enabled=not args.quiet), recorder],
            force=args.force,
            hint_file=args.file,
            progress=False,  # its own bars above, and its summary below, with the links
        )
    except RunStopped as exc:  # main says it was interrupted and exits with exc.status
        say(f"asolab: {exc}")
        raise
    end = recorder.of("run_end")[-1]
    if result.run_id is None:
        print(summary_table(end))
        return 0
    uri = result.tracking_uri or ""
    print(summary_table(end, {"MLflow run": result.run_id, "tracking store": uri}))
    print(f"browse it: {ui_command(uri)}   (run {result.run_id})")
    if result.experiment_id:
        from .tracking.browse import DEFAULT_UI, run_url, runs_url

        print(f"  this run:   {run_url(DEFAULT_UI, result.experiment_id, result.run_id)}")
        print(f"  all runs:   {runs_url(DEFAULT_UI, result.experiment_id)}")
    return 0


def _add_ui(sub: argparse._SubParsersAction) -> None:
    from .tracking.ui import add_ui

    add_ui(sub)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_run,
    _add_compare,
    _add_ui,
    _add_study,
    _add_baseline,
    _add_rank,
]


class _Parser(argparse.ArgumentParser):
    """argparse with asolab's one-line errors (``asolab: error: ...``, exit status 2)
    instead of a usage block; its subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        # "asolab study" -> "asolab: error: study: ..."; the top parser adds no second "asolab"
        where = self.prog.removeprefix("asolab").strip()
        prefix = f"{where}: " if where else ""
        self.exit(2, f"asolab: error: {prefix}{message}; see {self.prog} --help\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """Unknown arguments are the subcommand's (argparse reports them at the top)."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(ns, "command", None)
            message = f"unrecognized arguments: {' '.join(extra)}"
            if command:
                self.exit(2, f"asolab: error: {command}: {message}; see asolab {command} --help\n")
            self.error(message)
        return ns


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="asolab", description="ASO-SE neural architecture evolution with MLflow and Optuna"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def ui_command(uri: str) -> str:
    """The ``asolab ui`` command that serves ``uri`` (the store ``asolab ui`` finds by itself
    needs no flag)."""
    from .tracking.store import resolve_tracking_uri

    return (
        "asolab ui"
        if uri == resolve_tracking_uri()
        else f"asolab ui --tracking-uri {shlex.quote(uri)}"
    )


def say(line: str) -> None:
    """A line on stderr; where stderr is gone (a pipe whose reader died with the same
    Ctrl-C), nothing, and later writes go nowhere instead of failing (the run's hint is
    in the run too: its ``asolab.resume_command`` tag and description)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
        _silence()


def _silence() -> None:
    """Point stdout and stderr at /dev/null: the interpreter's last flush of a broken pipe
    would otherwise fail and change the exit status."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # a stream without a file descriptor (a test's capture)
            continue
    os.close(devnull)


# The status when the output's reader closed the pipe early, without a traceback: that of
# a tool the closed pipe killed (128 + SIGPIPE), as the shell reports it
PIPE_CLOSED = 141


def _reader_gone(stream: object) -> bool:
    """Whether ``stream`` is a pipe whose reader closed it (POLLERR on its write end)."""
    import select

    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's capture), closed
        return False
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _store_failure(exc: Exception, args: argparse.Namespace) -> Exception | None:
    """The one-line error for a full, read-only or corrupt store (None for other errors)."""
    from .tracking.health import store_failure
    from .tracking.store import resolve_tracking_uri

    return store_failure(exc, resolve_tracking_uri(getattr(args, "tracking_uri", "") or ""))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from .tracking.environment import quiet_mlflow
    from .tracking.health import quiet_db_errors

    quiet_db_errors(args.verbose)
    try:
        with quiet_mlflow():  # MLflow's download bars would bury the command's own output
            return args.func(args)
    except Exception as exc:  # a store that is full, read-only or corrupt, wherever it shows
        if isinstance(exc, user_errors()):
            say(f"asolab: error: {exc}")
            return 2
        if isinstance(exc, BrokenPipeError) and _reader_gone(sys.stdout):
            _silence()  # `asolab compare | head`: the reader had what it wanted
            return PIPE_CLOSED
        failure = _store_failure(exc, args)
        if failure is None:
            raise
        say(f"asolab: error: {failure}")
        return 2
    except KeyboardInterrupt as exc:
        say("asolab: interrupted; everything recorded so far is kept")
        return exc.status if isinstance(exc, (Terminated, RunStopped)) else 130


# The status the process ends with once every exit handler has run (None: a normal exit)
_status: list[int | None] = [None]


def console() -> NoReturn:
    """The ``asolab`` command (the console script): :func:`main`, then an exit without the
    interpreter's teardown.

    A normal exit frees every module and object of torch, MLflow and Optuna one by one,
    with everything already recorded: 1.7 s of a tiny tracked ``asolab run``'s 11.7 s on
    2 cores of an Intel Xeon (``bench/exit_cost.py``). So :func:`_exit_now`, registered first and
    hence run last, ends the process once the exit has done the rest as usual: threads
    joined, then every handler registered while the command ran (MLflow's,
    multiprocessing's, temporary folders', asolab's own). An uncaught exception exits
    normally, with its traceback.
    """
    atexit.register(_exit_now)
    try:
        status = main()
    except SystemExit as exc:  # argparse: --help (0), a usage error (2)
        if exc.code is None or isinstance(exc.code, int):
            _status[0] = exc.code or 0
        raise
    _status[0] = status
    sys.exit(status)


def _exit_now() -> None:
    """The last exit handler: flush what was written and end the process (see
    :func:`console`). Logging registered its handler before this one, so it is shut down
    here. A flush into a pipe whose reader is gone gives :data:`PIPE_CLOSED`, another
    failed flush 120, as Python's own exit does."""
    status = _status[0]
    if status is None:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None without a console (pythonw)
                stream.flush()
        except BrokenPipeError:  # `asolab compare | head`, its last lines
            status = status or PIPE_CLOSED
        except (OSError, ValueError):
            status = status or 120
    os._exit(status & 0xFF)


if __name__ == "__main__":
    sys.exit(main())

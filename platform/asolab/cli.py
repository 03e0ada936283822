"""Command line: ``asolab run | study | compare | ui | baseline | rank``.

Every known failure (bad config, missing data set, corrupt checkpoint,
unreachable tracking server, a diverging loss) ends with one line on stderr,
``asolab: error: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from . import threads as _threads

# Before anything imports torch: OpenMP reads its wait policy once, when torch loads it.
_threads.prepare_environment()

from .baseline.cli import add_baseline as _add_baseline
from .baseline.cli import add_rank as _add_rank
from .compare.cli import add_parser as _add_compare
from .config import ConfigError, load
from .data import DataError
from .interrupt import Terminated, sigterm_as_interrupt
from .runner.checkpoint import CheckpointError, CheckpointWriteError
from .study.cli import add_parser as _add_study
from .tracking.store import TrackingError

log = logging.getLogger("asolab")

# FloatingPointError: the runner's "loss became nan" (lower a learning rate), not a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    DataError,
    CheckpointError,
    TrackingError,
    FloatingPointError,
)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run ASO-SE evolution cycles for an experiment file")
    p.add_argument(
        "file",
        nargs="?",
        help=(
            "experiment TOML (default: experiments/digits.toml); a bare name looks in experiments/"
        ),
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
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


def cmd_run(args: argparse.Namespace) -> int:
    from .progress import ProgressObserver, summary_table
    from .runner import Runner
    from .runner.events import Recorder

    if args.resume is not None and not args.resume.strip():
        raise ConfigError("--resume needs the id of the MLflow run to continue (it was empty)")
    cfg = load(args.file, args.overrides)
    recorder = Recorder()
    observers: list = [ProgressObserver(enabled=not args.quiet), recorder]
    if not (cfg.tracking.enabled and not args.no_track):
        if args.resume is not None:
            raise ConfigError(
                "--resume needs tracking (the checkpoint lives in the MLflow run); drop --no-track"
            )
        Runner(cfg, observers).run()
        print(summary_table(recorder.of("run_end")[-1]))
        return 0
    return _run_tracked(cfg, args, observers, recorder)


def _run_tracked(cfg, args: argparse.Namespace, observers: list, recorder) -> int:
    """A run recorded in MLflow, checkpointed as it goes (so it can be resumed)."""
    from .progress import summary_table
    from .runner import Runner
    from .runner.checkpoint import local_folder
    from .tracking import MlflowTracker, check_reachable, resolve_tracking_uri

    # On --resume the file and --set only say where the run is (tracking.tracking_uri);
    # the run itself continues with the config stored in its checkpoint.
    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    if args.resume:
        _warn_ignored_overrides(args.overrides)
    check_reachable(uri)  # before any training: a wrong URI costs seconds, not a run
    tracker = MlflowTracker(
        tracking_uri=uri, experiment=args.experiment, log_models=cfg.tracking.log_models
    )
    with local_folder() as workdir:  # removed however the run ends
        try:
            if args.resume:
                tracker.resume_run_id = args.resume = _hold(uri, args)
                forced = _forced_threads(args.overrides)
                runner = _resumed_runner(uri, args.resume, [*observers, tracker], workdir, forced)
            else:
                runner = Runner(cfg, [*observers, tracker], checkpoint_dir=workdir)
            with sigterm_as_interrupt():
                runner.run()
        except KeyboardInterrupt:
            if tracker.run_id:
                _stopped(tracker, resume_command(args.file, tracker.run_id, uri))
            raise
        except Exception as exc:  # a full, read-only or corrupt store: one line, no traceback
            raise _one_line_failure(exc, uri, tracker, args.file) from None
    print(
        summary_table(
            recorder.of("run_end")[-1], {"MLflow run": tracker.run_id, "tracking store": uri}
        )
    )
    print(f"browse it: {ui_command(uri)}   (run {tracker.run_id})")
    if tracker.experiment_id and tracker.run_id:
        from .tracking.browse import DEFAULT_UI, run_url, runs_url

        print(f"  this run:   {run_url(DEFAULT_UI, tracker.experiment_id, tracker.run_id)}")
        print(f"  all runs:   {runs_url(DEFAULT_UI, tracker.experiment_id)}")
    return 0


def _one_line_failure(exc: Exception, uri: str, tracker, file: str | None) -> Exception:
    """What a run that failed ends with: for a full, read-only or corrupt store, or a full
    temp folder, one line with the fix and the command that continues the run; any other
    error as it is."""
    from .tracking.health import store_failure

    failure = exc if isinstance(exc, CheckpointWriteError) else store_failure(exc, uri)
    if failure is None:
        return exc
    if tracker.run_id:
        failure.args = (
            f"{failure}; run {tracker.run_id} stopped, continue it then with: "
            f"{resume_command(file, tracker.run_id, uri)}",
        )
    return failure


def _hold(uri: str, args: argparse.Namespace) -> str:
    """The full id of the run --resume names, held by this process from here on (another
    process cannot resume it at the same time); refused while another one runs it."""
    from .tracking import lease
    from .tracking.store import client, resumable_run

    # An id prefix or a run name names the run too; everything below uses the full id.
    run = resumable_run(client(uri), uri, args.resume)
    lease.take(uri, run.info.run_id, run, force=args.force)
    return run.info.run_id


def _stopped(tracker, command: str) -> None:
    """A stopped run's last words: the command that continues it, in the run (its tag
    and description, which outlive a terminal or a pipe that is gone) and on stderr."""
    from .tracking import layout as L

    note = f"Stopped before its end; continue it with:\n\n    {command}\n"
    try:
        tracker.client.set_tag(tracker.run_id, L.TAG_RESUME_COMMAND, command)
        tracker.client.set_tag(tracker.run_id, L.TAG_NOTE, note)
    except Exception as exc:  # the store may be what stopped the run; the hint still prints
        log.debug("could not record the resume command in run %s: %s", tracker.run_id, exc)
    say(f"asolab: run {tracker.run_id} stopped; continue it with: {command}")


def say(line: str) -> None:
    """A line on stderr, on a line of its own; where stderr is gone (a pipe whose reader
    died with the same Ctrl-C), nothing, and further writes go nowhere instead of failing."""
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


def _resumed_runner(uri: str, run_id: str, observers: list, workdir, threads: int = 0):
    """The runner that continues ``run_id``: from its checkpoint, or, for a run stopped
    before its first checkpoint, from the start with the config it recorded (the
    same MLflow run; steps it already logged are not written twice).

    A run that can never continue (its checkpoint is unreadable, or it stopped
    before it recorded even its config) is ended FAILED with the reason, instead
    of staying RUNNING for good, and the reason is the one-line error. ``threads``
    forces a thread count (0 = the run's own).
    """
    from .config import from_dict
    from .runner import Runner
    from .tracking import layout as L
    from .tracking.store import client, download_checkpoint, mark_failed, recorded_config

    path = download_checkpoint(uri, run_id, workdir / "resume")
    recorded_hash = client(uri).get_run(run_id).data.tags.get(L.TAG_CONFIG_HASH, "")
    try:
        if path is None:
            data = recorded_config(uri, run_id, workdir / "resume")
            if data is None:
                raise CheckpointError(
                    f"run {run_id} in {uri} stopped before it recorded its config or a checkpoint; "
                    "there is nothing to continue: start a new run"
                )
            log.warning("run %s has no checkpoint yet: it starts again from epoch 0", run_id)
            cfg = from_dict(data, source=f"the config recorded by run {run_id}")
            return Runner(
                cfg.replace(threads=threads) if threads else cfg, observers, checkpoint_dir=workdir
            )
        label = f"the checkpoint of run {run_id} in {uri}"
        return Runner.resume(
            path,
            observers,
            checkpoint_dir=workdir,
            label=label,
            threads=threads,
            owner=(run_id, recorded_hash),
        )
    except CheckpointError as exc:  # not a ConfigError: a device missing here may exist elsewhere
        mark_failed(uri, run_id, str(exc))
        raise


def resume_command(file: str | None, run_id: str, uri: str) -> str:
    """The command that continues ``run_id``: the same experiment file, and the
    store spelled out unless it is the default, so that it is found again
    whatever the environment (MLFLOW_TRACKING_URI) of the next shell."""
    from .tracking import default_tracking_uri

    parts = ["asolab", "run", *([file] if file else []), "--resume", run_id]
    if uri != default_tracking_uri():
        parts += ["--set", f"tracking.tracking_uri={uri}"]
    return shlex.join(parts)


def _forced_threads(overrides: list[str]) -> int:
    """``--set threads=N`` on ``--resume``: the one setting besides tracking.* that a
    resume takes (0 = keep the run's own count)."""
    values = [
        o.split("=", 1)[1]
        for o in overrides
        if o.split("=", 1)[0].strip() == "threads" and "=" in o
    ]
    if not values:
        return 0
    try:
        threads = int(values[-1])
    except ValueError:
        raise ConfigError(f"--set threads={values[-1]}: threads must be a whole number") from None
    if not 0 <= threads <= 1024:
        raise ConfigError(f"--set threads={threads}: threads must be between 0 and 1024")
    return threads


def _warn_ignored_overrides(overrides: list[str]) -> None:
    ignored = [
        o
        for o in overrides
        if not (o.strip().startswith("tracking.") or o.split("=", 1)[0].strip() == "threads")
    ]
    if ignored:
        log.warning(
            "--resume continues the run with the config in its checkpoint; ignoring %s",
            ", ".join(ignored),
        )


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
        self.exit(2, f"asolab: error: {self.prog}: {message}; see {self.prog} --help\n")


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
    from .tracking.health import quiet_db_errors

    quiet_db_errors(args.verbose)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        say(f"asolab: error: {exc}")
        return 2
    except Exception as exc:  # a store that is full, read-only or corrupt, wherever it shows
        failure = _store_failure(exc, args)
        if failure is None:
            raise
        say(f"asolab: error: {failure}")
        return 2
    except KeyboardInterrupt as exc:
        say("asolab: interrupted; everything recorded so far is kept")
        return 143 if isinstance(exc, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())

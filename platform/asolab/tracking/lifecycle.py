"""A tracked run from start to end: hold the run a resume continues (its lease), rebuild
its runner from the stored checkpoint, run it recorded in MLflow, and end it right when
it stops early (the command that continues it, recorded in the run and carried by the
error) or when the store fails (one line with the fix).

``asolab.run`` (api.py) is a thin facade over :func:`run_tracked`.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ExperimentConfig
from ..interrupt import RunStopped, Terminated, sigterm_as_interrupt
from ..runner.memory import MemoryLimitError

if TYPE_CHECKING:  # pragma: no cover
    from ..runner import Runner, RunResult
    from ..runner.events import Observer
    from .mlflow_tracker import MlflowTracker

log = logging.getLogger(__name__)


class RunOutOfMemory(MemoryLimitError):
    """A tracked run that ran out of memory in a phase: one line naming what to lower and
    the command that continues the run from its last checkpoint."""

    def __init__(self, error: MemoryLimitError, run_id: str, tracking_uri: str, command: str):
        super().__init__(f"{error}; then continue it with: {command}")
        self.run_id, self.tracking_uri, self.command = run_id, tracking_uri, command


@dataclass(frozen=True)
class TrackedRun:
    """What :func:`run_tracked` returns: the runner's result, the run and its config."""

    result: RunResult
    run_id: str | None
    experiment_id: str | None
    tracking_uri: str
    config: ExperimentConfig


def run_tracked(
    cfg: ExperimentConfig,
    observers: Sequence[Observer],
    mlflow_experiment: str | None,
    resume: str | None,
    *,
    threads: int = 0,
    force: bool = False,
    hint_file: str | None = None,
) -> TrackedRun:
    """A run recorded in MLflow, checkpointed as it goes (so it can be resumed): a new one
    of ``cfg``, or ``resume`` (an id, id prefix or name) continued from its checkpoint
    with ``threads`` forced (0: its own). ``hint_file`` is the experiment file that the
    recorded resume command names."""
    from ..runner import Runner
    from ..runner.checkpoint import local_folder
    from . import MlflowTracker, check_reachable, resolve_tracking_uri

    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    check_reachable(uri)  # before any training: a wrong URI costs seconds, not a run
    tracker = MlflowTracker(
        tracking_uri=uri, experiment=mlflow_experiment, log_models=cfg.tracking.log_models
    )
    with local_folder() as workdir:  # removed however the run ends
        try:
            if resume:
                tracker.resume_run_id = resume = hold(uri, resume, force)
                runner = resumed_runner(uri, resume, [*observers, tracker], workdir, threads)
            else:
                runner = Runner(cfg, [*observers, tracker], checkpoint_dir=workdir)
            with sigterm_as_interrupt():
                result = runner.run()
        except (KeyboardInterrupt, MemoryLimitError) as exc:
            # Ctrl-C, or out of memory in a phase: the checkpoints are kept.
            if not tracker.run_id:  # stopped before the run was created: nothing to continue
                raise
            raise _stopped(exc, tracker, tracker.run_id, uri, hint_file) from exc
        except Exception as exc:  # a full, read-only or corrupt store: one line, no traceback
            raise one_line_failure(exc, uri, tracker, hint_file) from None
    return TrackedRun(result, tracker.run_id, tracker.experiment_id, uri, runner.cfg)


def _stopped(
    exc: KeyboardInterrupt | MemoryLimitError,
    tracker: MlflowTracker,
    run_id: str,
    uri: str,
    file: str | None,
) -> BaseException:
    """What run ``run_id``, stopped by ``exc``, ends with: the command that continues it,
    recorded in the run and carried by the error."""
    command = resume_command(file, run_id, uri)
    record_stop(tracker, command)
    if isinstance(exc, MemoryLimitError):
        return RunOutOfMemory(exc, run_id, uri, command)
    return RunStopped(run_id, uri, command, exc.status if isinstance(exc, Terminated) else 130)


def hold(uri: str, resume: str, force: bool) -> str:
    """The full id of the run to resume, held by this process from here on (another
    process cannot run it at the same time); refused while another one runs it."""
    from . import lease
    from .store import client, resumable_run

    # An id prefix or a run name names the run too; everything below uses the full id.
    run = resumable_run(client(uri), uri, resume)
    lease.take(uri, run.info.run_id, run, force=force)
    return run.info.run_id


def record_stop(tracker: MlflowTracker, command: str) -> None:
    """A stopped run keeps the command that continues it (its ``asolab.resume_command``
    tag and its description): a terminal or a pipe that is gone loses the printed one."""
    from . import layout as L

    note = f"Stopped before its end; continue it with:\n\n    {command}\n"
    try:
        tracker.client.set_tag(tracker.run_id, L.TAG_RESUME_COMMAND, command)
        tracker.client.set_tag(tracker.run_id, L.TAG_NOTE, note)
    except Exception as exc:  # the store may be what stopped the run; the hint still prints
        log.debug("could not record the resume command in run %s: %s", tracker.run_id, exc)


def one_line_failure(
    exc: Exception, uri: str, tracker: MlflowTracker, file: str | None
) -> Exception:
    """What a failed run ends with: for a full, read-only or corrupt store, or a full temp
    folder, one line with the fix and the command that continues the run; else ``exc``."""
    from ..runner.checkpoint import CheckpointWriteError
    from .health import store_failure

    failure = exc if isinstance(exc, CheckpointWriteError) else store_failure(exc, uri)
    if failure is None:
        return exc
    if tracker.run_id:
        failure.args = (
            f"{failure}; run {tracker.run_id} stopped, continue it then with: "
            f"{resume_command(file, tracker.run_id, uri)}",
        )
    return failure


def resumed_runner(
    uri: str, run_id: str, observers: list, workdir: Path, threads: int = 0
) -> Runner:
    """The runner that continues ``run_id``: from its checkpoint, or, for a run stopped
    before its first checkpoint, from the start with the config it recorded (the
    same MLflow run; steps it already logged are not written twice).

    A run that can never continue (its checkpoint is unreadable, or it stopped
    before it recorded even its config) is ended FAILED with the reason, instead
    of staying RUNNING for good, and the reason is the one-line error. ``threads``
    forces a thread count (0 = the run's own).
    """
    from ..config import from_dict
    from ..runner import Runner
    from ..runner.checkpoint import CheckpointError
    from . import layout as L
    from .store import client, download_checkpoint, mark_failed, recorded_config

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
    from .store import default_tracking_uri

    parts = ["asolab", "run", *([file] if file else []), "--resume", run_id]
    if uri != default_tracking_uri():
        parts += ["--set", f"tracking.tracking_uri={uri}"]
    return shlex.join(parts)

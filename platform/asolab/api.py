"""The Python API: what ``asolab run`` and ``asolab compare`` do, callable from code.

``asolab/__init__.py`` exposes these names lazily (so ``import asolab`` loads
neither torch nor mlflow); the CLI is a thin layer over them. See
docs/python-api.md for a walk-through.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import ConfigError, ExperimentConfig, apply_overrides, load, parse_override
from .errors import text_arg as _text_arg
from .errors import wrong as _wrong
from .interrupt import sigterm_as_interrupt

if TYPE_CHECKING:
    import pandas as pd

    from .runner.events import Observer
    from .space.genotype import Genotype
    from .tracking.predictor import Predictor

log = logging.getLogger(__name__)

Overrides = Mapping[str, Any] | Sequence[str] | None
Experiment = str | Path | ExperimentConfig


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` produced: the MLflow run and the final network's numbers."""

    run_id: str | None  # the MLflow run (None when not tracked)
    genotype: Genotype  # the final genotype; str() gives the canonical string
    val_acc: float  # the final network's validation accuracy
    test_acc: float  # its test accuracy (reported, never optimised)
    params: int  # the final network's parameter count
    seconds: float
    tracking_uri: str | None  # the store the run is in (None when not tracked)
    config: ExperimentConfig  # the resolved config the run used
    experiment_id: str | None = None  # the MLflow experiment (None when not tracked)


def load_config(
    experiment: Experiment = "digits",
    overrides: Overrides = None,
    *,
    fn: str = "asolab.load_config",
) -> ExperimentConfig:
    """An experiment config, validated: a shipped name (``"digits"``), a TOML path, or a
    config, with ``overrides`` (``{"search.cycles": 1}`` or ``["search.cycles=1"]``).
    (``fn``: the function an error names.)"""
    if isinstance(experiment, ExperimentConfig):
        return apply_overrides(experiment, _pairs(overrides, fn)) if overrides else experiment
    if not isinstance(experiment, (str, os.PathLike)) or not str(experiment).strip():
        raise _wrong(fn, "experiment", experiment, _EXPERIMENT_TAKES)
    return load(experiment, _pairs(overrides, fn) if overrides else ())


_URI = "a tracking URI ('sqlite:///mlruns/mlflow.db', 'http://host:5000')"
_EXPERIMENT_TAKES = "a shipped experiment name ('digits'), a TOML path or an ExperimentConfig"
_OVERRIDES_TAKES = (
    "a mapping or a list of 'key=value' strings ({'search.cycles': 1} or ['search.cycles=1'])"
)


def _pairs(overrides: Overrides, fn: str = "asolab.run") -> dict[str, Any]:
    if overrides is None or (isinstance(overrides, (Mapping, list, tuple)) and not overrides):
        return {}
    if isinstance(overrides, Mapping):
        if not all(isinstance(k, str) for k in overrides):
            raise _wrong(fn, "overrides", overrides, _OVERRIDES_TAKES + " (keys as text)")
        return dict(overrides)
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise _wrong(fn, "overrides", overrides, _OVERRIDES_TAKES)
    return dict(parse_override(o) for o in overrides)


def run(
    experiment: Experiment = "digits",
    overrides: Overrides = None,
    tracking_uri: str | None = None,
    *,
    track: bool = True,
    mlflow_experiment: str | None = None,
    resume: str | None = None,
    observers: Sequence[Observer] = (),
    force: bool = False,
    hint_file: str | None = None,
) -> RunResult:
    """Run one experiment (as ``asolab run`` does) and return its result.

    ``experiment``: a shipped name, a TOML path or an :class:`ExperimentConfig`;
    ``overrides``: ``{"search.cycles": 1}``; ``tracking_uri``: the MLflow store (default:
    ``tracking.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``./mlruns``);
    ``track=False`` records nothing; ``mlflow_experiment``: the MLflow experiment
    (default ``tracking.experiment``, else the config's name); ``resume``: continue
    that run (id, id prefix or name) from its last checkpoint with its own config;
    ``observers``: extra run observers (progress bars, recorders); ``force``: resume
    even though the run's lease names a process on another machine (it is gone);
    ``hint_file``: the experiment file the recorded resume command names (the CLI's).
    """
    pairs = _pairs(overrides)
    if tracking_uri is not None:
        pairs["tracking.tracking_uri"] = _text_arg("asolab.run", "tracking_uri", tracking_uri, _URI)
    if resume is not None and not isinstance(resume, str):
        raise _wrong("asolab.run", "resume", resume, "a run's id, id prefix or name")
    if resume is not None and not str(resume).strip():
        raise ConfigError("resume needs the id of the MLflow run to continue (it was empty)")
    # On resume the config and overrides only say where the run is (tracking.*) and how
    # many threads it takes; the run continues with the config stored in its checkpoint.
    kept = {k: v for k, v in pairs.items() if not resume or _kept(k)}
    cfg = load_config(experiment, kept, fn="asolab.run")
    if resume:
        _warn_ignored_overrides(pairs)
    if not (cfg.tracking.enabled and track):
        if resume is not None:
            raise ConfigError(
                "resume needs tracking (the checkpoint lives in the MLflow run); drop --no-track"
            )
        from .runner import Runner

        result = Runner(cfg, list(observers)).run()
        return _result(result, None, None, cfg)
    if hint_file is None and isinstance(experiment, (str, Path)) and str(experiment) != "digits":
        hint_file = str(experiment)
    return _run_tracked(
        cfg, pairs, list(observers), mlflow_experiment, resume, force=force, hint_file=hint_file
    )


def _kept(key: str) -> bool:
    """The overrides a resume takes: where the store is, and the thread count."""
    return key.startswith("tracking.") or key == "threads"


def _result(
    result: Any,
    run_id: str | None,
    uri: str | None,
    cfg: ExperimentConfig,
    experiment_id: str | None = None,
) -> RunResult:
    return RunResult(
        run_id=run_id,
        genotype=result.genotype,
        val_acc=float(result.val_acc),
        test_acc=float(result.test_acc),
        params=int(result.derived_params),
        seconds=float(result.seconds),
        tracking_uri=uri,
        config=cfg,
        experiment_id=experiment_id,
    )


def _run_tracked(
    cfg: ExperimentConfig,
    pairs: dict[str, Any],
    observers: list,
    mlflow_experiment: str | None,
    resume: str | None,
    *,
    force: bool = False,
    hint_file: str | None = None,
) -> RunResult:
    """A run recorded in MLflow, checkpointed as it goes (so it can be resumed)."""
    from .runner import Runner
    from .runner.checkpoint import local_folder
    from .runner.memory import MemoryLimitError
    from .tracking import MlflowTracker, check_reachable, resolve_tracking_uri

    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    check_reachable(uri)  # before any training: a wrong URI costs seconds, not a run
    tracker = MlflowTracker(
        tracking_uri=uri, experiment=mlflow_experiment, log_models=cfg.tracking.log_models
    )
    with local_folder() as workdir:  # removed however the run ends
        try:
            if resume:
                tracker.resume_run_id = resume = _hold(uri, resume, force)
                threads = forced_threads(
                    [f"threads={pairs['threads']}"] if "threads" in pairs else []
                )
                runner = resumed_runner(uri, resume, [*observers, tracker], workdir, threads)
            else:
                runner = Runner(cfg, [*observers, tracker], checkpoint_dir=workdir)
            with sigterm_as_interrupt():
                result = runner.run()
        except (KeyboardInterrupt, MemoryLimitError) as exc:
            # Ctrl-C, or out of memory in a phase: the checkpoints are kept. The CLI
            # prints the resume command from these; code gets them on the error.
            exc.asolab_run_id = tracker.run_id  # type: ignore[attr-defined]
            exc.asolab_tracking_uri = uri  # type: ignore[attr-defined]
            if tracker.run_id:
                _record_stop(tracker, resume_command(hint_file, tracker.run_id, uri))
            raise
        except Exception as exc:  # a full, read-only or corrupt store: one line, no traceback
            raise _one_line_failure(exc, uri, tracker, hint_file) from None
    return _result(result, tracker.run_id, uri, runner.cfg, tracker.experiment_id)


def _hold(uri: str, resume: str, force: bool) -> str:
    """The full id of the run to resume, held by this process from here on (another
    process cannot run it at the same time); refused while another one runs it."""
    from .tracking import lease
    from .tracking.store import client, resumable_run

    # An id prefix or a run name names the run too; everything below uses the full id.
    run = resumable_run(client(uri), uri, resume)
    lease.take(uri, run.info.run_id, run, force=force)
    return run.info.run_id


def _record_stop(tracker: Any, command: str) -> None:
    """A stopped run keeps the command that continues it (its ``asolab.resume_command``
    tag and its description): a terminal or a pipe that is gone loses the printed one."""
    from .tracking import layout as L

    note = f"Stopped before its end; continue it with:\n\n    {command}\n"
    try:
        tracker.client.set_tag(tracker.run_id, L.TAG_RESUME_COMMAND, command)
        tracker.client.set_tag(tracker.run_id, L.TAG_NOTE, note)
    except Exception as exc:  # the store may be what stopped the run; the hint still prints
        log.debug("could not record the resume command in run %s: %s", tracker.run_id, exc)


def _one_line_failure(exc: Exception, uri: str, tracker: Any, file: str | None) -> Exception:
    """What a failed run ends with: for a full, read-only or corrupt store, or a full temp
    folder, one line with the fix and the command that continues the run; else ``exc``."""
    from .runner.checkpoint import CheckpointWriteError
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


def resumed_runner(uri: str, run_id: str, observers: list, workdir: Path, threads: int = 0):
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
    from .runner.checkpoint import CheckpointError
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


def forced_threads(overrides: Sequence[str]) -> int:
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


def _warn_ignored_overrides(pairs: Mapping[str, Any]) -> None:
    ignored = [f"{k}={v}" for k, v in pairs.items() if not _kept(k)]
    if ignored:
        log.warning(
            "--resume continues the run with the config in its checkpoint; ignoring %s",
            ", ".join(ignored),
        )


def runs(
    experiment: str | Sequence[str] = (),
    filter: str = "",
    tracking_uri: str | None = None,
    *,
    run_ids: Sequence[str] = (),
    study: str = "",
) -> pd.DataFrame:
    """The compare table (one row per run with a final genotype) of the runs selected
    as ``asolab compare`` selects them: MLflow experiment name(s), an MLflow filter
    string (``"params.data.name = 'folder'"``), run ids, a study."""
    from .compare.opsets import op_set_warning
    from .compare.select import load_selection

    experiments = [experiment] if isinstance(experiment, str) else list(experiment)
    selection = load_selection(
        tracking_uri, experiments=experiments, run_ids=run_ids, filter_string=filter, study=study
    )
    warning = op_set_warning(selection.records)
    if warning:
        log.warning("%s", warning)
    return selection.table()


def load_model(run_id: str, tracking_uri: str | None = None) -> Predictor:
    """The final network of a run (its id, an id prefix or its name) with its
    preprocessing, on the CPU: ``load_model(run).predict(images)`` takes raw images
    (PIL images, uint8 arrays, image files, a folder) and returns class names and
    probabilities; ``.network`` is the ``torch.nn.Module``, ``.params`` its parameter
    count. Built from asolab's own code and the run's spec, genotype and weights
    (tensors only): nothing stored in the run is executed (docs/python-api.md)."""
    from .compare.select import existing_store
    from .tracking.predictor import from_run
    from .tracking.store import RunNotFound, find_run, resolve_tracking_uri, sqlite_path

    fn = "asolab.load_model"
    run_id = _text_arg(fn, "run_id", run_id, "a run's id, id prefix or name")
    uri = resolve_tracking_uri(_text_arg(fn, "tracking_uri", tracking_uri, _URI, optional=True))
    db = sqlite_path(uri)
    if db is not None and not db.is_file():  # the MLflow client would make a new store there
        raise _wrong(fn, "tracking_uri", uri, f"an existing MLflow store; there is none at {db}")
    c = existing_store(uri)
    try:
        run = find_run(c, run_id)
    except RunNotFound as exc:
        raise ConfigError(str(exc)) from None
    return from_run(uri, run)


def register_dataset(name: str, loader: Any, **declared: Any) -> None:
    """Make ``name`` a valid ``data.name`` in this process (docs/plugins.md):
    ``loader(cfg) -> asolab.data.Arrays``; ``num_classes``, ``mean``, ``std``,
    ``augmentation`` may be declared."""
    from .data import register_dataset as _register

    _register(name, loader, **declared)


def register_op(name: str, factory: Any) -> None:
    """Make ``name`` a valid entry of ``space.primitives`` in this process:
    ``factory(channels, stride, affine) -> torch.nn.Module``, checked now."""
    from .space.ops import register_op as _register

    _register(name, factory)

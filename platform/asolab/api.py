"""The Python API: what ``asolab run`` and ``asolab compare`` do, callable from code.

``asolab/__init__.py`` exposes these names lazily (so ``import asolab`` loads
neither torch nor mlflow); the CLI is a thin layer over them. See
docs/python-api.md for a walk-through.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import (
    DEFAULT_EXPERIMENT,
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    load,
    parse_overrides,
)
from .errors import text_arg as _text_arg
from .errors import wrong as _wrong

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
    # how far the alphas moved: their entropy of a uniform choice's at the end (1: not at
    # all; docs/baselines.md, "How far a run's alphas moved")
    alpha_entropy: float = 1.0


def load_config(
    experiment: Experiment = DEFAULT_EXPERIMENT,
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
    return parse_overrides(overrides)


def run(
    experiment: Experiment = DEFAULT_EXPERIMENT,
    overrides: Overrides = None,
    tracking_uri: str | None = None,
    *,
    track: bool = True,
    mlflow_experiment: str | None = None,
    resume: str | None = None,
    observers: Sequence[Observer] = (),
    force: bool = False,
    hint_file: str | None = None,
    progress: bool | None = None,
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
    ``hint_file``: the experiment file the recorded resume command names (the CLI's);
    ``progress``: progress bars (tqdm.auto's in a notebook), the data notes and the
    summary on stderr (default: where a terminal or a notebook is attached; False:
    silent).

    A tracked run stopped by Ctrl-C, SIGTERM or SIGHUP raises ``RunStopped`` (a
    ``KeyboardInterrupt``), one out of memory in a phase ``RunOutOfMemory``; both carry
    ``run_id``, ``tracking_uri`` and ``command``, the command that continues the run
    (tracking/lifecycle.py).
    """
    shown = _progress(progress)
    observers = [*observers, *shown]
    pairs = _run_pairs(overrides, tracking_uri, resume)
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
    if hint_file is None and isinstance(experiment, (str, Path)):
        hint_file = str(experiment) if str(experiment) != DEFAULT_EXPERIMENT else None
    threads = forced_threads(pairs) if resume else 0
    out = _tracked(cfg, observers, mlflow_experiment, resume, threads, force, hint_file)
    for bars in shown:
        bars.say(f"MLflow run {out.run_id} in {out.tracking_uri}")
    return out


def _run_pairs(overrides: Overrides, tracking_uri: str | None, resume: object) -> dict[str, Any]:
    """``asolab.run``'s overrides with its tracking URI, its arguments checked."""
    pairs = _pairs(overrides)
    if tracking_uri is not None:
        pairs["tracking.tracking_uri"] = _text_arg("asolab.run", "tracking_uri", tracking_uri, _URI)
    if resume is not None and not isinstance(resume, str):
        raise _wrong("asolab.run", "resume", resume, "a run's id, id prefix or name")
    if resume is not None and not str(resume).strip():
        raise ConfigError("resume needs the id of the MLflow run to continue (it was empty)")
    return pairs


def _tracked(cfg, observers, mlflow_experiment, resume, threads, force, hint_file) -> RunResult:
    """A run recorded in MLflow (tracking/lifecycle.py), as the API's result."""
    from .tracking.lifecycle import run_tracked

    t = run_tracked(
        cfg, observers, mlflow_experiment, resume, threads=threads, force=force, hint_file=hint_file
    )
    return _result(t.result, t.run_id, t.tracking_uri, t.config, t.experiment_id)


def _progress(progress: bool | None) -> list[Any]:
    """The observer that shows a run from Python: bars, data notes, the summary."""
    from .progress import ProgressObserver, attached

    where = attached()
    if not (progress if progress is not None else bool(where)):
        return []
    return [ProgressObserver(notebook=where == "notebook", summary=True)]


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
        alpha_entropy=float(result.alpha_entropy),
    )


def resume_command(file: str | None, run_id: str, uri: str) -> str:
    """The command that continues ``run_id`` (tracking/lifecycle.py ``resume_command``;
    imported on use, so that the CLI's parser loads no torch)."""
    from .tracking.lifecycle import resume_command as _command

    return _command(file, run_id, uri)


def forced_threads(overrides: Overrides) -> int:
    """``--set threads=N`` on ``--resume``: the one setting besides tracking.* that a
    resume takes (0 = keep the run's own count)."""
    pairs = _pairs(overrides)
    if "threads" not in pairs:
        return 0
    threads = pairs["threads"]
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise ConfigError(f"--set threads={threads}: threads must be a whole number")
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
    from .compare.datanotes import data_warning
    from .compare.opsets import op_set_warning
    from .compare.select import load_selection

    experiments = [experiment] if isinstance(experiment, str) else list(experiment)
    selection = load_selection(
        tracking_uri, experiments=experiments, run_ids=run_ids, filter_string=filter, study=study
    )
    # what the terminal's compare warns of: op sets that differ, data notes of the splits
    for warning in (op_set_warning(selection.records), data_warning(selection.records)):
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
    """Make ``name`` a valid ``data.name`` in this process (docs/python-api.md#plugins):
    ``loader(cfg) -> asolab.data.Arrays``; ``num_classes``, ``mean``, ``std``,
    ``augmentation`` may be declared."""
    from .data import register_dataset as _register

    _register(name, loader, **declared)


def register_op(name: str, factory: Any) -> None:
    """Make ``name`` a valid entry of ``space.primitives`` in this process:
    ``factory(channels, stride, affine) -> torch.nn.Module``, checked now."""
    from .space.ops import register_op as _register

    _register(name, factory)

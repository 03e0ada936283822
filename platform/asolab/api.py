"""The Python API: what ``asolab run`` and ``asolab compare`` do, callable from code.

``asolab/__init__.py`` exposes these names lazily (so ``import asolab`` loads
neither torch nor mlflow); the CLI is a thin layer over them. See
docs/python-api.md for a walk-through.
"""

from __future__ import annotations

import logging
import tempfile
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

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from .runner.events import Observer
    from .space.genotype import Genotype

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
    experiment: Experiment = DEFAULT_EXPERIMENT, overrides: Overrides = None
) -> ExperimentConfig:
    """An experiment config, validated: a shipped name (``"digits"``), a TOML path, or a
    config, with ``overrides`` (``{"search.cycles": 1}`` or ``["search.cycles=1"]``)."""
    if isinstance(experiment, ExperimentConfig):
        pairs = parse_overrides(overrides)
        return apply_overrides(experiment, pairs) if pairs else experiment
    return load(experiment, parse_overrides(overrides))


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
    pairs = parse_overrides(overrides)
    if tracking_uri is not None:
        pairs["tracking.tracking_uri"] = tracking_uri
    if resume is not None and not str(resume).strip():
        raise ConfigError("resume needs the id of the MLflow run to continue (it was empty)")
    # On resume the config and overrides only say where the run is (tracking.*) and how
    # many threads it takes; the run continues with the config stored in its checkpoint.
    cfg = load_config(experiment, {k: v for k, v in pairs.items() if not resume or _kept(k)})
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
    from .tracking.lifecycle import run_tracked

    threads = forced_threads(pairs) if resume else 0
    t = run_tracked(
        cfg, observers, mlflow_experiment, resume, threads=threads, force=force, hint_file=hint_file
    )
    out = _result(t.result, t.run_id, t.tracking_uri, t.config, t.experiment_id)
    for bars in shown:
        bars.say(f"MLflow run {out.run_id} in {out.tracking_uri}")
    return out


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
    )


def resume_command(file: str | None, run_id: str, uri: str) -> str:
    """The command that continues ``run_id`` (tracking/lifecycle.py ``resume_command``;
    imported on use, so that the CLI's parser loads no torch)."""
    from .tracking.lifecycle import resume_command as _command

    return _command(file, run_id, uri)


def forced_threads(overrides: Overrides) -> int:
    """``--set threads=N`` on ``--resume``: the one setting besides tracking.* that a
    resume takes (0 = keep the run's own count)."""
    pairs = parse_overrides(overrides)
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


def load_model(run_id: str, tracking_uri: str | None = None) -> torch.nn.Module:
    """The final network of a run (its id, an id prefix or its name), on the CPU, in eval
    mode. It takes inputs normalised as the run's data were (docs/python-api.md)."""
    import mlflow.artifacts
    import mlflow.pytorch

    from .tracking import layout
    from .tracking.environment import quiet_mlflow
    from .tracking.store import RunNotFound, client, find_run, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri or "")
    c = client(uri)
    try:
        run = find_run(c, run_id)
    except RunNotFound as exc:
        raise ConfigError(str(exc)) from None
    model_uri = run.data.tags.get(layout.TAG_MODEL_URI)
    if not model_uri:
        raise ConfigError(
            f"run {run.info.run_id} has no model (it did not finish, or ran with "
            "tracking.log_models = false)"
        )
    logged = c.get_logged_model(model_uri.removeprefix("models:/"))
    with tempfile.TemporaryDirectory(prefix="asolab-model-") as tmp, quiet_mlflow():
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=logged.artifact_location, dst_path=tmp, tracking_uri=uri
        )
        model = mlflow.pytorch.load_model(local, map_location="cpu")
    return model.eval()


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

"""Running a study: open or resume it, run trials until the budget is met, in one
process or in K worker processes on this machine.

The budget ``n_trials`` counts the study's trials in total (complete, pruned,
failed, running; a stale trial whose parameters were retried counts once), so
re-running the same command resumes the study and only tops it up; ``n_trials``
0 means no limit, and then ``timeout`` (seconds per invocation) must be set.
Workers are ``asolab study --worker`` subprocesses sharing the storage; a worker
that exits non-zero makes the invocation end with :class:`WorkersFailed` after
the parent run recorded what the others did. Each worker gets
``max(1, auto // K)`` torch threads, ``auto`` being the cores left by other
asolab processes (asolab/threads.py). The sampler's seed mixes the study's
``seed`` with the worker index and the number of trials already in the study,
so parallel workers and resumed invocations do not replay the same points,
while a given study state is reproducible.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from ..config import ConfigError
from ..errors import first_line
from ..space.ops import load_ops
from ..threads import auto_threads
from ..tracking.store import mask_password
from . import report
from .config import StudyConfig, check_study_name
from .gpus import assign_gpus, study_gpus, worker_env
from .objective import TrialContext, run_trial
from .storage import (
    ATTR_ERROR,
    Heartbeat,
    budget_lock,
    is_sqlite,
    make_storage,
    recover_stale_trials,
    resolve_storage_url,
    used_budget,
)

log = logging.getLogger(__name__)

TrialCallback = Callable[[FrozenTrial], None]


class WorkersFailed(ConfigError):
    """``--workers`` processes that exited non-zero; ``outcome`` is what the study recorded.

    A ConfigError, so the CLI ends with its one-line error and exit status 2.
    """

    def __init__(self, outcome: StudyOutcome, failed: list[tuple[int, int]]) -> None:
        self.outcome, self.failed = outcome, failed
        super().__init__(
            f"{len(failed)} of the study's worker processes failed "
            f"({', '.join(_exit_text(k, c) for k, c in failed)}); the trials recorded so far are "
            f"kept; re-run the same command to resume study {outcome.study_name!r}"
        )


def _exit_text(worker: int, code: int) -> str:
    if code < 0:
        try:
            return f"worker {worker}: killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"worker {worker}: exit status {code}"


@dataclass
class StudyOutcome:
    """What one invocation of a study did, and where to look."""

    study_name: str
    storage_url: str
    tracking_uri: str
    parent_run_id: str
    experiment: str
    new_trials: list[int] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    def study(self, cfg: StudyConfig) -> optuna.Study:
        return optuna.load_study(
            study_name=self.study_name, storage=make_storage(self.storage_url, cfg.storage)
        )


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of ``workers`` processes: the "auto" rule's share
    (usable cores minus what other asolab processes took; asolab/threads.py)."""
    return max(1, auto_threads() // max(1, workers))


def sampler_seed(seed: int, worker: int = 0, trials_so_far: int = 0) -> int:
    """Distinct, reproducible seeds per (study seed, worker, trials already in the study)."""
    return int(
        np.random.SeedSequence([seed, worker, trials_so_far]).generate_state(1)[0] & 0x7FFFFFFF
    )


def make_sampler(
    cfg: StudyConfig, worker: int = 0, trials_so_far: int = 0
) -> optuna.samplers.BaseSampler:
    """The configured sampler with every setting explicit (Optuna 5 changed defaults)."""
    s, seed = cfg.sampler, sampler_seed(cfg.seed, worker, trials_so_far)
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=s.population_size)
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=s.n_startup_trials,
        multivariate=s.multivariate,
        constant_liar=s.constant_liar,
    )


def make_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    p = cfg.pruner
    if p.name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps
        )
    if p.name == "percentile":
        return optuna.pruners.PercentilePruner(
            p.percentile, n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps
        )
    if p.name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=p.min_resource,
            max_resource=cfg.base.search.cycles,
            reduction_factor=p.reduction_factor,
        )
    if p.name == "threshold":
        lower = p.lower if cfg.objective.directions[0] == "maximize" else None
        upper = None if lower is not None else p.lower
        return optuna.pruners.ThresholdPruner(
            lower=lower, upper=upper, n_warmup_steps=p.n_warmup_steps
        )
    return optuna.pruners.NopPruner()


def open_study(
    cfg: StudyConfig, storage_url: str, study_name: str, worker: int = 0
) -> optuna.Study:
    """Create the study or load it (``load_if_exists``); enqueue ``[[enqueue]]`` points once."""
    storage = make_storage(storage_url, cfg.storage)
    try:
        existing = {
            s.study_name: s.n_trials
            for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
        }
        study = optuna.create_study(
            storage=storage,
            study_name=study_name,
            directions=list(cfg.objective.directions),
            sampler=make_sampler(cfg, worker, existing.get(study_name, 0)),
            pruner=make_pruner(cfg),
            load_if_exists=True,
        )
    except ValueError as exc:
        raise ConfigError(f"study {study_name!r} in {mask_password(storage_url)}: {exc}") from None
    if list(study.directions) != [
        optuna.study.StudyDirection[d.upper()] for d in cfg.objective.directions
    ]:
        raise ConfigError(
            f"study {study_name!r} in {mask_password(storage_url)} exists with other "
            f"objectives ({[d.name for d in study.directions]}); use another --study-name or "
            "storage"
        )
    if worker == 0 and study.metric_names is None:
        with warnings.catch_warnings():  # ExperimentalWarning; optuna-dashboard shows these names
            warnings.simplefilter("ignore")
            study.set_metric_names(list(cfg.objective.metrics))
    if worker == 0 and cfg.enqueue and not study.get_trials(deepcopy=False):
        for point in cfg.enqueue:
            study.enqueue_trial(dict(point), skip_if_exists=True)
    return study


def resolve_budget(
    cfg: StudyConfig, n_trials: int | None, timeout: float | None
) -> tuple[int, float]:
    """``--n-trials`` / ``--timeout`` over the file's values, checked: (trials, seconds)."""
    budget = cfg.n_trials if n_trials is None else n_trials
    seconds = cfg.timeout if timeout is None else timeout
    if budget < 0:
        raise ConfigError(
            f"--n-trials must be >= 0 (got {budget}; 0 = no trial limit, with a --timeout)"
        )
    if seconds < 0:
        raise ConfigError(f"--timeout must be >= 0 seconds (got {seconds:g}; 0 = no time limit)")
    if budget == 0 and seconds == 0:
        raise ConfigError(
            "--n-trials 0 means no trial limit and needs a time budget: give --timeout S or set "
            f"timeout in {cfg.source}"
        )
    return budget, float(seconds)


def _trial_by_number(study: optuna.Study, number: int) -> FrozenTrial:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _tell(
    study: optuna.Study,
    trial: optuna.Trial,
    values: list[float] | None = None,
    state: TrialState | None = None,
) -> FrozenTrial:
    """Tell Optuna how a trial ended.

    If another worker failed the trial as stale meanwhile (its heartbeats did
    not get through), that verdict stands and its parameters are retried: a
    finished trial cannot be told again, so this is logged, not raised.
    """
    try:
        return study.tell(trial, values, state=state)
    except (ValueError, RuntimeError):
        frozen = _trial_by_number(study, trial.number)
        if not frozen.state.is_finished():
            raise
        log.error(
            "trial %d ended here as %s, but the storage already holds it as %s (%s); its result "
            "here is dropped",
            trial.number,
            state.name if state else "COMPLETE",
            frozen.state.name,
            frozen.user_attrs.get(ATTR_ERROR, "finished by another worker"),
        )
        return frozen


def _tell_failure(study: optuna.Study, trial: optuna.Trial, exc: BaseException) -> FrozenTrial:
    one_line = first_line(exc, named=True)
    try:
        trial.set_user_attr(ATTR_ERROR, one_line[:2000])
    except Exception:
        log.debug("could not record the error of trial %d", trial.number, exc_info=True)
    log.warning("trial %d failed: %s", trial.number, one_line)
    return _tell(study, trial, state=TrialState.FAIL)


def _recover(study: optuna.Study, cfg: StudyConfig, uri: str) -> None:
    for s in recover_stale_trials(study, cfg.storage):
        try:
            report.mark_stale_run(uri, s.trial, s.reason)
        except Exception:  # the MLflow record is a courtesy; the study goes on
            log.warning(
                "could not mark the MLflow run of stale trial %d", s.trial.number, exc_info=True
            )


def _run_one(study: optuna.Study, trial: optuna.Trial, ctx: TrialContext) -> FrozenTrial:
    """Run a trial and tell Optuna how it ended: COMPLETE, PRUNED or FAIL."""
    try:
        values = run_trial(trial, ctx)
    except optuna.TrialPruned:
        return _tell(study, trial, state=TrialState.PRUNED)
    except Exception as exc:  # NaN loss, divergence, out of memory: recorded, the study goes on
        return _tell_failure(study, trial, exc)
    except BaseException as exc:  # Ctrl-C: the trial failed, the study stops
        _tell_failure(study, trial, exc)
        raise
    return _tell(study, trial, values)


def optimize(
    cfg: StudyConfig,
    study: optuna.Study,
    ctx: TrialContext,
    storage_url: str,
    n_trials: int,
    timeout: float,
    on_trial: TrialCallback | None = None,
) -> list[int]:
    """Run trials until the study holds ``n_trials`` (0 = no limit) or ``timeout``
    seconds (0 = none) passed; a trial that runs when time is up finishes.

    Every trial is told to Optuna as COMPLETE, PRUNED or FAIL; a failing trial
    (NaN loss, divergence, out of memory, ...) is recorded and the study goes on.
    """
    start = time.monotonic()
    done: list[int] = []
    while not (timeout and time.monotonic() - start >= timeout):
        with budget_lock(storage_url):
            _recover(study, cfg, ctx.tracking_uri)
            if n_trials and used_budget(study) >= n_trials:
                break
            with warnings.catch_warnings():
                # asolab runs the heartbeat itself (storage.Heartbeat), not through Study.optimize
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
                trial = study.ask()
        with Heartbeat(study, trial, cfg.storage.heartbeat_interval):
            frozen = _run_one(study, trial, ctx)
        try:
            report.record_trial(ctx.tracking_uri, cfg, study.study_name, ctx.parent_run_id, frozen)
        except Exception:
            log.warning("could not record trial %d in MLflow", trial.number, exc_info=True)
        done.append(frozen.number)
        if on_trial is not None:
            on_trial(frozen)
    return done


def run_study(
    cfg: StudyConfig,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    workers: int = 1,
    storage_url: str = "",
    study_name: str = "",
    tracking_uri: str = "",
    on_trial: TrialCallback | None = None,
    on_start: Callable[[int], None] | None = None,
    gpus: str = "",
) -> StudyOutcome:
    """Run (or resume) a study until it holds ``n_trials`` trials or ``timeout`` passed.

    ``on_start`` is told, once the stores are checked and the study is open, how many
    trials of the budget the study already holds. ``gpus`` ("0,1"): the GPUs the
    workers share, one each round-robin (default: the visible ones; study/gpus.py).
    Returns where it is recorded; raises
    :class:`WorkersFailed` (after recording) when worker processes exited non-zero.
    """
    from ..tracking import check_reachable, resolve_tracking_uri

    name = check_study_name(study_name) if study_name else cfg.name
    uri = resolve_tracking_uri(
        tracking_uri or cfg.tracking.tracking_uri or cfg.base.tracking.tracking_uri
    )
    url = resolve_storage_url(storage_url, cfg.storage.url, uri)
    budget, seconds = resolve_budget(cfg, n_trials, timeout)
    _check_workers(workers, url)
    gpu_ids = study_gpus(gpus, cfg.base.device, workers)  # before anything is written
    load_ops(cfg.base.space.primitives)  # a plugin op that fails to import: refused, as run does
    check_reachable(uri)
    study = open_study(cfg, url, name)
    parent = report.ensure_parent_run(uri, cfg, name, url)
    outcome = StudyOutcome(name, url, uri, parent, cfg.mlflow_experiment)
    _recover(study, cfg, uri)
    before = {t.number for t in study.get_trials(deepcopy=False)}
    if on_start is not None:
        on_start(used_budget(study))
    failed: list[tuple[int, int]] = []
    try:
        if workers == 1:
            ctx = TrialContext(cfg, name, uri, parent, threads_per_worker(1))
            optimize(cfg, study, ctx, url, budget, seconds, on_trial)
        else:
            failed = _run_workers(
                cfg, workers, url, name, uri, parent, budget, seconds, assign_gpus(workers, gpu_ids)
            )
    finally:
        outcome.new_trials = sorted(
            t.number for t in study.get_trials(deepcopy=False) if t.number not in before
        )
        outcome.plots = report.finish_parent_run(uri, cfg, study, parent)
    if failed:
        raise WorkersFailed(outcome, failed)
    return outcome


def _check_workers(workers: int, url: str) -> None:
    """At least one worker, and only one on a SQLite storage."""
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1 (got {workers})")
    if workers > 1 and is_sqlite(url):
        raise ConfigError(
            f"--workers {workers} cannot share the SQLite storage {url}: Optuna documents SQLite "
            "as unsafe for concurrent workers; use the default journal storage (omit --storage, "
            "or give a path ending in .log) or PostgreSQL"
        )


def _run_workers(
    cfg: StudyConfig,
    workers: int,
    url: str,
    name: str,
    uri: str,
    parent: str,
    budget: int,
    seconds: float,
    gpus: Sequence[str | None] = (),
) -> list[tuple[int, int]]:
    """K ``asolab study --worker`` processes on this machine, sharing the storage, worker
    k on ``gpus[k]``; returns (worker, exit status) of those that failed."""
    if not cfg.source or not os.path.exists(cfg.source):
        raise ConfigError("--workers needs the study to come from a file (workers re-read it)")
    threads = threads_per_worker(workers)
    procs = []
    for k in range(workers):
        cmd = [
            sys.executable,
            "-m",
            "asolab",  # the command's own exit (asolab.cli.console)
            "study",
            cfg.source,
            "--worker",
            str(k),
            "--storage",
            url,
            "--study-name",
            name,
            "--n-trials",
            str(budget),
            "--timeout",
            str(seconds),
            "--tracking-uri",
            uri,
            "--parent-run-id",
            parent,
            "--threads",
            str(threads),
            "--seed",
            str(cfg.seed),
        ]
        for text in cfg.set_overrides:
            cmd += ["--set", text]
        gpu = gpus[k] if k < len(gpus) else None
        log.info("starting worker %d (GPU %s): %s", k, gpu, " ".join(cmd))
        procs.append(start_worker(cmd, gpu))
    try:
        codes = [p.wait() for p in procs]
    except BaseException:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        raise
    return [(k, c) for k, c in enumerate(codes) if c != 0]


def start_worker(cmd: Sequence[str], gpu: str | None, **popen: Any) -> subprocess.Popen:
    """Start one worker process with ``gpu`` as its only visible GPU (None: as this one)."""
    return subprocess.Popen(list(cmd), env=worker_env(os.environ, gpu), **popen)


def run_worker(
    cfg: StudyConfig,
    worker: int,
    storage_url: str,
    study_name: str,
    tracking_uri: str,
    parent_run_id: str,
    n_trials: int | None,
    timeout: float | None,
    threads: int,
    on_trial: TrialCallback | None = None,
) -> list[int]:
    """One worker process: trials until the shared budget is met (None: the file's budget)."""
    check_study_name(study_name)
    n_trials, timeout = resolve_budget(cfg, n_trials, timeout)
    study = open_study(cfg, storage_url, study_name, worker)
    ctx = TrialContext(cfg, study_name, tracking_uri, parent_run_id, threads)
    return optimize(cfg, study, ctx, storage_url, n_trials, timeout, on_trial)


__all__ = [
    "StudyOutcome",
    "WorkersFailed",
    "make_pruner",
    "make_sampler",
    "open_study",
    "optimize",
    "run_study",
    "run_worker",
    "threads_per_worker",
]

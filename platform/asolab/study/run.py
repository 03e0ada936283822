"""Running a study: open or resume it, run trials until the budget is met, in one
process or in K worker processes on this machine.

The budget ``n_trials`` counts the study's trials in total (complete, pruned,
failed, running; a stale trial whose parameters were retried counts once), so
re-running the same command resumes the study and only tops it up. Workers are
``asolab study --worker`` subprocesses sharing the storage; each gets
``max(1, cores // K)`` torch threads. The sampler's seed mixes the study's
``seed`` with the worker index and the number of trials already in the study,
so parallel workers and resumed invocations do not replay the same points,
while a given study state is reproducible.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from ..config import ConfigError
from . import report
from .config import StudyConfig
from .objective import TrialContext, run_trial
from .storage import (
    ATTR_ERROR,
    ATTR_STALE,
    Heartbeat,
    budget_lock,
    make_storage,
    recover_stale_trials,
    resolve_storage_url,
    used_budget,
)

log = logging.getLogger(__name__)

TrialCallback = Callable[[FrozenTrial], None]


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
        return optuna.load_study(study_name=self.study_name, storage=make_storage(self.storage_url, cfg.storage))


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def threads_per_worker(workers: int) -> int:
    return max(1, cpu_cores() // max(1, workers))


def sampler_seed(seed: int, worker: int = 0, trials_so_far: int = 0) -> int:
    """Distinct, reproducible seeds per (study seed, worker, trials already in the study)."""
    return int(np.random.SeedSequence([seed, worker, trials_so_far]).generate_state(1)[0] & 0x7FFFFFFF)


def make_sampler(cfg: StudyConfig, worker: int = 0, trials_so_far: int = 0) -> optuna.samplers.BaseSampler:
    """The configured sampler with every setting explicit (Optuna 5 changed defaults)."""
    s, seed = cfg.sampler, sampler_seed(cfg.seed, worker, trials_so_far)
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=s.population_size)
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=s.n_startup_trials, multivariate=s.multivariate,
        constant_liar=s.constant_liar,
    )


def make_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    p = cfg.pruner
    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps)
    if p.name == "percentile":
        return optuna.pruners.PercentilePruner(p.percentile, n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps)
    if p.name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=p.min_resource, max_resource=cfg.base.search.cycles, reduction_factor=p.reduction_factor)
    if p.name == "threshold":
        lower = p.lower if cfg.objective.directions[0] == "maximize" else None
        upper = None if lower is not None else p.lower
        return optuna.pruners.ThresholdPruner(lower=lower, upper=upper, n_warmup_steps=p.n_warmup_steps)
    return optuna.pruners.NopPruner()


def open_study(cfg: StudyConfig, storage_url: str, study_name: str, worker: int = 0) -> optuna.Study:
    """Create the study or load it (``load_if_exists``); enqueue ``[[enqueue]]`` points once."""
    storage = make_storage(storage_url, cfg.storage)
    try:
        existing = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
        study = optuna.create_study(
            storage=storage, study_name=study_name, directions=list(cfg.objective.directions),
            sampler=make_sampler(cfg, worker, existing.get(study_name, 0)), pruner=make_pruner(cfg), load_if_exists=True,
        )
    except ValueError as exc:
        raise ConfigError(f"study {study_name!r} in {storage_url}: {exc}") from None
    if list(study.directions) != [optuna.study.StudyDirection[d.upper()] for d in cfg.objective.directions]:
        raise ConfigError(
            f"study {study_name!r} in {storage_url} exists with other objectives ({[d.name for d in study.directions]}); "
            f"use another --study-name or storage"
        )
    if worker == 0 and cfg.enqueue and not study.get_trials(deepcopy=False):
        for point in cfg.enqueue:
            study.enqueue_trial(dict(point), skip_if_exists=True)
    return study


def _tell_failure(study: optuna.Study, trial: optuna.Trial, exc: BaseException) -> None:
    one_line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    try:
        trial.set_user_attr(ATTR_ERROR, one_line[:2000])
    except Exception:
        log.debug("could not record the error of trial %d", trial.number, exc_info=True)
    study.tell(trial, state=TrialState.FAIL)
    log.warning("trial %d failed: %s", trial.number, one_line)


def _recover(study: optuna.Study, cfg: StudyConfig, uri: str) -> None:
    for t in recover_stale_trials(study, cfg.storage):
        try:
            report.mark_stale_run(uri, t, str(study._storage.get_trial(t._trial_id).user_attrs.get(ATTR_STALE, "worker gone")))
        except Exception:  # the MLflow record is a courtesy; the study goes on
            log.warning("could not mark the MLflow run of stale trial %d", t.number, exc_info=True)


def optimize(
    cfg: StudyConfig,
    study: optuna.Study,
    ctx: TrialContext,
    storage_url: str,
    n_trials: int,
    timeout: float,
    on_trial: Optional[TrialCallback] = None,
) -> list[int]:
    """Run trials until the study holds ``n_trials`` or ``timeout`` seconds passed.

    Every trial is told to Optuna as COMPLETE, PRUNED or FAIL; a failing trial
    (NaN loss, divergence, out of memory, ...) is recorded and the study goes on.
    """
    start = time.monotonic()
    done: list[int] = []
    while not (timeout and time.monotonic() - start >= timeout):
        with budget_lock(storage_url):
            _recover(study, cfg, ctx.tracking_uri)
            if used_budget(study) >= n_trials:
                break
            with warnings.catch_warnings():
                # asolab runs the heartbeat itself (storage.Heartbeat), not through Study.optimize
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
                trial = study.ask()
        with Heartbeat(study, trial, cfg.storage.heartbeat_interval):
            try:
                values = run_trial(trial, ctx)
            except optuna.TrialPruned:
                study.tell(trial, state=TrialState.PRUNED)
            except Exception as exc:  # NaN loss, divergence, out of memory: recorded, the study goes on
                _tell_failure(study, trial, exc)
            except BaseException as exc:  # Ctrl-C: the trial failed, the study stops
                _tell_failure(study, trial, exc)
                raise
            else:
                study.tell(trial, values if len(values) > 1 else values[0])
        frozen = study._storage.get_trial(trial._trial_id)
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
    on_trial: Optional[TrialCallback] = None,
) -> StudyOutcome:
    """Run (or resume) a study until it holds ``n_trials`` trials; returns where it is recorded."""
    from ..tracking import check_reachable, resolve_tracking_uri

    name = study_name or cfg.name
    url = resolve_storage_url(storage_url, cfg.storage.url)
    uri = resolve_tracking_uri(tracking_uri or cfg.tracking.tracking_uri or cfg.base.tracking.tracking_uri)
    check_reachable(uri)
    budget = n_trials if n_trials is not None else cfg.n_trials
    seconds = timeout if timeout is not None else cfg.timeout
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1 (got {workers})")
    study = open_study(cfg, url, name)
    parent = report.ensure_parent_run(uri, cfg, name, url)
    outcome = StudyOutcome(name, url, uri, parent, cfg.mlflow_experiment)
    _recover(study, cfg, uri)
    before = {t.number for t in study.get_trials(deepcopy=False)}
    try:
        if workers == 1:
            ctx = TrialContext(cfg, uri, parent, threads_per_worker(1))
            optimize(cfg, study, ctx, url, budget, seconds, on_trial)
        else:
            _run_workers(cfg, workers, url, name, uri, parent, budget, seconds)
    finally:
        outcome.new_trials = sorted(t.number for t in study.get_trials(deepcopy=False) if t.number not in before)
        outcome.plots = report.finish_parent_run(uri, cfg, study, parent)
    return outcome


def _run_workers(cfg: StudyConfig, workers: int, url: str, name: str, uri: str, parent: str, budget: int, seconds: float) -> None:
    """K ``asolab study --worker`` processes on this machine, sharing the storage."""
    if not cfg.source or not os.path.exists(cfg.source):
        raise ConfigError("--workers needs the study to come from a file (workers re-read it)")
    threads = threads_per_worker(workers)
    procs = []
    for k in range(workers):
        cmd = [
            sys.executable, "-m", "asolab.cli", "study", cfg.source, "--worker", str(k),
            "--storage", url, "--study-name", name, "--n-trials", str(budget), "--timeout", str(seconds),
            "--tracking-uri", uri, "--parent-run-id", parent, "--threads", str(threads), "--seed", str(cfg.seed),
        ]
        log.info("starting worker %d: %s", k, " ".join(cmd))
        procs.append(subprocess.Popen(cmd))
    try:
        codes = [p.wait() for p in procs]
    except BaseException:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        raise
    bad = [(k, c) for k, c in enumerate(codes) if c != 0]
    if bad:
        log.warning("workers exited with status %s", ", ".join(f"{k}: {c}" for k, c in bad))


def run_worker(
    cfg: StudyConfig, worker: int, storage_url: str, study_name: str, tracking_uri: str,
    parent_run_id: str, n_trials: int, timeout: float, threads: int, on_trial: Optional[TrialCallback] = None,
) -> list[int]:
    """One worker process: trials until the shared budget is met."""
    study = open_study(cfg, storage_url, study_name, worker)
    ctx = TrialContext(cfg, tracking_uri, parent_run_id, threads)
    return optimize(cfg, study, ctx, storage_url, n_trials, timeout, on_trial)


__all__ = ["StudyOutcome", "make_pruner", "make_sampler", "open_study", "optimize", "run_study", "run_worker", "threads_per_worker"]

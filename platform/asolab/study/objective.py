"""The objective: one Optuna trial is one asolab run, recorded as an MLflow child run.

Thin glue, in the optuna-examples style: ``suggest -> experiment config ->
Runner``. The runner knows nothing about Optuna; :class:`TrialReporter` is an
observer that reports the validation accuracy after every cycle and raises
``optuna.TrialPruned`` when the pruner says so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import optuna

from ..config import ExperimentConfig
from ..data import DataBundle, load_data
from ..runner import Runner
from ..runner.device import resolve_device
from ..runner.events import CycleEnd, Observer, RunEnd, RunStart
from ..runner.gpubusy import ALL
from ..tracking.layout import TAG_STUDY, TAG_TRIAL
from . import report
from .config import ParamSpec, StudyConfig, trial_overrides
from .report import trial_run_name
from .storage import ATTR_GPU_BUSY, ATTR_MLFLOW_RUN

log = logging.getLogger(__name__)

# objective metric (the keys of study.config.OBJECTIVES) -> the attribute of CycleEnd
# (what the pruner watches per cycle) and of RunEnd (the trial's value) that holds it
EVENT_FIELD = {"val_acc": "val_acc", "val_loss": "val_loss", "params": "derived_params"}


def suggest(trial: optuna.Trial, p: ParamSpec) -> Any:
    """Sample one parameter from its declared distribution."""
    if p.type == "categorical":
        return trial.suggest_categorical(p.optuna_name, list(p.choices))
    if p.type == "int":
        return trial.suggest_int(
            p.optuna_name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log
        )
    return trial.suggest_float(p.optuna_name, p.low, p.high, step=p.step, log=p.log)


def trial_config(trial: optuna.Trial, cfg: StudyConfig, threads: int) -> ExperimentConfig:
    """The experiment config of this trial: base + sampled values + the worker's thread share."""
    sampled = {p.optuna_name: suggest(trial, p) for p in cfg.params}
    overrides = trial_overrides(sampled, cfg)
    for p in cfg.params:
        if p.fraction_of:  # the value the run used, next to the fraction Optuna sampled
            trial.set_user_attr(p.key, overrides[p.key])
    base_threads = cfg.base.threads
    overrides["threads"] = min(base_threads, threads) if base_threads else threads
    return cfg.base.replace(**overrides)


class TrialReporter(Observer):
    """Reports the objective's per-cycle value to Optuna; prunes when told to.

    With several seeds per trial, the runs report one after the other: the
    ``offset`` (seed index × cycles) keeps their steps apart, and every trial
    reports the same steps, which is what the pruners compare."""

    def __init__(self, trial: optuna.Trial, metric: str | None, offset: int = 0) -> None:
        self.trial, self.metric, self.offset = trial, metric, offset

    def on_cycle_end(self, event: CycleEnd) -> None:
        if self.metric is None:
            return
        value = float(getattr(event, EVENT_FIELD[self.metric]))
        self.trial.report(value, self.offset + event.cycle)
        if self.trial.should_prune():
            log.info(
                "trial %d pruned after cycle %d (%s = %.4f)",
                self.trial.number,
                event.cycle,
                self.metric,
                value,
            )
            raise optuna.TrialPruned(
                f"pruned after cycle {event.cycle} with {self.metric} = {value:.4f}"
            )


class RunLink(Observer):
    """Stores the MLflow child run id in the trial as soon as the tracker created it."""

    def __init__(self, trial: optuna.Trial, tracker: Any) -> None:
        self.trial, self.tracker = trial, tracker

    def on_run_start(self, event: RunStart) -> None:
        # With several seeds the trial has a run of its own, set before its seeds run.
        if getattr(self.tracker, "run_id", None) and ATTR_MLFLOW_RUN not in self.trial.user_attrs:
            self.trial.set_user_attr(ATTR_MLFLOW_RUN, self.tracker.run_id)


@dataclass
class TrialContext:
    """What every trial of one worker shares.

    ``study_name`` is the study's actual name (``--study-name`` may differ from
    the file's ``name``): trial runs are named and tagged with it, so that the
    study's parent run and ``--summary`` find them.
    """

    cfg: StudyConfig
    study_name: str
    tracking_uri: str
    parent_run_id: str
    threads: int
    _data: dict[str, DataBundle] = field(default_factory=dict)

    def data_for(self, exp: ExperimentConfig) -> DataBundle:
        """Load each data set once per worker (trials that tune data.* keys get their own)."""
        device = resolve_device(exp.device)
        key = repr((exp.data, exp.seed, str(device)))
        if key not in self._data:
            self._data[key] = load_data(exp.data, exp.seed, device)
        return self._data[key]


class _RunEndKeeper(Observer):
    def __init__(self) -> None:
        self.end: RunEnd | None = None

    def on_run_end(self, event: RunEnd) -> None:
        self.end = event


def objective_values(end: RunEnd, metrics: tuple[str, ...]) -> list[float]:
    """The trial's objective values, from the run's final evaluation (validation split;
    the test split is reported in the trial's run, never returned to Optuna)."""
    values = [float(getattr(end, EVENT_FIELD[m])) for m in metrics]
    for m, v in zip(metrics, values):
        if not math.isfinite(v):  # Optuna would fail the trial without saying why
            raise FloatingPointError(f"objective {m} is {v}")
    return values


def _run_seed(
    trial: optuna.Trial, ctx: TrialContext, exp: ExperimentConfig, index: int, parent: str
) -> RunEnd:
    """One run of the trial's config (seed ``exp.seed + index``), an MLflow child of
    ``parent``; the pruner sees its cycles at steps ``index * cycles + cycle``."""
    from ..tracking import MlflowTracker

    cfg = ctx.cfg
    first = cfg.objective.metrics[0]
    # Optuna cannot prune multi-objective trials; single objectives report per cycle.
    metric = first if not cfg.multi_objective and first in EVENT_FIELD else None
    run_exp = exp.replace(seed=exp.seed + index) if index else exp
    seed = run_exp.seed if cfg.objective.seeds > 1 else None
    name = trial_run_name(
        trial.number, exp.temperature.initial_temperature, exp.mutation.strength, seed
    )
    tracker = MlflowTracker(
        tracking_uri=ctx.tracking_uri,
        experiment=cfg.mlflow_experiment,
        run_name=name,
        parent_run_id=parent,
        tags={TAG_STUDY: ctx.study_name, TAG_TRIAL: str(trial.number)},
        log_models=run_exp.tracking.log_models,
    )
    keeper = _RunEndKeeper()
    reporter = TrialReporter(trial, metric, offset=index * exp.search.cycles)
    observers = [tracker, RunLink(trial, tracker), keeper, reporter]
    Runner(run_exp, observers, data=ctx.data_for(run_exp)).run()
    assert keeper.end is not None
    keep_gpu_busy(trial, keeper.end)
    return keeper.end


def keep_gpu_busy(trial: optuna.Trial, end: RunEnd) -> None:
    """Record on ``trial`` how busy its run kept the GPU (nothing off a GPU): the study's
    first finished trial then says whether the GPU has room for more workers."""
    if ALL in end.gpu_busy:
        trial.set_user_attr(ATTR_GPU_BUSY, round(end.gpu_busy[ALL], 1))


def run_trial(trial: optuna.Trial, ctx: TrialContext) -> list[float]:
    """Run one trial and return its objective values.

    One seed: the trial is one MLflow run, a child of the study's run. Several seeds:
    the trial gets a run of its own under the study's run (its knobs, the mean over
    seeds, its state), and each seed's run is nested under it.

    Exceptions (``TrialPruned``, ``FloatingPointError`` on a NaN loss, anything
    else) propagate after the trackers have closed the MLflow runs; the study loop
    tells Optuna and records the state.
    """
    cfg = ctx.cfg
    exp = trial_config(trial, cfg, ctx.threads)
    metrics, seeds = cfg.objective.metrics, cfg.objective.seeds
    if seeds == 1:
        return objective_values(_run_seed(trial, ctx, exp, 0, ctx.parent_run_id), metrics)
    run_id = report.start_trial_run(
        ctx.tracking_uri, cfg, ctx.study_name, ctx.parent_run_id, trial.number, exp
    )
    trial.set_user_attr(ATTR_MLFLOW_RUN, run_id)
    ends: list[tuple[int, RunEnd]] = []
    per_seed: list[list[float]] = []
    status = "FAILED"
    try:
        for i in range(seeds):
            end = _run_seed(trial, ctx, exp, i, run_id)
            per_seed.append(objective_values(end, metrics))
            ends.append((exp.seed + i, end))
        status = "FINISHED"
    except optuna.TrialPruned:
        status = "FINISHED"  # as a pruned single-seed run: its state tag says PRUNED
        raise
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        _finish(ctx, run_id, trial.number, ends if len(ends) == seeds else [], status)
    trial.set_user_attr("objective_per_seed", per_seed)
    return [sum(v) / seeds for v in zip(*per_seed)]


def _finish(ctx: TrialContext, run_id: str, number: int, ends: list, status: str) -> None:
    try:
        report.finish_trial_run(ctx.tracking_uri, run_id, number, ends, status)
    except Exception:  # the trial's outcome matters more than its MLflow summary
        log.warning("could not close the MLflow run of trial %d", number, exc_info=True)

"""The study in MLflow: one parent run per study, trial-state tags, plots, summary.

The parent run is found again by its tags (``asolab.study`` = name and
``asolab.study_parent`` = "true"), so re-running a study keeps adding child
runs under the same expandable row in the MLflow UI. When a study invocation
ends, the parent gets the best trial's value and parameters (as metrics with
the number of finished trials as step, and as tags) and the study plots.
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..tracking import layout as L
from ..tracking.layout import (
    BEST_PREFIX,
    PLOTS_DIR,
    TAG_BEST,
    TAG_BEST_TRIAL,
    TAG_ERROR,
    TAG_NOTE,
    TAG_RUN_KIND,
    TAG_STORAGE,
    TAG_STUDY,
    TAG_STUDY_PARENT,
    TAG_TRIAL,
    TAG_TRIAL_STATE,
)
from ..tracking.store import mask_password
from .config import StudyConfig
from .storage import ATTR_ERROR, ATTR_GPU_BUSY, ATTR_MLFLOW_RUN

log = logging.getLogger(__name__)

CONTOUR_PARAMS = ("temperature.initial_temperature", "mutation.strength")


def trial_run_name(
    number: int,
    temperature: float | None = None,
    strength: float | None = None,
    seed: int | None = None,
) -> str:
    """A trial run's name that tells trials apart in the UI's narrow name column:
    ``t007 τ2.1 s0.30`` (trial number, initial temperature, mutation strength); a seed
    run of a multi-seed trial has its seed next: ``t007 seed1 τ2.1 s0.30``."""
    name = f"t{number:03d}" + (f" seed{seed}" if seed is not None else "")
    if temperature is not None:
        name += f" τ{temperature:.2g}" if temperature < 10 else f" τ{temperature:.0f}"
    if strength is not None:
        name += f" s{strength:.2f}"
    return name


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def find_parent_run(uri: str, cfg: StudyConfig, study_name: str) -> str | None:
    c = client(uri)
    exp = c.get_experiment_by_name(cfg.mlflow_experiment)
    if exp is None:
        return None
    runs = c.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{TAG_STUDY}` = '{study_name}' and tags.`{TAG_STUDY_PARENT}` = 'true'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def ensure_parent_run(uri: str, cfg: StudyConfig, study_name: str, storage_url: str) -> str:
    """The study's parent run: found by its tags, else created; marked RUNNING."""
    from ..tracking.store import ensure_experiment

    c = client(uri)
    run_id = find_parent_run(uri, cfg, study_name)
    if run_id is not None:
        c.update_run(run_id, status="RUNNING")
        return run_id
    exp_id = ensure_experiment(c, uri, cfg.mlflow_experiment)
    tags = {
        TAG_STUDY: study_name,
        TAG_STUDY_PARENT: "true",
        TAG_RUN_KIND: L.KIND_STUDY,
        TAG_STORAGE: mask_password(storage_url),
        L.TAG_STUDY_DIRECTIONS: ",".join(cfg.objective.directions),
        L.TAG_STUDY_OBJECTIVE: ",".join(cfg.objective.metrics),
    }
    run = c.create_run(exp_id, tags=tags, run_name=f"study-{study_name}")
    run_id = run.info.run_id
    from mlflow.entities import Param

    values = (
        study_name,
        Path(cfg.experiment).name,
        ",".join(cfg.objective.metrics),
        cfg.sampler.name,
        cfg.pruner.name,
        str(cfg.seed),
    )
    params = [Param(k, v) for k, v in zip(L.STUDY_PARAMS, values, strict=True)]
    params += [Param(L.SPACE_PREFIX + p.optuna_name, _describe(p)) for p in cfg.params]
    c.log_batch(run_id, params=params)
    if cfg.source and Path(cfg.source).exists():
        c.log_artifact(run_id, cfg.source)
    return run_id


def _describe(p: Any) -> str:
    if p.type == "categorical":
        return f"categorical{list(p.choices)}"
    scale = " log" if p.log else ""
    frac = f" x {p.fraction_of}" if p.fraction_of else ""
    return f"{p.type}[{p.low}, {p.high}]{scale}{frac}"[:500]


def record_trial(
    uri: str, cfg: StudyConfig, study_name: str, parent_run_id: str, trial: FrozenTrial
) -> str:
    """Write a finished trial's state, parameters and values to its MLflow child run.

    A trial that failed before its run existed (e.g. while loading data) gets a
    child run of its own so that the error is visible in the UI.
    """
    from mlflow.entities import Metric, Param, RunTag

    c = client(uri)
    run_id = trial.user_attrs.get(ATTR_MLFLOW_RUN)
    if not run_id:
        from ..tracking.store import ensure_experiment

        exp_id = ensure_experiment(c, uri, cfg.mlflow_experiment)
        name = trial_run_name(
            trial.number,
            trial.params.get("temperature.initial_temperature"),
            trial.params.get("mutation.strength"),
        )
        run = c.create_run(
            exp_id,
            run_name=name,
            tags={
                L.MLFLOW_PARENT_RUN: parent_run_id,
                TAG_STUDY: study_name,
                TAG_TRIAL: str(trial.number),
            },
        )
        run_id = run.info.run_id
        c.set_terminated(run_id, status="FAILED" if trial.state == TrialState.FAIL else "FINISHED")
    tags = [
        RunTag(TAG_TRIAL_STATE, trial.state.name),
        RunTag(TAG_STUDY, study_name),
        RunTag(TAG_TRIAL, str(trial.number)),
    ]
    error = trial.user_attrs.get(ATTR_ERROR)
    if error:
        tags.append(RunTag(TAG_ERROR, str(error)[:5000]))
    params = [Param(L.TRIAL_PARAM_PREFIX + k, str(v)[:500]) for k, v in trial.params.items()]
    now = int(trial.datetime_complete.timestamp() * 1000) if trial.datetime_complete else 0
    metrics = []
    if trial.values is not None:
        metrics = [
            Metric(L.OBJECTIVE_PREFIX + m, float(v), now, 0)
            for m, v in zip(cfg.objective.metrics, trial.values)
        ]
    c.log_batch(run_id, metrics=metrics, params=params, tags=tags)
    return run_id


def mark_stale_run(uri: str, trial: FrozenTrial, reason: str) -> None:
    """The MLflow run of a trial whose worker died: KILLED, with the reason (and a
    multi-seed trial's seed run that was running)."""

    run_id = trial.user_attrs.get(ATTR_MLFLOW_RUN)
    if not run_id:
        return
    c = client(uri)
    c.set_tag(run_id, TAG_TRIAL_STATE, TrialState.FAIL.name)
    c.set_tag(run_id, TAG_ERROR, f"stale trial: {reason}")
    c.set_terminated(run_id, status="KILLED")
    exp_id = c.get_run(run_id).info.experiment_id
    running = f"tags.`{L.MLFLOW_PARENT_RUN}` = '{run_id}' and attributes.status = 'RUNNING'"
    for child in c.search_runs([exp_id], running):
        c.set_tag(child.info.run_id, TAG_ERROR, f"stale trial: {reason}")
        c.set_terminated(child.info.run_id, status="KILLED")


def start_trial_run(
    uri: str, cfg: StudyConfig, study_name: str, parent_run_id: str, number: int, exp: Any
) -> str:
    """The run of a multi-seed trial, nested under the study's run: one row in the UI
    with the trial's knobs (the experiment's keys but the seed) and, when it ends, its
    objective; its seed runs are nested under it (:func:`finish_trial_run`)."""
    from mlflow.entities import Param

    from ..tracking.store import ensure_experiment

    c = client(uri)
    exp_id = ensure_experiment(c, uri, cfg.mlflow_experiment)
    tags = {
        L.MLFLOW_PARENT_RUN: parent_run_id,
        TAG_STUDY: study_name,
        TAG_TRIAL: str(number),
        TAG_RUN_KIND: L.KIND_TRIAL,
        TAG_TRIAL_STATE: TrialState.RUNNING.name,
        L.TAG_DATASET: exp.data.name,  # the UI's data-set column reads it on the trial's row
    }
    t = exp.temperature.initial_temperature
    run = c.create_run(exp_id, tags=tags, run_name=trial_run_name(number, t, exp.mutation.strength))
    knobs = {k: v for k, v in exp.flat().items() if k != "seed"}
    c.log_batch(run.info.run_id, params=[Param(k, _param_text(v)) for k, v in knobs.items()])
    return run.info.run_id


def _param_text(value: Any) -> str:
    import json

    return json.dumps(value) if isinstance(value, (list, tuple)) else str(value)[:500]


def finish_trial_run(
    uri: str, run_id: str, number: int, seeds: list[tuple[int, Any]], status: str
) -> None:
    """End a multi-seed trial's run: with every seed's RunEnd (``seeds``: (seed, RunEnd)),
    the means over seeds of the runs' final metrics (the objective's ``final_val_acc``
    among them, so the UI's columns read the trial's values) and a description with the
    per-seed table; ``status``: FINISHED, FAILED or KILLED. The trial's state and
    ``objective.*`` values come from :func:`record_trial`."""
    from mlflow.entities import Metric

    c = client(uri)
    if seeds:
        now, n = int(time.time() * 1000), len(seeds)
        values = {
            L.FINAL_VAL_ACC: sum(e.val_acc for _, e in seeds) / n,
            L.FINAL_VAL_LOSS: sum(e.val_loss for _, e in seeds) / n,
            L.TEST_ACC: sum(e.test_acc for _, e in seeds) / n,
            # a whole count: no network has a third of a parameter (the UI's trial row)
            L.FINAL_PARAMS: round(sum(e.derived_params for _, e in seeds) / n),
            L.RUN_SECONDS: sum(e.seconds for _, e in seeds),  # the trial's cost: all its runs
        }
        c.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()])
        # A fixed-width block, not a Markdown table: the UI draws tables without cell
        # padding, and the header read "seedval acctest accparameters".
        rows = [
            f"{seed:>4}  {e.val_acc:>7.4f}  {e.test_acc:>8.4f}  {e.derived_params:>10,}"
            for seed, e in seeds
        ]
        c.set_tag(
            run_id,
            L.TAG_NOTE,
            "\n".join(
                [
                    f"**Trial {number}**: the mean over seeds {', '.join(str(s) for s, _ in seeds)}"
                    f" (their runs are nested under this one): validation accuracy "
                    f"**{values[L.FINAL_VAL_ACC]:.4f}**, test accuracy "
                    f"{values[L.TEST_ACC]:.4f} (reported, never optimised).",
                    "",
                    "```",
                    "seed  val acc  test acc  parameters",
                    *rows,
                    "```",
                ]
            ),
        )
    c.set_terminated(run_id, status=status)


# --------------------------------------------------------------------------- the parent's summary


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best trial (one objective) or the Pareto front (two)."""
    if not [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]:
        return []
    if len(study.directions) > 1:
        return list(study.best_trials)
    return [study.best_trial]


def finish_parent_run(
    uri: str, cfg: StudyConfig, study: optuna.Study, parent_run_id: str
) -> list[str]:
    """Best value and parameters, trial counts and plots onto the parent; returns the plot names."""
    from mlflow.entities import Metric, RunTag

    c = client(uri)
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    step = len(finished)
    now = int(
        max((t.datetime_complete.timestamp() for t in finished if t.datetime_complete), default=0)
        * 1000
    )
    states = {s.name.lower(): s for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    metrics = [
        Metric(
            L.TRIALS_PREFIX + name, float(sum(t.state == states[name] for t in trials)), now, step
        )
        for name in L.TRIAL_STATES_COUNTED
    ]
    tags: list[RunTag] = []
    best = best_trials(study)
    if len(study.directions) == 1 and best:
        b = best[0]
        metrics.append(Metric(L.BEST_VALUE, float(b.value), now, step))
        metrics.append(
            Metric(f"{BEST_PREFIX}{cfg.objective.metrics[0]}", float(b.value), now, step)
        )
        tags.append(RunTag(TAG_BEST_TRIAL, str(b.number)))
        for k, v in b.params.items():
            # rounded where asolab writes it for reading (the metric below stays exact)
            text = f"{v:.4g}" if isinstance(v, float) else str(v)
            tags.append(RunTag(f"{BEST_PREFIX}{k}", text))
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics.append(Metric(f"{BEST_PREFIX}{k}", float(v), now, step))
    elif best:
        tags.append(RunTag(L.TAG_PARETO_TRIALS, ",".join(str(t.number) for t in best)[:5000]))
        metrics.append(Metric(L.PARETO_SIZE, float(len(best)), now, step))
    c.log_batch(parent_run_id, metrics=metrics, tags=tags)
    mark_best_runs(c, cfg, study, best)
    c.set_tag(parent_run_id, TAG_NOTE, study_description(c, cfg, study, parent_run_id, best))
    from ..tracking.browse import refresh_view

    refresh_view(
        c, c.get_run(parent_run_id).info.experiment_id
    )  # the UI opens the study on its trials
    plots = log_plots(c, parent_run_id, cfg, study)
    c.set_terminated(parent_run_id, status="FINISHED")
    return plots


def mark_best_runs(c: Any, cfg: StudyConfig, study: optuna.Study, best: list[FrozenTrial]) -> None:
    """``asolab.best = true`` on the runs of the best trial (or the Pareto front), and on
    no other run of the study, so the runs table can filter on it."""

    keep = {t.user_attrs.get(ATTR_MLFLOW_RUN) for t in best} - {None}
    exp = c.get_experiment_by_name(cfg.mlflow_experiment)
    if exp is not None:
        marked = c.search_runs(
            [exp.experiment_id],
            f"tags.`{TAG_BEST}` = 'true' and tags.`{TAG_STUDY}` = '{study.study_name}'",
        )
        for run in marked:
            if run.info.run_id not in keep:
                c.delete_tag(run.info.run_id, TAG_BEST)
    for run_id in keep:
        c.set_tag(run_id, TAG_BEST, "true")


def study_description(
    c: Any, cfg: StudyConfig, study: optuna.Study, parent_run_id: str, best: list[FrozenTrial]
) -> str:
    """The parent run's Markdown description: objective, best trial (linked), top trials."""

    exp_id = c.get_run(parent_run_id).info.experiment_id
    trials = study.get_trials(deepcopy=False)
    counts = ", ".join(
        f"{sum(t.state == s for t in trials)} {s.name.lower()}"
        for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    )
    goal = ", ".join(f"{d} `{m}`" for m, d in zip(cfg.objective.metrics, cfg.objective.directions))
    lines = [
        f"### Study {study.study_name}",
        "",
        f"**Objective**: {goal} (validation split; the test split is never optimised). "
        f"**Trials**: {len(trials)} ({counts}). **Sampler**: {cfg.sampler.name}, **pruner**: "
        f"{cfg.pruner.name}.",
        f"Tuned: {', '.join(f'`{p.optuna_name}`' for p in cfg.params)}.",
        "",
    ]

    def link(t: FrozenTrial) -> str:
        run_id = t.user_attrs.get(ATTR_MLFLOW_RUN)
        name = f"trial {t.number}"
        return f"[{name}](#/experiments/{exp_id}/runs/{run_id})" if run_id else name

    if best:
        lines += [f"**Best**: {', '.join(link(t) for t in best)} (tag `{TAG_BEST}` = true)", ""]
    frame = summary_frame(study, cfg, top=5)
    if len(frame):
        names = list(cfg.objective.metrics) + [p.optuna_name for p in cfg.params]
        lines += ["| trial | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        by_number = {t.number: t for t in trials}
        for _, row in frame.iterrows():
            cells = [
                f"{row[n]:.4g}" if isinstance(row.get(n), float) else str(row.get(n, ""))
                for n in names
            ]
            lines.append(f"| {link(by_number[int(row['trial'])])} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(
        "Plots: `plots/` (optimization history, importances, contour). "
        "Live view: `optuna-dashboard` on the study's storage (see docs/studies.md)."
    )
    return "\n".join(lines)


def _save(ax: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
    fig.set_size_inches(max(fig.get_size_inches()[0], 7), max(fig.get_size_inches()[1], 5))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def study_plots(cfg: StudyConfig, study: optuna.Study, out: Path) -> tuple[list[str], list[str]]:
    """Write the study's plots as PNG (matplotlib); returns (written, notes on skipped plots)."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    written: list[str] = []
    notes: list[str] = []
    for name, make, needs in _plot_jobs(cfg, study):
        if len(complete) < needs:
            notes.append(
                f"{name}: skipped, needs at least {needs} complete trial(s), the study has "
                f"{len(complete)}"
            )
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning on every matplotlib plot
                ax = make()
            _save(ax, out / f"{name}.png")
            written.append(f"{name}.png")
        except Exception as exc:  # a plot must never fail the study
            notes.append(f"{name}: skipped ({type(exc).__name__}: {exc})")
            log.info("study plot %s skipped: %s", name, exc)
    return written, notes


def _plot_jobs(cfg: StudyConfig, study: optuna.Study) -> list[tuple[str, Any, int]]:
    """(name, a function that draws it, the complete trials it needs) for each plot."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import optuna.visualization.matplotlib as vis
    from optuna.importance import FanovaImportanceEvaluator

    multi = len(study.directions) > 1
    names = list(cfg.objective.metrics)
    target = (lambda t: t.values[0]) if multi else None
    target_name = names[0]
    params = [p.optuna_name for p in cfg.params]
    # temperature x mutation strength when both are tuned
    contour = [c for c in CONTOUR_PARAMS if c in params]
    if len(contour) < 2:
        contour = params[:2]
    jobs: list[tuple[str, Any, int]] = [
        (
            "optimization_history",
            lambda: vis.plot_optimization_history(study, target=target, target_name=target_name),
            1,
        ),
        (
            "param_importances",
            lambda: vis.plot_param_importances(
                study,
                evaluator=FanovaImportanceEvaluator(seed=cfg.seed),
                target=target,
                target_name=target_name,
            ),
            2,
        ),
        (
            "slice",
            lambda: vis.plot_slice(study, params=params, target=target, target_name=target_name),
            1,
        ),
    ]
    if len(contour) >= 2:
        jobs.append(
            (
                "contour",
                lambda: vis.plot_contour(
                    study, params=contour, target=target, target_name=target_name
                ),
                2,
            )
        )
    if multi:
        jobs.append(("pareto_front", lambda: vis.plot_pareto_front(study, target_names=names), 1))
    elif any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        jobs.append(("intermediate_values", lambda: vis.plot_intermediate_values(study), 0))
    return jobs


def log_plots(c: Any, run_id: str, cfg: StudyConfig, study: optuna.Study) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="asolab-study-") as tmp:
        out = Path(tmp) / PLOTS_DIR
        out.mkdir()
        written, notes = study_plots(cfg, study, out)
        if notes:
            (out / "NOTES.txt").write_text("\n".join(notes) + "\n")
            for note in notes:
                log.info("study %s: %s", study.study_name, note)
        if any(out.iterdir()):
            c.log_artifacts(run_id, str(out), PLOTS_DIR)
    return written


def summary_frame(study: optuna.Study, cfg: StudyConfig, top: int = 10) -> Any:
    """The best trials as a pandas DataFrame (the Pareto front for two objectives)."""
    import pandas as pd

    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(study.directions) > 1:
        trials = best_trials(study)
        trials.sort(
            key=lambda t: t.values[0],
            reverse=study.directions[0] == optuna.study.StudyDirection.MAXIMIZE,
        )
    else:
        trials.sort(
            key=lambda t: t.value, reverse=study.direction == optuna.study.StudyDirection.MAXIMIZE
        )
    rows = []
    on_gpus = any(ATTR_GPU_BUSY in t.user_attrs for t in trials[:top])
    for t in trials[:top]:
        row: dict[str, Any] = {"trial": t.number}
        row.update({m: v for m, v in zip(cfg.objective.metrics, t.values)})
        row.update(t.params)
        row["seconds"] = round(t.duration.total_seconds(), 1) if t.duration else None
        if on_gpus:  # how busy each trial kept its GPU (objective.keep_gpu_busy)
            row["gpu_busy_pct"] = t.user_attrs.get(ATTR_GPU_BUSY)
        row["mlflow_run"] = t.user_attrs.get(ATTR_MLFLOW_RUN, "")
        rows.append(row)
    return pd.DataFrame(rows)

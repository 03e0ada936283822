"""Select runs from any MLflow store and read what they recorded into pandas.

Only what the tracker recorded is read (names from :mod:`asolab.tracking.layout`):
params (the flattened config), tags, final metrics and the genotype artifacts.
Nothing else about the run's code is assumed, so runs made by earlier asolab
versions compare as long as their genotype artifacts parse. A run whose final
genotype cannot be found or parsed is *skipped* with its id and the reason,
never a crash.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Run, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ..config import ConfigError, data_set_name
from ..errors import first_line
from ..runner.phases import EPOCH_FIELDS
from ..space.genotype import Genotype
from ..tracking import layout
from ..tracking.runs import final_genotype
from ..tracking.store import RunNotFound, find_run, resolve_tracking_uri

log = logging.getLogger(__name__)

COMPARISON_EXPERIMENT = "asolab-comparisons"
# a run's validation accuracy: the final one, else the last cycle's, else the last epoch's
VAL_ACC_METRICS = (layout.FINAL_VAL_ACC, layout.CYCLE_VAL_ACC, layout.VAL_ACC)

# The training budget: runs that differ here are not compared like for like.
BUDGET_COLUMNS = ("cycles", "warmup_epochs", *EPOCH_FIELDS, "final_epochs")
# Table columns, in order: (column, where it comes from).
COLUMNS = (
    "run_name",
    "run_id",
    "experiment",
    "dataset",
    "seed",
    "schedule",
    "initial_temperature",
    "min_temperature",
    "anneal_fraction",
    "mutation_strength",
    *BUDGET_COLUMNS,
    "genotype",
    "params",
    "peak_rss_mb",
    "run_minutes",
    "device",
    "alpha_entropy",
    "val_acc",
    "test_acc",
    "status",
    "experiment_id",
)


class CompareError(ConfigError):
    """A selection problem (unknown experiment or run, bad filter), phrased as one line."""


def existing_store(tracking_uri: str) -> MlflowClient:
    """A client for ``tracking_uri``; a SQLite file that does not exist, or is not an
    MLflow store, and a server or database that does not answer are one-line errors
    (the MLflow client would retry for minutes, or make a new store)."""
    from ..tracking.store import check_reachable, check_sqlite_store

    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///") :])
        if not db.is_file():
            raise CompareError(
                f"no MLflow store at {db}; record runs with 'asolab run' first or pass "
                "--tracking-uri"
            )
        check_sqlite_store(tracking_uri)
    else:
        check_reachable(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri)


# Each column the runs table reads from one param: column -> param (RunRecord.row; the
# note on other settings that differ leaves these out, compare/settings.py).
TABLE_PARAMS = {
    "seed": "seed",
    "schedule": "temperature.schedule",
    "initial_temperature": "temperature.initial_temperature",
    "min_temperature": "temperature.min_temperature",
    "anneal_fraction": "temperature.anneal_fraction",
    "mutation_strength": "mutation.strength",
    "cycles": "search.cycles",
    "warmup_epochs": "search.warmup_epochs",
    **{f: f"search.{f}" for f in EPOCH_FIELDS},
}


@dataclass(frozen=True)
class RunRecord:
    """One selected run as compare sees it."""

    run_id: str
    run_name: str
    experiment: str
    status: str
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    genotype: Genotype
    experiment_id: str = ""

    def param(self, key: str, cast: type = str, default: Any = None) -> Any:
        raw = self.params.get(key)
        if raw is None:
            return default
        try:
            return cast(raw) if cast is not int else int(float(raw))
        except ValueError:
            return default

    def metric(self, *names: str) -> float:
        """The first of ``names`` that was logged (latest value), else NaN."""
        for name in names:
            if name in self.metrics:
                return float(self.metrics[name])
        return math.nan

    @property
    def data_set(self) -> str:
        """The data the run searched on: its data set's name, and for a researcher's own
        images or arrays, the folder's name or the file's stem (``folder-shapes``)."""
        name = self.tags.get(layout.TAG_DATASET) or self.param("data.name") or ""
        return data_set_name(
            name, self.param("data.data_dir", default=""), self.param("data.path", default="")
        )

    @property
    def device(self) -> str:
        """Where the run trained: ``cpu``, or the GPU's name (``NVIDIA H100 80GB HBM3``)."""
        gpu = self.tags.get(layout.TAG_DEVICE_INFO + "gpu_name")
        return gpu or self.tags.get(layout.TAG_DEVICE, "")

    def row(self) -> dict[str, Any]:
        p = TABLE_PARAMS
        return {
            "run_name": self.run_name,
            "run_id": self.run_id,
            "experiment": self.experiment,
            "dataset": self.data_set,
            "seed": self.param(p["seed"], int),
            "schedule": self.param(p["schedule"]),
            "initial_temperature": self.param(p["initial_temperature"], float, math.nan),
            "min_temperature": self.param(p["min_temperature"], float, math.nan),
            "anneal_fraction": self.param(p["anneal_fraction"], float, math.nan),
            "mutation_strength": self.param(p["mutation_strength"], float, math.nan),
            "cycles": self.param(p["cycles"], int),
            # Runs from before search.warmup_epochs existed had no warm-up.
            "warmup_epochs": self.param(p["warmup_epochs"], int, 0),
            **{f: self.param(p[f], int) for f in EPOCH_FIELDS},
            "final_epochs": layout.final_epochs_trained(self.params),
            "genotype": self.genotype.canonical,
            "params": self.metric(layout.FINAL_PARAMS, layout.DERIVED_PARAMS),
            "peak_rss_mb": self.metric(
                layout.FINAL_PREFIX + layout.PEAK_RSS_MB, layout.PEAK_RSS_MB, layout.RSS_MB
            ),
            # what the run cost: its wall time (search and final stage), and on what
            "run_minutes": round(self.metric(layout.RUN_SECONDS) / 60, 2),
            "device": self.device,
            # how far the alphas moved (1: not at all, docs/baselines.md): the last cycle's
            "alpha_entropy": self.metric(layout.ALPHA_ENTROPY),
            "val_acc": self.metric(*VAL_ACC_METRICS),
            "test_acc": self.metric(layout.TEST_ACC),
            "status": self.status,
            "experiment_id": self.experiment_id,
        }


@dataclass(frozen=True)
class Skipped:
    """A selected run that could not be compared, and why."""

    run_id: str
    run_name: str
    experiment: str
    reason: str  # one line, printed under the table

    def __str__(self) -> str:
        return f"{self.run_id} ({self.run_name}, {self.experiment}): {self.reason}"


@dataclass
class Selection:
    """The runs that compare, the runs skipped, and the store they came from."""

    tracking_uri: str
    records: list[RunRecord] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    description: str = ""

    def by_data_set(self) -> dict[str, Selection]:
        """The selection split by data set (one entry when all runs share one): runs on
        different data have no best run or Pareto front in common."""
        groups: dict[str, list[RunRecord]] = {}
        for r in self.records:
            groups.setdefault(r.data_set, []).append(r)
        if len(groups) <= 1:
            return {r.data_set: self for r in self.records[:1]}
        return {
            name: Selection(self.tracking_uri, runs, [], f"{self.description}, data set {name}")
            for name, runs in sorted(groups.items())
        }

    def table(self) -> pd.DataFrame:
        """One row per run, in :data:`COLUMNS` order (``params`` and ``cycles`` as integers)."""
        df = pd.DataFrame([r.row() for r in self.records], columns=list(COLUMNS))
        for col in ("seed", "params", *BUDGET_COLUMNS):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
        return df

    def record(self, ref: str) -> RunRecord:
        """The selected run that ``ref`` names: a run id, an id prefix or a run name.

        A full id always wins; otherwise ``ref`` must name exactly one run, so that
        ``--diff`` never silently compares a run the user did not mean.
        """
        exact = [r for r in self.records if r.run_id == ref]
        matches = exact or [
            r for r in self.records if r.run_id.startswith(ref) or r.run_name == ref
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise CompareError(
                f"run {ref!r} is not among the selected runs ({len(self.records)} selected)"
            )
        listed = ", ".join(f"{r.run_id} ({r.run_name}, {r.experiment})" for r in matches)
        raise CompareError(
            f"run {ref!r} is ambiguous: it matches {len(matches)} selected runs: {listed}; give "
            "more of the run id"
        )


# ---------------------------------------------------------------------- selection


def _experiment_ids(client: MlflowClient, names: Sequence[str]) -> dict[str, str]:
    """Experiment name -> id; an unknown name is a one-line error listing the known ones."""
    known = {
        e.name: e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    }
    missing = [n for n in names if n not in known]
    if missing:
        listed = ", ".join(sorted(n for n in known if n != COMPARISON_EXPERIMENT)) or "(none)"
        raise CompareError(
            f"experiment {missing[0]!r} not found in {_store_name(client)}; known experiments: "
            f"{listed}"
        )
    if names:
        return {n: known[n] for n in names}
    return {n: i for n, i in known.items() if n != COMPARISON_EXPERIMENT}


def _store_name(client: MlflowClient) -> str:
    return str(client.tracking_uri)


def _search(client: MlflowClient, experiment_ids: Iterable[str], filter_string: str) -> list[Run]:
    ids = list(experiment_ids)
    if not ids:
        return []
    runs: list[Run] = []
    token = None
    while True:
        try:
            page = client.search_runs(
                ids,
                filter_string=filter_string,
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=1000,
                page_token=token,
            )
        except MlflowException as exc:
            from ..tracking.health import store_failure

            failure = store_failure(exc, client.tracking_uri)  # not the filter's fault
            if failure is not None:
                raise failure from None
            first = first_line(exc.message if hasattr(exc, "message") else exc)
            raise CompareError(
                f"--filter {filter_string!r} is not a valid MLflow search expression: {first}"
            ) from None
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _get_run(client: MlflowClient, run_id: str) -> Run:
    """The run ``run_id`` names: an id, an id prefix (as the tables print them) or a name."""
    try:
        return find_run(client, run_id, _store_name(client))
    except RunNotFound as exc:
        raise CompareError(str(exc)) from None


def _and(*parts: str) -> str:
    return " and ".join(f"({p})" if " or " in p.lower() else p for p in parts if p)


def is_bookkeeping(run: Run) -> bool:
    """A run that only groups others (a comparison run, a study's parent run, a multi-seed
    trial's run): no genotype of its own."""
    tags = run.data.tags
    kind = tags.get(layout.TAG_RUN_KIND)
    return (
        kind in (layout.KIND_COMPARISON, layout.KIND_STUDY, layout.KIND_TRIAL)
        or tags.get(layout.TAG_STUDY_PARENT) == "true"
    )


def find_runs(
    client: MlflowClient,
    *,
    experiments: Sequence[str] = (),
    run_ids: Sequence[str] = (),
    filter_string: str = "",
    study: str = "",
    baseline: Sequence[str] = (),
) -> list[Run]:
    """The MLflow runs the selection names, in a stable order, without duplicates.

    Explicit ``run_ids`` are always included; experiments, filter and study
    select by search (every experiment except the comparisons one when no
    experiment is named), which leaves out comparison and study-parent runs.
    """
    runs: list[Run] = [_get_run(client, rid) for rid in run_ids]
    for ref in baseline:  # a baseline set: the ASO-SE run and its control arms (asolab baseline)
        source = _get_run(client, ref).info.run_id  # the arms are tagged with the full id
        exp_ids = _experiment_ids(client, experiments)
        found = _search(
            client,
            exp_ids.values(),
            _and(filter_string, f"tags.`{layout.TAG_BASELINE_OF}` = '{source}'"),
        )
        if not found:
            raise CompareError(
                f"--baseline {source}: no runs tagged {layout.TAG_BASELINE_OF}={source!r} in "
                f"{_store_name(client)}; make them with: asolab baseline {source}"
            )
        runs.extend(found)
    if (experiments or filter_string or study or not run_ids) and not baseline:
        exp_ids = _experiment_ids(client, experiments)
        study_filter = f"tags.`{layout.TAG_STUDY}` = '{study}'" if study else ""
        found = [
            r
            for r in _search(client, exp_ids.values(), _and(filter_string, study_filter))
            if not is_bookkeeping(r)
        ]
        if study:
            # A parent run without the parent tag (made by hand or by an older version)
            # carries the study tag too: prefer the runs that are trials.
            found = [r for r in found if layout.TAG_TRIAL in r.data.tags] or found
        if study and not found:
            raise CompareError(
                f"no runs tagged {layout.TAG_STUDY}={study!r} in {_store_name(client)}"
            )
        runs.extend(found)
    unique = list({r.info.run_id: r for r in runs}.values())  # a run named and also found: once
    unique.sort(key=lambda r: (r.info.experiment_id, r.info.start_time or 0, r.info.run_id))
    return unique


def _metric_value(run: Run, name: str) -> float | None:
    """The run's latest value of metric ``name``; None when it was never logged or is NaN."""
    v = run.data.metrics.get(name)
    return None if v is None or math.isnan(v) else float(v)


def rank_by_metric(runs: Sequence[Run], by: str, ascending: bool = False) -> list[Run]:
    """``runs`` best first by metric ``by`` (highest first unless ``ascending``); runs without
    it last.

    When no run has the metric at all (most often a misspelt name), ranking
    would return the runs in arbitrary order, so that is an error naming the
    metric and the metrics the runs do have.
    """
    if runs and all(_metric_value(r, by) is None for r in runs):
        known = sorted({m for r in runs for m in r.data.metrics})
        close = difflib.get_close_matches(by, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CompareError(
            f"--by {by!r}: no selected run has this metric{hint}; "
            f"the selected runs have: {', '.join(known) or '(no metrics)'}"
        )

    def key(r: Run) -> tuple[bool, float]:
        v = _metric_value(r, by)
        return (v is None, 0.0 if v is None else (v if ascending else -v))

    return sorted(runs, key=key)  # stable: ties keep the selection's order


def experiment_names(client: MlflowClient, runs: Iterable[Run]) -> dict[str, str]:
    names: dict[str, str] = {}
    for r in runs:
        eid = r.info.experiment_id
        if eid not in names:
            names[eid] = client.get_experiment(eid).name
    return names


def load_selection(
    tracking_uri: str | None = None,
    *,
    experiments: Sequence[str] = (),
    run_ids: Sequence[str] = (),
    filter_string: str = "",
    study: str = "",
    top: int = 0,
    by: str = layout.FINAL_VAL_ACC,
    ascending: bool = False,
    baseline: Sequence[str] = (),
) -> Selection:
    """Select runs and read each one's records; runs without a genotype are skipped.

    With ``top``, the ``top`` best runs by metric ``by`` that have a genotype are
    compared; skipped runs are those ranked above the last compared one.
    """
    uri = resolve_tracking_uri(tracking_uri or "")
    client = existing_store(uri)
    runs = find_runs(
        client,
        experiments=experiments,
        run_ids=run_ids,
        filter_string=filter_string,
        study=study,
        baseline=baseline,
    )
    if top:
        runs = rank_by_metric(runs, by, ascending)
    names = experiment_names(client, runs)
    selection = Selection(
        uri, description=describe(experiments, run_ids, filter_string, study, top, by, baseline)
    )
    for run in runs:
        # --top counts compared runs: a run without a genotype does not take a place,
        # and runs ranked below the K-th compared one are never read.
        if top and len(selection.records) == top:
            break
        name = run.info.run_name or run.data.tags.get(layout.MLFLOW_RUN_NAME, "")
        exp = names[run.info.experiment_id]
        try:
            genotype = final_genotype(client, run)
        except ValueError as exc:
            selection.skipped.append(Skipped(run.info.run_id, name, exp, str(exc)))
            log.info("skipping run %s: %s", run.info.run_id, exc)
            continue
        selection.records.append(
            RunRecord(
                run.info.run_id,
                name,
                exp,
                run.info.status,
                dict(run.data.params),
                dict(run.data.tags),
                dict(run.data.metrics),
                genotype,
                run.info.experiment_id,
            )
        )
    return selection


def describe(
    experiments: Sequence[str],
    run_ids: Sequence[str],
    filter_string: str,
    study: str,
    top: int,
    by: str,
    baseline: Sequence[str] = (),
) -> str:
    """The selection in words (report title, comparison-run param)."""

    def short(ref: str) -> str:  # a full run id as the tables print it; a prefix or name as given
        return layout.short_id(ref) if re.fullmatch(r"[0-9a-f]{32}", ref) else ref

    parts = [f"control arms of {short(b)}" for b in baseline]
    if experiments:
        parts.append("experiments " + ", ".join(experiments))
    if run_ids:
        parts.append("runs " + ", ".join(short(r) for r in run_ids))
    if study:
        parts.append(f"study {study}")
    if filter_string:
        parts.append(f"filter {filter_string}")
    if top:
        parts.append(f"top {top} by {by}")
    return "; ".join(parts) or "all experiments"

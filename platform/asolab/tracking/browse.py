"""What a researcher sees in the MLflow UI: the experiment's kind, description and
default runs-table view, the address that opens it, and each run's description.

MLflow 3's UI opens an experiment in its GenAI view (traces, judges) unless the
experiment tag ``mlflow.experimentKind`` says it is model development, or the URL
carries ``workflowType=machine_learning``. The runs table takes its filter and
sort from URL parameters (``searchFilter``, ``orderByKey``, ``orderByAsc``); its
columns only from the UI's own state, which the UI's "share view" feature loads
from an experiment tag ``mlflow.sharedViewState.<key>`` named by the URL
parameter ``viewStateShareKey``. asolab writes such a tag when it creates (or
first meets) an experiment, so the URL it prints opens the table with the
columns a researcher reads first.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from . import layout as L

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

DEFAULT_UI = "http://127.0.0.1:5000"  # where ``asolab ui`` serves by default
# Newest first, the UI's default: the only order in which it nests trials under their study's run.
SORT_KEY = "attributes.start_time"


def column(kind: str, name: str) -> str:
    """The UI's id of a runs-table column: ``metrics.`test_acc```, ``params.`x```."""
    return f"{kind}.`{name}`"


def view_state(expanded: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The runs table's shared view: asolab's columns, newest first, the ``expanded`` parent
    runs (studies) open on their trials, every other field at the UI's default (the view
    replaces the whole UI state)."""
    columns = [column("metrics", m) for m in L.VIEW_METRICS]
    columns += [column("params", p) for p in L.VIEW_PARAMS]
    columns += [column("tags", t) for t in L.VIEW_TAGS]
    return {
        "searchFilter": "",
        "orderByKey": SORT_KEY,
        "orderByAsc": False,
        "selectedColumns": columns,
        "columnOrder": [],
        "columnWidths": {},
        "runsExpanded": {run_id: True for run_id in expanded},
        "runsPinned": [],
        "runsHidden": [],
        "runsVisibilityMap": {},
        "runsHiddenMode": "FIRST_10_RUNS",
        "viewMaximized": False,
        "runListHidden": False,
        "isAccordionReordered": False,
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "groupBy": None,
        "groupsExpanded": {},
        "autoRefreshEnabled": True,
        "globalLineChartConfig": {
            "xAxisKey": "step",
            "lineSmoothness": 0,
            "selectedXAxisMetricKey": "",
        },
    }


def experiment_description(name: str) -> str:
    return (
        f"ASO-SE architecture search runs of **{name}** (asolab). Each run: its description "
        "(genotype, accuracy, budget), the picture cells/final.png, genotypes/final.json. Study "
        f"trials are nested under their study's run; the best trial has the tag {L.TAG_BEST} = "
        "true. Model selection uses the validation split; test_acc is reported, never optimised."
    )


def experiment_tags(name: str) -> dict[str, str]:
    """The tags that make the UI show an experiment as model training, described, with a view."""
    return {
        L.TAG_EXPERIMENT_KIND: L.EXPERIMENT_KIND,
        L.TAG_NOTE: experiment_description(name),
        L.TAG_VIEW_STATE: json.dumps(view_state()),
    }


def tag_experiment(
    client: MlflowClient, experiment_id: str, name: str, existing: dict[str, str]
) -> None:
    """Set whichever of :func:`experiment_tags` the experiment lacks (a user's own kept)."""
    for key, value in experiment_tags(name).items():
        if key not in existing:
            client.set_experiment_tag(experiment_id, key, value)


def refresh_view(client: MlflowClient, experiment_id: str) -> None:
    """Rewrite the experiment's asolab view so that every study's run opens on its trials."""
    parents = client.search_runs(
        [experiment_id], "tags.`asolab.study_parent` = 'true'", max_results=50
    )
    state = view_state([r.info.run_id for r in parents])
    client.set_experiment_tag(experiment_id, L.TAG_VIEW_STATE, json.dumps(state))


def runs_url(base: str, experiment_id: str | None = None, search_filter: str = "") -> str:
    """The UI address of the experiment's runs table in the model-training view, with
    asolab's columns (or the experiment list, without an experiment)."""
    base = base.rstrip("/")
    if experiment_id is None:
        return f"{base}/#/experiments?{L.WORKFLOW_PARAM}"
    query = f"viewStateShareKey={L.VIEW_KEY}&{L.WORKFLOW_PARAM}"
    if search_filter:
        query += "&searchFilter=" + urllib.parse.quote(search_filter)
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """The UI address of one run's overview."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{L.WORKFLOW_PARAM}"


def artifact_url(run_id: str, path: str) -> str:
    """A run artifact's address relative to the UI's root, for images in a run description."""
    query = urllib.parse.urlencode({"path": path, "run_uuid": run_id})
    return f"get-artifact?{query}"


def _fmt(value: Any) -> str:
    """A value as asolab writes it for reading: 4 decimals, thousands separated."""
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def run_description(
    run_id: str, head: dict[str, Any], genotype: str, details: dict[str, Any]
) -> str:
    """A run's Markdown description. What the UI shows before "Show more" (its first
    100 px) comes first: the genotype, then a strip of the cells (a link to their
    picture) and one line of ``head`` (accuracies, parameters, peak memory, wall time);
    then the full picture and the ``details`` (data set, budget, knobs), one per line.

    No Markdown tables: the UI draws them without cell padding, so that a header runs
    together ("seedval acc"); lines of "key **value**" read the same everywhere."""
    picture = artifact_url(run_id, L.FINAL_CELLS_ARTIFACT)
    thumb = f"[![final cells]({artifact_url(run_id, L.FINAL_CELLS_THUMB_ARTIFACT)})]({picture})"
    lines = [
        f"**Final genotype** `{genotype}`",
        "",
        # the strip of cells opens the picture: the UI shows ~100 px before "Show more"
        f"{thumb} " + " · ".join(f"{k} **{_fmt(v)}**" for k, v in head.items()),
        "",
        f"![final cells]({picture})",
        "",
        *(f"- {k}: {_fmt(v)}" for k, v in details.items()),
        "",
        "Test accuracy is reported, never selected on. The genotype's canonical form above "
        "is what `Genotype.parse` reads back (also in `genotypes/final.json`).",
        "",
    ]
    return "\n".join(lines)

"""What a recorded MLflow run holds that tracking/layout.py does not declare.

Used by the end-to-end tests of a run (test_tracking), a study (test_study) and a
comparison (test_compare): every name any of them writes must be in the layout.
"""

from __future__ import annotations

from collections.abc import Iterable

from mlflow import MlflowClient

from asolab.tracking import layout


def _artifact_paths(client: MlflowClient, run_id: str, folder: str | None = None) -> list[str]:
    out: list[str] = []
    for a in client.list_artifacts(run_id, folder):
        out += _artifact_paths(client, run_id, a.path) if a.is_dir else [a.path]
    return out


def undeclared(client: MlflowClient, run_id: str, config_keys: Iterable[str] = ()) -> list[str]:
    """``kind name`` for every metric, tag, param and artifact of the run that the
    layout does not declare (MLflow's own ``mlflow.*`` tags it sets itself excepted)."""
    run = client.get_run(run_id)
    keys = tuple(config_keys)
    found = [("metric", k) for k in run.data.metrics]
    found += [("tag", k) for k in run.data.tags if not k.startswith("mlflow.") or k in layout.TAGS]
    found += [("param", k) for k in run.data.params]
    found += [("artifact", p) for p in _artifact_paths(client, run_id)]
    for dataset in run.inputs.dataset_inputs if run.inputs else []:
        found += [("tag", t.key) for t in dataset.tags]
    return [f"{kind} {name}" for kind, name in found if not layout.declared(kind, name, keys)]

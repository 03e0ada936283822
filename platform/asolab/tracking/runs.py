"""Reading what a recorded run holds: its artifacts and its genotypes.

The tracker writes them (names from :mod:`asolab.tracking.layout`); compare,
baseline and the ranking diagnostic read them back through these helpers.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ..space.genotype import Genotype
from . import layout

log = logging.getLogger(__name__)

_CYCLE_RE = re.compile(r"cycle_(\d+)\.json$")


def read_artifact(client: MlflowClient, run_id: str, path: str) -> str | None:
    """Text of one artifact, or None when the run has no such artifact."""
    folder, _, name = path.rpartition("/")
    try:
        listed = {Path(a.path).name for a in client.list_artifacts(run_id, folder or None)}
    except (MlflowException, OSError):
        return None
    if name not in listed:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(run_id, path, tmp)
        return Path(local).read_text()


def final_genotype(client: MlflowClient, run: Run) -> Genotype:
    """The run's final genotype: its final-genotype tag, which comes with the run (no
    request of its own: ``compare`` over a remote store with hundreds of runs made two per
    run), else ``genotypes/final.json``. The artifact is read where the tag is missing,
    may be cut short (as long as the tracker's cap) or does not parse.

    Raises ``ValueError`` saying what is missing or unparsable.
    """
    tag = run.data.tags.get(layout.TAG_FINAL_GENOTYPE, "")
    from_tag, tag_error = None, None
    try:
        from_tag = Genotype.parse(tag) if tag else None
    except ValueError as exc:
        tag_error = f"tag {layout.TAG_FINAL_GENOTYPE} does not parse ({exc})"
    if from_tag is not None and len(tag) < layout.MAX_TAG_LENGTH:
        return from_tag
    text = read_artifact(client, run.info.run_id, layout.FINAL_GENOTYPE_ARTIFACT)
    if text is not None:
        try:
            return Genotype.from_json(text)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{layout.FINAL_GENOTYPE_ARTIFACT} does not parse ({exc})") from None
    if from_tag is not None:  # as long as the cap, and no artifact to say more
        return from_tag
    raise ValueError(
        tag_error or f"no {layout.FINAL_GENOTYPE_ARTIFACT} artifact (status {run.info.status})"
    )


def cycle_genotypes(client: MlflowClient, run_id: str) -> list[tuple[int, Genotype]]:
    """Every ``genotypes/cycle_NNN.json`` of a run as ``(cycle, genotype)``, by cycle.

    Artifacts that do not parse are logged and left out.
    """
    try:
        listed = client.list_artifacts(run_id, layout.GENOTYPE_DIR)
    except (MlflowException, OSError):
        return []
    cycles = sorted((int(m.group(1)), a.path) for a in listed if (m := _CYCLE_RE.search(a.path)))
    out = []
    if not cycles:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(client.download_artifacts(run_id, layout.GENOTYPE_DIR, tmp))
        for cycle, path in cycles:
            try:
                out.append((cycle, Genotype.from_json((local / Path(path).name).read_text())))
            except (ValueError, KeyError, TypeError, OSError) as exc:
                log.warning("run %s: %s does not parse (%s); left out", run_id, path, exc)
    return out

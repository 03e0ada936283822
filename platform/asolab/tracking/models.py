"""The final network as an MLflow logged model: created (or found again after a
kill), saved as a pyfunc model whose files hold no code (tracking/predictor.py)
with the tracker's own client, and linked to its run."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import mlflow.pyfunc  # imported here, not at the run's end: its first import takes a second
import numpy as np
import torch
from mlflow.entities import LoggedModel, LoggedModelOutput, LoggedModelStatus
from mlflow.models import Model, ModelSignature
from mlflow.types import ColSpec, Schema, TensorSpec

from ..runner.events import RunEnd
from ..version import __version__
from . import layout as L
from . import predictor


class ModelLogging:
    """Logging the final model (a part of :class:`~asolab.tracking.MlflowTracker`)."""

    def _final_model(self) -> LoggedModel:
        """The run's logged model for its final network: a new one, or, in a resumed run
        killed while logging it, the one it began (it holds the final metrics already;
        a second one would leave that one PENDING for good, beside a copy without them)."""
        if self.resume_run_id:
            begun = self._c.search_logged_models(
                [self.experiment_id], filter_string=f"source_run_id = '{self.run_id}'"
            )
            # (one that holds the final metrics first, should an older version have left two)
            named = sorted(
                (m for m in begun if m.name == L.MODEL_NAME), key=lambda m: not m.metrics
            )
            if named:
                return named[0]
        return self._c.create_logged_model(
            self.experiment_id,
            name=L.MODEL_NAME,
            source_run_id=self.run_id,
            model_type="asolab-derived-network",
        )

    def _log_model(self, event: RunEnd, logged: LoggedModel, step: int) -> None:
        """Save the final network into the logged model ``logged`` (created or found by
        :meth:`_final_model`), with this tracker's client only, and link the run to it.

        The model is an MLflow ``python_function`` model whose files hold no code: the
        network's spec, genotype and preprocessing as JSON and its weights as plain
        tensors (tracking/predictor.py); ``mlflow.pyfunc`` loads it through the installed
        asolab (its ``loader_module``), and ``asolab.load_model`` reads only those files.
        ``mlflow.pyfunc.log_model`` would write through the process-wide tracking URI,
        which a library must not change; what it does for a logged model that already
        exists is: save the model with its metadata, upload the folder, mark it READY.
        """
        model_id = logged.model_id
        if logged.status == LoggedModelStatus.READY:
            # Logged completely before a kill: only the run's link and tag may be missing.
            self._link_model(model_id, f"models:/{model_id}", step)
            return
        logged = self._c.get_logged_model(model_id)
        meta = Model(artifact_path=logged.artifact_location, model_uuid=model_id, model_id=model_id)
        try:
            with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
                network = Path(tmp) / Path(L.MODEL_NETWORK_DIR).name
                predictor.save(network, event.supernet, event.genotype, event.preprocessing)
                local = os.path.join(tmp, L.MODEL_DIR)
                # (its warning that no input example was given: the signature says it all;
                # the text starts with a colour code, hence the leading ".*")
                warnings.filterwarnings("ignore", message=".*An input example was not provided")
                mlflow.pyfunc.save_model(
                    local,
                    loader_module=L.MODEL_LOADER,
                    data_path=str(network),
                    mlflow_model=meta,
                    signature=_signature(event.preprocessing),
                    # Inferring requirements would load the model in a subprocess: slow,
                    # and we know them.
                    pip_requirements=[
                        f"torch=={torch.__version__.split('+')[0]}",
                        f"asolab=={__version__}",
                    ],
                )
                self._c.log_model_artifacts(model_id, local)
        except BaseException:
            self._c.finalize_logged_model(model_id, LoggedModelStatus.FAILED)
            raise
        self._c.finalize_logged_model(model_id, LoggedModelStatus.READY)
        self._link_model(model_id, meta.get_model_info(logged).model_uri, step)

    def _link_model(self, model_id: str, model_uri: str, step: int) -> None:
        """The run's output link to its model (once, also across a resume) and its tag."""
        linked = self.resume_run_id and any(
            o.model_id == model_id for o in self._c.get_run(self.run_id).outputs.model_outputs
        )
        if not linked:
            self._c.log_outputs(self.run_id, models=[LoggedModelOutput(model_id, step=step)])
        self._c.set_tag(self.run_id, L.TAG_MODEL_URI, model_uri)


def _signature(pre: dict[str, Any]) -> ModelSignature:
    """Raw uint8 images ``(N, H, W, C)`` in, ``class`` and ``probability`` out: pyfunc
    refuses float input (normalised or not) before the model sees it."""
    shape = (-1, int(pre["height"]), int(pre["width"]), int(pre["in_channels"]))
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.uint8), shape)]),
        outputs=Schema([ColSpec("string", "class"), ColSpec("double", "probability")]),
    )

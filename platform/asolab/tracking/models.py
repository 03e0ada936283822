"""The final network as an MLflow logged model: created (or found again after a
kill), saved in the mlflow.pytorch format with the tracker's own client, and
linked to its run."""

from __future__ import annotations

import logging
import os
import tempfile
from contextlib import nullcontext

import mlflow.pytorch  # imported here, not at the run's end: its first import takes a second
import torch
from mlflow.entities import LoggedModel, LoggedModelOutput, LoggedModelStatus
from mlflow.models import Model

from ..runner.events import RunEnd
from ..version import __version__
from . import layout as L


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
        """Save the final network in the mlflow.pytorch format into the logged model
        ``logged`` (created or found by :meth:`_final_model`), with this tracker's client
        only, and link the run to it.

        ``mlflow.pytorch.log_model`` would write through the process-wide tracking URI,
        which a library must not change; what it does for a logged model that already
        exists is: save the model with its metadata, upload the folder, mark it READY.
        """
        model_id = logged.model_id
        if logged.status == LoggedModelStatus.READY:
            # Logged completely before a kill: only the run's link and tag may be missing.
            self._link_model(model_id, f"models:/{model_id}", step)
            return
        from ..space.network import exported, extract

        net = event.supernet
        # On the CPU the supernet itself, its unused ops swapped out while it is saved
        # (a copy took a third of the tracker's time in a default run); a GPU network
        # is copied to the CPU, so that the model loads on machines without one.
        on_cpu = all(p.device.type == "cpu" for p in net.parameters())
        final = (
            exported(net, event.genotype) if on_cpu else nullcontext(extract(net, event.genotype))
        )
        logged = self._c.get_logged_model(model_id)
        meta = Model(artifact_path=logged.artifact_location, model_uuid=model_id, model_id=model_id)
        quiet = logging.getLogger(
            "mlflow.pytorch"
        )  # its pickle-format warning would repeat every run
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                local = os.path.join(tmp, L.MODEL_DIR)
                with final as model:
                    mlflow.pytorch.save_model(
                        model,
                        local,
                        mlflow_model=meta,
                        # The derived network runs data-dependent plans; pickle keeps it exactly
                        # as trained.
                        serialization_format="pickle",
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
        finally:
            quiet.setLevel(level)
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

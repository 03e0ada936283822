"""The MLflow observer: records a run's events in an MLflow tracking store.

What goes where is fixed in :mod:`asolab.tracking.layout`. Epoch metrics are
buffered and written with one ``log_batch`` at each checkpoint, and at an
epoch's end once the last write is ``LIVE_SECONDS`` old (so the UI's charts
follow a long phase), so logging costs a few store round trips per cycle.

Exactly-once on resume: the runner replays the phases after its last uploaded
checkpoint. Metrics are flushed before the checkpoint is uploaded, and a
resumed tracker reads the highest step it already holds for every metric and
drops anything at or below it, so a run killed at any point (SIGKILL included)
and resumed has exactly one value per metric and step. The tracker keeps no
memory across events that a restart would lose: what a cycle's mutation did
arrives again with the cycle's end (``CycleEnd.mutation_edits`` and
``CycleEnd.growth``, which the runner checkpoints). A run killed while its
final model was being logged finishes that same logged model on resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException

from ..config import ExperimentConfig, config_json
from ..errors import first_line
from ..runner.checkpoint import config_hash
from ..runner.events import (
    CheckpointSaved,
    CycleEnd,
    EpochEnd,
    FinalPlan,
    GrowthEvent,
    MutationEvent,
    Observer,
    RunEnd,
    RunInterrupted,
    RunStart,
)
from ..runner.gpubusy import ALL
from ..runner.pace import Pace
from ..space.genotype import Genotype
from ..space.plot import drawing_note, genotype_png, thumbnail_png
from ..version import __version__
from . import layout as L
from . import lease
from .describe import describe_run, edit_record, genotype_record, git_commit, threads_text
from .models import ModelLogging
from .provenance import plugin_tags
from .store import ensure_experiment, open_store, resolve_tracking_uri, resumable_run, sqlite_path
from .writer import WRITE_MODES, StoreWriter

log = logging.getLogger(__name__)

_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch
LIVE_SECONDS = 30.0  # buffered metrics wait at most this long (plus an epoch) for the store
_PARAM_BATCH = 100
_MAX_PARAM = 6000


class MlflowTracker(ModelLogging, Observer):
    """Records one run (new, resumed, or a study's child run) in MLflow.

    ``tracking_uri`` defaults to the config's ``tracking.tracking_uri``, then
    ``MLFLOW_TRACKING_URI``, then ``mlruns/mlflow.db``; ``experiment`` to the
    config's ``tracking.experiment``, then its name. ``resume_run_id``
    continues that run instead of creating one. ``run_id`` is set once
    ``on_run_start`` has created or resumed the run. ``write_mode`` says where
    store writes run (see ``StoreWriter``): ``auto`` (inline for a local SQLite
    store, on a thread for anything else), ``inline`` or ``thread``.
    """

    def __init__(
        self,
        *,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        log_models: bool = True,
        write_mode: str = "auto",
    ) -> None:
        if write_mode not in WRITE_MODES:
            raise ValueError(
                f"write_mode must be one of {', '.join(WRITE_MODES)}, got {write_mode!r}"
            )
        self._uri_arg = tracking_uri
        self._experiment_arg = experiment
        self._run_name = run_name
        self.parent_run_id = parent_run_id
        self.resume_run_id = resume_run_id
        self.extra_tags = dict(tags or {})
        self.log_models = log_models
        self._write_mode = write_mode
        self.run_id: str | None = None
        self.tracking_uri: str | None = None
        self.experiment_id: str | None = None
        self.client: MlflowClient | None = None
        self._pending: list[Metric] = []
        self._pending_tags: dict[str, str] = {}
        # per metric: the highest step already logged (read back from the store on resume);
        # steps only grow, so anything at or below it is a replay or a repeat and is dropped
        self._logged_max: dict[str, int] = {}
        self._last_flush = time.perf_counter()
        self._unsent: CheckpointSaved | None = None  # the latest checkpoint not uploaded yet
        self._closed = False
        self._writer = StoreWriter(inline=write_mode == "inline")
        self._uploads = 0
        self.log_seconds = 0.0  # time the training loop spent inside this observer
        self._config: ExperimentConfig | None = None  # for the run's description at its end
        self._final_epochs = 0  # fitted to search.budget_minutes (0: not fitted)
        self._dataset = ""
        self._data_notes: dict[str, str] = {}  # what the data did not say, for the description
        self._pace = Pace()  # says a slow epoch (the asolab.slow_epoch tag)

    # ------------------------------------------------------------------ helpers

    @property
    def _c(self) -> MlflowClient:
        assert self.client is not None and self.run_id is not None, "on_run_start has not run"
        return self.client

    def _metric(self, key: str, value: float, step: int, model_id: str | None = None) -> None:
        if step <= self._logged_max.get(key, -1):
            return
        self._logged_max[key] = step
        self._pending.append(
            Metric(key, float(value), int(time.time() * 1000), int(step), model_id=model_id)
        )

    def _tag(self, key: str, value: str) -> None:
        self._pending_tags[key] = str(value)[: L.MAX_TAG_LENGTH]

    def flush(self) -> None:
        """Write (or queue) buffered metrics and tags, in as few requests as MLflow allows."""
        if self.run_id is None or (not self._pending and not self._pending_tags):
            return
        metrics, self._pending = self._pending, []
        pending_tags, self._pending_tags = self._pending_tags, {}
        self._last_flush = time.perf_counter()
        pending_tags[L.TAG_LEASE] = lease.tag_value()  # the heartbeat: this process runs it
        tags = [RunTag(k, v) for k, v in pending_tags.items()]
        try:
            # In submission order with the artifacts, so that a checkpoint written after
            # these metrics is never in the store before them.
            self._writer.submit(self._write_batch, metrics, tags)
        except BaseException:
            # Not written (an inline write hit Ctrl-C or a store error, or the thread had
            # failed): keep the batch, so the end-of-run handler's flush writes it.
            self._pending = metrics + self._pending
            self._pending_tags = {**pending_tags, **self._pending_tags}
            raise

    def _write_batch(self, metrics: list[Metric], tags: list[RunTag]) -> None:
        for i in range(0, max(len(metrics), 1), _BATCH):
            self._c.log_batch(
                self.run_id, metrics=metrics[i : i + _BATCH], tags=tags if i == 0 else ()
            )

    @property
    def write_seconds(self) -> float:
        """Time spent in store writes (inline, or on the writer thread beside the training loop)."""
        return self._writer.busy_seconds

    def _artifact_text(self, text: str, path: str) -> None:
        self._writer.submit(self._c.log_text, self.run_id, text, path)

    def _artifact_png(self, genotype: Genotype, title: str, path: str) -> None:
        self._writer.submit(self._upload_png, genotype, title, path)

    def _upload_png(self, genotype: Genotype, title: str, path: str) -> None:
        folder, _, name = path.rpartition("/")
        with tempfile.TemporaryDirectory(prefix="asolab-art-") as tmp:
            local = Path(tmp) / name
            local.write_bytes(genotype_png(genotype, title=title))
            self._c.log_artifact(self.run_id, str(local), folder or None)
            if path == L.FINAL_CELLS_ARTIFACT:  # the strip the run's description leads with
                thumb = Path(tmp) / L.FINAL_CELLS_THUMB_ARTIFACT.rpartition("/")[2]
                thumb.write_bytes(thumbnail_png(local.read_bytes()))
                self._c.log_artifact(self.run_id, str(thumb), folder or None)

    def _upload_checkpoint(self, path: str) -> None:
        # Upload a snapshot: the runner replaces checkpoint.pt after the next phase, and
        # the store must never hold a checkpoint newer than the metrics flushed before it.
        src = Path(path)
        self._uploads += 1
        snap_dir = src.parent / f".upload-{self._uploads}"
        snap_dir.mkdir(parents=True, exist_ok=True)
        snap = snap_dir / L.CHECKPOINT_ARTIFACT.rpartition("/")[2]
        try:
            os.link(src, snap)  # instant; keeps this version even after os.replace
        except OSError:
            shutil.copy2(src, snap)

        def upload() -> None:
            try:
                self._c.log_artifact(self.run_id, str(snap), L.CHECKPOINT_DIR)
            finally:
                shutil.rmtree(snap_dir, ignore_errors=True)

        self._writer.submit(upload)

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.log_seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ run start

    def _experiment_name(self, cfg: ExperimentConfig) -> str:
        return self._experiment_arg or cfg.tracking.experiment or cfg.name

    def on_run_start(self, event: RunStart) -> None:
        with self._timed():
            cfg = event.config
            self._config, self._dataset = cfg, str(event.data.get("name", cfg.data.name))
            self._data_notes = dict(event.data.get("notes", {}))
            self._final_epochs = event.final_epochs
            self.tracking_uri = resolve_tracking_uri(self._uri_arg or cfg.tracking.tracking_uri)
            open_store(self.tracking_uri)  # study workers starting at once on a new store
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            if self._write_mode == "auto":
                self._writer.inline = sqlite_path(self.tracking_uri) is not None
            self.log_models = self.log_models and cfg.tracking.log_models
            if self.resume_run_id:
                self._resume(self.resume_run_id, event.resumed_from)
                self._tag(L.TAG_THREADS, threads_text(event))
            else:
                self._create(event)
            self.flush()
            log.info("MLflow run %s in %s", self.run_id, self.tracking_uri)

    def _create(self, event: RunStart) -> None:
        cfg = event.config
        client = self.client
        assert client is not None
        self.experiment_id = ensure_experiment(
            client, self.tracking_uri or "", self._experiment_name(cfg)
        )
        commit = git_commit()
        tags = {
            L.TAG_VERSION: __version__,
            L.TAG_GIT_COMMIT: commit,
            L.MLFLOW_GIT_COMMIT: commit,
            L.TAG_DATASET: str(event.data.get("name", cfg.data.name)),
            **{L.TAG_DATA_NOTE + k: v for k, v in event.data.get("notes", {}).items()},
            L.TAG_DEVICE: event.device,
            **{L.TAG_DEVICE_INFO + k: v for k, v in event.device_info.items()},
            L.TAG_HOST: socket.gethostname(),
            L.TAG_RUN_KIND: L.KIND_RUN,
            L.TAG_THREADS: threads_text(event),
            L.TAG_CONFIG_HASH: config_hash(cfg.to_dict()),
            L.TAG_LEASE: lease.tag_value(),
            **plugin_tags(cfg),
            **self.extra_tags,
        }
        if self.parent_run_id:
            tags[L.MLFLOW_PARENT_RUN] = self.parent_run_id
        if drawing_note():  # no graphviz: the run says its pictures may crowd
            tags[L.TAG_CELLS_NOTE] = drawing_note()
        run = client.create_run(self.experiment_id, tags=tags, run_name=self._run_name)
        lease.take(self.tracking_uri or "", run.info.run_id)
        self.run_id = run.info.run_id
        if not self._run_name:
            data = event.data.get("name", cfg.data.name)
            name = f"{data}-seed{cfg.seed}-{L.short_id(self.run_id)}"
            client.update_run(self.run_id, name=name)
        params = [
            Param(k, json.dumps(v) if isinstance(v, (list, tuple)) else str(v)[:_MAX_PARAM])
            for k, v in cfg.flat().items()
        ]
        if event.final_epochs:  # a control arm trains the count its ASO-SE run fitted
            params.append(Param(L.PARAM_FINAL_EPOCHS_FITTED, str(event.final_epochs)))
        for i in range(0, len(params), _PARAM_BATCH):
            client.log_batch(self.run_id, params=params[i : i + _PARAM_BATCH])
        self._artifact_text(config_json(cfg), L.CONFIG_ARTIFACT)
        self._artifact_text(
            json.dumps(
                {"data": event.data, "arch": event.arch, "total_epochs": event.total_epochs},
                indent=2,
                default=str,
            ),
            L.RUN_INFO_ARTIFACT,
        )
        self._log_dataset(event.data)

    def _ops(self) -> tuple[str, ...]:
        return tuple(self._config.space.primitives) if self._config else ()

    def _log_dataset(self, summary: dict[str, Any]) -> None:
        # The entity is built directly from the split summary: mlflow.data.from_pandas
        # would import and infer a schema for one row, costing a second per run.
        text = json.dumps(summary, sort_keys=True, default=str)
        schema = {
            "mlflow_colspec": [
                {"type": "double" if isinstance(v, (int, float)) else "string", "name": k}
                for k, v in summary.items()
            ]
        }
        dataset = Dataset(
            name=str(summary.get("name", "data")),
            digest=hashlib.sha256(text.encode()).hexdigest()[:8],
            # the researcher's own files are named by their path
            source_type="local" if summary.get("source") else "code",
            source=json.dumps(
                {"uri": summary["source"]}
                if summary.get("source")
                else {"asolab.data": summary.get("name", "data")}
            ),
            schema=json.dumps(schema),
            profile=json.dumps({k: v for k, v in summary.items() if k != "name"}, default=str),
        )
        inputs = [DatasetInput(dataset, tags=[InputTag(L.MLFLOW_DATA_CONTEXT, L.DATASET_CONTEXT)])]
        try:
            self._c.log_inputs(self.run_id, datasets=inputs)
        except MlflowException:
            # Runs of one experiment started at the same moment (study workers) race to
            # insert the same dataset row, and the loser's insert fails (how depends on the
            # store); its retry finds the winner's row. Any other error fails again.
            self._c.log_inputs(self.run_id, datasets=inputs)

    def _resume(self, run_id: str, position: dict[str, Any] | None) -> None:
        client = self.client
        assert client is not None
        run = resumable_run(client, self.tracking_uri or "", run_id)  # refuses a FINISHED run
        lease.take(self.tracking_uri or "", run_id, run)  # refuses a run another process runs
        self.run_id = run_id
        self.experiment_id = run.info.experiment_id
        for key in run.data.metrics:
            history = client.get_metric_history(run_id, key)
            if history:
                self._logged_max[key] = max(m.step for m in history)
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        resumed = int(run.data.tags.get(L.TAG_RESUMED, "0")) + 1
        self._tag(L.TAG_RESUMED, str(resumed))
        self._tag(L.TAG_RESUMED_FROM, L.resumed_text(position or None))
        if L.TAG_ERROR in run.data.tags:
            client.delete_tag(run_id, L.TAG_ERROR)  # a resumed run is no longer failed
        log.info(
            "resuming MLflow run %s (%d metrics already logged)", run_id, len(self._logged_max)
        )

    # ------------------------------------------------------------------ per epoch / phase

    def on_epoch_end(self, event: EpochEnd) -> None:
        with self._timed():
            values = {
                L.TRAIN_LOSS: event.train_loss,
                L.TRAIN_ACC: event.train_acc,
                L.VAL_LOSS: event.val_loss,
                L.VAL_ACC: event.val_acc,
                L.TEMPERATURE: event.temperature,
                L.EPOCH_SECONDS: event.seconds,
                L.IMAGES_PER_SEC: event.images_per_sec,
                L.TORCH_THREADS: event.threads,
                L.CYCLE: event.cycle,
                L.PHASE_INDEX_METRIC: L.PHASE_INDEX.get(event.phase, -1),
                **event.lrs,  # L.WEIGHT_LR, L.ALPHA_LR: the runner names them
            }
            if event.gpu_busy is not None:
                values[L.GPU_BUSY_PCT] = event.gpu_busy
            for k, v in values.items():
                self._metric(k, v, event.global_epoch)
            slow = self._pace.check(event)
            if slow:
                self._tag(L.TAG_SLOW_EPOCH, slow)
            if time.perf_counter() - self._last_flush >= LIVE_SECONDS:
                self.flush()

    def on_mutation(self, event: MutationEvent) -> None:
        with self._timed():
            record = {
                "cycle": event.cycle,
                "temperature": event.temperature,
                "strength": event.strength,
                "before": event.before.to_dict(),
                "after": event.after.to_dict(),
                "before_str": str(event.before),
                "after_str": str(event.after),
                "edits": [edit_record(e) for e in event.edits],
            }
            self._artifact_text(json.dumps(record, indent=2), L.mutation_artifact(event.cycle))
            if event.selection is not None:  # why each op was chosen (perturbation selection)
                text = json.dumps(event.selection, indent=1)
                self._artifact_text(text, L.selection_artifact(event.cycle))

    def _log_growth(self, events: tuple[GrowthEvent, ...], step: int) -> None:
        """A cycle's growth steps: the artifact and the per-cycle growth metrics."""
        record = [asdict(g) for g in events]  # every field of the event, as the checkpoint keeps it
        self._artifact_text(
            json.dumps(record, indent=2, default=str), L.growth_artifact(events[0].cycle)
        )
        self._metric(L.GROWTH_EVENTS, len(events), step)
        self._metric(L.GROWTH_PRESERVATION_ERROR, max(g.preservation_error for g in events), step)
        self._metric(L.GROWTH_PARAMS_AFTER, events[-1].params_after, step)

    def on_cycle_end(self, event: CycleEnd) -> None:
        with self._timed():
            step, c = event.global_epoch, event.cycle
            g = event.genotype
            self._artifact_text(genotype_record(g, self._ops()), L.genotype_artifact(c))
            self._artifact_png(g, f"cycle {c}", L.cells_artifact(c))
            self._tag(L.TAG_GENOTYPE, str(g))
            self._metric(L.CYCLE_VAL_ACC, event.val_acc, step)
            self._metric(L.CYCLE_VAL_LOSS, event.val_loss, step)
            self._metric(L.SUPERNET_PARAMS, event.supernet_params, step)
            self._metric(L.DERIVED_PARAMS, event.derived_params, step)
            for k, v in event.memory.items():  # L.MEMORY_METRICS: runner/memory.py names them
                self._metric(k, v, step)
            # From the event, not from on_mutation / on_growth: after a resume in
            # mid-cycle this process never saw the mutation.
            self._metric(L.MUTATION_EDITS, event.mutation_edits, step)
            self._metric(L.ALPHA_ENTROPY, event.alpha_entropy, step)
            if event.growth:
                self._log_growth(event.growth, step)
            # written with the retrain phase's metrics at its checkpoint (or the next flush)

    def on_checkpoint(self, event: CheckpointSaved) -> None:
        with self._timed():
            if event.due:
                self._send(event)
            else:  # replaced by the next one, or uploaded if the run stops first
                self._unsent = event

    def _send(self, event: CheckpointSaved) -> None:
        # Metrics first, checkpoint second: a kill in between only means the
        # replayed phase's steps are already there, and they are skipped.
        self._tag(L.TAG_PHASE, L.position_text(event.cycle, event.phase, event.stage_epoch))
        self.flush()
        self._upload_checkpoint(event.path)
        self._unsent = None

    # ------------------------------------------------------------------ the end

    def on_final_plan(self, event: FinalPlan) -> None:
        with self._timed():
            self._final_epochs = event.epochs
            self._writer.submit(
                self._c.log_param, self.run_id, L.PARAM_FINAL_EPOCHS_FITTED, str(event.epochs)
            )

    def on_run_end(self, event: RunEnd) -> None:
        with self._timed():
            step = event.global_epoch
            g = event.genotype
            finals = {
                L.FINAL_VAL_ACC: event.val_acc,
                L.FINAL_VAL_LOSS: event.val_loss,
                L.TEST_ACC: event.test_acc,
                L.TEST_LOSS: event.test_loss,
                L.FINAL_PARAMS: event.derived_params,
                L.FINAL_SUPERNET_PARAMS: event.supernet_params,
                L.RUN_SECONDS: event.seconds,
            }
            if ALL in event.gpu_busy:
                finals[L.RUN_GPU_BUSY_PCT] = event.gpu_busy[ALL]
            # Memory under final_* names: with no final epochs the run ends on the last
            # cycle's step, where the per-cycle figures already hold that step.
            finals.update({L.FINAL_PREFIX + k: v for k, v in event.memory.items()})
            model = None
            if self.log_models and event.supernet is not None:
                # Created before the final metrics so that they are written linked to the model
                # (the UI's Models tab shows them), instead of log_model's step= option, which
                # reads back the whole history of every metric of the run.
                model = self._final_model()
            model_id = model.model_id if model is not None else None
            for k, v in finals.items():
                self._metric(k, v, step, model_id=model_id)
            self._artifact_text(genotype_record(g, self._ops()), L.FINAL_GENOTYPE_ARTIFACT)
            self._artifact_png(g, "final genotype", L.FINAL_CELLS_ARTIFACT)
            self._tag(L.TAG_FINAL_GENOTYPE, str(g))
            if event.nondeterministic:
                self._tag(L.TAG_NONDETERMINISTIC, ", ".join(event.nondeterministic))
            self._tag(L.TAG_GENOTYPE, str(g))
            self._tag(
                L.TAG_NOTE,
                describe_run(
                    event,
                    self.run_id or "",
                    self._config,
                    self._dataset,
                    self._final_epochs,
                    self._data_notes,
                ),
            )
            self.flush()
            self._writer.drain()
            if model is not None:
                self._log_model(event, model, step)
            self._terminate("FINISHED")

    def on_run_interrupted(self, event: RunInterrupted) -> None:
        if self.run_id is None or self._closed:
            return
        exc = event.error
        # Never raises: the runner re-raises the original error, which must not be masked
        # by a second one from a store that may itself be what failed.
        with self._timed():
            interrupted = isinstance(exc, KeyboardInterrupt)
            try:
                if self._unsent is not None:
                    # The latest phase end not yet in the store: a resume starts there.
                    self._send(self._unsent)
                self.flush()
                self._writer.drain()
            except KeyboardInterrupt:
                # A second Ctrl-C while uploads drain: stop waiting, but still close the run.
                log.warning(
                    "interrupted again: not waiting for the last uploads of run %s", self.run_id
                )
                interrupted = True
            except Exception as err:
                _log_failure("could not write the last metrics or artifacts of run %s", self, err)
            try:
                if interrupted:
                    self._terminate("KILLED")
                elif _pruned(exc):
                    self._terminate("FINISHED")  # a pruned trial ended normally; the study tags it
                else:
                    self._c.set_tag(self.run_id, L.TAG_ERROR, self._reason(exc))
                    self._terminate("FAILED")
            except Exception as err:
                _log_failure("could not close run %s", self, err)

    def _reason(self, exc: BaseException) -> str:
        """The ``asolab.error`` tag: for a full, read-only or corrupt store, what to do."""
        from .health import store_failure

        failure = store_failure(exc, self.tracking_uri or "")
        return (
            str(failure)[: L.MAX_TAG_LENGTH]
            if failure is not None
            else first_line(exc, named=True, limit=L.MAX_TAG_LENGTH)
        )

    def _terminate(self, status: str) -> None:
        self._closed = True
        try:
            self._c.set_terminated(self.run_id, status=status)
        finally:
            lease.release(self.tracking_uri or "", self.run_id or "")

    def checkpoint_stamp(self) -> dict[str, str]:
        """The run id, in every checkpoint: a resume refuses another run's checkpoint."""
        return {"run_id": self.run_id} if self.run_id else {}


def _log_failure(message: str, tracker: MlflowTracker, err: Exception) -> None:
    """A failed last write: only at debug level when the store is full, read-only or
    corrupt (the command's one error line says so and what to do), else with its traceback."""
    from .health import condition

    if condition(err)[0]:
        log.debug(message, tracker.run_id, exc_info=err)
    else:
        log.exception(message, tracker.run_id)


def _pruned(exc: BaseException) -> bool:
    """Whether a study's pruner stopped the run: it ended normally, and the study tags it.
    optuna is imported only here, so that plain runs never load it."""
    import optuna

    return isinstance(exc, optuna.TrialPruned)

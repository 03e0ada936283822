"""Control arms of recorded ASO-SE runs, as ordinary tracked runs.

For a source run and a list of seeds, every seed gets an ASO-SE run (the
source itself for its own seed, a new run of the source's config otherwise)
and one run per control arm (:mod:`asolab.baseline.arms`) with the same
config, seed and weight-training budget. Every run of the set is tagged with
its arm, the ASO-SE run of its seed that it controls for, and the source run
(names in :mod:`asolab.tracking.layout`), in the source run's MLflow
experiment. A set that was interrupted goes on where it stopped: runs already
FINISHED in the set are not trained again.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

from ..config import ConfigError, ExperimentConfig, from_dict
from ..data import load_data
from ..runner import Runner
from ..runner.checkpoint import local_folder
from ..runner.cycle import RunResult, resolve_device
from ..runner.events import Observer
from ..space.genotype import Genotype
from ..tracking import layout as L
from ..tracking.runs import final_genotype, read_artifact
from .arms import arm_class, arm_runner
from .names import ARMS, DEFAULT_ARMS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SetRun:
    """One finished run of a baseline set."""

    arm: str
    seed: int
    run_id: str
    val_acc: float
    test_acc: float  # reported, never used for selection
    params: int
    trained: bool  # False: found FINISHED from an earlier invocation

    def line(self) -> str:
        """The run as one terminal line, columns aligned for every arm name."""
        width = max(len(a) for a in (L.ARM_ASO_SE, *ARMS))
        how = "trained" if self.trained else "recorded earlier"
        return (
            f"  seed {self.seed} {self.arm:<{width}} run {self.run_id}  "
            f"val {self.val_acc:.4f}  test {self.test_acc:.4f}  params {self.params}  ({how})"
        )


@dataclass(frozen=True)
class Source:
    """A recorded ASO-SE run: its config, final genotype and size."""

    run: Run
    experiment: str
    cfg: ExperimentConfig
    genotype: Genotype
    params: int

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def name(self) -> str:
        return self.run.info.run_name or L.short_id(self.run_id)


def get_run(client: MlflowClient, run_id: str) -> Run:
    """The run ``run_id`` names (an id, an id prefix or a run name)."""
    from ..tracking.store import RunNotFound, find_run

    try:
        return find_run(client, run_id)
    except RunNotFound as exc:
        raise ConfigError(
            f"{exc}; give the run id that 'asolab run' printed (and --tracking-uri if it is "
            "not the default store)"
        ) from None


def load_source(client: MlflowClient, run_id: str) -> Source:
    """The ASO-SE run ``run_id``, checked to be a finished search (not a control arm)."""
    run = get_run(client, run_id)
    run_id = run.info.run_id  # the full id, where the user gave a prefix or a name
    arm = run.data.tags.get(L.TAG_ARM, L.ARM_ASO_SE)
    if arm != L.ARM_ASO_SE:
        raise ConfigError(
            f"run {run_id} is the {arm!r} control arm of run "
            f"{run.data.tags.get(L.TAG_BASELINE_OF, '?')}; give an ASO-SE run"
        )
    if run.info.status != "FINISHED":
        raise ConfigError(
            f"run {run_id} is {run.info.status}; its control arms need a finished ASO-SE run "
            "(continue it with 'asolab run --resume' first)"
        )
    text = read_artifact(client, run_id, L.CONFIG_ARTIFACT)
    if text is None:
        raise ConfigError(
            f"run {run_id} has no {L.CONFIG_ARTIFACT} artifact: it was not recorded by 'asolab run'"
        )
    cfg = from_dict(json.loads(text), source=f"run {run_id} {L.CONFIG_ARTIFACT}")
    try:
        genotype = final_genotype(client, run)
    except ValueError as exc:
        raise ConfigError(f"run {run_id}: {exc}") from None
    params = run.data.metrics.get(L.FINAL_PARAMS)
    if params is None:
        raise ConfigError(
            f"run {run_id} has no final_params metric: it was not recorded by 'asolab run'"
        )
    experiment = client.get_experiment(run.info.experiment_id).name
    return Source(run, experiment, cfg, genotype, int(params))


def set_runs(
    client: MlflowClient, source: Source
) -> tuple[dict[tuple[str, int], Run], dict[tuple[str, int], Run]]:
    """The runs of ``source``'s set by (arm, seed): the FINISHED ones (the source
    included), and the latest unfinished one of each (arm, seed) not finished."""
    found = client.search_runs(
        [source.run.info.experiment_id],
        filter_string=f"tags.`{L.TAG_BASELINE_OF}` = '{source.run_id}'",
        run_view_type=ViewType.ACTIVE_ONLY,
        max_results=5000,
        order_by=["attributes.start_time DESC"],
    )
    done = {(L.ARM_ASO_SE, source.cfg.seed): source.run}
    unfinished: dict[tuple[str, int], Run] = {}
    for r in found:
        if L.TAG_ARM not in r.data.tags:
            continue
        key = (r.data.tags[L.TAG_ARM], int(float(r.data.params.get("seed", -1))))
        (done if r.info.status == "FINISHED" else unfinished).setdefault(key, r)
    return done, {k: r for k, r in unfinished.items() if k not in done}


def _finished(arm: str, seed: int, run: Run) -> SetRun:
    m = run.data.metrics
    return SetRun(
        arm,
        seed,
        run.info.run_id,
        m.get(L.FINAL_VAL_ACC, float("nan")),
        m.get(L.TEST_ACC, float("nan")),
        int(m.get(L.FINAL_PARAMS, 0)),
        trained=False,
    )


def run_set(
    tracking_uri: str,
    run_id: str,
    arms: Sequence[str] = DEFAULT_ARMS,
    seeds: Sequence[int] | None = None,
    *,
    overrides: dict | None = None,
    observers: Callable[[], Iterable[Observer]] = tuple,
    on_done: Callable[[SetRun], None] = lambda r: None,
) -> list[SetRun]:
    """Train (or find) the ASO-SE run and every control arm of each seed for source ``run_id``.

    ``overrides`` change how the runs execute, not what they compute (threads,
    device); ``observers`` makes fresh observers (progress bars) for each run.
    """
    if unknown := [a for a in arms if a not in ARMS]:
        raise ConfigError(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    client = MlflowClient(tracking_uri=tracking_uri)
    source = load_source(client, run_id)
    # The source joins its own set, so that one tag selects the whole comparison.
    client.set_tag(source.run_id, L.TAG_ARM, L.ARM_ASO_SE)
    client.set_tag(source.run_id, L.TAG_BASELINE_OF, source.run_id)
    done, unfinished = set_runs(client, source)
    seeds = list(seeds) if seeds else [source.cfg.seed]
    results: list[SetRun] = []
    for seed in seeds:
        results += _run_seed(
            tracking_uri,
            client,
            source,
            seed,
            arms,
            done,
            unfinished,
            overrides or {},
            observers,
            on_done,
        )
    return results


def _run_seed(
    uri: str,
    client: MlflowClient,
    source: Source,
    seed: int,
    arms: Sequence[str],
    done: dict,
    unfinished: dict,
    overrides: dict,
    observers: Callable[[], Iterable[Observer]],
    on_done: Callable[[SetRun], None],
) -> list[SetRun]:
    """The ASO-SE run of ``seed`` (found or trained), then each control arm of it."""
    cfg = source.cfg.replace(seed=seed, **overrides)
    data = load_data(cfg.data, seed, resolve_device(cfg.device))
    out: list[SetRun] = []

    def train(
        arm: str, controls: str | None, make: Callable[..., Runner], kind: type[Runner]
    ) -> RunResult:
        res, rid = _train(
            uri,
            source,
            cfg,
            seed,
            arm,
            controls,
            make,
            kind,
            unfinished.get((arm, seed)),
            observers,
        )
        out.append(SetRun(arm, seed, rid, res.val_acc, res.test_acc, res.derived_params, True))
        on_done(out[-1])
        return res

    def found_earlier(arm: str) -> None:
        out.append(_finished(arm, seed, done[(arm, seed)]))
        on_done(out[-1])

    if (L.ARM_ASO_SE, seed) in done:
        aso = done[(L.ARM_ASO_SE, seed)]
        found = source.genotype if aso is source.run else final_genotype(client, aso)
        final_epochs = L.final_epochs_trained(aso.data.params) or cfg.search.final_epochs
        found_earlier(L.ARM_ASO_SE)
    else:
        res = train(L.ARM_ASO_SE, None, lambda obs, **kw: Runner(cfg, obs, data=data, **kw), Runner)
        found, final_epochs = res.genotype, res.final_epochs
    aso_id, aso_params = out[0].run_id, out[0].params
    for arm in arms:
        if (arm, seed) in done:
            found_earlier(arm)
        else:
            make = functools.partial(_arm_runner, arm, cfg, found, aso_params, final_epochs, data)
            train(arm, aso_id, make, arm_class(arm))
    return out


def _arm_runner(
    arm: str,
    cfg: ExperimentConfig,
    found: Genotype,
    params: int,
    final_epochs: int,
    data,
    observers,
    **kw,
):
    # An arm trains as many final epochs as its ASO-SE run did: with a budget of its own,
    # an arm (which skips alpha-training) would fit more of them.
    return arm_runner(
        arm, cfg, found, params, observers, data=data, final_epochs=final_epochs, **kw
    )


def _train(
    uri: str,
    source: Source,
    cfg: ExperimentConfig,
    seed: int,
    arm: str,
    controls: str | None,
    make: Callable[..., Runner],
    kind: type[Runner],
    prior: Run | None,
    observers: Callable[[], Iterable[Observer]],
) -> tuple[RunResult, str]:
    """Train one run of the set, checkpointed into its MLflow run after every phase;
    an unfinished earlier run of the same arm and seed (``prior``) resumes from its
    checkpoint, like ``asolab run --resume``."""
    from ..tracking import MlflowTracker
    from ..tracking.store import TrackingError, download_checkpoint

    # Removed however the run ends; one a SIGKILL left behind, by the next run's start.
    with local_folder("asolab-baseline-") as work:
        path = None
        if prior is not None:
            try:
                path = download_checkpoint(uri, prior.info.run_id, Path(work) / "resume")
            except TrackingError:  # killed before its first checkpoint: start it again
                log.info(
                    "run %s has no checkpoint; %s seed %d starts again",
                    prior.info.run_id,
                    arm,
                    seed,
                )
        if prior is not None and path is not None:
            t = MlflowTracker(
                tracking_uri=uri,
                resume_run_id=prior.info.run_id,
                log_models=cfg.tracking.log_models,
            )
            runner = kind.resume(path, [*observers(), t], checkpoint_dir=work, data=None)
        else:
            t = _tracker(uri, source, cfg, seed, arm, controls)
            runner = make([*observers(), t], checkpoint_dir=work)
        res = runner.run()
    return res, t.run_id or ""


def _tracker(
    uri: str, source: Source, cfg: ExperimentConfig, seed: int, arm: str, controls: str | None
):
    """The MLflow observer of one run of ``source``'s set, tagged with its arm."""
    from ..tracking import MlflowTracker

    tags = {
        L.TAG_ARM: arm,
        L.TAG_BASELINE_OF: source.run_id,
        **({L.TAG_CONTROLS: controls} if controls else {}),
    }
    return MlflowTracker(
        tracking_uri=uri,
        experiment=source.experiment,
        tags=tags,
        run_name=f"{source.name}-{arm}-seed{seed}",
        log_models=cfg.tracking.log_models,
    )

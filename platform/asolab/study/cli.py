"""``asolab study``: run, resume, parallelise and summarise Optuna studies."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..config import ConfigError
from ..errors import first_line
from ..options import add_set, add_threads, add_tracking_uri
from ..tracking.layout import TAG_ERROR
from ..tracking.store import mask_password
from .config import check_study_name

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study",
        help="run (or resume) an Optuna study whose trials are asolab runs",
        description=(
            "Run an Optuna study over experiment keys (Gumbel temperature, mutation strength, "
            "...). Re-running the same command resumes the study and adds trials until "
            "--n-trials are reached."
        ),
    )
    p.add_argument(
        "file",
        nargs="?",
        help=(
            "study TOML (default: studies/temperature_mutation.toml); a bare name looks in studies/"
        ),
    )
    add_set(
        p,
        help=(
            "override a key of every trial's experiment, over the file's [overrides] "
            "(repeatable), e.g. --set search.cycles=1 for a quick study"
        ),
    )
    _budget_options(p)
    _place_options(p)
    # internal: one worker process started by --workers
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--parent-run-id", default="", help=argparse.SUPPRESS)
    add_threads(p, help=argparse.SUPPRESS, default=1)
    p.set_defaults(func=cmd_study)


def _budget_options(p: argparse.ArgumentParser) -> None:
    """How many trials, for how long, in how many processes."""
    p.add_argument(
        "--n-trials",
        type=int,
        default=None,
        metavar="N",
        help=(
            "total trials the study should hold (default: the file's n_trials; 0 = no limit, "
            "needs a timeout)"
        ),
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="stop starting trials after S seconds (default: the file's timeout; 0 = none)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="K",
        help=(
            "K worker processes on this machine, each with cores // K torch threads "
            "(default: one per GPU --gpus names, else 1)"
        ),
    )


def _place_options(p: argparse.ArgumentParser) -> None:
    """Where the study lives and what it is called; its sampler seed; --summary."""
    p.add_argument(
        "--gpus",
        default="",
        metavar="IDS",
        help=(
            "GPUs the workers share, one each round-robin, e.g. 0,1; a GPU named twice takes "
            "two workers (0,0: a search leaves a GPU mostly idle) (default: the visible ones)"
        ),
    )
    p.add_argument(
        "--storage",
        default="",
        metavar="URL",
        help=(
            "Optuna storage URL (default: optuna-journal.log beside the MLflow store, "
            "./mlruns/ unless --tracking-uri names a SQLite file elsewhere); "
            "postgresql://... for several machines"
        ),
    )
    p.add_argument(
        "--study-name", default="", metavar="NAME", help="study name (default: the file's name)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="sampler seed (default: the file's seed); give each machine its own",
    )
    p.add_argument(
        "--summary",
        action="store_true",
        help="print the best trials and where to find them; run nothing",
    )
    add_tracking_uri(
        p, help="MLflow tracking URI (default: the file's, MLFLOW_TRACKING_URI, or mlruns/)"
    )


def _trial_line(t: Any, metrics: tuple[str, ...]) -> str:
    values = ", ".join(f"{m}={v:.4g}" for m, v in zip(metrics, t.values)) if t.values else ""
    params = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items()
    )
    error = t.user_attrs.get(TAG_ERROR, "")  # storage.ATTR_ERROR, without importing optuna
    extra = f"  ({error})" if error else ""
    return f"trial {t.number:4d} {t.state.name:8s} {values}  [{params}]{extra}"


def gpu_room(t: Any) -> str:
    """For a study's first finished trial on a GPU that sat mostly idle: that the GPU has
    room for more trials at once ("" otherwise)."""
    from ..runner.gpubusy import LOW
    from .storage import ATTR_GPU_BUSY

    busy = t.user_attrs.get(ATTR_GPU_BUSY)
    if busy is None or busy >= LOW:
        return ""
    return (
        f"  its GPU was busy {busy:.0f}% of the training loops (every process on it counted): "
        "it has room for more trials at once, e.g. --gpus 0,0 (two workers on GPU 0; "
        "docs/scaling-out.md)"
    )


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{minutes:.0f} min"
        if minutes < 90
        else (f"{minutes / 60:.1f} h")
    )


class _TrialPrinter:
    """Prints the planned cost at start, a line per finished trial, and after the first
    trial of this invocation an estimate of the time left (one worker)."""

    def __init__(self, cfg: Any, budget: int = 0, seconds: float = 0.0, name: str = "") -> None:
        self.cfg, self.budget, self.seconds, self.name = cfg, budget, seconds, name or cfg.name
        self.first: float | None = None  # seconds the first trial took

    def plan(self, workers: int, held: int = 0) -> str:
        """The study's size and cost in runs; ``held``: trials the study already holds."""
        seeds, cycles = self.cfg.objective.seeds, self.cfg.base.search.cycles
        size = (
            f"{self.budget} trials x {seeds} seeds = {self.budget * seeds} runs"
            if self.budget
            else f"no trial limit, {seeds} runs a trial"
        )
        limit = f", stopping after {_duration(self.seconds)}" if self.seconds else ""
        left = (
            f"; {held} held already, {max(0, self.budget - held)} to run"
            if self.budget and held
            else ""
        )
        return (
            f"study {self.name}: {size} of {cycles} cycle{'s' if cycles > 1 else ''}{limit}, "
            f"{workers} worker{'s' if workers > 1 else ''}{left}"
        )

    def __call__(self, t: Any) -> None:
        print(_trial_line(t, self.cfg.objective.metrics), flush=True)
        if self.first is not None or t.duration is None:
            return
        self.first = t.duration.total_seconds()
        if hint := gpu_room(t):
            print(hint, flush=True)
        left = max(0, self.budget - (t.number + 1)) if self.budget else None
        if left == 0:
            return
        if left is None:
            print(f"  a trial takes about {_duration(self.first)}", flush=True)
            return
        estimate = left * self.first
        capped = " (the timeout ends it sooner)" if self.seconds and estimate > self.seconds else ""
        print(
            f"  about {_duration(estimate)} left for {left} more trials at "
            f"{_duration(self.first)} a trial{capped}",
            flush=True,
        )


def cmd_study(args: argparse.Namespace) -> int:
    import optuna

    from .config import load_study

    if not getattr(args, "verbose", False):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_study(args.file, args.overrides)
    if args.seed is not None:
        if args.seed < 0:
            raise ConfigError(f"--seed must be >= 0 (got {args.seed})")
        cfg = cfg.replace(seed=args.seed)
    if args.study_name:
        check_study_name(args.study_name)
    if args.summary:
        return _summary(args, cfg)

    if args.worker is not None:
        show = _TrialPrinter(cfg)
        from .run import run_worker

        run_worker(
            cfg,
            args.worker,
            args.storage,
            args.study_name or cfg.name,
            args.tracking_uri,
            args.parent_run_id,
            args.n_trials,
            args.timeout,
            args.threads,
            show,
        )
        return 0
    return _run(args, cfg)


def study_workers(workers: int | None, gpus: str) -> int:
    """``--workers``, or where it is not given one worker per GPU that ``--gpus`` names
    (``--gpus 0,1`` uses both GPUs; ``0,0,1,1`` puts two workers on each), else 1."""
    if workers is not None:
        return workers
    from .gpus import parse_gpus

    return len(parse_gpus(gpus)) if gpus else 1


def _run(args: argparse.Namespace, cfg: Any) -> int:
    """The study in this process and its workers, then its summary (after a failure too)."""
    from .run import WorkersFailed, resolve_budget, run_study

    budget, seconds = resolve_budget(cfg, args.n_trials, args.timeout)
    show = _TrialPrinter(cfg, budget, seconds, args.study_name)
    workers = study_workers(args.workers, args.gpus)
    try:
        outcome = run_study(
            cfg,
            n_trials=args.n_trials,
            timeout=args.timeout,
            workers=workers,
            storage_url=args.storage,
            study_name=args.study_name,
            tracking_uri=args.tracking_uri,
            on_trial=show if workers == 1 else None,
            on_start=lambda held: print(show.plan(workers, held), flush=True),
            gpus=args.gpus,
        )
    except WorkersFailed as exc:  # what the other workers did is recorded: show it, then the error
        _print_summary(
            cfg,
            exc.outcome.study(cfg),
            exc.outcome.storage_url,
            exc.outcome.tracking_uri,
            exc.outcome.parent_run_id,
        )
        raise
    _print_summary(
        cfg, outcome.study(cfg), outcome.storage_url, outcome.tracking_uri, outcome.parent_run_id
    )
    return 0


def _summary(args: argparse.Namespace, cfg: Any) -> int:
    """Print what the study holds; read-only: creates no store, no journal, no folder."""
    import optuna

    from ..tracking import check_reachable, resolve_tracking_uri
    from ..tracking.store import sqlite_path
    from . import report
    from .storage import journal_missing, make_storage, resolve_storage_url

    uri = resolve_tracking_uri(
        args.tracking_uri or cfg.tracking.tracking_uri or cfg.base.tracking.tracking_uri
    )
    url = resolve_storage_url(args.storage, cfg.storage.url, uri)
    name = args.study_name or cfg.name
    command = " ".join(["asolab study"] + ([args.file] if args.file else []))
    no_study = ConfigError(
        f"no study {name!r} in {mask_password(url)}; run `{command}` first, or pass "
        "--storage/--study-name"
    )
    if journal_missing(url):
        raise no_study
    try:
        study = optuna.load_study(study_name=name, storage=make_storage(url, cfg.storage))
    except KeyError:
        raise no_study from None
    db = sqlite_path(uri)
    try:
        if db is not None and not db.is_file():
            parent = "(none yet)"  # no MLflow store: the check would create an empty one
        else:
            check_reachable(uri)
            parent = report.find_parent_run(uri, cfg, name) or "(none yet)"
    except Exception as exc:  # the summary still helps without MLflow, but must not hide why
        reason = first_line(exc) or type(exc).__name__
        parent = f"(unknown: the MLflow store could not be read: {reason})"
    _print_summary(cfg, study, url, uri, parent)
    return 0


def _print_summary(cfg: Any, study: Any, url: str, uri: str, parent: str) -> None:
    import pandas as pd

    from . import report

    trials = study.get_trials(deepcopy=False)
    counts = pd.Series([t.state.name for t in trials]).value_counts().to_dict() if trials else {}
    frame = report.summary_frame(study, cfg)
    title = "Pareto front" if len(study.directions) > 1 else "best trials"
    print(
        f"study {study.study_name}: {len(trials)} trials "
        f"({', '.join(f'{v} {k.lower()}' for k, v in counts.items()) or 'none'}); storage "
        f"{mask_password(url)}"
    )
    if frame.empty:
        print("no complete trial yet")
    else:
        with pd.option_context(
            "display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format
        ):
            print(f"{title}:\n{frame.to_string(index=False)}")
    print(
        f"MLflow: experiment {cfg.mlflow_experiment!r} in {uri}; parent run {parent} "
        f"holds the plots (plots/) and one child run per trial."
    )
    print(f"Browse: asolab ui   (or: mlflow ui --backend-store-uri {uri})")
    if parent and not parent.startswith("("):  # "(none yet)", "(unknown: ...)"
        from ..tracking.browse import DEFAULT_UI, runs_url

        try:
            exp_id = report.client(uri).get_run(parent).info.experiment_id
        except Exception:  # the store is unreachable: the lines above said so
            return
        print(
            f"  the study's trials: {runs_url(DEFAULT_UI, exp_id)}   (expand {study.study_name!r})"
        )

"""``asolab baseline`` (control arms of ASO-SE runs) and ``asolab rank`` (ranking diagnostic)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys

from ..config import ConfigError
from ..interrupt import sigterm_as_interrupt
from ..options import add_quiet, add_threads, add_tracking_uri
from ..tracking import layout as L
from .names import ARMS, DEFAULT_ARMS

BASELINE_HELP = "train the control arms of recorded ASO-SE runs as tracked runs"
BASELINE_TEXT = (
    "For each ASO-SE run and seed: the ASO-SE run itself (a new run of the same config for "
    "another seed) and its control arms -- scratch (the found genotype from scratch), random "
    "(a random genotype with the same parameter count, +-10%), initial (the unevolved "
    "genotype) -- each with the same config, seed and weight-training budget, tagged with its "
    "arm and the run it controls for; scratch-final, random-final and initial-final train the "
    "same genotypes for the final stage's epochs only (the NAS literature's protocol). "
    "Compare them with: asolab compare --baseline RUN_ID. "
    "Running it again goes on where it stopped."
)
RANK_HELP = "measure how well a run's supernet ranks architectures (Kendall tau, Spearman rho)"
RANK_TEXT = (
    "Sample genotypes from the run's final alphas (and random ones), evaluate each on the "
    "supernet (one-shot) and after a short stand-alone training, both on the validation split; "
    "record Kendall's tau and Spearman's rho as metrics of the run, the pairs and a scatter "
    "plot as artifacts."
)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(
            f"--seeds {text!r}: give comma-separated integers, e.g. --seeds 0,1,2"
        ) from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: seeds must be distinct integers >= 0")
    return seeds


def add_arms(p: argparse.ArgumentParser) -> None:
    """``--arms A,B``: the control arms to train (read by :func:`parse_arms`)."""
    p.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help=f"comma-separated control arms, of {','.join(ARMS)} (default "
        f"{','.join(DEFAULT_ARMS)}; an arm ending in -final trains the final stage's epochs only)",
    )


def parse_arms(text: str) -> list[str]:
    """The arms ``--arms`` names; ConfigError for one that is not a control arm."""
    arms = [a.strip() for a in text.split(",") if a.strip()]
    if unknown := [a for a in arms if a not in ARMS]:
        raise ConfigError(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    return arms


def _common(p: argparse.ArgumentParser) -> None:
    add_threads(p, help="torch CPU threads (default: the run's own)")
    add_quiet(p)
    add_tracking_uri(p)


def add_baseline(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("baseline", help=BASELINE_HELP, description=BASELINE_TEXT)
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_ID",
        help="recorded, finished ASO-SE run(s): ids, id prefixes or run names",
    )
    add_arms(p)
    p.add_argument(
        "--seeds", default="", help="comma-separated seeds (default: the run's own seed)"
    )
    _common(p)
    p.set_defaults(func=cmd_baseline)


def cmd_baseline(args: argparse.Namespace) -> int:
    from ..progress import ProgressObserver
    from ..tracking import check_reachable, resolve_tracking_uri
    from .run import run_set

    arms, seeds = parse_arms(args.arms), _seeds(args.seeds) if args.seeds else None
    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 0 (got {args.threads})")
    uri = resolve_tracking_uri(args.tracking_uri)
    check_reachable(uri)
    overrides = {"threads": args.threads} if args.threads else {}

    def done(r) -> None:
        print(r.line(), flush=True)

    for run_id in args.runs:
        print(f"control arms of run {run_id}:", flush=True)
        try:
            with sigterm_as_interrupt():
                run_set(
                    uri,
                    run_id,
                    arms,
                    seeds,
                    overrides=overrides,
                    on_done=done,
                    observers=lambda: [ProgressObserver(enabled=not args.quiet)],
                )
        except KeyboardInterrupt:
            print(
                "asolab: baseline stopped; the same command continues it (finished runs are "
                f"kept, the stopped one resumes from its checkpoint): {_again(args, uri)}",
                file=sys.stderr,
            )
            raise
        tracking = "" if not args.tracking_uri else f" --tracking-uri {args.tracking_uri}"
        print(f"compare the arms: asolab compare --baseline {run_id}{tracking}")
    return 0


def _again(args: argparse.Namespace, uri: str) -> str:
    """The ``asolab baseline`` command line that continues this one."""
    argv = ["asolab", "baseline", *args.runs, "--arms", args.arms]
    if args.seeds:
        argv += ["--seeds", args.seeds]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return shlex.join([*argv, "--tracking-uri", uri])


def add_rank(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rank", help=RANK_HELP, description=RANK_TEXT)
    p.add_argument(
        "run", metavar="RUN_ID", help="a recorded run with a checkpoint (id, id prefix or name)"
    )
    p.add_argument(
        "--samples",
        type=int,
        default=8,
        metavar="K",
        help="genotypes from the alphas, and as many random (default 8)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=2,
        metavar="E",
        help="stand-alone training epochs per genotype (default 2)",
    )
    p.add_argument(
        "--standalone-seeds",
        type=int,
        default=1,
        metavar="N",
        help=(
            "stand-alone trainings per genotype, at the run's seed and the next ones; with 2 "
            "or more the stand-alone accuracy is their mean and the proxy's own reliability "
            "(Kendall tau between its first two seeds) is recorded too (default 1)"
        ),
    )
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the run's seed)")
    _common(p)
    p.set_defaults(func=cmd_rank)


def cmd_rank(args: argparse.Namespace) -> int:
    from ..tracking import check_reachable, resolve_tracking_uri
    from .ranking import rank_run

    uri = resolve_tracking_uri(args.tracking_uri)
    check_reachable(uri)
    figures = rank_run(
        uri,
        args.run,
        args.samples,
        args.epochs,
        args.seed,
        overrides={"threads": args.threads} if args.threads else None,
        on_pair=(lambda p: None) if args.quiet else _print_pair,
        standalone_seeds=args.standalone_seeds,
    )
    _print_ranking(args.run, figures)
    return 0


def _print_pair(p) -> None:
    """One genotype's accuracies as it is measured (on stderr: the summary goes to stdout)."""
    seeds = (
        " (" + " ".join(f"{a:.4f}" for a in p.standalone_by_seed) + ")"
        if len(p.standalone_by_seed) > 1
        else ""
    )
    print(
        f"  {p.source:<6} one-shot {p.one_shot_val_acc:.4f}  "
        f"stand-alone {p.standalone_val_acc:.4f}{seeds}  "
        f"{p.genotype}",
        file=sys.stderr,
        flush=True,
    )


def _print_ranking(run: str, figures: dict[str, float]) -> None:
    from .ranking import lead_text, lead_warning, p_text, proxy_text, proxy_warning
    from .sizerank import size_lines

    print(
        f"ranking of run {run}'s supernet ({int(figures[L.RANKING_GENOTYPES])} genotypes, "
        f"{proxy_text(figures)}):"
    )
    labels = ("sampled from alphas", "random", "all")
    for label, (suffix, _) in zip(labels, L.RANKING_GROUPS):
        print(
            f"  {label:<20} Kendall tau {_fig(figures[L.RANKING_KENDALL_TAU + suffix])}"
            f"{p_text(figures[L.RANKING_KENDALL_P + suffix])}  "
            f"Spearman rho {_fig(figures[L.RANKING_SPEARMAN_RHO + suffix])}"
        )
    if L.RANKING_PROXY_TAU in figures:
        print(
            f"  {'proxy (seed vs seed)':<20} Kendall tau "
            f"{_fig(figures[L.RANKING_PROXY_TAU])}"
            f"{p_text(figures[L.RANKING_PROXY_P])}  "
            "(the stand-alone proxy against itself: the most a one-shot tau can show)"
        )
        if warning := proxy_warning(figures):
            print(f"  {warning}")
    print("  (p: two-sided, how often a tau this far from 0 comes by chance alone)")
    lead = lead_text(figures)
    print(
        f"  stand-alone val acc, mean: from alphas {figures[L.RANKING_STANDALONE_MEAN]:.4f}, "
        f"random {figures[L.RANKING_STANDALONE_MEAN_RANDOM]:.4f}"
        + (f"; the alphas lead by {lead}" if lead else "")
    )
    if warning := lead_warning(figures):
        print(f"  {warning}")
    for line in size_lines(figures):
        print(f"  {line}")


def _fig(v: float) -> str:
    """A correlation, or why there is none (one genotype, or all accuracies tied)."""
    return "n/a (ties)" if math.isnan(v) else f"{v:+.3f}"

"""Command-line options that several subcommands share, built in one place so
that their names, defaults and help read the same everywhere."""

from __future__ import annotations

import argparse

STORE_HELP = "MLflow store (default: MLFLOW_TRACKING_URI, else mlruns/mlflow.db)"


def add_tracking_uri(p: argparse.ArgumentParser, help: str = STORE_HELP) -> None:
    """``--tracking-uri URI`` ("" when not given: the caller resolves the default)."""
    p.add_argument("--tracking-uri", default="", metavar="URI", help=help)


def add_threads(
    p: argparse.ArgumentParser, help: str = "torch CPU threads", default: int = 0
) -> None:
    """``--threads N`` (0: the caller's own rule)."""
    p.add_argument("--threads", type=int, default=default, metavar="N", help=help)


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress bars."""
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_set(p: argparse.ArgumentParser, help: str = "override a config value (repeatable)") -> None:
    """``--set SECTION.KEY=VALUE`` (repeatable), collected in ``overrides``."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=help,
    )

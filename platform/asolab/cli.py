"""Command line: ``asolab run | study | compare | ui``.

Every known failure (bad config, missing data set, corrupt checkpoint,
unreachable tracking server) ends with one line on stderr, ``asolab: error:
...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

from .compare.cli import add_parser as _add_compare
from .config import ConfigError, load
from .data import DataError
from .runner.checkpoint import CheckpointError

log = logging.getLogger("asolab")

USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataError, CheckpointError)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run ASO-SE evolution cycles for an experiment file")
    p.add_argument("file", nargs="?", help="experiment TOML (default: experiments/digits.toml); a bare name looks in experiments/")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .progress import ProgressObserver, summary_table
    from .runner import Runner
    from .runner.events import Recorder

    cfg = load(args.file, args.overrides)
    recorder = Recorder()
    runner = Runner(cfg, [ProgressObserver(enabled=not args.quiet), recorder])
    runner.run()
    print(summary_table(recorder.of("run_end")[-1]))
    return 0


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_run, _add_compare]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asolab", description="ASO-SE neural architecture evolution with MLflow and Optuna")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"asolab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("asolab: interrupted; everything recorded so far is kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Digits run with growth enabled: per growth event, params and accuracy before/after.

    python bench/growth_digits.py [--set key=value ...]
    python bench/growth_digits.py --smoke        # a seconds-long run (the test suite's)

Defaults: experiments/digits.toml with growth.policy = "cycle" and a shorter
schedule; prints one line per growth event and a closing summary. Exits 1 if
the network did not grow or any event lost more than 1 accuracy point or
broke function preservation (max |dlogits| > 1e-4).
"""

from __future__ import annotations

import argparse
import sys
import time

from asolab import config
from asolab.runner.cycle import Runner
from asolab.runner.events import Recorder

DEFAULTS = {
    "threads": 1,
    "device": "cpu",
    "tracking.enabled": False,
    "growth.policy": "cycle",
    "mutation.strength": 0.25,
    "space.init_channels": 8,
    "search.cycles": 3,
    "search.w_epochs": 2,
    "search.retrain_epochs": 2,
    "search.final_epochs": 3,
}
SMOKE = {
    "space.init_channels": 4,
    "search.w_epochs": 1,
    "search.alpha_epochs": 1,
    "search.retrain_epochs": 1,
    "search.final_epochs": 0,
    "search.cycles": 2,  # growth in each: widen, then deepen
    "data.train_subset": 64,  # one W-step an epoch
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    overrides = {**DEFAULTS, **(SMOKE if args.smoke else {})}
    overrides.update(dict(config.parse_override(o) for o in args.set))
    cfg = config.load(None, overrides)
    rec = Recorder()
    start = time.perf_counter()
    runner = Runner(cfg, [rec])
    params_start = runner.net.num_weights()
    result = runner.run()
    ok = True
    print(
        f"{'cycle':>5} {'kind':<7} {'where':<40} {'params':>17} {'max|dlogits|':>12} "
        f"{'val acc before -> after':>24}"
    )
    for e in rec.of("growth"):
        drop = e.val_acc_before - e.val_acc_after
        ok &= drop <= 0.01 and e.preservation_error <= 1e-4
        print(
            f"{e.cycle + 1:>5} {e.kind:<7} {e.where:<40} {e.params_before:>8}->{e.params_after:<8} "
            f"{e.preservation_error:>12.2e} {e.val_acc_before:>11.4f} -> {e.val_acc_after:.4f}"
        )
    params_end = runner.net.num_weights()
    ok &= params_end > params_start
    print(
        f"supernet params {params_start} -> {params_end}; "
        f"cycle val acc {[round(a, 4) for a in result.cycle_val_acc]}; "
        f"final val {result.val_acc:.4f} test {result.test_acc:.4f}; "
        f"{time.perf_counter() - start:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The control arms of an ASO-SE run: fixed genotypes trained for the same budget.

* ``scratch``  the genotype the ASO-SE run ended with, trained from scratch:
  the architecture's quality without the search's weight sharing (the
  standard NAS protocol of re-training the result);
* ``random``   a random genotype of the same space whose derived parameter
  count is within 10% of the ASO-SE network's (drawn until one fits; the
  closest of 5000 draws otherwise);
* ``initial``  the genotype derive() reads from the freshly initialised alphas
  of the same seed (search without evolution).

With ``search.param_free_cap`` the space is the capped one: the random and
initial genotypes keep within the cap, as the search's do.

"Same budget" means: each arm trains its fixed genotype from scratch (same
seed, so the same initial weights for the ops it shares) for exactly the
ASO-SE run's weight epochs, epoch by epoch in the same places -- the
W-training and W-retraining epochs of every cycle on the search split, then
``search.final_epochs`` on the whole training split (as many as the ASO-SE run
trained when ``search.budget_minutes`` fitted them) -- with the same SGD
settings and cosine learning-rate schedule. Alpha epochs train no weights and
are skipped (the arms have no alphas).

Each arm also comes with the ``-final`` budget (``scratch-final``,
``random-final``, ``initial-final``): the same genotype trained from scratch for
the final stage only -- the ASO-SE run's final epochs, with the learning rates
its final stage had -- while the search's epochs pass untrained. That is the
NAS literature's protocol (the searched and the baseline architecture get the
same final training) and the question "is the search, weights included, worth
its time?"; the default budget asks the stricter "is it better than spending
the search's weight epochs on one fixed network?".
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from ..config import ConfigError, ExperimentConfig
from ..runner import Runner
from ..runner.phases import BY_NAME, W_TRAIN
from ..runner.state import Position, epochs_done
from ..space.genotype import CELL_TYPES, Genotype
from ..space.ops import NONE, PARAMETER_FREE
from .names import ARMS, DEFAULT_ARMS, FINAL_ONLY, GENOTYPES  # noqa: F401 (their old home)

PARAM_TOLERANCE = 0.10  # the random arm's parameter count: within 10% of the ASO-SE network's


class FixedGenotypeRunner(Runner):
    """A runner whose genotype never changes: W-training trains the genotype's
    path instead of sampled ones, alpha-training and mutation do nothing. The
    epoch layout, LR schedule, BN recalibration and evaluation are the runner's.

    A subclass, because the phase table looks a phase's method up on the runner:
    overriding it is how a runner runs a phase differently. The arms add no state of
    their own (``reads`` only, checked like the Runner's parts)."""

    reads = frozenset({"cfg", "data", "net", "state"})

    def __init__(
        self,
        cfg: ExperimentConfig,
        observers=(),
        *,
        genotype: Genotype | None = None,
        final_epochs: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(cfg, observers, **kwargs)  # Runner.resume() builds it this way
        self.state.genotype = self.state.derived = (
            genotype if genotype is not None else self.net.derive(cfg.search.param_free_cap)
        )
        # The ASO-SE run's final-stage length when search.budget_minutes fitted it: the
        # arm trains the same epochs on the same schedule instead of fitting its own.
        self.state.final_epochs = final_epochs

    def w_train(self) -> None:
        epochs = BY_NAME[W_TRAIN].epochs(self.cfg.search, self.state.position.cycle)
        self.retrain(W_TRAIN, epochs, self.data.train)

    def alpha_train(self) -> None:
        pass

    @classmethod
    def epochs_at(cls, position: Position, search: Any) -> tuple[int, int] | None:
        # alpha-training trains nothing here, so its epochs never count
        return epochs_done(position, dataclasses.replace(search, alpha_epochs=0))

    def mutate_phase(self) -> None:
        pass

    def choose_final_genotype(self) -> Genotype:
        assert self.state.genotype is not None
        return self.state.genotype

    def fresh_weights(self) -> None:
        # An arm's weights are its own from the start: search.final_weights (the search's
        # hand-over to the final network) would discard the arm's search-split epochs.
        pass


class FinalOnlyRunner(FixedGenotypeRunner):
    """A fixed-genotype runner that trains the final stage only: the warm-up,
    W-training and W-retraining epochs pass untrained (counted, so the final
    epochs keep their places and learning rates in the schedule)."""

    reads = frozenset({"state"})

    def retrain(self, phase: str, epochs: int, split) -> None:
        self.state.position.global_epoch += epochs
        self.state.position.weight_epoch += epochs


def arm_class(arm: str) -> type[FixedGenotypeRunner]:
    """The runner class of ``arm`` (a resumed arm run is rebuilt with it)."""
    return FinalOnlyRunner if arm.endswith(FINAL_ONLY) else FixedGenotypeRunner


def random_genotype(
    rng: random.Random, primitives: tuple[str, ...], steps: int, param_free_cap: int = -1
) -> Genotype:
    """A uniformly random genotype: per node two distinct inputs, each with a non-none op;
    with ``param_free_cap`` >= 0, uniform over those whose cells keep within the cap
    (drawn again until one does)."""
    ops = [p for p in primitives if p != NONE]
    while True:
        g = _uniform_genotype(rng, ops, steps)
        if param_free_cap < 0 or g.most_param_free() <= param_free_cap:
            return g
        if all(op in PARAMETER_FREE for op in ops):
            raise ConfigError(
                f"search.param_free_cap = {param_free_cap}: space.primitives has no op with "
                "weights to fill the cells; add one or set the cap to -1"
            )


def _uniform_genotype(rng: random.Random, ops: list[str], steps: int) -> Genotype:
    cells = {
        kind: tuple(
            tuple((rng.choice(ops), j) for j in rng.sample(range(k + 2), 2)) for k in range(steps)
        )
        for kind in CELL_TYPES
    }
    return Genotype.from_cells(cells, range(2, steps + 2))


def matched_random(
    runner: Runner, target: int, seed: int, tolerance: float = PARAM_TOLERANCE, tries: int = 5000
) -> tuple[Genotype, int]:
    """A random genotype whose derived parameter count is within ``tolerance`` of ``target``,
    from the space the search draws from: with ``search.param_free_cap`` no cell has
    more parameter-free ops than the cap."""
    rng = random.Random(1000 + seed)
    cap = runner.cfg.search.param_free_cap
    best: tuple[float, Genotype, int] | None = None
    for _ in range(tries):
        g = random_genotype(rng, runner.spec.primitives, runner.spec.steps, cap)
        n = runner.net.count_derived(g)
        gap = abs(n - target) / target
        if best is None or gap < best[0]:
            best = (gap, g, n)
        if gap <= tolerance:
            break
    assert best is not None
    return best[1], best[2]


def arm_runner(
    arm: str, cfg: ExperimentConfig, found: Genotype, found_params: int, observers=(), **kwargs: Any
) -> FixedGenotypeRunner:
    """The runner of one control arm for an ASO-SE run of ``cfg`` that ended with
    genotype ``found`` of ``found_params`` derived parameters."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")
    kind, genotype = arm_class(arm), arm.removesuffix(FINAL_ONLY)
    if genotype == "initial":
        return kind(cfg, observers, **kwargs)
    if genotype == "scratch":
        # On the fresh, ungrown network: cells that growth inserted (and their own
        # cells in the genotype) are left out.
        return kind(cfg, observers, genotype=dataclasses.replace(found, own_cells=()), **kwargs)
    data = kwargs.get("data")
    probe = FixedGenotypeRunner(cfg, data=data)  # seeded: the fresh supernet of this seed
    drawn, _ = matched_random(probe, found_params, cfg.seed)
    return kind(cfg, observers, genotype=drawn, **kwargs)

"""How well does the supernet rank architectures? (``asolab rank``)

The standard explanation when a weight-sharing search loses to random
architectures is that the supernet ranks them poorly. This measures it on a
recorded run: K genotypes sampled from the run's final alphas and K random
genotypes of the same space each get

* a one-shot validation accuracy: the supernet evaluated along the genotype
  on the validation split, after re-estimating BatchNorm statistics along it
  (as the runner does for every derived network), and
* a stand-alone validation accuracy: the genotype trained from scratch for a
  few epochs on the search split (same seed, same SGD settings), evaluated on
  the validation split; with several stand-alone seeds, the mean over them.

Kendall's tau and Spearman's rho between the two (over the sampled
genotypes, the random ones, and both) become metrics of the run; the pairs
and a scatter plot become artifacts (names in :mod:`asolab.tracking.layout`).

A short stand-alone training is itself a noisy judge. With two or more
stand-alone seeds the diagnostic also measures the proxy's own reliability:
Kendall's tau between the first two seeds' accuracies over all genotypes. A
one-shot tau cannot be expected to exceed it; a near-zero one-shot tau under a
near-zero proxy tau says the proxy, not the supernet, is what cannot rank.
The supernet is the one in the run's last checkpoint: for a search-only run
(``search.final_epochs = 0``, as studies run) that is the supernet at the end
of the search; after final epochs its weights have also trained along the
final genotype. The test split is never read.
"""

from __future__ import annotations

import math
import random
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, ExperimentConfig
from ..data import DataBundle
from ..runner import Runner
from ..space.cells import edge_index
from ..space.flops import network_size
from ..space.genotype import CELL_TYPES, Genotype
from ..space.network import SearchNetwork
from ..space.ops import NONE, PARAMETER_FREE
from ..tracking import layout as L
from .arms import FixedGenotypeRunner, random_genotype
from .pareto import log_png, pareto_png, ranking_points
from .sizerank import size_correlations

SOURCES = ("alphas", "random")


@dataclass(frozen=True)
class Pair:
    """One genotype's two accuracies."""

    source: str  # "alphas" | "random"
    genotype: str
    one_shot_val_acc: float
    standalone_val_acc: float  # the mean over the stand-alone seeds
    standalone_by_seed: tuple[float, ...] = ()  # one accuracy per stand-alone seed
    params: int = 0  # the genotype's network: parameters (as the runner counts them) ...
    flops: int = 0  # ... and multiply-adds of one image (space/flops.py)


def sample_genotype(
    net: SearchNetwork, rng: random.Random, temperature: float = 1.0, param_free_cap: int = -1
) -> Genotype:
    """A genotype drawn from the alphas' softmax: per node two distinct inputs, each
    drawn with probability proportional to its strongest non-none op's weight (the
    quantity derive() ranks by), and each kept edge's op drawn among the non-none ops;
    with ``param_free_cap`` >= 0, among the ops with weights once a cell has that many
    parameter-free ones (as mutation does)."""
    prims = net.spec.primitives
    allowed = [i for i, p in enumerate(prims) if p != NONE]
    cells = {}
    for kind in CELL_TYPES:
        w = (net.alphas[kind].detach().cpu() / temperature).softmax(-1)
        nodes = []
        free = 0  # parameter-free ops drawn into this cell so far
        for k in range(net.spec.steps):
            inputs = list(range(k + 2))
            strength = [max(w[edge_index(k, j), i].item() for i in allowed) for j in inputs]
            chosen: list[int] = []
            for _ in range(2):
                j = rng.choices(
                    [j for j in inputs if j not in chosen],
                    [s for j, s in zip(inputs, strength) if j not in chosen],
                )[0]
                chosen.append(j)
            node = []
            for j in chosen:
                row = w[edge_index(k, j)]
                ops = allowed
                if 0 <= param_free_cap <= free:
                    ops = [i for i in allowed if prims[i] not in PARAMETER_FREE] or allowed
                op = rng.choices(ops, [row[i].item() for i in ops])[0]
                free += prims[op] in PARAMETER_FREE
                node.append((prims[op], j))
            nodes.append(tuple(node))
        cells[kind] = tuple(nodes)
    return Genotype.from_cells(cells, range(2, net.spec.steps + 2))


def _distinct(draw: Callable[[], Genotype], k: int, tries: int = 50) -> list[Genotype]:
    """Up to ``k`` distinct genotypes from ``draw`` (alphas that have converged repeat
    themselves)."""
    out: dict[str, Genotype] = {}
    for _ in range(k * tries):
        g = draw()
        out.setdefault(g.canonical, g)
        if len(out) == k:
            break
    return list(out.values())


def standalone_config(cfg: ExperimentConfig, epochs: int) -> ExperimentConfig:
    """One cycle of ``epochs`` W-training epochs on the search split, nothing else."""
    return cfg.replace(
        **{
            "search.cycles": 1,
            "search.warmup_epochs": 0,
            "search.w_epochs": epochs,
            "search.alpha_epochs": 0,
            "search.retrain_epochs": 0,
            "search.final_epochs": 0,
        }
    )


def standalone_val_acc(cfg: ExperimentConfig, genotype: Genotype, data: DataBundle) -> float:
    """Train ``genotype`` from scratch by ``cfg``'s cycles (no final stage) and return its
    validation accuracy; the test split is not even evaluated."""
    runner = FixedGenotypeRunner(cfg, genotype=genotype, data=data)
    runner.determinism.apply()  # speed.deterministic, as Runner.run applies it
    try:
        while runner.state.position.cycle < runner.cfg.search.cycles:
            runner.next_phase()
        assert runner.state.genotype is not None
        return runner.evaluate(runner.data.val, runner.state.genotype)[1]
    finally:
        runner.determinism.restore()


def measure(
    runner: Runner,
    samples: int,
    epochs: int,
    seed: int,
    on_pair: Callable[[Pair], None] = lambda p: None,
    standalone_seeds: int = 1,
) -> list[Pair]:
    """The pairs of up to ``samples`` genotypes from the runner's alphas and ``samples``
    random ones; each genotype trains alone once per stand-alone seed (the run's seed,
    then the next ones)."""
    if samples < 2:
        raise ConfigError(
            f"--samples must be at least 2 (got {samples}): a rank correlation needs two genotypes"
        )
    if epochs < 1:
        raise ConfigError(f"--epochs must be at least 1 (got {epochs})")
    if standalone_seeds < 1:
        raise ConfigError(f"--standalone-seeds must be at least 1 (got {standalone_seeds})")
    rng = random.Random(seed)
    spec = runner.spec
    cap = runner.cfg.search.param_free_cap  # both groups from the space the search derives in
    drawn = {
        "alphas": _distinct(lambda: sample_genotype(runner.net, rng, param_free_cap=cap), samples),
        "random": _distinct(
            lambda: random_genotype(rng, spec.primitives, spec.steps, cap), k=samples
        ),
    }
    # One-shot first, while the supernet is as the run left it (calibration only touches BN
    # statistics).
    one_shot = {
        (src, g.canonical): runner.evaluate(runner.data.val, runner.calibrate(g))[1]
        for src, gs in drawn.items()
        for g in gs
    }
    cfg = standalone_config(runner.cfg, epochs)
    seeds = [cfg.seed + i for i in range(standalone_seeds)]
    pairs = []
    for src, gs in drawn.items():
        for g in gs:
            alone = tuple(standalone_val_acc(cfg.replace(seed=s), g, runner.data) for s in seeds)
            mean = sum(alone) / len(alone)
            size = network_size(spec, g, runner.data.image_size)
            pair = Pair(src, g.canonical, one_shot[(src, g.canonical)], mean, alone, *size)
            pairs.append(pair)
            on_pair(pair)
    return pairs


def _kendall(a: list[float], b: list[float]) -> tuple[float, float]:
    """Kendall's tau and its two-sided p-value, NaN when undefined (under two values,
    or one side all tied)."""
    from scipy.stats import kendalltau

    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:
        return math.nan, math.nan
    kendall = kendalltau(a, b)
    return float(kendall.statistic), float(kendall.pvalue)


def correlations(pairs: list[Pair]) -> dict[str, float]:
    """Kendall's tau, its two-sided p-value (no association as the null hypothesis) and
    Spearman's rho per source and over all pairs (NaN where undefined). A handful of
    genotypes leaves tau uncertain by several tenths; the p-value says how often a tau
    this far from zero comes by chance. With two or more stand-alone seeds, also the
    proxy's reliability: tau (and p) between the first two seeds over all genotypes."""
    from scipy.stats import spearmanr

    out: dict[str, float] = {L.RANKING_GENOTYPES: float(len(pairs))}
    for suffix, group in L.RANKING_GROUPS:
        chosen = [p for p in pairs if p.source == group] if group in SOURCES else pairs
        a = [p.one_shot_val_acc for p in chosen]
        b = [p.standalone_val_acc for p in chosen]
        tau, p = _kendall(a, b)
        out[L.RANKING_KENDALL_TAU + suffix] = tau
        out[L.RANKING_KENDALL_P + suffix] = p
        out[L.RANKING_SPEARMAN_RHO + suffix] = (
            math.nan if math.isnan(tau) else float(spearmanr(a, b).statistic)
        )
    if pairs and all(len(p.standalone_by_seed) >= 2 for p in pairs):
        tau, p = _kendall(
            [p.standalone_by_seed[0] for p in pairs], [p.standalone_by_seed[1] for p in pairs]
        )
        out[L.RANKING_PROXY_TAU] = tau
        out[L.RANKING_PROXY_P] = p
    return out


def alphas_lead(pairs: list[Pair]) -> dict[str, float]:
    """Do the alphas gather on genotypes that train better alone than random ones? Each
    group's mean stand-alone accuracy, the difference (alphas minus random) and its 95%
    interval by Welch's t (the groups are independent draws whose spreads may differ);
    the difference and interval are NaN while a group has fewer than two genotypes. A
    supernet that ranks well does not help the search if the alphas do not follow it."""
    from scipy.stats import ttest_ind

    groups = [[p.standalone_val_acc for p in pairs if p.source == s] for s in SOURCES]
    out = {
        L.RANKING_STANDALONE_MEAN + suffix: (sum(g) / len(g) if g else math.nan)
        for (suffix, _), g in zip(L.RANKING_GROUPS, groups)
    }
    lead = low = high = math.nan
    if all(len(g) >= 2 for g in groups):
        lead = out[L.RANKING_STANDALONE_MEAN] - out[L.RANKING_STANDALONE_MEAN_RANDOM]
        if any(len(set(g)) > 1 for g in groups):  # Welch's interval needs some spread
            interval = ttest_ind(*groups, equal_var=False).confidence_interval(0.95)
            low, high = float(interval.low), float(interval.high)
    return out | {
        L.RANKING_ALPHAS_LEAD: lead,
        L.RANKING_ALPHAS_LEAD_LOW: low,
        L.RANKING_ALPHAS_LEAD_HIGH: high,
    }


def lead_text(figures: dict[str, float]) -> str:
    """The alphas' lead in points with its interval: "+0.30 points (95% CI -0.61 ..
    +1.21)", or "" for a run ranked before it was logged."""
    lead = figures.get(L.RANKING_ALPHAS_LEAD, math.nan)
    if math.isnan(lead):
        return ""
    low = figures.get(L.RANKING_ALPHAS_LEAD_LOW, math.nan)
    high = figures.get(L.RANKING_ALPHAS_LEAD_HIGH, math.nan)
    interval = "" if math.isnan(low) else f" (95% CI {100 * low:+.2f} .. {100 * high:+.2f})"
    return f"{100 * lead:+.2f} points{interval}"


def lead_warning(figures: dict[str, float]) -> str | None:
    """A line for when the alphas' genotypes are not shown to train better alone than
    random ones (the interval of the lead reaches zero): the search's choice then rests
    on the alpha phase, whatever the supernet's ranking. None otherwise."""
    low = figures.get(L.RANKING_ALPHAS_LEAD_LOW, math.nan)
    if math.isnan(low) or low > 0:
        return None
    entropy = figures.get(L.RANKING_ALPHA_ENTROPY, math.nan)
    moved = "" if math.isnan(entropy) else f" (their entropy is {entropy:.2f} of uniform)"
    return (
        "the alphas' genotypes are not shown to train better alone than random ones"
        f"{moved}: look at the alpha phase (search.alpha_lr, search.alpha_epochs, temperature.*)"
    )


def p_text(p: float) -> str:
    """Kendall's tau's p-value as printed after the tau: " (p 0.14)", or nothing
    when the tau has none (undefined, or a run ranked before p-values were logged)."""
    return "" if math.isnan(p) else f" (p {p:.2f})"


def proxy_text(figures: dict[str, float]) -> str:
    """The stand-alone proxy's size: "stand-alone 6 epochs x 2 seeds" (or "stand-alone
    size not recorded" for a run ranked before it was logged)."""
    epochs = figures.get(L.RANKING_STANDALONE_EPOCHS, math.nan)
    seeds = figures.get(L.RANKING_STANDALONE_SEEDS, math.nan)
    if math.isnan(epochs):
        return "stand-alone size not recorded"
    seeds_text = "" if math.isnan(seeds) else f" x {int(seeds)} seed{'s' if seeds != 1 else ''}"
    return f"stand-alone {int(epochs)} epoch{'s' if epochs != 1 else ''}{seeds_text}"


def proxy_warning(figures: dict[str, float]) -> str | None:
    """A line for when the stand-alone proxy is not shown to agree with itself (its
    seed-vs-seed tau not positive at p < 0.05): then a one-shot tau may be the proxy's
    noise, and the fix is a longer stand-alone training. None when it agrees, or was
    not measured."""
    if L.RANKING_PROXY_TAU not in figures:
        return None
    tau, p = figures[L.RANKING_PROXY_TAU], figures[L.RANKING_PROXY_P]
    if not math.isnan(tau) and tau > 0 and p < 0.05:
        return None
    told = "undefined (tied accuracies)" if math.isnan(tau) else f"{tau:+.2f}{p_text(p)}"
    return (
        f"the stand-alone proxy is not shown to agree with itself (seed vs seed tau {told}): "
        "the one-shot taus above may be its noise; raise --epochs"
    )


def scatter_png(pairs: list[dict], title: str) -> bytes | None:
    """One-shot against stand-alone validation accuracy, one colour per source."""
    if not pairs:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.6, 4.0))
    for src, colour in zip(SOURCES, ("tab:blue", "tab:orange")):
        chosen = [p for p in pairs if p["source"] == src]
        if chosen:
            ax.scatter(
                [p["one_shot_val_acc"] for p in chosen],
                [p["standalone_val_acc"] for p in chosen],
                label="sampled from alphas" if src == "alphas" else "random",
                c=colour,
                s=22,
            )
    ax.set_xlabel("one-shot val acc (supernet)")
    ax.set_ylabel("stand-alone val acc (short training)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def rank_run(
    tracking_uri: str,
    run_id: str,
    samples: int = 8,
    epochs: int = 2,
    seed: int | None = None,
    overrides: dict | None = None,
    data: DataBundle | None = None,
    on_pair: Callable[[Pair], None] = lambda p: None,
    standalone_seeds: int = 1,
) -> dict[str, float]:
    """Measure the ranking of recorded run ``run_id``'s supernet; record metrics and artifacts
    in the run."""
    from mlflow.tracking import MlflowClient

    from .run import get_run

    client = MlflowClient(tracking_uri=tracking_uri)
    run = get_run(client, run_id)
    runner = _resumed_supernet(client, run.info.run_id, data)
    if overrides:
        runner.cfg = runner.cfg.replace(**overrides)
        if runner.cfg.threads:
            torch.set_num_threads(runner.cfg.threads)
    pairs = measure(
        runner,
        samples,
        epochs,
        runner.cfg.seed if seed is None else seed,
        on_pair,
        standalone_seeds,
    )
    figures = correlations(pairs) | alphas_lead(pairs) | size_correlations(pairs)
    # alphas that have not moved from uniform cannot gather on anything: say how far they did
    figures[L.RANKING_ALPHA_ENTROPY] = runner.net.alpha_entropy()
    # the proxy's size travels with its figures: a tau from 2 epochs is not one from 6
    figures[L.RANKING_STANDALONE_EPOCHS] = float(epochs)
    figures[L.RANKING_STANDALONE_SEEDS] = float(standalone_seeds)
    _record(client, run, figures, pairs, {"samples": samples, "epochs": epochs}, standalone_seeds)
    return figures


def _resumed_supernet(client: Any, run_id: str, data: DataBundle | None) -> Runner:
    """The run's supernet, rebuilt from its checkpoint."""
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="asolab-rank-") as tmp:
        try:
            path = client.download_artifacts(run_id, L.CHECKPOINT_ARTIFACT, tmp)
        except (MlflowException, OSError):
            raise ConfigError(
                f"run {run_id} has no {L.CHECKPOINT_ARTIFACT}: the ranking needs the run's "
                "supernet (runs of 'asolab run' and studies keep one)"
            ) from None
        return Runner.resume(path, data=data)


def _record(
    client: Any,
    run: Any,
    figures: dict[str, float],
    pairs: list[Pair],
    sizes: dict[str, int],
    standalone_seeds: int,
) -> None:
    """The figures as metrics of the run (step 0), the pairs and the scatter as artifacts."""
    import json

    run_id = run.info.run_id
    for k, v in figures.items():
        if not math.isnan(v):
            client.log_metric(run_id, k, v, step=0)
    records = [asdict(p) for p in pairs]
    client.log_text(
        run_id,
        json.dumps({**sizes, "standalone_seeds": standalone_seeds, "pairs": records}, indent=1),
        L.RANKING_PAIRS_ARTIFACT,
    )
    png = scatter_png(
        records, f"{run.info.run_name}: tau {figures[L.RANKING_KENDALL_TAU]:.2f} (alphas)"
    )
    if png:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(L.RANKING_PLOT_ARTIFACT).name
            p.write_bytes(png)
            client.log_artifact(run_id, str(p), L.RANKING_DIR)
    panel = (f"{run.info.run_name}: ranked genotypes, stand-alone", ranking_points(records))
    log_png(client, run_id, pareto_png([panel]), L.RANKING_PARETO_ARTIFACT)

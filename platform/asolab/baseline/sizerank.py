"""Parameter count as a ranking baseline for ``asolab rank``.

Zero-cost proxies are judged against the simplest one: count the parameters
(ZiCo, ICLR 2023: none beats it consistently). Over the genotypes a ranking
diagnostic trains alone, Kendall's tau and Spearman's rho of their parameter
count, and of their multiply-adds (one forward pass, :mod:`asolab.space.flops`),
against their stand-alone validation accuracy sit beside the supernet's
(over all genotypes). ``ranking_tau_minus_params`` is the supernet's tau minus
the parameter count's: above zero, the supernet ranks better than counting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..tracking.layout import (
    RANKING_FLOPS_KENDALL_TAU,
    RANKING_FLOPS_SPEARMAN_RHO,
    RANKING_PARAMS_KENDALL_P,
    RANKING_PARAMS_KENDALL_TAU,
    RANKING_PARAMS_SPEARMAN_RHO,
    RANKING_TAU_MINUS_PARAMS,
)

SUPERNET_TAU = "ranking_kendall_tau_all"  # the supernet's tau over the same genotypes


def size_correlations(pairs: Sequence[Any]) -> dict[str, float]:
    """Tau (and p) and rho of each pair's ``params`` and ``flops`` against its stand-alone
    accuracy, and the supernet's tau over all pairs minus the parameter count's (NaN where
    undefined: under two genotypes, or all sizes or accuracies tied)."""
    from scipy.stats import kendalltau, spearmanr

    out = {}
    acc = [p.standalone_val_acc for p in pairs]
    for field, tau_name, rho_name in (
        ("params", RANKING_PARAMS_KENDALL_TAU, RANKING_PARAMS_SPEARMAN_RHO),
        ("flops", RANKING_FLOPS_KENDALL_TAU, RANKING_FLOPS_SPEARMAN_RHO),
    ):
        size = [float(getattr(p, field)) for p in pairs]
        tau = p_value = rho = math.nan
        if len(size) >= 2 and len(set(size)) > 1 and len(set(acc)) > 1:
            k = kendalltau(size, acc)
            tau, p_value = float(k.statistic), float(k.pvalue)
            rho = float(spearmanr(size, acc).statistic)
        out[tau_name], out[rho_name] = tau, rho
        if field == "params":
            out[RANKING_PARAMS_KENDALL_P] = p_value
    one_shot = [p.one_shot_val_acc for p in pairs]
    supernet = math.nan
    if len(set(one_shot)) > 1 and len(set(acc)) > 1:
        supernet = float(kendalltau(one_shot, acc).statistic)
    out[RANKING_TAU_MINUS_PARAMS] = supernet - out[RANKING_PARAMS_KENDALL_TAU]
    return out


def _fig(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:+.3f}"


def size_lines(figures: Mapping[str, float]) -> list[str]:
    """The parameter-count baseline for the terminal: its tau and rho (and the FLOPs'),
    then whether the supernet ranks better than counting parameters."""
    tau = figures.get(RANKING_PARAMS_KENDALL_TAU, math.nan)
    p = figures.get(RANKING_PARAMS_KENDALL_P, math.nan)
    p_text = "" if math.isnan(p) else f" (p {p:.2f})"
    lines = [
        f"{'parameter count':<20} Kendall tau {_fig(tau)}{p_text}  Spearman rho "
        f"{_fig(figures.get(RANKING_PARAMS_SPEARMAN_RHO, math.nan))}  (all genotypes)",
        f"{'multiply-adds':<20} Kendall tau "
        f"{_fig(figures.get(RANKING_FLOPS_KENDALL_TAU, math.nan))}  Spearman rho "
        f"{_fig(figures.get(RANKING_FLOPS_SPEARMAN_RHO, math.nan))}  (all genotypes)",
    ]
    verdict = verdict_text(figures)
    if verdict:
        lines.append(verdict)
    return lines


def verdict_text(figures: Mapping[str, float]) -> str:
    """Does the supernet rank better than counting parameters? "" when undefined."""
    gap = figures.get(RANKING_TAU_MINUS_PARAMS, math.nan)
    if math.isnan(gap):
        return ""
    supernet = figures.get(SUPERNET_TAU, math.nan)
    params = figures.get(RANKING_PARAMS_KENDALL_TAU, math.nan)
    how = "better than" if gap > 0 else "no better than"
    return (
        f"the supernet ranks {how} counting parameters: tau {supernet:+.3f} vs {params:+.3f} "
        f"(supernet minus parameters {gap:+.3f})"
    )


def compare_text(figures: Mapping[str, float]) -> str:
    """The parameter-count baseline as compare prints it after a run's ranking figures:
    "; parameters tau +0.450 (supernet minus parameters -0.150)", or "" when the run was
    ranked before it was recorded."""
    tau = figures.get(RANKING_PARAMS_KENDALL_TAU, math.nan)
    if tau is None or math.isnan(tau):
        return ""
    gap = figures.get(RANKING_TAU_MINUS_PARAMS, math.nan)
    return f"; parameters tau {tau:+.3f} (supernet minus parameters {_fig(gap)})"

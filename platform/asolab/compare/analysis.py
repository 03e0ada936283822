"""Genotype analysis across runs: diffs, distances, op frequencies, clusters, evolution.

Everything here works on values (:class:`~asolab.space.genotype.Genotype`,
:class:`~asolab.compare.select.RunRecord`) and returns pandas frames, except
:func:`load_evolution`, which reads a run's per-cycle genotype artifacts.

Distance is :func:`asolab.space.genotype.distance`: the number of edge
positions ``(cell, node, input)`` whose operations differ (a missing edge
counts as different) plus one per cell whose concat list differs (cells with
their own alphas included): a Hamming distance, hence a metric.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from ..space.genotype import CELL_TYPES, Genotype, concat_changes, diff, distance
from ..space.ops import NONE, PRIMITIVES
from ..tracking import layout
from ..tracking.runs import cycle_genotypes, read_artifact
from .arms import arm_runs, arm_seed_table, arm_summary, has_arms
from .select import VAL_ACC_METRICS, RunRecord, Selection

DIFF_COLUMNS = ("cell", "node", "input", "before", "after")
OWN_COLUMN = "own"  # op frequencies of the cells with their own alphas


def diff_lines(a: Genotype, b: Genotype) -> list[str]:
    """Human-readable changes from ``a`` to ``b``: one line per changed edge, then concat
    changes."""
    lines = [str(c) for c in diff(a, b)]
    for kind, before, after in concat_changes(a, b):
        lines.append(f"{kind} concat: {_concat_text(before)} -> {_concat_text(after)}")
    return lines


def _concat_text(concat: tuple[int, ...] | None) -> str:
    return (
        "-" if concat is None else ",".join(map(str, concat))
    )  # "-": no such cell, as for a missing edge


def diff_frame(a: Genotype, b: Genotype) -> pd.DataFrame:
    """The edge changes from ``a`` to ``b`` as a frame (``-`` = no edge at that position)."""
    rows = [
        {
            "cell": c.cell,
            "node": c.node,
            "input": c.input,
            "before": "+".join(c.before) or "-",
            "after": "+".join(c.after) or "-",
        }
        for c in diff(a, b)
    ]
    return pd.DataFrame(rows, columns=list(DIFF_COLUMNS))


def labels(records: Sequence[RunRecord]) -> list[str]:
    """Short, unique labels for runs: the run name, with the id prefix when names repeat."""
    counts = Counter(r.run_name for r in records)
    return [
        r.run_name
        if r.run_name and counts[r.run_name] == 1
        else f"{r.run_name or 'run'}:{layout.short_id(r.run_id)}"
        for r in records
    ]


def distance_matrix(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Pairwise genotype distances, rows and columns labelled by run."""
    names = labels(records)
    data = [[distance(a.genotype, b.genotype) for b in records] for a in records]
    return pd.DataFrame(data, index=names, columns=names)


def op_frequencies(genotypes: Sequence[Genotype]) -> pd.DataFrame:
    """How often each op appears, per cell type, summed over ``genotypes``.

    Index: every primitive (the standard ones in their usual order, then any
    others seen); columns ``normal``, ``reduce``, then ``own`` (all cells with
    their own alphas together) only when some genotype has such cells, and
    ``total``.
    """
    columns = (*CELL_TYPES, OWN_COLUMN)
    counts = {kind: Counter() for kind in columns}
    for g in genotypes:
        for kind, _node, op, _i in g.edges():
            counts[kind if kind in CELL_TYPES else OWN_COLUMN][op] += 1
    seen = set().union(*counts.values())
    ops = [p for p in PRIMITIVES if p in seen or p != NONE] + sorted(seen - set(PRIMITIVES))
    shown = columns if counts[OWN_COLUMN] else CELL_TYPES
    df = pd.DataFrame(
        {kind: [counts[kind][op] for op in ops] for kind in shown}, index=pd.Index(ops, name="op")
    )
    df["total"] = df.sum(axis=1)
    return df


def clusters(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Groups of runs that found the same genotype (same canonical form), most runs first.

    Columns: ``cluster`` (1 = most found), ``runs`` (how many), ``genotype``,
    ``run_names``, ``experiments``, ``mean_val_acc``, ``best_test_acc``.
    """
    groups: dict[str, list[int]] = {}
    for k, r in enumerate(records):
        groups.setdefault(r.genotype.canonical, []).append(k)
    names = labels(records)
    rows = []
    for canonical, members in groups.items():
        val = [records[k].metric(*VAL_ACC_METRICS) for k in members]
        test = [records[k].metric(layout.TEST_ACC) for k in members]
        rows.append(
            {
                "runs": len(members),
                "genotype": canonical,
                "run_names": ", ".join(names[k] for k in members),
                "experiments": ", ".join(sorted({records[k].experiment for k in members})),
                "mean_val_acc": _mean(val),
                "best_test_acc": max((t for t in test if not math.isnan(t)), default=math.nan),
            }
        )
    df = pd.DataFrame(
        rows,
        columns=["runs", "genotype", "run_names", "experiments", "mean_val_acc", "best_test_acc"],
    )
    df = df.sort_values(
        ["runs", "mean_val_acc"], ascending=[False, False], na_position="last", kind="stable"
    ).reset_index(drop=True)
    df.insert(0, "cluster", range(1, len(df) + 1))
    return df


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def best(records: Sequence[RunRecord]) -> RunRecord | None:
    """The run with the highest validation accuracy (the first run when none has one)."""
    if not records:
        return None
    scored = [(r.metric(*VAL_ACC_METRICS), -k, r) for k, r in enumerate(records)]
    valid = [s for s in scored if not math.isnan(s[0])]
    return max(valid, key=lambda s: (s[0], s[1]))[2] if valid else records[0]


@dataclass(frozen=True)
class GenotypeDiff:
    """How one run's genotype differs from a reference run's."""

    reference: RunRecord
    other: RunRecord
    lines: tuple[str, ...]
    distance: int  # edge positions that differ (space.genotype.distance)


def diffs_to_best(records: Sequence[RunRecord]) -> list[GenotypeDiff]:
    """For each distinct genotype other than the best run's: its diff from the best run's
    genotype."""
    ref = best(records)
    if ref is None:
        return []
    out, seen = [], {ref.genotype.canonical}
    for r in records:
        if r.genotype.canonical in seen:
            continue
        seen.add(r.genotype.canonical)
        out.append(
            GenotypeDiff(
                ref,
                r,
                tuple(diff_lines(ref.genotype, r.genotype)),
                distance(ref.genotype, r.genotype),
            )
        )
    return out


def evolution(
    cycles: Sequence[tuple[int, Genotype]], cycle_val_acc: Mapping[int, float] | None = None
) -> pd.DataFrame:
    """The genotype at each cycle and its edit distance from the previous cycle's.

    Columns: ``cycle``, ``distance_prev`` (NaN-free integer; 0 for the first
    cycle), ``changes`` (the diff lines joined by ``; ``), ``val_acc`` (the
    cycle's entry in ``cycle_val_acc``, keyed by cycle number, else NaN),
    ``genotype``.
    """
    accs = cycle_val_acc or {}
    rows = []
    prev: Genotype | None = None
    for cycle, g in cycles:
        rows.append(
            {
                "cycle": cycle,
                "distance_prev": distance(prev, g) if prev is not None else 0,
                "changes": "; ".join(diff_lines(prev, g)) if prev is not None else "",
                "val_acc": accs.get(cycle, math.nan),
                "genotype": g.canonical,
            }
        )
        prev = g
    return pd.DataFrame(rows, columns=["cycle", "distance_prev", "changes", "val_acc", "genotype"])


def val_acc_by_cycle(values: Sequence[Metric], epoch_cycles: Sequence[Metric]) -> dict[int, float]:
    """Match ``cycle_val_acc`` values to cycle numbers by step.

    The tracker logs ``cycle_val_acc`` at the global epoch reached when the
    cycle ends, one step past that cycle's last epoch, and logs the epoch
    metric ``cycle`` (the cycle number) at every epoch. So a value belongs to
    the cycle of the last epoch before its step. Matching by step, not by
    position, keeps every value on its own cycle when a cycle artifact is
    missing or does not parse. Without a ``cycle`` history (a store written by
    other means) the k-th value by step is cycle k.
    """
    values = sorted(
        values, key=lambda m: (m.step, m.timestamp)
    )  # a re-logged step: the latest wins
    if not epoch_cycles:
        ordinal = {step: k for k, step in enumerate(sorted({m.step for m in values}))}
        return {ordinal[m.step]: m.value for m in values}
    epochs = sorted((m.step, int(m.value)) for m in epoch_cycles)
    epoch_steps = [step for step, _ in epochs]
    out = {}
    for m in values:
        k = bisect.bisect_left(epoch_steps, m.step)  # epochs[k - 1] is the last epoch before m.step
        # No epoch before it: only cycle 0 can have ended (a cycle without epochs).
        out[epochs[k - 1][1] if k else 0] = m.value
    return out


def load_evolution(client: MlflowClient, run_id: str) -> pd.DataFrame:
    """:func:`evolution` of a recorded run: its cycle artifacts and its ``cycle_val_acc``
    history."""
    accs = val_acc_by_cycle(
        client.get_metric_history(run_id, layout.CYCLE_VAL_ACC),
        client.get_metric_history(run_id, layout.CYCLE),
    )
    return evolution(cycle_genotypes(client, run_id), accs)


@dataclass
class Comparison:
    """Everything compare derives from a selection (the report renders this)."""

    selection: Selection
    table: pd.DataFrame
    clusters: pd.DataFrame
    op_frequencies: pd.DataFrame
    distances: pd.DataFrame
    diffs: list[GenotypeDiff]
    evolutions: dict[str, pd.DataFrame] = field(default_factory=dict)  # run_id -> evolution frame
    arms: pd.DataFrame | None = None  # arm view (compare/arms.py), when runs carry arm tags
    arm_seeds: pd.DataFrame | None = None  # the arm view's per-seed table, likewise
    rankings: pd.DataFrame | None = None  # ranking diagnostic figures of the runs that have them
    ranking_pairs: dict[str, list] = field(default_factory=dict)  # run_id -> pairs (report scatter)

    @property
    def records(self) -> list[RunRecord]:
        return self.selection.records


def analyse(
    selection: Selection, *, with_evolution: bool = True, client: MlflowClient | None = None
) -> Comparison:
    """Derive every table of a comparison; ``with_evolution`` reads each run's cycle genotypes."""
    records = selection.records
    evolutions: dict[str, pd.DataFrame] = {}
    if with_evolution and records:
        client = client or MlflowClient(tracking_uri=selection.tracking_uri)
        evolutions = {r.run_id: load_evolution(client, r.run_id) for r in records}
    table = selection.table()
    arms = arm_seeds = None
    if has_arms(records):
        from .sizefit import flops_by_run

        client = client or MlflowClient(tracking_uri=selection.tracking_uri)
        arm_frame = arm_runs(records, flops_by_run(client, records))
        arms, arm_seeds = arm_summary(arm_frame), arm_seed_table(arm_frame)
        # which arm each run is, and the ASO-SE run it controls for
        table.insert(2, "arm", [r.tags.get(layout.TAG_ARM, "") for r in records])
        table.insert(3, "controls", [r.tags.get(layout.TAG_CONTROLS, "") for r in records])
    rankings = ranking_table(records)
    pairs: dict[str, list] = {}
    if with_evolution and rankings is not None:
        client = client or MlflowClient(tracking_uri=selection.tracking_uri)
        pairs = {rid: p for rid in rankings["run_id"] if (p := ranking_pairs(client, rid))}
    return Comparison(
        selection=selection,
        table=table,
        arms=arms,
        arm_seeds=arm_seeds,
        rankings=rankings,
        ranking_pairs=pairs,
        clusters=clusters(records),
        op_frequencies=op_frequencies([r.genotype for r in records]),
        distances=distance_matrix(records),
        diffs=diffs_to_best(records),
        evolutions=evolutions,
    )


def ranking_table(records: Sequence[RunRecord]) -> pd.DataFrame | None:
    """The ranking diagnostic figures (``asolab rank``) of the runs that have them, or None."""
    rows = [
        {
            "run_name": r.run_name,
            "run_id": r.run_id,
            **{m: r.metric(m) for m in layout.RANKING_METRICS},
        }
        for r in records
        if any(m in r.metrics for m in layout.RANKING_METRICS)
    ]
    return pd.DataFrame(rows) if rows else None


def ranking_pairs(client: MlflowClient, run_id: str) -> list:
    """The (one-shot, stand-alone) pairs a ranking diagnostic recorded in ``run_id``."""
    text = read_artifact(client, run_id, layout.RANKING_PAIRS_ARTIFACT)
    return json.loads(text)["pairs"] if text else []

"""Op sets: runs that searched different operations do not compare like for like.

A genotype found among four ops and one found among eight (or among a plugin's
ops) differ by what they could choose, not only by what the search chose; the
comparison says so instead of ranking them silently side by side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .select import RunRecord

OPS_PARAM = "space.primitives"  # the flattened config key of the op set


def op_set(record: RunRecord) -> tuple[str, ...] | None:
    """The ops a run searched (its recorded ``space.primitives``), None if unrecorded."""
    raw = record.params.get(OPS_PARAM)
    if raw is None:
        return None
    try:
        ops = json.loads(raw)
    except ValueError:
        return None
    return tuple(ops) if isinstance(ops, list) else None


def op_sets(records: Sequence[RunRecord]) -> dict[tuple[str, ...], list[str]]:
    """Each op set searched -> the names of the runs that searched it."""
    out: dict[tuple[str, ...], list[str]] = {}
    for r in records:
        ops = op_set(r)
        if ops is not None:
            out.setdefault(ops, []).append(r.run_name or r.run_id[:8])
    return out


def op_set_warning(records: Sequence[RunRecord]) -> str:
    """One sentence when the runs searched different op sets ('' otherwise): the terminal,
    the HTML report and ``asolab.runs`` say the same."""
    sets = op_sets(records)
    if len(sets) < 2:
        return ""
    common = set.intersection(*(set(s) for s in sets))
    parts = [
        f"{', '.join(runs)} searched [{', '.join(o for o in ops if o not in common) or '-'}]"
        for ops, runs in sets.items()
    ]
    return (
        f"The compared runs searched {len(sets)} different op sets (space.primitives), so "
        f"their genotypes differ by what they could choose too; besides the shared "
        f"[{', '.join(sorted(common)) or '-'}]: " + "; ".join(parts) + "."
    )

"""Data notes: the compared runs whose splits say less than their figures suggest.

A run records what its data did not say (``asolab.data_note.*`` tags): a split that
lacks a class (a random carve of an imbalanced set), test or validation images that
are copies of training images. Such a run's validation or test accuracy is not
measured as the others' may be, so the terminal and the HTML report name the runs
under the table, by note, pointing to each run's description for the whole note.
Layout and resize notes say how images were read, not what a figure measures, and
are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..data.core import NOTE_COPIES, NOTE_MISSING
from ..data.load import SPLIT_TITLES
from ..tracking.layout import TAG_DATA_NOTE
from .select import RunRecord

SHOWN_RUNS = 4  # runs named per note; the rest are counted
# each note's key -> its few words in the sentence, in the sentence's order: what
# selection reads first, then what is reported
NOTES = {
    **{
        NOTE_MISSING + split: f"the {SPLIT_TITLES[split]} lacks classes"
        for split in ("validation", "test", "search", "training")
    },
    **{
        NOTE_COPIES + split: f"{split} images are copies of training images"
        for split in ("validation", "test")
    },
}


def data_warning(records: Sequence[RunRecord]) -> str:
    """One sentence naming, per data note, the runs that recorded it ('' when none)."""
    runs: dict[str, list[str]] = {}
    for key, what in NOTES.items():
        for r in records:
            if TAG_DATA_NOTE + key in r.tags:
                runs.setdefault(what, []).append(r.run_name or r.run_id)
    if not runs:
        return ""
    parts = []
    for what, names in runs.items():
        who = "every run" if len(names) == len(records) > 1 else ", ".join(names[:SHOWN_RUNS])
        if len(names) > SHOWN_RUNS and len(names) < len(records):
            who += f" and {len(names) - SHOWN_RUNS} more"
        parts.append(f"{what}: {who}")
    sentence = "; ".join(parts) + " (each run's description says which and how many)."
    return sentence[0].upper() + sentence[1:]

"""Settings: what else differs between the compared runs' recorded configs.

The runs table shows the knobs a study tunes and the training budget. Runs made
with another setting besides those (``data.drop_last``, a learning rate, the
device, a plugin's option) would otherwise sit side by side with nothing to say
that they were not made alike; the terminal and the HTML report name each such
setting and its values.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..tracking.layout import PARAM_FINAL_EPOCHS_FITTED, TRIAL_PARAM_PREFIX
from .opsets import OPS_PARAM
from .select import TABLE_PARAMS, RunRecord

SHOWN = 8  # settings named in the sentence; the rest are counted
SHOWN_VALUES = 4  # a setting's values named (a study's tuned setting has one per trial)
UNSET = "(unset)"  # a key a run did not record (a run from before the key existed)

# params shown elsewhere: a column of the runs table (the experiment's name and data set,
# the final epochs trained: layout.final_epochs_trained), or the op-set warning
ELSEWHERE = frozenset(TABLE_PARAMS.values()) | {
    "name",
    "data.name",
    "search.final_epochs",
    PARAM_FINAL_EPOCHS_FITTED,
    OPS_PARAM,
}
# params about where a run was recorded and how many threads it had, not what it did, and
# a study trial's copies of its sampled values (their own config keys are compared)
NOT_METHOD_PREFIXES = ("tracking.", "threads", TRIAL_PARAM_PREFIX)


def setting_differences(records: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Each recorded setting (not shown elsewhere) whose value differs between ``records``
    -> its values (:func:`_in_order`)."""
    keys = sorted({k for r in records for k in r.params})
    out: dict[str, list[str]] = {}
    for key in keys:
        if key in ELSEWHERE or key.startswith(NOT_METHOD_PREFIXES):
            continue
        values = _in_order({r.params.get(key, UNSET) for r in records})
        if len(values) > 1:
            out[key] = values
    return out


def _in_order(values: set[str]) -> list[str]:
    """Numbers by value (0.05 before 0.1 before 10), anything else as text, unset first."""

    def key(v: str) -> tuple[int, float, str]:
        try:
            return (1, float(v), v)
        except ValueError:
            return (0 if v == UNSET else 2, 0.0, v)

    return sorted(values, key=key)


def _values(values: list[str]) -> str:
    """A setting's values as the sentence names them: the first few of many."""
    if len(values) <= SHOWN_VALUES:
        return " | ".join(values)
    return " | ".join(values[: SHOWN_VALUES - 1]) + f" | ... ({len(values)} values)"


def settings_warning(records: Sequence[RunRecord]) -> str:
    """One sentence naming the other settings that differ ('' when none): the terminal and
    the HTML report say the same."""
    differ = setting_differences(records)
    if not differ:
        return ""
    named = [f"{key} {_values(values)}" for key, values in list(differ.items())[:SHOWN]]
    more = f"; and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
    return (
        "Besides the table's knobs and budget, the compared runs differ in "
        + "; ".join(named)
        + more
        + "."
    )

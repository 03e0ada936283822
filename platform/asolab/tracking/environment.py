"""MLflow's environment as asolab runs it, set in one place.

MLflow draws a progress bar per artifact download. asolab's commands show their
own output (a table, one-line errors), and a notebook cell would fill with bars,
so downloads run with the bars off, unless the user has set the variable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """MLflow's artifact progress bars off inside the block (a setting the user made in
    the environment wins), and the environment back as it was after it."""
    before = os.environ.get(PROGRESS_BAR)
    os.environ.setdefault(PROGRESS_BAR, "false")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PROGRESS_BAR, None)

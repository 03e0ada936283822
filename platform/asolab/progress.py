"""Terminal feedback for the CLI: a progress bar per phase and a summary table.

This is an observer like any other; library code never prints.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

from .evolution.selection import alphas_in_words, undecided_alphas
from .runner import events as ev
from .runner.gpubusy import advice, in_words
from .runner.pace import Pace
from .runner.phases import FINAL, PHASE_TITLES, PHASES


def attached() -> str:
    """Who would see progress: "notebook" (a Jupyter kernel), "terminal" (stderr is
    one), or "" (a script whose output goes to a file or a pipe)."""
    ipython = sys.modules.get("IPython")
    if ipython is not None:
        try:
            shell = ipython.get_ipython()
        except Exception:  # an IPython too old or half imported: not a notebook
            shell = None
        if type(shell).__name__ == "ZMQInteractiveShell":
            return "notebook"
    try:
        return "terminal" if sys.stderr.isatty() else ""
    except (AttributeError, ValueError):  # a replaced or closed stream
        return ""


class ProgressObserver(ev.Observer):
    """One tqdm bar per phase (epochs as units), a line per mutation and cycle.

    ``notebook``: tqdm.auto's bars (widgets in Jupyter); ``summary``: the summary
    table at the run's end (the CLI prints its own, with where the run is recorded).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        enabled: bool = True,
        *,
        notebook: bool = False,
        summary: bool = False,
    ) -> None:
        # sys.stderr as it is now, not as it was at import: a redirected or replaced stream
        # (pytest's capture, a notebook) may have been closed since.
        self.stream = _Guarded(stream if stream is not None else sys.stderr)
        self.enabled = enabled
        self.summary = summary
        self.pace = Pace()  # an epoch far slower than the run's others is said
        self.end: ev.RunEnd | None = None
        self._bars = tqdm
        if notebook:
            from tqdm.auto import tqdm as auto

            self._bars = auto
        self.bar: tqdm | None = None
        self.key: tuple[int, str] | None = None
        self.epochs: dict[str, int] = {}
        self.phase_seconds: list[float] = []  # the current bar's epochs, for what is left
        self.postfix: dict[str, str] = {}

    def _write(self, text: str) -> None:
        if self.enabled:
            tqdm.write(text, file=self.stream)

    def on_run_start(self, event: ev.RunStart) -> None:
        s = event.config.search
        self.epochs = {p.name: p.epochs(s) for p in PHASES}
        self.epochs[FINAL] = event.final_epochs or s.final_epochs
        self.first = {p.name: p.epochs(s, cycle=0) for p in PHASES}  # the warm-up's share
        d = event.data
        where = f" ({self._resumed(event.resumed_from)})" if event.resumed_from else ""
        # "digits", not "digits on digits", where the experiment is named after its data
        on = "" if event.config.name == d["name"] else f" on {d['name']}"
        cycles = f"{s.cycles} cycle{'s' if s.cycles != 1 else ''}"
        info = event.device_info
        # which GPU, as the machine numbers it: a worker's cuda:0 may be the machine's GPU 3
        gpu = f" ({info['gpu_name']}, GPU {info['gpu_index']})" if "gpu_name" in info else ""
        self._write(
            f"asolab: {event.config.name}{on} ({d['train']} train / {d['val']} val / "
            f"{d['test']} test), device {event.device}{gpu}, {cycles}{where}"
        )
        for note in d.get("notes", {}).values():  # a layout told from the shape, a resize
            self._write(f"  data: {note}")

    @staticmethod
    def _resumed(position: dict) -> str:
        if position.get("next") == FINAL and position.get("stage_epoch"):
            return f"resumed in the final stage at epoch {position['stage_epoch'] + 1}"
        return f"resumed at cycle {position['cycle']}"

    def on_epoch_end(self, event: ev.EpochEnd) -> None:
        key = (event.cycle, event.phase)
        if key != self.key:
            self._close()
            self.key = key
            label = PHASE_TITLES[event.phase] + (
                "" if event.phase == FINAL else f" {event.cycle + 1}"
            )
            total = (self.first if event.cycle == 0 else self.epochs).get(
                event.phase, self.epochs[event.phase]
            )
            # A run resumed inside the final stage starts its bar at the epoch it resumed at.
            # The bar appears after the phase's first epoch, so tqdm's own clock would miss
            # that epoch (and show a rate of many epochs per second): the time and what is
            # left come from the epochs' own seconds instead.
            self.bar = self._bars(
                total=total,
                initial=event.epoch,
                desc=label,
                unit="ep",
                file=self.stream,
                leave=False,
                disable=not self.enabled,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}",
            )
            self.phase_seconds = []
        assert self.bar is not None
        slow = self.pace.check(event)
        if slow:
            self._write(slow)
        self.phase_seconds.append(event.seconds)
        self.postfix = {
            "val_acc": f"{event.val_acc:.3f}",
            "tau": f"{event.temperature:.2f}",
            "img_s": f"{event.images_per_sec:.0f}",
            "epoch": tqdm.format_interval(event.seconds),
        }
        if event.gpu_busy is not None:
            self.postfix["gpu"] = f"{event.gpu_busy:.0f}%"
        self._show_left(counting=1, refresh=False)  # never shown beside the old count
        self.bar.update(1)
        self.bar.refresh()  # tqdm skips an update within 0.1 s of its last print

    def _show_left(self, counting: int = 0, refresh: bool = True) -> None:
        """The bar's postfix with the time the phase's remaining epochs will take
        (``counting``: epochs done but not counted on the bar yet)."""
        assert self.bar is not None
        mean = sum(self.phase_seconds) / max(1, len(self.phase_seconds))
        left = max(0, (self.bar.total or 0) - self.bar.n - counting) * mean
        self.bar.set_postfix(self.postfix, left=tqdm.format_interval(left), refresh=refresh)

    def on_mutation(self, event: ev.MutationEvent) -> None:
        self._close()
        self._write(
            f"cycle {event.cycle + 1}: mutation (s={event.strength}, tau={event.temperature:.2f}): "
            + "; ".join(map(str, event.edits))
        )

    def on_growth(self, event: ev.GrowthEvent) -> None:
        self._write(
            f"cycle {event.cycle + 1}: growth {event.kind} at {event.where}: params "
            f"{event.params_before} -> {event.params_after}, max|dlogits| "
            f"{event.preservation_error:.2e}, val_acc {event.val_acc_before:.4f} -> "
            f"{event.val_acc_after:.4f}"
        )

    def on_cycle_end(self, event: ev.CycleEnd) -> None:
        self._close()
        self._write(
            f"cycle {event.cycle + 1}: val_acc {event.val_acc:.4f}, derived params "
            f"{event.derived_params}, rss {event.memory['rss_mb']:.0f} MB  genotype "
            f"{event.genotype}"
        )

    def on_final_plan(self, event: ev.FinalPlan) -> None:
        self.epochs[FINAL] = event.epochs
        if self.bar is not None and self.key is not None and self.key[1] == FINAL:
            self.bar.total = event.epochs
            self._show_left()
        self._write(
            f"final stage: {event.epochs} of at most {event.most} epochs fit the "
            f"{event.budget_minutes:g}-minute budget ({event.seconds_per_epoch:.0f} s per epoch, "
            f"{max(0.0, event.minutes_left):.1f} min left after the first)"
        )

    def on_run_end(self, event: ev.RunEnd) -> None:
        self._close()
        self.end = event
        if self.summary:
            self._write(summary_table(event))

    def say(self, text: str) -> None:
        """A line beside the bars (nothing when disabled)."""
        self._write(text)

    def on_run_interrupted(self, event: ev.RunInterrupted) -> None:
        shown = self.bar is not None and self.enabled
        self._close()
        if shown:  # end the bar's line (and a terminal's ^C): what follows starts on its own
            self.stream.write("\n")
            self.stream.flush()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            self.key = None


class _Guarded:
    """A terminal stream that falls silent, instead of failing, once it is gone: the reader
    of ``asolab run 2>&1 | tee log`` dies with the same Ctrl-C, and a progress bar that
    raised BrokenPipeError would stop the run's own cleanup (its KILLED state, its last
    checkpoint)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.gone = True
        return 0

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                self.gone = True

    def __getattr__(self, name: str):  # isatty, encoding, fileno: as the stream has them
        return getattr(self.stream, name)


def summary_table(end: ev.RunEnd, extra: dict[str, object] | None = None) -> str:
    """The final summary as an aligned two-column table. Lines under it say what would
    help where the alphas trained but ended near uniform, and where a GPU sat mostly
    idle."""
    alphas = alphas_in_words(end.alpha_entropy, end.alpha_steps)
    rows = {
        "final genotype": str(end.genotype),
        "derived network parameters": f"{end.derived_params:,}",
        "supernet parameters": f"{end.supernet_params:,}",
        "validation accuracy": f"{end.val_acc:.4f}",
        "test accuracy": f"{end.test_acc:.4f}",
        "peak RSS (MB)": f"{end.memory['peak_rss_mb']:.0f}",
        "wall time (s)": f"{end.seconds:.1f}",
        # where the alphas trained: how far they moved
        **({"alphas": alphas} if end.alpha_steps else {}),
        **({"GPU busy (training loops)": in_words(end.gpu_busy)} if end.gpu_busy else {}),
        # speed.deterministic, and ops that had no deterministic kernel
        **({"not deterministic": ", ".join(end.nondeterministic)} if end.nondeterministic else {}),
        **(extra or {}),
    }
    width = max(len(k) for k in rows)
    # Left-aligned values: the genotype string is far longer than the numbers.
    lines = [f"{key:<{width}}  {value}" for key, value in rows.items()]
    below = [undecided_alphas(end.alpha_entropy, end.alpha_steps), advice(end.gpu_busy)]
    return "\n".join(lines + [line for line in below if line])

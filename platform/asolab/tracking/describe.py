"""What the tracker writes about a run besides its metrics: the code's git
commit, the thread-count tag, the run's Markdown description, and the JSON
records of genotypes and mutation edits."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from typing import Any

from ..config import PROJECT_ROOT, ExperimentConfig
from ..evolution.selection import alphas_in_words
from ..runner.events import RunEnd, RunStart
from ..runner.gpubusy import ALL, in_words
from ..runner.phases import PHASES
from ..space.genotype import Genotype
from . import layout as L
from .browse import run_description


def git_commit() -> str:
    """The code's git commit, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def threads_text(event: RunStart) -> str:
    """The ``asolab.threads`` tag: the count and how it was chosen, e.g. ``2 (auto)``."""
    return f"{event.config.threads} ({event.threads_source})"


def describe_run(
    event: RunEnd,
    run_id: str,
    cfg: ExperimentConfig | None,
    dataset: str,
    fitted_epochs: int,
    data_notes: dict[str, str] | None = None,
) -> str:
    """The run's Markdown description (MLflow's run note): what a researcher reads first.
    ``data_notes``: what the data did not say (a layout told from the shape, a resize, a
    split without a class, copies of training images), a line each after the data set."""
    # What the UI shows before "Show more": accuracies, size, memory, time (then the picture).
    # Short words: the line shares its 100 px with the genotype and the cells' strip.
    head: dict[str, Any] = {
        "val acc": event.val_acc,
        "test acc": event.test_acc,
        "params": event.derived_params,
    }
    peak = event.memory.get(L.CUDA_PEAK_MB) or event.memory.get(L.PEAK_RSS_MB)
    if peak:
        head["peak memory"] = f"{float(peak):,.0f} MB"
    head["wall time"] = f"{float(event.seconds):,.1f} s"
    facts: dict[str, Any] = {"data set": dataset}
    # the tags hold them too, but the UI cuts a tag's value to a few words
    facts.update({f"data note ({key})": note for key, note in (data_notes or {}).items()})
    params: dict[str, Any] = {}
    if cfg is not None:
        s, t = cfg.search, cfg.temperature
        final = f"{s.final_epochs} final epoch{'s' if s.final_epochs != 1 else ''}"
        if fitted_epochs:
            final = (
                f"{fitted_epochs} final epoch{'s' if fitted_epochs != 1 else ''} (of at most "
                f"{s.final_epochs}, fitted to {s.budget_minutes:g} minutes)"
            )
        cycle = " + ".join(f"{p.epochs(s)} {p.short}" for p in PHASES if p.epochs_field)
        cycles = f"{s.cycles} cycle{'s' if s.cycles != 1 else ''}"
        facts["budget"] = f"{cycles} x ({cycle} epochs), {final}"
        params = {
            "temperature": f"{t.initial_temperature:g} -> {t.min_temperature:g} ({t.schedule}, "
            f"anneal {t.anneal_fraction:g})",
            "mutation strength": f"{cfg.mutation.strength:g}",
            "seed": cfg.seed,
        }
    if event.alpha_steps:
        facts["alphas"] = alphas_in_words(event.alpha_entropy, event.alpha_steps)
    if ALL in event.gpu_busy:
        facts["GPU busy in training"] = in_words(event.gpu_busy)
    return run_description(run_id, head, str(event.genotype), {**facts, **params})


def genotype_record(g: Genotype, primitives: tuple[str, ...] = ()) -> str:
    """A genotype artifact: the canonical one-line form first, then the fields
    ``Genotype.from_json`` reads (it ignores ``canonical`` and the op set searched,
    ``primitives``), one line per field."""
    fields = {L.GENOTYPE_CANONICAL_KEY: str(g), **g.to_dict()}
    if primitives:
        fields[L.GENOTYPE_OPS_KEY] = list(primitives)
    return (
        "{\n"
        + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items())
        + "\n}\n"
    )


def edit_record(edit: Any) -> dict[str, Any]:
    if hasattr(edit, "__dataclass_fields__"):
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(edit).items()}
    else:
        out = {}
    out["text"] = str(edit)
    return out

"""The published GPU tables, printed from the JSON reports ``bench/gpu_check.py`` wrote.

    python bench/gpu_figures.py bench/results/gpu_h100_2026-11-26

Reads every ``*.json`` report in the folder (a check run in several groups with
``--skip`` writes one report per group; a section that ran in none is left out) and
prints the Markdown rows bench/README.md's "On a GPU" section quotes: one row per
run, a setting's variants included (images/s per phase, GPU busy during W-training,
peak CUDA memory), the layout and precision variants, each growth kind's first step
against the steady ones, the study and the placement tests. Nothing is measured
here; ``tests/test_bench_results.py`` checks that the README quotes these lines as
printed, so the tables reproduce from the repository.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RUNS = ("digits", "fashion", "cifar_shape")
PHASES = ("w_train", "alpha", "retrain", "final")
VARIANTS = {"eager": "eager fp32", "bf16": "bf16 autocast", "channels_last": "channels-last"}


def load(folder: Path) -> tuple[dict, dict]:
    """The first report's header (device, torch, date) and every section that ran, by name."""
    reports = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    if not reports:
        raise SystemExit(f"gpu_figures: no *.json report in {folder}")
    sections: dict[str, dict] = {}
    for report in reports:
        for name, section in report["sections"].items():
            if section.get("status") != "skipped":
                sections[name] = section
    return reports[0], sections


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _ratio(value: float) -> str:
    return f"{value:.0f}x" if value >= 10 else f"{value:.1f}x"


def _busy(figures: dict | str) -> str:
    """GPU busy in W-training: mean (max), and the mean after the first epoch where the
    report has it (older reports do not)."""
    if not isinstance(figures, dict):
        return str(figures)
    cell = f"{figures['util_mean_pct']:.1f}% ({figures['util_max_pct']:.0f}%)"
    steady = figures.get("util_mean_pct_after_first_epoch")
    return cell if steady is None else f"{cell}; after the first epoch {steady:.1f}%"


def run_names(sections: dict) -> list[str]:
    """The run sections: digits, fashion and the CIFAR-like shape first, then every other
    run the report holds (a setting's variant: ``digits_drop_last``, ``cifar_shape_limit3``
    and so on), in the order they ran."""
    others = [n for n, s in sections.items() if "final_inference_images_per_sec" in s]
    return [n for n in RUNS if n in sections] + [n for n in others if n not in RUNS]


def run_rows(sections: dict) -> list[str]:
    lines = [
        "| run | W-train img/s | alpha img/s | retrain img/s | final img/s | final inference img/s "
        "| GPU busy in W-training, mean (max) | peak CUDA memory | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in run_names(sections):
        s = sections[name]
        if s.get("status") != "ok":
            continue
        ips = s["images_per_sec"]
        busy = _busy(s["gpu_during_w_train"])
        own = s.get("run_gpu_busy", {}).get("w_train")  # the run's own figure (NVML), if any
        busy += "" if own is None else f"; the run's own {own:.1f}%"
        memory = s.get("peak_cuda_memory_mib")
        cells = [name, *(_n(ips[p]) if p in ips else "-" for p in PHASES)]
        cells += [_n(s["final_inference_images_per_sec"]), busy]
        cells += [f"{memory:,.0f} MiB" if memory is not None else "-", f"{s['seconds']:.1f} s"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def loop_rows(sections: dict) -> list[str]:
    """Where each run's seconds went: its training loops per phase and the rest (data,
    evaluation, tracking, start-up), with its test accuracy; none for reports older than
    the loops' figures (2026-11-26)."""
    runs = [n for n in run_names(sections) if "loop_seconds" in sections[n]]
    if not runs:
        return []
    lines = [
        "| run | s | outside loops | W loop | alpha loop | retrain loop | final loop | test |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in runs:
        s = sections[name]
        loops = s["loop_seconds"]
        cells = [name, f"{s['seconds']:.1f}", f"{s['seconds'] - sum(loops.values()):.1f}"]
        cells += [f"{loops[p]:.1f}" if p in loops else "-" for p in PHASES]
        cells.append(f"{100 * s['test_acc']:.1f}%" if "test_acc" in s else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def variant_rows(sections: dict) -> list[str]:
    s = sections.get("variants")
    if not s or s.get("status") != "ok":
        return []
    eager = s["eager"]["images_per_sec"]
    lines = ["| variant | W-train img/s | vs eager |", "|---|---|---|"]
    for key, label in VARIANTS.items():
        if key in s:
            ips = s[key]["images_per_sec"]
            lines.append(f"| {label} | {_n(ips)} | {ips / eager:.2f}x |")
    return lines


def growth_rows(sections: dict) -> list[str]:
    s = sections.get("growth")
    if not s or s.get("status") != "ok":
        return []
    lines = [
        "| growth | where | max abs delta logits | first step | steady step | first / steady |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("widen", "deepen", "branch"):
        g = s[kind]
        first, steady = g["first_step_s"], g["steady_step_s"]
        lines.append(
            f"| {kind} | {g['where']} | {g['max_abs_delta_logits']:.1e} | {first:.3f} s "
            f"| {steady * 1000:.1f} ms | {_ratio(first / steady)} |"
        )
    return lines


def other_lines(sections: dict) -> list[str]:
    lines = []
    study = sections.get("study")
    if study and study.get("status") == "ok":
        lines.append(
            f"study: {study['trial_runs']} trial runs on 2 workers in {study['seconds']:.1f} s, "
            f"devices {', '.join(study['devices'])}"
        )
    tests = sections.get("device_tests")
    if tests:
        # a failed section keeps pytest's last line after gpu_check's own prefix
        summary = tests.get("summary") or tests.get("error", "").splitlines()[0]
        summary = summary.removeprefix("device tests failed: ")
        lines.append(f"device_tests: {tests['status']}: {summary}")
    return lines


def figures(folder: Path) -> list[str]:
    """Every line the README quotes, in the order it quotes them."""
    head, sections = load(folder)
    info = head.get("device_info") or {}
    machine = f"{info.get('gpu_name', head['device'])}, torch {head['torch']}, {head['when']}"
    return [
        f"machine: {machine}",
        *run_rows(sections),
        *loop_rows(sections),
        *variant_rows(sections),
        *growth_rows(sections),
        *other_lines(sections),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a folder of gpu_check JSON reports")
    args = p.parse_args(argv)
    for line in figures(args.folder):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

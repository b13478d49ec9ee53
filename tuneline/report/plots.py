"""Training curves as PNG, raw and smoothed (LLaMA-Factory's sigmoid-weighted moving average)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Every key tuneline knows how to plot, in plotting order; a log holding none of one key skips it.
PLOT_KEYS = ("loss", "eval_loss", "accuracy", "eval_accuracy", "rewards/accuracies", "rewards/chosen", "reward")

# The curves worth looking at per stage (what `plot` asks for).
STAGE_PLOT_KEYS: dict[str, tuple[str, ...]] = {
    "pt": ("loss", "eval_loss"),
    "sft": ("loss", "eval_loss", "accuracy", "eval_accuracy"),
    "rm": ("loss", "eval_loss", "accuracy", "eval_accuracy"),
    "dpo": ("loss", "eval_loss", "rewards/accuracies", "rewards/chosen"),
    "kto": ("loss", "eval_loss", "rewards/chosen"),
    "ppo": ("loss", "reward"),
    "grpo": ("loss", "reward"),
    "rloo": ("loss", "reward"),
}

RAW_ALPHA = 0.4
COLOR = "#1f77b4"


def smoothing_weight(length: int) -> float:
    """EMA weight for a series of `length` points: 1.8 * (sigmoid(0.05 * length) - 0.5), in [0, 0.9)."""
    return 1.8 * (1.0 / (1.0 + math.exp(-0.05 * length)) - 0.5)


def smooth(values: Sequence[float]) -> list[float]:
    """EMA of the series, seeded with its first value."""
    if not values:
        return []
    weight = smoothing_weight(len(values))
    out, previous = [], values[0]
    for value in values:
        previous = weight * previous + (1.0 - weight) * value
        out.append(previous)
    return out


def read_trainer_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Entries of trainer_log.jsonl; a torn last line (a run killed mid-write) or a blank line is skipped."""
    entries = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def metric_series(entries: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the entries that hold a finite number for `key`."""
    steps, values = [], []
    for entry in entries:
        value, step = entry.get(key), entry.get("current_steps", entry.get("step"))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if isinstance(step, (int, float)):
            steps.append(step)
            values.append(float(value))
    return steps, values


def plot_curves(trainer_log_path: str | os.PathLike, out_dir: str | os.PathLike,
                keys: Sequence[str] | None = None) -> list[str]:
    """One PNG per key present in the log (training_<key>.png, '/' as '_'); returns their paths."""
    entries = read_trainer_log(trainer_log_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key in keys or PLOT_KEYS:
        steps, values = metric_series(entries, key)
        if not values:
            continue
        path = out_dir / f"training_{key.replace('/', '_')}.png"
        _save_curve(steps, values, key, Path(trainer_log_path).parent.name, path)
        written.append(str(path))
    return written


def _save_curve(steps: list[float], values: list[float], key: str, run: str, path: Path) -> None:
    """Draw raw (faint) and smoothed curves; write to a temporary name, then rename."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure()
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(111)
    axes.plot(steps, values, color=COLOR, alpha=RAW_ALPHA, label="original")
    axes.plot(steps, smooth(values), color=COLOR, label="smoothed")
    axes.set_title(f"training {key} of {run}" if run else f"training {key}")
    axes.set_xlabel("step")
    axes.set_ylabel(key)
    axes.legend()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    figure.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, path)

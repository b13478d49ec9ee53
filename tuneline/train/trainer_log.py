"""trainer_log.jsonl: the training's own record of every logged step (LLaMA-Factory's keys plus every numeric
metric), written by it and followed by the flow for progress and plots."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

PROGRESS_KEYS = frozenset({"current_steps", "total_steps", "percentage", "elapsed_time", "remaining_time",
                           "total_tokens", "throughput", "timestamp", "peak_gpu_memory_mb"})
_RENAMED = {"learning_rate": "lr"}  # LLaMA-Factory's name in the log
_ORIGINAL = {short: name for name, short in _RENAMED.items()}


def finite_numbers(values: dict[str, Any]) -> dict[str, float]:
    """The entries that are finite numbers (not bools), as floats: what a log line and MLflow take."""
    return {key: float(value) for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


def log_record(progress: dict[str, Any], metrics: dict[str, float]) -> dict[str, Any]:
    """The line for one log event: the progress fields, then the metrics (renamed as LLaMA-Factory's log)."""
    return {**progress, **{_RENAMED.get(key, key): value for key, value in metrics.items()}}


def logged_metrics(entry: dict[str, Any]) -> dict[str, float]:
    """The metrics of one line, under the names the trainer logged them with."""
    return finite_numbers({_ORIGINAL.get(key, key): value for key, value in entry.items() if key not in PROGRESS_KEYS})


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every whole line of the log (one cut short by a kill is left out)."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def truncate_log(path: Path, last_step: int) -> None:
    """Keep only records up to last_step: after a resume, later steps are logged again, once.

    The kept lines go to a new file renamed over the old one, so a reader following the old file sees another inode
    and starts again from its beginning."""
    if path.is_file():
        _replace(path, [json.dumps(entry) for entry in read_log(path) if entry.get("current_steps", 0) <= last_step])


def rebuild_log(path: Path, log_history: list[dict[str, Any]]) -> None:
    """Write trainer_log.jsonl from a checkpoint's log history, for a resume from a checkpoint fetched from MLflow into
    an empty output_dir; the history has no times, so those lines carry none."""
    if path.exists():
        return
    lines = []
    for logged in log_history:
        step = logged.get("step")
        metrics = finite_numbers({key: value for key, value in logged.items() if key != "step"})
        if isinstance(step, int) and metrics:
            lines.append(json.dumps(log_record({"current_steps": step}, metrics)))
    _replace(path, lines)


def _replace(path: Path, lines: list[str]) -> None:
    """The file holds `lines` as a whole (a new file renamed over it): a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)


"""The training's progress bar in the terminal that runs `tuneline train`, drawn from trainer_log.jsonl.

The child's own bar cannot reach the terminal (its output is read line by line into the step's log). Only on a
terminal: a served worker, a CI log or a pipe gets the log lines alone."""

from __future__ import annotations

import shutil
import sys
from typing import Any, TextIO

BAR_FORMAT = "training {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{desc}]"


class TerminalProgress:
    """`progress(entry)` for each trainer_log entry moves the bar; `close()` leaves it at its last state."""

    def __init__(self, stream: TextIO):
        self.stream, self.bar = stream, None

    def __call__(self, entry: dict[str, Any]) -> None:
        step, total = entry.get("current_steps"), entry.get("total_steps")
        if not isinstance(step, int) or not isinstance(total, int) or total <= 0:
            return
        from tqdm import tqdm

        if self.bar is None:  # a terminal that reports no size (0 x 0) gets one, or tqdm would hide the bar
            size = shutil.get_terminal_size()
            self.bar = tqdm(total=total, file=self.stream, bar_format=BAR_FORMAT, ncols=min(size.columns or 100, 160),
                            nrows=size.lines or 24, leave=True)
        self.bar.total = total
        self.bar.n = min(step, total)
        shown = [f"{label} {tqdm.format_interval(entry[key])}" for label, key in
                 (("elapsed", "elapsed_time"), ("ETA", "remaining_time")) if isinstance(entry.get(key), (int, float))]
        shown += [f"loss {entry['loss']:.4g}"] if isinstance(entry.get("loss"), (int, float)) else []
        self.bar.set_description_str(", ".join(shown), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def terminal_progress(stream: TextIO | None = None) -> TerminalProgress | None:
    """A bar on `stream` (stderr) when it is a terminal, else None."""
    stream = stream or sys.stderr
    return TerminalProgress(stream) if stream.isatty() else None

"""The flow's side of the child's trainer_log.jsonl: follow it while training runs, for progress and MLflow.

The flow's process sends the child's step metrics to the MLflow run (`MetricsSender`) rather than the child: it
has MLflow loaded and its store open already, where the child would import them (~1.3 s of CPU, taken from its
first training steps on a CPU machine). The file is the hand-over, and it stays on disk: whatever a killed
process had not sent yet is sent by the next start, which reads the file again from the top.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneline.train.trainer_log import METRICS_SPOOL_DIR, logged_metrics

INTERVAL_S = 5.0


class TrainerLogReader:
    """Follows trainer_log.jsonl as the child appends to it: the entries new since the last call.

    `due()` hands them on at most every `interval_s`: each hand-over is an API call (a Prefect artifact update, a
    database write on its server) and an MLflow request, taking CPU from training; one per logging step cost ~1% of
    a CPU run. A file replaced by another (a resumed child keeps only the lines up to its checkpoint, renamed over
    the old file) is read again from its start. With `skip_existing`, the file found at the start is passed over
    until it is replaced: a resuming child's first act is to cut it back to its checkpoint, and lines beyond
    that (from the start that was killed) describe training that is done again.
    """

    def __init__(self, path: Path, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 skip_existing: bool = False):
        self.path, self.offset = path, 0
        self.interval_s, self.clock = interval_s, clock
        self.reported_at: float | None = None
        self._inode: int | None = None
        self._skipped = self._current_inode() if skip_existing else None

    def _current_inode(self) -> int | None:
        try:
            return self.path.stat().st_ino
        except OSError:
            return None

    def due(self) -> list[dict[str, Any]]:
        """The new entries, if the last hand-over is `interval_s` old and the log grew since; else none."""
        now = self.clock()
        if self.reported_at is not None and now - self.reported_at < self.interval_s:
            return []
        entries = self.new_entries()
        if entries:
            self.reported_at = now
        return entries

    def new_entries(self) -> list[dict[str, Any]]:
        try:
            stat = self.path.stat()
        except OSError:
            return []
        if stat.st_ino == self._skipped:
            return []
        if stat.st_ino != self._inode or stat.st_size < self.offset:  # another file, or cut back in place
            self._inode, self.offset = stat.st_ino, 0
        if stat.st_size == self.offset:
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(complete)
        entries = []
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return entries


class MetricsSender:
    """The metrics of trainer_log.jsonl entries, sent to an MLflow run with the trainer's global step as step.

    From a worker thread (the caller never waits on MLflow); each step once (steps MLflow holds are dropped, so
    entries read again after a resume cost nothing); kept in output_dir's spool while MLflow is unreachable.
    """

    def __init__(self, run_id: str, tracking_uri: str | None, output_dir: Path):
        from tuneline.tracking import BackgroundStepLogger, StepMetricLogger

        spool = Path(output_dir) / METRICS_SPOOL_DIR
        self._sender = BackgroundStepLogger(lambda: StepMetricLogger(run_id, tracking_uri, spool))

    def send(self, entries: list[dict[str, Any]]) -> None:
        steps = []
        for entry in entries:
            metrics = logged_metrics(entry)
            if metrics and isinstance(entry.get("current_steps"), int):
                logged_at = entry.get("timestamp")
                steps.append((metrics, entry["current_steps"], int(logged_at * 1000) if logged_at else None))
        self._sender.send(steps)

    def close(self) -> int:
        """Wait until everything is sent or spooled; returns how many values wait in the spool (0: all sent)."""
        return self._sender.close()

"""The flow's side of the child's trainer_log.jsonl: follow it while training runs, for the step's progress."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

INTERVAL_S = 5.0


class TrainerLogReader:
    """Follows trainer_log.jsonl as the child appends to it: the entries new since the last call.

    `due()` hands them on at most every `interval_s`, so many steps a second do not each become an API call. A file
    replaced by another (a resumed child cuts it back to its checkpoint) is read again from its start; with
    `skip_existing` the file found at the start is passed over until then, as its later lines get redone."""

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

"""tests/durations.json: what each test cost in the runs that last ran it, and per tier the sum, so a change sees
what it adds to `make test` and `make acceptance` before CI does.

Seconds are a test's setup, call and teardown (setup includes a session fixture's first build), summed as pytest
reports them; a run updates the tests it ran and keeps the others. `last_run` holds the wall time of the latest run
of each whole tier run alone, with the machine's load then: timings on a shared machine mean little without it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

KEY = pytest.StashKey["Recorder"]()
RECORDER: Recorder | None = None  # the controller's, set at session start (xdist reports arrive through its hooks)


class Recorder:
    def __init__(self, started: float):
        self.started = started
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed: set[str] = set()

    def add(self, report) -> None:
        self.seconds[report.nodeid] += report.duration
        if report.failed:
            self.failed.add(report.nodeid)

    def tiers_run(self, tier_of) -> set[str | None]:
        return {tier_of(nodeid) for nodeid in self.seconds}

    def save(self, path: Path, tier_of, workers: int, whole_tier: str | None) -> float:
        """Merge this run into `path` (written to a temporary name, then renamed); the run's wall time."""
        import time

        wall_s = time.monotonic() - self.started
        if not self.seconds:
            return wall_s
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
        root = path.parents[1]
        tests = {nodeid: s for nodeid, s in record.get("tests", {}).items()  # tests moved or deleted since go
                 if (root / nodeid.split("::")[0]).is_file()}
        tests.update({nodeid: round(s, 2) for nodeid, s in self.seconds.items() if nodeid not in self.failed})
        tiers: dict[str, dict[str, float]] = {}
        for nodeid, seconds in tests.items():
            tier = tiers.setdefault(tier_of(nodeid) or "other", {"tests": 0, "sum_s": 0.0})
            tier["tests"] += 1
            tier["sum_s"] = round(tier["sum_s"] + seconds, 1)
        last_run = record.get("last_run", {})
        if whole_tier is not None and not self.failed:
            last_run[whole_tier] = {
                "wall_s": round(wall_s, 1), "tests": len(self.seconds),
                "workers": workers,
                "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}
        out = {"tiers": dict(sorted(tiers.items())), "last_run": dict(sorted(last_run.items())),
               "tests": dict(sorted(tests.items()))}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.rename(path)
        return wall_s

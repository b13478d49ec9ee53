"""While a training runs, the threads that only watch it give way to it for the CPU.

Beside a CPU training, the orchestrating process and Prefect's temporary server take ~0.6% of a 2-core machine
(sending the child's step metrics to MLflow, its output and progress to the orchestrator). At the training's own
priority that share cost the training loop 2-2.5 times itself: its threads wait for each other at every step, so
the one put off holds up the rest. At nice 15 the same load runs in the moments a core would idle and cost the
loop nothing measurable (`benchmarks/orchestration_overhead.py` measures both); 15 rather than 19, so that against
cores kept busy by something else it still gets ~3% of one, enough to keep reading the child's output.

Only while training runs: before, the training's imports and the orchestration's start-up (a temporary server's
boot) are all on the way to its first step, and a server lowered from its start booted up to 3 s later.

Linux keeps a nice value per thread. The calling thread keeps its own: it starts the trainings (a retry's too),
which would inherit it; threads started by a lowered thread inherit the lowered value. Raising a priority again
needs privilege (root, CAP_SYS_NICE): without it the lowered threads stay lowered, which only matters where they
later compete for a busy CPU. Elsewhere than Linux nothing is changed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

WATCHER_NICE = 15
_watchers: set[int] = set()


def add_watcher(pid: int) -> None:
    """A process of ours that serves the run (Prefect's temporary server): it gives way too while training runs."""
    _watchers.add(pid)


def remove_watcher(pid: int) -> None:
    _watchers.discard(pid)


@contextlib.contextmanager
def watchers_give_way() -> Iterator[dict[tuple[int, int], int]]:
    """Within: every other thread of this process, and every thread of the added watchers, runs at nice
    WATCHER_NICE or lower priority; yields the (process, thread) ids lowered with the value each had, set back on
    exit where the system allows."""
    lowered: dict[tuple[int, int], int] = {}
    me = threading.get_native_id()
    for pid in (os.getpid(), *sorted(_watchers)):
        for tid in _threads(pid):
            if tid == me:
                continue
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                before = os.getpriority(os.PRIO_PROCESS, tid)
                if before < WATCHER_NICE:
                    os.setpriority(os.PRIO_PROCESS, tid, WATCHER_NICE)
                    lowered[pid, tid] = before
    try:
        yield lowered
    finally:
        for (pid, tid), before in lowered.items():
            if tid in _threads(pid):  # an id that ended may be another process's thread by now: never touch it
                with contextlib.suppress(OSError):  # PermissionError: raising it back needs privilege
                    os.setpriority(os.PRIO_PROCESS, tid, before)


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # not Linux, or the process is gone
        return []

"""While a training runs, the threads that only watch it give way to it for the CPU.

Beside a CPU training, the orchestrating process and Prefect's temporary server take ~0.7% of a 2-core machine
(the child's output and progress to the orchestrator, its step metrics to MLflow, the server's answers). At the
training's own priority such a share cost the training loop 2.1-3.3 times itself (4 times once): its threads wait
for each other at every step, so the one put off holds up the rest. At nice 19 a busy loop of known share cost the
loop a median of ~0.4 times its share (-0.5 to 1.7 in eight measurements), at nice 15 0.8-1.3 times, at nice 10 1.6
times (`benchmarks/orchestration_overhead.py` measures it): a thread at nice 19 runs mostly when a core would
idle. Against cores kept busy by something else it still gets ~1.5% of each, twice what the watchers need.

Only while training runs: before, the training's imports and the orchestration's start-up (a temporary server's
boot) are all on the way to its first step, and a server lowered from its start booted up to 3 s later.

Linux keeps a nice value per thread. The calling thread keeps its own: it starts the trainings (a retry's too),
which would inherit it; it leaves following the training to a thread of its own (`run_as_watcher`). Threads
started by a lowered thread inherit the lowered value. Raising a priority again needs privilege (root with
CAP_SYS_NICE): without it the lowered threads stay lowered, which only matters where they later compete for a
busy CPU. Elsewhere than Linux nothing is changed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

WATCHER_NICE = 19
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
        alive = {pid: set(_threads(pid)) for pid, _ in lowered}
        for (pid, tid), before in lowered.items():
            if tid in alive[pid]:  # an id that ended may be another process's thread by now: never touch it
                with contextlib.suppress(OSError):  # PermissionError: raising it back needs privilege
                    os.setpriority(os.PRIO_PROCESS, tid, before)


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # not Linux, or the process is gone
        return []


def run_as_watcher(work: Callable[[], T], interrupted: Callable[[], object]) -> T:
    """`work()` in a thread of its own at the watchers' nice value, with this thread's context variables (an
    orchestrator's settings and run live there); returns its result or raises its error. If this thread is
    interrupted while it waits (Ctrl-C), `interrupted()` is called first, to end what the work follows."""
    outcome: dict[str, object] = {}
    done = threading.Event()  # not join(): Python 3.11 takes a thread whose join was interrupted for ended

    def run() -> None:
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WATCHER_NICE)  # this thread only
        try:
            outcome["result"] = work()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread, which raises it
            outcome["error"] = error
        finally:
            done.set()

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="tuneline-watcher")
    thread.start()
    try:
        done.wait()
    except BaseException:
        interrupted()
        done.wait()
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]

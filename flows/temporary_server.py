"""The temporary Prefect API server's process: Prefect's own app under uvicorn, kept quiet while training runs.

`flows.api_server` runs it as `python -m flows.temporary_server PORT`. It serves the app, settings and database
Prefect's own temporary server would, with two things left out that cost a CPU run's training without doing
anything for a server that lives for one run:
- docket's background worker. In a temporary server it only runs Prefect's telemetry, the events table's
  vacuum, time-based automation triggers and the clean-up queued when runs are deleted: a lasting
  `prefect server start` on the same database runs them all. Its scheduler, stream reader and cancellation
  listener poll ~20 times a second between them: ~1% of a core while nothing happens.
- uvicorn's ten checks a second for a shutdown: here a signal wakes the loop instead (~0.25% of a core).
Idle, the server took 1.4% of a core with both, 0.2-0.3% without. A CPU training run pays 2-3 times a share of
the CPU it loses (its threads wait for the one that was put off): that was 1-1.5% of the training loop's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from types import FrameType

import uvicorn


class _SignalledServer(uvicorn.Server):
    """uvicorn's server, woken by a shutdown signal instead of looking for one every 0.1 s."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        ticks = 0
        while not await self.on_tick(ticks):  # a multiple of 10 refreshes the Date header, as each 1 s tick should
            ticks = (ticks + 10) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)


@contextlib.asynccontextmanager
async def _no_background_worker(docket: object, **_: object) -> AsyncIterator[None]:
    yield


def serve(port: int) -> None:
    import prefect.server.api.server as prefect_server

    prefect_server.background_worker = _no_background_worker  # read by create_app's lifespan when it starts
    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                            log_level="error", lifespan="on")
    _SignalledServer(config).run()


if __name__ == "__main__":
    serve(int(sys.argv[1]))

"""Prefect's temporary API server, started at the top of a command-line run so it boots while we import.

Without a configured `PREFECT_API_URL`, Prefect starts a temporary server (a uvicorn subprocess) the first
time the flow needs its API: after the parent has imported Prefect, its flows and its server package (~4 s),
and then it waits ~6 s for the server to boot, one after the other. Here a server process (Prefect's app
factory and settings under uvicorn, as `prefect.server.api.server.SubprocessASGIServer` runs them, less the idle
polling `flows.temporary_server` leaves out) starts before those imports, on the second core, and the flow is
pointed at it with `temporary_settings`. A fully cached re-run is then bounded by the server's boot rather than
by boot plus imports.

A configured API (a running `prefect server start`, Prefect Cloud) is used as before, and
`PREFECT_SERVER_EPHEMERAL_ENABLED=false` keeps its meaning. The server stops when the run ends; on Linux it
also dies with the parent if the parent is killed (Prefect's own is left running then).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from tuneline.errors import UserError
from tuneline.pipeline.give_way import add_watcher, remove_watcher
from tuneline.train.launch import die_with_parent

_temporary_url: str | None = None


def is_temporary(api_url: str | None) -> bool:
    """Whether the API stops with this run (none configured, or ours), so a link into its UI would go dead."""
    return api_url is None or api_url == _temporary_url


@contextlib.contextmanager
def prefect_api(warm_up: Callable[[], object] = lambda: None) -> Iterator[str | None]:
    """Within: Prefect uses the configured API, or a temporary server started on entry; yields the API URL.

    `warm_up` runs while the server boots (the imports the run needs anyway). The server is started before
    Prefect itself is imported (~2 s), and stopped again at once if Prefect's settings name an API after all.
    """
    global _temporary_url
    server, url = (None, None) if os.environ.get("PREFECT_API_URL") else _start_server()
    try:
        from prefect.settings import (
            PREFECT_API_URL,
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
            PREFECT_UI_URL,
            get_current_settings,
            temporary_settings,
        )

        settings = get_current_settings()
        if server is None or settings.api.url or not settings.server.ephemeral.enabled:
            _stop(server)
            server = None
            warm_up()
            yield settings.api.url
            return
        print(f"Prefect: temporary API server on {url} (for a lasting one: prefect server start)", file=sys.stderr)
        warm_up()
        _wait_until_healthy(server, url, settings.server.ephemeral.startup_timeout_seconds)
        _temporary_url = url
        add_watcher(server.pid)  # it only serves the run: it gives way to training for the CPU
        # It serves no UI. Nor does it get flow-run heartbeats: they let a lasting server mark a run that died as
        # crashed, which one that stops with the run never can; and each run's end waited up to 1 s on their thread.
        updates = {PREFECT_API_URL: url, PREFECT_UI_URL: "", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
        with temporary_settings(updates=updates):
            try:
                yield url
            finally:
                _send_pending_logs_and_events()
    finally:
        _temporary_url = None
        if server is not None:
            remove_watcher(server.pid)
        _stop(server)


def _start_server() -> tuple[subprocess.Popen, str]:
    """Prefect's server app in a process of its own (`flows.temporary_server`), on a free port of 127.0.0.1."""
    port = _free_port()
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    server = subprocess.Popen([sys.executable, "-m", "flows.temporary_server", str(port)], env=env,
                              preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))  # SIGTERM: closes its db
    return server, f"http://127.0.0.1:{port}/api"


def _stop(server: subprocess.Popen | None) -> None:
    if server is None:
        return
    server.terminate()
    try:
        server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _send_pending_logs_and_events() -> None:
    """Flush Prefect's log and event workers while the server still listens (else exit waits on retries)."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for pending in (APILogWorker.instance().drain(), EventsWorker.drain_all()):
            if inspect.isawaitable(pending):
                await pending

    run_coro_as_sync(drain())


def _wait_until_healthy(server: subprocess.Popen, url: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client() as client:
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    state = f"exited with code {server.returncode}" if server.poll() is not None else f"no answer in {timeout} s"
    raise UserError(f"Prefect's temporary API server at {url} did not start ({state}); start a lasting one with "
                    "`prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api", title="no Prefect API")


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

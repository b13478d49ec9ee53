"""One Prefect API for the whole test run, shared by the test processes (pytest-xdist workers).

Starting a Prefect server costs seconds of CPU and a database; each worker once started its own. Here the first
worker that needs the API starts `prefect server start` under a file lock in the run's folder and writes its URL
there; the others read it. The controller (the `pytest` process) stops it when the run ends. A watchdog process
stands between the server and the run: it stops the server when the controller is gone, so a killed test run
leaves no server behind.

`python -m tests.support.prefect_server CONTROLLER_PID PORT HOME` is that watchdog.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

from tests.support.ports import wait_until_answers

STATE = "prefect-server.json"
STARTUP_S = 180  # a cold start on a loaded 2-core machine (database migrations, services) takes tens of seconds


def api_url(run_dir: Path, controller_pid: int) -> str:
    """The API URL of the run's Prefect server, started now when no test process has started it yet."""
    from tests.support.ports import free_port

    with FileLock(str(run_dir / "prefect-server.lock")):
        state = run_dir / STATE
        if state.is_file():
            return json.loads(state.read_text())["url"]
        home, port = run_dir / "prefect-server-home", free_port()
        home.mkdir(exist_ok=True)
        env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
        env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]))
        with open(run_dir / "prefect-server.log", "wb") as log:
            watchdog = subprocess.Popen([sys.executable, "-m", "tests.support.prefect_server", str(controller_pid),
                                         str(port), str(home)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        url = f"http://127.0.0.1:{port}/api"
        _wait_healthy(url, watchdog, run_dir / "prefect-server.log")
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": watchdog.pid}))
        tmp.rename(state)
        return url


def _wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    wait_until_answers(f"{url}/health", process, log, STARTUP_S, "the test run's Prefect server")


def stop(run_dir: Path) -> None:
    """Stop the run's server (its watchdog's process group), if a test process started one."""
    state = run_dir / STATE
    if not state.is_file():
        return
    pid = json.loads(state.read_text())["pid"]
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):  # reaped here when this process started it
                os.waitpid(pid, os.WNOHANG)
            os.killpg(pid, 0)
            time.sleep(0.2)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _watch(controller_pid: int, port: int, home: str) -> None:
    """Run the server until the controller is gone or this process is told to stop, then stop the server."""
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port), "--no-ui", "--analytics-off"],
                              env={**os.environ, "PREFECT_HOME": home})
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    while not stopping and server.poll() is None:
        try:
            os.kill(controller_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(1)
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

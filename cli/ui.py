"""Both UIs at once: `tuneline ui [--prefect-port 4200] [--mlflow-port 5000]`.

Starts `prefect server start` and `mlflow server` on 127.0.0.1 (MLflow on the project's SQLite store,
./mlflow.db, with new artifacts under ./mlartifacts, where tuneline's own runs put theirs), prints both
addresses and the two settings that send runs to them, and stops both on Ctrl+C. Each server runs in a process
group of its own, so stopping it stops what it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tuneline.errors import UserError
from tuneline.runtime.contract import die_with_parent
from tuneline.tracking.store import MODEL_TRAINING_VIEW

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180


@dataclass
class Server:
    name: str
    url: str  # what a browser opens
    health: str  # answers 200 once the server is up
    process: subprocess.Popen
    log: Path


def _free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


def _start(name: str, cmd: list[str], url: str, health: str, log: Path, env: dict) -> Server:
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    return Server(name, url, health, process, log)


def _wait_healthy(server: Server, deadline: float) -> None:
    while True:
        try:
            urllib.request.urlopen(server.health, timeout=2)
            return
        except OSError:
            if server.process.poll() is not None:
                raise UserError(f"{server.name} exited with code {server.process.returncode}; its log: {server.log}\n"
                                + server.log.read_text(errors="replace")[-2000:], title=f"{server.name} did not start") from None
            if time.monotonic() > deadline:
                raise UserError(f"{server.name} did not answer {server.health} within {START_TIMEOUT_S} s; its log: "
                                f"{server.log}", title=f"{server.name} did not start") from None
            time.sleep(0.5)


def stop(servers: list[Server]) -> None:
    """SIGTERM each server's process group, then SIGKILL what is still there after 20 s."""
    for server in servers:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGTERM)
    for server in servers:
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


def start_servers(root: Path, host: str = "127.0.0.1", prefect_port: int = 4200, mlflow_port: int = 5000,
                  mlflow_store: str | None = None) -> list[Server]:
    """Both servers, answering; the caller stops them (`stop`)."""
    root = root.resolve()
    logs = root / ".tuneline" / "ui"
    logs.mkdir(parents=True, exist_ok=True)
    busy = [f"{host}:{port}" for port in (prefect_port, mlflow_port) if not _free(host, port)]
    if busy:
        raise UserError(f"{' and '.join(busy)} already in use: stop what serves there, or choose other ports "
                        "with --prefect-port / --mlflow-port")
    store = mlflow_store or f"sqlite:///{root / 'mlflow.db'}"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)  # the server serves; it is nobody's client
    env["PREFECT_SERVER_UI_API_URL"] = f"http://{host}:{prefect_port}/api"  # else its UI calls port 4200
    prefect = _start("Prefect server", [str(BIN / "prefect"), "server", "start", "--host", host, "--port",
                                        str(prefect_port)],
                     f"http://{host}:{prefect_port}", f"http://{host}:{prefect_port}/api/health",
                     logs / "prefect.log", env)
    mlflow = _start("MLflow server", [str(BIN / "mlflow"), "server", "--host", host, "--port", str(mlflow_port),
                                      "--backend-store-uri", store, "--artifacts-destination",
                                      str(root / "mlartifacts"), "--workers", "1"],
                    f"http://{host}:{mlflow_port}", f"http://{host}:{mlflow_port}/health", logs / "mlflow.log", env)
    servers = [prefect, mlflow]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in servers:
            _wait_healthy(server, deadline)
    except BaseException:
        stop(servers)
        raise
    return servers


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def serve_uis(root: Path, host: str, prefect_port: int, mlflow_port: int) -> None:
    """Until Ctrl+C (SIGINT, even where a shell started this with it ignored) or SIGTERM; both stop the servers."""
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    servers = start_servers(root, host, prefect_port, mlflow_port)
    prefect, mlflow = servers
    print(f"Prefect UI: {prefect.url}\nMLflow UI:  {mlflow.url}/#/{MODEL_TRAINING_VIEW}\n"
          f"Send runs to them:\n  export PREFECT_API_URL={prefect.url}/api\n"
          f"  export MLFLOW_TRACKING_URI={mlflow.url}\n"
          f"Logs under {root.resolve() / '.tuneline' / 'ui'}. Ctrl+C stops both.", flush=True)
    try:
        while all(s.process.poll() is None for s in servers):
            time.sleep(1)
        gone = next(s for s in servers if s.process.poll() is not None)
        raise UserError(f"{gone.name} exited with code {gone.process.returncode}; its log: {gone.log}",
                        title="a server stopped")
    finally:
        stop(servers)

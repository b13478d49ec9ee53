"""`tuneline api` started as a user starts it (a subprocess on a free port, API_KEY set), for the API tests, and the
OpenAI client pointed at it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port, wait_until_answers

KEY = "sk-test-key"


@contextlib.contextmanager
def api_server(args: list[str], log_path: Path, **env: str):
    """(base URL, log path) of `tuneline api ARGS` once it answers /health; stopped on exit."""
    port = free_port()
    environ = {**os.environ, "API_PORT": str(port), "API_KEY": KEY, **env}
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "api", *args], env=environ, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_up(port, process, log_path)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def wait_until_up(port: int, process, log_path: Path, timeout: float = 180) -> None:
    wait_until_answers(f"http://127.0.0.1:{port}/health", process, log_path, timeout, "tuneline api")


def client(base_url: str, key: str = KEY):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)

"""A free TCP port on 127.0.0.1, for the servers the tests start (Prefect, MLflow, the hub stand-in, a second
training machine, `tuneline api`), and the wait until such a server answers."""

import socket
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_answers(url: str, process, log_path: Path, seconds: float, what: str) -> None:
    """Return once `url` answers; fail with the end of the server's log when its process ends or time runs out."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                state = f"exited {process.returncode}" if process.poll() is not None else f"no answer in {seconds} s"
                raise AssertionError(f"{what} ({url}): {state}\n{Path(log_path).read_text()[-4000:]}") from None
            time.sleep(0.5)

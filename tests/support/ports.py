"""A free TCP port on 127.0.0.1, for the servers the tests start (Prefect, MLflow, the hub stand-in, a second
training machine)."""

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

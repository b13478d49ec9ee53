"""Whether the Ray cluster a config names answers, asked before anything starts and again by the Ray driver.

ray.init retries an absent cluster for minutes before it gives up; a TCP connection to the cluster's address says
the same in a moment, so a wrong or stopped cluster costs the user one line instead of a long wait."""

from __future__ import annotations

import socket

from tuneline.errors import UserError


def unreachable(address: str, why: str) -> UserError:
    return UserError(f"cannot reach the Ray cluster at {address} ({why}): start it (`ray start --head` on its head "
                     "machine) or fix 'ray_address' / RAY_ADDRESS; nothing of the training was recorded as done, so the "
                     "same command continues once Ray answers")


def cluster_problems(config) -> list[str]:
    """Before anything starts: the cluster a config names answers (a local Ray needs no check)."""
    if config.ray is None or config.ray.local:
        return []
    try:
        refuse_unreachable(config.ray.address or config.ray.init_kwargs["address"], timeout_s=5.0)
    except UserError as err:
        return [str(err)]
    return []


def refuse_unreachable(address: str, timeout_s: float = 10.0) -> None:
    """A TCP connection to the cluster's address first: ray.init itself retries an absent cluster for minutes."""
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, _, port = host_port.rpartition(":")
    if address == "auto" or not port.isdigit():
        return  # Ray finds (or names) the cluster itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise unreachable(address, err.strerror or type(err).__name__) from None

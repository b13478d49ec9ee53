"""LLaMA-Factory's torchrun environment (`FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=0 MASTER_ADDR=... llamafactory-cli
train`), read as the machine keys tuneline's launch already has.

LLaMA-Factory reads these variables in its command, when it starts torchrun; tuneline reads them where its command
reads the config, and only with FORCE_TORCHRUN on and outside a launched training process (which torchrun,
accelerate and Ray give a LOCAL_RANK of their own). A key the config sets wins over its variable. The elastic ones
(a rendezvous that machines join and leave, restarted by torchrun) are refused: tuneline's machines are a fixed set,
and restarts from the last checkpoint are what Ray gives (`use_ray`, `ray_max_failures`).
"""

from __future__ import annotations

import os
from typing import Any

SWITCH = "FORCE_TORCHRUN"
AS_KEYS = {"NNODES": "num_machines", "NODE_RANK": "machine_rank", "NPROC_PER_NODE": "num_processes",
           "MASTER_ADDR": "main_process_ip", "MASTER_PORT": "main_process_port"}
ELASTIC = ("RDZV_ID", "MIN_NNODES", "MAX_NNODES", "MAX_RESTARTS")
NUMBERS = ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_PORT")


def torchrun_values(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The keys LLaMA-Factory's torchrun variables stand for (those the config leaves unset), and the problems."""
    if os.environ.get(SWITCH, "").lower() not in ("1", "true", "y", "yes") or "LOCAL_RANK" in os.environ:
        return {}, []
    problems, values = [], {}
    elastic = [name for name in ELASTIC if os.environ.get(name) not in (None, "", "0")]
    if elastic:
        problems.append(f"{', '.join(f'{n}={os.environ[n]}' for n in elastic)}: torchrun's elastic launch (machines "
                        "joining and leaving, restarts) is not how tuneline runs; unset them, and for restarts from "
                        "the last checkpoint train on Ray ('use_ray: true', 'ray_max_failures: N')")
    if os.environ.get("USE_RAY", "").lower() in ("1", "true", "y", "yes") or raw.get("use_ray"):
        problems.append(f"{SWITCH}=1 and Ray both launch the training: unset one of them")
    for name, key in AS_KEYS.items():
        value = os.environ.get(name)
        if value in (None, "") or key in raw:
            continue
        if name in NUMBERS and not value.isdigit():
            problems.append(f"the environment variable {name}={value} (for '{key}') must be a whole number")
            continue
        values[key] = int(value) if name in NUMBERS else value
    if values.get("num_machines", 1) == 1:  # one machine: torchrun's address is its own loopback, nothing to meet
        values = {k: v for k, v in values.items() if k in ("num_processes",)}
    return values, problems

"""LLaMA-Factory's Ray Train keys, refused in one message that says what tuneline runs instead.

LLaMA-Factory hands a training to Ray Train when `USE_RAY=1` (its workers, storage and placement from these keys).
tuneline launches every training with accelerate from a Prefect task, so a Ray worker pool would be a second
launcher beside the one whose checkpoints, resume and MLflow record the flow owns: several GPUs, several machines and
many runs at once each have their way here (docs/machines.md, "Ray")."""

from __future__ import annotations

import os

# LLaMA-Factory 0.9.5's RayArguments, the keys its Ray examples set, and the environment switch that turns Ray on.
RAY_KEYS = ("use_ray", "ray_num_workers", "ray_run_name", "ray_storage_path", "ray_storage_filesystem",
            "resources_per_worker", "placement_strategy", "ray_init_kwargs", "master_addr", "master_port")
RAY_SWITCH = "USE_RAY"

INSTEAD = ("tuneline trains with accelerate, not Ray Train: several GPUs of one machine with 'num_processes' "
           "(one per GPU by default), several machines with 'num_machines' and 'main_process_ip' (each other machine "
           "runs `tuneline train-node CONFIG --machine-rank N`), many runs at once on a Prefect work pool (a worker "
           "per machine, docs/deployments.md); see docs/machines.md, 'Ray'")


def ray_problems(keys: list[str]) -> list[str]:
    """One problem naming every Ray key set (and USE_RAY when it is on), or none."""
    named = [f"'{key}'" for key in keys]
    if os.environ.get(RAY_SWITCH, "").lower() in ("1", "true", "y", "yes"):
        named.append(f"the environment variable {RAY_SWITCH}")
    if not named:
        return []
    return [f"{', '.join(named)} ask for a training on Ray, which tuneline does not run; remove "
            f"{'it' if len(named) == 1 else 'them'}. {INSTEAD}"]

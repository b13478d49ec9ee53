"""Serve the deployments of a prefect.yaml from one process, no work pool: `tuneline serve [PREFECT_YAML]`.

`prefect.yaml` stays the one place deployments are written; `prefect deploy --all` reads the same file when a work
pool and workers are wanted instead. A served run executes the same flow as `tuneline train`, so unchanged inputs
make it all cache hits. Relative config paths are read from the folder this is started in (the repository's).
"""

from __future__ import annotations

from pathlib import Path

import yaml

DEFAULT_PREFECT_YAML = Path("deployments") / "prefect.yaml"


def runner_deployments(prefect_yaml: Path = DEFAULT_PREFECT_YAML) -> list:
    """One RunnerDeployment of the finetune flow per entry of prefect.yaml: parameters, schedules, limit."""
    from prefect.schedules import Cron

    from flows.finetune import finetune

    spec = yaml.safe_load(Path(prefect_yaml).read_text())
    out = []
    for entry in spec["deployments"]:
        schedules = [Cron(s["cron"], timezone=s.get("timezone", "UTC")) for s in entry.get("schedules") or []]
        out.append(finetune.to_deployment(
            name=entry["name"], description=entry.get("description"), tags=entry.get("tags"),
            parameters=entry.get("parameters", {}), schedules=schedules,
            concurrency_limit=entry.get("concurrency_limit"),
        ))
    return out


def serve_deployments(prefect_yaml: Path = DEFAULT_PREFECT_YAML) -> None:
    from prefect import serve

    from flows.concurrency import ensure_gpu_limit

    deployments = runner_deployments(prefect_yaml)
    ensure_gpu_limit()
    serve(*deployments)

"""Retraining that runs itself, without a work pool: serve the schedules of deployments/prefect.yaml.

    python deployments/serve.py            # registers each deployment with its cron and runs them when due

`prefect.yaml` stays the one place schedules are written; `prefect deploy --all` reads the same file when a
work pool and workers are wanted instead. Unchanged inputs make a scheduled run all cache hits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PREFECT_YAML = Path(__file__).with_name("prefect.yaml")


def runner_deployments(prefect_yaml: Path = PREFECT_YAML) -> list:
    """One RunnerDeployment of the finetune flow per entry of prefect.yaml, with its parameters and schedules."""
    sys.path.insert(0, str(REPO))
    from prefect.schedules import Cron

    from flows.finetune import finetune

    spec = yaml.safe_load(prefect_yaml.read_text())
    out = []
    for entry in spec["deployments"]:
        schedules = [Cron(s["cron"], timezone=s.get("timezone", "UTC")) for s in entry.get("schedules", [])]
        out.append(finetune.to_deployment(
            name=entry["name"], description=entry.get("description"), tags=entry.get("tags"),
            parameters=entry.get("parameters", {}), schedules=schedules,
        ))
    return out


def main() -> None:
    from prefect import serve

    serve(*runner_deployments())


if __name__ == "__main__":
    main()

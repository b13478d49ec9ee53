"""Retraining that runs itself, without a work pool: serve the deployments of deployments/prefect.yaml.

    python deployments/serve.py [PREFECT_YAML]     # registers each deployment with its schedules, runs them when due

`prefect.yaml` stays the one place deployments are written; `prefect deploy --all` reads the same file when a work
pool and workers are wanted instead. A served run executes the same flow as `tuneline train`, so unchanged inputs
make it all cache hits. Relative config paths are read from the folder this is started in (the repository's).
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

    spec = yaml.safe_load(Path(prefect_yaml).read_text())
    out = []
    for entry in spec["deployments"]:
        schedules = [Cron(s["cron"], timezone=s.get("timezone", "UTC")) for s in entry.get("schedules") or []]
        out.append(finetune.to_deployment(
            name=entry["name"], description=entry.get("description"), tags=entry.get("tags"),
            parameters=entry.get("parameters", {}), schedules=schedules,
        ))
    return out


def main(argv: list[str]) -> None:
    from prefect import serve

    serve(*runner_deployments(Path(argv[0]) if argv else PREFECT_YAML))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Serve the deployments of a prefect.yaml from one process, no work pool: `tuneline serve [PREFECT_YAML]`.

`prefect.yaml` stays the one place deployments are written; `prefect deploy --all` reads the same file when a work
pool and workers are wanted instead. A served run executes the same flow as `tuneline train`, so unchanged inputs
make it all cache hits. Relative config paths are read from the folder this is started in (the repository's).
"""

from __future__ import annotations

from pathlib import Path
from zoneinfo import ZoneInfo

import yaml

from tuneline.errors import UserError

DEFAULT_PREFECT_YAML = Path("deployments") / "prefect.yaml"


def runner_deployments(prefect_yaml: Path = DEFAULT_PREFECT_YAML) -> list:
    """One RunnerDeployment of the finetune flow per entry of prefect.yaml: parameters, schedules, limit."""
    from flows.finetune import finetune

    spec = yaml.safe_load(Path(prefect_yaml).read_text())
    out = []
    for entry in spec["deployments"]:
        schedules = [_cron(prefect_yaml, entry["name"], s) for s in entry.get("schedules") or []]
        _check_parameters(prefect_yaml, entry)
        out.append(finetune.to_deployment(
            name=entry["name"], description=entry.get("description"), tags=entry.get("tags"),
            parameters=entry.get("parameters", {}), schedules=schedules,
            concurrency_limit=entry.get("concurrency_limit"),
        ))
    return out


def _cron(prefect_yaml: Path, deployment: str, schedule: dict):
    """The schedule, or a message naming the deployment and the cron string Prefect cannot read."""
    from prefect.schedules import Cron

    try:
        ZoneInfo(schedule.get("timezone", "UTC"))
        return Cron(schedule["cron"], timezone=schedule.get("timezone", "UTC"))
    except (ValueError, KeyError) as err:  # ZoneInfoNotFoundError is a KeyError
        raise UserError(f"{prefect_yaml}: deployment '{deployment}' has schedule {schedule}, which Prefect cannot "
                        f"read ({err}); write five fields, e.g. cron: \"0 2 * * *\" (02:00 daily), and an IANA "
                        "timezone such as UTC") from None


def _check_parameters(prefect_yaml: Path, entry: dict) -> None:
    """A deployment whose config would fail is refused when served, not at its first scheduled run."""
    from orchestration.parameters import Settings, all_overrides
    from tuneline.pipeline.preflight import checked_config

    params = entry.get("parameters") or {}
    if "config_path" not in params:
        raise UserError(f"{prefect_yaml}: deployment '{entry['name']}' has no parameters.config_path; name the run "
                        "config it trains")
    settings = Settings(**params["settings"]) if params.get("settings") else None
    try:
        checked_config(params["config_path"], all_overrides(settings, params.get("overrides")))
    except UserError as err:
        raise UserError(err.problems, title=f"{prefect_yaml}: deployment '{entry['name']}'") from None


def serve_deployments(prefect_yaml: Path = DEFAULT_PREFECT_YAML) -> None:
    from prefect import serve

    from orchestration.concurrency import ensure_gpu_limit

    deployments = runner_deployments(prefect_yaml)
    ensure_gpu_limit()
    serve(*deployments)

"""Start a run of a deployment from the command line: `tuneline trigger NAME [key=value ...]`.

    tuneline trigger sft-nightly learning_rate=5e-5 max_steps=20
    tuneline trigger finetune/finetune-on-demand config_path=examples/dpo_lora_demo.yaml

`key=value` pairs become the run's parameters: `config_path` replaces the deployment's config, the keys of the
typed Run form (orchestration.parameters.Settings) fill those fields, any other config key is added to `overrides`. The
config is checked here, so a mistake is reported before a run exists. A served deployment or a worker picks the
run up; this prints its id and its page in the Prefect UI and returns without waiting.
"""

from __future__ import annotations

from pydantic import ValidationError

from orchestration.parameters import Settings
from tuneline.config.loader import parse_overrides
from tuneline.errors import UserError, did_you_mean


def run_parameters(defaults: dict, assignments: list[str]) -> dict:
    """The deployment's parameters with the command line's key=value pairs applied."""
    params = {**defaults}
    settings = {**(params.get("settings") or {})}
    overrides = list(params.get("overrides") or [])
    for pair in assignments:
        [(key, value)] = parse_overrides([pair]).items()
        if key == "config_path":
            params["config_path"] = str(value)
        elif key in Settings.model_fields:
            settings[key] = value
        else:
            overrides.append(pair.strip())
    if settings:
        try:
            params["settings"] = Settings(**settings).model_dump(exclude_none=True)
        except ValidationError as err:
            raise UserError([f"'{'.'.join(map(str, e['loc']))}={settings.get(e['loc'][0])}': {e['msg']}"
                             for e in err.errors()], title="invalid run parameters") from None
    params["overrides"] = overrides
    return params


async def _find_deployment(client, name: str):
    """The deployment named `flow/deployment` or, when that is unambiguous, just `deployment`."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    if "/" in name:
        try:
            return await client.read_deployment_by_name(name)
        except Exception:  # noqa: BLE001 - any failure to find it is reported with the names that exist
            found = []
    else:
        found = await client.read_deployments(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])))
        if len(found) == 1:
            return found[0]
    every = await client.read_deployments()
    flows = {f.id: f.name for f in await client.read_flows()}
    names = sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in every)
    if len(found) > 1:
        raise UserError(f"deployment '{name}' exists for several flows; name one of "
                        f"{', '.join(n for n in names if n.endswith('/' + name))}")
    listed = ", ".join(names) if names else "none: serve some with `tuneline serve`"
    raise UserError(f"no deployment '{name}' on {_api_url()}{did_you_mean(name, names)}; deployments: {listed}")


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def flow_run_page(flow_run_id) -> str:
    from prefect.settings import PREFECT_UI_URL

    return f"{PREFECT_UI_URL.value()}/runs/flow-run/{flow_run_id}"


def trigger(name: str, assignments: list[str]) -> tuple[str, str]:
    """Create the flow run; returns its id and its page in the Prefect UI."""
    import asyncio
    from pathlib import Path

    from prefect.client.orchestration import get_client

    from tuneline.pipeline.preflight import checked_config

    if not _api_url():
        raise UserError("no Prefect server to send the run to: set PREFECT_API_URL (e.g. "
                        "http://127.0.0.1:4200/api, after `tuneline ui` or `prefect server start`)")

    async def create():
        async with get_client() as client:
            deployment = await _find_deployment(client, name)
            params = run_parameters(deployment.parameters or {}, assignments)
            config_path = params.get("config_path")
            if config_path and Path(config_path).is_file():  # else it is read where the deployment runs
                settings = Settings(**params.get("settings", {}))  # the machine's own checks run on the worker
                checked_config(config_path, [*settings.as_overrides(), *params["overrides"]], machine=False)
            return await client.create_flow_run_from_deployment(deployment.id, parameters=params)

    run = asyncio.run(create())
    return str(run.id), flow_run_page(run.id)

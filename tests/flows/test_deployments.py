"""The nightly schedule in deployments/prefect.yaml reaches a real Prefect API as a deployment of `finetune`."""

import asyncio
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _serve_module():
    spec = importlib.util.spec_from_file_location("deployments_serve", REPO / "deployments" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_served_deployments_carry_the_yaml_schedule_and_a_valid_config(prefect_api):
    import yaml
    from prefect.client.orchestration import get_client

    from tuneline.config import load_config

    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    deployments = _serve_module().runner_deployments()
    assert [d.name for d in deployments] == [e["name"] for e in spec["deployments"]]
    ids = [d.apply() for d in deployments]

    async def read():
        async with get_client() as client:
            return [await client.read_deployment(i) for i in ids]

    for entry, stored in zip(spec["deployments"], asyncio.run(read()), strict=True):
        assert [s.schedule.cron for s in stored.schedules] == [s["cron"] for s in entry.get("schedules", [])]
        assert stored.global_concurrency_limit.limit == 1, "one run at a time writes a deployment's output_dir"
        assert stored.parameters["config_path"] == entry["parameters"]["config_path"]
        config = load_config(REPO / stored.parameters["config_path"], stored.parameters["overrides"],
                             check_paths=False)
        assert config.stage in {"pt", "sft", "rm", "dpo", "kto", "ppo"}
        form = stored.parameter_openapi_schema  # what the UI's Run form is drawn from
        fields = form["definitions"]["Settings"]["properties"]
        assert {"learning_rate", "lora_rank", "pref_beta", "stage"} <= set(fields)
        assert fields["learning_rate"]["description"] and fields["stage"]["anyOf"][0]["enum"][:2] == ["pt", "sft"]


def test_a_cron_that_prefect_rejects_fails_when_served(tmp_path):
    bad = tmp_path / "prefect.yaml"
    bad.write_text((REPO / "deployments" / "prefect.yaml").read_text().replace("0 2 * * *", "every night"))
    with pytest.raises(ValueError):
        _serve_module().runner_deployments(bad)


def test_serving_creates_the_gpu_limit_once_and_keeps_one_set_by_hand(prefect_api, monkeypatch):
    from prefect.client.orchestration import get_client

    from flows.concurrency import GPU_TAG, SLOTS_ENV, ensure_gpu_limit

    async def delete():
        async with get_client() as client:
            await client.delete_concurrency_limit_by_tag(GPU_TAG)

    monkeypatch.setenv(SLOTS_ENV, "2")
    assert ensure_gpu_limit() == 2
    monkeypatch.setenv(SLOTS_ENV, "5")
    assert ensure_gpu_limit() == 2, "an existing limit is the operator's: kept"
    asyncio.run(delete())

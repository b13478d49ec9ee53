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


@pytest.mark.parametrize(("good", "bad", "named"), [("0 2 * * *", "every night", "'every night'"),
                                                     ("timezone: UTC", "timezone: Mars/Olympus", "Mars/Olympus"),
                                                     ("examples/dpo_lora_demo.yaml", "examples/nope.yaml", "nope.yaml")])
def test_a_deployment_that_cannot_run_is_refused_when_served_with_its_name(tmp_path, capsys, good, bad, named):
    from cli.main import run

    spec = tmp_path / "prefect.yaml"
    spec.write_text((REPO / "deployments" / "prefect.yaml").read_text().replace(good, bad, 1))
    assert run(["serve", str(spec)]) == 2
    err = capsys.readouterr().err
    assert named in err and "deployment '" in err and "Traceback" not in err


def _deploy(name: str, parameters: dict) -> str:
    from flows.finetune import finetune

    return str(finetune.to_deployment(name=name, parameters=parameters).apply())


def _flow_runs(deployment_id: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[
                deployment_id])))

    return asyncio.run(read())


def test_trigger_starts_a_run_with_typed_fields_and_overrides_and_prints_its_page(prefect_api, capsys):
    from cli.main import run

    deployment = _deploy("trigger-me", {"config_path": "examples/sft_lora_demo.yaml", "overrides": ["max_steps=3"]})
    assert run(["trigger", "trigger-me", "learning_rate=2e-4", "logging_steps=3"]) == 0
    out = capsys.readouterr().out
    [run] = _flow_runs(deployment)
    assert f"flow run {run.id}" in out and f"/runs/flow-run/{run.id}" in out
    assert run.parameters["settings"] == {"learning_rate": 2e-4}, "a Run-form field goes to its typed field"
    assert run.parameters["overrides"] == ["max_steps=3", "logging_steps=3"], "other keys extend the overrides"
    assert run.state.is_scheduled()


@pytest.mark.parametrize(("argv", "message"), [
    (["trigger", "no-such-deployment"], "no deployment 'no-such-deployment'"),
    (["trigger", "trigger-bad", "lerning_rate=1e-4"], "did you mean 'learning_rate'"),
    (["trigger", "trigger-bad", "learning_rate=-1"], "'learning_rate=-1'"),
    (["trigger", "trigger-bad", "max_steps"], "key=value"),
])
def test_a_trigger_that_cannot_run_starts_nothing_and_says_why(prefect_api, capsys, argv, message):
    from cli.main import run

    deployment = _deploy("trigger-bad", {"config_path": "examples/sft_lora_demo.yaml", "overrides": []})
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not _flow_runs(deployment)


def test_trigger_leaves_the_machines_checks_to_the_worker_that_trains(prefect_api, capsys):
    """A run triggered from a laptop for a cluster: the Ray head answers only inside the cluster (192.0.2.1 is a
    documentation address no packet reaches), so the check that refuses it belongs to the worker, not to trigger."""
    from cli.main import run
    from tuneline.errors import UserError
    from tuneline.pipeline.preflight import checked_config

    cluster = ["use_ray=true", "ray_num_workers=2", "ray_address=192.0.2.1:6379"]
    with pytest.raises(UserError, match="cannot reach the Ray cluster at 192.0.2.1:6379"):
        checked_config("examples/sft_lora_demo.yaml", cluster)  # what `tuneline train` on this machine says
    deployment = _deploy("trigger-cluster", {"config_path": "examples/sft_lora_demo.yaml", "overrides": cluster})
    assert run(["trigger", "trigger-cluster", "logging_steps=3"]) == 0, capsys.readouterr().err
    [flow_run] = _flow_runs(deployment)
    assert flow_run.parameters["overrides"] == [*cluster, "logging_steps=3"]
    assert run(["trigger", "trigger-cluster", "lerning_rate=1e-4"]) == 2, "the config's own keys are still checked"
    assert "did you mean 'learning_rate'" in capsys.readouterr().err


def test_trigger_without_a_server_says_how_to_reach_one(capsys, monkeypatch):
    from cli.main import run

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: None}):
        assert run(["trigger", "sft-nightly"]) == 2
    assert "PREFECT_API_URL" in capsys.readouterr().err


def test_serving_creates_the_gpu_limit_once_and_keeps_one_set_by_hand(prefect_api, monkeypatch):
    from prefect.client.orchestration import get_client

    from orchestration.concurrency import GPU_TAG, SLOTS_ENV, ensure_gpu_limit

    async def delete():
        async with get_client() as client:
            await client.delete_concurrency_limit_by_tag(GPU_TAG)

    monkeypatch.setenv(SLOTS_ENV, "2")
    assert ensure_gpu_limit() == 2
    monkeypatch.setenv(SLOTS_ENV, "5")
    assert ensure_gpu_limit() == 2, "an existing limit is the operator's: kept"
    asyncio.run(delete())


def test_the_kubernetes_job_template_is_accepted_by_prefect_as_a_work_pools_base_template(prefect_api):
    """The server checks that every placeholder of job_configuration is a declared variable."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    template = json.loads((REPO / "deployments" / "kubernetes-job-template.json").read_text())

    async def create():
        async with get_client() as client:
            return await client.create_work_pool(WorkPoolCreate(name="k8s-gpu", type="kubernetes",
                                                                base_job_template=template))

    pool = asyncio.run(create())
    variables = pool.base_job_template["variables"]["properties"]
    assert variables["shared_volume_claim"]["default"] == "tuneline-shared" and variables["gpus"]["default"] == 1
    containers = pool.base_job_template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert {"name": "shared", "mountPath": "/shared"} in containers["containers"][0]["volumeMounts"]
    broken = {**template, "job_configuration": {**template["job_configuration"], "image": "{{ no_such_variable }}"}}

    async def create_broken():
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name="k8s-broken", type="kubernetes",
                                                         base_job_template=broken))

    with pytest.raises(Exception, match="no_such_variable"):
        asyncio.run(create_broken())

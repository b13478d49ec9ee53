"""deployments/prefect-kubernetes.yaml the way a user sets it up, against the run's real Prefect API: `prefect
work-pool create --type kubernetes` from deployments/kubernetes-job-template.json, `prefect deploy` of the file, a
flow run of the deployment, and the Job that prefect-kubernetes' worker builds for that run, valid against
Kubernetes' batch/v1 schema. No Kubernetes cluster exists here: nothing submits the Job, and no worker polls the pool
(the run is deleted)."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import yaml

from tests.support.kube_schemas import job_as_the_api_server_takes_it, problems

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _prefect(*args: str, env: dict) -> None:
    done = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_prefect_deploys_it_and_the_kubernetes_worker_would_submit_a_valid_job(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    spec = yaml.safe_load((REPO / "deployments" / "prefect-kubernetes.yaml").read_text())
    pool, suffix = f"gpu-k8s-{uuid4().hex[:8]}", uuid4().hex[:8]  # the run's one server: names of this test's own
    for deployment in spec["deployments"]:
        assert deployment["work_pool"]["name"] == "gpu-k8s"  # the pool docs/machines.md creates
        deployment["work_pool"]["name"], deployment["name"] = pool, f"{deployment['name']}-{suffix}"
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    _prefect("work-pool", "create", pool, "--type", "kubernetes", "--base-job-template",
             "deployments/kubernetes-job-template.json", env=env)
    _prefect("deploy", "--all", "--prefect-file", str(tmp_path / "prefect.yaml"), env=env)

    async def jobs() -> list[tuple[dict, dict]]:
        async with get_client() as client:
            work_pool = await client.read_work_pool(pool)
            found = []
            for entry in spec["deployments"]:
                deployment = await client.read_deployment_by_name(f"finetune/{entry['name']}")
                assert deployment.job_variables == entry["work_pool"]["job_variables"]
                assert deployment.parameters == entry["parameters"] and deployment.pull_steps == spec["pull"]
                run = await client.create_flow_run_from_deployment(deployment.id)
                try:
                    configuration = await KubernetesWorkerJobConfiguration.resolve_for_flow_run(
                        run, client=client, work_pool=work_pool, worker_name="no-worker", deployment=deployment)
                finally:
                    await client.delete_flow_run(run.id)
                    await client.delete_deployment(deployment.id)
                found.append((entry, configuration.job_manifest))
            await client.delete_work_pool(pool)
            return found

    for entry, manifest in asyncio.run(jobs()):
        job = job_as_the_api_server_takes_it(manifest)
        assert problems(job) == [], entry["name"]
        container = job["spec"]["template"]["spec"]["containers"][0]
        variables = entry["work_pool"]["job_variables"]
        assert container["image"] == variables["image"] and container["args"][:2] == ["bash", "-c"]
        assert "ray start --address=tuneline-ray-head-svc:6379" in container["args"][2]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
        assert env["PREFECT__FLOW_RUN_ID"] and env["PREFECT_API_URL"] == prefect_api  # how the pod finds its run
        assert {k: env[k] for k in variables["env"]} == variables["env"] and "secretKeyRef" in env["RAY_AUTH_TOKEN"]

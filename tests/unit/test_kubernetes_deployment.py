"""deployments/prefect-kubernetes.yaml without a cluster or a server: its entrypoint is the flow and takes its
parameters, its config trains on the KubeRay cluster's head service, its job variables are the work pool's, and the
Job that prefect-kubernetes' worker would create from deployments/kubernetes-job-template.json is valid against
Kubernetes' batch/v1 schema (tests/support/kube_schemas.py)."""

import copy
import json
import shlex
from pathlib import Path
from uuid import uuid4

import pytest
import yaml

from tests.support.kube_schemas import job_as_the_api_server_takes_it, manifests, problems

REPO = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((REPO / "deployments" / "prefect-kubernetes.yaml").read_text())
TEMPLATE = json.loads((REPO / "deployments" / "kubernetes-job-template.json").read_text())
DEPLOYMENTS = SPEC["deployments"]


def _job(template: dict, job_variables: dict) -> dict:
    """The Job manifest prefect-kubernetes' worker submits for a flow run of a deployment with these variables: the
    pool's defaults and the deployment's variables put into the template by Prefect's templating, then the worker's
    own preparation (Prefect's from_template_and_values does the same, then looks up block and variable references,
    which need a server and which these templates do not use: tests/e2e/test_kubernetes_deploy.py goes that way)."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    values = {name: v["default"] for name, v in template["variables"]["properties"].items() if "default" in v}
    configuration = KubernetesWorkerJobConfiguration(**apply_values(copy.deepcopy(template["job_configuration"]),
                                                                    {**values, **job_variables}))
    configuration.prepare_for_flow_run(FlowRun(flow_id=uuid4(), name="nightly-sft"))
    return job_as_the_api_server_takes_it(configuration.job_manifest)


def _cluster() -> dict:
    return next(doc for _, doc in manifests(REPO / "deployments") if doc["kind"] == "RayCluster")


def test_the_job_of_the_work_pool_defaults_is_a_valid_kubernetes_job():
    job = _job(TEMPLATE, {})
    assert problems(job) == []
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["prefect", "flow-run", "execute"]


def test_a_typo_in_the_job_template_is_reported_where_it_is():
    template = copy.deepcopy(TEMPLATE)
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    pod["containers"][0]["volumeMount"] = pod["containers"][0].pop("volumeMounts")
    assert [p for p in problems(_job(template, {})) if "'volumeMount' was unexpected" in p] != []


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_the_entrypoint_is_the_flow_and_takes_the_parameters(deployment):
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint

    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert isinstance(flow, Flow) and flow.name == "finetune"
    assert flow.validate_parameters(deployment["parameters"])["config_path"] == deployment["parameters"]["config_path"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_the_job_variables_are_the_work_pools_and_make_a_valid_job(deployment):
    from prefect.utilities.schema_tools import validate

    variables = deployment["work_pool"]["job_variables"]
    schema = TEMPLATE["variables"]
    assert set(variables) <= set(schema["properties"]), "Prefect ignores a job variable the pool does not have"
    validate(variables, schema, raise_on_error=True)  # as the server validates them when the deployment is made
    job = _job(TEMPLATE, variables)
    assert problems(job) == []
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == variables["image"] and container["resources"]["limits"]["nvidia.com/gpu"] == 0
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert {k: env[k] for k in variables["env"]} == variables["env"]
    assert env["RAY_AUTH_TOKEN"]["secretKeyRef"]["name"] == "tuneline-ray-auth"


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_the_flow_pod_joins_the_cluster_the_config_trains_on(deployment, monkeypatch):
    """The command's `ray start --address` and the config's ray_address are the RayCluster's head service and GCS
    port; the config trains on Ray there with its caches and checkpoints on the volume every pod mounts."""
    from tuneline.config import load_config

    cluster = _cluster()
    head = f"{cluster['metadata']['name']}-head-svc:6379"  # KubeRay's service for the head; 6379: its GCS
    job = _job(TEMPLATE, deployment["work_pool"]["job_variables"])
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["bash", "-c"]
    joining, execute = args[2].split(" && ")
    assert shlex.split(joining) == ["ray", "start", f"--address={head}", "--num-cpus=0", "--num-gpus=0"]
    assert execute == "exec prefect flow-run execute"  # the worker's own command, run on that node
    monkeypatch.chdir(REPO)  # the pull step's /app: the repo as the image holds it
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    parameters = deployment["parameters"]
    config = load_config(parameters["config_path"], parameters["overrides"], check_paths=False)
    assert config.ray.address == head and not config.ray.local
    assert config.ray.num_workers == 2 and config.ray.resources_per_worker == {"GPU": 1}
    assert all(str(path).startswith("/shared/") for path in (config.output_dir, config.pipeline.pipeline_cache_dir))

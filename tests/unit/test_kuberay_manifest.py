"""The Kubernetes manifests in deployments/ against the schemas their kinds publish, without a cluster: KubeRay's
RayCluster CRD (ray.io/v1) and Kubernetes' own types (tests/support/kube_schemas.py says which and from where), read
strictly as the API server reads them; and what ties the RayCluster to our image, volume and Ray."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from tests.support.kube_schemas import manifests, problems

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = manifests(REPO / "deployments")


def _cluster() -> dict:
    return next(doc for _, doc in MANIFESTS if doc["kind"] == "RayCluster")


def test_deployments_hold_a_raycluster_and_the_volume_it_mounts():
    assert {doc["kind"] for _, doc in MANIFESTS} >= {"RayCluster", "PersistentVolumeClaim"}


@pytest.mark.parametrize(("name", "manifest"), MANIFESTS, ids=[f"{n}:{d['kind']}" for n, d in MANIFESTS])
def test_every_manifest_is_valid_against_its_published_schema(name, manifest):
    assert problems(manifest) == [], name


def _at(doc, path: str):
    """The node at a dotted path (list items by index)."""
    for part in filter(None, path.split(".")):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _typo(path: str, old: str, new: str | None):
    """An edit of the RayCluster: the key `old` at `path` renamed to `new` (None: deleted)."""
    def edit(doc):
        node = _at(doc, path)
        value = node.pop(old)
        if new is not None:
            node[new] = value
    return edit


@pytest.mark.parametrize(("edit", "where"), [
    (_typo("spec.headGroupSpec", "rayStartParams", "rayStartParam"), "spec.headGroupSpec: "),
    (_typo("spec.workerGroupSpecs.0.template.spec.containers.0", "volumeMounts", "volumeMount"),
     "spec.workerGroupSpecs.0.template.spec.containers.0: "),
    (_typo("spec.headGroupSpec.template.spec.volumes.0", "persistentVolumeClaim", "persistentVolumeclaim"),
     "spec.headGroupSpec.template.spec.volumes.0: "),
    (_typo("metadata", "name", "nmae"), "metadata: "),
    (_typo("spec.workerGroupSpecs.0", "groupName", None), "spec.workerGroupSpecs.0: 'groupName' is a required"),
], ids=["ray-start-params", "container-field", "volume-source", "metadata", "required-group-name"])
def test_a_typo_in_the_manifest_is_reported_where_it_is(edit, where):
    broken = copy.deepcopy(_cluster())
    edit(broken)
    found = problems(broken)
    assert len(found) == 1 and found[0].startswith(where), found


@pytest.mark.parametrize(("path", "value", "said"), [
    ("spec.workerGroupSpecs.0.replicas", "2", "'2' is not of type 'integer'"),
    ("spec.headGroupSpec.rayStartParams.num-cpus", 0, "0 is not of type 'string'"),  # a map of strings
    ("spec.upgradeStrategy", {"type": "Rolling"}, "'Rolling' is not one of ['Recreate', 'None']"),
])
def test_a_wrong_value_is_reported_with_what_the_schema_wants(path, value, said):
    broken = copy.deepcopy(_cluster())
    parent, _, last = path.rpartition(".")
    _at(broken, parent)[last] = value
    assert [p for p in problems(broken) if said in p], problems(broken)


def test_the_ray_cluster_runs_our_image_on_the_shared_volume_with_our_ray():
    import ray

    spec = _cluster()["spec"]
    assert spec["rayVersion"] == ray.__version__  # the Ray the image's tuneline[ray] installs, as tested here
    job = json.loads((REPO / "deployments" / "kubernetes-job-template.json").read_text())
    claim = job["variables"]["properties"]["shared_volume_claim"]["default"]
    volume = next(doc for _, doc in MANIFESTS if doc["kind"] == "PersistentVolumeClaim")
    assert volume["metadata"]["name"] == claim and volume["spec"]["accessModes"] == ["ReadWriteMany"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"].endswith("/tuneline:latest") and container["workingDir"] == "/app"
        assert {"name": "shared", "mountPath": "/shared"} in container["volumeMounts"]
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
        auth = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
        assert auth.keys() == {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} and all(ref["optional"] for ref in auth.values())
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no training worker lands on the head
    head_ports = {p["name"]: p["containerPort"] for p in spec["headGroupSpec"]["template"]["spec"]["containers"][0]
                  ["ports"]}
    assert head_ports["gcs-server"] == 6379  # the address a flow's Ray driver joins (tuneline.pipeline.ray_launch)
    dockerfile = (REPO / "deployments" / "Dockerfile").read_text()
    assert '".[ray]"' in dockerfile and "WORKDIR /app" in dockerfile


def test_the_manifests_name_the_same_secret_as_the_work_pool():
    job = json.loads((REPO / "deployments" / "kubernetes-job-template.json").read_text())
    secret = job["variables"]["properties"]["ray_auth_secret"]["default"]
    text = (REPO / "deployments" / "ray-cluster.yaml").read_text()
    assert yaml.safe_load(text) and text.count(f"name: {secret},") == 2  # RAY_AUTH_MODE and RAY_AUTH_TOKEN

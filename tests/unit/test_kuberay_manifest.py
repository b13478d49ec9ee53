"""deployments/ray-cluster.yaml against the rules of KubeRay's RayCluster CRD (ray.io/v1, ray-operator/config/crd/
bases/ray.io_rayclusters.yaml) that a hand-written manifest breaks most easily, without a cluster: the group specs'
required fields, rayStartParams as a map of strings, the image and volume the Prefect work pool's jobs use, and the
Ray version the `ray` extra installs."""

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_the_ray_cluster_manifest_is_a_raycluster_of_our_image_on_the_shared_volume():
    import ray

    cluster = yaml.safe_load((REPO / "deployments" / "ray-cluster.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster") and cluster["metadata"]["name"]
    spec = cluster["spec"]
    assert spec["rayVersion"] == ray.__version__  # the Ray the image's tuneline[ray] installs, as tested here
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    assert all(worker["groupName"] and worker["template"] for worker in spec["workerGroupSpecs"])
    assert all(worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"]
               for worker in spec["workerGroupSpecs"])
    job = json.loads((REPO / "deployments" / "kubernetes-job-template.json").read_text())
    claim = job["variables"]["properties"]["shared_volume_claim"]["default"]
    for group in groups:
        assert all(isinstance(v, str) for v in group.get("rayStartParams", {}).values())  # CRD: map of strings
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"].endswith("/tuneline:latest") and container["workingDir"] == "/app"
        assert {"name": "shared", "mountPath": "/shared"} in container["volumeMounts"]
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no training worker lands on the head
    dockerfile = (REPO / "deployments" / "Dockerfile").read_text()
    assert '".[ray]"' in dockerfile and "WORKDIR /app" in dockerfile

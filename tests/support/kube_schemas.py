"""The published schemas the Kubernetes manifests in deployments/ are checked against, without a cluster.

tests/fixtures/kuberay holds the `v1` schema of KubeRay's RayCluster CRD and tests/fixtures/kubernetes the
Kubernetes 1.35 core types it refers to (each file says where it comes from). An API server prunes or rejects a field
a schema does not name (kubectl's default, `--validate=strict`, rejects it); JSON Schema allows one unless the object
is closed, so KubeRay's objects are closed here as the API server treats them (the Kubernetes file already is), except
where a CRD leaves an object open (x-kubernetes-preserve-unknown-fields)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORE = "kubernetes-core.json"
# (apiVersion, kind) -> the schema of a manifest of that kind: a KubeRay CRD file, or a core type's name
KINDS = {("ray.io/v1", "RayCluster"): "kuberay/rayclusters.ray.io-v1.yaml",
         ("batch/v1", "Job"): "io.k8s.api.batch.v1.Job",
         ("v1", "PersistentVolumeClaim"): "io.k8s.api.core.v1.PersistentVolumeClaim"}


def closed(schema):
    """Every object that names its fields takes no other, as the API server's strict field validation has it; a
    required field with a default may be left out (the server fills the default in before it validates)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: closed(value) for key, value in schema.items()}
    fields = schema.get("properties", {})
    if fields and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    if "required" in schema:
        schema["required"] = [name for name in schema["required"] if "default" not in fields.get(name, {})]
    return schema


@cache
def _registry() -> Registry:
    core = json.loads((FIXTURES / "kubernetes" / "core-v1.35-strict.json").read_text())
    return Registry().with_resource(CORE, Resource.from_contents(core, default_specification=DRAFT202012))


def validator(api_version: str, kind: str) -> Draft202012Validator:
    """The validator of a manifest of this apiVersion and kind; a kind without a schema here is a KeyError."""
    source = KINDS[(api_version, kind)]
    if source.endswith(".yaml"):
        schema = closed(yaml.safe_load((FIXTURES / source).read_text()))
    else:
        schema = {"$ref": f"{CORE}#/$defs/{source}"}
    return Draft202012Validator(schema, registry=_registry())


def problems(manifest: dict) -> list[str]:
    """Each place a manifest breaks its kind's schema, as `path: message`; none for a valid one."""
    found = validator(manifest.get("apiVersion"), manifest.get("kind")).iter_errors(manifest)
    return sorted(f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}" for error in found)


def manifests(folder: Path) -> list[tuple[str, dict]]:
    """(file name, document) of each Kubernetes object in the folder's YAML files (a document with a `kind`)."""
    return [(path.name, document) for path in sorted(folder.glob("*.yaml"))
            for document in yaml.safe_load_all(path.read_text()) if isinstance(document, dict) and "kind" in document]


def job_as_the_api_server_takes_it(job: dict) -> dict:
    """prefect-kubernetes' worker refuses a job template whose pod spec lacks `parallelism: 1` and `completions: 1`
    (its own default template has them there); they are JobSpec's fields, not PodSpec's, so the API server drops them
    from the pod spec with a warning (its default field validation for API clients, which the worker is). Checked
    present, then dropped, so that everything else meets the strict schema."""
    job = json.loads(json.dumps(job))
    pod = job["spec"]["template"]["spec"]
    assert (pod.pop("parallelism", None), pod.pop("completions", None)) == (1, 1), "prefect-kubernetes requires them"
    return job

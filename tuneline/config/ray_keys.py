"""LLaMA-Factory's Ray keys, read into the settings that place a training's workers on Ray.

LLaMA-Factory hands a training to Ray when `USE_RAY=1` (0.9.5: `ray_num_workers` workers started with `ray.remote`;
its earlier releases: Ray Train, placed by `resources_per_worker` and `placement_strategy`, its run state under
`ray_storage_path`). tuneline does the same through Ray Train's TorchTrainer (tuneline.pipeline.ray_launch): Ray
places and restarts the workers, each runs tuneline's own training child, and the flow keeps the cache, the keys,
the checkpoints and the MLflow record. The keys never enter the train key: where the workers ran does not shape
the weights, so a run started on accelerate resumes on Ray and back.

Ray is on with `USE_RAY=1` in the environment, `use_ray: true`, or any Ray key but `master_addr`/`master_port`
(LLaMA-Factory would ignore them without `USE_RAY`; tuneline never ignores a key). `ray_address` (or `RAY_ADDRESS`)
names a running cluster; without one a local Ray starts and stops with the training.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

RAY_SWITCH, ADDRESS_ENV = "USE_RAY", "RAY_ADDRESS"
RAY_KEYS = ("use_ray", "ray_num_workers", "ray_run_name", "ray_storage_path", "ray_storage_filesystem",
            "resources_per_worker", "placement_strategy", "ray_init_kwargs", "master_addr", "master_port",
            "ray_address", "ray_max_failures")
NOT_ALONE = ("master_addr", "master_port")  # they only say where the workers meet: no reason to start Ray
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray's placement group strategies
LOCAL_ONLY_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # folders no other machine sees
EXTRA = "pip install 'tuneline[ray]'"


@dataclass
class RaySettings:
    """Where and how the training's workers run on Ray; every field from a LLaMA-Factory key or tuneline's own."""

    num_workers: int = 1
    address: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    run_name: str | None = None
    storage_path: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_failures: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RaySettings:
        return cls(**json.loads(text))

    @property
    def local(self) -> bool:
        """No cluster named: a Ray of this machine alone, started and stopped with the training."""
        return not (self.address or self.init_kwargs.get("address"))


def switched_on() -> bool:
    return os.environ.get(RAY_SWITCH, "").lower() in ("1", "true", "y", "yes")


def ray_settings(values: dict[str, Any]) -> tuple[RaySettings | None, list[str]]:
    """The Ray settings these keys (and USE_RAY / RAY_ADDRESS) ask for, or None for a training without Ray; and
    every problem with them, each naming the key, its value and what to do."""
    use = values.get("use_ray")
    wanted = [key for key in values if key not in NOT_ALONE and key != "use_ray"]
    on = use is True or (use is None and (switched_on() or bool(wanted)))
    if not on:
        if use is False and wanted + [k for k in NOT_ALONE if k in values]:
            named = ", ".join(f"'{k}'" for k in values if k != "use_ray")
            return None, [f"'use_ray: false' with {named}: they place a training on Ray; remove them, or set "
                          "'use_ray: true'"]
        if stray := [k for k in NOT_ALONE if k in values]:
            return None, [f"{', '.join(repr(k) for k in stray)} say where Ray's workers meet, and this config does not "
                          "train on Ray: set 'use_ray: true' (or USE_RAY=1), or for several machines under accelerate "
                          "use 'main_process_ip' and 'main_process_port'"]
        return None, []
    problems: list[str] = []
    if find_spec("ray") is None or find_spec("ray.train") is None:
        problems.append(f"this config trains on Ray ({', '.join(repr(k) for k in values) or RAY_SWITCH + '=1'}) and "
                        f"Ray Train is not installed: {EXTRA}")
    settings = RaySettings()
    for key, read in READERS.items():
        if key in values and values[key] is not None:
            problem = read(settings, values[key])
            if problem:
                problems.append(f"'{key}: {values[key]}' {problem}")
    settings.address = settings.address or os.environ.get(ADDRESS_ENV) or None
    return settings, problems


def _positive_int(name: str, minimum: int):
    def read(settings: RaySettings, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            return f"must be a whole number of at least {minimum}"
        setattr(settings, name, value)
        return None
    return read


def _mapping(name: str):
    def read(settings: RaySettings, value: Any) -> str | None:
        if isinstance(value, str) and value.strip().startswith("{"):
            try:
                value = json.loads(value)  # as LLaMA-Factory reads a JSON string from the command line
            except json.JSONDecodeError as err:
                return f"is not valid JSON ({err.msg})"
        if not isinstance(value, dict):
            return "must be a mapping (YAML or a JSON string)"
        if name == "resources_per_worker" and not all(isinstance(v, (int, float)) for v in value.values()):
            return "must map each resource (CPU, GPU, or a custom one) to an amount"
        setattr(settings, name, dict(value))
        return None
    return read


def _text(name: str):
    def read(settings: RaySettings, value: Any) -> str | None:
        setattr(settings, name, str(value))
        return None
    return read


def _placement(settings: RaySettings, value: Any) -> str | None:
    if str(value).upper() not in PLACEMENTS:
        return f"is not a Ray placement strategy: use one of {', '.join(PLACEMENTS)}"
    settings.placement_strategy = str(value).upper()
    return None


def _storage(settings: RaySettings, value: Any) -> str | None:
    if "://" in str(value):
        return ("is a URI: Ray Train keeps only its run state there, while tuneline's workers read the cached dataset "
                "and write checkpoints through the file system; mount the bucket (s3fs, gcsfuse) on every machine and "
                "give its path, or leave the key out")
    settings.storage_path = str(Path(value).absolute())
    return None


def _filesystem(settings: RaySettings, value: Any) -> str | None:
    return ("names a cloud file system for Ray's storage; tuneline's workers read the cached dataset and write "
            "checkpoints through the file system every machine mounts (output_dir, pipeline_cache_dir): mount the "
            "bucket (s3fs, gcsfuse) there, point ray_storage_path at it, and remove ray_storage_filesystem")


def _port(settings: RaySettings, value: Any) -> str | None:
    if not str(value).isdigit() or not 0 < int(value) < 65536:
        return "must be a port number (1 to 65535)"
    settings.master_port = int(value)
    return None


def _use(settings: RaySettings, value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


READERS = {
    "use_ray": _use,
    "ray_num_workers": _positive_int("num_workers", 1),
    "ray_max_failures": _positive_int("max_failures", -1),
    "ray_address": _text("address"),
    "ray_init_kwargs": _mapping("init_kwargs"),
    "resources_per_worker": _mapping("resources_per_worker"),
    "placement_strategy": _placement,
    "ray_run_name": _text("run_name"),
    "ray_storage_path": _storage,
    "ray_storage_filesystem": _filesystem,
    "master_addr": _text("master_addr"),
    "master_port": _port,
}


def ray_run_problems(config) -> list[str]:
    """What this run asks of its launch that Ray does not do, or that a remote worker could not reach."""
    settings, pipe = config.ray, config.pipeline
    if settings is None:
        return []
    problems = []
    if pipe.num_processes:
        problems.append(f"'num_processes: {pipe.num_processes}' counts accelerate's processes; on Ray "
                        f"'ray_num_workers' ({settings.num_workers}) counts the training processes: remove one")
    if pipe.num_machines > 1:
        problems.append(f"'num_machines: {pipe.num_machines}': on Ray the cluster places the workers over its "
                        "machines; remove 'num_machines', 'machine_rank' and 'main_process_ip'")
    return problems


def unreachable_paths(config) -> list[str]:
    """On a cluster the workers run on other machines, in the flow's working folder: paths they read or write are
    refused where it is plain that no other machine sees them (a machine-local folder such as /tmp). A check of the
    machine the flow runs on, where relative paths resolve."""
    if config.ray is None or config.ray.local:
        return []
    paths = {"output_dir": config.training.get("output_dir"),
             "pipeline_cache_dir": config.pipeline.pipeline_cache_dir}
    if Path(config.model.model_name_or_path or "").exists():  # a model from a hub is fetched by each worker
        paths["model_name_or_path"] = config.model.model_name_or_path
    problems = []
    for key, value in paths.items():
        path = str(Path(value).absolute()) if value else ""
        if any(path == root or path.startswith(root + "/") for root in LOCAL_ONLY_ROOTS):
            problems.append(f"'{key}: {value}' is in {path.split('/')[1] and '/' + path.split('/')[1]}, which only "
                            f"this machine sees, and the workers of the Ray cluster at "
                            f"{config.ray.address or 'ray_init_kwargs'} read and write it from others: give a path "
                            "on storage every machine mounts at the same place (NFS; a bucket through s3fs or gcsfuse)")
    return problems

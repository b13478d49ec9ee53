"""LLaMA-Factory's Ray keys: read into the settings the Ray launch uses, or refused before start with what to do.
No Ray starts here (tests/flows/test_ray.py and the Ray example in test_llamafactory_examples.py run it)."""

from pathlib import Path

import pytest

from tuneline.config import load_config
from tuneline.config.ray_keys import RaySettings
from tuneline.errors import ConfigError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llamafactory" / "0.9.5"
RAY_EXAMPLE = FIXTURES / "examples" / "train_lora" / "qwen3_lora_sft_ray.yaml"
BASE = "model_name_or_path: org/model\ndataset: demo_sft\n"


@pytest.fixture(autouse=True)
def no_ray_environment(monkeypatch):
    for name in ("USE_RAY", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def loaded(tmp_path, text: str, **overrides):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, overrides, check_paths=False)


def problems_of(tmp_path, text: str, **overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        loaded(tmp_path, text, **overrides)
    return str(caught.value)


def test_the_ray_example_becomes_the_settings_ray_train_is_given(monkeypatch):
    config = load_config(RAY_EXAMPLE, check_paths=False)
    ray = config.ray
    assert (ray.num_workers, ray.placement_strategy, ray.resources_per_worker) == (4, "PACK", {"GPU": 1})
    assert ray.run_name == "qwen3_4b_sft_lora" and ray.storage_path == str(Path("saves").absolute())
    assert ray.local and ray.max_failures == 0
    assert RaySettings.from_json(ray.to_json()) == ray  # how the train step hands them to the Ray driver
    assert "ray_num_workers" not in config.flat()  # where workers run does not shape the weights: not in the keys


def test_ray_is_on_from_the_environment_switch_or_use_ray_and_off_without(tmp_path, monkeypatch):
    assert loaded(tmp_path, BASE).ray is None
    assert loaded(tmp_path, BASE + "use_ray: true\n").ray == RaySettings()
    monkeypatch.setenv("USE_RAY", "1")  # how LLaMA-Factory turns Ray on, with no key at all
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    shared = "output_dir: /shared/out\npipeline_cache_dir: /shared/cache\n"  # a cluster's workers reach them
    ray = loaded(tmp_path, BASE + shared + "master_addr: 10.0.0.7\nmaster_port: '29501'\nray_init_kwargs: "
                               "'{\"runtime_env\": {\"env_vars\": {\"A\": \"1\"}}}'\n").ray
    assert (ray.address, ray.master_addr, ray.master_port) == ("10.0.0.5:6379", "10.0.0.7", 29501)
    assert ray.init_kwargs == {"runtime_env": {"env_vars": {"A": "1"}}} and not ray.local


def test_keys_ray_cannot_honour_here_are_refused_with_what_to_do(tmp_path):
    message = problems_of(tmp_path, BASE + "ray_storage_filesystem: s3\nplacement_strategy: NEAR\nray_num_workers: 0\n"
                                           "use_ray: true\nnum_processes: 2\n")
    assert "'ray_storage_filesystem: s3'" in message and "mount the bucket" in message
    assert "'placement_strategy: NEAR'" in message and "STRICT_SPREAD" in message
    assert "'ray_num_workers: 0'" in message and "'num_processes: 2'" in message
    assert "'ray_storage_path: s3://bucket/run'" in problems_of(tmp_path, BASE + "ray_storage_path: s3://bucket/run\n")
    stray = problems_of(tmp_path, BASE + "master_addr: 10.0.0.7\n")
    assert "'master_addr'" in stray and "main_process_ip" in stray and "use_ray" in stray
    assert "remove them" in problems_of(tmp_path, BASE + "use_ray: false\nray_num_workers: 2\n")


def test_a_cluster_is_refused_paths_no_other_machine_sees(tmp_path):
    """A check of the machine the flow runs on (where relative paths resolve): `tuneline train` makes it, a trigger
    from a laptop leaves it to the worker."""
    from tuneline.errors import UserError
    from tuneline.pipeline.preflight import checked_config

    text = BASE + f"ray_address: 10.0.0.5:6379\noutput_dir: {tmp_path / 'out'}\npipeline_cache_dir: /shared/cache\n"
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(UserError) as caught:
        checked_config(tmp_path / "c.yaml")
    message = str(caught.value)
    assert f"'output_dir: {tmp_path / 'out'}' is in /tmp" in message and "pipeline_cache_dir" not in message
    assert checked_config(tmp_path / "c.yaml", machine=False).ray.address == "10.0.0.5:6379"
    local = loaded(tmp_path, BASE + f"use_ray: true\noutput_dir: {tmp_path / 'out'}\n")  # a local Ray: one machine
    assert local.ray.local


def test_without_ray_installed_a_ray_config_is_refused_naming_the_extra(tmp_path, monkeypatch):
    """Ray Train is installed here, so its absence is what find_spec would answer without it."""
    from tuneline.config import ray_keys

    monkeypatch.setattr(ray_keys, "find_spec", lambda name: None)
    assert "pip install 'tuneline[ray]'" in problems_of(tmp_path, BASE + "ray_num_workers: 2\n")


def test_the_train_step_launches_the_ray_driver_with_the_settings(tmp_path):
    from tuneline.pipeline.launch import launch_command
    from tuneline.pipeline.ray_launch import worker_resources

    config = loaded(tmp_path, BASE + "ray_num_workers: 2\nresources_per_worker: {GPU: 1, CPU: 2}\n")
    cmd = launch_command(config, tmp_path / "c.yaml", "/cache/data")
    assert cmd[1:3] == ["-m", "tuneline.pipeline.ray_launch"] and cmd[-2:] == ["--dataset", "/cache/data"]
    assert RaySettings.from_json(cmd[cmd.index("--ray") + 1]).num_workers == 2
    assert worker_resources(config.ray, use_cpu=True) == ({"CPU": 2}, False)  # no GPU here: trains on CPU
    assert worker_resources(config.ray, use_cpu=False) == ({"GPU": 1, "CPU": 2}, True)


def test_a_failed_fit_ends_the_driver_with_the_childs_own_line():
    """Ray Train's own error type, as a fit raises it when a worker's child exits with a user error (code 2: not
    retried by the flow) or dies."""
    from ray.train.v2.api.exceptions import WorkerGroupError

    from tuneline.pipeline.ray_launch import CHILD_FAILED, failure_of

    said = WorkerGroupError("Training failed", {1: RuntimeError(f"{CHILD_FAILED}2] output_dir 'out' holds another "
                                                                "run\nTraceback (most recent call last): ...")})
    assert failure_of(said) == (2, "output_dir 'out' holds another run")
    died = WorkerGroupError("Training failed", {0: RuntimeError(f"{CHILD_FAILED}-9] worker 0")})
    assert failure_of(died) == (1, "worker 0")


def test_an_unreachable_cluster_is_one_line_before_anything_starts(tmp_path, capsys):
    from cli.main import run
    from tests.support.ports import free_port

    config = tmp_path / "c.yaml"
    config.write_text(BASE + f"output_dir: {tmp_path / 'out'}\n")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert run(["train", str(config), f"ray_address={address}", "pipeline_cache_dir=/shared/cache"]) == 2
    said = capsys.readouterr().err
    assert f"cannot reach the Ray cluster at {address}" in said and "ray start --head" in said
    assert "Traceback" not in said and not (tmp_path / "out").exists()

"""LLaMA-Factory's torchrun variables become tuneline's machine keys, or are refused with what to do."""

import pytest

from tuneline.config import load_config
from tuneline.errors import ConfigError

BASE = "model_name_or_path: org/model\ndataset: demo_sft\n"
TORCHRUN = ("FORCE_TORCHRUN", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID",
            "MIN_NNODES", "MAX_NNODES", "MAX_RESTARTS", "LOCAL_RANK", "USE_RAY")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)


def loaded(tmp_path, text=BASE):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path, check_paths=False)


def test_the_variables_of_a_two_machine_torchrun_become_the_machine_keys(tmp_path, monkeypatch):
    for name, value in {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29501",
                        "NPROC_PER_NODE": "2"}.items():
        monkeypatch.setenv(name, value)
    assert loaded(tmp_path).pipeline.num_machines == 1  # LLaMA-Factory reads them only with FORCE_TORCHRUN
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    pipe = loaded(tmp_path).pipeline
    assert (pipe.num_machines, pipe.machine_rank, pipe.main_process_ip, pipe.main_process_port,
            pipe.num_processes) == (2, 1, "10.0.0.5", 29501, 2)
    assert loaded(tmp_path, BASE + "num_processes: 1\n").pipeline.num_processes == 1  # the config's key wins
    monkeypatch.setenv("LOCAL_RANK", "0")  # inside a launched training process: its launcher's variables
    assert loaded(tmp_path).pipeline.num_machines == 1


def test_elastic_launch_and_ray_beside_torchrun_are_refused_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    monkeypatch.setenv("RDZV_ID", "job7")
    monkeypatch.setenv("MAX_RESTARTS", "3")
    with pytest.raises(ConfigError) as caught:
        loaded(tmp_path, BASE + "use_ray: true\n")
    message = str(caught.value)
    assert "RDZV_ID=job7, MAX_RESTARTS=3" in message and "ray_max_failures" in message
    assert "FORCE_TORCHRUN=1 and Ray both launch" in message

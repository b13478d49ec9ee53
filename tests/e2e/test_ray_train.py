"""The train step on a local Ray (Ray Train's TorchTrainer, 2 CPU workers over gloo), through the command the flow
runs, with DeepSpeed ZeRO-3 as LLaMA-Factory's ds_z3_config.json sets it: a worker SIGKILLed mid-run makes Ray restart
the group, whose children resume from the last complete checkpoint (DeepSpeed's own, its optimizer state in one
shard per process) and end with the losses and weights of an uninterrupted run of the same config at 2 processes
under `accelerate launch`. A local Ray costs about 5 s to start and each fit some 20 s here, so these stay few."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

import pytest

from tests.support.sft_runs import final_weights
from tests.support.training import REPO_ROOT, make_config, step_losses, train_step
from tuneline.pipeline.launch import launch_command
from tuneline.runtime.contract import read_run_file
from tuneline.train.checkpoints import checkpoint_step, complete_checkpoints

ZERO3 = REPO_ROOT / "examples" / "deepspeed" / "ds_z3_config.json"
SETTINGS = {"finetuning_type": "full", "learning_rate": 5e-3, "lr_scheduler_type": "linear", "warmup_steps": 2,
            "max_steps": 8, "save_steps": 2, "per_device_train_batch_size": 2, "max_samples": 64, "cutoff_len": 64,
            "deepspeed": str(ZERO3)}
WORKER_PID = re.compile(r"\(RayTrainWorker pid=(\d+)")


@pytest.fixture(autouse=True)
def local_ray(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def dataset(tiny_model_dir, tmp_path_factory) -> dict:
    from tuneline.data import build_dataset

    return build_dataset(make_config(tiny_model_dir, tmp_path_factory.mktemp("ray") / "unused", **SETTINGS))


def test_zero3_on_ray_restarts_a_killed_worker_and_ends_as_on_accelerate(tiny_model_dir, dataset, tmp_path):
    uninterrupted = make_config(tiny_model_dir, tmp_path / "accelerate", **SETTINGS, num_processes=2)
    reference = subprocess.Popen(launch_command(uninterrupted, _dump(uninterrupted, tmp_path / "a.yaml"),
                                                dataset["path"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = make_config(tiny_model_dir, tmp_path / "ray", **SETTINGS, ray_num_workers=2, ray_max_failures=1)
    lines: list[str] = []
    killed: list[int] = []

    def kill_a_worker_after_a_checkpoint():
        while not complete_checkpoints(config.output_dir):
            time.sleep(0.05)
        killed.append(checkpoint_step(complete_checkpoints(config.output_dir)[-1]))
        pid = next(int(m.group(1)) for line in lines if (m := WORKER_PID.search(line)))
        subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(pid)], check=True)  # the Ray worker itself

    killer = threading.Thread(target=kill_a_worker_after_a_checkpoint, daemon=True)
    killer.start()
    result = train_step(config, dataset, None, "ray-key", None, None, on_line=lines.append)
    killer.join(timeout=1)
    assert killed and killed[0] < 8, "killed too late to test the restart"
    run = read_run_file(config.output_dir)
    assert run["status"] == "complete" and run["resumed_step"] >= killed[0] and result.train_key == "ray-key"
    assert reference.wait() == 0
    for step in range(2, 9, 2):  # DeepSpeed's engine saved each checkpoint: one optimizer shard per worker
        shards = list((config.output_dir / f"checkpoint-{step}" / f"global_step{step}").glob("*optim_states.pt"))
        assert len(shards) == 2, (step, shards)
    expected_losses, got_losses = step_losses(tmp_path / "accelerate"), step_losses(config.output_dir)
    assert sorted(got_losses) == list(range(1, 9)) and len(set(expected_losses.values())) == 8
    for step, loss in expected_losses.items():
        assert got_losses[step] == pytest.approx(loss, rel=1e-6), step
    expected, got = final_weights(tmp_path / "accelerate"), final_weights(config.output_dir)
    assert expected.keys() == got.keys()  # ZeRO-3 gathered its partitions back into whole tensors
    for name, tensor in expected.items():
        assert got[name].shape == tensor.shape and (tensor - got[name]).abs().max().item() <= 1e-6, name
    assert not list(tmp_path.glob("ray/checkpoint-*/.tmp*"))


def _dump(config, path):
    from tuneline.config import dump_config

    return dump_config(config, path)


"""`python -m tuneline.train` as a real subprocess: exact resume after SIGKILL, errors, and 2-process training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.training import make_config, write_config
from tuneline.runtime.contract import read_run_file
from tuneline.train.checkpoints import checkpoint_step, complete_checkpoints

RESUME_SETTINGS = {"finetuning_type": "lora", "lora_rank": 4, "lora_dropout": 0.1, "learning_rate": 1e-2,
                   "lr_scheduler_type": "linear", "warmup_steps": 2, "max_steps": 10, "save_steps": 2,
                   "per_device_train_batch_size": 4, "max_samples": 64, "cutoff_len": 64}


@pytest.fixture(scope="module")
def sft_ref(tiny_model_dir, tmp_path_factory) -> dict:
    """The demo sft data built by the real data step (what the flow passes with --dataset)."""
    from tuneline.data import build_dataset

    root = tmp_path_factory.mktemp("entry")
    return build_dataset(make_config(tiny_model_dir, root / "unused", **RESUME_SETTINGS))


def train_cmd(config_path, dataset_path) -> list[str]:
    return [sys.executable, "-m", "tuneline.train", str(config_path), "--dataset", str(dataset_path)]


def log_records(output_dir) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]


def step_losses(output_dir) -> dict[int, float]:
    return {r["current_steps"]: r["loss"] for r in log_records(output_dir) if "loss" in r}


def adapter_weights(output_dir):
    from safetensors.torch import load_file

    return load_file(str(output_dir / "adapter_model.safetensors"))


def test_sigkill_then_resume_matches_an_uninterrupted_run(tiny_model_dir, sft_ref, tmp_path, empty_mlflow_store):
    """The killed start sent nothing to MLflow (here: it had no run to send to); the resumed one sends the steps
    its log holds up to the checkpoint, then its own: MLflow holds every step once."""
    import shutil

    from tuneline import tracking

    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.open_run(uri, "resume", "work-key", "resume test", {})
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    reference_cfg = write_config(tmp_path / "ref.yaml", tiny_model_dir, reference_dir, **RESUME_SETTINGS)
    killed_cfg = write_config(tmp_path / "kill.yaml", tiny_model_dir, killed_dir, **RESUME_SETTINGS)
    reference = subprocess.Popen(train_cmd(reference_cfg, sft_ref["path"]), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    victim = subprocess.Popen(train_cmd(killed_cfg, sft_ref["path"]), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    while victim.poll() is None and not complete_checkpoints(killed_dir):
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    killed_at = checkpoint_step(complete_checkpoints(killed_dir)[-1])
    assert read_run_file(killed_dir)["status"] == "running" and killed_at < 10, "killed too late to test resume"

    env = {**os.environ, "MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": uri}
    resumed = subprocess.run(train_cmd(killed_cfg, sft_ref["path"]), capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [step for step, _ in tracking.metric_history(uri, run_id, "loss")] == list(range(1, 11))
    assert reference.wait() == 0
    run = read_run_file(killed_dir)
    assert run["status"] == "complete" and run["resumed_step"] >= killed_at
    assert f"checkpoint-{run['resumed_step']}" in run["resumed_from"]

    expected, got = step_losses(reference_dir), step_losses(killed_dir)
    assert sorted(expected) == sorted(got) == list(range(1, 11))  # each step logged once, however often it ran
    for step in range(killed_at, 11):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    assert_same_weights(adapter_weights(reference_dir), adapter_weights(killed_dir))

    # launched again, it finds checkpoint-10 (= max_steps, mid-epoch) and must not train a step 11
    again = subprocess.run(train_cmd(killed_cfg, sft_ref["path"]), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    run = read_run_file(killed_dir)
    assert run["status"] == "complete" and run["resumed_step"] == 10 and run["global_step"] == 10
    assert max(step_losses(killed_dir)) == 10 and checkpoint_step(complete_checkpoints(killed_dir)[-1]) == 10
    assert_same_weights(adapter_weights(reference_dir), adapter_weights(killed_dir))


def assert_same_weights(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert (tensor - got[name]).abs().max().item() <= 1e-6, name


def test_user_errors_exit_2_with_one_message_that_the_launcher_carries(tiny_model_dir, sft_ref, tmp_path):
    from tuneline.pipeline.launch import TrainingFailed, run_streaming

    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"train_key": "someone-else"}))
    (out / "checkpoint-5").mkdir()
    cfg = write_config(tmp_path / "c.yaml", tiny_model_dir, out, max_steps=1)
    lines: list[str] = []
    with pytest.raises(TrainingFailed) as err:
        run_streaming(train_cmd(cfg, sft_ref["path"]), None, lines.append)
    assert err.value.returncode == 2
    assert "overwrite_output_dir" in str(err.value) and "Traceback" not in str(err.value)
    assert any("tuneline: error:" in line for line in lines)

    # through `accelerate launch`, whose own traceback follows the child's message: the message alone is kept
    from tuneline.config import load_config
    from tuneline.pipeline.launch import launch_command

    with pytest.raises(TrainingFailed) as err:
        run_streaming(launch_command(load_config(cfg, check_paths=False), cfg, sft_ref["path"]), None, lines.append)
    assert "overwrite_output_dir" in str(err.value) and "Traceback" not in str(err.value)


def test_two_cpu_processes_follow_the_one_process_loss_curve(tiny_model_dir, sft_ref, tmp_path):
    """Data parallel over gloo (2 processes x batch 2) against 1 process x batch 4: the same global batches, so the
    same losses. Started by the launcher's own `accelerate launch` command (ACCELERATE_USE_CPU + --multi_gpu)."""
    from tuneline.config import load_config
    from tuneline.pipeline.launch import launch_command, run_streaming

    lora = {k for k in RESUME_SETTINGS if k.startswith("lora_")}  # refused outside LoRA runs
    settings = {**{k: v for k, v in RESUME_SETTINGS.items() if k not in lora}, "finetuning_type": "full",
                "max_steps": 4, "save_steps": 100, "learning_rate": 5e-3, "lr_scheduler_type": "constant",
                "warmup_steps": 0}
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_cfg = write_config(tmp_path / "one.yaml", tiny_model_dir, one_dir, **settings)
    two_cfg = write_config(tmp_path / "two.yaml", tiny_model_dir, two_dir,
                           **{**settings, "per_device_train_batch_size": 2, "num_processes": 2})
    cmd = launch_command(load_config(two_cfg, check_paths=False), two_cfg, sft_ref["path"])
    assert cmd[:2] == ["env", "ACCELERATE_USE_CPU=true"] and "--multi_gpu" in cmd
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.Popen(train_cmd(one_cfg, sft_ref["path"]), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    lines: list[str] = []
    run_streaming(cmd, env, lines.append)
    assert single.wait() == 0
    state = json.loads((two_dir / "trainer_state.json").read_text())
    assert state["train_batch_size"] == 2  # per process: the 4 rows a step came from two processes
    one, two = step_losses(one_dir), step_losses(two_dir)
    assert log_records(two_dir)[-1]["total_tokens"] == log_records(one_dir)[-1]["total_tokens"]
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4), step
    assert len(set(one.values())) == 4  # the weights moved between steps, so the later steps compare training
    assert read_run_file(two_dir)["status"] == "complete"


def test_launch_command_uses_the_shipped_accelerate_and_deepspeed_configs(tiny_model_dir, tmp_path, monkeypatch):
    import yaml

    from tests.support.training import REPO_ROOT as repo
    from tuneline.pipeline.launch import launch_command
    from tuneline.train.training_args import translate_training_keys

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a 2-GPU machine, without needing one (no torch call)
    fsdp = f"{repo}/examples/accelerate/fsdp_config.yaml"
    config = make_config(tiny_model_dir, tmp_path / "out", accelerate_config=fsdp, num_processes=2)
    cmd = launch_command(config, tmp_path / "c.yaml")
    assert cmd[:4] == [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch"]  # accelerate launch
    assert cmd[cmd.index("--config_file") + 1] == fsdp and cmd[cmd.index("--num_processes") + 1] == "2"
    assert yaml.safe_load(Path(fsdp).read_text())["distributed_type"] == "FSDP"
    plain = launch_command(make_config(tiny_model_dir, tmp_path / "out"), tmp_path / "c.yaml")
    assert "--multi_gpu" in plain and plain[plain.index("--num_processes") + 1] == "2" and "env" not in plain
    ppo = launch_command(make_config(tiny_model_dir, tmp_path / "out", stage="ppo", reward_model=str(tiny_model_dir),
                                     reward_model_type="full"), tmp_path / "c.yaml")
    assert "--multi_gpu" in ppo and ppo[ppo.index("--num_processes") + 1] == "2"  # our PPO loop: data parallel too
    for name, stage in (("ds_z2_config", 2), ("ds_z3_config", 3), ("ds_z3_offload_config", 3)):
        path = f"{repo}/examples/deepspeed/{name}.json"
        assert json.loads(Path(path).read_text())["zero_optimization"]["stage"] == stage
        config = make_config(tiny_model_dir, tmp_path / "out", deepspeed=path)
        assert translate_training_keys(config.training)["deepspeed"] == path  # reaches TrainingArguments as is


def test_cpu_processes_get_the_cores_not_one_thread(tiny_model_dir, tmp_path, monkeypatch):
    """accelerate turns --num_cpu_threads_per_process into the child's OMP_NUM_THREADS; left out, it is 1."""
    from tuneline.pipeline.launch import launch_command

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever this machine has
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    for processes in (1, 2):
        cmd = launch_command(make_config(tiny_model_dir, tmp_path / "out", num_processes=processes), "c.yaml")
        assert cmd[cmd.index("--num_cpu_threads_per_process") + 1] == str(max(1, cores // processes))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    cmd = launch_command(make_config(tiny_model_dir, tmp_path / "out"), "c.yaml")
    assert cmd[cmd.index("--num_cpu_threads_per_process") + 1] == "3"


@pytest.mark.parametrize(("stage", "dataset", "data_dir"), [
    ("sft", "mllm_demo", "llamafactory/0.9.5/data"),
    ("dpo", "rlhf_v", "llamafactory-mm"),  # the reference live: the policy with its adapter off, on the images too
])
def test_a_killed_vision_training_resumes_exactly(tiny_vlm, tmp_path, stage, dataset, data_dir):
    """sft and dpo on image rows with a tiny Gemma 3, the images decoded by two DataLoader workers (the default for
    image rows): killed after a checkpoint, the same command ends as the uninterrupted run."""
    import yaml

    from tests.support.training import REPO_ROOT, config_values
    from tuneline.data import build_dataset

    model = tiny_vlm("gemma3")
    settings = {**RESUME_SETTINGS, "stage": stage, "dataset": dataset, "template": "gemma3", "cutoff_len": 512,
                "max_steps": 8, "per_device_train_batch_size": 2,
                "dataset_dir": str(REPO_ROOT / "tests" / "fixtures" / data_dir)}
    ref = build_dataset(make_config(model, tmp_path / "unused", **settings))
    configs = {}
    for name in ("reference", "killed"):
        values = config_values(model, tmp_path / name, **settings)
        del values["dataloader_num_workers"]  # the default for image rows
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump(values))
    reference = subprocess.Popen(train_cmd(configs["reference"], ref["path"]), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    victim = subprocess.Popen(train_cmd(configs["killed"], ref["path"]), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    killed_dir = tmp_path / "killed"
    while victim.poll() is None and not complete_checkpoints(killed_dir):
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    killed_at = checkpoint_step(complete_checkpoints(killed_dir)[-1])
    assert killed_at < 8, "killed too late to test resume"
    resumed = subprocess.run(train_cmd(configs["killed"], ref["path"]), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert reference.wait() == 0
    expected, got = step_losses(tmp_path / "reference"), step_losses(killed_dir)
    assert sorted(expected) == sorted(got) == list(range(1, 9))
    for step in range(killed_at, 9):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    assert_same_weights(adapter_weights(tmp_path / "reference"), adapter_weights(killed_dir))
    assert (killed_dir / "processor_config.json").is_file()

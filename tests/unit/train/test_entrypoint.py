"""`python -m tuneline.train` as a real subprocess: exact resume after SIGKILL, errors, and 2-process training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from train_helpers import make_config, write_config

from tuneline.train.checkpoints import checkpoint_step, complete_checkpoints
from tuneline.train.output_dir import read_run_file

pytestmark = pytest.mark.slow
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


def test_sigkill_then_resume_matches_an_uninterrupted_run(tiny_model_dir, sft_ref, tmp_path):
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

    resumed = subprocess.run(train_cmd(killed_cfg, sft_ref["path"]), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert reference.wait() == 0
    run = read_run_file(killed_dir)
    assert run["status"] == "complete" and run["resumed_step"] >= killed_at
    assert f"checkpoint-{run['resumed_step']}" in run["resumed_from"]

    expected, got = step_losses(reference_dir), step_losses(killed_dir)
    assert sorted(got) == list(range(1, 11))  # each step logged once, however often it ran
    for step in expected:
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
    ref_weights, resumed_weights = adapter_weights(reference_dir), adapter_weights(killed_dir)
    assert ref_weights.keys() == resumed_weights.keys()
    for name, tensor in ref_weights.items():
        assert (tensor - resumed_weights[name]).abs().max().item() <= 1e-6, name


def test_user_errors_exit_2_with_one_message_that_the_launcher_carries(tiny_model_dir, sft_ref, tmp_path):
    from tuneline.train.launch import TrainingFailed, run_streaming

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

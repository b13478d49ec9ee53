"""sft runs on the tiny model as the training child runs them, and the check that a run resumed from a checkpoint
continues exactly (losses and every final weight): shared by the optimizer, loss and profiler tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

DATA = Path(__file__).resolve().parents[2] / "data"


class SeenOptimizer(TrainerCallback):
    def __init__(self):
        self.optimizer = None

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
        self.optimizer = inner


def sft_config(tmp_path, model, out, **keys):
    from tuneline.config import load_config

    values = {"model_name_or_path": str(model), "dataset": "demo_sft", "dataset_dir": str(DATA), "max_samples": 16,
              "cutoff_len": 64, "output_dir": str(out), "pipeline_cache_dir": str(tmp_path / "cache"),
              "per_device_train_batch_size": 2, "learning_rate": 1e-2, "logging_steps": 1, "save_steps": 2,
              "max_steps": 4, "warmup_steps": 1, "lr_scheduler_type": "cosine", "seed": 0,
              "finetuning_type": "full", "dataloader_num_workers": 0, **keys}
    return load_config(None, values)


def sft_run(tmp_path, model, out, **keys):
    from tuneline.data import build_dataset
    from tuneline.train import sft

    config = sft_config(tmp_path, model, out, **keys)
    seen = SeenOptimizer()
    sft.run(config, build_dataset(config), [seen])
    logged = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    return seen.optimizer, {e["current_steps"]: e["loss"] for e in logged if "loss" in e}


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    name = "adapter_model.safetensors" if (out / "adapter_model.safetensors").is_file() else "model.safetensors"
    return load_file(str(out / name))


def resumed_exactly(tmp_path, model, **keys):
    """Trains 4 steps; trains again from the first run's checkpoint-2 into another folder; returns the optimizer of
    the first run once both agree on steps 3 and 4 and on every final weight."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    optimizer, losses = sft_run(tmp_path, model, whole, **keys)
    _, resumed_losses = sft_run(tmp_path, model, resumed, resume_from_checkpoint=str(whole / "checkpoint-2"), **keys)
    assert sorted(resumed_losses) == [3, 4]
    for step in (3, 4):
        assert resumed_losses[step] == pytest.approx(losses[step], rel=1e-6, abs=1e-7), step
    before, after = final_weights(whole), final_weights(resumed)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        torch.testing.assert_close(after[name], tensor, rtol=0, atol=0, msg=name)
    return optimizer, losses

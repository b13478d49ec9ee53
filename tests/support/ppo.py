"""What the PPO tests share: a config on the tiny model and a LoRA reward model the rm stage trained briefly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.config import load_config

DATA = Path(__file__).resolve().parents[2] / "data"


def make_config(model_dir, output_dir, cache_dir, **overrides):
    values = {"model_name_or_path": str(model_dir), "dataset_dir": str(DATA), "cutoff_len": 64,
              "pipeline_cache_dir": str(cache_dir), "output_dir": str(output_dir), "finetuning_type": "lora",
              "seed": 0, "disable_tqdm": True, "save_strategy": "no", "lr_scheduler_type": "constant", **overrides}
    return load_config(overrides=values)


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A LoRA reward model trained briefly by the rm stage on the demo pairs."""
    from tuneline.data import build_dataset
    from tuneline.train.rm import run

    root = tmp_path_factory.mktemp("rm")
    config = make_config(tiny_model_dir, root / "rm", root / "cache", stage="rm", dataset="demo_pref",
                         max_samples=128, per_device_train_batch_size=8, learning_rate=5e-3, max_steps=24,
                         logging_steps=8, eval_strategy="no")
    run(config, build_dataset(config), [])
    return root / "rm"


def ppo_config(tiny_model_dir, reward_model_dir, tmp_path, **overrides):
    values = {"stage": "ppo", "dataset": "demo_sft", "max_samples": 40, "val_size": 8, "reward_model":
              str(reward_model_dir), "reward_model_type": "lora", "per_device_train_batch_size": 4,
              "per_device_eval_batch_size": 8, "learning_rate": 3e-3, "max_steps": 3, "logging_steps": 1,
              "max_new_tokens": 4, "ppo_epochs": 1, **overrides}
    return make_config(tiny_model_dir, tmp_path / "ppo", tmp_path / "cache", **values)

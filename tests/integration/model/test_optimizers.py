"""LoRA+ learning rates and BAdam's block updates, on real optimizer steps and through the trainer that wires them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from tests.support.model_steps import changed, loss_of, snapshot
from tuneline.errors import ConfigError
from tuneline.model import badam_problems, create_badam_optimizer, create_loraplus_optimizer, load_model

DATA = Path(__file__).resolve().parents[3] / "data"


def _args(tmp_path, **kwargs):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)


def test_loraplus_gives_b_its_ratio_of_the_learning_rate(make_config, tokenizer, batch, tmp_path):
    config = make_config(loraplus_lr_ratio=16.0, lora_target="q_proj,v_proj")
    model = load_model(config, tokenizer)
    optimizer = create_loraplus_optimizer(model, _args(tmp_path, learning_rate=1e-3, optim="sgd"), config.finetuning)
    assert isinstance(optimizer, torch.optim.SGD)  # the `optim` the user chose, underneath
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    names = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(lr_of) == len(names)
    for name, param in names.items():
        assert lr_of[id(param)] == pytest.approx(16e-3 if "lora_B" in name else 1e-3), name
    # One real SGD step from non-zero B: each update is exactly -lr x grad with its group's lr.
    for param in names.values():
        torch.nn.init.normal_(param, std=0.1)
    before = snapshot(model)
    loss_of(model, batch).backward()
    grads = {n: p.grad.clone() for n, p in names.items()}
    optimizer.step()
    for name, param in names.items():
        want = before[name] - lr_of[id(param)] * grads[name]
        assert torch.allclose(param.detach(), want, atol=1e-7), name


def test_loraplus_needs_lora(make_config):
    with pytest.raises(ConfigError, match="'loraplus_lr_ratio' sets the learning rate of LoRA's B matrices"):
        make_config(finetuning_type="full", loraplus_lr_ratio=16.0)


def _block_of(names: set[str]) -> set[str]:
    return {n.split(".")[2] if n.startswith("model.layers.") else n for n in names}


def test_badam_layer_mode_updates_only_the_active_block(make_config, tokenizer, batch, tmp_path):
    config = make_config(finetuning_type="full", use_badam=True, badam_mode="layer", badam_switch_mode="ascending",
                         badam_start_block=0, badam_switch_interval=3)
    model = load_model(config, tokenizer)
    optimizer = create_badam_optimizer(model, _args(tmp_path, learning_rate=1e-2), config.finetuning)
    blocks = []
    for _ in range(7):
        before = snapshot(model)
        loss_of(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
        blocks.append(_block_of(changed(model, before)))
    # One whole layer per step; badam switches after its first interval's second step, then every 3 steps.
    assert blocks == [{"0"}, {"0"}, {"1"}, {"1"}, {"1"}, {"0"}, {"0"}]
    assert all(changed_params for changed_params in blocks)


def test_badam_ratio_mode_updates_a_fraction_of_each_weight(make_config, tokenizer, batch, tmp_path):
    config = make_config(finetuning_type="full", use_badam=True, badam_mode="ratio", badam_update_ratio=0.25)
    model = load_model(config, tokenizer)
    optimizer = create_badam_optimizer(model, _args(tmp_path, learning_rate=1e-2), config.finetuning)
    before = snapshot(model)
    loss_of(model, batch).backward()
    optimizer.step()
    weight = "model.layers.0.mlp.up_proj.weight"
    fraction = (model.get_parameter(weight) != before[weight]).float().mean().item()
    assert fraction == pytest.approx(0.25, abs=0.01)
    assert "model.embed_tokens.weight" not in changed(model, before)


class ChangedBlocks(TrainerCallback):
    """Records, for each training step, the layers (or other top-level parameters) whose weights it changed."""

    def __init__(self):
        self.steps: list[set[str]] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.before = snapshot(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.steps.append(_block_of(changed(model, self.before)))


def _sft_run(tmp_path, **keys):
    """The sft stage as a training process runs it, on 32 demo rows; returns the ChangedBlocks it was given."""
    from tuneline.config import load_config
    from tuneline.data import build_dataset
    from tuneline.train import sft

    values = {"model_name_or_path": str(keys.pop("model")), "dataset": "demo_sft", "dataset_dir": str(DATA),
              "max_samples": 32, "output_dir": str(tmp_path / "out"), "pipeline_cache_dir": str(tmp_path / "cache"),
              "per_device_train_batch_size": 4, "learning_rate": 1e-2, "logging_steps": 1, "save_strategy": "no",
              "seed": 0, "finetuning_type": "full", "use_badam": True, **keys}
    config = load_config(None, values)
    recorder = ChangedBlocks()
    sft.run(config, build_dataset(config), [recorder])
    return recorder, [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_sft_trainer_runs_badam_layer_mode(tiny_model_dir, tmp_path, checkpointing):
    """One layer trains per step and the block switches every `badam_switch_interval` steps, with gradient
    checkpointing (on by default) or without: badam's callback must not cut the gradients off."""
    recorder, _ = _sft_run(tmp_path, model=tiny_model_dir, max_steps=5, badam_mode="layer", badam_start_block=0,
                           badam_switch_mode="ascending", badam_switch_interval=2,
                           disable_gradient_checkpointing=not checkpointing)
    # badam switches when its step count + 1 is a multiple of the interval: after the first step, then every 2.
    assert recorder.steps == [{"0"}, {"1"}, {"1"}, {"0"}, {"0"}]


def test_the_sft_trainer_runs_badam_ratio_mode_with_clipping(tiny_model_dir, tmp_path):
    """Ratio mode's sparse gradients reach the optimizer through the Trainer's clipping (badam's replacement),
    and only a share of each layer's weights changes."""
    recorder, log = _sft_run(tmp_path, model=tiny_model_dir, max_steps=2, badam_mode="ratio",
                             badam_update_ratio=0.25, max_grad_norm=0.5)
    assert recorder.steps == [{"0", "1", "model.norm.weight"}] * 2  # not the embeddings, nor the output layer
    assert all(math.isfinite(entry["grad_norm"]) for entry in log if "loss" in entry)


def test_badam_across_processes_is_refused_before_anything_starts(make_config, tmp_path, monkeypatch):
    """badam runs in one process, or in several under DeepSpeed ZeRO-3 (layer mode): refused when the config plans
    processes (`num_processes`), when the launcher would start one per GPU, and in a training process of a
    launch with several (WORLD_SIZE), before the model loads."""
    from tuneline.pipeline.preflight import checked_config

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    badam = {"finetuning_type": "full", "use_badam": True}
    assert badam_problems(make_config(**badam)) == []
    with pytest.raises(ConfigError, match=r"'badam_mode: layer' on 2 process\(es\) needs DeepSpeed ZeRO-3 \(got no "):
        make_config(**badam, num_processes=2)
    with pytest.raises(ConfigError, match="'badam_mode: ratio' runs in one process without DeepSpeed"):
        make_config(**badam, badam_mode="ratio", num_processes=2)
    z2, z3 = tmp_path / "z2.json", tmp_path / "z3.json"
    z2.write_text('{"zero_optimization": {"stage": 2}}')
    z3.write_text('{"zero_optimization": {"stage": 3}}')
    with pytest.raises(ConfigError, match=r"needs DeepSpeed ZeRO-3 \(got ZeRO-2\)"):
        make_config(**badam, deepspeed=str(z2))
    assert badam_problems(make_config(**badam, deepspeed=str(z3), num_processes=2)) == []

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the launcher would start two processes
    with pytest.raises(ConfigError, match=r"on 2 process\(es\) needs DeepSpeed ZeRO-3"):
        checked_config(None, {"model_name_or_path": str(tmp_path), "dataset": "x", **badam})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a training process of a two-process launch
    with pytest.raises(ConfigError, match=r"on 2 process\(es\) needs DeepSpeed ZeRO-3"):
        make_config(**badam)

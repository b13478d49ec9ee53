"""LoRA+ learning rates and BAdam's block updates, each on real optimizer steps."""

from __future__ import annotations

import pytest
import torch
from model_test_helpers import changed, loss_of, snapshot

from tuneline.errors import ConfigError
from tuneline.model import badam_problems, create_badam_optimizer, create_loraplus_optimizer, load_model


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


def test_loraplus_needs_lora(make_config, tokenizer, tmp_path):
    config = make_config(finetuning_type="full", loraplus_lr_ratio=16.0)
    model = load_model(config, tokenizer)
    with pytest.raises(ConfigError, match="'loraplus_lr_ratio' applies to LoRA adapters"):
        create_loraplus_optimizer(model, _args(tmp_path), config.finetuning)


def _block_of(names: set[str]) -> set[str]:
    return {n.split(".")[2] if n.startswith("model.layers.") else n for n in names}


@pytest.mark.slow
def test_badam_layer_mode_updates_only_the_active_block(make_config, tokenizer, batch, tmp_path):
    config = make_config(finetuning_type="full", use_badam=True, badam_mode="layer", badam_switch_mode="ascending",
                         badam_start_block=0, badam_switch_interval=3)
    model = load_model(config, tokenizer)
    optimizer = create_badam_optimizer(model, _args(tmp_path, learning_rate=1e-2), config.finetuning, config)
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


@pytest.mark.slow
def test_badam_ratio_mode_updates_a_fraction_of_each_weight(make_config, tokenizer, batch, tmp_path):
    config = make_config(finetuning_type="full", use_badam=True, badam_mode="ratio", badam_update_ratio=0.25)
    model = load_model(config, tokenizer)
    optimizer = create_badam_optimizer(model, _args(tmp_path, learning_rate=1e-2), config.finetuning, config)
    before = snapshot(model)
    loss_of(model, batch).backward()
    optimizer.step()
    weight = "model.layers.0.mlp.up_proj.weight"
    fraction = (model.get_parameter(weight) != before[weight]).float().mean().item()
    assert fraction == pytest.approx(0.25, abs=0.01)
    assert "model.embed_tokens.weight" not in changed(model, before)


@pytest.mark.slow
def test_badam_trainer_patch_clips_and_trains(make_config, tokenizer, batch, tmp_path):
    from datasets import Dataset
    from transformers import Trainer

    from tuneline.model import prepare_trainer_for_badam

    config = make_config(finetuning_type="full", use_badam=True, badam_switch_interval=50, badam_start_block=1)
    model = load_model(config, tokenizer)
    args = _args(tmp_path, learning_rate=1e-2, max_steps=3, per_device_train_batch_size=2, max_grad_norm=0.5,
                 logging_steps=1, save_strategy="no")
    rows = {"input_ids": batch["input_ids"].tolist(), "labels": batch["input_ids"].tolist()}
    optimizer = create_badam_optimizer(model, args, config.finetuning, config)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict(rows), optimizers=(optimizer, None))
    prepare_trainer_for_badam(trainer)
    before = snapshot(model)
    trainer.train()
    assert _block_of(changed(model, before)) == {"1"}
    assert all("grad_norm" in entry for entry in trainer.state.log_history if "loss" in entry)


def test_badam_problems_name_what_it_cannot_serve(make_config, tmp_path):
    assert badam_problems(make_config(finetuning_type="full", use_badam=True)) == []
    ratio = make_config(finetuning_type="full", use_badam=True, badam_mode="ratio")
    assert "'badam_mode: ratio' runs in one process" in badam_problems(ratio, world_size=2)[0]
    z2 = tmp_path / "z2.json"
    z2.write_text('{"zero_optimization": {"stage": 2}}')
    layer = make_config(finetuning_type="full", use_badam=True, deepspeed=str(z2))
    assert "needs DeepSpeed ZeRO-3 (got ZeRO-2)" in badam_problems(layer, world_size=2)[0]
    z3 = tmp_path / "z3.json"
    z3.write_text('{"zero_optimization": {"stage": 3}}')
    assert badam_problems(make_config(finetuning_type="full", use_badam=True, deepspeed=str(z3)), world_size=2) == []

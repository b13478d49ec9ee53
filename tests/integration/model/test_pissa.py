"""PiSSA: trained by the stage trainer with `pissa_convert`, the adapter saved at the end is plain LoRA which,
applied to the original base weights, reproduces the trained model; and the keys where PiSSA would be ignored or
give a wrong reference are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from tests.support.model_steps import logits
from tuneline.errors import ConfigError, UserError
from tuneline.model import convert_pissa_adapter, load_model, pissa_init_dir

DATA = Path(__file__).resolve().parents[3] / "data"


class TrainedLogits(TrainerCallback):
    """The trained model's logits on a fixed batch, taken when training ends (before the final save)."""

    def __init__(self, batch):
        self.batch, self.logits = batch, None

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.logits = logits(model, self.batch)
        model.train()


@pytest.mark.parametrize("pissa_iter", [-1, 4])
def test_the_sft_trainer_saves_the_converted_adapter(tiny_model_dir, tokenizer, batch, tmp_path, pissa_iter):
    from tuneline.config import load_config
    from tuneline.data import build_dataset
    from tuneline.train import sft

    out = tmp_path / "out"
    base = {"model_name_or_path": str(tiny_model_dir), "dataset": "demo_sft", "dataset_dir": str(DATA),
            "max_samples": 32, "output_dir": str(out), "pipeline_cache_dir": str(tmp_path / "cache"), "max_steps": 4,
            "per_device_train_batch_size": 4, "learning_rate": 1e-2, "save_steps": 2, "lora_rank": 4, "seed": 0}
    config = load_config(None, {**base, "pissa_init": True, "pissa_iter": pissa_iter, "pissa_convert": True})
    trained = TrainedLogits(batch)
    sft.run(config, build_dataset(config), [trained])

    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["r"] == 8 and saved["init_lora_weights"] is True  # [A | A0], [B | -B0]: plain LoRA of rank 2r
    assert json.loads((out / "checkpoint-4" / "adapter_config.json").read_text())["r"] == 4  # resumable PiSSA
    assert (pissa_init_dir(out) / "adapter_model.safetensors").is_file()
    original = load_model(load_config(None, base), tokenizer, is_trainable=False)
    assert not torch.allclose(logits(original, batch), trained.logits, atol=1e-3)  # training moved the model
    converted = load_model(load_config(None, base), tokenizer, is_trainable=False, adapters=str(out))
    assert torch.allclose(logits(converted, batch), trained.logits, atol=1e-4)


def test_conversion_without_initial_state_is_a_clear_error(make_config, tokenizer, tmp_path):
    model = load_model(make_config(pissa_init=True, lora_rank=2, lora_target="q_proj"), tokenizer)
    with pytest.raises(UserError, match="initial state .* is missing"):
        convert_pissa_adapter(model, tmp_path / "final", tmp_path / "nowhere")


@pytest.mark.parametrize(("keys", "message"), [
    ({"pissa_convert": True}, "without 'pissa_init: true' the adapter is plain LoRA already"),
    ({"pissa_init": True, "finetuning_type": "full"}, "'pissa_init' needs 'finetuning_type: lora'"),
    ({"pissa_init": True, "stage": "kto"}, "'pissa_init' with 'stage: kto' and no 'ref_model'"),
    ({"pissa_init": True, "stage": "dpo"}, "'pissa_init' with 'stage: dpo' and no 'ref_model'"),
    ({"pissa_init": True, "adapter_name_or_path": "org/adapter"}, "the last adapter of 'adapter_name_or_path' keeps"),
])
def test_pissa_is_refused_where_it_would_be_ignored_or_wrong(make_config, keys, message):
    with pytest.raises(ConfigError, match=message):
        make_config(**keys)


def test_pissa_with_its_own_reference_model_is_accepted(make_config):
    make_config(pissa_init=True, stage="dpo", ref_model="org/base")
    make_config(pissa_init=True, stage="dpo", pref_loss="simpo")  # no reference at all
    make_config(pissa_init=True, adapter_name_or_path="org/adapter", create_new_adapter=True)

"""PiSSA: the trained adapter, converted to plain LoRA, reproduces the PiSSA-trained model on the original base."""

from __future__ import annotations

import pytest
import torch
from model_test_helpers import changed, logits, snapshot, train_steps

from tuneline.errors import UserError
from tuneline.model import PissaConvertCallback, convert_pissa_adapter, load_model, pissa_init_dir


@pytest.mark.slow
@pytest.mark.parametrize("pissa_iter", [-1, 4])
def test_converted_adapter_matches_the_pissa_model(make_config, tokenizer, batch, tmp_path, pissa_iter):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    config = make_config(pissa_init=True, pissa_iter=pissa_iter, pissa_convert=True, lora_rank=4)
    model = load_model(config, tokenizer)
    base = logits(load_model(make_config(), tokenizer, is_trainable=False), batch)
    assert torch.allclose(logits(model, batch), base, atol=1e-4)  # W_res + A0 B0 == W before training
    args = TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[])
    PissaConvertCallback().on_train_begin(args, TrainerState(), TrainerControl(), model=model)
    init_dir = pissa_init_dir(args.output_dir)
    assert (init_dir / "adapter_model.safetensors").is_file()

    before = snapshot(model)
    train_steps(model, batch)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed(model, before) == trainable
    trained = logits(model, batch)
    assert not torch.allclose(trained, base, atol=1e-3)

    convert_pissa_adapter(model, tmp_path / "final", init_dir)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable  # still training PiSSA
    assert torch.equal(logits(model, batch), trained)
    plain = load_model(make_config(), tokenizer, is_trainable=False, adapters=str(tmp_path / "final"))
    assert torch.allclose(logits(plain, batch), trained, atol=1e-4)


def test_conversion_without_initial_state_is_a_clear_error(make_config, tokenizer, tmp_path):
    model = load_model(make_config(pissa_init=True, lora_rank=2, lora_target="q_proj"), tokenizer)
    with pytest.raises(UserError, match="initial state .* is missing"):
        convert_pissa_adapter(model, tmp_path / "final", tmp_path / "nowhere")

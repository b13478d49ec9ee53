"""load_model: which parameters train for each finetuning type, LoRA options, adapters, reward models, errors."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.support.model_steps import changed, logits, loss_of, make_adapter, snapshot, train_steps
from tuneline.errors import ConfigError, UserError
from tuneline.model import count_parameters, load_model

LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def trainable_names(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_lora_trains_only_adapter_weights(make_config, tokenizer, batch):
    model = load_model(make_config(finetuning_type="lora"), tokenizer)
    trainable = trainable_names(model)
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    before = snapshot(model)
    train_steps(model, batch)
    assert changed(model, before) == trainable


@pytest.mark.parametrize(("keys", "expected"), [
    ({"freeze_trainable_layers": 1}, lambda n: n.startswith("model.layers.1.")),
    ({"freeze_trainable_layers": -1}, lambda n: n.startswith("model.layers.0.")),
    ({"freeze_trainable_layers": 2, "freeze_trainable_modules": "mlp", "freeze_extra_modules": "norm"},
     lambda n: ".mlp." in n or n == "model.norm.weight"),
    ({"freeze_trainable_layers": -1, "freeze_trainable_modules": "q_proj,post_attention_layernorm"},
     lambda n: n in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.post_attention_layernorm.weight")),
])
def test_freeze_trains_the_chosen_layers_and_modules(make_config, tokenizer, batch, keys, expected):
    model = load_model(make_config(finetuning_type="freeze", **keys), tokenizer)
    want = {n for n, _ in model.named_parameters() if expected(n)}
    assert want and trainable_names(model) == want
    before = snapshot(model)
    train_steps(model, batch)
    assert changed(model, before) == want


def test_full_trains_everything(make_config, tokenizer, batch):
    model = load_model(make_config(finetuning_type="full"), tokenizer)
    everything = {n for n, _ in model.named_parameters()}
    assert trainable_names(model) == everything
    before = snapshot(model)
    train_steps(model, batch)
    assert changed(model, before) == everything


def test_freeze_errors_name_the_key_and_valid_modules(make_config, tokenizer):
    with pytest.raises(ConfigError) as err:
        load_model(make_config(finetuning_type="freeze", freeze_trainable_modules="mpl", freeze_extra_modules="nrom"),
                   tokenizer)
    text = str(err.value)
    assert "'freeze_trainable_modules' names 'mpl'" in text and "did you mean 'mlp'" in text
    assert "'freeze_extra_modules' names 'nrom'" in text and "did you mean 'norm'" in text
    with pytest.raises(ConfigError, match="no trainable parameter"):
        load_model(make_config(finetuning_type="freeze", freeze_trainable_layers=0), tokenizer)


def _lora_modules(model) -> set[str]:
    return {n.split(".")[-1] for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}


def test_lora_target_all_versus_names(make_config, tokenizer):
    assert _lora_modules(load_model(make_config(lora_target="all"), tokenizer)) == LINEAR  # lm_head excluded
    assert _lora_modules(load_model(make_config(lora_target="q_proj,v_proj"), tokenizer)) == {"q_proj", "v_proj"}
    with pytest.raises(ConfigError, match="'lora_target' names 'q_prj'.*did you mean 'q_proj'"):
        load_model(make_config(lora_target="q_prj"), tokenizer)


def test_additional_target_trains_and_saves_the_module(make_config, tokenizer, batch, tmp_path):
    from safetensors.torch import load_file

    model = load_model(make_config(lora_target="q_proj", additional_target="lm_head"), tokenizer)
    head = {n for n in trainable_names(model) if "lm_head" in n}
    assert head == {"base_model.model.lm_head.modules_to_save.default.weight"}
    before = snapshot(model)
    train_steps(model, batch)
    assert head <= changed(model, before)
    model.save_pretrained(str(tmp_path / "adapter"))
    assert any("lm_head" in k for k in load_file(tmp_path / "adapter" / "adapter_model.safetensors"))


def test_rslora_and_dora_take_effect(make_config, tokenizer):
    q_proj = lambda m: m.base_model.model.model.layers[0].self_attn.q_proj  # noqa: E731
    plain = q_proj(load_model(make_config(lora_rank=4, lora_alpha=8), tokenizer))
    assert plain.scaling["default"] == pytest.approx(8 / 4)
    rs = q_proj(load_model(make_config(lora_rank=4, lora_alpha=8, use_rslora=True), tokenizer))
    assert rs.scaling["default"] == pytest.approx(8 / 4**0.5)
    dora = q_proj(load_model(make_config(use_dora=True), tokenizer))
    assert "default" in dora.lora_magnitude_vector and "default" not in getattr(plain, "lora_magnitude_vector", {})


def test_adapters_merge_all_but_the_last_when_training(make_config, tokenizer, batch, tiny_model_dir, tmp_path):
    first = make_adapter(tiny_model_dir, tmp_path / "a1", seed=1)
    second = make_adapter(tiny_model_dir, tmp_path / "a2", seed=2)
    both = f"{first},{second}"
    reference = logits(load_model(make_config(adapter_name_or_path=both), tokenizer, is_trainable=False), batch)
    assert not torch.allclose(reference, logits(load_model(make_config(), tokenizer, is_trainable=False), batch))
    resumed = load_model(make_config(adapter_name_or_path=both), tokenizer)
    assert torch.allclose(logits(resumed, batch), reference, atol=1e-5)
    assert trainable_names(resumed) and all("lora_" in n for n in trainable_names(resumed))
    assert _lora_modules(resumed) == {"q_proj", "v_proj"}  # the second adapter's own targets, still attached
    fresh = load_model(make_config(adapter_name_or_path=both, create_new_adapter=True), tokenizer)
    assert torch.allclose(logits(fresh, batch), reference, atol=1e-5)  # both merged, new adapter starts at zero
    assert _lora_modules(fresh) == LINEAR


def test_peft_reading_a_deprecated_property_leaves_no_notice_in_the_log(make_config, tokenizer, tiny_model_dir,
                                                                       tmp_path):
    """peft 0.21 asks transformers 5 `is_gradient_checkpointing` when it wraps a model; only that notice goes."""
    import warnings

    adapter = make_adapter(tiny_model_dir, tmp_path / "a1", seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_model(make_config(lora_rank=4), tokenizer)
        load_model(make_config(adapter_name_or_path=str(adapter)), tokenizer, is_trainable=False)
        warnings.warn("`is_gradient_checkpointing` elsewhere", FutureWarning, stacklevel=1)
    notices = [str(w.message) for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert notices == ["`is_gradient_checkpointing` elsewhere"]


def test_adapters_argument_overrides_the_config(make_config, tokenizer, batch, tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "a1", seed=1)
    config = make_config(adapter_name_or_path=str(adapter))
    with_adapter = logits(load_model(config, tokenizer, is_trainable=False), batch)
    without = logits(load_model(config, tokenizer, is_trainable=False, adapters=""), batch)
    base = logits(load_model(make_config(), tokenizer, is_trainable=False), batch)
    assert torch.equal(without, base) and not torch.allclose(with_adapter, base)


def test_value_head_gives_one_score_per_sequence(make_config, tokenizer):
    model = load_model(make_config(), tokenizer, add_valuehead=True, is_trainable=False)
    short = tokenizer(["hello there"], return_tensors="pt")
    padded = tokenizer(["hello there", "a much longer second sequence of text"], return_tensors="pt", padding=True)
    assert tokenizer.padding_side == "right" and padded["input_ids"][0, -1] == tokenizer.pad_token_id
    scores = logits(model, padded)
    assert scores.shape == (2, 1)
    assert torch.allclose(scores[0], logits(model, short)[0], atol=1e-5)  # read at the last real token


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_value_head_save_load_round_trip(make_config, tokenizer, batch, tmp_path, finetuning_type):
    from safetensors.torch import load_file

    model = load_model(make_config(finetuning_type=finetuning_type), tokenizer, add_valuehead=True)
    head = [n for n in trainable_names(model) if "score" in n]
    assert head
    before = snapshot(model)
    train_steps(model, batch)
    assert set(head) <= changed(model, before)
    trained = logits(model, batch)
    model.save_pretrained(str(tmp_path / "rm"))
    if finetuning_type == "lora":
        assert any("score" in k for k in load_file(tmp_path / "rm" / "adapter_model.safetensors"))
        reloaded = load_model(make_config(), tokenizer, is_trainable=False, add_valuehead=True,
                              adapters=str(tmp_path / "rm"))
    else:
        reloaded = load_model(make_config(model_name_or_path=str(tmp_path / "rm")), tokenizer,
                              is_trainable=False, add_valuehead=True)
    assert torch.allclose(logits(reloaded, batch), trained, atol=1e-5)


def test_counts_and_log_line(make_config, tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="tuneline"):
        model = load_model(make_config(lora_rank=4, lora_target="q_proj"), tokenizer)
    trainable, total = count_parameters(model)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    per_layer = 4 * (q_proj.in_features + q_proj.out_features)
    assert trainable == 2 * per_layer and total == sum(p.numel() for p in model.parameters())
    assert f"trainable params: {trainable:,} || all params: {total:,} || trainable%:" in caplog.text


def test_inference_load_freezes_everything(make_config, tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="tuneline"):
        model = load_model(make_config(finetuning_type="full"), tokenizer, is_trainable=False)
    trainable, total = count_parameters(model)
    assert trainable == 0 and not model.training
    assert f"all params: {total:,}" in caplog.text and "trainable params" not in caplog.text


def test_missing_model_path_is_a_clear_error(make_config, tokenizer, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(UserError, match=f"'model_name_or_path' path '{missing}' does not exist"):
        load_model(make_config(model_name_or_path=str(missing)), tokenizer)


def test_adapter_for_another_model_names_the_adapter(make_config, tokenizer, tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    other = AutoConfig.from_pretrained(tiny_model_dir)
    other.hidden_size, other.intermediate_size = 32, 64
    adapter = make_adapter(AutoModelForCausalLM.from_config(other), tmp_path / "wide-adapter")
    with pytest.raises(UserError) as err:
        load_model(make_config(adapter_name_or_path=str(adapter)), tokenizer)
    assert f"adapter '{adapter}' does not fit the base model" in str(err.value)
    (tmp_path / "not-adapter").mkdir()
    with pytest.raises(UserError, match="no adapter_config.json"):
        load_model(make_config(adapter_name_or_path=str(tmp_path / "not-adapter")), tokenizer)


def test_quantization_without_cuda_is_a_clear_error(make_config, tokenizer, monkeypatch):
    # Simulates a machine without a GPU, so the test means the same on a GPU runner.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="'quantization_bit: 4' quantizes through bitsandbytes, which needs a CUDA GPU"):
        load_model(make_config(quantization_bit=4), tokenizer)


def test_flash_attention_without_its_kernel_is_a_clear_error(make_config, tokenizer, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU, as above
    with pytest.raises(UserError, match="flash_attention_2"):
        load_model(make_config(attn_implementation="flash_attention_2"), tokenizer)


def mlp_calls_in_one_step(model, batch) -> int:
    """Forward calls of the last layer's MLP in one training step: 2 when the backward pass recomputes it."""
    mlp = [module for name, module in model.named_modules() if name.endswith(".mlp")][-1]
    calls = []
    hook = mlp.register_forward_hook(lambda *_: calls.append(1))
    try:
        train_steps(model, batch, steps=1)
    finally:
        hook.remove()
    return len(calls)


@pytest.mark.parametrize(("finetuning_type", "keys"), [
    ("lora", {}), ("freeze", {"freeze_trainable_layers": 1}), ("full", {})])
def test_gradient_checkpointing_is_on_by_default_and_every_finetuning_type_trains(make_config, tokenizer, batch,
                                                                                   finetuning_type, keys):
    """As in LLaMA-Factory: checkpointed unless turned off; frozen inputs (LoRA, freeze) still carry gradients."""
    config = make_config(finetuning_type=finetuning_type, **keys)
    assert not config.model.disable_gradient_checkpointing
    model = load_model(config, tokenizer)
    trainable = trainable_names(model)
    before = snapshot(model)
    assert mlp_calls_in_one_step(model, batch) == 2
    assert changed(model, before) == trainable
    for off in ({"disable_gradient_checkpointing": True}, {"gradient_checkpointing": False}):
        assert mlp_calls_in_one_step(load_model(make_config(finetuning_type=finetuning_type, **keys, **off),
                                                tokenizer), batch) == 1


def checkpoint_kind(model, batch) -> str:
    """The autograd node at a decoder layer's output: torch's reentrant checkpoint leaves its own."""
    layer = [module for name, module in model.named_modules() if name.endswith("layers.1")][0]
    seen = []
    hook = layer.register_forward_hook(lambda _m, _i, out: seen.append(type(out.grad_fn).__name__))
    try:
        model.train()
        loss_of(model, batch)
    finally:
        hook.remove()
    return "reentrant" if seen[0] == "CheckpointFunctionBackward" else "non-reentrant"


def test_reentrant_checkpointing_by_default_as_in_llamafactory_and_its_switches(make_config, tokenizer, batch,
                                                                              monkeypatch):
    def kind(**keys):
        return checkpoint_kind(load_model(make_config(finetuning_type="full", **keys), tokenizer), batch)

    assert kind() == "reentrant"
    assert kind(use_reentrant_gc=False) == "non-reentrant"
    assert kind(gradient_checkpointing_kwargs={"use_reentrant": False}) == "non-reentrant"
    every_other = load_model(make_config(finetuning_type="full", activation_checkpointing_kwargs={"every_n_layers": 2}),
                             tokenizer)
    assert mlp_calls_in_one_step(every_other, batch) == 1  # layers 0, 2, ... only: the last of two is not recomputed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU run, as on a machine without a GPU
    with pytest.raises(ConfigError, match="'offload: true' in the checkpointing kwargs .* needs a GPU"):
        load_model(make_config(gradient_checkpointing_kwargs={"offload": True}), tokenizer)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for an FSDP2 config
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert kind() == "non-reentrant"


def test_a_model_without_checkpointing_support_trains_without_it(make_config, tokenizer, batch, tmp_path, caplog):
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    gpt = tmp_path / "gpt"
    OpenAIGPTLMHeadModel(OpenAIGPTConfig(vocab_size=600, n_positions=64, n_embd=32, n_layer=1, n_head=2)
                         ).save_pretrained(str(gpt))
    with caplog.at_level(logging.WARNING, logger="tuneline"):
        model = load_model(make_config(model_name_or_path=str(gpt), finetuning_type="full", flash_attn="disabled"),
                           tokenizer)
    assert "OpenAIGPTLMHeadModel does not support it: training without it" in caplog.text
    assert "'disable_gradient_checkpointing: true'" in caplog.text
    before = snapshot(model)
    train_steps(model, batch, steps=1)
    assert changed(model, before) == trainable_names(model)


def test_added_special_tokens_grow_and_train_the_embeddings(make_config, batch):
    from tuneline.model import load_tokenizer

    config = make_config(add_special_tokens="<|tool|>,<|think|>", lora_target="q_proj")
    tokenizer = load_tokenizer(config.model)
    assert tokenizer.convert_tokens_to_ids("<|think|>") == 513 and len(tokenizer) == 514
    model = load_model(config, tokenizer)
    assert model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    saved = {n for n in trainable_names(model) if "modules_to_save" in n}
    assert {n.split(".")[-4] for n in saved} == {"embed_tokens", "lm_head"}
    before = snapshot(model)
    train_steps(model, {**batch, "input_ids": batch["input_ids"].clamp(max=513)}, steps=1)
    assert saved <= changed(model, before)

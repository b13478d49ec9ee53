"""The token keys as a run loads its tokenizer and model: `add_tokens` (ordinary tokens) and the special tokens of
`new_special_tokens_config` join the tokenizer; the embeddings grow to a multiple of 64 rows, started as
`init_special_tokens` says (LLaMA-Factory's noisy mean, or a described token's mean description embedding);
`model_max_length` raises the tokenizer's; `use_kv_cache` sets the cache of a model loaded to generate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tuneline.config import load_config
from tuneline.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "data"
DESCRIPTIONS = "<|svg_start|>: the beginning of a picture\n<|svg_end|>: the end of a picture\n"


def _config(tiny_model_dir, tmp_path, **keys):
    return load_config(None, {"model_name_or_path": str(tiny_model_dir), "dataset": "demo_sft",
                              "dataset_dir": str(DATA), "output_dir": str(tmp_path / "out"), **keys})


def _loaded(config, is_trainable=True):
    from tuneline.model import load_model, load_tokenizer

    tokenizer = load_tokenizer(config.model)
    return tokenizer, load_model(config, tokenizer, is_trainable=is_trainable)


def test_described_tokens_start_from_their_descriptions_and_the_others_from_the_noisy_mean(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tmp_path / "tokens.yaml").write_text(DESCRIPTIONS)
    config = _config(tiny_model_dir, tmp_path, add_tokens="svgpath,svgfill", finetuning_type="full",
                     new_special_tokens_config=str(tmp_path / "tokens.yaml"), init_special_tokens="desc_init")
    tokenizer, model = _loaded(config)
    base_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir).get_input_embeddings().weight.detach()
    ids = tokenizer.convert_tokens_to_ids(["svgpath", "svgfill", "<|svg_start|>", "<|svg_end|>"])
    assert ids == list(range(len(base_tokenizer), len(base_tokenizer) + 4))
    assert {"<|svg_start|>", "<|svg_end|>"} <= set(tokenizer.all_special_tokens)
    assert "svgpath" not in tokenizer.all_special_tokens
    weight = model.get_input_embeddings().weight.detach()
    assert weight.shape[0] % 64 == 0 and weight.shape[0] >= len(tokenizer)
    torch.testing.assert_close(weight[: old.shape[0]], old)
    for token, text in (("<|svg_start|>", "the beginning of a picture"), ("<|svg_end|>", "the end of a picture")):
        described = old[base_tokenizer(text, add_special_tokens=False)["input_ids"]].mean(dim=0)
        torch.testing.assert_close(weight[tokenizer.convert_tokens_to_ids(token)], described)
    noisy = weight[old.shape[0]:][[i - old.shape[0] for i in range(old.shape[0], weight.shape[0]) if i not in ids[2:]]]
    assert (noisy - old.mean(dim=0)).std().item() == pytest.approx(1 / math.sqrt(weight.shape[1]), rel=0.1)


def test_noise_init_and_lora_train_and_save_the_grown_embeddings(tiny_model_dir, tmp_path):
    tokenizer, model = _loaded(_config(tiny_model_dir, tmp_path, add_tokens="svgpath"))
    saved = model.peft_config["default"].modules_to_save or []
    assert any("embed_tokens" in name for name in saved)  # the new rows train and are saved with the adapter


def test_model_max_length_raises_the_tokenizers_and_bounds_cutoff_len(tiny_model_dir, tmp_path):
    from tuneline.model import load_tokenizer

    config = _config(tiny_model_dir, tmp_path, model_max_length=10**9, cutoff_len=64)
    assert load_tokenizer(config.model).model_max_length == 10**9
    with pytest.raises(ConfigError, match="'cutoff_len: 4096' is above 'model_max_length: 2048'"):
        _config(tiny_model_dir, tmp_path, model_max_length=2048, cutoff_len=4096)


@pytest.mark.parametrize("enabled", [True, False])
def test_use_kv_cache_is_the_cache_switch_of_a_model_loaded_to_generate(tiny_model_dir, tmp_path, enabled):
    _, model = _loaded(_config(tiny_model_dir, tmp_path, use_kv_cache=enabled), is_trainable=False)
    assert model.config.use_cache is enabled and model.generation_config.use_cache is enabled


@pytest.mark.parametrize(("keys", "refused"), [
    ({"init_special_tokens": "desc_init"}, "'init_special_tokens: desc_init' starts each new token's embedding from "
                                           "its description, and there are none"),
    ({"new_special_tokens_config": "<yaml>", "add_special_tokens": "<a>"},
     "'new_special_tokens_config' and 'add_special_tokens' both name the special tokens to add"),
    ({"new_special_tokens_config": "<list>"}, "must map each new special token to a description"),
    ({"new_special_tokens_config": "<missing>"}, "cannot be read"),
])
def test_token_keys_that_cannot_work_are_refused(tiny_model_dir, tmp_path, keys, refused):
    (tmp_path / "tokens.yaml").write_text(DESCRIPTIONS)
    (tmp_path / "list.yaml").write_text("- <|a|>\n- <|b|>\n")
    places = {"<yaml>": tmp_path / "tokens.yaml", "<list>": tmp_path / "list.yaml", "<missing>": tmp_path / "no.yaml"}
    keys = {key: str(places.get(value, value)) for key, value in keys.items()}
    with pytest.raises(ConfigError, match=refused):
        _config(tiny_model_dir, tmp_path, **keys)


def test_edited_descriptions_change_the_models_key(tiny_model_dir, tmp_path):
    """The same file with other descriptions starts the new rows elsewhere: a cached training must not stand for it."""
    from tuneline.model.fingerprint import model_fingerprint

    (tmp_path / "tokens.yaml").write_text(DESCRIPTIONS)
    config = _config(tiny_model_dir, tmp_path, new_special_tokens_config=str(tmp_path / "tokens.yaml"),
                     init_special_tokens="desc_init")
    before = model_fingerprint(config)
    (tmp_path / "tokens.yaml").write_text(DESCRIPTIONS.replace("picture", "drawing"))
    assert model_fingerprint(config) != before

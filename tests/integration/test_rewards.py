"""Reward models from LLaMA-Factory: a causal LM (full or LoRA) with value_head.safetensors loads as our reward
model and scores as LLaMA-Factory scores (the value head on the last real token's last hidden state); a folder
that is neither tuneline's nor LLaMA-Factory's reward model is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuneline.config import load_config
from tuneline.errors import ConfigError

HEAD_KEYS = ("v_head.summary.weight", "v_head.summary.bias")  # trl's AutoModelForCausalLMWithValueHead names


def random_head(hidden: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {HEAD_KEYS[0]: torch.randn(1, hidden, generator=generator),
            HEAD_KEYS[1]: torch.randn(1, generator=generator)}


def save_llamafactory_rm(model, tokenizer, folder: Path, head: dict, bin_format: bool = False) -> Path:
    """The folder LLaMA-Factory's rm stage leaves: the decoder (or its adapter), the tokenizer, the value head."""
    from safetensors.torch import save_file

    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    if bin_format:
        torch.save(head, folder / "value_head.bin")
    else:
        save_file(head, str(folder / "value_head.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def full_rm(tiny_model_dir, tokenizer, tmp_path_factory) -> Path:
    """A full LLaMA-Factory reward model: the tiny Llama with changed weights, and its value head."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # not the base model any more
    return save_llamafactory_rm(model, tokenizer, tmp_path_factory.mktemp("lf") / "rm_full",
                                random_head(model.config.hidden_size))


@pytest.fixture(scope="module")
def lora_rm(tiny_model_dir, tokenizer, tmp_path_factory) -> Path:
    """A LoRA LLaMA-Factory reward model: a causal-LM adapter (random, non-zero) and its value head."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, init_lora_weights=False,
                                            target_modules=["q_proj", "v_proj"]))
    return save_llamafactory_rm(model, tokenizer, tmp_path_factory.mktemp("lf") / "rm_lora",
                                random_head(base.config.hidden_size, seed=1))


def ppo_config(tiny_model_dir, reward_model, tmp_path, **keys):
    return load_config(None, {"model_name_or_path": str(tiny_model_dir), "stage": "ppo", "dataset": "unused",
                              "output_dir": str(tmp_path / "out"), "reward_model": str(reward_model), **keys},
                       check_paths=False)


def right_padded(tokenizer, texts):
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert tokenizer.padding_side == "right" and (batch["attention_mask"] == 0).any()
    return batch


def llamafactory_scores(causal_lm, head: dict, batch) -> torch.Tensor:
    """What LLaMA-Factory computes: trl's value head on the last hidden state, read at attention_mask.sum() - 1."""
    with torch.no_grad():
        hidden = causal_lm(**batch, output_hidden_states=True).hidden_states[-1]
    last = batch["attention_mask"].sum(-1) - 1
    return hidden[torch.arange(len(last)), last] @ head[HEAD_KEYS[0]][0] + head[HEAD_KEYS[1]][0]


def scores_of(config, tokenizer, batch) -> torch.Tensor:
    from tuneline.model import load_tokenizer
    from tuneline.objectives.rewards import load_reward_model, sequence_scores

    ours = load_tokenizer(config.model)
    assert ours.get_vocab() == tokenizer.get_vocab()
    model = load_reward_model(config, ours)
    with torch.no_grad():
        return sequence_scores(model, batch["input_ids"], batch["attention_mask"])


TEXTS = ["hello there", "a much longer second sequence of text to score", "short"]


def test_a_full_llamafactory_reward_model_scores_as_llamafactory_does(tiny_model_dir, tokenizer, full_rm, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    batch = right_padded(tokenizer, TEXTS)
    head = load_file(full_rm / "value_head.safetensors")
    expected = llamafactory_scores(AutoModelForCausalLM.from_pretrained(full_rm).eval(), head, batch)
    scores = scores_of(ppo_config(tiny_model_dir, full_rm, tmp_path, reward_model_type="full"), tokenizer, batch)
    assert torch.allclose(scores, expected, atol=1e-5)
    base = llamafactory_scores(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), head, batch)
    assert not torch.allclose(scores, base, atol=1e-3)  # the reward model's own weights, not the base model's


def test_a_lora_llamafactory_reward_model_scores_as_llamafactory_does(tiny_model_dir, tokenizer, lora_rm, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    batch = right_padded(tokenizer, TEXTS)
    head = load_file(lora_rm / "value_head.safetensors")
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(lora_rm))
    expected = llamafactory_scores(with_adapter.eval(), head, batch)
    scores = scores_of(ppo_config(tiny_model_dir, lora_rm, tmp_path, reward_model_type="lora"), tokenizer, batch)
    assert torch.allclose(scores, expected, atol=1e-5)
    # LLaMA-Factory's other spelling: the base as a full reward model, the head beside its last adapter
    as_full = ppo_config(tiny_model_dir, tiny_model_dir, tmp_path, reward_model_type="full",
                         reward_model_adapters=str(lora_rm))
    assert torch.allclose(scores_of(as_full, tokenizer, batch), expected, atol=1e-5)
    with with_adapter.disable_adapter():
        assert not torch.allclose(scores, llamafactory_scores(with_adapter, head, batch), atol=1e-3)


def test_a_value_head_saved_as_bin_scores_the_same(tiny_model_dir, tokenizer, full_rm, tmp_path):
    import shutil

    from safetensors.torch import load_file

    as_bin = tmp_path / "rm_bin"
    shutil.copytree(full_rm, as_bin)
    (as_bin / "value_head.safetensors").unlink()
    torch.save(load_file(full_rm / "value_head.safetensors"), as_bin / "value_head.bin")
    batch = right_padded(tokenizer, TEXTS)
    full = ppo_config(tiny_model_dir, full_rm, tmp_path, reward_model_type="full")
    binary = ppo_config(tiny_model_dir, as_bin, tmp_path, reward_model_type="full")
    assert torch.equal(scores_of(full, tokenizer, batch), scores_of(binary, tokenizer, batch))


def test_a_folder_that_is_no_reward_model_is_refused(tiny_model_dir, tokenizer, tmp_path):
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    from tuneline.objectives.rewards import load_reward_model

    plain = tmp_path / "plain"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(str(plain))
    with pytest.raises(ConfigError, match=r"'reward_model: .*plain' is a LlamaForCausalLM, not a reward model: "
                                          r"tuneline's .* or LLaMA-Factory's \(value_head.safetensors"):
        load_reward_model(ppo_config(tiny_model_dir, plain, tmp_path, reward_model_type="full"), tokenizer)
    adapter = tmp_path / "sft_adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                   LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, target_modules=["q_proj"])).save_pretrained(
        str(adapter))
    with pytest.raises(ConfigError, match="is a LoRA adapter for CAUSAL_LM, not a reward model"):
        load_reward_model(ppo_config(tiny_model_dir, adapter, tmp_path, reward_model_type="lora"), tokenizer)


@pytest.mark.parametrize(("head", "message"), [
    ({"summary.weight": torch.zeros(1, 64)}, "holds no LLaMA-Factory value head: it needs 'v_head.summary.weight'"),
    (random_head(32), r"weight \(1, 32\) .* the model's hidden size is 64 .* trained on another base model"),
])
def test_a_value_head_that_does_not_fit_is_refused(tiny_model_dir, tokenizer, tmp_path, head, message):
    from transformers import AutoModelForCausalLM

    from tuneline.objectives.rewards import load_reward_model

    folder = save_llamafactory_rm(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, tmp_path / "rm",
                                  head)
    with pytest.raises(ConfigError, match=message):
        load_reward_model(ppo_config(tiny_model_dir, folder, tmp_path, reward_model_type="full"), tokenizer)
    (folder / "value_head.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="is not a readable value head"):
        load_reward_model(ppo_config(tiny_model_dir, folder, tmp_path, reward_model_type="full"), tokenizer)


def test_an_api_reward_model_is_refused_when_the_config_is_read(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="'reward_model_type' is 'api'; allowed values: lora, full"):
        ppo_config(tiny_model_dir, "http://localhost:8000/v1/score", tmp_path, reward_model_type="api")


def test_ppo_trains_against_a_llamafactory_reward_model(tiny_model_dir, lora_rm, tmp_path):
    """The path a user takes: `stage: ppo` with `reward_model` set to LLaMA-Factory's output_dir."""
    import math

    from tuneline.data import build_dataset
    from tuneline.train.ppo import run

    data = Path(__file__).resolve().parents[2] / "data"
    config = load_config(None, {
        "model_name_or_path": str(tiny_model_dir), "stage": "ppo", "dataset": "demo_sft", "dataset_dir": str(data),
        "max_samples": 12, "val_size": 4, "cutoff_len": 64, "reward_model": str(lora_rm), "reward_model_type": "lora",
        "output_dir": str(tmp_path / "ppo"), "pipeline_cache_dir": str(tmp_path / "cache"), "max_steps": 2,
        "per_device_train_batch_size": 4, "max_new_tokens": 4, "ppo_epochs": 1, "logging_steps": 1, "seed": 0,
        "save_strategy": "no", "disable_tqdm": True})
    result = run(config, build_dataset(config), [])
    assert result["global_step"] == 2 and math.isfinite(result["metrics"]["eval_reward"])

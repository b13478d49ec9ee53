"""The models PPO needs beside the policy: a value head on the policy's last hidden state, the frozen reward
model (`reward_model`, a full model or a LoRA adapter trained by `stage: rm`), and the reference.

The reward model is what `tuneline.train.rm` saves: `AutoModelForSequenceClassification` with one label (a full
folder, or a SEQ_CLS LoRA adapter whose `score` head is saved beside it), scored at the last real token.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from tuneline.errors import ConfigError

VALUE_HEAD_FILE = "value_head.pt"


class ValueHead(torch.nn.Module):
    """Linear(hidden, 1) on the policy's last hidden state: the value of the state before each token."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.normal_(self.summary.weight, std=1.0 / (hidden_size + 1))
        torch.nn.init.zeros_(self.summary.bias)

    def forward(self, hidden):
        return self.summary(hidden.float()).squeeze(-1)


def reward_config(config):
    """A copy of the run config whose model is the reward model, with its adapters merged in."""
    ft = config.finetuning
    rcfg = copy.deepcopy(config)
    if ft.reward_model_type == "full":
        rcfg.model.model_name_or_path = ft.reward_model
        rcfg.model.adapter_name_or_path = ft.reward_model_adapters
        rcfg.finetuning.finetuning_type = "full"
    else:  # a LoRA adapter on the policy's base model (and the adapters the base carries)
        existing = [a for a in (config.model.adapter_name_or_path or "").split(",") if a.strip()]
        rcfg.model.adapter_name_or_path = ",".join([*existing, ft.reward_model])
    rcfg.model.quantization_bit = None
    return rcfg


def check_reward_tokenizer(config, tokenizer) -> None:
    """The reward model reads the policy's token ids, so both must share one vocabulary."""
    from transformers import AutoTokenizer

    folder = Path(config.finetuning.reward_model)
    if not (folder / "tokenizer_config.json").is_file():
        return  # nothing saved beside it: it uses the base model's tokenizer
    theirs = AutoTokenizer.from_pretrained(str(folder))
    if theirs.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"'reward_model: {folder}' has a tokenizer that does not match the policy's "
                          f"('{config.model.model_name_or_path}'): train the reward model on the same base model")


def load_reward_model(config, tokenizer):
    """The frozen reward model, in eval mode."""
    from tuneline.model import load_model

    ft = config.finetuning
    if not ft.reward_model and config.pipeline.reward_model_config:
        raise ConfigError("'reward_model_config' is trained by the flow (`tuneline train`); outside it, train that "
                          "config and set 'reward_model' to its output_dir")
    if not ft.reward_model:
        raise ConfigError("'stage: ppo' needs 'reward_model' (a reward model path or adapter trained with stage: rm)")
    if not Path(ft.reward_model).exists():
        raise ConfigError(f"'reward_model: {ft.reward_model}' does not exist; train one with 'stage: rm'")
    is_adapter = (Path(ft.reward_model) / "adapter_config.json").is_file()
    if is_adapter != (ft.reward_model_type == "lora"):
        kind = "a LoRA adapter" if is_adapter else "a full model"
        raise ConfigError(f"'reward_model: {ft.reward_model}' is {kind} but 'reward_model_type' is "
                          f"'{ft.reward_model_type}'; set 'reward_model_type: {'lora' if is_adapter else 'full'}'")
    check_reward_tokenizer(config, tokenizer)
    rcfg = reward_config(config)
    return load_model(rcfg, tokenizer, is_trainable=False, add_valuehead=True).eval()


def load_reference(config, tokenizer, policy):
    """(reference model, context manager factory): a frozen copy or `ref_model`, or for LoRA without
    `ref_model` the policy itself with its adapter disabled."""
    from contextlib import nullcontext

    from tuneline.reference import load_reference_model

    reference = load_reference_model(config, tokenizer)
    if reference is not None:
        return reference.eval(), nullcontext
    return policy, policy.disable_adapter


def load_value_head(policy, folder: Path | None) -> ValueHead:
    hidden = policy.config.hidden_size
    head = ValueHead(hidden)
    if folder is not None and (folder / VALUE_HEAD_FILE).is_file():
        head.load_state_dict(torch.load(folder / VALUE_HEAD_FILE, map_location="cpu"))
    return head

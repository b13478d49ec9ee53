"""The models PPO needs beside the policy: a value head on the policy's last hidden state and the frozen
reference; and the files the policy and its value head are saved in (output_dir and checkpoints). The reward model
loads through `tuneline.objectives.rewards`, which the evaluation shares.
"""

from __future__ import annotations

from pathlib import Path

import torch

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


def load_reference(config, tokenizer, policy):
    """(reference model, context manager factory): a frozen copy or `ref_model`, or for LoRA without
    `ref_model` the policy itself with its adapter disabled."""
    from contextlib import nullcontext

    from tuneline.reference import load_reference_model

    reference = load_reference_model(config, tokenizer)
    if reference is not None:
        return reference.eval(), nullcontext
    return policy, policy.disable_adapter


def save_policy(policy, tokenizer, head, folder: Path) -> None:
    """The policy as `save_pretrained` writes it (for LoRA the adapter), its tokenizer and the value head."""
    folder.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    torch.save(head.state_dict(), folder / VALUE_HEAD_FILE)


def load_policy(policy, head, folder: Path) -> None:
    """What `save_policy` wrote in `folder` (a checkpoint), loaded into the policy and value head training goes on
    with."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter = folder / "adapter_model.safetensors"
    if adapter.is_file():
        set_peft_model_state_dict(policy, load_file(str(adapter)))
    else:
        weights = {}
        for shard in sorted(folder.glob("model*.safetensors")):
            weights.update(load_file(str(shard)))
        policy.load_state_dict(weights, strict=False)
    head.load_state_dict(torch.load(folder / VALUE_HEAD_FILE, map_location="cpu", weights_only=True))

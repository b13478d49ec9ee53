"""The models PPO needs beside the policy: a value head on the policy's last hidden state and the frozen
reference. The reward model loads through `tuneline.rewards`, which the evaluation shares.
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


def load_value_head(policy, folder: Path | None) -> ValueHead:
    hidden = policy.config.hidden_size
    head = ValueHead(hidden)
    if folder is not None and (folder / VALUE_HEAD_FILE).is_file():
        head.load_state_dict(torch.load(folder / VALUE_HEAD_FILE, map_location="cpu", weights_only=True))
    return head

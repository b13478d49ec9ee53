"""Helpers for the model tests: parameter snapshots and real optimizer steps."""

from __future__ import annotations


def snapshot(model) -> dict:
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def changed(model, before: dict) -> set[str]:
    import torch

    return {name for name, param in model.named_parameters() if not torch.equal(param.detach(), before[name])}


def loss_of(model, batch):
    """Causal-LM loss on the batch, or the summed score of a one-label (reward) model."""
    out = model(**batch, labels=batch["input_ids"]) if not _is_scorer(model) else model(**batch)
    return out.loss if not _is_scorer(model) else out.logits.sum()


def _is_scorer(model) -> bool:
    return getattr(model.config, "num_labels", 2) == 1 and "SequenceClassification" in type(
        getattr(model, "get_base_model", lambda: model)()).__name__


def train_steps(model, batch, steps: int = 3, lr: float = 1e-2, optimizer=None) -> None:
    import torch

    optimizer = optimizer or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        loss_of(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()


def logits(model, batch):
    import torch

    model.eval()
    with torch.no_grad():
        return model(**batch).logits


def make_adapter(base_dir, out_dir, seed: int = 0, targets=("q_proj", "v_proj"), **config_overrides):
    """Save a LoRA adapter with random (non-zero) A and B for the model in `base_dir`, so it changes the logits."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir) if not hasattr(base_dir, "config") else base_dir
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets),
                                                  init_lora_weights=False, **config_overrides))
    peft_model.save_pretrained(str(out_dir))
    return out_dir

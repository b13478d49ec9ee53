"""Muon and Adam-mini as LLaMA-Factory builds them (use_muon, use_adam_mini).

Muon: torch.optim.Muon on the 2-D weights that are neither embeddings nor the output layer, with LLaMA-Factory's
settings (momentum 0.95, Nesterov, 5 Newton-Schulz steps, its learning rate scaled by 0.2 * sqrt(max(rows, cols))
to match AdamW's update size: torch's `adjust_lr_fn="match_rms_adamw"`), and AdamW on every other parameter. torch
keeps Muon's momentum as an average where LLaMA-Factory keeps a sum: the two differ by a constant factor, which the
orthogonalization normalizes away. Adam-mini: the adam-mini package, told the model's width and heads."""

from __future__ import annotations

from tuneline.errors import UserError
from tuneline.model.optimizer_set import OptimizerSet


def muon_parameters(model) -> tuple[list, list]:
    """(Muon's parameters, AdamW's): trainable 2-D weights outside embeddings and the output layer go to Muon."""
    muon, adamw = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (muon if param.ndim == 2 and "embed" not in name and "lm_head" not in name else adamw).append(param)
    return muon, adamw


def create_muon_optimizer(model, training_args, finetuning_args=None):
    import torch

    muon, adamw = muon_parameters(model)
    lr, wd = training_args.learning_rate, training_args.weight_decay
    optimizers = []
    if muon:
        optimizers.append(torch.optim.Muon(muon, lr=lr, weight_decay=wd, momentum=0.95, nesterov=True, ns_steps=5,
                                           adjust_lr_fn="match_rms_adamw"))
    if adamw:
        optimizers.append(torch.optim.AdamW(adamw, lr=lr, weight_decay=wd, eps=training_args.adam_epsilon,
                                            betas=(training_args.adam_beta1, training_args.adam_beta2)))
    return OptimizerSet(optimizers)


def create_adam_mini_optimizer(model, training_args, finetuning_args=None):
    from transformers.integrations import is_deepspeed_zero3_enabled
    from transformers.modeling_utils import is_fsdp_enabled

    try:
        from adam_mini import Adam_mini
    except ImportError:
        raise UserError("'use_adam_mini: true' needs the adam-mini package: `pip install -e '.[adam-mini]'`") from None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return Adam_mini(
        named_parameters=model.named_parameters(), lr=training_args.learning_rate,
        betas=(training_args.adam_beta1, training_args.adam_beta2), eps=training_args.adam_epsilon,
        weight_decay=training_args.weight_decay, model_sharding=is_fsdp_enabled() or is_deepspeed_zero3_enabled(),
        dim=getattr(config, "hidden_size", None), n_heads=getattr(config, "num_attention_heads", None),
        n_kv_heads=getattr(config, "num_key_value_heads", None), verbose=False)

"""Custom optimizers (LoRA+, BAdam) for `Trainer.create_optimizer`, and PPO's loop optimizer built as the Trainer
would build it. All build on `Trainer.get_optimizer_cls_and_kwargs`, so every `optim` transformers offers works."""

from __future__ import annotations

import sys

from tuneline.config.ppo_keys import TRAINER_ONLY_OPTIMIZERS
from tuneline.config.validate import block_optimizer_problems, zero_stage
from tuneline.errors import ConfigError, UserError


def _decay_parameter_names(model) -> set[str]:
    from transformers import Trainer

    # Trainer's own rule (no decay on biases and norms); the method never reads `self`.
    return set(Trainer.get_decay_parameter_names(None, model))


def _optimizer_cls_and_kwargs(model, training_args):
    from transformers import Trainer

    return Trainer.get_optimizer_cls_and_kwargs(training_args, model)


def loraplus_param_groups(model, training_args, finetuning_args) -> list[dict]:
    """LoRA+ groups: B matrices (and 1-d params) at lr x loraplus_lr_ratio, embedding B at its own lr."""
    if not finetuning_args.loraplus_lr_ratio:
        raise ConfigError("'loraplus_lr_ratio' is not set; LoRA+ needs the ratio of B's learning rate over A's")
    decay = _decay_parameter_names(model)
    lr, wd = training_args.learning_rate, training_args.weight_decay
    b_lr = lr * finetuning_args.loraplus_lr_ratio
    groups = {"lora_a": (lr, wd), "lora_b": (b_lr, wd), "lora_b_nodecay": (b_lr, 0.0),
              "embedding": (finetuning_args.loraplus_lr_embedding, wd)}
    params: dict[str, list] = {key: [] for key in groups}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if "lora_embedding_B" in name:
            params["embedding"].append(param)
        elif "lora_B" in name or param.ndim == 1:
            params["lora_b" if name in decay else "lora_b_nodecay"].append(param)
        else:
            params["lora_a"].append(param)
    return [{"params": params[k], "lr": lr_, "weight_decay": wd_} for k, (lr_, wd_) in groups.items() if params[k]]


def create_loraplus_optimizer(model, training_args, finetuning_args):
    """LoRA+ (Hayou et al. 2024): B learns faster than A; the base optimizer is the one `optim` names."""
    optim_cls, optim_kwargs = _optimizer_cls_and_kwargs(model, training_args)
    return optim_cls(loraplus_param_groups(model, training_args, finetuning_args), **optim_kwargs)


def decay_groups(model, weight_decay: float) -> list[dict]:
    """The Trainer's two parameter groups: `weight_decay` on weights, none on biases and norms."""
    decay = _decay_parameter_names(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def loop_optimizer(model, extra, training_args, finetuning_args):
    """The optimizer the Trainer would build for `model`, for a loop of tuneline's own, with the parameters of `extra`
    (PPO's value head) in groups of their own at `learning_rate`."""
    import torch

    optim_cls, optim_kwargs = _optimizer_cls_and_kwargs(model, training_args)
    built_by_trainer = not (isinstance(optim_cls, type) and issubclass(optim_cls, torch.optim.Optimizer)) or any(
        key in optim_kwargs for key in ("params", "model", "optimizer_dict"))
    if built_by_trainer or str(training_args.optim).startswith(TRAINER_ONLY_OPTIMIZERS):
        raise ConfigError(f"'optim: {training_args.optim}' is driven by transformers' Trainer, which this stage's "
                          "training loop is not; use a plain optimizer such as adamw_torch, adafactor or sgd")
    if finetuning_args.loraplus_lr_ratio:
        groups = loraplus_param_groups(model, training_args, finetuning_args)
    else:
        groups = decay_groups(model, training_args.weight_decay)
    return optim_cls(groups + decay_groups(extra, training_args.weight_decay), **optim_kwargs)


# --- BAdam

def _require_badam():
    try:
        import badam
    except ImportError:
        raise UserError("'use_badam' needs the badam package: `pip install badam>=1.4`") from None
    return badam


def create_badam_optimizer(model, training_args, finetuning_args):
    """BAdam's block optimizer around the optimizer `optim` names (layer mode) or its sparse Adam (ratio mode);
    refused, naming the key, where this launch's processes or DeepSpeed stage are ones badam cannot serve."""
    badam = _require_badam()
    problems = block_optimizer_problems(finetuning_args, training_args.world_size, zero_stage(training_args.deepspeed))
    if problems:
        raise ConfigError(problems)
    decay = _decay_parameter_names(model)
    named = [(n, p) for n, p in model.named_parameters()]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": training_args.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    optim_cls, optim_kwargs = _optimizer_cls_and_kwargs(model, training_args)
    ft = finetuning_args
    if ft.badam_mode == "layer":
        # badam switches after every step when the interval is -1; tuneline's -1 means "never switch".
        every = sys.maxsize if ft.badam_switch_interval < 0 else ft.badam_switch_interval
        return badam.BlockOptimizer(
            base_optimizer=optim_cls(groups, **optim_kwargs), named_parameters_list=named,
            block_prefix_list=None, switch_block_every=every, start_block=ft.badam_start_block,
            switch_mode=ft.badam_switch_mode, verbose=ft.badam_verbose)
    has_lm_head = any("lm_head" in n for n, _ in named)  # tied embeddings leave no lm_head parameter to freeze
    return badam.BlockOptimizerRatio(
        param_groups=groups, named_parameters_list=named, update_ratio=ft.badam_update_ratio,
        switch_every=max(ft.badam_switch_interval, 1), mask_mode=ft.badam_mask_mode, verbose=ft.badam_verbose,
        include_embedding=False, include_lm_head=not has_lm_head,
        **{k: v for k, v in optim_kwargs.items() if k in ("lr", "betas", "eps")})  # its sparse Adam takes these


def prepare_trainer_for_badam(trainer) -> None:
    """What BAdam needs from the Trainer (LLaMA-Factory wires the same): gradient clipping that accepts ratio mode's
    sparse gradients, and badam's callback, which hands the block optimizer to DeepSpeed ZeRO-3's."""
    from types import MethodType

    badam = _require_badam()
    trainer.accelerator.clip_grad_norm_ = MethodType(badam.clip_grad_norm_old_version, trainer.accelerator)
    trainer.add_callback(_callback_class(badam)())


def _callback_class(badam):
    class BAdamCallback(badam.BAdamCallback):
        """badam's callback, keeping gradient checkpointing working: badam's removes the embeddings' input gradients
        for a checkpointing of its own, which tuneline (checkpointing since the model loaded) does not use; without
        them a reentrant checkpoint gives no layer a gradient, so they are put back."""

        def on_train_begin(self, args, state, control, **kwargs):
            model = kwargs["model"]
            checkpointing = getattr(model, "is_activation_checkpointing", False)
            super().on_train_begin(args, state, control, **kwargs)
            if checkpointing:
                model.enable_input_require_grads()

    return BAdamCallback

"""Custom optimizers a trainer plugs into `Trainer.create_optimizer`: LoRA+ and BAdam.

Both build on `Trainer.get_optimizer_cls_and_kwargs`, so every `optim` transformers offers (adamw_torch,
adafactor, sgd, ...) keeps working underneath.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tuneline.config import RunConfig
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
    if finetuning_args.finetuning_type != "lora":
        raise ConfigError(f"'loraplus_lr_ratio' applies to LoRA adapters, not 'finetuning_type: "
                          f"{finetuning_args.finetuning_type}'")
    optim_cls, optim_kwargs = _optimizer_cls_and_kwargs(model, training_args)
    return optim_cls(loraplus_param_groups(model, training_args, finetuning_args), **optim_kwargs)


# --- BAdam


def _zero_stage(deepspeed) -> int:
    """ZeRO stage of a DeepSpeed config given as a dict or a JSON file path; 0 without DeepSpeed."""
    if not deepspeed:
        return 0
    if isinstance(deepspeed, (str, Path)):
        try:
            deepspeed = json.loads(Path(deepspeed).read_text())
        except (OSError, json.JSONDecodeError):
            return 0
    return int(deepspeed.get("zero_optimization", {}).get("stage", 0) or 0)


def badam_problems(config: RunConfig, world_size: int | None = None) -> list[str]:
    """What BAdam cannot serve: adapters, ratio mode across processes, layer mode across processes without ZeRO-3."""
    ft = config.finetuning
    if not ft.use_badam:
        return []
    problems = []
    if ft.finetuning_type != "full":
        problems.append(f"'use_badam' updates blocks of the full model; it conflicts with 'finetuning_type: "
                        f"{ft.finetuning_type}' (use 'finetuning_type: full')")
    world_size = world_size or int(os.environ.get("WORLD_SIZE", "0")) or config.pipeline.num_processes or 1
    stage = _zero_stage(config.training.get("deepspeed"))
    if ft.badam_mode == "ratio" and (world_size > 1 or stage):
        problems.append("'badam_mode: ratio' runs in one process without DeepSpeed; use 'badam_mode: layer' with "
                        "DeepSpeed ZeRO-3 for several processes")
    elif ft.badam_mode == "layer" and (world_size > 1 or stage) and stage != 3:
        problems.append(f"'badam_mode: layer' on {world_size} process(es) needs DeepSpeed ZeRO-3 "
                        f"(got {'ZeRO-' + str(stage) if stage else 'no DeepSpeed'}); use a ZeRO-3 'deepspeed' "
                        "config or train in one process")
    if ft.badam_mode == "ratio" and not 0 < ft.badam_update_ratio <= 1:
        problems.append(f"'badam_update_ratio' is {ft.badam_update_ratio}; allowed: 0 < value <= 1")
    return problems


def _require_badam():
    try:
        import badam
    except ImportError:
        raise UserError("'use_badam' needs the badam package: `pip install badam>=1.4`") from None
    return badam


def create_badam_optimizer(model, training_args, finetuning_args, config: RunConfig | None = None):
    """BAdam's block optimizer around the optimizer `optim` names (layer mode) or its sparse Adam (ratio mode)."""
    badam = _require_badam()
    if config is not None and (problems := badam_problems(config)):
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
    """The two patches BAdam needs: gradient clipping that accepts sparse grads, and its callback."""
    from types import MethodType

    badam = _require_badam()
    trainer.accelerator.clip_grad_norm_ = MethodType(badam.clip_grad_norm_old_version, trainer.accelerator)
    trainer.add_callback(badam.BAdamCallback)

"""Which keys `stage: ppo` honours. Its loop is tuneline's own, not transformers' Trainer, so a TrainingArguments key
it does not read is refused under ppo instead of being passed along and ignored."""

from __future__ import annotations

from tuneline.config.run_config import RunConfig
from tuneline.config.training_keys import PUBLISH_KEYS

# TrainingArguments keys the PPO loop reads, or that act before it starts (the process group, the model's
# precision and checkpointing, the data split, output_dir's ownership). PUBLISH_KEYS act after it, in the flow.
PPO_TRAINING_KEYS = frozenset({
    "output_dir", "overwrite_output_dir", "resume_from_checkpoint", "report_to",
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "num_train_epochs",
    "max_steps", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "optim",
    "optim_args", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "seed", "data_seed",
    "full_determinism", "bf16", "fp16", "tf32", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "activation_checkpointing", "activation_checkpointing_kwargs", "logging_steps", "logging_first_step",
    "save_strategy", "save_steps", "save_total_limit", "use_cpu", "ddp_timeout", "ddp_backend", "local_rank",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context",
})

# Keys the loop does not read, with the value that says what it does anyway: accepted at that value (LLaMA-Factory's
# ppo examples carry some of them), refused at any other.
PPO_FIXED: dict[str, object] = {
    "do_train": True,  # the stage trains; `tuneline evaluate` scores a model with the reward model
    "disable_tqdm": True,  # progress goes to trainer_log.jsonl; there is no progress bar
    "save_only_model": False,  # checkpoints hold optimizer, scheduler and random states, so resume is exact
    "save_safetensors": True,
    "logging_strategy": "steps",
    "logging_nan_inf_filter": True,  # a non-finite metric is logged as 0.0
    "eval_strategy": "no",  # the reward is measured before and after training
    "evaluation_strategy": "no",
    "load_best_model_at_end": False,
    "neftune_noise_alpha": None,
    "torch_compile": False,
    "group_by_length": False,
    "remove_unused_columns": False,
}

# Optimizers whose stepping transformers' Trainer drives itself (fused backward, train/eval switches, parameter groups
# of their own): a loop of tuneline's own cannot run them.
TRAINER_ONLY_OPTIMIZERS = ("galore", "apollo", "lomo", "adalomo", "schedule_free")

# Why a key is refused under ppo, where there is more to say than that the loop does not read it.
PPO_REASONS = {
    "neftune_noise_alpha": "NEFTune's embedding noise is added by transformers' Trainer (stages sft and pt)",
    "save_strategy": "the loop saves every 'save_steps' steps ('steps') or each epoch of prompts ('epoch'); it "
                     "keeps no best metric",
    "eval_strategy": "the loop measures the reward on the validation split before and after training",
}


def ppo_problems(config: RunConfig) -> list[str]:
    """Keys `stage: ppo` would accept and ignore, each refused with what to do instead."""
    if config.stage != "ppo":
        return []
    ft, problems = config.finetuning, []
    if ft.use_badam:
        problems.append("'use_badam: true' is not supported by 'stage: ppo': badam's block optimizer would leave the "
                        "value head untrained; remove it (LoRA, freeze and full tuning work)")
    if config.generating.num_beams != 1:
        problems.append(f"'num_beams: {config.generating.num_beams}' has no effect under 'stage: ppo': the loop samples "
                        "each answer (PPO needs the sampling policy's probabilities), it does not search beams; "
                        "remove it")
    optim = str(config.training.get("optim") or "")
    if optim.startswith(TRAINER_ONLY_OPTIMIZERS):
        problems.append(f"'optim: {optim}' is driven by transformers' Trainer, which the PPO loop is not; use a plain "
                        "optimizer such as adamw_torch, adafactor or sgd")
    if str(config.training.get("save_strategy", "steps")) == "best":
        problems.append(f"'save_strategy: best' has no effect under 'stage: ppo': {PPO_REASONS['save_strategy']}; use "
                        "'steps' or 'epoch'")
    for key, value in config.training.items():
        if key in PPO_TRAINING_KEYS or key in PUBLISH_KEYS or (key in PPO_FIXED and value == PPO_FIXED[key]):
            continue
        reason = PPO_REASONS.get(key, "tuneline's PPO loop is not transformers' Trainer and does not read it")
        allowed = f" (only {PPO_FIXED[key]!r} is accepted)" if key in PPO_FIXED else ""
        problems.append(f"'{key}: {value}' has no effect under 'stage: ppo': {reason}; remove it{allowed}")
    return problems

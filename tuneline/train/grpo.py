"""`stage: grpo` -- Group Relative Policy Optimization, trained by trl's GRPOTrainer; `stage: rloo` the same run on
trl's RLOOTrainer (REINFORCE Leave-One-Out: each answer's baseline is the mean reward of the others of its prompt).

Run through the flow (`tuneline train examples/grpo_lora_demo.yaml`) or in a training process
(`accelerate launch -m tuneline.train <config>`), which calls `run` below.

Why trl here when dpo, kto and rm are our own: GRPO needs no tokenized answers and no private loss of ours, only
prompts and reward functions, and trl's trainer is a transformers Trainer, so it runs under the same launch,
callbacks (trainer_log.jsonl, MLflow by step) and complete-or-absent checkpoints as every other stage. The prompt
is the template's rendering up to the answer slot (built by the dataset step, `prompt` column); the row's last
answer reaches the reward functions as `solution`. With `beta > 0`, trl's reference is the base with the LoRA
adapter switched off, or for freeze and full tuning a second copy of the base it loads itself.
"""

from __future__ import annotations

from typing import Any

from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from tuneline.config.grpo_keys import NOT_FOR_RLOO
from tuneline.errors import ConfigError
from tuneline.train.trainer_base import StageSpec, TunelineTrainer, run_trainer, speak_trained_template, split_of

PROMPT_COLUMNS = ["prompt", "solution"]  # what trl reads and hands to the reward functions; the ids stay behind


class TunelineGRPOTrainer(TunelineTrainer, GRPOTrainer):
    """trl's GRPO loop with tuneline's atomic checkpoints and finetuning hooks (TunelineTrainer comes first in the
    method order, and calls on into GRPOTrainer)."""


class TunelineRLOOTrainer(TunelineTrainer, RLOOTrainer):
    """trl's RLOO loop, with the same of tuneline's as TunelineGRPOTrainer."""


# stage -> (trl's config class, the trainer class tuneline builds)
TRAINERS = {"grpo": (GRPOConfig, TunelineGRPOTrainer), "rloo": (RLOOConfig, TunelineRLOOTrainer)}


def grpo_training_args(config, **overrides: Any) -> GRPOConfig | RLOOConfig:
    """GRPOConfig (RLOOConfig for rloo) from the training keys (as every stage builds its TrainingArguments), the grpo keys under trl's
    names, and the generating keys for sampling."""
    import dataclasses

    from tuneline.train.training_args import device_defaults, translate_training_keys

    kwargs = device_defaults(translate_training_keys(config.training), config)
    kwargs["include_num_input_tokens_seen"] = "no"  # trl's batches hold prompt and answer ids, not input_ids
    kwargs.setdefault("gradient_checkpointing", False)  # tuneline.model sets it up when loading, as for every stage
    grpo = dataclasses.asdict(config.grpo)
    grpo.pop("reward_funcs")
    if config.stage == "rloo":
        for key in NOT_FOR_RLOO:  # refused at any other value than the default (config/grpo_keys.py)
            grpo.pop(key)
    gen = config.generating
    kwargs.update(grpo, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k,
                  repetition_penalty=gen.repetition_penalty, **overrides)
    try:
        return TRAINERS[config.stage][0](**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{config.stage} settings rejected by trl: {exc}", source=config.source) from None


def prompts_of(split):
    return split.select_columns(PROMPT_COLUMNS) if split is not None else None


def run(config, dataset_ref: dict, extra_callbacks: list) -> dict[str, Any]:
    """Train the grpo stage on the processed prompts; returns output_dir, global step and metrics."""
    from transformers import set_seed

    from tuneline.data import load_processed
    from tuneline.model.loader import load_model
    from tuneline.model.tokenizer import load_tokenizer
    from tuneline.objectives.grpo_rewards import resolve_reward_funcs
    from tuneline.train.callbacks import build_callbacks

    args = grpo_training_args(config)
    tokenizer = load_tokenizer(config.model)
    datasets = load_processed(dataset_ref)
    train, evals = split_of(datasets, "train"), split_of(datasets, "validation")
    if train is None:
        raise ConfigError("the training split is empty: check 'dataset', 'max_samples' and 'val_size'")
    reward_funcs, names = resolve_reward_funcs(config, tokenizer, args.device)
    set_seed(args.seed)
    model = load_model(config, tokenizer, is_trainable=True)
    speak_trained_template(config, tokenizer)
    callbacks = build_callbacks(config, args.output_dir, extra_callbacks)
    trainer = TRAINERS[config.stage][1](
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=prompts_of(train),
        eval_dataset=prompts_of(evals) if args.eval_strategy != "no" else None, processing_class=tokenizer,
        callbacks=callbacks, finetuning_args=config.finetuning)
    trainer.reward_func_names = names  # the metric names trl logs (rewards/<name>/mean): the config's own
    return run_trainer(trainer, config, StageSpec(name=config.stage), tokenizer, callbacks)

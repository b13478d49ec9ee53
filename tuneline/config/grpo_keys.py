"""The keys of `stage: grpo`, under trl's names (GRPOConfig), and what refuses them elsewhere.

Sampling reuses the generating keys a LLaMA-Factory config already has (`temperature`, `top_p`, `top_k`,
`repetition_penalty`), so one key never means two things; `max_completion_length` is trl's own."""

from __future__ import annotations

from dataclasses import dataclass, fields

from tuneline.config.fields import arg

GRPO_STAGES = ("grpo", "rloo")  # rloo: the same keys on trl's RLOOTrainer, less those it has not
NOT_FOR_RLOO = ("loss_type", "scale_rewards")  # RLOOConfig has neither: its loss and advantages are its own
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


@dataclass
class GrpoArgs:
    reward_funcs: list | None = arg(
        None, "grpo: the rewards, each a trl built-in by name (think_format, accuracy, reasoning_accuracy), "
              "'path/to/file.py:function' (called as trl calls reward functions: "
              "prompts=, completions=, solution= and the other dataset columns as keyword arguments) or a reward "
              "model folder (a tuneline or LLaMA-Factory stage: rm output).")
    reward_weights: list | None = arg(None, "grpo: one weight per reward_funcs item; default 1.0 each.")
    num_generations: int = arg(8, "grpo: answers sampled per prompt (a group); the effective batch must divide by it.")
    max_completion_length: int = arg(256, "grpo: most tokens generated per answer.")
    beta: float = arg(0.0, "grpo: KL coefficient to the reference (0: no reference is used; LoRA: the base with "
                           "the adapter switched off).")
    loss_type: str = arg("dapo", "grpo: trl's loss formulation.", LOSS_TYPES)
    epsilon: float = arg(0.2, "grpo: lower clipping range of the probability ratio.")
    epsilon_high: float | None = arg(None, "grpo: upper clipping range; default epsilon.")
    num_iterations: int = arg(1, "grpo: optimisation passes over each generated batch.")
    scale_rewards: str = arg("group", "grpo: advantages divided by the reward std of each group, the batch, or not.",
                             ("group", "batch", "none"))
    mask_truncated_completions: bool = arg(False, "grpo: leave answers cut at max_completion_length out of the loss.")
    steps_per_generation: int | None = arg(None, "grpo: optimizer steps per generation round; default "
                                                 "gradient_accumulation_steps.")
    generation_batch_size: int | None = arg(None, "grpo: answers generated per round; default the effective batch.")
    use_vllm: bool = arg(False, "grpo: generate with vLLM (CUDA only; `pip install tuneline[vllm]`).")
    vllm_mode: str = arg("colocate", "grpo: vLLM in the training processes, or a `trl vllm-serve` server.",
                         ("colocate", "server"))


GRPO_KEYS = tuple(f.name for f in fields(GrpoArgs))
GRPO_DEFAULTS = {f.name: f.default for f in fields(GrpoArgs)}

# TrainingArguments keys GRPOConfig does not take (they belong to Seq2SeqTrainingArguments or to generating a
# prediction file), refused under grpo rather than ignored.
NOT_FOR_GRPO = {"predict_with_generate": False, "generation_max_length": None, "generation_num_beams": None,
                "do_predict": False}


def grpo_problems(config) -> list[str]:
    """grpo keys set outside `stage: grpo`, and settings `stage: grpo` cannot honour (checkable from the config)."""
    grpo, problems = config.grpo, []
    if config.stage not in GRPO_STAGES:
        return [f"'{key}: {getattr(grpo, key)}' has no effect in this run: it applies only with 'stage: grpo' or "
                "'rloo'; "
                "remove it" for key in GRPO_KEYS if getattr(grpo, key) != GRPO_DEFAULTS[key]]
    problems += [f"'{key}: {getattr(grpo, key)}' has no effect under 'stage: rloo': trl's RLOOTrainer has no such "
                 "setting; remove it" for key in NOT_FOR_RLOO
                 if config.stage == "rloo" and getattr(grpo, key) != GRPO_DEFAULTS[key]]
    if not grpo.reward_funcs and not config.pipeline.reward_model_config:
        problems.append(f"'stage: {config.stage}' needs 'reward_funcs': a list of trl built-ins (e.g. think_format), "
                        "'file.py:function' items or reward model folders")
    rewards = len(grpo.reward_funcs or []) + bool(config.pipeline.reward_model_config)  # its model comes last
    if grpo.reward_weights is not None and len(grpo.reward_weights) != rewards:
        problems.append(f"'reward_weights' has {len(grpo.reward_weights)} weights for {rewards} rewards "
                        "('reward_funcs', then the model of 'reward_model_config'); give one weight per reward")
    if not config.generating.do_sample:
        problems.append(f"'do_sample: false' has no effect under 'stage: {config.stage}': it compares sampled "
                        "answers; remove it")
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in grpo.reward_weights or []):
        problems.append(f"'reward_weights: {grpo.reward_weights}' must be numbers")
    if grpo.num_generations < 2:
        problems.append(f"'num_generations: {grpo.num_generations}' must be at least 2: GRPO compares the answers "
                        "of one prompt with each other")
    if config.finetuning.reward_model or config.finetuning.reward_model_adapters:
        problems.append(f"'reward_model' is ppo's key; under 'stage: {config.stage}' list the reward model folder in "
                        "'reward_funcs'")
    if grpo.vllm_mode != GRPO_DEFAULTS["vllm_mode"] and not grpo.use_vllm:
        problems.append(f"'vllm_mode: {grpo.vllm_mode}' has no effect without 'use_vllm: true'; remove it")
    for key, accepted in NOT_FOR_GRPO.items():
        value = config.training.get(key)
        if value not in (None, accepted):
            problems.append(f"'{key}: {value}' has no effect under 'stage: {config.stage}': trl's trainer does not "
                            "read it; the flow's evaluate step samples and scores answers; remove it")
    if config.generating.num_beams != 1:
        problems.append(f"'num_beams: {config.generating.num_beams}' has no effect under 'stage: {config.stage}': "
                        "answers are sampled; remove it")
    return problems


# trl.rewards functions usable by name (with or without the `_reward` suffix); True: they need `math-verify`.
BUILTIN_REWARDS = {"think_format": ("think_format_reward", False), "accuracy": ("accuracy_reward", True),
                   "reasoning_accuracy": ("reasoning_accuracy_reward", True)}


def builtin_reward(item: str) -> tuple[str, bool] | None:
    """(trl.rewards function name, whether it needs math-verify) of a built-in reward's name, else None."""
    return BUILTIN_REWARDS.get(item.removesuffix("_reward"))


def reward_function_path(item: str) -> tuple[str, str] | None:
    """(file, function) of a 'path/to/file.py:function' item, else None."""
    file, sep, name = item.rpartition(":")
    return (file, name) if sep and file.endswith(".py") else None

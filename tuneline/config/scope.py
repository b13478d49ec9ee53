"""Keys that mean something only in some runs (a stage, a finetuning type, another key turned on), and keys tuneline
reads nowhere: set where they would change nothing, they are refused, naming what they need, instead of being
accepted and ignored."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tuneline.config.args import GROUPS
from tuneline.config.grpo_keys import GRPO_KEYS
from tuneline.config.run_config import RunConfig
from tuneline.config.training_keys import TRAINING_DEFAULTS, TRAINING_KEYS

Rule = tuple[Callable[[RunConfig], bool], str]


def _type(name: str) -> Rule:
    return (lambda c: c.finetuning.finetuning_type == name, f"with 'finetuning_type: {name}'")


def _stages(*names: str) -> Rule:
    return (lambda c: c.stage in names, "with " + " or ".join(f"'stage: {n}'" for n in names))


def _key(name: str, test: Callable[[object], bool] = bool, what: str = "") -> Rule:
    return (lambda c: test(c.flat().get(name)), what or f"with '{name}' set")


# Optimizers of transformers whose `optim_args` are read (the others take none).
OPTIM_ARGS_READERS = ("sgd", "adagrad", "rmsprop", "adamw_anyprecision", "grokadamw", "galore", "apollo", "lomo",
                      "schedule_free", "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "lion", "paged",
                      "adamw_bnb_8bit", "adamw_8bit", "rmsprop_bnb")
_reference_losses = (lambda c: c.stage in ("kto", "ppo") or (c.stage == "dpo" and c.finetuning.pref_loss not in
                                                               ("orpo", "simpo")),
                     "where training compares with a reference model ('stage: dpo' with a reference loss, 'kto', "
                     "'ppo')")

def _may_see_images(config: RunConfig) -> bool:
    """A local model whose config.json has a vision_config; a hub model is checked when it loads (the loader)."""
    config_file = Path(str(config.model.model_name_or_path)).expanduser() / "config.json"
    try:
        return "vision_config" in json.loads(config_file.read_text())
    except FileNotFoundError:
        return not config_file.parent.is_dir()
    except (OSError, ValueError):
        return True  # unreadable: the loader reports it


SCOPE: dict[str, Rule] = {
    **dict.fromkeys(("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model"),
                    (_may_see_images, "with a vision-language model (a config.json with a 'vision_config')")),
    **dict.fromkeys(("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_rslora", "use_dora"),
                    _type("lora")),
    "additional_target": (lambda c: c.finetuning.finetuning_type in ("lora", "oft"),
                          "with 'finetuning_type: lora' or 'oft'"),
    **dict.fromkeys(("oft_rank", "oft_block_size", "oft_target", "module_dropout"), _type("oft")),
    **dict.fromkeys(("galore_target", "galore_rank", "galore_update_interval", "galore_scale", "galore_proj_type",
                     "galore_layerwise"), _key("use_galore", what="with 'use_galore: true'")),
    **dict.fromkeys(("apollo_target", "apollo_rank", "apollo_update_interval", "apollo_scale", "apollo_proj",
                     "apollo_proj_type", "apollo_scale_type", "apollo_scale_front", "apollo_layerwise"),
                    _key("use_apollo", what="with 'use_apollo: true'")),
    **dict.fromkeys(("use_dft_loss", "use_eaft_loss", "use_asft_loss"), _stages("sft")),
    "eaft_alpha": _key("use_eaft_loss", what="with 'use_eaft_loss: true'"),
    "asft_alpha": _key("use_asft_loss", what="with 'use_asft_loss: true'"),
    **dict.fromkeys(("fp8_backend", "fp8_enable_fsdp_float8_all_gather"), _key("fp8", what="with 'fp8: true'")),
    **dict.fromkeys(("profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps", "profiler_active_steps",
                     "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory", "profiler_with_stack"),
                    _key("enable_torch_profiler", what="with 'enable_torch_profiler: true'")),
    "create_new_adapter": _key("adapter_name_or_path"),
    "loraplus_lr_embedding": _key("loraplus_lr_ratio"),
    "pissa_iter": _key("pissa_init", what="with 'pissa_init: true'"),
    **dict.fromkeys(("machine_rank", "main_process_ip", "main_process_port"),
                    _key("num_machines", lambda n: (n or 1) > 1, "with 'num_machines' above 1")),
    **dict.fromkeys(("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"), _type("freeze")),
    **dict.fromkeys(("badam_mode", "badam_switch_interval", "badam_verbose"),
                    _key("use_badam", what="with 'use_badam: true'")),
    **dict.fromkeys(("badam_start_block", "badam_switch_mode"),
                    (lambda c: c.finetuning.use_badam and c.finetuning.badam_mode == "layer",
                     "with 'use_badam: true' in 'badam_mode: layer'")),
    **dict.fromkeys(("badam_update_ratio", "badam_mask_mode"),
                    (lambda c: c.finetuning.use_badam and c.finetuning.badam_mode == "ratio",
                     "with 'use_badam: true' in 'badam_mode: ratio'")),
    **dict.fromkeys(("pref_beta", "pref_ftx"), _stages("dpo", "kto")),
    "pref_loss": _stages("dpo"),
    "simpo_gamma": (lambda c: c.stage == "dpo" and c.finetuning.pref_loss == "simpo",
                    "with 'stage: dpo' and 'pref_loss: simpo'"),
    **dict.fromkeys(("kto_chosen_weight", "kto_rejected_weight"), _stages("kto")),
    "ref_model": _reference_losses,
    **dict.fromkeys(("ref_model_adapters", "ref_model_quantization_bit"), _key("ref_model")),
    "precompute_ref": (lambda c: c.stage in ("dpo", "kto") and _reference_losses[0](c),
                       "with 'stage: dpo' (a reference loss) or 'stage: kto'"),
    "reward_model_config": _stages("ppo", "grpo", "rloo"),
    **dict.fromkeys(("reward_model", "reward_model_type", "ppo_buffer_size", "ppo_epochs",
                     "ppo_score_norm", "ppo_target", "ppo_init_kl_coef", "ppo_whiten_rewards"), _stages("ppo")),
    "reward_model_adapters": (lambda c: c.stage == "ppo" and c.finetuning.reward_model_type == "full",
                              "with 'stage: ppo' and 'reward_model_type: full' (a LoRA reward model sits on the "
                              "policy's base and its adapters)"),
    **dict.fromkeys(("quantization_type", "double_quantization"),
                    _key("quantization_bit", lambda v: v == 4, "with 'quantization_bit: 4'")),
    **dict.fromkeys(("compute_accuracy", "predict_with_generate"), _stages("sft")),
    "label_smoothing_factor": (_stages("sft", "pt")[0], "with 'stage: sft' or 'pt' (the other stages' losses are "
                                                        "their own)"),
    **dict.fromkeys(("generation_max_length", "generation_num_beams", "skip_special_tokens"),
                    _key("predict_with_generate", what="with 'predict_with_generate: true'")),
    **dict.fromkeys(("temperature", "top_p", "top_k"), _key("do_sample", what="with 'do_sample: true'")),
    "length_penalty": _key("num_beams", lambda v: (v or 1) > 1, "with beam search ('num_beams' above 1)"),
    "interleave_probs": _key("mix_strategy", lambda v: str(v).startswith("interleave"),
                             "with 'mix_strategy: interleave_under' or 'interleave_over'"),
    "eval_steps": (lambda c: _eval_strategy(c) == "steps", "with 'eval_strategy: steps'"),
    **dict.fromkeys(("eval_delay", "eval_on_start"), (lambda c: _eval_strategy(c) != "no",
                                                      "with 'eval_strategy: steps' or 'epoch'")),
    **dict.fromkeys(("metric_for_best_model", "greater_is_better"),
                    (lambda c: bool(c.training.get("load_best_model_at_end") or c.finetuning.early_stopping_steps),
                     "with 'load_best_model_at_end: true' or 'early_stopping_steps'")),
    "save_steps": (lambda c: str(c.training.get("save_strategy") or "steps") == "steps", "with 'save_strategy: steps'"),
    **dict.fromkeys(("hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision",
                     "hub_token"), _key("push_to_hub", what="with 'push_to_hub: true'")),
    "optim_args": (lambda c: str(c.training.get("optim") or "adamw_torch_fused").startswith(OPTIM_ARGS_READERS),
                   "with an 'optim' that takes them (sgd, adagrad, rmsprop, galore_*, ...; the adamw_torch ones and "
                   "adafactor take none)"),
    "optim_target_modules": (lambda c: str(c.training.get("optim") or "").startswith(("galore", "apollo")),
                             "with 'optim: galore_*' or 'apollo_*'"),
    **dict.fromkeys(("dataloader_persistent_workers", "dataloader_prefetch_factor"),
                    (lambda c: bool(c.training.get("dataloader_num_workers")), "with 'dataloader_num_workers' above 0")),
}

# Keys tuneline reads nowhere, with the one value that says what it does anyway (None: only unset), and why.
FIXED: dict[str, tuple[object, str]] = {
    "adapter_folder": (None, "list the adapters to load in 'adapter_name_or_path'"),
    "low_cpu_mem_usage": (True, "transformers 5 always loads weights without a second copy in memory"),
    "ignore_pad_token_for_loss": (True, "padding never counts in tuneline's losses"),
    "max_length": (1024, "generation stops at 'max_new_tokens', which is always set: change that instead"),
    "logging_dir": (None, "tuneline logs to trainer_log.jsonl and MLflow, and writes no TensorBoard folder"),
    "save_safetensors": (True, "transformers 5 always saves safetensors"),
    "remove_unused_columns": (False, "tuneline's processed datasets hold model inputs only"),
    "sortish_sampler": (False, "transformers 5 has no sortish sampler: use 'group_by_length: true'"),
    "generation_config": (None, "generation follows the generating keys (max_new_tokens, do_sample, top_p, ...)"),
    **dict.fromkeys(("project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"),
                    (None, "it names a trackio project; tuneline reports to MLflow only")),
    "hub_strategy": ("end", "tuneline publishes the final model and its card once, after the model card is "
                            "written (what 'end' means), and uploads no checkpoints"),
    "hub_always_push": (False, "tuneline publishes once and waits for that upload, so there is no earlier push to "
                               "skip"),
    "parallelism_config": (None, "it takes an accelerate ParallelismConfig object, which a YAML value cannot be: "
                                 "use 'accelerate_config'"),
}


# TrainingArguments keys a run that only predicts reads: it builds no TrainingArguments, so every other one is read
# only by training. ddp_timeout and overwrite_output_dir are kept because LLaMA-Factory's nlg_eval example sets them.
READ_WHEN_PREDICTING = frozenset({
    "output_dir", "overwrite_output_dir", "ddp_timeout", "local_rank", "seed", "data_seed", "bf16", "fp16", "use_cpu",
    "per_device_eval_batch_size", "do_train", "do_predict", "predict_with_generate", "generation_max_length",
    "generation_num_beams", "report_to", "run_name"})
# Keys only a training reads: those TrainingArguments keys; the new adapter (or trainable layers) it builds and the
# optimisers beside AdamW; the stages' losses and models; its processes and what the flow does with what it trained.
# A run that trains nothing (`do_predict` without `do_train`, the predict flow) reads none of them. The model to load
# (finetuning_type, adapter_name_or_path, quantization, precision), the data and generation stay allowed; keys FIXED
# refuses anyway are left to it.
TRAINING_ONLY: frozenset[str] = frozenset(set(TRAINING_KEYS) - READ_WHEN_PREDICTING - set(FIXED)) | {
    # tuneline's and LLaMA-Factory's keys of the training loop, its checkpoints and its evaluations on the way
    "disable_shuffling", "use_dft_loss", "use_eaft_loss", "eaft_alpha", "use_asft_loss", "asft_alpha", "fp8",
    "fp8_backend", "fp8_enable_fsdp_float8_all_gather", "enable_liger_kernel", "enable_torch_profiler",
    "profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps", "profiler_active_steps", "profiler_repeat",
    "profiler_record_shapes", "profiler_profile_memory", "profiler_with_stack", "pure_bf16", "disable_gradient_checkpointing", "use_reentrant_gc",
    "include_effective_tokens_per_second", "plot_loss", "compute_accuracy", "early_stopping_steps",
    "discard_checkpoints", "mlflow_log_checkpoints",
    # the new adapter or trainable layers, and the optimisers beside AdamW
    "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "additional_target", "use_rslora", "use_dora",
    "create_new_adapter", "loraplus_lr_ratio", "loraplus_lr_embedding", "pissa_init", "pissa_iter", "pissa_convert",
    "oft_rank", "oft_block_size", "oft_target", "module_dropout", "freeze_trainable_layers",
    "freeze_trainable_modules", "freeze_extra_modules", "freeze_vision_tower", "freeze_multi_modal_projector",
    "freeze_language_model", "use_badam", "badam_mode", "badam_start_block", "badam_switch_mode",
    "badam_switch_interval", "badam_update_ratio", "badam_mask_mode", "badam_verbose", "use_galore", "galore_target",
    "galore_rank", "galore_update_interval", "galore_scale", "galore_proj_type", "galore_layerwise", "use_apollo",
    "apollo_target", "apollo_rank", "apollo_update_interval", "apollo_scale", "apollo_proj", "apollo_proj_type",
    "apollo_scale_type", "apollo_scale_front", "apollo_layerwise", "use_adam_mini", "use_muon",
    # the preference and RL stages
    "pref_beta", "pref_ftx", "pref_loss", "dpo_label_smoothing", "kto_chosen_weight", "kto_rejected_weight",
    "simpo_gamma", "ref_model", "ref_model_adapters", "ref_model_quantization_bit", "precompute_ref", "reward_model",
    "reward_model_adapters", "reward_model_type", "reward_model_config", "ppo_buffer_size", "ppo_epochs",
    "ppo_score_norm", "ppo_target", "ppo_init_kl_coef", "ppo_whiten_rewards", *GRPO_KEYS,
    # the training's processes, and what the flow does with the trained model (publishing: TrainingArguments keys)
    "num_processes", "accelerate_config", "num_machines", "machine_rank", "main_process_ip", "main_process_port",
    "eval_max_samples", "eval_max_new_tokens", "mlflow_registered_model",
}


def training_only_keys(config: RunConfig) -> list[str]:
    """The keys only training reads that a run training nothing sets; [] for a run that trains."""
    if not config.predict_only:
        return []
    flat = config.flat()
    return [key for key in flat if key in TRAINING_ONLY and _is_set(config, key, flat[key])]


def training_only_problems(config: RunConfig) -> list[str]:
    """One problem naming every key `training_only_keys` finds."""
    unread = training_only_keys(config)
    if not unread:
        return []
    shown = config.masked()
    named = ", ".join(f"'{key}: {shown[key]}'" for key in unread)
    return [f"'do_predict: true' without 'do_train' trains nothing, and these keys are read only by training, so "
            f"they would change nothing: {named}; remove them, or set 'do_train: true' to train first"]


def _eval_strategy(config: RunConfig) -> str:
    return str(config.training.get("eval_strategy") or config.training.get("evaluation_strategy") or "no")


_DEFAULTS = {**{f: getattr(cls, f, None) for cls in GROUPS.values() for f in cls.__dataclass_fields__},
             **TRAINING_DEFAULTS}  # tuneline's own defaults of TrainingArguments keys: in every config unless changed


def _is_set(config: RunConfig, key: str, value) -> bool:
    """Whether `key` asks for something: away from its default (a derived one for lora_alpha and precompute_ref)."""
    ft = config.finetuning
    if key == "lora_alpha":
        return value != 2 * ft.lora_rank
    if key == "precompute_ref":
        return bool(value) != (ft.stage in ("dpo", "kto") and ft.pref_loss not in ("orpo", "simpo"))
    if key in _DEFAULTS:
        return value != _DEFAULTS[key]
    return value not in (None, False, "", [], {})


def scope_problems(config: RunConfig) -> list[str]:
    """Every key set where it changes nothing, with what it needs; every key tuneline does not read, set."""
    flat, shown, problems = config.flat(), config.masked(), []  # a secret's value is never quoted
    unread = set(training_only_keys(config))  # named once, by training_only_problems
    for key, (applies, when) in SCOPE.items():
        if key in flat and key not in unread and _is_set(config, key, flat[key]) and not applies(config):
            problems.append(f"'{key}: {shown[key]}' has no effect in this run: it applies only {when}; remove it")
    for key, (accepted, why) in FIXED.items():
        value = flat.get(key)
        if value is not None and value != accepted:
            problems.append(f"'{key}: {value}' has no effect: {why}; remove it")
    return problems + training_only_problems(config) + predict_problems(config)


def predict_problems(config: RunConfig) -> list[str]:
    """`do_predict` generates (sft only, as `predict_with_generate` is) answers to a held-out set."""
    if not config.training.get("do_predict"):
        return []
    problems = []
    if not config.training.get("predict_with_generate"):
        problems.append("'do_predict: true' has no effect without generation: tuneline predicts with "
                        "'predict_with_generate: true' (answers to the validation split, in generated_predictions.jsonl)"
                        "; set that, or remove 'do_predict'")
    if not (config.eval_dataset_names or (config.data.val_size and config.dataset_names)):
        problems.append("'do_predict: true' answers the prompts of a held-out set and there is none: set "
                        "'eval_dataset' (entries of dataset_info.json), or 'val_size' with 'dataset'")
    return problems

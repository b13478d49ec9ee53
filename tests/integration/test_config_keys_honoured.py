"""Every key of the config schema is honoured or refused, never accepted and ignored (issue 23).

The schema: the typed groups of tuneline/config/args.py, transformers' TrainingArguments keys and the legacy ones
(training_keys.py), and the LLaMA-Factory options tuneline does not support. Each key, set to a valid value other
than the one it has in a config where it applies (CONTEXTS), is refused by `load_config` with a message naming it,
or changes what runs. What runs is read from the objects a run is built from, never from the config: the processed
dataset's reference, the tokenizer and model as they load (the loader's keyword arguments, adapter, trainable and
checkpointed parameters), the TrainingArguments a Trainer stage trains with and the trainer built on them
(optimizer, learning rates, callbacks, collator, metrics, the loss of a batch), PPO's loop (optimizer, schedule,
prompt loader, KL control, a rollout), the generation settings, the launch command, where the reference and reward
models come from, and the names MLflow tracks the run under.

Three more walks: each key of tuneline.config.scope set where it does not apply is refused; each TrainingArguments
and generating key under `stage: ppo` changes PPO's loop or is refused; RUNTIME and MACHINE (keys whose effect
shows only while a run goes, or only on a GPU or in several processes) name real keys and real tests.

A key added to the schema and wired nowhere fails here. No training: a few milliseconds per key, and about a
second for each context's first build.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import re
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tuneline.config import load_config
from tuneline.config.args import GeneratingArgs
from tuneline.config.loader import ALL_KEYS, GROUP_FIELDS
from tuneline.config.scope import SCOPE
from tuneline.config.training_keys import PUBLISH_KEYS, TRAINING_DEFAULTS, TRAINING_KEYS, UNSUPPORTED_KEYS
from tuneline.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
MEDIA_DATA = REPO / "tests" / "fixtures" / "llamafactory-mm"  # LLaMA-Factory's image demo, for media_dir
# The learning rates are read by stepping schedulers without training: torch's warning about that order is expected.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")

# --- the configs keys are tried in: keys that apply only in some runs, and the keys that make such a run

PREF, KTO = {"stage": "dpo", "dataset": "demo_pref"}, {"stage": "kto", "dataset": "demo_kto"}
PPO = {"stage": "ppo", "reward_model": "<model>", "reward_model_type": "full", "max_new_tokens": 4}
EVAL = {"val_size": 4, "eval_strategy": "steps", "eval_steps": 2}
BADAM = {"finetuning_type": "full", "use_badam": True}
GRPO = {"stage": "grpo", "reward_funcs": ["think_format"], "per_device_train_batch_size": 8}
CONTEXTS: dict[str, dict[str, Any]] = {
    **dict.fromkeys(["reward_funcs", "num_generations", "max_completion_length", "beta", "loss_type", "epsilon",
                     "epsilon_high", "num_iterations", "scale_rewards", "mask_truncated_completions",
                     "steps_per_generation", "generation_batch_size"], GRPO),
    "reward_weights": GRPO,
    "vllm_mode": {**GRPO, "use_vllm": True},
    **dict.fromkeys(["freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"],
                    {"finetuning_type": "freeze"}),
    "use_badam": {"finetuning_type": "full"},
    **dict.fromkeys(["badam_mode", "badam_start_block", "badam_switch_mode", "badam_switch_interval",
                     "badam_verbose"], BADAM),
    **dict.fromkeys(["badam_update_ratio", "badam_mask_mode"], {**BADAM, "badam_mode": "ratio"}),
    **dict.fromkeys(["pissa_iter", "pissa_convert"], {"pissa_init": True}),
    **dict.fromkeys(["use_galore", "use_apollo", "pure_bf16"], {"finetuning_type": "full"}),
    **dict.fromkeys(["galore_target", "galore_rank", "galore_update_interval", "galore_scale", "galore_proj_type",
                     "galore_layerwise"], {"finetuning_type": "full", "use_galore": True}),
    **dict.fromkeys(["apollo_target", "apollo_rank", "apollo_update_interval", "apollo_scale", "apollo_proj",
                     "apollo_proj_type", "apollo_scale_type", "apollo_scale_front", "apollo_layerwise"],
                    {"finetuning_type": "full", "use_apollo": True}),
    **dict.fromkeys(["oft_rank", "oft_block_size", "oft_target", "module_dropout"], {"finetuning_type": "oft"}),
    "loraplus_lr_embedding": {"loraplus_lr_ratio": 4.0, "lora_target": "q_proj,embed_tokens"},
    "create_new_adapter": {"adapter_name_or_path": "<adapter>"},
    **dict.fromkeys(["pref_beta", "pref_ftx", "pref_loss", "dpo_label_smoothing", "ref_model", "precompute_ref"],
                    PREF),
    "simpo_gamma": {**PREF, "pref_loss": "simpo"},
    **dict.fromkeys(["ref_model_adapters", "ref_model_quantization_bit"], {**PREF, "ref_model": "<model>"}),
    **dict.fromkeys(["kto_chosen_weight", "kto_rejected_weight"], KTO),
    "eaft_alpha": {"use_eaft_loss": True}, "asft_alpha": {"use_asft_loss": True},
    "init_special_tokens": {"new_special_tokens_config": "<tokens>"},
    **dict.fromkeys(["fp8_backend", "fp8_enable_fsdp_float8_all_gather"], {"fp8": True}),
    **dict.fromkeys(["profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps", "profiler_active_steps",
                     "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory", "profiler_with_stack"],
                    {"enable_torch_profiler": True}),
    **dict.fromkeys(["reward_model", "reward_model_type", "reward_model_adapters", "ppo_buffer_size", "ppo_epochs",
                     "ppo_score_norm", "ppo_target", "ppo_init_kl_coef", "ppo_whiten_rewards"], PPO),
    **dict.fromkeys(["generation_max_length", "generation_num_beams", "skip_special_tokens"],
                    {"val_size": 4, "predict_with_generate": True}),
    "predict_with_generate": {"val_size": 4},
    "length_penalty": {"num_beams": 2},
    **dict.fromkeys(["eval_steps", "eval_delay", "eval_on_start", "eval_accumulation_steps",
                     "eval_do_concat_batches", "eval_use_gather_object", "include_for_metrics", "batch_eval_metrics",
                     "prediction_loss_only", "bf16_full_eval", "fp16_full_eval", "load_best_model_at_end",
                     "early_stopping_steps", "compute_accuracy", "per_device_eval_batch_size"], EVAL),
    **dict.fromkeys(["metric_for_best_model", "greater_is_better"], {**EVAL, "load_best_model_at_end": True}),
    **dict.fromkeys(["eval_strategy", "evaluation_strategy"], {"val_size": 4}),
    "interleave_probs": {"dataset": "demo_sft,demo_sharegpt", "mix_strategy": "interleave_under"},
    "lr_scheduler_kwargs": {"lr_scheduler_type": "cosine_with_restarts"},
    **dict.fromkeys(["media_dir", "image_max_pixels", "image_min_pixels", "video_max_pixels", "video_min_pixels",
                     "video_fps", "video_maxlen", "image_do_pan_and_scan"], {"dataset": "mllm_demo", "dataset_dir": "<media_data>",
                                                    "model_name_or_path": "<vlm>", "template": "gemma3"}),
    "crop_to_patches": {"dataset": "mllm_demo", "dataset_dir": "<media_data>", "model_name_or_path": "<intern_vl>",
                        "template": "intern_vl"},
    "optim_args": {"optim": "sgd"},
    "optim_target_modules": {"optim": "galore_adamw"},
    **dict.fromkeys(["dataloader_persistent_workers", "dataloader_prefetch_factor"], {"dataloader_num_workers": 1}),
    **dict.fromkeys(["hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision",
                     "hub_token"], {"push_to_hub": True}),
}

# A valid value for keys whose type suggests none (strings, mappings), or where the automatic one is invalid.
VALUES: dict[str, Any] = {
    "model_name_or_path": "<model2>", "adapter_name_or_path": "<adapter>", "adapter_folder": "<adapter>",
    "cache_dir": "<tmp>/hub", "model_revision": "v2", "hf_hub_token": "hf_token", "add_special_tokens": "<|x|>",
    "add_tokens": "svgpath", "new_special_tokens_config": "<tokens>", "profiler_output_dir": "<tmp>/traces",
    "export_dir": "<tmp>/export", "dataset": "demo_sharegpt", "eval_dataset": "demo_sft_eval",
    "dataset_dir": "<data2>", "template": "chatml", "val_size": 4, "tool_format": "qwen", "tool_date": "26 Jul 2024", "max_samples": 8,
    "default_system": "Be brief.", "tokenized_path": "<tmp>/tokenized", "pad_to_multiple_of": 8, "media_dir": "<media2>",
    "interleave_probs": "0.3,0.7", "lora_target": "q_proj,v_proj", "additional_target": "lm_head", "lora_alpha": 4,
    "loraplus_lr_ratio": 4.0, "freeze_trainable_layers": 1, "freeze_trainable_modules": "mlp",
    "freeze_extra_modules": "norm", "badam_start_block": 1, "ref_model": "<model>", "ref_model_adapters": "<adapter>",
    "precompute_ref": False, "simpo_gamma": 1.0, "reward_model": "<model2>", "reward_model_adapters": "<adapter>",
    "reward_model_type": "lora", "reward_model_config": "<rm_config>", "ppo_target": 3.0, "max_new_tokens": 6,
    "max_length": 64, "run_name": "named", "pipeline_cache_dir": "<tmp>/cache2", "mlflow_experiment": "exp",
    "mlflow_tracking_uri": "sqlite:///<tmp>/other.db", "mlflow_registered_model": "registered",
    "accelerate_config": "<accelerate>", "num_processes": 2, "main_process_ip": "10.0.0.5", "eval_max_new_tokens": 8, "eval_max_samples": 8,
    # TrainingArguments and legacy keys
    "output_dir": "<tmp>/out2", "lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"num_cycles": 2},
    "optim": "sgd", "optim_args": "momentum=0.9", "optim_target_modules": ["q_proj"], "warmup_steps": 2,
    "warmup_ratio": 0.1, "max_steps": 5, "logging_steps": 3, "eval_steps": 3, "save_steps": 3,
    "logging_strategy": "epoch", "eval_strategy": "epoch", "evaluation_strategy": "epoch", "save_strategy": "epoch",
    "hub_strategy": "every_save", "hub_token": "hf_token", "hub_model_id": "org/model", "hub_revision": "v2",
    "metric_for_best_model": "eval_accuracy", "include_num_input_tokens_seen": "all", "log_level": "info",
    "log_level_replica": "info", "report_to": "mlflow", "project": "proj", "trackio_space_id": "org/space",
    "trackio_bucket_id": "bucket", "trackio_static_space_id": "org/static", "torch_compile_backend": "eager",
    "torch_compile_mode": "default", "liger_kernel_config": {"rope": True},
    "gradient_checkpointing_kwargs": {"use_reentrant": False}, "activation_checkpointing_kwargs": {"use_reentrant": False},
    "gradient_checkpointing": False, "activation_checkpointing": False, "include_for_metrics": ["inputs"],
    "label_names": ["labels"], "train_sampling_strategy": "group_by_length", "length_column_name": "size",
    "ddp_backend": "gloo", "fsdp": "full_shard", "fsdp_config": {"min_num_params": 1}, "deepspeed": "<zero2>",
    "debug": "underflow_overflow", "resume_from_checkpoint": "<tmp>/out/checkpoint-1", "logging_dir": "<tmp>/logs",
    "generation_config": {"max_new_tokens": 4}, "accelerator_config": {"split_batches": True},
    "parallelism_config": {"dp_shard_size": 1}, "dataloader_multiprocessing_context": "spawn",
    "neftune_noise_alpha": 5.0, "dataloader_prefetch_factor": 4, "per_device_eval_batch_size": 2,
    "generation_max_length": 16, "generation_num_beams": 2, "data_seed": 7, "seed": 7, "ddp_timeout": 60,
    "ddp_bucket_cap_mb": 10, "torch_empty_cache_steps": 2, "save_total_limit": 2, "early_stopping_steps": 2,
    "eval_accumulation_steps": 2, "eval_delay": 2.0, "local_rank": 0, "save_safetensors": False,
    "dpo_label_smoothing": 0.1, "top_p": 0.9, "adam_beta1": 0.8, "adam_beta2": 0.99,
    "galore_target": "mlp", "apollo_target": "mlp", "oft_target": "q_proj,v_proj", "oft_block_size": 16,
    "reward_funcs": ["think_format", "<rewards>:letter_share"], "reward_weights": [2.0], "num_generations": 4,
    "generation_batch_size": 16,
}

# Where tuneline's default is not the schema's: checkpointing is on unless turned off, as in LLaMA-Factory;
# tuneline's datasets hold model inputs only, so no column is removed; the model is published once, at the end.
EFFECTIVE_DEFAULTS = {"gradient_checkpointing": True, "activation_checkpointing": True, "remove_unused_columns": False,
                      "hub_strategy": "end"}

# Keys whose effect shows only while a run goes (or in the flow around it): key -> the test that shows it.
RUNTIME: dict[str, str] = {
    "ppo_epochs": "tests/integration/train/test_ppo.py::test_ppo_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run",
    "reward_model_config": "tests/e2e/test_preference_flows.py::test_ppo_trains_its_reward_model_first_as_a_subflow",
    "resume_from_checkpoint": "tests/integration/train/test_checkpoints.py::test_resume_from_the_last_step_trains_no_extra_step",
    "overwrite_output_dir": "tests/integration/train/test_checkpoints.py::"
                            "test_same_key_resumes_and_other_key_is_refused_unless_overwrite",
    "discard_checkpoints": "tests/integration/train/test_resume_across_changes.py::"
                           "test_a_change_of_the_maths_is_refused_then_set_aside_never_deleted",
    "do_eval": "tests/integration/test_config_keys_honoured.py::test_do_eval_evaluates_a_model_that_does_not_train",
    "predict_with_generate": "tests/integration/train/test_trainers.py::"
                             "test_sft_full_trains_and_reports_accuracy_and_predictions",
    "skip_special_tokens": "tests/integration/train/test_trainers.py::test_sft_full_trains_and_reports_accuracy_and_predictions",
    "mlflow_registered_model": "tests/e2e/test_finetune_flow.py::test_flow_trains_tracks_and_caches",
    "eval_max_samples": "tests/integration/test_evaluate.py::test_evaluate_sft_scores_and_is_cached",
    "eval_max_new_tokens": "tests/integration/test_evaluate.py::test_evaluate_sft_scores_and_is_cached",
    "export_dir": "tests/integration/test_export.py::test_export_matches_base_plus_adapters",
    "export_legacy_format": "tests/integration/test_export.py::test_export_matches_base_plus_adapters",
    "export_size": "tests/integration/test_export.py::test_export_matches_base_plus_adapters",  # shards of the tiny model: one
    # what tuneline does whatever the key says: the non-default value asks for it, the default does not stop it
    "plot_loss": "tests/e2e/test_finetune_flow.py::test_flow_trains_tracks_and_caches",  # loss plots, always
    "include_effective_tokens_per_second": "tests/integration/train/test_trainers.py::"
                                           "test_sft_full_trains_and_reports_accuracy_and_predictions",  # throughput
    "report_to": "tests/e2e/test_finetune_flow.py::test_flow_trains_tracks_and_caches",  # MLflow, always
    # published by the flow after the model card, whatever the stage (the stand-in hub keeps what it received)
    "push_to_hub": "tests/e2e/test_publish_flow.py::"
                   "test_the_flow_publishes_the_model_and_its_card_once_and_records_where",
    **dict.fromkeys(["hub_model_id", "hub_private_repo", "hub_token"],
                    "tests/e2e/test_publish.py::test_the_final_model_and_the_card_are_uploaded_to_a_private_repo"),
    # ASFT's KL term, zero until the model moves from its frozen copy (the first step)
    "asft_alpha": "tests/integration/train/test_sft_anchored_losses.py::"
                  "test_asft_loss_anchors_to_the_model_before_training_also_when_resumed",
    # the rows of new tokens, which the batch's loss (rounded) does not show
    "init_special_tokens": "tests/integration/test_new_tokens.py::"
                           "test_described_tokens_start_from_their_descriptions_and_the_others_from_the_noisy_mean",
    **dict.fromkeys(["enable_torch_profiler", "profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps",
                     "profiler_active_steps", "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory",
                     "profiler_with_stack"], "tests/integration/train/test_torch_profiler.py::"
                                             "test_traces_follow_the_profiler_keys_and_reach_mlflow"),
    "hub_revision": "tests/e2e/test_publish.py::"
                    "test_without_hub_model_id_the_repo_is_named_after_output_dir_under_the_tokens_user",
}

# Keys whose effect needs what this machine may lack: a GPU, bitsandbytes, several processes.
MACHINE: dict[str, str] = {
    "use_cpu": "without a GPU tuneline trains on the CPU anyway",
    "dataloader_pin_memory": "transformers pins memory only with a GPU",
    "tf32": "TensorFloat-32 needs an Ampere or newer GPU; transformers refuses it elsewhere",
    "quantization_bit": "bitsandbytes quantization needs a CUDA GPU (refused without one: test_loader.py)",
    "quantization_type": "a 4-bit base, which needs a CUDA GPU",
    "double_quantization": "a 4-bit base, which needs a CUDA GPU",
    "ddp_backend": "a process group, which only a launch of several processes has",
    "use_vllm": "vLLM generation needs a CUDA GPU (refused without one: test_grpo.py)",
    "vllm_mode": "how vLLM runs, under use_vllm, which needs a CUDA GPU",
    "enable_liger_kernel": "liger-kernel's Triton kernels need a CUDA GPU (refused without one; the arguments it "
                           "hands the Trainer: test_liger_and_fp8.py)",
    **dict.fromkeys(["fp8", "fp8_backend", "fp8_enable_fsdp_float8_all_gather"],
                    "FP8 matmuls need a CUDA GPU with FP8 tensor cores (refused without one; the launch flags and "
                    "training arguments: test_liger_and_fp8.py)"),
}

# --- what runs, read from the objects a run is built from


class Recorder:
    """Wraps a loader (`from_pretrained`): records the keyword arguments of each call, then calls it."""

    def __init__(self, cls, name: str = "from_pretrained"):
        self.cls, self.name, self.calls = cls, name, []
        self.original = getattr(cls, name)

    def __call__(self, *args, **kwargs):
        self.calls.append({k: repr(v) for k, v in kwargs.items()})
        return self.original(*args, **kwargs)

    @contextlib.contextmanager
    def active(self):
        setattr(self.cls, self.name, self)
        try:
            yield self
        finally:
            setattr(self.cls, self.name, self.original)


def describe_optimizer(optimizer) -> dict:
    groups = [{k: repr(v) for k, v in group.items() if k != "params"} | {"size": len(group["params"])}
              for group in optimizer.param_groups]
    inner = getattr(optimizer, "base_optimizer", None)
    block = ("switch_block_every", "switch_mode", "current_block_idx", "update_ratio", "verbose", "mask_mode")
    return {"class": type(optimizer).__name__, "inner": type(inner).__name__ if inner else None,
            "defaults": {k: repr(v) for k, v in optimizer.defaults.items()}, "groups": groups,
            **{name: repr(getattr(optimizer, name)) for name in block if hasattr(optimizer, name)}}


def describe_model(model) -> dict:
    peft = getattr(model, "peft_config", None) or {}
    checkpointed = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    return {
        "class": type(model).__name__,
        "adapters": {name: {k: repr(v) for k, v in cfg.to_dict().items()} for name, cfg in peft.items()},
        "parameters": {n: (str(p.dtype), p.requires_grad, tuple(p.shape)) for n, p in model.named_parameters()},
        "checkpointed": len(checkpointed),
        "checkpoint_kwargs": sorted({repr(getattr(getattr(m, "_gradient_checkpointing_func", None), "keywords", None))
                                     for m in checkpointed}),
        "config": {k: repr(v) for k, v in model.config.to_dict().items()},
    }


def describe_callbacks(callbacks) -> list:
    """Each callback's class and its settings (numbers and names; not the clock times it keeps)."""
    return [(type(cb).__name__, {k: repr(v) for k, v in vars(cb).items()
                                 if isinstance(v, (int, float, str, bool)) and "time" not in k}) for cb in callbacks]


def model_loading(config, tokenizer, add_valuehead: bool = False) -> tuple[dict, Any]:
    """The model as a stage loads it, and the keyword arguments its weights were loaded with."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from tuneline.model import load_model

    recorders = [Recorder(AutoModelForCausalLM), Recorder(AutoModelForSequenceClassification)]
    with contextlib.ExitStack() as stack:
        for recorder in recorders:
            stack.enter_context(recorder.active())
        model = load_model(config, tokenizer, is_trainable=bool(config.training.get("do_train", True)),
                           add_valuehead=add_valuehead)
    return {"loaded_with": [r.calls for r in recorders], "model": describe_model(model)}, model


def nudged(model):
    """Trainable weights moved off their initial values (a LoRA policy starts equal to its reference)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def batch_loss(trainer) -> float:
    """The stage's loss of its first four training rows (no step taken)."""
    import torch

    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    trainer.model.eval()
    with torch.no_grad():
        return round(float(trainer.compute_loss(trainer.model, batch)), 6)


def trainer_built(config, tokenizer, dataset_ref, step: bool = False) -> dict:
    """The trainer a stage builds: model, optimizer and learning rates, callbacks, collator, metrics; with `step`,
    only the loss of a batch."""
    from tuneline.data import build_collator, load_processed
    from tuneline.train import STAGE_MODULES
    from tuneline.train.callbacks import build_callbacks
    from tuneline.train.trainer_base import StageSpec, build_trainer
    from tuneline.train.training_args import build_training_args

    module = __import__(STAGE_MODULES[config.stage], fromlist=["run"])
    if config.stage in ("dpo", "kto"):
        trainer_class = module.DPOTrainer if config.stage == "dpo" else module.KTOTrainer
        spec = StageSpec(name=config.stage, trainer_class=partial(trainer_class, ref_model=None))
    else:
        spec = module.SPEC
    args = build_training_args(config)
    described, model = model_loading(config, tokenizer, spec.add_valuehead)
    collator = build_collator(spec.name, tokenizer, config.data.pad_to_multiple_of)
    trainer = build_trainer(config, spec, nudged(model), tokenizer, load_processed(dataset_ref), collator,
                            build_callbacks(config, args.output_dir), args=args)
    if step:
        return {"loss": batch_loss(trainer) if args.do_train else None}
    optimizer = trainer.create_optimizer()
    scheduler = trainer.create_scheduler(num_training_steps=8, optimizer=optimizer)
    lrs = [[group["lr"] for group in optimizer.param_groups]]
    for _ in range(4):
        scheduler.step()
        lrs.append(scheduler.get_last_lr())
    return {**described, "trainer": type(trainer).__name__, "optimizer": describe_optimizer(optimizer), "lrs": lrs,
            "callbacks": describe_callbacks(trainer.callback_handler.callbacks),
            "collator": {k: repr(v) for k, v in vars(collator).items()},
            "metrics": [getattr(trainer.compute_metrics, "__name__", None),
                        getattr(trainer.preprocess_logits_for_metrics, "__name__", None)],
            "columns": trainer.train_dataset.column_names}


def ppo_loop_built(config, tokenizer, dataset_ref, step: bool = False) -> dict:
    """PPO's own loop: the policy, optimizer, schedule, learning rates, prompt loader and KL control; with `step`,
    only a rollout (sampled answers, advantages and returns)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from tuneline.data import build_collator, load_processed
    from tuneline.train.ppo import PPOLoop
    from tuneline.train.ppo_models import ValueHead, load_reference
    from tuneline.train.ppo_schedule import PPOSchedule, loader_settings, lr_scheduler
    from tuneline.train.training_args import build_training_args

    args = build_training_args(config)
    described, policy = model_loading(config, tokenizer)
    torch.manual_seed(0)
    scorer = AutoModelForSequenceClassification.from_pretrained(config.model.model_name_or_path, num_labels=1,
                                                                pad_token_id=tokenizer.pad_token_id).eval()
    reference, context = load_reference(config, tokenizer, policy)
    loop = PPOLoop(config, args, nudged(policy), tokenizer, scorer, ValueHead(policy.config.hidden_size), reference,
                   context)
    prompts = load_processed(dataset_ref)["train"]
    if step:
        tokenizer.padding_side = "left"
        try:
            torch.manual_seed(0)
            roll = loop.rollout(build_collator("ppo", tokenizer)([prompts[i] for i in range(4)]))
        finally:
            tokenizer.padding_side = "right"
        return {"rollout": (roll.ids.tolist(), [round(float(x), 5) for x in roll.advantages.flatten()],
                            [round(float(x), 5) for x in roll.returns.flatten()])}
    plan = PPOSchedule.plan(args, config.finetuning.ppo_buffer_size, len(prompts))
    scheduler = lr_scheduler(loop.optimizer, args, plan.max_steps)
    lrs = []
    for _ in range(6):
        scheduler.step()
        lrs.append(scheduler.get_last_lr())
    steps = range(1, 3 * plan.per_epoch + 1)
    return {**described, "optimizer": describe_optimizer(loop.optimizer), "lrs": lrs, "plan": dataclasses.asdict(plan),
            "saves": [s for s in steps if plan.saves_at(s)], "logs": [s for s in steps if plan.logs_at(s)],
            "loader": loader_settings(args), "kl": (loop.kl.coef, loop.kl.target), "device": str(args.device)}


def dataset_built(config, tokenizer) -> dict:
    from tuneline.data import build_dataset

    return {k: v for k, v in build_dataset(config).items() if k != "tokens"}


def tokenizer_loaded(config, tokenizer) -> dict:
    from transformers import AutoTokenizer

    from tuneline.model import load_tokenizer

    with Recorder(AutoTokenizer).active() as recorder:
        loaded = load_tokenizer(config.model)
    return {"loaded_with": recorder.calls, "size": len(loaded), "special": loaded.all_special_tokens}


def generation_settings(config, tokenizer) -> dict | None:
    """What `predict_with_generate` generates with (PPO samples in its rollout: see `training`)."""
    from tuneline.evaluation.generation import eos_token_ids
    from tuneline.evaluation.prediction import generation_config

    if config.stage == "ppo":
        return None
    settings = generation_config(config, tokenizer, eos_token_ids(tokenizer, None)).to_dict()
    return {k: v for k, v in settings.items() if k != "transformers_version"}


def launch_command(config, tokenizer) -> list[str]:
    from tuneline.pipeline.launch import launcher

    return launcher(config)


def models_referred(config, tokenizer) -> dict:
    """Where the reference and reward models come from, and the names the run is tracked under."""
    from tuneline.objectives.rewards import reward_config
    from tuneline.reference import needs_reference, reference_source

    reward = reward_config(config) if config.finetuning.reward_model else None
    return {"reference": (needs_reference(config), reference_source(config)),
            "reward": (reward.model.model_name_or_path, reward.model.adapter_name_or_path,
                       reward.finetuning.finetuning_type) if reward else None,
            "tracked_as": (config.run_name, config.experiment_name, config.pipeline.mlflow_tracking_uri)}


# TrainingArguments fields transformers' Trainer never reads: they reach a run only through tuneline's own code.
NOT_READ_BY_TRAINER = {"do_train", "do_eval", "do_predict", "resume_from_checkpoint", "sortish_sampler",
                       "predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config",
                       "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"}


def training_arguments(config, tokenizer) -> dict | None:
    """The TrainingArguments a Trainer stage trains with, as transformers reads them (PPO's loop: see `training`)."""
    from tuneline.train.training_args import build_training_args

    if config.stage == "ppo":
        return None
    if config.stage == "grpo":  # trl's GRPOConfig, and the reward functions its trainer calls
        from tuneline.objectives.grpo_rewards import resolve_reward_funcs
        from tuneline.train.grpo import grpo_training_args

        return {**grpo_training_args(config).to_dict(), "rewards": resolve_reward_funcs(config, tokenizer)[1]}
    args = build_training_args(config)
    read = {k: v for k, v in args.to_dict().items() if k not in NOT_READ_BY_TRAINER}
    return {**read, "hub_token": args.hub_token is not None}  # to_dict masks it, given or not


def inference_loading(config, tokenizer) -> dict:
    """What evaluation and `tuneline export` load the base with (its dtype: `infer_dtype`)."""
    from transformers import AutoModelForCausalLM

    from tuneline.model import load_model

    with Recorder(AutoModelForCausalLM).active() as recorder:
        model = load_model(config, tokenizer, is_trainable=False, adapters="")
    return {"loaded_with": recorder.calls, "use_cache": (model.config.use_cache, model.generation_config.use_cache)}


def training_built(config, tokenizer, step: bool = False) -> dict:
    from tuneline.data import build_dataset

    build = ppo_loop_built if config.stage == "ppo" else trainer_built
    return build(config, tokenizer, build_dataset(config), step)


# In order of cost: a key is followed until the first section it changes.
SECTIONS = {"dataset": dataset_built, "tokenizer": tokenizer_loaded, "generation": generation_settings,
            "launch": launch_command, "models": models_referred, "arguments": training_arguments,
            "inference": inference_loading, "training": training_built,
            "step": partial(training_built, step=True)}

# --- the values tried


def default_of(key: str) -> Any:
    from transformers import Seq2SeqTrainingArguments

    if key in EFFECTIVE_DEFAULTS:
        return EFFECTIVE_DEFAULTS[key]
    if key in GROUP_FIELDS:
        fld = GROUP_FIELDS[key][1]
        return fld.default_factory() if fld.default_factory is not dataclasses.MISSING else fld.default
    if key in UNSUPPORTED_KEYS:
        return UNSUPPORTED_KEYS[key]
    if key in TRAINING_DEFAULTS:
        return TRAINING_DEFAULTS[key]
    fields = {f.name: f.default for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init}
    return getattr(fields.get(key), "value", fields.get(key))  # enums as their YAML spelling


ONLY_VALUE = object()  # a key whose choices allow one value: nothing else can be set


def other_value(key: str, current: Any) -> Any:
    """A valid value of `key` other than `current`."""
    if key in VALUES and VALUES[key] != current:
        return VALUES[key]
    if key in UNSUPPORTED_KEYS:
        return "on" if not isinstance(current, bool) else not current
    choices = GROUP_FIELDS[key][1].metadata.get("choices") if key in GROUP_FIELDS else None
    if choices:
        return next((c for c in choices if c != current), ONLY_VALUE)
    kind = TRAINING_KEYS.get(key) or next((k for k in ("bool", "int", "float") if k in str(GROUP_FIELDS[key][2])), "")
    if kind == "bool":
        return not current
    if kind == "int":
        return (current or 0) + 2
    if kind == "float":
        return current * 2 if current else 0.5
    raise AssertionError(f"give '{key}' a valid value in VALUES: its type suggests none")


@pytest.fixture(scope="module")
def world(tiny_model_dir, tmp_path_factory):
    """The files the tried values name (placeholders in CONTEXTS and VALUES), the base config and the tokenizer."""
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model
    from tuneline.demo.tiny_vlm import build_tiny_vlm
    from tuneline.model import load_tokenizer

    tmp = tmp_path_factory.mktemp("keys")
    other = build_tiny_model(tmp / "model2", **{**TINY_PRESETS["test"], "num_hidden_layers": 3})
    adapter = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"]))
    adapter.save_pretrained(str(tmp / "adapter"))
    shutil.copytree(DATA, tmp / "data2")
    shutil.copytree(MEDIA_DATA, tmp / "media_data")
    pictures = tmp / "media2" / "mllm_demo_data"  # the same names holding other pictures
    pictures.mkdir(parents=True)
    for name, other in (("1.jpg", "2.jpg"), ("2.jpg", "3.jpg"), ("3.jpg", "1.jpg")):
        shutil.copy(MEDIA_DATA / "mllm_demo_data" / other, pictures / name)
    rows = json.loads((DATA / "demo_sft.json").read_text())
    (tmp / "data2" / "demo_sft.json").write_text(json.dumps(rows[1:]))  # another dataset under the same name
    (tmp / "rm.yaml").write_text(f"stage: rm\nmodel_name_or_path: {tiny_model_dir}\ndataset: demo_pref\n")
    (tmp / "accelerate.yaml").write_text("distributed_type: NO\nnum_processes: 1\n")
    (tmp / "rewards.py").write_text("def letter_share(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    (tmp / "zero2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (tmp / "tokens.yaml").write_text("<|svg_start|>: the beginning of a picture\n")
    vlm = build_tiny_vlm(tmp / "vlm", "gemma3")  # image rows need a vision-language model
    intern_vl = build_tiny_vlm(tmp / "intern_vl", "intern_vl")  # crop_to_patches tiles InternVL's images
    places = {"<model2>": str(other), "<model>": str(tiny_model_dir), "<vlm>": str(vlm), "<intern_vl>": str(intern_vl),
              "<adapter>": str(tmp / "adapter"),
              "<data2>": str(tmp / "data2"), "<media_data>": str(tmp / "media_data"), "<media2>": str(tmp / "media2"),
              "<rm_config>": str(tmp / "rm.yaml"), "<rewards>": str(tmp / "rewards.py"),
              "<accelerate>": str(tmp / "accelerate.yaml"), "<zero2>": str(tmp / "zero2.json"),
              "<tokens>": str(tmp / "tokens.yaml"), "<tmp>": str(tmp)}
    base = {"model_name_or_path": str(tiny_model_dir), "dataset": "demo_sft", "dataset_dir": str(DATA),
            "max_samples": 16, "output_dir": str(tmp / "out"), "pipeline_cache_dir": str(tmp / "cache"),
            "mlflow_tracking_uri": f"sqlite:///{tmp}/mlflow.db", "disable_tqdm": True}
    return {"places": places, "base": base, "tokenizer": load_tokenizer(load_config(None, base).model),
            "observed": {}}


def resolve(value: Any, places: dict[str, str]) -> Any:
    if isinstance(value, list):
        return [resolve(item, places) for item in value]
    if isinstance(value, str):
        for name, path in places.items():
            value = value.replace(name, path)
    return value


def tried(key: str, world, context: dict | None = None) -> tuple[dict, dict]:
    """(a config where `key` applies, the same with `key` set to another valid value)."""
    places = world["places"]
    context = context if context is not None else CONTEXTS.get(key, {})
    values = {**world["base"], **{k: resolve(v, places) for k, v in context.items()}}
    value = other_value(key, values.get(key, default_of(key)))
    return values, {**values, key: value if value is ONLY_VALUE else resolve(value, places)}


def observe(world, values: dict, section: str) -> Any:
    """What `section` shows for the config `values`, built once; built twice the first time, so that what a tried
    key's build is compared with is a second build (the dataset step's a cache hit)."""
    cache_key = (json.dumps(values, sort_keys=True, default=str), section)
    if cache_key not in world["observed"]:
        SECTIONS[section](load_config(None, values), world["tokenizer"])
        world["observed"][cache_key] = SECTIONS[section](load_config(None, values), world["tokenizer"])
    return world["observed"][cache_key]


def effect_of(key: str, values: dict, changed: dict, world) -> str:
    """'refused' (naming the key), or the first section of what runs the key changed, or 'nothing'."""
    if changed[key] is ONLY_VALUE:
        return "refused"  # its choices allow no other value
    try:
        config = load_config(None, changed)
    except ConfigError as exc:
        assert f"'{key}" in str(exc), f"refused without naming '{key}': {exc}"
        assert not re.search(f"'{key}' is .*; (it must|allowed)", str(exc)), f"give '{key}' a valid value: {exc}"
        return "refused"
    for section in SECTIONS:
        before = observe(world, values, section)  # first: a dataset the tried key shares is then a cache hit
        if SECTIONS[section](config, world["tokenizer"]) != before:
            return section
    return "nothing"


# --- the walks


@pytest.mark.parametrize("key", sorted(set(ALL_KEYS) - set(RUNTIME) - set(MACHINE)))
def test_each_key_changes_what_runs_or_is_refused(key, world):
    values, changed = tried(key, world)
    assert effect_of(key, values, changed, world) != "nothing", (
        f"'{key}: {changed[key]!r}' is accepted and changes nothing that runs: wire it, refuse it in "
        "tuneline/config, or (if its effect shows only while training) name the test that shows it in RUNTIME")


# A config where each scoped key does not apply, where the sft LoRA base is one where it does.
FULL, RM = {"finetuning_type": "full"}, {"stage": "rm", "dataset": "demo_pref"}
OUTSIDE = {**dict.fromkeys(["temperature", "top_p", "top_k"], {"do_sample": False}),
           **dict.fromkeys(["lora_rank", "lora_alpha", "lora_dropout", "lora_target", "additional_target", "use_dora",
                            "use_rslora"], FULL),
           **dict.fromkeys(["compute_accuracy", "predict_with_generate", "label_smoothing_factor", "use_dft_loss",
                            "use_eaft_loss", "use_asft_loss"], RM),
           "save_steps": {"save_strategy": "no"}, "optim_args": {"optim": "adamw_torch"}}


@pytest.mark.parametrize("key", sorted(SCOPE))
def test_a_key_set_where_it_does_not_apply_is_refused(key, world):
    applies, _ = SCOPE[key]
    values, changed = tried(key, world, OUTSIDE.get(key, {}))
    if key == "precompute_ref":
        changed[key] = True  # an sft run computes no reference log-probs: asking for them is what does nothing
    assert not applies(load_config(None, values)), f"{key} applies in the base config: give it a context in OUTSIDE"
    with pytest.raises(ConfigError, match=f"'{key}: .*' has no effect in this run: it applies only"):
        load_config(None, changed)


PPO_WALK = sorted((set(TRAINING_KEYS) | {f.name for f in dataclasses.fields(GeneratingArgs)}) - set(MACHINE)
                  - {"resume_from_checkpoint", "overwrite_output_dir", "report_to"}  # RUNTIME: the same in ppo
                  - (set(RUNTIME) & PUBLISH_KEYS))  # the flow publishes after any stage


def read_by_ppo() -> set[str]:
    """TrainingArguments attributes the PPO loop's modules read (`args.<name>`, `loop.args.<name>`)."""
    names = set()
    for path in (REPO / "tuneline" / "train").glob("ppo*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (
                    (isinstance(node.value, ast.Name) and node.value.id == "args")
                    or (isinstance(node.value, ast.Attribute) and node.value.attr == "args")):
                names.add(node.attr)
    return names


# Keys that act before PPO's loop starts, where one process cannot show them.
BEFORE_THE_LOOP = {"ddp_timeout": "the process group the training entry point sets up from TrainingArguments",
                   "local_rank": "the process's device, which accelerate's launcher assigns"}


def ppo_context(key: str, world) -> dict:
    """`stage: ppo` plus the key's own context, where that context is one PPO runs in."""
    combined = {**PPO, **CONTEXTS.get(key, {})}
    try:
        load_config(None, {**world["base"], **{k: resolve(v, world["places"]) for k, v in combined.items()}})
    except ConfigError:
        return PPO
    return combined


@pytest.mark.parametrize("key", PPO_WALK)
def test_each_training_key_changes_the_ppo_loop_or_is_refused(key, world):
    """Under `stage: ppo` a key the loop reads at each step (max_grad_norm, save_total_limit) counts as honoured
    where the loop's code reads it from the training arguments; the others must show in what the loop is built
    with (or act before it, BEFORE_THE_LOOP), or be refused."""
    values, changed = tried(key, world, ppo_context(key, world))
    effect = effect_of(key, values, changed, world)
    assert effect != "nothing" or key in read_by_ppo() or key in BEFORE_THE_LOOP, (
        f"'{key}: {changed[key]!r}' under 'stage: ppo' is accepted and changes nothing the PPO loop runs with: "
        "honour it in tuneline/train/ppo.py or refuse it in tuneline/config/ppo_keys.py")


def test_the_tables_name_real_keys_and_real_tests():
    assert set(CONTEXTS) | set(VALUES) | set(RUNTIME) | set(MACHINE) | set(BEFORE_THE_LOOP) <= set(ALL_KEYS)
    assert not set(RUNTIME) & set(MACHINE)
    for key, test in RUNTIME.items():
        path, _, name = test.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(), f"RUNTIME['{key}'] names a missing test: {test}"


def test_do_eval_evaluates_a_model_that_does_not_train(world):
    """`do_eval` matters when nothing trains: the model is evaluated on the validation split, or not at all."""
    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.train.sft import SPEC
    from tuneline.train.trainer_base import build_trainer, train_and_evaluate

    results = {}
    for do_eval in (False, True):
        config = load_config(None, {**world["base"], "val_size": 4, "do_train": False, "do_eval": do_eval})
        model = model_loading(config, world["tokenizer"])[1]
        trainer = build_trainer(config, SPEC, model, world["tokenizer"], load_processed(build_dataset(config)),
                                build_collator("sft", world["tokenizer"]), [])
        results[do_eval] = train_and_evaluate(trainer, config, SPEC, world["tokenizer"])
    assert "eval_loss" not in results[False] and "eval_loss" in results[True]

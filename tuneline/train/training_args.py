"""Build transformers' Seq2SeqTrainingArguments from `config.training`, translating LLaMA-Factory's legacy keys."""

from __future__ import annotations

import sys
from typing import Any

from tuneline.config.training_keys import PUBLISH_KEYS
from tuneline.errors import ConfigError


def _group_by_length(value: Any) -> dict[str, Any]:
    return {"train_sampling_strategy": "group_by_length"} if value else {}


def _drop(_value: Any) -> dict[str, Any]:
    return {}


# Legacy key -> the TrainingArguments kwargs it means in transformers 5.
LEGACY_TRANSLATIONS = {
    "overwrite_output_dir": _drop,  # tuneline's own meaning, handled by output_dir.py
    "logging_dir": _drop,  # transformers 5 has no logging_dir; tuneline logs to trainer_log.jsonl and MLflow
    "save_safetensors": _drop,  # always safetensors in transformers 5
    "group_by_length": _group_by_length,
    "evaluation_strategy": lambda v: {"eval_strategy": v} if v is not None else {},
    "warmup_ratio": lambda v: {"warmup_steps": float(v)} if v else {},  # a float < 1 is read as a ratio
}
# Keys tuneline owns or passes elsewhere: resume goes to trainer.train(); the hub keys to tuneline.hub.publish, after the
# model card (a Trainer given push_to_hub creates the repo when built and uploads from inside training at each save).
NOT_ARGUMENTS = frozenset({"resume_from_checkpoint", *PUBLISH_KEYS})


def translate_training_keys(training: dict[str, Any]) -> dict[str, Any]:
    """config.training -> TrainingArguments kwargs (no torch import, so it is cheap to test)."""
    kwargs = {k: v for k, v in training.items() if k not in LEGACY_TRANSLATIONS and k not in NOT_ARGUMENTS}
    for key, translate in LEGACY_TRANSLATIONS.items():
        if key in training:
            for new_key, value in translate(training[key]).items():
                if new_key == "warmup_steps" and kwargs.get("warmup_steps"):
                    continue  # an explicit warmup_steps wins over warmup_ratio
                if new_key == "eval_strategy":
                    kwargs.setdefault(new_key, value)  # the new name wins over the legacy one
                else:
                    kwargs[new_key] = value
    kwargs["report_to"] = "none"  # the config allows none or mlflow, and the training logs to MLflow itself
    kwargs["remove_unused_columns"] = False  # our datasets are tokenized already; every column is an input
    kwargs.setdefault("include_num_input_tokens_seen", "non_padding")  # trained tokens for throughput
    kwargs.setdefault("ddp_find_unused_parameters", False)
    return kwargs


def device_defaults(kwargs: dict[str, Any], config) -> dict[str, Any]:
    """CPU when no GPU; bf16/fp16 autocast matching the dtype tuneline.model loads the weights in (FP8 instead with
    `fp8`); liger-kernel with `enable_liger_kernel`."""
    import torch

    from tuneline.model.precision import training_precision
    from tuneline.train.liger_and_fp8 import apply_liger_and_fp8

    if not torch.cuda.is_available():
        kwargs.setdefault("use_cpu", True)
    precision = training_precision(config)
    kwargs["bf16"], kwargs["fp16"] = precision == "bf16", precision == "fp16"
    kwargs.setdefault("disable_tqdm", not sys.stderr.isatty())  # progress goes to trainer_log.jsonl instead
    return apply_liger_and_fp8(kwargs, config)


def build_training_args(config, **overrides: Any):
    """Seq2SeqTrainingArguments for this run; transformers' own validation errors become a ConfigError."""
    from transformers import Seq2SeqTrainingArguments

    kwargs = device_defaults(translate_training_keys(config.training), config)
    if config.finetuning.early_stopping_steps:
        kwargs.setdefault("metric_for_best_model", "eval_loss")
        if kwargs.get("eval_strategy", "no") == "no":  # transformers would fail an assert once the model is loaded
            raise ConfigError(f"'early_stopping_steps: {config.finetuning.early_stopping_steps}' counts evaluations "
                              "without improvement, but none run: set 'eval_strategy: steps' (with 'eval_steps') or "
                              "'eval_strategy: epoch'", source=config.source)
    if config.finetuning.disable_shuffling:
        kwargs.setdefault("train_sampling_strategy", "sequential")
    kwargs.update(overrides)
    try:
        return Seq2SeqTrainingArguments(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"training arguments rejected by transformers: {exc}", source=config.source) from None

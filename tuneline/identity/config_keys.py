"""The keys computed from the config, the model and other keys alone: what the steps' own code imports (the
tokenizer check, the evaluation, a training run alone), so that they reach no data or reference code. Cheap by
design: no torch, transformers or datasets import.

The same key names the step's folder and Prefect's cache entry. Each step's key holds the version of the code it runs
(`step_code_version`); the resume and run keys hold none on purpose, so a checkpoint resumes across an edit of the code
that does not change what its optimisation depends on."""

from __future__ import annotations

from typing import Any

from tuneline.config import RunConfig
from tuneline.content.code import step_code_version
from tuneline.content.fingerprint import fingerprint, memo_dir
from tuneline.identity.settings import EVAL_ONLY, NOT_CONTENT, weight_neutral_keys
from tuneline.model.fingerprint import reward_model_fingerprint
from tuneline.model.tokenizer import tokenizer_fingerprint


def tokenizer_key(config: RunConfig) -> str:
    return fingerprint("load-tokenizer", tokenizer_fingerprint(config.model, memo_dir(config)),
                       step_code_version("load-tokenizer"))


def base_model_key(config: RunConfig) -> str:
    from tuneline.model import model_fingerprint

    return model_fingerprint(config, memo_dir(config))


def training_slice(config: RunConfig) -> dict:
    flat = config.flat()
    return {k: v for k, v in flat.items() if k not in NOT_CONTENT | EVAL_ONLY}


def train_key(config: RunConfig, dataset_fp: str, reference_fp: str) -> str:
    return fingerprint("train", training_slice(config), dataset_fp, reference_fp, base_model_key(config),
                       reward_model_fingerprint(config, memo_dir(config)), step_code_version("train"))


def resume_key(config: RunConfig, dataset_fp: str, reference_fp: str) -> str:
    """What a checkpoint's optimisation depends on: the train key less the code and the settings that only change how a
    run is watched or stored. A run whose train key differs but whose resume key matches resumes."""
    neutral = weight_neutral_keys(config)
    shaping = {k: v for k, v in training_slice(config).items() if k not in neutral}
    return fingerprint("resume", shaping, dataset_fp, reference_fp, base_model_key(config),
                       reward_model_fingerprint(config, memo_dir(config)))


def plot_key(train_key: str) -> str:
    return fingerprint("plot", train_key, step_code_version("plot"))


def model_card_key(config: RunConfig, train_key: str, base_eval_fp: str, tuned_eval_fp: str, run_id: str | None) -> str:
    """The card shows the settings (all of them, the run name too), both evaluations and the MLflow run's link."""
    return fingerprint("model-card", train_key, base_eval_fp, tuned_eval_fp, run_id, config.masked(),
                       step_code_version("model-card"))


def work_key(config: RunConfig, run_key: str) -> str:
    """This exact work (every setting the train key holds, within that training): only a finished run with this
    key stands for this config's result (a cached rerun reopens it, an export downloads its model)."""
    return fingerprint("work", run_key, training_slice(config))


def standalone_key(config: RunConfig, dataset_ref: dict[str, Any] | None) -> str:
    """The key of a training when the child runs alone (no flow gave it the step's keys): the resume key of its data
    (by fingerprint, or the folder named to it) without a reference step, serving as both keys, so an edit of the
    code resumes the run's checkpoints."""
    data = dataset_ref or {}
    return resume_key(config, data.get("fingerprint") or data.get("path"), None)


# The config keys that change an evaluation's result (besides the model and the data).
EVAL_KEYS = ("stage", "cutoff_len", "template", "eval_max_samples", "eval_max_new_tokens",
             "per_device_eval_batch_size", "seed")
# What PPO's evaluation also reads: the reward model scores answers sampled with the generating config.
PPO_EVAL_KEYS = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty")
GRPO_EVAL_KEYS = ("max_completion_length",)  # grpo's answers are as long as in training


def evaluation_key(config: RunConfig, model_key: str, dataset_fp: str) -> str:
    """One evaluation's result: the model, the data, what the evaluation reads of the config, and its code."""
    reward_model = reward_model_fingerprint(config, memo_dir(config))  # memoised: a large reward model is read once
    sampled = PPO_EVAL_KEYS + (GRPO_EVAL_KEYS if config.stage in ("grpo", "rloo") else ())
    sampling = config.slice(*sampled) if reward_model else None
    return fingerprint("evaluate", step_code_version("evaluate"), model_key, dataset_fp,
                       config.slice(*EVAL_KEYS), reward_model, sampling)


# What changes the answers besides the model and the data: how rows are encoded and batched, and how to generate.
PREDICT_KEYS = ("stage", "cutoff_len", "template", "per_device_eval_batch_size", "seed", "do_sample", "temperature",
                "top_p", "top_k", "num_beams", "max_new_tokens", "repetition_penalty", "length_penalty",
                "skip_special_tokens", "generation_max_length", "generation_num_beams")


def predict_key(config: RunConfig, model_key: str, dataset_fp: str) -> str:
    return fingerprint("predict", step_code_version("predict"), model_key, dataset_fp,
                       config.slice(*PREDICT_KEYS))

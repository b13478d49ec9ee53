"""Content keys of every cached step, and of a training's resume and MLflow run. Cheap by design: no torch,
transformers or datasets import.

The same key names the step's folder and Prefect's cache entry. Each step's key holds the version of the code it runs
(`step_code_version`); the resume and run keys hold none on purpose, so a checkpoint resumes across an edit of the code
that does not change what its optimisation depends on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneline.config import RunConfig
from tuneline.content.fingerprint import fingerprint, memo_dir
from tuneline.identity import step_code_version
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


STANDALONE_VERSION = "train-1"  # a training the child runs alone: part of its key, bumped by hand only


def standalone_key(config: RunConfig, dataset_ref: dict[str, Any] | None) -> str:
    """The key of a training when the child runs alone (no flow gave it the step's keys); it serves as the resume key
    too, so like the resume key it holds no code version: an edit of the code resumes the run's checkpoints."""
    from tuneline.model.fingerprint import model_fingerprint

    model_fp = model_fingerprint(config, Path(config.pipeline.pipeline_cache_dir) / "hashes")
    neutral = weight_neutral_keys(config)
    shaping = {}
    for group in (config.model, config.finetuning):
        shaping.update({k: v for k, v in vars(group).items() if k not in neutral})
    shaping.update({k: v for k, v in config.training.items() if k not in neutral})
    data_fp = (dataset_ref or {}).get("fingerprint") or (dataset_ref or {}).get("path")
    return fingerprint(STANDALONE_VERSION, model_fp, data_fp, shaping)

"""Content keys of every cached step. Cheap by design: no torch, transformers or datasets import.

The same key names the step's folder and Prefect's cache entry."""

from __future__ import annotations

from tuneline.config import RunConfig
from tuneline.fingerprint import fingerprint, memo_dir
from tuneline.identity import step_code_version
from tuneline.identity.settings import EVAL_ONLY, NOT_CONTENT, weight_neutral_keys
from tuneline.model.fingerprint import reward_model_fingerprint
from tuneline.model.tokenizer import tokenizer_fingerprint


def tokenizer_key(config: RunConfig) -> str:
    return tokenizer_fingerprint(config.model, memo_dir(config))


def dataset_key(config: RunConfig) -> str:
    from tuneline.data import dataset_fingerprint

    return dataset_fingerprint(config)


def base_model_key(config: RunConfig) -> str:
    from tuneline.model import model_fingerprint

    return model_fingerprint(config, memo_dir(config))


def reference_key(config: RunConfig, dataset_fp: str) -> str:
    from tuneline.reference import needs_reference, reference_fingerprint

    if not needs_reference(config):
        return fingerprint("no-reference", config.stage, config.finetuning.pref_loss)
    return reference_fingerprint(config, dataset_fp)


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


def run_key(config: RunConfig, dataset_fp: str) -> str:
    """Names one training in MLflow: starts that resume one another's checkpoints (same resume key, same output_dir)
    share a run, while the same training run again into another output_dir gets a run of its own."""
    where = str(config.output_dir.expanduser().resolve())
    return fingerprint("run", resume_key(config, dataset_fp, reference_key(config, dataset_fp)), where)


def work_key(config: RunConfig, run_key: str) -> str:
    """This exact work (every setting the train key holds, within that training): only a finished run with this
    key stands for this config's result (a cached rerun reopens it, an export downloads its model)."""
    return fingerprint("work", run_key, training_slice(config))

"""Every step's key, the flow's one import of them: those computed from the config alone (config_keys), and the
dataset, reference and run keys, whose inputs tuneline.data and tuneline.reference read (data files, media, the rows
a run visits; each holding its step's code version).

The same key names the step's folder and Prefect's cache entry."""

from tuneline.config import RunConfig
from tuneline.content.fingerprint import fingerprint
from tuneline.data.cache_key import dataset_fingerprint
from tuneline.identity.config_keys import (
    base_model_key,
    evaluation_key,
    model_card_key,
    plot_key,
    predict_key,
    resume_key,
    standalone_key,
    tokenizer_key,
    train_key,
    training_slice,
    work_key,
)
from tuneline.reference import needs_reference, reference_fingerprint

__all__ = ["base_model_key", "dataset_key", "evaluation_key", "model_card_key", "plot_key", "predict_key",
           "reference_key", "resume_key", "run_key", "standalone_key", "tokenizer_key", "train_key", "training_slice",
           "work_key"]


def dataset_key(config: RunConfig) -> str:
    return dataset_fingerprint(config)


def reference_key(config: RunConfig, dataset_fp: str) -> str:
    if not needs_reference(config):
        return fingerprint("no-reference", config.stage, config.finetuning.pref_loss)
    return reference_fingerprint(config, dataset_fp)


def run_key(config: RunConfig, dataset_fp: str) -> str:
    """Names one training in MLflow: starts that resume one another's checkpoints (same resume key, same output_dir)
    share a run, while the same training run again into another output_dir gets a run of its own."""
    where = str(config.output_dir.expanduser().resolve())
    return fingerprint("run", resume_key(config, dataset_fp, reference_key(config, dataset_fp)), where)

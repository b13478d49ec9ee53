"""The keys whose ingredients tuneline.data and tuneline.reference compute (they name their own folders with them,
each holding its step's code version from tuneline.identity), and the flow's one import of every other key, which
tuneline.identity.keys computes."""

from tuneline.config import RunConfig
from tuneline.content.fingerprint import fingerprint
from tuneline.identity.keys import (
    base_model_key,
    model_card_key,
    plot_key,
    resume_key,
    tokenizer_key,
    train_key,
    training_slice,
    work_key,
)

__all__ = ["base_model_key", "dataset_key", "model_card_key", "plot_key", "reference_key", "resume_key", "run_key",
           "tokenizer_key", "train_key", "training_slice", "work_key"]


def dataset_key(config: RunConfig) -> str:
    from tuneline.data import dataset_fingerprint

    return dataset_fingerprint(config)


def reference_key(config: RunConfig, dataset_fp: str) -> str:
    from tuneline.reference import needs_reference, reference_fingerprint

    if not needs_reference(config):
        return fingerprint("no-reference", config.stage, config.finetuning.pref_loss)
    return reference_fingerprint(config, dataset_fp)


def run_key(config: RunConfig, dataset_fp: str) -> str:
    """Names one training in MLflow: starts that resume one another's checkpoints (same resume key, same output_dir)
    share a run, while the same training run again into another output_dir gets a run of its own."""
    where = str(config.output_dir.expanduser().resolve())
    return fingerprint("run", resume_key(config, dataset_fp, reference_key(config, dataset_fp)), where)

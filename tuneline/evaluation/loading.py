"""Load what an evaluation needs: the model to score and the data, through `tuneline.model.load_model` so evaluation
sees exactly what training saw."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tuneline.config.args import ADAPTER_TYPES
from tuneline.config.run_config import split_names
from tuneline.content.records import BuiltDataset
from tuneline.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
# Stages whose model is a sequence scorer (one reward per sequence) rather than a language model.
SCORER_STAGES = frozenset({"rm"})


def eval_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def tuned_adapters(config, adapter_dir: str) -> list[str]:
    """The adapters that make up the tuned model, as training built it: without `create_new_adapter` the saved adapter
    replaces the last of `adapter_name_or_path`, otherwise it comes on top of all of them."""
    existing = split_names(config.model.adapter_name_or_path)
    continues_last = (config.finetuning.finetuning_type in ADAPTER_TYPES and existing
                      and not config.finetuning.create_new_adapter)
    return (existing[:-1] if continues_last else existing) + [str(adapter_dir)]


def load_eval_model(config, tokenizer, adapter_dir: str | None):
    """The model in eval mode on the eval device; a folder with adapter_config.json is a peft adapter, any other
    folder a full model (full or freeze fine-tuning), which already holds any adapters it was trained from."""
    from tuneline.model import load_model

    scorer = config.stage in SCORER_STAGES
    folder = Path(adapter_dir) if adapter_dir else None
    if folder is None:
        model = load_model(config, tokenizer, is_trainable=False, add_valuehead=scorer)
    elif not folder.is_dir():
        raise UserError(f"the model to evaluate, '{folder}', does not exist", title="cannot evaluate")
    elif (folder / ADAPTER_CONFIG).is_file():
        adapters = ",".join(tuned_adapters(config, str(folder)))
        model = load_model(config, tokenizer, is_trainable=False, add_valuehead=scorer, adapters=adapters)
    else:
        full = dataclasses.replace(config, model=dataclasses.replace(config.model, model_name_or_path=str(folder)))
        model = load_model(full, tokenizer, is_trainable=False, add_valuehead=scorer, adapters="")
    if config.model.quantization_bit is None:  # a quantized model is placed on its GPU as it loads
        model = model.to(eval_device())
    return model.eval()


def load_validation(dataset_ref: BuiltDataset | dict[str, Any]):
    """The processed validation split of a build-dataset result."""
    from tuneline.data import load_processed

    splits = load_processed(dataset_ref)
    if "validation" not in splits:
        raise UserError("evaluation needs a validation split; set 'val_size' (e.g. 0.1) or 'eval_dataset'",
                        title="cannot evaluate")
    return splits["validation"]

"""Model side: tokenizer, processor and model loading, adapters, finetuning types, PiSSA, and the optimizers
LLaMA-Factory's keys choose (LoRA+, BAdam, GaLore, APOLLO, Adam-mini, Muon).

Names are imported on first use, so `from tuneline.model import model_fingerprint` stays free of torch.
"""

from __future__ import annotations

import importlib

from tuneline.model.fingerprint import model_fingerprint
from tuneline.model.tokenizer import load_tokenizer, tokenizer_fingerprint

_LAZY = {
    "load_model": "tuneline.model.loader",
    "count_parameters": "tuneline.model.loader",
    "training_precision": "tuneline.model.precision",
    "compute_dtype": "tuneline.model.precision",
    "save_pissa_init": "tuneline.model.pissa",
    "convert_pissa_adapter": "tuneline.model.pissa",
    "pissa_init_dir": "tuneline.model.pissa",
    "PissaConvertCallback": "tuneline.model.pissa",
    "create_loraplus_optimizer": "tuneline.model.optimizers",
    "create_badam_optimizer": "tuneline.model.optimizers",
    "prepare_trainer_for_badam": "tuneline.model.optimizers",
    "create_low_rank_optimizer": "tuneline.model.low_rank_optimizers",
    "create_muon_optimizer": "tuneline.model.muon_adam_mini",
    "create_adam_mini_optimizer": "tuneline.model.muon_adam_mini",
    "badam_problems": "tuneline.config.validate",
    "load_processor": "tuneline.model.processor",
    "save_processor": "tuneline.model.processor",
    "SaveProcessorCallback": "tuneline.model.processor",
}

__all__ = ["load_tokenizer", "model_fingerprint", "tokenizer_fingerprint", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tuneline.model' has no attribute '{name}'")

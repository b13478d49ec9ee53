"""Training stages, one module each, run in the training subprocess (`python -m tuneline.train CONFIG`).

Stage interface (every module in STAGE_MODULES):

    run(config: RunConfig, dataset_ref: dict, extra_callbacks: list) -> dict

- `config.training["resume_from_checkpoint"]` is already decided by output_dir.py: pass it to `trainer.train`
  as is, never inspect output_dir yourself.
- `dataset_ref` loads with `tuneline.data.load_processed(dataset_ref)`.
- `extra_callbacks` go after the common ones (`tuneline.train.callbacks.build_callbacks`).
- Returns `{"output_dir": str, "global_step": int, "metrics": {name: float}}`, the model and tokenizer saved in
  output_dir.
- Build the trainer on `TunelineTrainer` (or a subclass) so checkpoints stay complete-or-absent.

Importing this package is cheap: stage modules (torch, transformers) load only in `stage_runner`."""

from __future__ import annotations

import importlib
from collections.abc import Callable

STAGE_MODULES: dict[str, str] = {
    "pt": "tuneline.train.pt",
    "sft": "tuneline.train.sft",
    "rm": "tuneline.train.rm",
    "dpo": "tuneline.train.dpo",
    "kto": "tuneline.train.kto",
    "ppo": "tuneline.train.ppo",
    "grpo": "tuneline.train.grpo",
    "rloo": "tuneline.train.grpo",  # the same run on trl's RLOOTrainer
}


def stage_runner(stage: str) -> Callable:
    """The `run` function of a stage's module, imported on first use."""
    from tuneline.errors import ConfigError, did_you_mean

    if stage not in STAGE_MODULES:
        raise ConfigError(f"'stage: {stage}' is unknown{did_you_mean(stage, STAGE_MODULES)}; allowed: "
                          f"{', '.join(STAGE_MODULES)}")
    return importlib.import_module(STAGE_MODULES[stage]).run

"""Training stages, one module each, run in the training subprocess (`python -m tuneline.train CONFIG`).

Stage interface (every module in STAGE_MODULES, including helper-written dpo/kto/ppo):

    run(config: RunConfig, dataset_ref: dict, extra_callbacks: list) -> dict

- `config`: the resolved RunConfig. `config.training["resume_from_checkpoint"]` has already been set by the
  entry point to the checkpoint to resume from (a complete `checkpoint-N` path) or None: pass it to
  `trainer.train(resume_from_checkpoint=...)` as is. Do not inspect output_dir yourself; output_dir.py decided.
- `dataset_ref`: `{"path": <processed dataset folder>, ...}` as `tuneline.data.build_dataset` returns it (or a
  ref with just "path"); load it with `tuneline.data.load_processed(dataset_ref)`.
- `extra_callbacks`: transformers TrainerCallbacks to add after the common ones (trainer_log.jsonl, MLflow
  metrics, early stopping: `tuneline.train.callbacks.build_callbacks`).
- Returns `{"output_dir": str, "global_step": int, "metrics": {name: float}}`; the final model/adapter and the
  tokenizer are saved in output_dir, with train_results.json / eval_results.json / all_results.json.
- Build the trainer on `tuneline.train.trainer_base.TunelineTrainer` (or a subclass) so checkpoints stay complete-or-absent: it writes them under `.partial/` and renames them when whole.

Importing this package is cheap: stage modules (torch, transformers) load only in `stage_runner`.
"""

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
}


def stage_runner(stage: str) -> Callable:
    """The `run` function of a stage's module, imported on first use."""
    from tuneline.errors import ConfigError, did_you_mean

    if stage not in STAGE_MODULES:
        raise ConfigError(f"'stage: {stage}' is unknown{did_you_mean(stage, STAGE_MODULES)}; allowed: "
                          f"{', '.join(STAGE_MODULES)}")
    return importlib.import_module(STAGE_MODULES[stage]).run

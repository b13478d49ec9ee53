"""The cached evaluation step: its key, and the cache folder that answers it. No torch here.

The base model is scored once per (base, data) and every run on that base reuses it; a tuned model is scored once
per result."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tuneline.content.fingerprint import FileHasher, fingerprint, memo_dir
from tuneline.content.records import BuiltDataset, Evaluation
from tuneline.content.step_cache import cached_step
from tuneline.identity import step_code_version
from tuneline.model.fingerprint import model_fingerprint, reward_model_fingerprint

# Bump when a metric's meaning changes; edits to the evaluation sources also change keys (see code_version).
EVAL_VERSION = "1"

# The config keys that change an evaluation's result (besides the model and the data).
EVAL_KEYS = ("stage", "cutoff_len", "template", "eval_max_samples", "eval_max_new_tokens",
             "per_device_eval_batch_size", "seed")

# Files that make up a model or adapter; logs, plots, cards and checkpoints in the same folder do not count.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".model")
MODEL_FILE_NAMES = ("config.json", "adapter_config.json", "generation_config.json",
                    "model.safetensors.index.json", "pytorch_model.bin.index.json")


EVAL_METRICS, EVAL_PREDICTIONS = "metrics.json", "predictions.jsonl"  # in each evaluation's cache folder
NO_VALIDATION = ("no validation split: set `val_size` (e.g. 0.1) or `eval_dataset` to evaluate before and after "
                 "training")

# What PPO's evaluation also reads: the reward model scores answers sampled with the generating config.
PPO_EVAL_KEYS = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty")
GRPO_EVAL_KEYS = ("max_completion_length",)  # grpo's answers are as long as in training


def not_evaluated(*evaluations: Evaluation) -> str | None:
    """Why these evaluate-step results hold no metrics (the first reason given), or None when they were scored."""
    return next((evaluation.skipped for evaluation in evaluations if evaluation.skipped), None)


def eval_fingerprint(config, model_key: str, dataset_fingerprint: str) -> str:
    """Key of one evaluation result."""
    reward_model = reward_model_fingerprint(config, memo_dir(config))  # memoised: a large reward model is read once
    keys = PPO_EVAL_KEYS + (GRPO_EVAL_KEYS if config.stage in ("grpo", "rloo") else ())
    sampling = config.slice(*keys) if reward_model else None
    return fingerprint("evaluate", EVAL_VERSION, code_version(), model_key, dataset_fingerprint,
                       config.slice(*EVAL_KEYS), reward_model, sampling)


def code_version() -> str:
    """The evaluation's code (every module it imports), so a fixed metric is never answered from a stale entry."""
    return step_code_version("evaluate")


def model_content_key(config, adapter_dir: str | os.PathLike | None = None,
                      memo_dir: str | os.PathLike | None = None) -> str:
    """Content key of the base model as evaluation loads it, or of base + what training saved in `adapter_dir`.

    The finetuning keys are left out, so every run on one base shares its evaluation; `adapter_dir` counts by its
    top-level weight and config files only, so logs and checkpoints written beside them do not change the key."""
    base = model_fingerprint(config, memo_dir, include_finetuning=False)
    if adapter_dir is None:
        return base
    hasher = FileHasher(memo_dir)
    files = _model_files_hash(hasher, Path(adapter_dir))
    hasher.save()
    return fingerprint("tuned", base, files)


def _model_files_hash(hasher: FileHasher, root: Path) -> dict[str, str]:
    files = sorted(p for p in root.iterdir() if p.is_file() and _is_model_file(p.name))
    return {p.name: hasher.hash_file(p) for p in files}


def _is_model_file(name: str) -> bool:
    return name in MODEL_FILE_NAMES or name.endswith(MODEL_FILE_SUFFIXES)


def evaluate_model(config, dataset_ref: BuiltDataset | dict[str, Any], adapter_dir: str | None,
                   model_key: str) -> dict[str, Any]:
    """Score a model on the validation split; cached under `<pipeline_cache_dir>/evaluate/<key>/`.

    A dataset built without a validation split is not an error: the result then has no metrics and says why in
    "skipped"."""
    dataset = BuiltDataset.from_stored(dataset_ref)
    key = eval_fingerprint(config, model_key, dataset.fingerprint)
    if dataset.eval_rows == 0:  # LLaMA-Factory's examples hold none: the run is simply not evaluated
        return {"metrics": {}, "skipped": NO_VALIDATION, "fingerprint": key, "path": None, "cache_hit": False,
                "num_samples": 0}

    def build(folder: Path) -> dict[str, Any]:
        from tuneline.evaluation.run import run_evaluation

        result = run_evaluation(config, dataset, adapter_dir)
        _write_json(folder / EVAL_METRICS, result["metrics"])
        if result.get("predictions"):
            _write_jsonl(folder / EVAL_PREDICTIONS, result["predictions"])
        return {"metrics": result["metrics"], "num_samples": result["num_samples"],
                "num_generated": len(result.get("predictions") or []), "model_key": model_key,
                "adapter_dir": str(adapter_dir) if adapter_dir else None}

    ref = cached_step(config.pipeline.pipeline_cache_dir, "evaluate", key, build,
                      refresh=config.pipeline.refresh_cache)
    return ref


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")

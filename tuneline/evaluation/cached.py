"""The cached evaluation step: its key, and the cache folder that answers it. No torch here.

The base model is scored once per (base, data) and every run on that base reuses it; a tuned model is scored once
per result."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tuneline.content.fingerprint import FileHasher, fingerprint
from tuneline.content.records import BuiltDataset, Evaluation
from tuneline.content.step_cache import cached_step
from tuneline.identity.config_keys import evaluation_key
from tuneline.model.fingerprint import model_fingerprint

# Files that make up a model or adapter; logs, plots, cards and checkpoints in the same folder do not count.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".model")
MODEL_FILE_NAMES = ("config.json", "adapter_config.json", "generation_config.json",
                    "model.safetensors.index.json", "pytorch_model.bin.index.json")


EVAL_METRICS, EVAL_PREDICTIONS = "metrics.json", "predictions.jsonl"  # in each evaluation's cache folder
NO_VALIDATION = ("no validation split: set `val_size` (e.g. 0.1) or `eval_dataset` to evaluate before and after "
                 "training")


def not_evaluated(*evaluations: Evaluation) -> str | None:
    """Why these evaluate-step results hold no metrics (the first reason given), or None when they were scored."""
    return next((evaluation.skipped for evaluation in evaluations if evaluation.skipped), None)


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
    key = evaluation_key(config, model_key, dataset.fingerprint)
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

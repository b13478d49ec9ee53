"""The cached `predict` step of a `do_predict` run without training: its key, and the cache folder that answers it.
No torch here.

Keyed like `evaluate` (the model's content, the data, the code) plus every generating key: the same model asked
the same questions the same way is answered from the cache. The files are then copied into output_dir, where
LLaMA-Factory leaves them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from tuneline.content.records import BuiltDataset
from tuneline.content.step_cache import cached_step, entry_dir, is_complete
from tuneline.identity.config_keys import predict_key
from tuneline.runtime.contract import PREDICTIONS_FILE

PREDICT_RESULTS = "predict_results.json"  # LLaMA-Factory's name for the metrics (trainer.save_metrics("predict"))


def predict_model(config, dataset_ref: BuiltDataset | dict[str, Any], model_key: str) -> dict[str, Any]:
    """Answers and scores of the model the config names (base and `adapter_name_or_path`) for the validation split;
    cached under `<pipeline_cache_dir>/predict/<key>/`, then copied into output_dir."""
    dataset = BuiltDataset.from_stored(dataset_ref)
    key = predict_key(config, model_key, dataset.fingerprint)

    def build(folder: Path) -> dict[str, Any]:
        from tuneline.evaluation.prediction import run_prediction, write_predictions

        records, metrics = run_prediction(config, dataset, None)
        write_predictions(folder / PREDICTIONS_FILE, records)
        (folder / PREDICT_RESULTS).write_text(json.dumps(metrics, indent=2, sort_keys=True), encoding="utf-8")
        return {"metrics": metrics, "num_samples": len(records), "model_key": model_key}

    ref = cached_step(config.pipeline.pipeline_cache_dir, "predict", key, build,
                      refresh=config.pipeline.refresh_cache)
    copy_into_output_dir(Path(ref["path"]), config.output_dir)
    return {**ref, "output_dir": str(config.output_dir)}


def predictions_in_place(config, key: str) -> bool:
    """Whether the cache entry of `key` is whole and output_dir holds its files (else the step runs again)."""
    entry = entry_dir(config.pipeline.pipeline_cache_dir, "predict", key)
    return is_complete(entry) and all((config.output_dir / name).is_file() for name in (PREDICTIONS_FILE,
                                                                                          PREDICT_RESULTS))


def copy_into_output_dir(folder: Path, output_dir: Path) -> None:
    """generated_predictions.jsonl and predict_results.json beside each other in output_dir (each written whole)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in (PREDICTIONS_FILE, PREDICT_RESULTS):
        tmp = output_dir / f".{name}.tmp"
        shutil.copyfile(folder / name, tmp)
        os.replace(tmp, output_dir / name)

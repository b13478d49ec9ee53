"""`predict_with_generate` after training: the trained model answers every evaluation prompt in the same process,
into `<output_dir>/generated_predictions.jsonl`, scored as LLaMA-Factory does (tuneline.evaluation.prediction)."""

from __future__ import annotations

from pathlib import Path

from tuneline.evaluation.prediction import predict_rows, write_predictions
from tuneline.runtime.contract import PREDICTIONS_FILE


def predict_with_generate(trainer, config, dataset, tokenizer) -> dict[str, float]:
    """Write the answers and return predict_rouge-*/predict_bleu-4 (main process only)."""
    if dataset is None or not config.training.get("predict_with_generate") or not trainer.is_world_process_zero():
        return {}
    model = trainer.accelerator.unwrap_model(trainer.model)
    records, metrics = predict_rows(config, model, tokenizer, dataset, trainer.args.per_device_eval_batch_size)
    write_predictions(Path(trainer.args.output_dir) / PREDICTIONS_FILE, records)
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    return metrics

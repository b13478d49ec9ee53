"""Supervised fine-tuning: causal LM loss over response tokens only (labels -100 never count), token accuracy
when `compute_accuracy`, and generated answers scored by ROUGE/BLEU when `predict_with_generate`.

Run: `python -m tuneline.train examples/sft_lora.yaml` (or through `accelerate launch`).
"""

from __future__ import annotations

from typing import Any

from tuneline.train.predict import predict_with_generate
from tuneline.train.trainer_base import StageSpec, run_stage

IGNORE_INDEX = -100


def argmax_logits(logits, labels):
    """Keep only the predicted ids: whole-vocabulary logits for an eval set do not fit in memory."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return logits.argmax(dim=-1)


def token_accuracy(eval_prediction) -> dict[str, float]:
    """Share of label tokens (labels != -100) whose next-token prediction is right."""
    import numpy as np

    preds, labels = np.asarray(eval_prediction.predictions), np.asarray(eval_prediction.label_ids)
    preds, labels = preds[:, :-1], labels[:, 1:]
    counted = labels != IGNORE_INDEX
    total = int(counted.sum())
    return {"accuracy": float((preds == labels)[counted].sum() / total) if total else 0.0}


def sft_metrics(config, tokenizer):
    if config.finetuning.compute_accuracy and not config.training.get("prediction_loss_only"):
        return token_accuracy, argmax_logits
    return None, None


SPEC = StageSpec(name="sft", metrics=sft_metrics, after_train=predict_with_generate, perplexity=True)


def run(config, dataset_ref: dict, extra_callbacks: list | None = None) -> dict[str, Any]:
    return run_stage(config, dataset_ref, extra_callbacks or [], SPEC)

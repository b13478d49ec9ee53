"""Evaluate a model on the validation split, before and after training, cached by content.

Exports only the cached step's entry points: `run` (torch) is imported only when an evaluation actually runs."""

from tuneline.evaluation.cached import (
    EVAL_METRICS,
    EVAL_PREDICTIONS,
    NO_VALIDATION,
    eval_fingerprint,
    evaluate_model,
    model_content_key,
    not_evaluated,
)

__all__ = ["EVAL_METRICS", "EVAL_PREDICTIONS", "NO_VALIDATION", "eval_fingerprint", "evaluate_model",
           "model_content_key", "not_evaluated"]

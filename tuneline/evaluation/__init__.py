"""Evaluate a model on the validation split, before and after training, and predict (`do_predict`), cached by
content.

Exports only the cached step's entry points: `run` (torch) is imported only when an evaluation actually runs."""

from tuneline.evaluation.cached import (
    EVAL_METRICS,
    EVAL_PREDICTIONS,
    NO_VALIDATION,
    evaluate_model,
    model_content_key,
    not_evaluated,
)
from tuneline.evaluation.predict_step import PREDICT_RESULTS, predict_model, predictions_in_place

__all__ = ["EVAL_METRICS", "EVAL_PREDICTIONS", "NO_VALIDATION", "evaluate_model",
           "model_content_key", "not_evaluated", "PREDICT_RESULTS", "predict_model",
           "predictions_in_place"]

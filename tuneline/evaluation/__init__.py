"""Evaluate a model on the validation split, before and after training, cached by content.

`cached` computes the key and answers from the cache without torch; `run` (with `loading`, `scoring` and
`generation`) loads the model and scores it, and is imported only when an evaluation actually runs (never on a
cache hit). So importing this package stays cheap: it exports the cached step's entry points only.
"""

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

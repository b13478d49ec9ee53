"""Which metrics each stage's evaluation produces, so a sweep or a retrain that is to be decided by a metric
the run will never report is refused before anything trains."""

from __future__ import annotations

from tuneline.config import RunConfig
from tuneline.errors import did_you_mean

# The tuned model's evaluation metrics by stage (tuneline.evaluation.run's steps; a unit test pins the names).
LANGUAGE_MODEL = ("eval_loss", "perplexity", "token_accuracy")
PAIRWISE = ("reward_accuracy", "reward_margin", "rewards_chosen", "rewards_rejected")
STAGE_METRICS = {
    "pt": LANGUAGE_MODEL,
    "sft": (*LANGUAGE_MODEL, "exact_match", "rouge1", "rouge2", "rougeL", "bleu4"),
    "rm": ("eval_loss", *PAIRWISE),
    "dpo": (*LANGUAGE_MODEL, *PAIRWISE),
    "kto": (*LANGUAGE_MODEL, *PAIRWISE),
    "ppo": ("reward",),
    "grpo": ("reward",),  # and reward_<name> per reward function
    "rloo": ("reward",),
}
TRAIN_METRICS = ("train_loss",)  # the trainer's mean loss over the run (not ppo's own loop)


def metric_problems(config: RunConfig, metric: str, *, flag: str = "--metric", train_metrics: bool = True) -> list[str]:
    """Why `metric` cannot decide between runs of this config. `train_metrics`: whether the trainer's own mean loss may
    decide (a sweep: yes; a retrain, which scores the champion on the same held-out set: no)."""
    trainable = TRAIN_METRICS if train_metrics and config.stage != "ppo" else ()
    if metric in TRAIN_METRICS and not trainable:
        why = "ppo's training loop does not report it" if config.stage == "ppo" else \
            "the champion is compared on the held-out set, where the training loss is not measured"
        return [f"{flag} {metric}: {why}; use one of {', '.join(STAGE_METRICS.get(config.stage, ()))}"]
    if metric in trainable:
        return []
    produced = STAGE_METRICS.get(config.stage, ())
    if metric not in produced:
        hint = did_you_mean(metric, produced)
        return [f"{flag} {metric}: the {config.stage} evaluation does not produce it{hint}; use one of "
                f"{', '.join((*produced, *trainable))}"]
    if not config.has_validation:
        other = ", or use --metric train_loss" if trainable else ""
        return [f"{flag} {metric} is measured on a held-out set and this config has none: set 'val_size' "
                f"(e.g. 0.1) or 'eval_dataset'{other}"]
    return []

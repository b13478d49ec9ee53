"""Retraining's decisions: is there anything new to train on, and does the new version replace the champion.

A retrain whose data and base model equal the champion's has nothing to learn; otherwise the new version becomes
champion only if it beats the champion on the same held-out set by `min_delta`."""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.config import RunConfig
from tuneline.identity import keys

CHAMPION, CHALLENGER = "champion", "challenger"
DATA_TAG, BASE_TAG = "dataset_fingerprint", "base_model_key"
DECISION_TAG = "tuneline.promotion"


def data_identity(config: RunConfig) -> dict[str, str]:
    """What a version was trained from: the data's fingerprint and the base model's (its resolved revision)."""
    return {DATA_TAG: keys.dataset_key(config), BASE_TAG: keys.base_model_key(config)}


def unchanged(champion: dict, identity: dict[str, str]) -> bool:
    return all(champion["tags"].get(key) == value for key, value in identity.items())


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def decide(metric: str, new: float | None, champion: float | None, greater_is_better: bool,
           min_delta: float) -> Decision:
    """Promote when the new score beats the champion's, by at least `min_delta` (>= 0); a tie keeps the champion,
    and a first version always wins."""
    if champion is None:
        return Decision(True, "the first version of this model")
    if new is None:
        return Decision(False, f"the new version has no '{metric}' to compare")
    gain = new - champion if greater_is_better else champion - new
    better = "higher" if greater_is_better else "lower"
    verdict = f"{metric} {new:.6g} against the champion's {champion:.6g} ({better} is better, needed {min_delta:+g})"
    return Decision(gain > 0 and gain >= min_delta, verdict)

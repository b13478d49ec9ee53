"""`do_predict`'s scores equal LLaMA-Factory 0.9.5's on English and Chinese pairs: its own ComputeSimilarity's
outputs, recorded by benchmarks/predict_metrics_parity.py --snapshot (LLaMA-Factory is not imported here)."""

import json
from pathlib import Path

import pytest

from tuneline.evaluation.similarity import pair_similarity, similarity_metrics

SNAPSHOT = Path(__file__).parents[1] / "fixtures" / "llamafactory" / "0.9.5" / "predict_metrics_parity.json"


def test_each_pair_and_the_mean_equal_llamafactorys():
    recorded = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    pairs = recorded["inputs"]
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in label) for _, label in pairs), "Chinese pairs are covered"
    for (prediction, label), want in zip(pairs, recorded["scores"], strict=True):
        assert pair_similarity(prediction, label) == pytest.approx(want, abs=1e-9), (prediction, label)
    mean = similarity_metrics([p for p, _ in pairs], [label for _, label in pairs])
    assert mean == pytest.approx({f"predict_{k}": v for k, v in recorded["mean"].items()}, abs=1e-9)


def test_no_answers_have_no_scores():
    assert similarity_metrics([], []) == {}

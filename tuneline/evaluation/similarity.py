"""LLaMA-Factory's scores for generated answers (its `ComputeSimilarity`), so `do_predict` figures compare with its.

ROUGE-1/2/L F1 from rouge-chinese over jieba words (the same split for Chinese and English), BLEU-4 from nltk's
sentence_bleu with smoothing method 3 over characters (LLaMA-Factory passes the raw strings), each pair rounded to
4 decimals of a percentage, then averaged. benchmarks/predict_metrics_parity.py checks these against LLaMA-Factory's
own code. tuneline's before/after `evaluate` keeps its own scores (`generation.text_metrics`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

ROUGE_NAMES = ("rouge-1", "rouge-2", "rouge-l")
SIMILARITY_NAMES = (*ROUGE_NAMES, "bleu-4")


@functools.cache
def _scorers():
    import logging

    import jieba
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    jieba.setLogLevel(logging.WARNING)  # it announces building its dictionary on every first use
    return jieba.cut, Rouge(), sentence_bleu, SmoothingFunction().method3


def pair_similarity(prediction: str, label: str) -> dict[str, float]:
    """rouge-1, rouge-2, rouge-l and bleu-4 of one answer, in percent (0-100)."""
    cut, rouge, sentence_bleu, smoothing = _scorers()
    hypothesis, reference = " ".join(cut(prediction)), " ".join(cut(label))
    if hypothesis.split() and reference.split():
        scores = {name: value["f"] for name, value in rouge.get_scores(hypothesis, reference)[0].items()}
    else:  # rouge-chinese fails on an empty side; LLaMA-Factory scores it 0
        scores = dict.fromkeys(ROUGE_NAMES, 0.0)
    scores["bleu-4"] = sentence_bleu([list(label)], list(prediction), smoothing_function=smoothing)
    return {name: round(float(scores[name]) * 100, 4) for name in SIMILARITY_NAMES}


def similarity_metrics(predictions: Sequence[str], labels: Sequence[str], prefix: str = "predict_") -> dict[str, float]:
    """The mean of each score over the pairs, named as LLaMA-Factory logs them (predict_rouge-1, ...)."""
    if not predictions:
        return {}
    scored = [pair_similarity(p, label) for p, label in zip(predictions, labels, strict=True)]
    return {f"{prefix}{name}": sum(s[name] for s in scored) / len(scored) for name in SIMILARITY_NAMES}

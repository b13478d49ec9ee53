"""sft evaluation by generation: ask each row's final question (earlier turns as context), decode greedily, score."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from tuneline.evaluation.scoring import IGNORE_INDEX, batch_ranges, pad_rows, to_device

_WORDS = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def last_labelled_span(labels: Sequence[int]) -> tuple[int, int] | None:
    """[start, end) of the last run of label tokens, or None when the row has none."""
    end = len(labels)
    while end > 0 and labels[end - 1] == IGNORE_INDEX:
        end -= 1
    if end == 0:
        return None
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return start, end


def until_eos(tokens: Sequence[int], eos_ids: set[int]) -> list[int]:
    out = []
    for token in tokens:
        if token in eos_ids:
            break
        out.append(int(token))
    return out


def split_prompt_answer(input_ids: Sequence[int], labels: Sequence[int],
                        eos_ids: set[int]) -> tuple[list[int], list[int]] | None:
    span = last_labelled_span(labels)
    if span is None or span[0] == 0:
        return None
    start, end = span
    return list(input_ids[:start]), until_eos(labels[start:end], eos_ids)


def eos_token_ids(tokenizer, model) -> set[int]:
    """The tokenizer's eos plus any the model's generation config names (chat models end turns with their own)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    return ids


def generate_greedy(model, prompts: Sequence[Sequence[int]], *, pad_id: int, eos_ids: set[int],
                    max_new_tokens: int, batch_size: int, row_inputs=None) -> list[list[int]]:
    """Greedy answers (token ids, cut at the first eos) for left-padded batches of prompts."""
    from transformers import GenerationConfig

    settings = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                                pad_token_id=pad_id, eos_token_id=sorted(eos_ids) or None)
    return generate_batches(model, prompts, settings, pad_id, eos_ids, batch_size, row_inputs)


def generate_batches(model, prompts: Sequence[Sequence[int]], settings, pad_id: int, eos_ids: set[int],
                     batch_size: int, row_inputs=None) -> list[list[int]]:
    """Answers under any GenerationConfig, in the prompts' order; prompts are batched by length (little left
    padding to prefill); the model is left in its mode. `row_inputs(rows, length, left)`: more inputs for rows."""
    import torch

    device = next(model.parameters()).device
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: dict[int, list[int]] = {}
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start, end in batch_ranges(len(by_length), batch_size):
            chunk = by_length[start:end]
            rows = [prompts[i] for i in chunk]
            ids = pad_rows(rows, pad_id, left=True).to(device)
            mask = pad_rows([[1] * len(r) for r in rows], 0, left=True).to(device)
            extra = to_device(row_inputs(chunk, ids.shape[1], True), device) if row_inputs else {}
            output = model.generate(input_ids=ids, attention_mask=mask, generation_config=settings, **extra)
            answers.update({i: until_eos(row.tolist(), eos_ids) for i, row in zip(chunk, output[:, ids.shape[1]:],
                                                                                   strict=True)})
    model.train(was_training)
    return [answers[i] for i in range(len(prompts))]


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation, any script (rouge_score's default tokenizer drops non-ASCII text)."""
    return _WORDS.findall(text.lower())


def _f1(overlap: int, predicted: int, reference: int) -> float:
    if not overlap:  # also when either side is empty
        return 0.0
    precision, recall = overlap / predicted, overlap / reference
    return 2 * precision * recall / (precision + recall)


def rouge_n(prediction: Sequence[str], reference: Sequence[str], n: int) -> float:
    """ROUGE-N F1: the n-grams both token lists share (each counted as often as it occurs in both)."""
    predicted, wanted = (Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
                         for tokens in (prediction, reference))
    return _f1(sum((predicted & wanted).values()), sum(predicted.values()), sum(wanted.values()))


def rouge_l(prediction: Sequence[str], reference: Sequence[str]) -> float:
    """ROUGE-L F1: the longest common subsequence of the two token lists."""
    previous = [0] * (len(reference) + 1)
    for token in prediction:
        current = [0]
        for j, other in enumerate(reference):
            current.append(previous[j] + 1 if token == other else max(previous[j + 1], current[j]))
        previous = current
    return _f1(previous[-1], len(prediction), len(reference))


def text_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """exact_match (after strip), mean ROUGE-1/2/L F1 and mean sentence BLEU-4, all in [0, 1].

    ROUGE is computed here: rouge_score's import pulls in nltk and scipy for two short formulas (a test checks both
    agree)."""
    import sacrebleu

    if not predictions:
        return {}
    count = len(predictions)
    sums = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for pred, ref in zip(predictions, references, strict=True):
        said, wanted = words(pred), words(ref)
        sums["rouge1"] += rouge_n(said, wanted, 1)
        sums["rouge2"] += rouge_n(said, wanted, 2)
        sums["rougeL"] += rouge_l(said, wanted)
    # Sentence BLEU-4 (sacrebleu's exp smoothing and effective order) averaged: a corpus BLEU of short answers
    # is 0 whenever they have no 4-grams, even when every answer is right.
    bleu = sum(sacrebleu.sentence_bleu(p, [r]).score for p, r in zip(predictions, references, strict=True))
    exact = sum(p.strip() == r.strip() for p, r in zip(predictions, references, strict=True)) / count
    return {"exact_match": exact, **{k: v / count for k, v in sums.items()}, "bleu4": bleu / count / 100.0}

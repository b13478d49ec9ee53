"""Teacher-forced scores over label tokens, and the pairwise metrics built on them as pure functions."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

from tuneline.objectives.rewards import sequence_scores

IGNORE_INDEX = -100
# exp() of a loss above this overflows a float; such a model has no meaningful perplexity anyway.
_MAX_LOG_PERPLEXITY = 700.0


def batch_ranges(total: int, size: int) -> Iterator[tuple[int, int]]:
    size = max(1, int(size))
    for start in range(0, total, size):
        yield start, min(start + size, total)


def pad_rows(rows: Sequence[Sequence[int]], value: int, left: bool = False):
    """A (batch, longest) long tensor, padded on the right (or the left, for generation)."""
    import torch

    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            if left:
                out[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            else:
                out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def to_device(inputs: dict, device) -> dict:
    return {key: value.to(device) if hasattr(value, "to") else value for key, value in inputs.items()}


def label_scores(model, input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], pad_id: int,
                 batch_size: int, row_inputs=None) -> dict[str, list]:
    """Per row: "logp" (sum of label-token log-probs), "tokens" (label count), "correct" (argmax hits), in the rows'
    order; rows are batched by length. `row_inputs(rows, length, left)`: more forward inputs for those rows."""
    import torch

    from tuneline.objectives.logps import label_logits

    device = next(model.parameters()).device
    by_length = sorted(range(len(input_ids)), key=lambda i: len(input_ids[i]))
    scored: dict[int, tuple[float, int, int]] = {}
    with torch.no_grad():
        for start, end in batch_ranges(len(by_length), batch_size):
            chunk = by_length[start:end]
            rows = [input_ids[i] for i in chunk]
            ids = pad_rows(rows, pad_id).to(device)
            mask = pad_rows([[1] * len(r) for r in rows], 0).to(device)
            gold = pad_rows([labels[i] for i in chunk], IGNORE_INDEX).to(device)
            extra = row_inputs(chunk, ids.shape[1], False) if row_inputs else {}
            logits, targets, row_of = label_logits(model, ids, mask, gold, **to_device(extra, device))
            logp = -torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            hits = (logits.argmax(-1) == targets).long()
            zeros = torch.zeros(len(chunk), device=device)
            sums = zeros.index_add(0, row_of, logp).tolist()
            counts = zeros.index_add(0, row_of, torch.ones_like(logp)).long().tolist()
            correct = zeros.long().index_add(0, row_of, hits).tolist()
            scored.update({i: (sums[k], counts[k], correct[k]) for k, i in enumerate(chunk)})
    ordered = [scored[i] for i in range(len(input_ids))]
    return {"logp": [s[0] for s in ordered], "tokens": [s[1] for s in ordered], "correct": [s[2] for s in ordered]}


def loss_metrics(scores: dict[str, list]) -> dict[str, float]:
    """Token-weighted mean NLL over every label token, its perplexity, and teacher-forced token accuracy."""
    tokens = sum(scores["tokens"])
    if tokens == 0:
        return {}
    loss = -sum(scores["logp"]) / tokens
    perplexity = math.exp(loss) if loss < _MAX_LOG_PERPLEXITY else math.inf
    return {"eval_loss": loss, "perplexity": perplexity, "token_accuracy": sum(scores["correct"]) / tokens}


def pairwise_metrics(chosen: Sequence[float], rejected: Sequence[float]) -> dict[str, float]:
    """Share of pairs whose chosen reward is strictly higher (ties count as wrong), and the mean margin."""
    if len(chosen) != len(rejected):
        raise ValueError(f"{len(chosen)} chosen rewards but {len(rejected)} rejected ones")
    if not chosen:
        return {}
    margins = [c - r for c, r in zip(chosen, rejected, strict=True)]
    return {
        "reward_accuracy": sum(m > 0 for m in margins) / len(margins),
        "reward_margin": sum(margins) / len(margins),
        "rewards_chosen": sum(chosen) / len(chosen),
        "rewards_rejected": sum(rejected) / len(rejected),
    }


def sequence_rewards(model, input_ids: Sequence[Sequence[int]], pad_id: int, batch_size: int,
                     row_inputs=None) -> list[float]:
    """One reward per row from a sequence scorer, read out as rm trains and PPO scores (`tuneline.objectives.rewards`).
    `row_inputs` as in `label_scores`."""
    import torch

    device = next(model.parameters()).device
    rewards: list[float] = []
    with torch.no_grad():
        for start, end in batch_ranges(len(input_ids), batch_size):
            rows = input_ids[start:end]
            ids = pad_rows(rows, pad_id).to(device)
            mask = pad_rows([[1] * len(r) for r in rows], 0).to(device)
            extra = row_inputs(list(range(start, end)), ids.shape[1], False) if row_inputs else {}
            rewards += sequence_scores(model, ids, mask, **to_device(extra, device)).float().tolist()
    return rewards


def bradley_terry_loss(chosen: Sequence[float], rejected: Sequence[float]) -> dict[str, float]:
    """The reward model's own eval loss: mean -log sigmoid(r_chosen - r_rejected)."""
    if not chosen:
        return {}
    losses = [math.log1p(math.exp(-(c - r))) if c - r > -30 else r - c for c, r in zip(chosen, rejected, strict=True)]
    return {"eval_loss": sum(losses) / len(losses)}


def unpaired_metrics(desirable: Sequence[float], undesirable: Sequence[float]) -> dict[str, float]:
    """pairwise_metrics over every (desirable, undesirable) pair, for unpaired (KTO) data, in O(n log n)."""
    if not desirable or not undesirable:
        return {}
    ranked = sorted(undesirable)
    wins = sum(bisect.bisect_left(ranked, d) for d in desirable)  # undesirable rewards strictly below d
    chosen, rejected = sum(desirable) / len(desirable), sum(undesirable) / len(undesirable)
    return {"reward_accuracy": wins / (len(desirable) * len(ranked)), "reward_margin": chosen - rejected,
            "rewards_chosen": chosen, "rewards_rejected": rejected}

"""Per-sequence log-probs of labelled tokens: what every preference loss and the reference step consume.

Shared by the dpo/kto trainers (policy and live reference) and by `tuneline.reference` (precomputed
reference), so a precomputed and a live reference compute exactly the same numbers. It sits beside
`tuneline.losses`, below both of its users: the reference step need not reach into the training package.
"""

from __future__ import annotations

IGNORE_INDEX = -100


def sequence_logps(model, input_ids, attention_mask, labels):
    """(sum of log p(label) over labelled tokens, number of labelled tokens) per row; logits in float32."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, :-1, :].float()
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    safe_targets = torch.where(mask, targets, torch.zeros_like(targets))
    token_logps = torch.log_softmax(logits, dim=-1).gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
    return (token_logps * mask).sum(-1), mask.sum(-1)


def pad_right(tensors, value: int):
    """Stack 2-d tensors of different widths into one, padding on the right."""
    import torch

    width = max(t.size(1) for t in tensors)
    padded = [torch.nn.functional.pad(t, (0, width - t.size(1)), value=value) for t in tensors]
    return torch.cat(padded, 0)


def pair_logps(model, batch, pad_token_id: int = 0):
    """One forward over [chosen; rejected]: (chosen sums, rejected sums, chosen lengths, rejected lengths)."""
    input_ids = pad_right([batch["chosen_input_ids"], batch["rejected_input_ids"]], pad_token_id)
    attention_mask = pad_right([batch["chosen_attention_mask"], batch["rejected_attention_mask"]], 0)
    labels = pad_right([batch["chosen_labels"], batch["rejected_labels"]], IGNORE_INDEX)
    sums, lengths = sequence_logps(model, input_ids, attention_mask, labels)
    rows = batch["chosen_input_ids"].size(0)
    return sums[:rows], sums[rows:], lengths[:rows], lengths[rows:]


def completion_logps(model, batch, prefix: str = ""):
    """Summed log-probs of the completions in `<prefix>input_ids` (KTO: prefix '' or 'kl_')."""
    return sequence_logps(model, batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"],
                          batch[f"{prefix}labels"])

"""Per-sequence log-probs of labelled tokens, shared by the dpo/kto trainers and the reference step so a precomputed
and a live reference compute exactly the same numbers."""

from __future__ import annotations

import functools
import inspect

IGNORE_INDEX = -100
# A preference batch's vision inputs (pixels, per-token types) for the forward over its `<prefix>` sequences, under
# `<prefix>media_inputs`; pairs: one set for [chosen; rejected] (tuneline.data.collators makes them).
MEDIA_INPUTS = "media_inputs"


def projects_selected_positions(model) -> bool:
    """Whether `model` (however wrapped) takes a boolean `logits_to_keep` mask: then only the positions a loss reads
    are projected onto the vocabulary, the step's largest matmul."""
    while hasattr(model, "module"):
        model = model.module
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _forward_takes_logits_to_keep(type(model)) and _boolean_masks_slice()


@functools.cache
def _forward_takes_logits_to_keep(model_class: type) -> bool:
    """Read once per class: every log-prob batch asks."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


@functools.cache
def _boolean_masks_slice() -> bool:
    """transformers slices by a boolean (batch, length) mask since 5.x, not in every 5.x: try it once."""
    import torch

    try:
        from transformers.modeling_utils import slice_logits_to_keep

        return slice_logits_to_keep(torch.zeros(1, 2, 1), torch.tensor([[True, False]])).shape == (1, 1)
    except (ImportError, IndexError, RuntimeError):
        return False


def label_logits(model, input_ids, attention_mask, labels, **inputs):
    """Float32 logits of the positions whose next token is labelled, one row each (row-major), with those labels
    and the batch row each came from; `inputs`: more of the forward's inputs (a vision model's pixels)."""
    import torch

    targets = labels[:, 1:]
    counted = targets != IGNORE_INDEX
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False, **inputs}
    if projects_selected_positions(model):
        logits = model(**kwargs, logits_to_keep=torch.nn.functional.pad(counted, (0, 1), value=False)).logits
    else:
        logits = model(**kwargs).logits[:, :-1][counted]
    return logits.reshape(-1, logits.size(-1)).float(), targets[counted], counted.nonzero()[:, 0]


def sequence_logps(model, input_ids, attention_mask, labels, **inputs):
    """(sum of log p(label) over labelled tokens, number of labelled tokens) per row; logits in float32;
    `inputs`: more of the forward's inputs (a vision model's pixels)."""
    import torch

    logits, targets, rows = label_logits(model, input_ids, attention_mask, labels, **inputs)
    token_logps = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    sums = torch.zeros(input_ids.size(0), dtype=token_logps.dtype, device=token_logps.device)
    return sums.index_add(0, rows, token_logps), (labels[:, 1:] != IGNORE_INDEX).sum(-1)


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
    sums, lengths = sequence_logps(model, input_ids, attention_mask, labels, **batch.get(MEDIA_INPUTS, {}))
    rows = batch["chosen_input_ids"].size(0)
    return sums[:rows], sums[rows:], lengths[:rows], lengths[rows:]


def completion_logps(model, batch, prefix: str = ""):
    """Summed log-probs of the completions in `<prefix>input_ids` (KTO: prefix '' or 'kl_')."""
    return sequence_logps(model, batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"],
                          batch[f"{prefix}labels"], **batch.get(f"{prefix}{MEDIA_INPUTS}", {}))

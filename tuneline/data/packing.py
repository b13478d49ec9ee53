"""Packing: several whole supervised examples per row, isolated from each other.

Isolation relies on transformers reading `position_ids` resets as sequence boundaries, which it does only with no
`attention_mask` and no KV cache: the packed-sft collator must leave both out. Each example's first label is -100
so no token is trained to follow the previous example."""

from __future__ import annotations

import bisect

IGNORE = -100


def first_fit_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices grouped into bins of total length <= capacity: each bin greedily takes the longest that fits."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sizes = [lengths[i] for i in order]
    bins = []
    while order:
        room, current = capacity, []
        while True:
            pos = bisect.bisect_right(sizes, room) - 1
            if pos < 0:
                break
            room -= sizes.pop(pos)
            current.append(order.pop(pos))
        if not current:  # longer than capacity on its own: it gets its own bin
            sizes.pop(0)
            current.append(order.pop(0))
        bins.append(current)
    return bins


def pack_examples(pairs: list[tuple[list[int], list[int]]], cutoff_len: int) -> dict[str, list]:
    """(input_ids, labels) examples -> packed rows with input_ids, attention_mask, labels, position_ids."""
    pairs = [p for p in pairs if p[0]]
    out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "position_ids": []}
    for group in first_fit_bins([len(p[0]) for p in pairs], cutoff_len):
        ids, labels, positions = [], [], []
        for index in group:
            example_ids, example_labels = pairs[index]
            ids += example_ids
            labels += [IGNORE] + example_labels[1:]
            positions += range(len(example_ids))
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
        out["position_ids"].append(positions)
    return out

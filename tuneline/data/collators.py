"""Batch collators: pad each column group to the batch's longest (optionally a multiple), as tensors.

Pad values by column: `*input_ids` -> the tokenizer's pad id, `*attention_mask` -> 0, `*labels` -> -100.
Columns padded together share one length (chosen and rejected, so a trainer can concatenate them). PPO
prompts are padded on the left, for generation. A packed sft batch (rows carrying `position_ids`) is
collated without `attention_mask` and with `use_cache=False`: see `tuneline.data.packing` for why.

`flatten` (padding-free sft training, decided by `tuneline.model.batching`): transformers'
`DataCollatorWithFlattening` puts the batch's examples end to end in one row, isolated as a packed row's are
(position resets, no mask, each example's first label -100). The loss is the padded batch's, and the trainer's
token count (`labels[..., 1:]`) is unchanged, since a row's first label never counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.objectives.logps import MEDIA_INPUTS

IGNORE = -100

_PAIR = [[f"{s}_{c}" for s in ("chosen", "rejected") for c in ("input_ids", "attention_mask", "labels")]]
STAGE_GROUPS: dict[str, list[list[str]]] = {
    "pt": [["input_ids", "attention_mask", "labels"]],
    "sft": [["input_ids", "attention_mask", "labels", "position_ids"]],
    "rm": _PAIR,
    "dpo": _PAIR,
    "kto": [["input_ids", "attention_mask", "labels"], ["kl_input_ids", "kl_attention_mask", "kl_labels"]],
    "ppo": [["input_ids", "attention_mask"]],
    "grpo": [["input_ids", "attention_mask"]],
    "rloo": [["input_ids", "attention_mask"]],
}
LEFT_PADDED = ("ppo", "grpo", "rloo")
# Stages whose rows hold several sequences that one forward reads together, in this order, padded to one length.
SEQUENCE_PREFIXES = {"rm": ("chosen_", "rejected_"), "dpo": ("chosen_", "rejected_")}


def _pad_value(column: str, pad_id: int) -> int:
    if column.endswith("input_ids"):
        return pad_id
    if column.endswith("labels"):
        return IGNORE
    return 0


@dataclass
class Collator:
    stage: str
    pad_token_id: int
    pad_to_multiple_of: int | None = None
    flatten: bool = False
    media: Any = None  # tuneline.data.mm.run_media.RunMedia: rows name images or videos, made into pixels here

    def target_length(self, longest: int) -> int:
        m = self.pad_to_multiple_of
        return longest if not m else -(-longest // m) * m

    def __call__(self, features: list[dict]) -> dict:
        import torch

        if self.flatten and "position_ids" not in features[0]:
            return self.flattened(features)
        batch: dict = {}
        left = self.stage in LEFT_PADDED
        for group in STAGE_GROUPS[self.stage]:
            present = [c for c in group if c in features[0]]
            length = self.target_length(max(len(f[c]) for f in features for c in present))
            for column in present:
                rows = []
                for f in features:
                    values = list(f[column])
                    gap = length - len(values)
                    pad = _pad_value(column, self.pad_token_id)
                    fill = list(range(gap)) if column == "position_ids" else [pad] * gap
                    rows.append(fill + values if left else values + fill)
                batch[column] = torch.tensor(rows, dtype=torch.long)
        if "kto_tags" in features[0]:
            batch["kto_tags"] = torch.tensor([bool(f["kto_tags"]) for f in features])
        if "position_ids" in batch:  # packed: transformers isolates examples only without a mask and cache
            batch.pop("attention_mask", None)
            batch["use_cache"] = False
        if self.media is not None:
            batch.update(self.stage_media(features, batch))
        return batch

    def stage_media(self, features: list[dict], batch: dict) -> dict:
        """The batch's media inputs where the stage's forward reads them: beside the ids (sft); under
        MEDIA_INPUTS for the one forward over [chosen; rejected] (rm, dpo: each row's images twice, as
        LLaMA-Factory's pairwise collator gives them); under MEDIA_INPUTS and `kl_`MEDIA_INPUTS for kto's two
        forwards (the mismatched completion follows the row's own prompt, so its own images)."""
        if self.stage in SEQUENCE_PREFIXES:
            prefixes = SEQUENCE_PREFIXES[self.stage]
            halves = [{"input_ids": f[f"{prefix}input_ids"], "images": f.get("images"), "videos": f.get("videos")}
                      for prefix in prefixes for f in features]
            return {MEDIA_INPUTS: self.media_inputs(halves, batch[f"{prefixes[0]}input_ids"].shape[1])}
        if self.stage == "kto":
            return {f"{prefix}{MEDIA_INPUTS}": self.media_inputs(
                [{**f, "input_ids": f[f"{prefix}input_ids"]} for f in features], batch[f"{prefix}input_ids"].shape[1])
                for prefix in ("", "kl_")}
        return self.media_inputs(features, batch["input_ids"].shape[1])

    def media_inputs(self, features: list[dict], length: int, left: bool = False) -> dict:
        """The pixels of the batch's images and videos (decoded here, in the DataLoader's workers), and any per-token
        input the plugin adds, padded as the ids are (on the left for generation)."""
        import torch

        images = [image for f in features for image in f.get("images") or ()]
        videos = [video for f in features for video in f.get("videos") or ()]
        if not images and not videos:
            return {}
        ids = [list(f["input_ids"]) for f in features]
        inputs = self.media.batch_inputs(images, videos, ids)
        for key, value in inputs.items():
            if isinstance(value, list) and value and isinstance(value[0], list):  # one list per row, unpadded
                gaps = [[0] * (length - len(row)) for row in value]
                inputs[key] = torch.tensor([gap + row if left else row + gap for row, gap in zip(value, gaps, strict=True)])
            elif key in self.media.plugin.token_inputs:
                inputs[key] = pad_token_axis(value, [len(row) for row in ids], length, left)
        return dict(inputs)

    def flattened(self, features: list[dict]) -> dict:
        from transformers import DataCollatorWithFlattening

        columns = [{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features]
        return {**DataCollatorWithFlattening()(columns), "use_cache": False}


def pad_token_axis(tensor, lengths: list[int], length: int, left: bool):
    """A (rows, tokens, ...) tensor that the plugin made as long as the batch's longest row (`lengths`: each row's
    tokens), with zeros on its token axis up to `length`: after it, as LLaMA-Factory pads Mllama's cross-attention
    mask; or before each row's own tokens, where the ids are padded on the left (generation)."""
    import torch

    if not left:
        return torch.nn.functional.pad(tensor, (0, 0) * (tensor.dim() - 2) + (0, length - tensor.shape[1]))
    padded = tensor.new_zeros((tensor.shape[0], length, *tensor.shape[2:]))
    for row, size in enumerate(lengths):
        padded[row, length - size:] = tensor[row, :size]
    return padded


def build_collator(stage: str, tokenizer, pad_to_multiple_of: int | None = None, flatten: bool = False,
                   media=None) -> Collator:
    """The collator for a stage's processed columns (trainers use remove_unused_columns=False)."""
    if stage not in STAGE_GROUPS:
        raise ValueError(f"no collator for stage '{stage}'; stages: {sorted(STAGE_GROUPS)}")
    if flatten and stage != "sft":
        raise ValueError(f"flattened batches are built for sft only, not '{stage}'")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if media is not None and flatten:
        raise ValueError("rows with images are not flattened")
    return Collator(stage, pad_id, pad_to_multiple_of, flatten, media)

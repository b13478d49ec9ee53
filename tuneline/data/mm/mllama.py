"""Llama 3.2 Vision (Mllama): the text reads images through cross-attention layers, not through image tokens in the
sequence. An image is one `<|image|>` token in the text, as both transformers' processor and LLaMA-Factory write it;
its pixels go in as up to `max_image_tiles` tiles per image, and `cross_attention_mask` says which text tokens see
which image: from an image's token to the next image's (consecutive images together), the last to the end.

A batch holds its images row by row (`pixel_values`: rows, images, tiles, channels, height, width) with the aspect
ratio of each image's tile grid; rows with fewer images than the batch's most are padded, as the image processor pads
them. `cross_attention_mask` (rows, tokens, images, tiles) runs along the tokens, so the collator pads its token axis
as it pads the ids (`token_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.base_plugin import MMPlugin
from tuneline.data.mm.pixels import MediaSettings, regularize_image
from tuneline.errors import DataError


@dataclass(frozen=True)
class MllamaPlugin(MMPlugin):
    """One `<|image|>` per image; the batch's tiles, their aspect ratios and the cross-attention mask."""

    token_inputs = ("cross_attention_mask",)

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        return [self.image_token] * len(images)

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """`images` in row order, each row's share read from its `<|image|>` tokens in `batch_ids`."""
        import torch
        from transformers.models.mllama.processing_mllama import (
            convert_sparse_cross_attention_mask_to_dense,
            get_cross_attention_token_mask,
        )

        if not images:
            return {}
        image_id = processor.tokenizer.convert_tokens_to_ids(self.image_token)
        regularized = iter([regularize_image(image, settings.image_max_pixels, settings.image_min_pixels)
                            for image in images])
        counts = [list(ids).count(image_id) for ids in batch_ids]
        if sum(counts) != len(images):
            raise DataError(f"the batch's rows hold {sum(counts)} {self.image_token} token(s) for {len(images)} "
                            f"image(s); each image needs exactly one {self.image_token} (a row cut by cutoff_len "
                            "can lose it: raise cutoff_len)")
        rows = [[next(regularized) for _ in range(count)] for count in counts]
        inputs = dict(processor.image_processor(rows, return_tensors="pt"))
        tiles = inputs.pop("num_tiles")
        spans = [get_cross_attention_token_mask(list(ids), image_id) for ids in batch_ids]
        mask = convert_sparse_cross_attention_mask_to_dense(spans, num_tiles=tiles,
                                                            max_num_tiles=processor.image_processor.max_image_tiles,
                                                            length=max(len(ids) for ids in batch_ids))
        inputs["cross_attention_mask"] = torch.from_numpy(mask)
        return inputs


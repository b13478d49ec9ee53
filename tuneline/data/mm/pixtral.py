"""Pixtral: an image becomes one `[IMG]` per patch of the resized image, row by row, each row closed by
`[IMG_BREAK]` and the last by `[IMG_END]` instead.

The image processor shrinks an image to fit its longest edge and rounds each side up to whole patches; the count is
worked out here from the size in the file's header (`pixtral_size`), so a dataset is expanded without decoding its
pixels. LLaMA-Factory 0.9.5 counts from the processed pixels' `image_sizes`; `benchmarks/mm_parity.py` compares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.base_plugin import MMPlugin
from tuneline.data.mm.pixels import MediaSettings, image_size


@dataclass(frozen=True)
class PixtralPlugin(MMPlugin):
    """Pixtral's rows of patches. The processor's `patch_size` times its `spatial_merge_size` (1 for Pixtral, 2 for
    Mistral 3) is one token's side, as LLaMA-Factory reads them."""

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        side = processor.patch_size * (getattr(processor, "spatial_merge_size", None) or 1)
        texts = []
        for image in images:
            width, height = image_size(image, settings.image_max_pixels, settings.image_min_pixels)
            height, width = pixtral_size(height, width, processor.image_processor)
            row = self.image_token * (width // side) + processor.image_break_token
            texts.append((row * (height // side))[:-len(processor.image_break_token)] + processor.image_end_token)
        return texts


def pixtral_size(height: int, width: int, image_processor: Any) -> tuple[int, int]:
    """(height, width) Pixtral's image processor makes of an image: scaled down (never up) to fit `longest_edge`
    (or `height` x `width`), then each side rounded up to whole patches of the processor's own patch size.
    Written here because transformers sizes an image only from its pixels; a test pins it to transformers."""
    if not getattr(image_processor, "do_resize", True):
        return height, width
    size, patch = _sizes(image_processor.size), _sizes(image_processor.patch_size)
    longest = size.get("longest_edge")
    max_height, max_width = (longest, longest) if longest else (size["height"], size["width"])
    ratio = max(height / max_height, width / max_width)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return (math.ceil(height / patch["height"]) * patch["height"],
            math.ceil(width / patch["width"]) * patch["width"])


def _sizes(value: Any) -> dict:
    """A size setting as a dict: an int (a square), a dict, or transformers' SizeDict."""
    if isinstance(value, int):
        return {"height": value, "width": value}
    if isinstance(value, dict):
        return value
    return {key: getattr(value, key) for key in ("height", "width", "longest_edge") if getattr(value, key, None)}

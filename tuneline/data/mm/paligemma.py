"""PaliGemma: a row's images come before everything else, as `image_seq_length` image tokens each, ahead of the
beginning-of-sequence token; the `<image>` placeholders themselves are dropped from the text.

Those tokens are placed at the token level, where no template slot reaches (before the template's prefix), so the
plugin adds them to the encoded ids (`add_media_ids`) instead of writing them into the text. They are never trained
on, and they count against `cutoff_len` before any turn, as LLaMA-Factory 0.9.5 counts them. A batch marks them
with `token_type_ids` 0 (every other token 1), which PaliGemma reads to let an image's tokens attend to each other
both ways; LLaMA-Factory marks them so too (PaliGemma's own processor also marks the prompt 0).

Where LLaMA-Factory differs: with `mask_history` it builds the turns in reverse onto the image tokens, which leaves
those at the end of the row, behind the text, and its `token_type_ids` then mark the wrong tokens. Here they stay in
front, where the model and its own processor put them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.base_plugin import MMPlugin
from tuneline.data.mm.pixels import MediaSettings

IGNORE = -100


@dataclass(frozen=True)
class PaliGemmaPlugin(MMPlugin):
    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        return [""] * len(images)

    def add_media_ids(self, ids: list[int], labels: list[int] | None, images: list, videos: list,
                      processor: Any) -> tuple[list[int], list[int] | None]:
        """`image_seq_length` image tokens per image before `ids` (and as many ignored labels before `labels`)."""
        count = len(images) * processor.image_seq_length
        prefix = [processor.tokenizer.convert_tokens_to_ids(self.image_token)] * count
        return prefix + ids, None if labels is None else [IGNORE] * count + labels

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """Adds `token_type_ids` (unpadded lists): 0 on the image tokens in front of each row, 1 after them."""
        inputs = super().batch_inputs(images, videos, batch_ids, processor, settings)
        image_id = processor.tokenizer.convert_tokens_to_ids(self.image_token)
        inputs["token_type_ids"] = [[0] * (leading := _leading(ids, image_id)) + [1] * (len(ids) - leading)
                                    for ids in batch_ids]
        return inputs


def _leading(ids: list[int], token: int) -> int:
    """How many of `ids` at the front are `token`."""
    count = 0
    while count < len(ids) and ids[count] == token:
        count += 1
    return count

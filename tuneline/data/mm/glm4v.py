"""GLM-4.1V's plugin (GLM-4.1V-Thinking, GLM-4.5V): images as Qwen2-VL's (resized to whole merged blocks within the
image processor's pixel range, one `<|image|>` per merged block), framed by `<|begin_of_image|>` and
`<|end_of_image|>`; the batch adds `mm_token_type_ids`, from which transformers computes the multimodal rotary
positions.

Videos are refused: GLM-4.1V writes each frame with its timestamp, which its video processor computes, and every
transformers video processor needs torchvision; LLaMA-Factory 0.9.5 also writes every video of a row with the first
one's frame count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.pixels import MediaSettings, image_size
from tuneline.data.mm.plugins import MMPlugin, Qwen2VLPlugin

IMAGE_START, IMAGE_END = "<|begin_of_image|>", "<|end_of_image|>"


@dataclass(frozen=True)
class GLM4VPlugin(Qwen2VLPlugin):
    unencoded_videos = ("writes GLM-4.1V's video frames each with the timestamp its video processor computes, "
                        "which tuneline does not encode yet")

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        image_processor = processor.image_processor
        texts = []
        for image in images:
            width, height = image_size(image, settings.image_max_pixels, settings.image_min_pixels, qwen=True)
            count = image_processor.get_number_of_image_patches(height, width) // image_processor.merge_size ** 2
            texts.append(IMAGE_START + self.image_token * count + IMAGE_END)
        return texts


PLUGINS: dict[str, MMPlugin] = {"glm4v": GLM4VPlugin("glm4v", image_token="<|image|>")}

"""GLM-4.1V's plugin (GLM-4.1V-Thinking, GLM-4.5V): images as Qwen2-VL's (resized to whole merged blocks within the
image processor's pixel range, one `<|image|>` per merged block), framed by `<|begin_of_image|>` and
`<|end_of_image|>`; the batch adds `mm_token_type_ids`, from which transformers computes the multimodal rotary
positions.

Videos are refused: GLM-4.1V writes each frame with its timestamp, which its video processor computes, and every
transformers video processor needs torchvision; LLaMA-Factory 0.9.5 also writes every video of a row with the first
one's frame count."""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.data.mm.plugins import MMPlugin, Qwen2VLPlugin


@dataclass(frozen=True)
class GLM4VPlugin(Qwen2VLPlugin):
    image_frame = ("<|begin_of_image|>", "<|end_of_image|>")
    unencoded_videos = ("writes GLM-4.1V's video frames each with the timestamp its video processor computes, "
                        "which tuneline does not encode yet")


PLUGINS: dict[str, MMPlugin] = {"glm4v": GLM4VPlugin("glm4v", image_token="<|image|>")}

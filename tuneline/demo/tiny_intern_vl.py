"""The tiny InternVL preset's pieces (`tuneline tiny-model --preset intern_vl OUT_DIR`, put together in
`tuneline.demo.tiny_vlm`): InternVL's vision tower on small tiles, pixel-shuffled to a quarter of its patches as
context tokens, before a Qwen2 text model, as InternVL 3 is.

Its processor holds a video processor, which needs torchvision: the files are written as InternVLProcessor saves
them, and where torchvision does not load the image half is read alone (`tuneline.model.image_only_processor`)."""

from __future__ import annotations

import json
from pathlib import Path

# InternVL's image tokens, as its tokenizer names them for the processor
INTERN_VL_NAMED = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                   "video_token": "<video>"}
CHAT_IMAGE, CHAT_VIDEO = "'<IMG_CONTEXT>'", "'<video>'"  # what the chat template writes, the processor expands


def tile_tokens(image_size: int, patch_size: int) -> int:
    """Context tokens per tile: its patches, halved on each side by InternVL's pixel shuffle."""
    return (image_size // patch_size // 2) ** 2


def intern_vl_config(tokenizer, text: dict, vision: dict):
    """`text`: the Qwen2 text model's sizes and token ids; `vision`: the tower's, with its `image_size` (a tile) and
    `patch_size`."""
    from transformers import InternVLConfig

    return InternVLConfig(text_config={"model_type": "qwen2", **text}, vision_config=vision,
                          image_token_id=tokenizer.context_image_token_id,
                          image_seq_length=tile_tokens(vision["image_size"], vision["patch_size"]))


def save_intern_vl_processor(tokenizer, folder: Path, image_size: int, patch_size: int) -> None:
    """processor_config.json as InternVLProcessor saves it, built without its video processor (torchvision)."""
    from transformers import GotOcr2ImageProcessorPil

    tile = {"height": image_size, "width": image_size}
    images = {**GotOcr2ImageProcessorPil(size=tile).to_dict(), "image_processor_type": "GotOcr2ImageProcessor"}
    videos = {"video_processor_type": "InternVLVideoProcessor", "size": tile, "image_mean": images["image_mean"],
              "image_std": images["image_std"]}
    tokenizer.save_pretrained(folder)
    config = {"processor_class": "InternVLProcessor", "image_seq_length": tile_tokens(image_size, patch_size),
              "image_processor": images, "video_processor": videos}
    (folder / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

"""The tiny Pixtral preset (`tuneline tiny-model --preset pixtral OUT_DIR`): LLaVA with a Pixtral vision tower on a
Mistral text model, and Pixtral's processor files.

transformers builds `PixtralProcessor` only where torchvision loads, so its files are written as it saves them (its
settings, the PIL image processor's nested inside): the folder loads whole where torchvision does, and as its image
half (`tuneline.model.pixtral_processor`) where it does not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

PIXTRAL_TOKENS = ("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]")
PIXTRAL_NAMED = {"image_token": "[IMG]"}


def pixtral_config(tokenizer, text_config: Callable, vision: dict):
    """The tiny presets' text model (`text_config(tokenizer, **changes)`) as Mistral, seeing through a Pixtral tower
    of the presets' `vision` sizes: images up to `image_size` a side, the tower's rotary grid as big."""
    from transformers import LlavaConfig

    tower = {"model_type": "pixtral", **vision, "head_dim": vision["hidden_size"] // 2}
    return LlavaConfig(text_config={"model_type": "mistral", **text_config(tokenizer, head_dim=16)},
                       vision_config=tower, image_token_id=tokenizer.image_token_id, vision_feature_layer=-1,
                       vision_feature_select_strategy="full", projector_hidden_act="gelu")


def save_pixtral_processor(tokenizer, folder: Path, vision: dict) -> None:
    """processor_config.json as PixtralProcessor saves it, written without building it (it needs torchvision)."""
    from transformers import PixtralImageProcessorPil

    patch = vision["patch_size"]
    images = PixtralImageProcessorPil(size={"longest_edge": vision["image_size"]},
                                      patch_size={"height": patch, "width": patch}).to_dict()
    images["image_processor_type"] = "PixtralImageProcessor"
    config = {"processor_class": "PixtralProcessor", "image_processor": images, "patch_size": patch,
              "spatial_merge_size": 1, "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
              "image_end_token": "[IMG_END]"}
    tokenizer.save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

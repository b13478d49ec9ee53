"""A Pixtral processor where torchvision does not load.

transformers declares `PixtralProcessor` (Pixtral's, and Mistral 3's) as needing torchvision and refuses to build it
without, though its image processor has a PIL version that needs none. An image row needs no more than that image
processor, the tokenizer and the processor's own settings (patch size, spatial merge, the three image tokens): the
plugin (`tuneline.data.mm.pixtral`) writes the tokens itself, from sizes, as the full processor would. So this holds
those and answers what the plugin asks of a processor; saved, it writes the model's own processor files too, so the
folder loads whole where torchvision does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuneline.model.image_only_processor import ImageOnlyProcessor, processor_files

# PixtralProcessor's own defaults, for a processor_config.json that leaves a setting out
PIXTRAL_DEFAULTS = {"patch_size": 16, "spatial_merge_size": 1, "image_token": "[IMG]",
                    "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}


@dataclass
class PixtralImageOnlyProcessor(ImageOnlyProcessor):
    patch_size: int = PIXTRAL_DEFAULTS["patch_size"]
    spatial_merge_size: int = PIXTRAL_DEFAULTS["spatial_merge_size"]
    image_token: str = PIXTRAL_DEFAULTS["image_token"]
    image_break_token: str = PIXTRAL_DEFAULTS["image_break_token"]
    image_end_token: str = PIXTRAL_DEFAULTS["image_end_token"]


def has_pixtral_tower(model_config) -> bool:
    """Whether the model sees through a Pixtral vision tower (Pixtral's LLaVA, Mistral 3): its processor is
    PixtralProcessor."""
    return getattr(getattr(model_config, "vision_config", None), "model_type", None) == "pixtral"


def load_pixtral_image_only(model_args, hub_kwargs: dict) -> PixtralImageOnlyProcessor:
    """The processor from its parts: the image processor, the tokenizer, and the settings of the model's
    processor_config.json."""
    from transformers import AutoImageProcessor, AutoTokenizer

    name = model_args.model_name_or_path
    image_processor = AutoImageProcessor.from_pretrained(name, **hub_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(name, use_fast=model_args.use_fast_tokenizer, **hub_kwargs)
    files = processor_files(name, hub_kwargs)
    path = files.get("processor_config.json")
    settings = json.loads(Path(path).read_text()) if path else {}
    names = list(tokenizer.model_input_names) + list(image_processor.model_input_names)
    return PixtralImageOnlyProcessor(image_processor, tokenizer, names, files,
                                     **{key: settings.get(key, value) for key, value in PIXTRAL_DEFAULTS.items()})

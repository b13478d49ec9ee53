"""A Qwen-VL, InternVL, GLM-4.1V or MiniCPM-V 4.6 processor without its video half, where torchvision does not load.

transformers builds the Qwen2-VL, Qwen2.5-VL, Qwen3-VL, InternVL, GLM-4.1V and MiniCPM-V 4.6 processors only with their video processor,
and every video processor imports torchvision, so without it none of them loads, even for rows that hold only images.
But an image row needs no more than the image processor (its PIL version loads without torchvision) and the
tokenizer: the plugin (`tuneline.data.mm`) counts the pad tokens (MiniCPM's markers are tokenizer attributes) and
adds `mm_token_type_ids` itself, which is all the full processor adds for images. So this holds those two parts and
answers what the plugin asks of a processor; rows with videos are still refused before the run starts
(`tuneline.data.mm.requirements`). Saved, it writes the image processor, the tokenizer and the model's own processor
files, so the folder loads whole where torchvision does.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.errors import UserError

# processors whose image half suffices
IMAGE_ONLY_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "internvl", "glm4v", "glm4v_moe", "minicpmv4_6")
# The model's processor files that neither the image processor nor the tokenizer writes, copied as they are.
PROCESSOR_FILES = ("processor_config.json", "video_preprocessor_config.json", "chat_template.jinja",
                   "chat_template.json")


@dataclass
class ImageOnlyProcessor:
    image_processor: Any
    tokenizer: Any
    model_input_names: list[str]
    source_files: dict[str, str] = field(default_factory=dict)  # file name -> the model's copy
    # the processor's own settings from processor_config.json (InternVL's `image_seq_length`), read as attributes
    settings: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        settings = self.__dict__.get("settings", {})
        if name in settings:
            return settings[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, path in self.source_files.items():
            shutil.copyfile(path, folder / name)
        self.image_processor.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))


def load_image_only_processor(model_args, model_config, hub_kwargs: dict, error: ImportError) -> ImageOnlyProcessor:
    """The image half of a Qwen-VL model's processor; `error` (the full processor's ImportError) is raised as a
    UserError for any other model, whose processor has no image-only use."""
    from transformers import AutoImageProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    name = model_args.model_name_or_path
    if model_config.model_type not in IMAGE_ONLY_TYPES:
        raise UserError(f"the processor of '{name}' needs torchvision, which is not installed or does not load beside "
                        f"this torch ({str(error).strip().splitlines()[0]}); install the torchvision build that "
                        "matches your torch") from None
    image_processor = AutoImageProcessor.from_pretrained(name, **hub_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(name, use_fast=model_args.use_fast_tokenizer, **hub_kwargs)
    processor_class = PROCESSOR_MAPPING[type(model_config)]
    names = list(tokenizer.model_input_names) + list(image_processor.model_input_names)
    if getattr(processor_class, "return_mm_token_type_ids", False):  # the full processor's own addition
        names.append("mm_token_type_ids")
    files = processor_files(name, hub_kwargs)
    return ImageOnlyProcessor(image_processor, tokenizer, names, files, _scalar_settings(files))


def processor_files(name: str, hub_kwargs: dict) -> dict[str, str]:
    """The model's own processor files (`PROCESSOR_FILES`) that it has: file name -> local path."""
    from transformers.utils import cached_file

    return {file: path for file in PROCESSOR_FILES
            if (path := cached_file(name, file, _raise_exceptions_for_missing_entries=False, **hub_kwargs))}


def _scalar_settings(files: dict[str, str]) -> dict[str, Any]:
    """processor_config.json's plain values (not the nested image and video processor configs)."""
    if "processor_config.json" not in files:
        return {}
    config = json.loads(Path(files["processor_config.json"]).read_text())
    return {key: value for key, value in config.items()
            if key != "processor_class" and isinstance(value, (int, float, str, bool))}

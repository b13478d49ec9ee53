"""The tiny MiniCPM-V 4.6: `tuneline tiny-model --preset minicpm_v_4_6 OUT_DIR`.

MiniCPM-V 4.6's own layers at toy sizes: a 1-layer NaViT vision tower of 8-pixel patches with its window-attention
merger after that layer (so an image keeps the real 16x downsampling), the merger MLP, and a Qwen3.5 text model of
one linear-attention and one full-attention layer. Images are sliced at a 64-pixel resolution into at most 4 slices,
so a demo photo is an overview of 3 pads and a 1 x 3 grid of 6-pad slices. The tokenizer holds MiniCPM's markers
(`<image>`, `<slice>`, `<image_id>` and their ends) and pads (`<|image_pad|>`, `<|video_pad|>`) as attributes, where
its processor reads them. transformers' MiniCPMV4_6Processor needs a video processor (torchvision): its files are
written as that processor saves them, and without torchvision the image-only processor loads them.
"""

from __future__ import annotations

import json
from pathlib import Path

NAMED = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
         "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
         "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}
PATCH, SLICE_RESOLUTION = 8, 64
IMAGE_SETTINGS = {"patch_size": PATCH, "scale_resolution": SLICE_RESOLUTION, "max_slice_nums": 4}
# Qwen3.5's gated delta-net layer beside a full-attention one; its heads sized to the width of 64
LINEAR_ATTENTION = {"layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16}


def minicpm_v_4_6_config(tokenizer, text_config: dict):
    """The model's config around `text_config` (the tiny text sizes and the tokenizer's ids)."""
    from transformers import MiniCPMV4_6Config

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "patch_size": PATCH, "image_size": SLICE_RESOLUTION}
    return MiniCPMV4_6Config(text_config={"model_type": "qwen3_5_text", **text_config,
                                          **LINEAR_ATTENTION},
                             vision_config=vision, insert_layer_id=0, image_size=SLICE_RESOLUTION,
                             image_token_id=tokenizer.convert_tokens_to_ids(NAMED["image_token"]),
                             video_token_id=tokenizer.convert_tokens_to_ids(NAMED["video_token"]))


def save_minicpm_v_4_6_processor(tokenizer, folder: Path) -> None:
    """processor_config.json as MiniCPMV4_6Processor saves it, built without its video processor (torchvision)."""
    from transformers import MiniCPMV4_6ImageProcessorPil

    images = MiniCPMV4_6ImageProcessorPil(**IMAGE_SETTINGS).to_dict()
    videos = {"video_processor_type": "MiniCPMV4_6VideoProcessor", **IMAGE_SETTINGS,
              **{key: images[key] for key in ("image_mean", "image_std", "downsample_mode", "use_image_id")}}
    tokenizer.save_pretrained(folder)
    config = {"processor_class": "MiniCPMV4_6Processor", "image_processor": images, "video_processor": videos}
    (folder / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

"""The tiny GLM-4.1V and GLM-4.5V presets' pieces (`tuneline tiny-model --preset glm4v OUT_DIR`, or glm4_5v; put
together in `tuneline.demo.tiny_vlm`): GLM-4.1V's vision tower (8-pixel patches, 2 x 2 merged) before a GLM-4 text
model with multimodal rotary positions, dense for glm4v and a small mixture of experts for glm4_5v, as GLM-4.5V is.

Its processor holds a video processor, which needs torchvision: the files are written as Glm4vProcessor saves them,
and where torchvision does not load the image half is read alone (`tuneline.model.image_only_processor`)."""

from __future__ import annotations

import json
from pathlib import Path

# GLM-4's turn and reasoning words (its templates' stop words among them) and GLM-4.1V's media words
GLM4V_TOKENS = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                "<think>", "</think>", "<answer>", "</answer>", "<|begin_of_image|>", "<|end_of_image|>",
                "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>")
GLM4V_NAMED = {"image_token": "<|image|>", "video_token": "<|video|>"}
GLM4V_EOS = "<|endoftext|>"
GLM4V_TURN, GLM4V_IMAGE = "'<|' ~ role ~ '|>\\n'", "'<|begin_of_image|><|image|><|end_of_image|>'"
# a head of 16 rotates its first half (GLM's partial rotary), those 4 frequencies split over time, height and width
GLM4V_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]}
# the tiny mixture: 4 routed experts, 2 a token, one shared, the first layer dense
GLM4_5V_EXPERTS = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                   "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}


def _media_ids(tokenizer) -> dict[str, int]:
    ids = tokenizer.convert_tokens_to_ids
    return {"image_token_id": ids("<|image|>"), "video_token_id": ids("<|video|>"),
            "image_start_token_id": ids("<|begin_of_image|>"), "image_end_token_id": ids("<|end_of_image|>"),
            "video_start_token_id": ids("<|begin_of_video|>"), "video_end_token_id": ids("<|end_of_video|>")}


def glm4v_config(tokenizer, text: dict, vision: dict, experts: bool = False):
    """`text`: the text model's sizes and token ids (a head of 16); `vision`: the tower's (with `patch_size`,
    `spatial_merge_size`, `temporal_patch_size`); `experts`: GLM-4.5V's mixture-of-experts text model."""
    from transformers import Glm4vConfig, Glm4vMoeConfig

    text = {**text, "rope_parameters": GLM4V_ROPE, **(GLM4_5V_EXPERTS if experts else {})}
    return (Glm4vMoeConfig if experts else Glm4vConfig)(text_config=text, vision_config=vision, **_media_ids(tokenizer))


def save_glm4v_processor(tokenizer, folder: Path, patch_size: int, pixels: dict) -> None:
    """processor_config.json as Glm4vProcessor saves it, built without its video processor (torchvision). `pixels`:
    the image processor's range, for an image counted as the two frames of one temporal patch."""
    from transformers import Glm4vImageProcessorPil

    patches = {"patch_size": patch_size, "temporal_patch_size": 2, "merge_size": 2}
    images = {**Glm4vImageProcessorPil(size=dict(pixels), **patches).to_dict(),
              "image_processor_type": "Glm4vImageProcessor"}
    videos = {"video_processor_type": "Glm4vVideoProcessor", "size": dict(pixels), **patches,
              "image_mean": images["image_mean"], "image_std": images["image_std"]}
    tokenizer.save_pretrained(folder)
    config = {"processor_class": "Glm4vProcessor", "image_processor": images, "video_processor": videos}
    (folder / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

"""LLaMA-Factory 0.9.5's multimodal templates whose media tuneline does not encode, each with what to use instead.

A user's YAML that names one hears which model family it is for and the two ways on: the same model's text turns
(a template tuneline builds, for rows without media), or a vision family tuneline encodes. Never "not known": the name
is LLaMA-Factory's own."""

from __future__ import annotations

from typing import NamedTuple


class Unbuilt(NamedTuple):
    family: str  # the models the template is for
    media: str  # what its plugin encodes
    text: str | None  # the built template whose text turns are the same, slot for slot; None: none is
    reason: str | None = None  # why it is not built, where more can be said than that its media are not encoded


IMAGES, VIDEOS, AUDIO = "images", "images and videos", "audio"
OMNI = "images, videos and audio"
UNBUILT: dict[str, Unbuilt] = {
    "dots_ocr": Unbuilt("dots.ocr", IMAGES, None),
    "ernie_vl": Unbuilt("ERNIE-4.5-VL", IMAGES, None),
    "gemma3n": Unbuilt("Gemma 3n", "images and audio", "gemma"),
    "gemma4n": Unbuilt("Gemma 4n", "images and audio", "gemma4"),
    "glm_ocr": Unbuilt("GLM-OCR", IMAGES, "glm4"),
    "granite3_vision": Unbuilt("Granite 3 Vision", IMAGES, None),
    "keye_vl": Unbuilt("Keye-VL", VIDEOS, "qwen3"),
    "kimi_vl": Unbuilt("Kimi-VL", IMAGES, None),
    "lfm2_vl": Unbuilt("LFM2-VL", IMAGES, None),
    "llava_next_video": Unbuilt("LLaVA-NeXT-Video", VIDEOS, "vicuna"),
    "llava_next_video_mistral": Unbuilt("LLaVA-NeXT-Video (Mistral)", VIDEOS, "mistral"),
    "llava_next_video_yi": Unbuilt("LLaVA-NeXT-Video (Yi)", VIDEOS, "yi"),
    "mimo_vl": Unbuilt("MiMo-VL", VIDEOS, None),
    "minicpm_v": Unbuilt("MiniCPM-V 2 to 4.5", VIDEOS, "minicpm_v_4_6", reason=(
        "those models are remote code in their checkpoints, model type 'minicpmv': transformers has no class for "
        "their processor, whose slice placeholders the plugin asks for, nor for their model, which reads the "
        "plugin's `image_bound`; MiniCPM-V 4.6 is transformers' own, and template 'minicpm_v_4_6' encodes its "
        "images")),
    "minicpm_o": Unbuilt("MiniCPM-o", OMNI, None, reason=(
        "its plugin reads audio through the remote-code processor of the checkpoint, model type 'minicpmo', which "
        "transformers does not have, and tuneline encodes no audio")),
    "ministral3": Unbuilt("Ministral 3", IMAGES, "ministral"),
    "qwen2_audio": Unbuilt("Qwen2-Audio", AUDIO, None),
    "qwen2_omni": Unbuilt("Qwen2.5-Omni", OMNI, "qwen2_vl"),
    "qwen3_omni": Unbuilt("Qwen3-Omni", OMNI, "qwen3"),
    "qwen3_omni_nothink": Unbuilt("Qwen3-Omni", OMNI, "qwen3_nothink"),
    "video_llava": Unbuilt("Video-LLaVA", VIDEOS, "vicuna"),
    "yi_vl": Unbuilt("Yi-VL", IMAGES, None),
    "youtu_vl": Unbuilt("Youtu-VL", IMAGES, None),
}


def unbuilt_template_problem(name: str | None, vision_built: list[str]) -> str | None:
    """Why `name` (a LLaMA-Factory multimodal template tuneline does not build) is refused, and what to use instead;
    None for any other name."""
    unbuilt = UNBUILT.get(name or "")
    if unbuilt is None:
        return None
    text = (f"for rows without {unbuilt.media}, its text turns are template '{unbuilt.text}'"
            if unbuilt.text else "no built template has its text turns; 'auto' reads the model's own chat template")
    reason = f" ({unbuilt.reason})" if unbuilt.reason else ""
    return (f"template '{name}' is LLaMA-Factory's template for {unbuilt.family} ({unbuilt.media}), whose "
            f"{'audio' if 'audio' in unbuilt.media else 'media'} tuneline does not encode{reason}: {text}, or "
            f"fine-tune a vision model whose template tuneline builds ({', '.join(vision_built)})")

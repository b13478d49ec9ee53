"""Offline tiny vision-language models: `tuneline tiny-model --preset gemma3 OUT_DIR` (or llava, llava_next, qwen2_vl,
qwen3_vl, pixtral, paligemma, minicpm_v_4_6, mllama, intern_vl, glm4v, glm4_5v).

Random weights: a 2-layer text model of width 64 and a 1-layer vision tower on 32-pixel images, so a CPU training step
stays far under a second; the tiny BPE tokenizer with the family's special tokens; the family's processor files, so
`AutoProcessor.from_pretrained(OUT_DIR)` loads offline. Qwen's processors also hold a video processor, which needs
torchvision: their files are written as the processor saves them, and load where torchvision is installed."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tuneline.demo import tiny_paligemma, tiny_pixtral
from tuneline.demo.tiny_glm4v import (
    GLM4V_EOS,
    GLM4V_IMAGE,
    GLM4V_NAMED,
    GLM4V_TOKENS,
    GLM4V_TURN,
    glm4v_config,
    save_glm4v_processor,
)
from tuneline.demo.tiny_intern_vl import (
    CHAT_IMAGE,
    CHAT_VIDEO,
    INTERN_VL_NAMED,
    intern_vl_config,
    save_intern_vl_processor,
)
from tuneline.demo.tiny_minicpm import NAMED as MINICPM_NAMED
from tuneline.demo.tiny_minicpm import minicpm_v_4_6_config, save_minicpm_v_4_6_processor
from tuneline.demo.tiny_mllama import (
    MLLAMA_END,
    MLLAMA_EOS,
    MLLAMA_IMAGE,
    MLLAMA_NAMED,
    MLLAMA_TOKENS,
    MLLAMA_TURN,
    mllama_config,
    save_mllama_processor,
    see_through_gates,
)
from tuneline.demo.tiny_model import DEFAULT_CORPUS_DIR, IM_END, replace_dir, train_tokenizer

VOCAB_SIZE, MAX_LENGTH = 512, 1024
IMAGE_SIZE, PATCH_SIZE = 32, 8  # 4 x 4 patches per image
# initializer_range 1/sqrt(width), as the text tiny model: a 0.02 init keeps the logits too flat to learn from.
TEXT_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": MAX_LENGTH, "initializer_range": 64**-0.5}
VISION_SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
TOWER = {**VISION_SIZES, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}  # for the families in modules of their own
# Qwen resizes each image to a pixel count in [min, max], in multiples of patch x merge (16): 2 x 2 to 4 x 4 tokens.
QWEN_PIXELS = {"shortest_edge": 16 * 16, "longest_edge": IMAGE_SIZE * IMAGE_SIZE * 4}
# Qwen's text rotary halves (8 per head of 16) split over time, height and width.
QWEN_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]}

_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for item in content -%}"
    "{%- if item['type'] == 'image' -%}{{- @IMAGE@ -}}"
    "{%- elif item['type'] == 'video' -%}{{- @VIDEO@ -}}"
    "{%- else -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "@BOS@"
    "{%- for message in messages -%}"
    "{%- set role = @ASSISTANT@ if message['role'] == 'assistant' else message['role'] -%}"
    "{{- @OPEN@ -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- render(message['content']) -}}{{- @END_ANSWER@ -}}{%- endgeneration -%}"
    "{%- else -%}{{- render(message['content']) -}}{{- @END_TURN@ -}}{%- endif -%}"
    "{{- @BETWEEN@ -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{%- set role = @ASSISTANT@ -%}{{- @OPEN@ -}}{%- endif -%}"
)


def chat_template(open_turn: str, end_turn: str, image: str, video: str = "''", end_answer: str | None = None,
                  assistant: str = "'assistant'", bos: bool = False, between: str = "'\\n'") -> str:
    """A family's chat template from jinja expressions; string or list content (`{"type": "image"}` items), and
    {% generation %} around answers so `return_assistant_tokens_mask` finds them; `between`: after each turn."""
    parts = {"@OPEN@": open_turn, "@END_TURN@": end_turn, "@END_ANSWER@": end_answer or end_turn, "@IMAGE@": image,
             "@VIDEO@": video, "@ASSISTANT@": assistant, "@BOS@": "{{- bos_token -}}" if bos else "",
             "@BETWEEN@": between}
    text = _TEMPLATE
    for name, value in parts.items():
        text = text.replace(name, value)
    return text


CHATML_OPEN, CHATML_END = "'<|im_start|>' ~ role ~ '\\n'", "'<|im_end|>'"
QWEN_IMAGE, QWEN_VIDEO = "'<|vision_start|><|image_pad|><|vision_end|>'", "'<|vision_start|><|video_pad|><|vision_end|>'"
QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_NAMED = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
              "vision_end_token": "<|vision_end|>"}


def _ids(tokenizer) -> dict[str, int]:
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def _text_config(tokenizer, **extra) -> dict:
    return {**TEXT_SIZES, "vocab_size": VOCAB_SIZE, "tie_word_embeddings": False, **_ids(tokenizer), **extra}


def _token_id(tokenizer, token: str) -> int:
    return tokenizer.convert_tokens_to_ids(token)


# --- the families: config from the tokenizer, processor files into a folder


def _gemma3_config(tokenizer):
    from transformers import Gemma3Config

    vision = {**VISION_SIZES, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    return Gemma3Config(text_config=_text_config(tokenizer, head_dim=16, sliding_window=64), vision_config=vision,
                        mm_tokens_per_image=4, image_token_index=tokenizer.image_token_id,
                        boi_token_index=_token_id(tokenizer, tokenizer.boi_token),
                        eoi_token_index=_token_id(tokenizer, tokenizer.eoi_token))


def _gemma3_processor(tokenizer, folder: Path) -> None:
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    images = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    Gemma3Processor(images, tokenizer, chat_template=tokenizer.chat_template, image_seq_length=4).save_pretrained(folder)


CLIP_VISION = {"model_type": "clip_vision_model", **VISION_SIZES, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE,
               "projection_dim": VISION_SIZES["hidden_size"]}  # the LLaVA families' tower


def _llava_config(tokenizer):
    from transformers import LlavaConfig

    return LlavaConfig(text_config={"model_type": "llama", **_text_config(tokenizer)}, vision_config=CLIP_VISION,
                       image_token_id=tokenizer.image_token_id, vision_feature_layer=-1,
                       vision_feature_select_strategy="default")


def _llava_processor(tokenizer, folder: Path) -> None:
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    # 16 patch tokens: CLIP's class token is counted (+1) then dropped by the "default" feature selection
    LlavaProcessor(images, tokenizer, patch_size=PATCH_SIZE, vision_feature_select_strategy="default",
                   num_additional_image_tokens=1, chat_template=tokenizer.chat_template).save_pretrained(folder)


# LLaVA-NeXT's any-resolution grids: a 32-pixel base view, plus a 1 x 2, 2 x 1 or 2 x 2 grid of 32-pixel tiles
LLAVA_NEXT_GRIDS = [[IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE], [2 * IMAGE_SIZE, 2 * IMAGE_SIZE]]


def _llava_next_config(tokenizer):
    from transformers import LlavaNextConfig

    return LlavaNextConfig(text_config={"model_type": "llama", **_text_config(tokenizer)}, vision_config=CLIP_VISION,
                           image_token_id=tokenizer.image_token_id, vision_feature_layer=-1,
                           vision_feature_select_strategy="default", image_grid_pinpoints=LLAVA_NEXT_GRIDS)


def _llava_next_processor(tokenizer, folder: Path) -> None:
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    images = LlavaNextImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                        image_grid_pinpoints=LLAVA_NEXT_GRIDS)
    LlavaNextProcessor(images, tokenizer, patch_size=PATCH_SIZE, vision_feature_select_strategy="default",
                       num_additional_image_tokens=1, chat_template=tokenizer.chat_template).save_pretrained(folder)


def _qwen_ids(tokenizer) -> dict[str, int]:
    return {"image_token_id": tokenizer.image_token_id, "video_token_id": tokenizer.video_token_id,
            "vision_start_token_id": _token_id(tokenizer, "<|vision_start|>"),
            "vision_end_token_id": _token_id(tokenizer, "<|vision_end|>")}


QWEN_PATCHES = {"patch_size": PATCH_SIZE, "temporal_patch_size": 2, "spatial_merge_size": 2}


def _qwen2_vl_config(tokenizer):
    from transformers import Qwen2VLConfig

    vision = {"depth": 1, "embed_dim": 32, "hidden_size": TEXT_SIZES["hidden_size"], "num_heads": 2, "mlp_ratio": 2,
              **QWEN_PATCHES}
    return Qwen2VLConfig(text_config=_text_config(tokenizer, rope_parameters=QWEN_ROPE), vision_config=vision,
                         **_qwen_ids(tokenizer))


def _qwen3_vl_config(tokenizer):
    from transformers import Qwen3VLConfig

    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": TEXT_SIZES["hidden_size"], "num_position_embeddings": 16,
              "deepstack_visual_indexes": [0], **QWEN_PATCHES}
    rope = {**QWEN_ROPE, "mrope_interleaved": True}
    return Qwen3VLConfig(text_config=_text_config(tokenizer, head_dim=16, rope_parameters=rope), vision_config=vision,
                         **_qwen_ids(tokenizer))


def qwen_image_processor():
    """The Qwen image processor of the tiny presets (the PIL one: it runs without torchvision)."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(size=dict(QWEN_PIXELS), patch_size=PATCH_SIZE, temporal_patch_size=2,
                                    merge_size=2)


def _qwen_processor(processor_class: str, video_processor_class: str) -> Callable:
    def save(tokenizer, folder: Path) -> None:
        """processor_config.json as Qwen's processor saves it, built without its video processor (torchvision)."""
        images = qwen_image_processor().to_dict()
        images["image_processor_type"] = "Qwen2VLImageProcessor"
        videos = {"video_processor_type": video_processor_class, "size": dict(QWEN_PIXELS), "patch_size": PATCH_SIZE,
                  "temporal_patch_size": 2, "merge_size": 2, "image_mean": images["image_mean"],
                  "image_std": images["image_std"]}
        tokenizer.save_pretrained(folder)
        config = {"processor_class": processor_class, "image_processor": images, "video_processor": videos}
        (folder / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return save


@dataclass(frozen=True)
class VisionFamily:
    """What a tiny VLM preset is built from: its tokens, template, config and processor files."""

    config: Callable  # tokenizer -> the model's PretrainedConfig
    save_processor: Callable  # (tokenizer, folder) -> None: the processor's files, tokenizer included
    chat_template: str
    tokens: tuple[str, ...] = ()  # special tokens added to the tiny tokenizer's four
    named: dict[str, str] = field(default_factory=dict)  # of those, the attributes processors read
    eos_token: str = IM_END
    prepare: Callable | None = None  # model -> None: weights the family's init leaves inert, made to matter


VLM_PRESETS: dict[str, VisionFamily] = {
    "gemma3": VisionFamily(
        _gemma3_config, _gemma3_processor,
        chat_template("'<start_of_turn>' ~ role ~ '\\n'", "'<end_of_turn>'", "'<start_of_image>'",
                      assistant="'model'", bos=True),
        tokens=("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"),
        named={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        eos_token="<end_of_turn>"),
    # LLaVA-1.5's "USER: <image>\n... ASSISTANT: ..." turns, each answer closed by the end-of-sequence token
    "llava": VisionFamily(
        _llava_config, _llava_processor,
        chat_template("(role | upper) ~ ': '", "''", "'<image>\\n'", end_answer="eos_token"),
        tokens=("<image>",), named={"image_token": "<image>"}),
    "llava_next": VisionFamily(
        _llava_next_config, _llava_next_processor,
        chat_template("(role | upper) ~ ': '", "''", "'<image>\\n'", end_answer="eos_token"),
        tokens=("<image>",), named={"image_token": "<image>"}),
    "qwen2_vl": VisionFamily(
        _qwen2_vl_config, _qwen_processor("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
        chat_template(CHATML_OPEN, CHATML_END, QWEN_IMAGE, QWEN_VIDEO), tokens=QWEN_TOKENS, named=QWEN_NAMED),
    "qwen3_vl": VisionFamily(
        _qwen3_vl_config, _qwen_processor("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
        chat_template(CHATML_OPEN, CHATML_END, QWEN_IMAGE, QWEN_VIDEO), tokens=QWEN_TOKENS, named=QWEN_NAMED),
    # Ministral's "[INST]...[/INST]" turns, each answer closed by the end-of-sequence token
    "pixtral": VisionFamily(
        partial(tiny_pixtral.pixtral_config, text_config=_text_config, vision=TOWER),
        partial(tiny_pixtral.save_pixtral_processor, vision=TOWER),
        chat_template("('[INST]' if role == 'user' else '')", "'[/INST]'", "'[IMG]'", end_answer="eos_token",
                      bos=True),
        tokens=tiny_pixtral.PIXTRAL_TOKENS, named=tiny_pixtral.PIXTRAL_NAMED),
    # the prompt on its own line after the beginning of sequence (its processor puts the images before that)
    "paligemma": VisionFamily(
        partial(tiny_paligemma.paligemma_config, text_config=_text_config, vision=TOWER),
        partial(tiny_paligemma.save_paligemma_processor, vision=TOWER),
        chat_template("''", "''", "'<image>'", end_answer="eos_token", bos=True),
        tokens=tiny_paligemma.PALIGEMMA_TOKENS, named=tiny_paligemma.PALIGEMMA_NAMED),
    # MiniCPM-V 4.6: ChatML turns, an image item written as its pad (its processor expands it)
    "minicpm_v_4_6": VisionFamily(
        lambda tokenizer: minicpm_v_4_6_config(tokenizer, _text_config(tokenizer, head_dim=16)),
        save_minicpm_v_4_6_processor,
        chat_template(CHATML_OPEN, CHATML_END, "'<|image_pad|>'", "'<|video_pad|>'"),
        tokens=tuple(MINICPM_NAMED.values()), named=MINICPM_NAMED),
    # Llama 3's turns, one right after the other; each image one <|image|>, read through cross-attention
    "mllama": VisionFamily(
        lambda tokenizer: mllama_config(tokenizer, _text_config(tokenizer)), save_mllama_processor,
        chat_template(MLLAMA_TURN, MLLAMA_END, MLLAMA_IMAGE, bos=True, between="''"), tokens=MLLAMA_TOKENS,
        named=MLLAMA_NAMED, eos_token=MLLAMA_EOS, prepare=see_through_gates),
    # ChatML after the bos token; 32-pixel tiles of 4 context tokens
    "intern_vl": VisionFamily(
        lambda tokenizer: intern_vl_config(tokenizer, _text_config(tokenizer), {**VISION_SIZES, "patch_size": PATCH_SIZE,
                                                                                "image_size": IMAGE_SIZE}),
        lambda tokenizer, folder: save_intern_vl_processor(tokenizer, folder, IMAGE_SIZE, PATCH_SIZE),
        chat_template(CHATML_OPEN, CHATML_END, CHAT_IMAGE, CHAT_VIDEO, bos=True),
        tokens=tuple(INTERN_VL_NAMED.values()), named=INTERN_VL_NAMED),
}
# GLM-4's turns; an image counts as two frames, so twice Qwen's pixel range gives the same 2 x 2 to 4 x 4 tokens
GLM4V_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "image_size": IMAGE_SIZE,
                "out_hidden_size": TEXT_SIZES["hidden_size"], **QWEN_PATCHES}
VLM_PRESETS.update({name: VisionFamily(
    lambda tokenizer, experts=experts: glm4v_config(tokenizer, _text_config(tokenizer, head_dim=16), GLM4V_VISION,
                                                    experts),
    lambda tokenizer, folder: save_glm4v_processor(tokenizer, folder, PATCH_SIZE,
                                                   {key: 2 * value for key, value in QWEN_PIXELS.items()}),
    chat_template(GLM4V_TURN, "''", GLM4V_IMAGE), tokens=GLM4V_TOKENS, named=GLM4V_NAMED, eos_token=GLM4V_EOS)
    for name, experts in (("glm4v", False), ("glm4_5v", True))})


def see_images(model) -> None:
    """Gives zero-initialized projector weights (Gemma 3's `mm_input_projection_weight`) random values: at zero
    every image reaches the language model as the same zeros, and no test could tell whether pixels arrive."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "multi_modal_projector" in name and param.dim() > 1 and not param.any():
                param.normal_(0.0, param.shape[0] ** -0.5)


def build_tiny_vlm(out_dir: str | Path, preset: str, *, seed: int = 0, corpus_dir: str | Path | None = None) -> Path:
    """Build the preset's model, tokenizer and processor files into `out_dir` (replaced whole)."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    from tuneline.demo.demo_data import corpus_texts

    family = VLM_PRESETS[preset]
    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_texts(corpus_dir or DEFAULT_CORPUS_DIR), VOCAB_SIZE, MAX_LENGTH, family.tokens,
                                family.named, family.eos_token, family.chat_template)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(family.config(tokenizer))
    see_images(model)
    if family.prepare:
        family.prepare(model)
    model.generation_config = GenerationConfig(**_ids(tokenizer))
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        family.save_processor(tokenizer, tmp)
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out

"""The tiny PaliGemma preset (`tuneline tiny-model --preset paligemma OUT_DIR`): a SigLIP vision tower on a Gemma
text model, and PaliGemma's processor, built from local pieces.

PaliGemma's processor adds the model's 1024 location and 128 segmentation tokens to a tokenizer that lacks them, as
real PaliGemma vocabularies hold them: the tiny tokenizer is saved with them and the text model sized for them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

PALIGEMMA_TOKENS = ("<image>", "<start_of_turn>", "<end_of_turn>")  # the image token, and paligemma_chat's turns
PALIGEMMA_NAMED = {"image_token": "<image>"}


def paligemma_config(tokenizer, text_config: Callable, vision: dict):
    """The tiny presets' text model (`text_config(tokenizer, **changes)`) as Gemma, its vocabulary grown by
    PaliGemma's extra tokens, seeing through a SigLIP tower of the presets' `vision` sizes: one image token per
    patch."""
    from transformers import PaliGemmaConfig
    from transformers.models.paligemma.processing_paligemma import EXTRA_TOKENS

    text = text_config(tokenizer, head_dim=16, tie_word_embeddings=True)
    text["vocab_size"] += len(EXTRA_TOKENS)
    return PaliGemmaConfig(text_config={"model_type": "gemma", **text}, vocab_size=text["vocab_size"],
                           vision_config={"model_type": "siglip_vision_model", **vision},
                           image_token_index=tokenizer.image_token_id, projection_dim=text["hidden_size"],
                           hidden_size=text["hidden_size"])


def save_paligemma_processor(tokenizer, folder: Path, vision: dict) -> None:
    from transformers import PaliGemmaProcessor, SiglipImageProcessorPil

    size = vision["image_size"]
    images = SiglipImageProcessorPil(size={"height": size, "width": size},
                                     image_seq_length=(size // vision["patch_size"]) ** 2)
    PaliGemmaProcessor(images, tokenizer, chat_template=tokenizer.chat_template).save_pretrained(folder)

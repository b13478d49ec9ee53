"""The tiny PaliGemma preset (`tuneline tiny-model --preset paligemma OUT_DIR`): a SigLIP vision tower on a Gemma
text model, and PaliGemma's processor, built from local pieces.

PaliGemma's processor adds the model's 1024 location and 128 segmentation tokens to a tokenizer that lacks them, as
real PaliGemma vocabularies hold them: the tiny tokenizer is saved with them and the text model sized for them."""

from __future__ import annotations

from pathlib import Path

PALIGEMMA_TOKENS = ("<image>", "<start_of_turn>", "<end_of_turn>")  # the image token, and paligemma_chat's turns
PALIGEMMA_NAMED = {"image_token": "<image>"}


def paligemma_config(tokenizer):
    """32-pixel images in 8-pixel patches: 16 image tokens each."""
    from transformers import PaliGemmaConfig
    from transformers.models.paligemma.processing_paligemma import EXTRA_TOKENS

    from tuneline.demo.tiny_vlm import IMAGE_SIZE, PATCH_SIZE, TEXT_SIZES, VISION_SIZES, VOCAB_SIZE, _text_config

    vocab = VOCAB_SIZE + len(EXTRA_TOKENS)
    text = _text_config(tokenizer, head_dim=16, vocab_size=vocab, tie_word_embeddings=True)
    vision = {"model_type": "siglip_vision_model", **VISION_SIZES, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    return PaliGemmaConfig(text_config={"model_type": "gemma", **text}, vision_config=vision, vocab_size=vocab,
                           image_token_index=tokenizer.image_token_id, projection_dim=TEXT_SIZES["hidden_size"],
                           hidden_size=TEXT_SIZES["hidden_size"])


def save_paligemma_processor(tokenizer, folder: Path) -> None:
    from transformers import PaliGemmaProcessor, SiglipImageProcessorPil

    from tuneline.demo.tiny_vlm import IMAGE_SIZE, PATCH_SIZE

    images = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                     image_seq_length=(IMAGE_SIZE // PATCH_SIZE) ** 2)
    PaliGemmaProcessor(images, tokenizer, chat_template=tokenizer.chat_template).save_pretrained(folder)

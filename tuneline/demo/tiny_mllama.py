"""The tiny Llama 3.2 Vision preset's pieces (`tuneline tiny-model --preset mllama OUT_DIR`; put together in
`tuneline.demo.tiny_vlm`): Llama 3's chat tokens and `<|image|>` on the tiny tokenizer, a text model whose middle
layer of three is a cross-attention layer, and a vision model of two local layers and one global one over up to four
32-pixel tiles an image, its first layer's features concatenated to the last (as Mllama's vision model does with its
intermediate layers)."""

from __future__ import annotations

from pathlib import Path

TILE, TILES = 32, 4
MLLAMA_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|image|>")
MLLAMA_NAMED, MLLAMA_EOS = {"image_token": "<|image|>"}, "<|eot_id|>"
MLLAMA_TURN, MLLAMA_END, MLLAMA_IMAGE = "'<|start_header_id|>' ~ role ~ '<|end_header_id|>\\n\\n'", "'<|eot_id|>'", \
    "'<|image|>'"
MLLAMA_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_global_layers": 1,
                 "attention_heads": 2, "image_size": TILE, "patch_size": 8, "max_num_tiles": TILES,
                 "intermediate_layers_indices": [0], "vision_output_dim": 32 * 2}  # the last layer's and layer 0's


def mllama_config(tokenizer, text: dict):
    """`text`: the text model's sizes and token ids; one more layer than it says, the middle one cross-attention."""
    from transformers import MllamaConfig

    text = {**text, "num_hidden_layers": text["num_hidden_layers"] + 1, "cross_attention_layers": [1]}
    return MllamaConfig(vision_config=MLLAMA_VISION, text_config=text, image_token_index=tokenizer.image_token_id)


def save_mllama_processor(tokenizer, folder: Path) -> None:
    from transformers import MllamaImageProcessorPil, MllamaProcessor

    images = MllamaImageProcessorPil(size={"height": TILE, "width": TILE}, max_image_tiles=TILES)
    MllamaProcessor(images, tokenizer, chat_template=tokenizer.chat_template).save_pretrained(folder)


def see_through_gates(model) -> None:
    """Opens Mllama's tanh gates, zero when initialized: at zero the cross-attention layer adds nothing, so the
    pixels could not change a loss, and no test could tell whether they arrive."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "gate" in name.rsplit(".", 1)[-1] and not param.any():
                param.fill_(1.0)

"""A vision-language export's chat template writes an image as the model's processor expects it, so the processor's
own expansion gives the ids training encoded (the plugin's expansion): image parts or `<image>` in the text.

Tiny presets whose processors build here (Qwen-VL's need torchvision for their video half; the placeholder forms are
checked against training's text in test_jinja_template)."""

from __future__ import annotations

import pytest

from tuneline.data.jinja_template import chat_template
from tuneline.data.mm import get_mm_plugin
from tuneline.data.mm.pixels import MediaSettings
from tuneline.data.mm.run_media import RunMedia
from tuneline.data.template_catalog import get_template

QUESTION = "What is in this picture?"


def _image(seed: int):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 56, 3), dtype=np.uint8))


@pytest.mark.parametrize("preset", ["llava", "gemma3", "mllama"])
def test_the_processor_expands_the_rendered_image_to_the_trained_ids(preset, tiny_vlm):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vlm(preset))
    tokenizer = processor.tokenizer
    template = get_template(preset, tokenizer)
    processor.chat_template = chat_template(template, tokenizer)
    images = [_image(0), _image(1)]
    media = RunMedia(get_mm_plugin(template.mm_plugin), processor, MediaSettings())
    trained = [{"role": "user", "content": f"<image>{QUESTION}<image>"}, {"role": "assistant", "content": ""}]
    prompt_ids, _ = template.encode_oneturn(tokenizer, media.expand(trained, images, []))
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}, {"type": "image"}]}]
    for messages in (trained[:1], parts):
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        served = processor(text=text, images=images, add_special_tokens=False)["input_ids"][0]
        assert list(served) == prompt_ids

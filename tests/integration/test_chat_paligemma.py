"""`tuneline chat` with an image on the tiny PaliGemma: the prompt it generates from is the one PaliGemma's own
processor makes (the image tokens, then the beginning of sequence, before the question), with the same pixels, and
the answer is the model's own `generate` on those inputs, without tuneline.

One difference is deliberate: PaliGemma's processor marks a prompt's text `token_type_ids` 0 (attended both ways, as
the image), where training (LLaMA-Factory's convention, which tuneline keeps) marks only the image tokens 0; the
chat uses training's marks, and so does the reference answer."""

from __future__ import annotations

from cli.main import run
from tests.support.vision_chat import QUESTION, noise_image, processor_answer, vlm_chat_config


def test_paligemma_chat_prompts_as_its_processor_does(tiny_vlm, tmp_path, capsys):
    import torch
    from PIL import Image
    from transformers import AutoProcessor

    from tuneline.config import load_config
    from tuneline.serving.chat import Chat

    path, out = vlm_chat_config(tiny_vlm, tmp_path, "paligemma")
    image = noise_image(tmp_path, 0)
    chat = Chat(load_config(str(path)), tmp_path, images=True)
    prompt, row_inputs, _ = chat.prepare([{"role": "user", "content": QUESTION}], images=[str(image)])
    processor = AutoProcessor.from_pretrained(out)
    own = processor(text=f"<image>{QUESTION}", images=[Image.open(image).convert("RGB")], return_tensors="pt",
                    add_special_tokens=False)
    assert prompt == own["input_ids"][0].tolist() and prompt[:17] == [processor.image_token_id] * 16 + [
        processor.tokenizer.bos_token_id]
    inputs = row_inputs(prompt, len(prompt), True)
    assert torch.equal(inputs["pixel_values"], own["pixel_values"])
    assert inputs["token_type_ids"].tolist() == [[0] * 16 + [1] * (len(prompt) - 16)]

    assert run(["chat", str(path), "--prompt", QUESTION, "--image", str(image)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == processor_answer(out, "paligemma", image)

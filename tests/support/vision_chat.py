"""What the image chat and serving tests share: LLaMA-Factory's demo images, a noise image, and the answer the
processor and model give without tuneline."""

from __future__ import annotations

from pathlib import Path

MLLM_DATA = Path(__file__).resolve().parents[1] / "fixtures/llamafactory/0.9.5/data"


QUESTION = "what is this?"


PROMPTS = {"gemma3": "<|bos|><start_of_turn>user\n<start_of_image>{}<end_of_turn>\n<start_of_turn>model\n",
           "llava": ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                     "helpful, detailed, and polite answers to the user's questions.USER: <image>{} ASSISTANT:")}
PROMPTS["llava_next"] = PROMPTS["llava"]  # the same vicuna turns
PROMPTS["mllama"] = ("<|bos|><|start_header_id|>user<|end_header_id|>\n\n<|image|>{}<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n")


def noise_image(folder, seed: int):
    """A 32 x 32 PNG of random pixels (the tiny models' own size: nothing is resized before the processor)."""
    import numpy as np
    from PIL import Image

    path = folder / f"noise-{seed}.png"
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    return path


def processor_answer(model_dir, preset: str, image_path, question: str = QUESTION, max_new_tokens: int = 6) -> str:
    """The processor's pixels and ids, greedy `generate` of the model as transformers loads it: no tuneline."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    image = Image.open(image_path).convert("RGB")
    inputs = processor(text=PROMPTS[preset].format(question), images=[image], return_tensors="pt",
                       add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    answer = out[0, inputs["input_ids"].shape[1]:].tolist()
    return processor.tokenizer.decode(answer, skip_special_tokens=True).strip()

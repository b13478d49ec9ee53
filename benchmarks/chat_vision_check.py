"""`tuneline chat` with an image on every tiny vision-language family, where torchvision loads (the GPU image):
`python benchmarks/chat_vision_check.py [--device cuda] [--presets gemma3,llava,qwen2_vl,qwen3_vl]`.

For each preset (`tuneline tiny-model --preset NAME`, random weights) and a few random-pixel images: the answer of
`tuneline.serving.chat.Chat` (template, plugin, the collator's pixels, `generate_batches`) against the model's processor and
`generate` alone, given the same prompt text with the image written as the processor's own single image token (the
processor expands it and makes the pixels). Prints a table of answers that agree and the seconds per answer; figures
only. Needs torch, transformers, tokenizers, peft and PIL beside tuneline's own modules (no Prefect, MLflow or
datasets)."""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tuneline from this checkout, installed or not
DATA = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"  # a config names data; none is read
QUESTION = "what is this?"


def noise_images(count: int):
    import numpy as np
    from PIL import Image

    return [Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8))
            for seed in range(count)]


def processor_text(chat, prompt_ids: list[int]) -> str:
    """The prompt's text with the plugin's expansion of the image written as the processor's one image token."""
    processor = chat.vision.media.processor
    text = chat.tokenizer.decode(prompt_ids)
    if getattr(processor, "full_image_sequence", None):  # Gemma 3: begin-of-image, soft tokens, end-of-image
        return text.replace(processor.full_image_sequence, processor.boi_token)
    token = chat.vision.media.plugin.image_token
    return re.sub(f"(?:{re.escape(token)})+", token, text)


def processor_answer(chat, model, image, device: str, max_new_tokens: int) -> str:
    import torch

    prompt = chat._prompt(chat.vision.expand_safely([{"role": "user", "content": f"<image>{QUESTION}"}], [image]),
                          None, None)
    processor = chat.vision.media.processor
    inputs = processor(text=processor_text(chat, prompt), images=[image], return_tensors="pt",
                       add_special_tokens=False).to(device)
    assert inputs["input_ids"][0].tolist() == prompt, "the processor's expansion equals the plugin's"
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=sorted(chat.eos_ids), pad_token_id=chat.tokenizer.pad_token_id)
    return chat.tokenizer.decode(out[0, len(prompt):].tolist(), skip_special_tokens=True).strip()


def check(preset: str, device: str, images: int, work: Path) -> dict:
    from transformers import AutoModelForImageTextToText

    from tuneline.config import load_config
    from tuneline.demo.tiny_vlm import build_tiny_vlm
    from tuneline.serving.chat import Chat

    folder = build_tiny_vlm(work / preset, preset)
    config = load_config(None, {"model_name_or_path": str(folder), "stage": "sft", "template": preset,
                                "dataset": "mllm_demo", "dataset_dir": str(DATA),
                                "do_sample": False, "max_new_tokens": 8}, check_paths=False)
    chat = Chat(config, model_folder=folder, images=True)
    dtype = next(chat.model.parameters()).dtype  # the reference in the dtype tuneline loaded
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype).to(device).eval()
    agree, seconds, answers = 0, 0.0, set()
    for image in noise_images(images):
        start = time.perf_counter()
        answer = chat.respond([{"role": "user", "content": QUESTION}], images=[image]).text
        seconds += time.perf_counter() - start
        answers.add(answer)
        agree += answer == processor_answer(chat, model, image, device, 8)
    return {"preset": preset, "agree": f"{agree}/{images}", "distinct answers": len(answers),
            "s per answer": round(seconds / images, 3), "device": str(next(chat.model.parameters()).device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", default="gemma3,llava,qwen2_vl,qwen3_vl")
    parser.add_argument("--images", type=int, default=4)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            try:
                rows.append(check(preset, args.device, args.images, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - a figure-only check reports each family's failure and goes on
                rows.append({"preset": preset, "agree": f"failed: {type(exc).__name__}: {exc}"[:300]})
            print(rows[-1], flush=True)
    columns = ["preset", "agree", "distinct answers", "s per answer", "device"]
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(column, "")) for column in columns) + " |")


if __name__ == "__main__":
    main()

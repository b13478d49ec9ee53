"""`tuneline chat` with an image on the tiny Pixtral: the answer is the model's own `generate` on the inputs Pixtral's
processor would make, without tuneline.

transformers builds no PixtralProcessor without torchvision (absent here), so those inputs are made as it makes them:
its PIL image processor's pixels and sizes, and the prompt's `[IMG]` written out as its `replace_image_token` writes
it (a row of `[IMG]` per patch row, `[IMG_BREAK]` between rows, `[IMG_END]` last)."""

from __future__ import annotations

import json

from cli.main import run
from tests.support.vision_chat import QUESTION, noise_image, vlm_chat_config


def generated_answer(model_dir, image_path) -> str:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    settings = json.loads((model_dir / "processor_config.json").read_text())
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForImageTextToText.from_pretrained(model_dir)
    pixels = AutoImageProcessor.from_pretrained(model_dir)([Image.open(image_path).convert("RGB")], return_tensors="pt")
    rows, columns = (pixels["image_sizes"][0] // settings["patch_size"]).tolist()
    image = "[IMG_BREAK]".join(["[IMG]" * columns] * rows) + "[IMG_END]"
    text = f"{tokenizer.bos_token}[INST]{image}{QUESTION}[/INST]"
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.eval().generate(input_ids=ids, pixel_values=pixels["pixel_values"],
                                    image_sizes=pixels["image_sizes"], do_sample=False, max_new_tokens=6)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def test_pixtral_chat_answers_from_the_pixels_as_generate_does(tiny_vlm, tmp_path, capsys):
    path, out = vlm_chat_config(tiny_vlm, tmp_path, "pixtral")
    answers = []
    for seed in (0, 1):
        image = noise_image(tmp_path, seed)
        assert run(["chat", str(path), "--prompt", QUESTION, "--image", str(image)]) == 0
        answers.append(capsys.readouterr().out.splitlines()[-1])
        assert answers[-1] == generated_answer(out, image)
    assert answers[0] != answers[1], "another image, another answer: the pixels reach the model"

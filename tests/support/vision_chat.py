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
PROMPTS["paligemma"] = "<image>{}"  # the processor puts the image tokens, then the beginning of sequence, before it


def vlm_chat_config(tiny_vlm, root, preset: str):
    """A config whose output_dir holds a finished full training of the tiny model (its own files stand for it)."""
    import json
    import shutil

    import yaml

    out = shutil.copytree(tiny_vlm(preset), root / f"{preset}-out")
    (out / "run.json").write_text(json.dumps({"status": "complete"}))
    config = {"model_name_or_path": str(tiny_vlm(preset)), "stage": "sft", "finetuning_type": "full",
              "dataset": "mllm_demo", "dataset_dir": str(MLLM_DATA),
              "template": preset, "output_dir": str(out), "do_sample": False, "max_new_tokens": 6}
    path = root / f"{preset}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, out
PROMPTS["minicpm_v_4_6"] = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                            "<|image_pad|>{}<|im_end|>\n<|im_start|>assistant\n")
MINICPM_TOKENS = ("image_token", "image_start_token", "image_end_token", "slice_start_token", "slice_end_token",
                  "image_id_start_token", "image_id_end_token")
PROMPTS["mllama"] = ("<|bos|><|start_header_id|>user<|end_header_id|>\n\n<|image|>{}<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n")
# Families whose processor needs torchvision (its video half): the prompt holds the image's tokens as transformers'
# own processor method writes them from the image processor's output (`image_half_answer`)
PROMPTS["intern_vl"] = ("<|bos|><|im_start|>system\n你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及"
                        "多家合作单位联合开发的多模态大语言模型。<|im_end|>\n<|im_start|>user\n{image}{question}<|im_end|>\n"
                        "<|im_start|>assistant\n")
PROMPTS["glm4v"] = "[gMASK]<sop><|user|>\n<|begin_of_image|>{image}<|end_of_image|>{question}<|assistant|>"


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
    if preset == "paligemma":  # the prompt's text marked 1, as training marks it (PaliGemma's processor marks it 0)
        inputs["token_type_ids"] = (inputs["input_ids"] != processor.image_token_id).long()
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    answer = out[0, inputs["input_ids"].shape[1]:].tolist()
    return processor.tokenizer.decode(answer, skip_special_tokens=True).strip()


def minicpm_processor_text(image_processor, tokenizer, processed) -> str:
    """The text transformers' MiniCPMV4_6Processor writes for the first image of `processed` (its image processor's
    output), with its local id. That processor is built only with its video processor (torchvision), so its own
    expansion methods run on an object holding what it would hold."""
    from types import SimpleNamespace

    from transformers import MiniCPMV4_6Processor

    holder = SimpleNamespace(slice_mode=image_processor.slice_mode,
                             **{name: getattr(tokenizer, name) for name in MINICPM_TOKENS})
    divisor = 4 if image_processor.downsample_mode == "4x" else 16
    text = MiniCPMV4_6Processor.replace_image_token(holder, processed, 0, image_token_divisor=divisor)
    if image_processor.use_image_id:
        text = MiniCPMV4_6Processor._prepend_local_ids(holder, [holder.image_token], [text], holder.image_token)[0]
    return text


def minicpm_processor_answer(model_dir, image_path, question: str = QUESTION, max_new_tokens: int = 6) -> str:
    """`processor_answer` for MiniCPM-V 4.6: its image processor's pixels, the prompt its processor's own expansion
    writes (`minicpm_processor_text`), greedy `generate`: no tuneline."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    tokenizer, images = AutoTokenizer.from_pretrained(model_dir), AutoImageProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    pixels = images([Image.open(image_path).convert("RGB")], return_tensors="pt")
    prompt = PROMPTS["minicpm_v_4_6"].format(question).replace(
        tokenizer.image_token, minicpm_processor_text(images, tokenizer, pixels))
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, pixel_values=pixels["pixel_values"], target_sizes=pixels["target_sizes"],
                             do_sample=False, max_new_tokens=max_new_tokens)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:].tolist(), skip_special_tokens=True).strip()


def image_half_answer(model_dir, preset: str, image_path, question: str = QUESTION, max_new_tokens: int = 6) -> str:
    """As `processor_answer` for InternVL and GLM-4.1V, whose processors cannot be built without torchvision: the
    image processor's pixels, the image's tokens written by the processor class's own `replace_image_token` on them,
    greedy `generate` of the model as transformers loads it (GLM-4.1V's image tokens marked for its rotary
    positions, as its processor marks them): no tuneline."""
    import json
    from types import SimpleNamespace

    import torch
    from PIL import Image
    from transformers import (
        AutoImageProcessor,
        AutoModelForImageTextToText,
        AutoTokenizer,
        Glm4vProcessor,
        InternVLProcessor,
    )

    tokenizer, image_processor = AutoTokenizer.from_pretrained(model_dir), AutoImageProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    pixels = image_processor(images=[Image.open(image_path).convert("RGB")], return_tensors="pt")
    if preset == "intern_vl":
        settings = json.loads((model_dir / "processor_config.json").read_text())
        own = SimpleNamespace(start_image_token="<img>", end_image_token="</img>", image_token="<IMG_CONTEXT>",
                              image_seq_length=settings["image_seq_length"])
        image, inputs = InternVLProcessor.replace_image_token(own, pixels, 0), {"pixel_values": pixels["pixel_values"]}
    else:
        own = SimpleNamespace(image_processor=image_processor, image_token="<|image|>")
        image, inputs = Glm4vProcessor.replace_image_token(own, pixels, 0), dict(pixels)
    ids = tokenizer(PROMPTS[preset].format(image=image, question=question), return_tensors="pt",
                    add_special_tokens=False)
    inputs.update(ids)
    if preset != "intern_vl":
        inputs["mm_token_type_ids"] = (ids["input_ids"] == tokenizer.convert_tokens_to_ids("<|image|>")).long()
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:].tolist(), skip_special_tokens=True).strip()

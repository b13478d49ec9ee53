"""The offline tiny vision-language presets: each builds small, loads offline with Auto classes, and its processor's
prompt expansion and pixel values go through a real forward and loss on a real image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.training import PRESET_MODEL_TYPES
from tuneline.demo.tiny_vlm import VLM_PRESETS, build_tiny_vlm, qwen_image_processor

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data" / "mllm_demo_data" / "1.jpg"
IMAGE_TOKENS = {"intern_vl": "context_image_token"}  # the tokenizer attribute holding the image token, if not its own
CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]},
        {"role": "assistant", "content": "A cat."}]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folders = {}

    def folder(preset: str) -> Path:
        if preset not in folders:
            folders[preset] = build_tiny_vlm(tmp_path_factory.mktemp(preset) / "model", preset)
        return folders[preset]

    return folder


@pytest.fixture(scope="module")
def image():
    from PIL import Image

    return Image.open(IMAGE).convert("RGB")


def forward_loss(model, inputs) -> float:
    import torch

    model.train()
    out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.isfinite(out.loss) and grads and all(torch.isfinite(g).all() for g in grads)
    return float(out.loss.detach())




@pytest.mark.parametrize("preset", sorted(VLM_PRESETS))
def test_each_preset_is_a_few_hundred_kb_with_ids_that_match_its_tokenizer(built, preset):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    folder = built(preset)
    assert sum(p.stat().st_size for p in folder.iterdir()) < 2_000_000
    assert {"config.json", "model.safetensors", "tokenizer.json", "processor_config.json",
            "chat_template.jinja"} <= {p.name for p in folder.iterdir()}
    tokenizer, config = AutoTokenizer.from_pretrained(folder), AutoConfig.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    assert config.model_type == PRESET_MODEL_TYPES.get(preset, preset) and sum(p.numel() for p in model.parameters()) < 300_000
    family = VLM_PRESETS[preset]
    assert all(tokenizer.convert_tokens_to_ids(t) != tokenizer.unk_token_id for t in family.tokens)
    assert len(tokenizer) <= config.get_text_config().vocab_size
    assert tokenizer.convert_ids_to_tokens(getattr(config, "image_token_id", None)
                                           or config.image_token_index) == family.named[IMAGE_TOKENS.get(
                                               preset, "image_token")]
    assert tokenizer.eos_token == family.eos_token == tokenizer.convert_ids_to_tokens(config.get_text_config()
                                                                                        .eos_token_id)


@pytest.mark.parametrize("preset", ["gemma3", "llava", "llava_next"])
def test_processor_expands_the_image_and_the_model_computes_a_loss(built, image, preset):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(built(preset))
    model = AutoModelForImageTextToText.from_pretrained(built(preset))
    text = processor.apply_chat_template(CHAT, tokenize=False)
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    # 4 x 4 patches; Gemma 3 pools them to 2 x 2; LLaVA-NeXT adds the best grid's (2 x 2 tiles for this wide image:
    # 8 x 8 patches, 4 rows of them letterbox) and a newline per row: 16 + 4 x 8 + 4
    assert image_tokens == {"gemma3": 4, "llava": 16, "llava_next": 52}[preset]
    tiles = (5,) if preset == "llava_next" else ()  # the base view and the 2 x 2 grid's
    assert tuple(inputs["pixel_values"].shape) == (1, *tiles, 3, 32, 32)
    assert 0 < forward_loss(model, inputs) < 20


@pytest.mark.parametrize("preset", ["qwen2_vl", "qwen3_vl"])
def test_qwen_model_runs_on_its_image_processors_patches(built, image, preset):
    """The processor itself needs torchvision (its video processor); its image half and the template run here."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    folder = built(preset)
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForImageTextToText.from_pretrained(folder)
    saved = json.loads((folder / "processor_config.json").read_text())
    assert saved["processor_class"] == {"qwen2_vl": "Qwen2VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}[preset]
    assert saved["image_processor"]["patch_size"] == saved["video_processor"]["patch_size"] == 8
    pixels = qwen_image_processor()(images=[image], return_tensors="pt")
    tokens = int(pixels["image_grid_thw"].prod()) // 4  # merge 2 x 2
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert "<|vision_start|><|image_pad|><|vision_end|>What is in the picture?<|im_end|>" in text
    inputs = {**tokenizer(text.replace("<|image_pad|>", "<|image_pad|>" * tokens), return_tensors="pt"), **pixels}
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == tokenizer.image_token_id).long()
    assert 0 < forward_loss(model, inputs) < 20


def test_minicpm_model_runs_on_the_slices_its_plugin_counts(built, image):
    """MiniCPM-V 4.6's processor needs torchvision too: its image processor's overview and slices, the pads the
    plugin writes for them (one per 16 patches), and the model's forward on both."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    from tuneline.data.mm import get_mm_plugin
    from tuneline.model.image_only_processor import ImageOnlyProcessor

    folder = built("minicpm_v_4_6")
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForImageTextToText.from_pretrained(folder)
    saved = json.loads((folder / "processor_config.json").read_text())
    assert saved["processor_class"] == "MiniCPMV4_6Processor"
    assert saved["image_processor"]["patch_size"] == saved["video_processor"]["patch_size"] == 8
    processor = ImageOnlyProcessor(AutoImageProcessor.from_pretrained(folder), tokenizer, [])
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert "<|im_start|>user\n<|image_pad|>What is in the picture?<|im_end|>" in text
    plugin = get_mm_plugin("minicpm_v_4_6")
    expanded = plugin.expand_messages([{"role": "user", "content": "<image>"}], [str(IMAGE)], [], processor)
    assert expanded[0]["content"].startswith("<image_id>0</image_id><image>") and "<slice>" in expanded[0]["content"]
    pixels = plugin.batch_inputs([str(IMAGE)], [], [[1]], processor)
    assert pixels["target_sizes"].tolist() == [[4, 12], [12, 8], [12, 8], [12, 8]]  # the overview, a 1 x 3 grid
    inputs = {**tokenizer(text.replace("<|image_pad|>", expanded[0]["content"]), return_tensors="pt"), **pixels}
    pads = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert pads == int(pixels["target_sizes"].prod(-1).sum()) // 16 == 21
    assert 0 < forward_loss(model, inputs) < 20


def test_intern_vl_model_runs_on_its_image_processors_tiles(built, image):
    """InternVL's processor needs torchvision (its video processor); its image half, its saved settings and the
    template run here: the image processor's tiles of a wide image, 4 context tokens each, through a forward."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    folder = built("intern_vl")
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForImageTextToText.from_pretrained(folder)
    saved = json.loads((folder / "processor_config.json").read_text())
    assert saved["processor_class"] == "InternVLProcessor" and saved["image_seq_length"] == 4
    pixels = AutoImageProcessor.from_pretrained(folder)(images=[image], crop_to_patches=True, return_tensors="pt")
    tiles = int(pixels["num_patches"][0])
    assert tiles > 1 and tuple(pixels["pixel_values"].shape) == (tiles, 3, 32, 32)
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert text.startswith("<|bos|><|im_start|>user\n<IMG_CONTEXT>What is in the picture?<|im_end|>")
    expanded = text.replace("<IMG_CONTEXT>", "<img>" + "<IMG_CONTEXT>" * 4 * tiles + "</img>")
    inputs = {**tokenizer(expanded, return_tensors="pt", add_special_tokens=False),
              "pixel_values": pixels["pixel_values"]}
    assert 0 < forward_loss(model, inputs) < 20


def test_assistant_mask_covers_only_the_answer(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built("gemma3"))
    out = tokenizer.apply_chat_template(CHAT, return_dict=True, return_assistant_tokens_mask=True)
    kept = [i for i, keep in zip(out["input_ids"], out["assistant_masks"], strict=True) if keep]
    assert tokenizer.decode(kept) == "A cat.<end_of_turn>"


def test_cli_lists_the_presets_and_builds_one(tmp_path):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    helped = subprocess.run([sys.executable, "-m", "cli.main", "tiny-model", "--help"], capture_output=True,
                            text=True, check=True, cwd=REPO, env=env)
    assert all(name in " ".join(helped.stdout.split()) for name in ("demo", "gemma3", "llava", "qwen2_vl",
                                                                     "qwen3_vl"))
    built = subprocess.run([sys.executable, "-m", "cli.main", "tiny-model", "--preset", "llava",
                            str(tmp_path / "llava")], capture_output=True, text=True, cwd=REPO, env=env)
    assert built.returncode == 0, built.stderr
    assert json.loads((tmp_path / "llava" / "config.json").read_text())["model_type"] == "llava"
    wrong = subprocess.run([sys.executable, "-m", "cli.main", "tiny-model", "--preset", "llava2",
                            str(tmp_path / "x")], capture_output=True, text=True, cwd=REPO, env=env)
    assert wrong.returncode != 0 and "unknown preset 'llava2'" in wrong.stderr and "qwen3_vl" in wrong.stderr


def test_mllama_reads_the_image_through_cross_attention(built, image):
    """One <|image|> in Llama 3's turns (as tuneline's mllama template writes them), the image as 4 tiles of 32
    pixels, the text after it masked to see them, and the cross-attention gates open: the pixels move the loss."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tuneline.data.template_catalog import get_template

    processor = AutoProcessor.from_pretrained(built("mllama"))
    model = AutoModelForImageTextToText.from_pretrained(built("mllama"))
    text = processor.apply_chat_template(CHAT, tokenize=False)
    prompt, answer = get_template("mllama", processor.tokenizer).encode_oneturn(
        processor.tokenizer, [{"role": "user", "content": "<|image|>What is in the picture?"},
                             {"role": "assistant", "content": "A cat."}])
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == prompt + answer
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 1
    assert tuple(inputs["pixel_values"].shape) == (1, 1, 4, 3, 32, 32)
    seen = inputs["cross_attention_mask"][0, :, 0, 0]
    first = inputs["input_ids"][0].tolist().index(model.config.image_token_id)
    assert not seen[:first].any() and seen[first:].all()
    loss = forward_loss(model, inputs)
    with torch.no_grad():
        blind = model(input_ids=inputs["input_ids"], labels=inputs["input_ids"]).loss
    assert 0 < loss < 20 and abs(loss - float(blind)) > 1e-4


def test_mllama_answers_a_left_padded_batch_as_transformers_does(built):
    """Prompts of two images, one and one, answered in one left-padded batch through tuneline's collator: the same
    tokens as the processor's own left-padded batch and `generate` (with a padded image slot for the one-image rows,
    which in transformers' Mllama the text before a row's first image sees: answers may differ from unbatched ones)."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tuneline.data.collators import build_collator
    from tuneline.data.mm import MediaSettings, get_mm_plugin
    from tuneline.data.mm.run_media import RunMedia
    from tuneline.evaluation.generation import generate_greedy

    processor = AutoProcessor.from_pretrained(built("mllama"))
    model = AutoModelForImageTextToText.from_pretrained(built("mllama")).eval()
    turn = ("<|bos|><|start_header_id|>user<|end_header_id|>\n\n<|image|>{}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    texts = [turn.format("Who are they?<|image|> and"), turn.format("Who?"), turn.format("Who is he, and where?")]
    paths = [[IMAGE, IMAGE.with_name("2.jpg")], [IMAGE.with_name("2.jpg")], [IMAGE.with_name("3.jpg")]]
    prompts = [processor.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    collator = build_collator("sft", processor.tokenizer, media=RunMedia(get_mm_plugin("mllama"), processor,
                                                                         MediaSettings()))
    ours = generate_greedy(model, prompts, pad_id=processor.tokenizer.pad_token_id,
                           eos_ids={processor.tokenizer.eos_token_id}, max_new_tokens=6, batch_size=3,
                           row_inputs=lambda rows, length, left: collator.media_inputs(
                               [{"input_ids": prompts[k], "images": [str(p) for p in paths[k]]} for k in rows],
                               length, left))
    processor.tokenizer.padding_side = "left"
    inputs = processor(text=texts, images=[[Image.open(p).convert("RGB") for p in row] for row in paths],
                       padding=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=6,
                             pad_token_id=processor.tokenizer.pad_token_id)
    eos = processor.tokenizer.eos_token_id
    theirs = [row[:row.index(eos)] if eos in row else row for row in out[:, inputs["input_ids"].shape[1]:].tolist()]
    assert ours == theirs and any(ours)

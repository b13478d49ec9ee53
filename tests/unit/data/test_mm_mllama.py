"""Llama 3.2 Vision (mllama) on a real tiny MllamaProcessor built offline: one <|image|> per image, as the
processor writes it, and the batch's tiles, aspect ratios and cross-attention mask equal to what the processor
itself computes from the same text, for rows of different lengths and image counts, padded on either side."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tests.support.mm_parity import DEMO_IMAGES, load_parity_benchmark
from tuneline.data.collators import build_collator
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.mm.pixels import regularize_image
from tuneline.data.mm.run_media import RunMedia
from tuneline.data.template_catalog import TEMPLATES
from tuneline.data.unbuilt_templates import UNBUILT
from tuneline.errors import DataError

BENCH = load_parity_benchmark()
PLUGIN = get_mm_plugin("mllama")
LIMITS = [{}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400}]


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    return BENCH.load_processor("mllama", BENCH.build_processor("mllama", tmp_path_factory.mktemp("mllama")), {})


def chat(*contents: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]


def images_of(tmp_path, *sizes) -> list[str]:
    paths = []
    for number, size in enumerate(sizes):
        paths.append(str(tmp_path / f"{number}.png"))
        Image.new("RGB", size, ("teal", "orange", "navy")[number % 3]).save(paths[-1])
    return paths


def own_inputs(processor, texts: list[str], rows: list[list[str]], settings: MediaSettings) -> dict:
    """transformers' MllamaProcessor on the same texts and (regularized) images: ids, pixels, mask."""
    resized = [[regularize_image(image, settings.image_max_pixels, settings.image_min_pixels) for image in row]
               for row in rows]
    return processor(text=texts, images=resized, padding=True, return_tensors="pt")


def test_mllama_is_built_on_llama3_turns():
    mllama, llama3 = TEMPLATES["mllama"], TEMPLATES["llama3"]
    assert mllama.mm_plugin == "mllama" and "mllama" not in UNBUILT
    assert (mllama.user, mllama.assistant, mllama.system, mllama.stop_words, mllama.tool_format) == (
        llama3.user, llama3.assistant, llama3.system, llama3.stop_words, llama3.tool_format)


@pytest.mark.parametrize("size", [(300, 168), (168, 300), (200, 200), (20, 90), (1500, 300)])
@pytest.mark.parametrize("limits", LIMITS)
def test_each_image_is_one_token_and_its_tiles_are_the_processors(processor, tmp_path, size, limits):
    settings = MediaSettings(**limits)
    [path] = images_of(tmp_path, size)
    expanded = PLUGIN.expand_messages(chat("<image>Who?", "Them."), [path], [], processor, settings)
    assert expanded[0]["content"] == "<|image|>Who?"
    own = own_inputs(processor, [expanded[0]["content"]], [[path]], settings)
    assert own["input_ids"][0].tolist().count(processor.image_token_id) == 1  # the processor adds none either
    ours = PLUGIN.batch_inputs([path], [], [own["input_ids"][0].tolist()], processor, settings)
    assert sorted(ours) == ["aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask", "pixel_values"]
    for key, value in ours.items():
        assert torch.equal(value, own[key]), key
    assert ours["cross_attention_mask"].sum() > 0


def four_rows(processor, tmp_path, side: str) -> tuple[dict, list[list[int]], list[list[str]]]:
    """None, two images apart, two together, one: the processor's own batch (padded on `side`), each row's ids
    unpadded, and each row's images."""
    paths = images_of(tmp_path, (300, 168), (168, 300), (60, 60), (200, 200), (90, 20))
    texts = ["No image here at all", "<|image|>Who are they? and now<|image|>what?", "<|image|><|image|>Both",
             "<|image|>Hi"]
    rows = [[], paths[:2], paths[2:4], paths[4:]]
    processor.tokenizer.padding_side = side
    try:
        own = own_inputs(processor, texts, rows, MediaSettings())
    finally:
        processor.tokenizer.padding_side = "right"
    lengths = own["attention_mask"].sum(-1).tolist()
    ids = [row[-n:] if side == "left" else row[:n] for row, n in zip(own["input_ids"].tolist(), lengths, strict=True)]
    return own, ids, rows


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_batch_of_rows_with_different_image_counts_is_masked_as_the_processor_masks_it(processor, tmp_path, side):
    """Each text token sees the images before it (consecutive images together), on every token of its row; rows
    without images see none; tiles and aspect ratios per row, padded to the batch's most images."""
    own, ids, rows = four_rows(processor, tmp_path, side)
    media = RunMedia(PLUGIN, processor, MediaSettings())
    ours = build_collator("sft", processor.tokenizer, media=media).media_inputs(
        [{"input_ids": row, "images": images} for row, images in zip(ids, rows, strict=True)],
        own["input_ids"].shape[1], side == "left")
    for key in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
        assert torch.equal(ours[key], own[key]), key
    real = own["attention_mask"][:, :, None, None]  # on padding the processor's mask and LLaMA-Factory's differ
    assert torch.equal(ours["cross_attention_mask"] * real, own["cross_attention_mask"] * real)
    assert ours["cross_attention_mask"][0].sum() == 0 and ours["pixel_values"].shape[:3] == (4, 2, 4)


def test_the_sft_batch_pads_the_mask_as_its_ids(processor, tmp_path):
    """Padded with zeros after each row's tokens, as long as the ids (here to a multiple of 8)."""
    own, ids, rows = four_rows(processor, tmp_path, "right")
    features = [{"input_ids": row, "attention_mask": [1] * len(row), "labels": row, "images": images}
                for row, images in zip(ids, rows, strict=True)]
    media = RunMedia(PLUGIN, processor, MediaSettings())
    batch = build_collator("sft", processor.tokenizer, pad_to_multiple_of=8, media=media)(features)
    mask, width, real = batch["cross_attention_mask"], own["input_ids"].shape[1], own["attention_mask"][:, :, None, None]
    assert mask.shape[:2] == batch["input_ids"].shape and mask.shape[1] % 8 == 0 and mask.shape[1] > width
    assert torch.equal(mask[:, :width] * real, own["cross_attention_mask"] * real) and not mask[:, width:].any()


def test_pairwise_halves_each_get_their_rows_mask(processor, tmp_path):
    """dpo: chosen then rejected rows in one forward, each with its row's images, masks as long as the pair."""
    [path] = images_of(tmp_path, (300, 168))
    image = processor.image_token_id
    row = {"chosen_input_ids": [1, image, 5, 6, 7], "rejected_input_ids": [1, image, 8],
           "chosen_attention_mask": [1] * 5, "rejected_attention_mask": [1] * 3, "chosen_labels": [-100] * 2 + [6] * 3,
           "rejected_labels": [-100] * 2 + [8], "images": [path], "videos": []}
    batch = build_collator("dpo", processor.tokenizer, media=RunMedia(PLUGIN, processor, MediaSettings()))([row])
    mask = batch["media_inputs"]["cross_attention_mask"]
    assert mask.shape[:2] == (2, 5) and batch["media_inputs"]["pixel_values"].shape[0] == 2
    # a row's one image is seen to the batch's longest row, padding included, as in LLaMA-Factory (no label there)
    assert mask[0, :, 0, 0].tolist() == mask[1, :, 0, 0].tolist() == [0, 1, 1, 1, 1]


def test_images_must_match_the_rows_image_tokens(processor):
    with pytest.raises(DataError, match="hold 1 <|image|> token"):
        PLUGIN.batch_inputs([str(DEMO_IMAGES / "1.jpg")] * 2, [], [[1, processor.image_token_id, 5]], processor)
    with pytest.raises(DataError, match="placeholder"):
        PLUGIN.expand_messages(chat("<image>Who?"), [], [], processor)

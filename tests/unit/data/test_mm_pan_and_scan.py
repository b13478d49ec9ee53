"""Gemma 3's pan and scan (`image_do_pan_and_scan: true`): a wide or tall image is followed by its crops, in the
text (LLaMA-Factory's sentence, one image-token run per crop) and in the pixels (the image, then its crops); the
crop count known from the image's size alone; refused under any other template; part of the dataset's key.
Parity with LLaMA-Factory 0.9.5 itself is in test_mm_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.support.mm_parity import load_parity_benchmark
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.mm.pixels import PAN_AND_SCAN, pan_and_scan_crops
from tuneline.data.mm.run_media import RunMedia
from tuneline.errors import ConfigError

BENCH = load_parity_benchmark()
PANS = MediaSettings(image_do_pan_and_scan=True)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = BENCH.build_processor("gemma3", tmp_path_factory.mktemp("gemma3") / "gemma3")
    return BENCH.load_processor("gemma3", folder, {})


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    """800 x 300 of distinct pixels: 3 crops of 267 x 300 (ratio 2.7 rounds to 3; each crop at least 256 wide)."""
    path = tmp_path_factory.mktemp("images") / "wide.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 800, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_crop_count_from_the_size_is_transformers_cut():
    """The count known when the dataset builds is the number of crops transformers' processor cuts."""
    from transformers import Gemma3ImageProcessorPil

    cut = Gemma3ImageProcessorPil().pan_and_scan
    options = {k: v for k, v in PAN_AND_SCAN.items() if k != "do_pan_and_scan"}
    sizes = [(w, h) for w in (1, 200, 256, 300, 511, 512, 513, 700, 768, 800, 1024, 1100, 2000)
             for h in (1, 200, 255, 256, 300, 420, 640, 1000, 1300)]
    assert [pan_and_scan_crops(w, h) for w, h in sizes] == [len(cut(np.zeros((1, h, w)), **options))
                                                            for w, h in sizes]
    assert (pan_and_scan_crops(800, 300), pan_and_scan_crops(300, 800), pan_and_scan_crops(300, 168)) == (3, 3, 0)


def test_a_wide_image_is_followed_by_its_crops_in_text_and_pixels(gemma3, wide):
    plugin, image = get_mm_plugin("gemma3"), gemma3.full_image_sequence
    messages = [{"role": "user", "content": "<image>Who?"}]
    text = plugin.expand_messages(messages, [wide], [], gemma3, PANS)[0]["content"]
    assert text == (f"Here is the original image {image} and here are some crops to help you see better "
                    f"{image} {image} {image}Who?")
    pixels = plugin.batch_inputs([wide], [], [[]], gemma3, PANS)["pixel_values"]
    whole = plugin.batch_inputs([wide], [], [[]], gemma3)["pixel_values"]
    assert pixels.shape[0] == 4 and bool((pixels[0] == whole[0]).all())  # the image first, as without crops
    opened = Image.open(wide)
    for i in range(3):  # then its crops, left to right
        crop = plugin.batch_inputs([opened.crop((267 * i, 0, min(267 * (i + 1), 800), 300))], [], [[]],
                                   gemma3)["pixel_values"][0]
        assert bool((pixels[1 + i] == crop).all())


def test_an_image_without_crops_still_gets_llamafactorys_sentence(gemma3):
    """LLaMA-Factory writes the sentence for every image (transformers' own processor only where there are crops)."""
    plugin, image = get_mm_plugin("gemma3"), gemma3.full_image_sequence
    demo = BENCH.demo_rows()[1]["images"]  # 300 x 199: too small to crop
    text = plugin.expand_messages([{"role": "user", "content": "<image>"}], demo, [], gemma3, PANS)[0]["content"]
    assert text == f"Here is the original image {image} and here are some crops to help you see better "
    assert plugin.batch_inputs(demo, [], [[]], gemma3, PANS)["pixel_values"].shape[0] == 1


@pytest.mark.parametrize("plugin", ["llava", "qwen2_vl", "base"])
def test_other_plugins_refuse_pan_and_scan(plugin):
    with pytest.raises(ConfigError, match="'image_do_pan_and_scan: true' crops images for Gemma 3 only"):
        RunMedia(get_mm_plugin(plugin), None, PANS)
    assert RunMedia(get_mm_plugin(plugin), None, MediaSettings()).settings == MediaSettings()


def test_preflight_refuses_it_with_a_template_other_than_gemma3(make_config, tiny_vlm):
    from tuneline.pipeline.preflight import template_problems

    for template in ("llava", "qwen2_vl", "chatml", None):
        problems = template_problems(make_config(dataset="mllm_demo", template=template, image_do_pan_and_scan=True))
        assert any("'image_do_pan_and_scan: true' crops images for Gemma 3 only" in p for p in problems), template
    gemma3 = make_config(dataset="mllm_demo", template="gemma3", image_do_pan_and_scan=True,
                         model_name_or_path=str(tiny_vlm("gemma3")))  # a tokenizer with gemma3's stop word
    assert template_problems(gemma3) == []


def test_toggling_it_rebuilds_the_dataset(media_data_dir, make_config, tiny_vlm):
    from tuneline.data import build_dataset, load_processed

    vision = {"dataset": "mllm_demo", "model_name_or_path": str(tiny_vlm("gemma3")), "template": "gemma3",
              "image_min_pixels": 400 * 400}
    plain = build_dataset(make_config(**vision))
    panned = build_dataset(make_config(**vision, image_do_pan_and_scan=True))
    assert panned["fingerprint"] != plain["fingerprint"] and not panned["cache_hit"]
    assert panned["tokens"] > plain["tokens"]  # the sentence and the crops' image tokens
    assert build_dataset(make_config(**vision, image_do_pan_and_scan=True))["cache_hit"]
    again = build_dataset(make_config(**vision))
    assert again["cache_hit"] and again["fingerprint"] == plain["fingerprint"]
    rows = load_processed(panned)["train"]
    assert rows[0]["input_ids"] != load_processed(plain)["train"][0]["input_ids"]

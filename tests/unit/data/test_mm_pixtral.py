"""Pixtral's plugin on the parity benchmark's tiny processor (built offline): each image becomes a grid of `[IMG]` as
large as the image Pixtral's own image processor makes, counted here from the image's size alone.

transformers' PixtralProcessor (and even its module) needs torchvision, absent here, so its expansion cannot be
called: the grid is read off the image processor's own `image_sizes` and pixels, and written out as PixtralProcessor's
`replace_image_token` writes it (`benchmarks/mm_parity.py` checks the whole text against LLaMA-Factory's)."""

from __future__ import annotations

import dataclasses

import pytest
from PIL import Image

from tests.support.mm_parity import DEMO_IMAGES, load_parity_benchmark
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.mm.pixels import regularize_image
from tuneline.data.mm.pixtral import pixtral_size
from tuneline.data.template_catalog import TEMPLATES, VISION

BENCH = load_parity_benchmark()


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    folder = BENCH.build_processor("pixtral", tmp_path_factory.mktemp("pixtral"))
    return BENCH.load_processor("pixtral", folder, {})


def chat(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize("size", [(300, 168), (168, 300), (200, 200), (20, 90), (1500, 300), (61, 59), (113, 112)])
@pytest.mark.parametrize("limits", [{}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400}])
def test_pixtral_writes_each_image_as_its_processor_expands_it(processor, tmp_path, size, limits):
    """From the size alone, the grid of the processed pixels: one row of `[IMG]` per patch row, each closed by
    `[IMG_BREAK]`, the last by `[IMG_END]`."""
    settings = MediaSettings(**limits)
    path = tmp_path / "image.png"
    Image.new("RGB", size, "teal").save(path)
    expanded = get_mm_plugin("pixtral").expand_messages(chat("[INST]<image>Who?"), [str(path)], [], processor,
                                                        settings)
    resized = regularize_image(str(path), settings.image_max_pixels, settings.image_min_pixels)
    pixels = processor.image_processor([resized], return_tensors="pt")
    rows, columns = (pixels["image_sizes"][0] // processor.patch_size).tolist()
    own = "[IMG_BREAK]".join(["[IMG]" * columns] * rows) + "[IMG_END]"
    assert expanded[0]["content"] == "[INST]" + own + "Who?" and rows * columns > 1
    inputs = get_mm_plugin("pixtral").batch_inputs([str(path)], [], [[1]], processor, settings)
    assert inputs["image_sizes"].tolist() == pixels["image_sizes"].tolist()
    assert inputs["pixel_values"].shape[-2:] == tuple(pixels["image_sizes"][0].tolist())


def test_several_images_each_get_their_own_rows(processor):
    """A wide and a tall image in one message: each its own grid, in order, one batch of both padded alike."""
    wide, tall = str(DEMO_IMAGES / "1.jpg"), str(DEMO_IMAGES / "2.jpg")
    plugin = get_mm_plugin("pixtral")
    expanded = plugin.expand_messages(chat("<image>and<image>"), [wide, tall], [], processor)
    first, second = expanded[0]["content"].split("and")
    assert first == plugin.expand_messages(chat("<image>"), [wide], [], processor)[0]["content"]
    assert second == plugin.expand_messages(chat("<image>"), [tall], [], processor)[0]["content"]
    inputs = plugin.batch_inputs([wide, tall], [], [[1]], processor)
    counts = [text.count("[IMG]") for text in (first, second)]
    assert [int(h * w) for h, w in (inputs["image_sizes"] // processor.patch_size).tolist()] == counts


@pytest.mark.parametrize("patch", [8, 14, 16])
@pytest.mark.parametrize("size", [{"longest_edge": 112}, {"longest_edge": 64}, {"height": 40, "width": 90}])
def test_pixtral_size_is_the_image_processors(patch, size):
    """The resize written from sizes equals transformers' own, over shapes around the edge and patch boundaries."""
    import numpy as np
    from transformers import PixtralImageProcessorPil
    from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size

    image_processor = PixtralImageProcessorPil(size=size, patch_size={"height": patch, "width": patch})
    edges = (size["longest_edge"],) * 2 if "longest_edge" in size else (size["height"], size["width"])
    for height in (1, 7, 8, 15, 16, 17, 63, 64, 65, 111, 112, 113, 300, 1000):
        for width in (1, 9, 16, 33, 64, 112, 200, 999):
            expected = get_resize_output_image_size(np.zeros((3, height, width)), size=edges,
                                                    patch_size=(patch, patch), input_data_format="channels_first")
            assert pixtral_size(height, width, image_processor) == tuple(expected), (height, width)


def test_pixtral_template_is_ministral_turns_around_pixtral_images():
    """LLaMA-Factory's `pixtral` is its `ministral` slot for slot (in its own registry, as the template-parity snapshot
    holds it), with the Pixtral plugin; here too."""
    turns = load_parity_benchmark("template_parity").read_snapshot()["text_turns"]
    assert turns["pixtral"] == turns["ministral"]
    pixtral = TEMPLATES["pixtral"]
    assert pixtral.mm_plugin == "pixtral" and "pixtral" in VISION
    assert dataclasses.replace(pixtral, name="ministral", mm_plugin=None) == TEMPLATES["ministral"]

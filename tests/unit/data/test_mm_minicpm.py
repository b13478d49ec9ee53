"""MiniCPM-V 4.6's image pads, counted from sizes, equal what transformers' own MiniCPMV4_6Processor writes from the
pixels. That processor cannot be built here (it needs a video processor, hence torchvision), so its own expansion
methods (`replace_image_token`, `_prepend_local_ids`) are called on an object holding what it would hold."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PIL import Image

from tests.support.mm_parity import load_parity_benchmark
from tests.support.vision_chat import minicpm_processor_text
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.template_catalog import TEMPLATES
from tuneline.errors import DataError

BENCH = load_parity_benchmark()
PLUGIN = get_mm_plugin("minicpm_v_4_6")
VARIANTS = {  # image processor settings beside the parity processor's (14-pixel patches, 112-pixel slices)
    "16x": {}, "4x": {"downsample_mode": "4x", "use_image_id": False}, "no_slices": {"slice_mode": False},
    "two_slices": {"max_slice_nums": 2}, "coarse": {"patch_size": 16, "scale_resolution": 64},
}
SIZES = [(300, 168), (168, 300), (200, 200), (20, 90), (1500, 300), (61, 59), (1000, 1000)]


@pytest.fixture(scope="module")
def parity_processor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minicpm") / "minicpm_v_4_6"
    return BENCH.load_processor("minicpm_v_4_6", BENCH.build_processor("minicpm_v_4_6", folder), {})


def processor_with(base, **settings) -> SimpleNamespace:
    from transformers import MiniCPMV4_6ImageProcessorPil

    image_processor = MiniCPMV4_6ImageProcessorPil(**{**BENCH.minicpm_processors().IMAGE_PROCESSOR, **settings})
    return SimpleNamespace(**{**vars(base), "image_processor": image_processor,
                              "default_use_image_id": image_processor.use_image_id,
                              "slice_mode": image_processor.slice_mode})


def own_expansion(processor, image) -> str:
    """transformers' MiniCPMV4_6Processor's text for one image: its placeholder, then its local id before it."""
    from transformers.image_utils import load_image

    processed = processor.image_processor([load_image(image)])
    return minicpm_processor_text(processor.image_processor, processor.tokenizer, processed)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pads_equal_the_processors_own_expansion(parity_processor, tmp_path, size, variant):
    processor = processor_with(parity_processor, **VARIANTS[variant])
    path = tmp_path / "image.png"
    Image.new("RGB", size, "teal").save(path)
    own = own_expansion(processor, str(path))
    expanded = PLUGIN.expand_messages([{"role": "user", "content": "<image>Who?"}], [str(path)], [], processor)
    assert expanded[0]["content"] == own + "Who?" and processor.image_token in own
    inputs = PLUGIN.batch_inputs([str(path)], [], [[1]], processor)
    theirs = processor.image_processor([str(path)], return_tensors="pt")
    assert inputs["target_sizes"].tolist() == theirs["target_sizes"].tolist()
    assert inputs["pixel_values"].equal(theirs["pixel_values"])
    assert inputs["downsample_mode"] == processor.image_processor.downsample_mode
    assert "grids" not in inputs and "num_patches_per_image" not in inputs


def test_large_images_get_a_slice_grid_and_each_image_its_number(parity_processor, tmp_path):
    wide, small = tmp_path / "wide.png", tmp_path / "small.png"
    Image.new("RGB", (900, 300), "teal").save(wide)
    Image.new("RGB", (40, 40), "teal").save(small)
    expanded = PLUGIN.expand_messages([{"role": "user", "content": "<image>and<image>"}], [str(wide), str(small)],
                                      [], parity_processor)[0]["content"]
    first, second = expanded.split("and")
    assert first.startswith("<image_id>0</image_id><image>") and second.startswith("<image_id>1</image_id><image>")
    assert first.count("<slice>") > 1 and "\n" in first  # a grid of several rows
    assert "<slice>" not in second  # smaller than the slice resolution: the overview alone, grown


def test_an_exif_turned_photo_is_counted_upright(parity_processor, tmp_path):
    """transformers turns a photo by its EXIF orientation before sizing it: the count must follow."""
    path = tmp_path / "turned.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees: the 600 x 200 pixels show as 200 x 600
    Image.new("RGB", (600, 200), "teal").save(path, exif=exif)
    expanded = PLUGIN.expand_messages([{"role": "user", "content": "<image>"}], [str(path)], [], parity_processor)
    assert expanded[0]["content"] == own_expansion(parity_processor, str(path))
    assert own_expansion(parity_processor, str(path)) != own_expansion(parity_processor, Image.new("RGB", (600, 200)))


def test_the_image_only_processor_reads_the_markers_from_its_tokenizer(parity_processor, tmp_path):
    """Without torchvision the model's processor is its image processor and tokenizer alone: the same text."""
    path = tmp_path / "image.png"
    Image.new("RGB", (300, 168), "teal").save(path)
    image_only = SimpleNamespace(image_processor=parity_processor.image_processor, tokenizer=parity_processor.tokenizer)
    chat = [{"role": "user", "content": "<image>Who?"}]
    assert PLUGIN.expand_messages(chat, [str(path)], [], image_only) == PLUGIN.expand_messages(
        chat, [str(path)], [], parity_processor)


def test_pixel_limits_do_not_resize_images_as_in_llamafactory(parity_processor):
    row = BENCH.demo_rows()[0]
    counts = {PLUGIN.expand_messages(row["messages"], row["images"], [], parity_processor, MediaSettings(**limits))[0]
              ["content"] for limits in ({}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400})}
    assert len(counts) == 1


def test_videos_are_refused_and_the_template_is_chatml_turns(parity_processor):
    with pytest.raises(DataError, match="takes no videos"):
        PLUGIN.expand_messages([{"role": "user", "content": "<video>"}], [], ["clip.mp4"], parity_processor)
    template = TEMPLATES["minicpm_v_4_6"]
    assert template.mm_plugin == "minicpm_v_4_6" and template.stop_words == ("<|im_end|>",)
    assert template.user == ("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",)


@pytest.mark.parametrize("variant", ["16x", "4x"])
def test_a_decoded_prompt_reads_each_whole_image_as_one_placeholder(parity_processor, tmp_path, variant):
    """Predictions and the model card show a prompt with its images as <image>: the number, the overview and every
    slice of an image are one image."""
    processor = processor_with(parity_processor, **VARIANTS[variant])
    wide, small = tmp_path / "wide.png", tmp_path / "small.png"
    Image.new("RGB", (900, 300), "teal").save(wide)
    Image.new("RGB", (40, 40), "teal").save(small)
    chat = [{"role": "user", "content": "<image>Who?\n<image>"}]
    expanded = PLUGIN.expand_messages(chat, [str(wide), str(small)], [], processor)[0]["content"]
    assert expanded.count("<slice>") > 1
    assert PLUGIN.readable(f"<|im_start|>user\n{expanded}<|im_end|>") == "<|im_start|>user\n<image>Who?\n<image><|im_end|>"

"""InternVL's plugin on a real tiny image processor (GotOcr2's, 56-pixel tiles, built offline): each image becomes
the tokens transformers' InternVLProcessor writes for it, tiled or not, and a batch holds every tile's pixels."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PIL import Image

from tests.support.mm_parity import REPO, load_parity_benchmark
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.mm.pixels import regularize_image
from tuneline.data.mm.plugins import FAMILY_MODULES, PLUGINS
from tuneline.data.mm.run_media import RunMedia
from tuneline.data.template_catalog import TEMPLATES
from tuneline.errors import ConfigError

BENCH = load_parity_benchmark()
CLIPS = REPO / "tests" / "fixtures" / "llamafactory-mm" / "mllm_demo_data"
SIZES = [(300, 168), (168, 300), (200, 200), (20, 90), (1500, 300), (61, 59), (900, 40)]
LIMITS = [{}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400}]


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("intern-vl")
    return BENCH.load_processor("intern_vl", BENCH.build_processor("intern_vl", folder), {})


def own_expansion(processor, image, crop_to_patches: bool) -> str:
    """The text transformers' InternVLProcessor puts where the image was: its `replace_image_token` on the image
    processor's own output for these pixels (the processor itself cannot be built without torchvision)."""
    from transformers import InternVLProcessor

    tokens = SimpleNamespace(start_image_token="<img>", end_image_token="</img>", image_token="<IMG_CONTEXT>",
                             image_seq_length=processor.image_seq_length)
    inputs = processor.image_processor(images=[image], crop_to_patches=crop_to_patches, return_tensors="pt")
    return InternVLProcessor.replace_image_token(tokens, inputs, 0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("limits", LIMITS)
@pytest.mark.parametrize("crop_to_patches", [False, True])
def test_intern_vl_counts_each_image_as_its_processor_expands_it(processor, tmp_path, size, limits, crop_to_patches):
    """From the image's size alone, the text InternVL's processor writes from its pixels: one tile, or with
    `crop_to_patches` the grid nearest its shape after the pixel limits and a thumbnail, 4 context tokens each."""
    settings = MediaSettings(**limits, crop_to_patches=crop_to_patches)
    path = tmp_path / "image.png"
    Image.new("RGB", size, "teal").save(path)
    plugin = get_mm_plugin("intern_vl")
    expanded = plugin.expand_messages([{"role": "user", "content": "<image>Who?"}], [str(path)], [], processor,
                                      settings)
    resized = regularize_image(str(path), settings.image_max_pixels, settings.image_min_pixels)
    own = own_expansion(processor, resized, crop_to_patches)
    assert expanded[0]["content"] == own + "Who?"
    tiles = own.count("<IMG_CONTEXT>") // 4
    assert tiles == 1 if not crop_to_patches else tiles > 1 or size == (200, 200) or size == (61, 59)
    inputs = plugin.batch_inputs([str(path)], [], [[1]], processor, settings)
    assert list(inputs) == ["pixel_values"] and list(inputs["pixel_values"].shape) == [tiles, 3, 56, 56]


def test_a_batch_holds_each_images_tiles_in_order(processor, tmp_path):
    wide, tall = str(CLIPS / "1.jpg"), str(tmp_path / "tall.png")  # 300 x 168: a 4 x 2 grid and the thumbnail
    Image.open(wide).rotate(90, expand=True).save(tall)
    settings = MediaSettings(crop_to_patches=True)
    plugin = get_mm_plugin("intern_vl")
    one, other = (plugin.batch_inputs([image], [], [[1]], processor, settings)["pixel_values"] for image in (wide, tall))
    both = plugin.batch_inputs([wide, tall], [], [[1], [1]], processor, settings)["pixel_values"]
    assert one.shape[0] == 9 and both.shape[0] == one.shape[0] + other.shape[0]
    assert bool((both[:9] == one).all()) and bool((both[9:] == other).all())


def test_videos_are_frames_of_one_tile_each_through_the_image_processor(processor):
    """As in LLaMA-Factory: each sampled frame is written `FrameN: <img>...</img>` on its own line, and its pixels
    (after the video pixel limits) follow the images' tiles; no video processor, so no torchvision is needed."""
    plugin, settings = get_mm_plugin("intern_vl"), MediaSettings(video_fps=1.0, video_maxlen=3)
    clip = str(CLIPS / "1.mp4")
    text = plugin.expand_messages([{"role": "user", "content": "<image><video>What happens?"}],
                                  [str(CLIPS / "1.jpg")], [clip], processor,
                                  settings)[0]["content"]
    frame = "<img>" + "<IMG_CONTEXT>" * 4 + "</img>"
    assert text == frame + "\n".join(f"Frame{i}: {frame}" for i in (1, 2, 3)) + "What happens?"
    inputs = plugin.batch_inputs([str(CLIPS / "1.jpg")], [clip], [[1]], processor, settings)
    assert list(inputs["pixel_values"].shape) == [1 + 3, 3, 56, 56]
    assert not plugin.videos_need_torchvision and get_mm_plugin("qwen2_vl").videos_need_torchvision


def test_crop_to_patches_is_refused_for_other_plugins(processor):
    with pytest.raises(ConfigError, match="'crop_to_patches: true' tiles images for InternVL only.*'llava'"):
        RunMedia(get_mm_plugin("llava"), processor, MediaSettings(crop_to_patches=True))
    assert RunMedia(get_mm_plugin("intern_vl"), processor, MediaSettings(crop_to_patches=True))


def test_intern_templates_are_internlm_turns_around_the_intern_vl_plugin():
    intern2, intern_vl, intern_s1 = TEMPLATES["intern2"], TEMPLATES["intern_vl"], TEMPLATES["intern_s1"]
    assert intern_vl.mm_plugin == intern_s1.mm_plugin == "intern_vl"
    assert intern_vl.default_system.startswith("你是书生·万象，英文名是InternVL") and intern_s1.default_system == ""
    for template in (intern_vl, intern_s1):
        assert (template.slots, template.prefix, template.stop_words) == (intern2.slots, intern2.prefix,
                                                                          intern2.stop_words)
    assert "intern_vl" in FAMILY_MODULES and "intern_vl" not in PLUGINS
    with pytest.raises(ConfigError, match="did you mean 'intern_vl'"):
        get_mm_plugin("intern_v")

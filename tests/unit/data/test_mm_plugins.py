"""The vision-language plugins on real tiny processors (built offline): how many tokens each image becomes, how the
pixel limits change that, the tensors a batch gets, and the rows and configs they refuse."""

from __future__ import annotations

import math
import re
import shutil
from types import SimpleNamespace

import pytest
from PIL import Image

from tests.support.mm_parity import DEMO_IMAGES, REPO, load_parity_benchmark
from tuneline.data.media import pyav_problem, video_problem
from tuneline.data.mm import MediaSettings, get_mm_plugin, video_requirements_problem
from tuneline.data.mm.pixels import (
    SampledVideo,
    image_size,
    limited_size,
    regularize_image,
    sample_indices,
    sample_video,
)
from tuneline.data.mm.plugins import FAMILY_MODULES, PLUGINS, frame_times
from tuneline.data.mm.requirements import torchvision_works
from tuneline.data.template_catalog import TEMPLATES
from tuneline.errors import ConfigError, DataError

BENCH = load_parity_benchmark()
IMAGE = str(DEMO_IMAGES / "1.jpg")  # 300 x 168


@pytest.fixture(scope="module")
def processors(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("mm-processors")
    return {family: BENCH.load_processor(family, BENCH.build_processor(family, work / family), {})
            for family in BENCH.FAMILIES}


def chat(*contents: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]


def test_llava_expands_each_image_to_its_patch_count(processors):
    expanded = get_mm_plugin("llava").expand_messages(chat("<image>Who?<image>", "Them."), [IMAGE, IMAGE], [],
                                                      processors["llava"])
    # 56x56 crop / 14-pixel patches = 16 patches, +1 CLS, -1 for the 'default' feature strategy
    assert expanded[0]["content"] == "<image>" * 16 + "Who?" + "<image>" * 16
    assert expanded[1] == {"role": "assistant", "content": "Them."}
    inputs = get_mm_plugin("llava").batch_inputs([IMAGE], [], [[1, 2]], processors["llava"])
    assert list(inputs["pixel_values"].shape) == [1, 3, 56, 56]


@pytest.mark.parametrize("size", [(300, 168), (168, 300), (200, 200), (20, 90), (1500, 300), (61, 59)])
@pytest.mark.parametrize("limits", [{}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400}])
def test_llava_next_counts_each_image_as_its_processor_expands_it(processors, tmp_path, size, limits):
    """From the image's size alone, the count LLaVA-NeXT's processor writes from the pixels: the best grid for the
    shape after the pixel limits, its letterbox rows or columns cut, one newline per row, the base view's 16."""
    processor, settings = processors["llava_next"], MediaSettings(**limits)
    path = tmp_path / "image.png"
    Image.new("RGB", size, "teal").save(path)
    expanded = get_mm_plugin("llava_next").expand_messages(chat("<image>Who?"), [str(path)], [], processor, settings)
    resized = regularize_image(str(path), settings.image_max_pixels, settings.image_min_pixels)
    own = processor(text="<image>", images=[resized])["input_ids"][0].count(processor.image_token_id)
    assert expanded[0]["content"] == "<image>" * own + "Who?" and own > 16
    inputs = get_mm_plugin("llava_next").batch_inputs([str(path)], [], [[1]], processor, settings)
    assert inputs["image_sizes"].tolist() == [[resized.height, resized.width]]
    assert list(inputs["pixel_values"].shape[-3:]) == [3, 56, 56]


def test_gemma3_frames_soft_tokens_and_marks_them(processors):
    processor = processors["gemma3"]
    expanded = get_mm_plugin("gemma3").expand_messages(chat("<image>Who?"), [IMAGE], [], processor)
    soft = "<image_soft_token>" * 4  # the processor's image_seq_length
    assert expanded[0]["content"] == f"\n\n<start_of_image>{soft}<end_of_image>\n\nWho?"
    soft_id, boi_id = processor.tokenizer.convert_tokens_to_ids(["<image_soft_token>", "<start_of_image>"])
    inputs = get_mm_plugin("gemma3").batch_inputs([IMAGE], [], [[boi_id, soft_id, soft_id, 7]], processor)
    assert inputs["token_type_ids"] == [[0, 1, 1, 0]]
    assert list(inputs["pixel_values"].shape) == [1, 3, 56, 56]


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl"])
def test_qwen_token_count_at_build_time_matches_the_collators_grid(processors, name):
    plugin, processor = get_mm_plugin(name), processors[name]
    for settings in (MediaSettings(), MediaSettings(image_max_pixels=80 * 80), MediaSettings(image_min_pixels=400 ** 2)):
        text = plugin.expand_messages(chat("<image>"), [IMAGE], [], processor, settings)[0]["content"]
        grid = plugin.batch_inputs([IMAGE], [], [[]], processor, settings)["image_grid_thw"]
        assert text == "<|vision_start|>" + "<|image_pad|>" * (int(grid.prod()) // 4) + "<|vision_end|>"


def test_pixel_limits_change_the_qwen_token_count(processors):
    plugin, processor = get_mm_plugin("qwen2_vl"), processors["qwen2_vl"]

    def pads(settings):
        return plugin.expand_messages(chat("<image>"), [IMAGE], [], processor, settings)[0]["content"].count(
            "<|image_pad|>")

    default, small = pads(MediaSettings()), pads(MediaSettings(image_max_pixels=80 * 80))
    large = pads(MediaSettings(image_max_pixels=8 * 8, image_min_pixels=8 * 8))  # min wins when they cross
    # 300x168 rounds to 11x6 28-pixel blocks, over the processor's 64-block cap: shrunk to 10x5; 106x59 -> 4x2
    assert (default, small) == (50, 8)
    assert large == 4  # 10x6 pixels -> Qwen's 28-pixel side: 28x28 -> smart_resize's 56x56 floor (2x2)


def test_limits_scale_down_then_up_and_keep_qwen_sides():
    assert limited_size(300, 168, 768 * 768, 32 * 32) == (300, 168)
    assert limited_size(300, 168, 80 * 80, 32 * 32) == (106, 59)
    assert limited_size(300, 168, 768 * 768, 400 * 400) == (534, 299)
    assert limited_size(10, 100, 768 * 768, 16, qwen=True) == (28, 100)
    assert limited_size(6000, 28, 10 ** 9, 16, qwen=True) == (5040, 28)  # past 200:1, cut to 180:1
    assert limited_size(10, 100, 768 * 768, 16) == (10, 100)  # the side rule is Qwen's only


def test_regularized_pixels_have_the_size_counted_at_build_time(tmp_path):
    gray = tmp_path / "gray.png"
    Image.new("L", (90, 10), 128).save(gray)
    for qwen in (False, True):
        image = regularize_image(str(gray), 768 * 768, 32 * 32, qwen)
        assert (image.size, image.mode) == (image_size(str(gray), 768 * 768, 32 * 32, qwen), "RGB")
    assert image.size == (96, 28)  # 900 pixels grown to 1024 (96x10), then Qwen's 28-pixel side


def test_placeholder_and_media_counts_must_match(processors):
    plugin = get_mm_plugin("qwen2_vl")
    with pytest.raises(DataError, match=r"2 <image> placeholder\(s\) but the row has 1 image"):
        plugin.expand_messages(chat("<image>a<image>"), [IMAGE], [], processors["qwen2_vl"])
    with pytest.raises(DataError, match=r"0 <video> placeholder\(s\) but the row has 1 video"):
        plugin.expand_messages(chat("<image>"), [IMAGE], [[IMAGE, IMAGE]], processors["qwen2_vl"])


def test_models_refuse_media_they_cannot_read(processors):
    with pytest.raises(DataError, match="plugin 'llava' takes no videos"):
        get_mm_plugin("llava").expand_messages(chat("<video>"), [], [[IMAGE]], processors["llava"])
    with pytest.raises(DataError, match="plugin 'base' takes no images"):
        get_mm_plugin(None).expand_messages(chat("<image>"), [IMAGE], [], None)
    assert get_mm_plugin(None).expand_messages(chat("plain"), [], [], None) == chat("plain")
    with pytest.raises(ConfigError, match="needs the model's processor"):
        get_mm_plugin("gemma3").expand_messages(chat("<image>"), [IMAGE], [], SimpleNamespace())


def test_unknown_plugin_names_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'qwen2_vl'"):
        get_mm_plugin("qwen2vl")


def test_qwen_videos_from_frames_expand_per_frame_pair(processors):
    frames = [str(DEMO_IMAGES / f"{i}.jpg") for i in (1, 2, 3)]  # odd: the last frame is repeated
    processor = processors["qwen3_vl"]
    qwen2 = get_mm_plugin("qwen2_vl").expand_messages(chat("<video>"), [], [frames], processor)[0]["content"]
    qwen3 = get_mm_plugin("qwen3_vl").expand_messages(chat("<video>"), [], [frames], processor)[0]["content"]
    # 4 frames of 300x168 (under 256*256 pixels: kept). Qwen2-VL sizes each frame alone: 6x11 28-pixel blocks are
    # over the 64-block cap, shrunk to 5x10; 2 frame pairs x 50 blocks = 100 pads
    assert qwen2 == "<|vision_start|>" + "<|video_pad|>" * 100 + "<|vision_end|>"
    # Qwen3-VL caps the clip's pixels: 4 frames x 6x11 blocks shrunk to 2x5 per frame -> 10 pads per frame pair,
    # each pair stamped with the mean time of its frames (0 and 1, 2 and 2 at 2 fps)
    frame = "<|vision_start|>" + "<|video_pad|>" * 10 + "<|vision_end|>"
    assert qwen3 == f"<0.2 seconds>{frame}<1.0 seconds>{frame}"


def test_a_stream_of_unknown_length_is_counted_by_the_frames_it_has(tmp_path, processors):
    """A JPEG named .mp4 opens in PyAV as a video stream of one frame whose header gives no frame count: LLaMA-Factory
    then samples the first `video_maxlen` frames. Only those that exist are counted, at build time as in the
    collator, so the tokens written match the pixels made (counting all 128 would write 64 frame pairs)."""
    clip = tmp_path / "still.mp4"
    shutil.copy(IMAGE, clip)
    header, decoded = sample_video(str(clip), MediaSettings(), decode=False), sample_video(str(clip), MediaSettings())
    assert header.indices == decoded.indices == [0] and len(decoded.frames) == 1
    assert header.duration == decoded.duration == 0.5  # no duration in the header: one frame at video_fps
    assert video_problem(clip) is None  # PyAV reads it as a video, as LLaMA-Factory's does
    text = get_mm_plugin("qwen2_vl").expand_messages(chat("<video>"), [], [str(clip)], processors["qwen2_vl"])
    # one frame repeated to a pair; 300x168 as 5x10 28-pixel blocks (see the frames test above): 50 pads
    assert text[0]["content"] == "<|vision_start|>" + "<|video_pad|>" * 50 + "<|vision_end|>"


def test_qwen3_stamps_each_video_with_its_own_frames(processors):
    """Each video gets its own frame pairs and times, wherever it sits: LLaMA-Factory 0.9.5 writes every video of a
    row with the first one's pair count and times, and fails on a video after the first message (checked there)."""
    clips = REPO / "tests" / "fixtures" / "llamafactory-mm" / "mllm_demo_data"
    plugin, processor = get_mm_plugin("qwen3_vl"), processors["qwen3_vl"]
    two = plugin.expand_messages(chat("<video><video>Which?"), [], [str(clips / "1.mp4"), str(clips / "3.mp4")],
                                 processor)[0]["content"]
    stamps = re.findall(r"<([0-9.]+) seconds>", two)
    # 1.mp4: 19 frames sampled over 9.7 s, the last repeated -> 10 pairs; 3.mp4: 12 over 6.1 s -> 6, timed from 0
    assert len(stamps) == 16 and (stamps[0], stamps[9], stamps[10], stamps[15]) == ("0.3", "9.7", "0.3", "5.8")
    later = plugin.expand_messages(chat("Hi.", "Hello.", "<video>And now?"), [], [str(clips / "3.mp4")], processor)
    assert later[2]["content"].startswith("<0.3 seconds><|vision_start|>") and later[2]["content"].count("seconds>") == 6


QWEN3_VIDEO = {"size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, "patch_size": 16,
               "merge_size": 2, "temporal_patch_size": 2, "max_video_tokens": 768}  # Qwen3VLVideoProcessor's defaults


def test_qwen3_video_token_count_equals_transformers_own_count_with_and_without_the_frame_cap():
    """transformers counts a Qwen3-VL video's patches in a method free of torchvision (`get_num_of_video_patches`,
    called here on the settings alone), in step with its resize; the plugin's grid equals it, also with the per-frame
    cap (`cap_pixels_per_frame`, transformers 5.2x), which LLaMA-Factory 0.9.5 does not read."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    plugin, counts = get_mm_plugin("qwen3_vl"), {}
    for cap in (None, True):
        config = SimpleNamespace(**QWEN3_VIDEO, cap_pixels_per_frame=cap)
        processor = SimpleNamespace(video_processor=config, image_processor=config)
        for (width, height), frames, settings in (((640, 360), 19, MediaSettings()),
                                                  ((640, 360), 128, MediaSettings(video_max_pixels=1280 * 720)),
                                                  ((1920, 1080), 2, MediaSettings(video_max_pixels=1920 * 1080)),
                                                  ((90, 1600), 6, MediaSettings(video_min_pixels=256 * 256))):
            video = SampledVideo([], list(range(frames)), (width, height), None, frames / 2.0)
            grid = plugin.video_grid(video, processor, settings)
            frame_width, frame_height = limited_size(width, height, settings.video_max_pixels,
                                                     settings.video_min_pixels, qwen=True)
            expected = Qwen3VLVideoProcessor.get_num_of_video_patches(config, frames + frames % 2, frame_height,
                                                                      frame_width)
            assert math.prod(grid) == expected, (cap, width, height, frames)
            counts.setdefault((width, frames), []).append(expected)
    assert any(uncapped != capped for uncapped, capped in counts.values()), "the cap changes some count"


def test_qwen2_video_frames_follow_the_per_frame_cap_where_the_processor_sets_it():
    """Qwen2-VL's video processor module needs torchvision to import, so its resize rule is worked by hand: 20
    frames of 640x360 (kept under 1280x720 pixels), 28-pixel blocks. Uncapped, each frame stays within 602,112
    pixels: 13 x 23 blocks (26 x 46 patches). Capped at 768 tokens, a frame's top is max(min(602112, int(768 x 784
    x 0.9) x 2 // 20), int(100352 x 1.05)) = 105,369 pixels: 8 x 15 blocks (16 x 30 patches)."""
    plugin, settings = get_mm_plugin("qwen2_vl"), MediaSettings(video_max_pixels=1280 * 720)
    video = SampledVideo([], list(range(20)), (640, 360), None, 10.0)
    grids = []
    for cap in (None, True):
        config = SimpleNamespace(size={"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}, patch_size=14,
                                 merge_size=2, temporal_patch_size=2, max_video_tokens=768, cap_pixels_per_frame=cap)
        grids.append(plugin.video_grid(video, SimpleNamespace(video_processor=config, image_processor=config),
                                       settings))
    assert grids == [(10, 26, 46), (10, 16, 30)]


def test_frame_times_average_each_temporal_patch():
    assert frame_times([0.0, 1.0, 2.0], fps=2.0, merge_size=2) == [0.25, 1.0]
    kept = sample_indices(100, duration=10.0, fps=2.0, maxlen=128)  # 2 per second over 10 s, spread evenly
    assert (len(kept), kept[0], kept[-1]) == (20, 0, 99) and kept == sorted(set(kept))
    assert len(sample_indices(100, duration=100.0, fps=2.0, maxlen=8)) == 8


def test_templates_name_known_plugins():
    plugins = {name: TEMPLATES[name].mm_plugin for name in ("llava", "llava_next", "gemma3", "qwen2_vl", "qwen3_vl",
                                                           "qwen3_vl_nothink")}
    assert plugins == {"llava": "llava", "llava_next": "llava_next", "gemma3": "gemma3", "qwen2_vl": "qwen2_vl",
                       "qwen3_vl": "qwen3_vl", "qwen3_vl_nothink": "qwen3_vl"}
    assert {t.mm_plugin for t in TEMPLATES.values()} - {None} <= set(PLUGINS) | set(FAMILY_MODULES)
    assert TEMPLATES["qwen3_vl"].reasoning and not TEMPLATES["qwen3_vl_nothink"].reasoning


def test_video_requirements_name_torchvision_when_it_is_missing():
    problem = video_requirements_problem()
    if torchvision_works() and pyav_problem() is None:
        assert problem is None
    elif pyav_problem() is None:
        assert "reading videos needs torchvision" in problem and "pip install torchvision" in problem


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl"])
def test_qwen_marks_image_and_video_pads_where_the_processor_returns_their_types(processors, name):
    """transformers' Qwen-VL processors (from 5.17) return `mm_token_type_ids`, and their models refuse pixels
    without them; a processor that does not name them gets none."""
    plugin, processor = get_mm_plugin(name), processors[name]
    image_pad, video_pad = processor.tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    ids = [[7, image_pad, image_pad, 8], [image_pad, video_pad]]
    assert "mm_token_type_ids" not in plugin.batch_inputs([IMAGE], [], ids, processor)
    newer = SimpleNamespace(**{**vars(processor), "model_input_names": [*processor.model_input_names, "mm_token_type_ids"]})
    assert plugin.batch_inputs([IMAGE], [], ids, newer)["mm_token_type_ids"] == [[0, 1, 1, 0], [1, 2]]

"""GLM-4.1V's plugin on a real tiny image processor (Glm4v's PIL one, built offline): each image becomes the tokens
transformers' Glm4vProcessor writes for it inside the chat template's begin and end of image, and its videos are
refused with the reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PIL import Image

from tests.support.mm_parity import REPO, load_parity_benchmark
from tuneline.data.mm import MediaSettings, get_mm_plugin
from tuneline.data.mm.pixels import regularize_image
from tuneline.data.template_catalog import TEMPLATES

BENCH = load_parity_benchmark()
DEMO = REPO / "tests" / "fixtures" / "llamafactory-mm" / "mllm_demo_data"
SIZES = [(300, 168), (168, 300), (200, 200), (20, 90), (1500, 300), (61, 59), (900, 10)]
LIMITS = [{}, {"image_max_pixels": 80 * 80}, {"image_min_pixels": 400 * 400}]


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm4v")
    return BENCH.load_processor("glm4v", BENCH.build_processor("glm4v", folder), {})


def own_expansion(processor, image) -> str:
    """What GLM-4.1V's chat template and processor write for the image: the template's begin and end of image around
    the processor's `replace_image_token` on its image processor's output for these pixels (the processor itself
    cannot be built without torchvision)."""
    from transformers import Glm4vProcessor

    own = SimpleNamespace(image_processor=processor.image_processor, image_token="<|image|>")
    inputs = processor.image_processor(images=[image], return_tensors="pt")
    return "<|begin_of_image|>" + Glm4vProcessor.replace_image_token(own, inputs, 0) + "<|end_of_image|>"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("limits", LIMITS)
def test_glm4v_counts_each_image_as_its_processor_expands_it(processor, tmp_path, size, limits):
    """From the image's size alone (after the pixel limits and Qwen's side limits, as LLaMA-Factory's GLM-4.1V plugin
    inherits them), the text the processor writes from its pixels; the batch's grid holds the same count."""
    settings = MediaSettings(**limits)
    path = tmp_path / "image.png"
    Image.new("RGB", size, "teal").save(path)
    plugin = get_mm_plugin("glm4v")
    expanded = plugin.expand_messages([{"role": "user", "content": "<image>Who?"}], [str(path)], [], processor,
                                      settings)
    resized = regularize_image(str(path), settings.image_max_pixels, settings.image_min_pixels, qwen=True)
    own = own_expansion(processor, resized)
    assert expanded[0]["content"] == own + "Who?" and own.count("<|image|>") > 1
    inputs = plugin.batch_inputs([str(path)], [], [[1]], processor, settings)
    assert int(inputs["image_grid_thw"].prod()) // 4 == own.count("<|image|>")


def test_mm_token_type_ids_mark_the_image_tokens_where_the_processor_asks_for_them(processor):
    plugin = get_mm_plugin("glm4v")
    image = processor.tokenizer.convert_tokens_to_ids("<|image|>")
    full = SimpleNamespace(**{**vars(processor), "model_input_names": [*processor.model_input_names,
                                                                      "mm_token_type_ids"]})
    inputs = plugin.batch_inputs([str(DEMO / "1.jpg")], [], [[5, image, image, 7]], full, MediaSettings())
    assert inputs["mm_token_type_ids"] == [[0, 1, 1, 0]]
    assert "mm_token_type_ids" not in plugin.batch_inputs([str(DEMO / "1.jpg")], [], [[5]], processor)


def test_glm_templates_are_reasoning_turns_that_also_stop_at_the_answers_end():
    glm4v, glm4_5v = TEMPLATES["glm4v"], TEMPLATES["glm4_5v"]
    assert glm4v.mm_plugin == glm4_5v.mm_plugin == "glm4v" and glm4v.reasoning and glm4_5v.reasoning
    assert glm4v.stop_words == glm4_5v.stop_words == ("<|user|>", "<|observation|>", "</answer>")
    assert (glm4v.tool_format, glm4_5v.tool_format) == ("glm4", "glm4_moe")
    assert glm4v.slots == TEMPLATES["glmz1"].slots and glm4_5v.slots == TEMPLATES["glm4_moe"].slots
    assert get_mm_plugin("glm4v").video_token is None and "timestamp" in get_mm_plugin("glm4v").unencoded_videos


def test_a_video_dataset_under_glm4v_is_refused_before_the_run_with_the_reason():
    from tuneline.pipeline.preflight import video_template_problem

    problem = video_template_problem("mllm_video_demo", "glm4v")
    assert "'template: glm4v' writes GLM-4.1V's video frames each with the timestamp" in problem
    assert "intern_vl" in problem and "qwen3_vl" in problem  # the templates whose videos are encoded
    assert "LLaMA-Factory's plugin for it has no video token" in video_template_problem("d", "llava")

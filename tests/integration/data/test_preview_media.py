"""`tuneline preview` on image rows shows them as training encodes them: each image as the model's own tokens."""

from __future__ import annotations

import pytest

from tests.support.training import MLLM_DATA, vlm_config


@pytest.mark.parametrize(("preset", "start"), [("paligemma", "<image>" * 32 + "<|bos|>Who are they?"),
                                               ("pixtral", "<|bos|>[INST][IMG][IMG][IMG][IMG][IMG_BREAK]")])
def test_preview_expands_the_images_as_the_build_step_does(tiny_vlm, tmp_path, preset, start):
    from tuneline.data import build_dataset, load_processed, preview

    config = vlm_config(tiny_vlm, tmp_path, preset, dataset="mllm_demo", dataset_dir=str(MLLM_DATA))
    lines = preview(config, n=1).splitlines()
    text = next(line for line in lines if line.startswith("text: "))
    assert text.startswith(f"text: {start}")
    ids = next(line for line in lines if line.startswith("input_ids"))
    built = load_processed(build_dataset(config))["train"][0]["input_ids"]
    assert ids.endswith(f": {built}")

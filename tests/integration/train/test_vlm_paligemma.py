"""sft with images on the tiny PaliGemma: mllm_demo built with each row's images before everything (16 image tokens
each, ahead of the beginning of sequence, never trained on), batched with the token types PaliGemma's attention reads,
trained, the processor saved; under `paligemma` and under Gemma's turns (`paligemma_chat`)."""

from __future__ import annotations

import pytest

from tests.support.training import MLLM_DATA, FirstBatch, assert_pixels_reach_forward, vlm_config


@pytest.mark.parametrize("template", ["paligemma", "paligemma_chat"])
def test_paligemma_trains_with_its_images_before_the_text(tiny_vlm, tmp_path, template):
    from transformers import AutoProcessor

    from tuneline.data import build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer
    from tuneline.train.sft import run

    config = vlm_config(tiny_vlm, tmp_path, "paligemma", dataset="mllm_demo", dataset_dir=str(MLLM_DATA), val_size=2,
                        template=template)
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    tokenizer = load_tokenizer(config.model)
    image, bos = tokenizer.convert_tokens_to_ids("<image>"), tokenizer.bos_token_id
    for row in train:
        count = 16 * len(row["images"])
        assert row["input_ids"][:count + 1] == [image] * count + [bos] and row["input_ids"].count(image) == count
        assert row["labels"][:count + 1] == [-100] * (count + 1)

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    types, ids = batch["token_type_ids"], batch["input_ids"]
    assert types.shape == ids.shape and int((types == 0)[batch["attention_mask"] == 1].sum()) == int((ids == image).sum())
    assert batch["pixel_values"].shape[0] * 16 == int((ids == image).sum()) > 0
    assert result["global_step"] == 2
    out = tmp_path / "out"
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        assert AutoProcessor.from_pretrained(folder).image_seq_length == 16, folder

    assert_pixels_reach_forward(config, tokenizer, dataset_media(config, tokenizer, [train]), [train[0], train[1]], out)

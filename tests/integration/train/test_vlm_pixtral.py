"""sft with images on the tiny Pixtral (LLaVA with a Pixtral vision tower): mllm_demo expanded at build time into each
image's own grid of `[IMG]` rows, batched with each image at its own size, trained, the processor saved.

Without torchvision (here) transformers builds no PixtralProcessor: the run uses its image half
(`tuneline.model.pixtral_processor`), and its folders keep the model's processor files."""

from __future__ import annotations

from tests.support.training import MLLM_DATA, FirstBatch, assert_pixels_reach_forward, vlm_config


def sft_config(tiny_vlm, tmp_path, **keys):
    return vlm_config(tiny_vlm, tmp_path, "pixtral", **{"dataset": "mllm_demo", "dataset_dir": str(MLLM_DATA),
                                                        "val_size": 2, **keys})


def test_pixtral_trains_on_each_image_at_its_own_size(tiny_vlm, tmp_path):
    import json

    from transformers import AutoImageProcessor

    from tuneline.data import build_dataset, load_processed
    from tuneline.data.mm.requirements import torchvision_works
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path)
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    tokenizer = load_tokenizer(config.model)
    media = dataset_media(config, tokenizer, [train])
    if not torchvision_works():
        assert type(media.processor).__name__ == "PixtralImageOnlyProcessor"
    image, end = (tokenizer.convert_tokens_to_ids(token) for token in ("[IMG]", "[IMG_END]"))
    assert all(row["input_ids"].count(end) == len(row["images"]) for row in train)
    assert tokenizer.decode(train[0]["input_ids"]).startswith(tokenizer.bos_token + "[INST][IMG]")

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    patches = (batch["image_sizes"] // media.processor.patch_size).prod(-1)
    assert int((batch["input_ids"] == image).sum()) == int(patches.sum()) > 0  # one token per patch of each image
    assert batch["pixel_values"].shape[0] == batch["image_sizes"].shape[0] >= 2
    assert result["global_step"] == 2

    out = tmp_path / "out"
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        saved = json.loads((folder / "processor_config.json").read_text())
        assert saved["processor_class"] == "PixtralProcessor" and saved["patch_size"] == media.processor.patch_size
        assert type(AutoImageProcessor.from_pretrained(folder)).__name__.startswith("PixtralImageProcessor")
    assert_pixels_reach_forward(config, tokenizer, media, [train[0], train[1]], out)

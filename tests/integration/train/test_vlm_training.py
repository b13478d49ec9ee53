"""sft with images on the tiny vision-language models: LLaMA-Factory's mllm_demo built, batched with pixels and
trained through the training child's own path, the processor saved, the held-out rows scored with their images."""

from __future__ import annotations

import pytest

from tests.support.training import MLLM_DATA, MM_DATA, FirstBatch, assert_pixels_reach_forward, vlm_config
from tuneline.errors import ConfigError


def sft_config(tiny_vlm, tmp_path, preset: str, **keys):
    return vlm_config(tiny_vlm, tmp_path, preset, **{"dataset": "mllm_demo", "dataset_dir": str(MLLM_DATA),
                                                     "val_size": 2, **keys})


def built_with_image_half(tiny_vlm, tmp_path, preset: str):
    """(config, dataset reference, tokenizer, train rows, media) of a preset whose processor needs torchvision: where
    it does not load (here), the media hold the image half of its processor."""
    from tuneline.data import build_dataset, load_processed
    from tuneline.data.mm.requirements import torchvision_works
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer

    config = sft_config(tiny_vlm, tmp_path, preset)
    ref = build_dataset(config)
    tokenizer = load_tokenizer(config.model)
    train = load_processed(ref)["train"]
    media = dataset_media(config, tokenizer, [train])
    if not torchvision_works():
        assert type(media.processor).__name__ == "ImageOnlyProcessor"
    return config, ref, tokenizer, train, media


@pytest.mark.parametrize("preset", ["gemma3", "llava"])
def test_sft_trains_on_the_images_and_saves_the_processor(tiny_vlm, tmp_path, preset):
    from tuneline.data import build_dataset, load_processed
    from tuneline.evaluation.run import run_evaluation
    from tuneline.model.processor import load_processor
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path, preset)
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    processor = load_processor(config)
    image_token = processor.tokenizer.convert_tokens_to_ids(
        processor.image_token if preset == "llava" else "<image_soft_token>")
    row = train[0]
    per_image = train[0]["input_ids"].count(image_token) // len(row["images"])
    assert per_image > 1 and all(path.endswith(".jpg") for path in row["images"])  # expanded at build time

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    images = sum(len(train[i]["images"]) for i in range(len(train)))
    assert batch["pixel_values"].shape[0] == sum(
        (batch["input_ids"] == image_token).sum(-1).tolist()) // per_image <= images
    if preset == "gemma3":  # the soft tokens attend to each other both ways: marked, padded as the ids
        assert batch["token_type_ids"].shape == batch["input_ids"].shape
        assert batch["token_type_ids"].sum() == (batch["input_ids"] == image_token).sum()
    out = tmp_path / "out"
    assert result["global_step"] == 2
    from transformers import AutoProcessor

    from tuneline.data.jinja_template import chat_template
    from tuneline.data.template_catalog import run_template

    trained = chat_template(run_template(config.data, processor.tokenizer), processor.tokenizer, config.data.tool_date)
    assert processor.chat_template != trained  # the base's own, which training did not speak
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        assert (folder / "processor_config.json").is_file(), folder
        saved = AutoProcessor.from_pretrained(folder)  # served as it is: the template training encoded
        assert saved.chat_template == saved.tokenizer.chat_template == trained, folder

    scored = run_evaluation(config, ref, str(out))  # held-out rows scored with their images
    assert scored["num_samples"] == 2 and "eval_loss" in scored["metrics"]

    from transformers import AutoModelForImageTextToText

    from tuneline.export.merge import export_model

    exported = sft_config(tiny_vlm, tmp_path / "export", preset, adapter_name_or_path=str(out),
                          export_dir=str(tmp_path / "merged"))
    merged = export_model(exported)
    assert AutoProcessor.from_pretrained(merged).image_processor is not None  # `tuneline export` keeps the processor
    assert AutoModelForImageTextToText.from_pretrained(merged).config.model_type == preset


def test_the_images_change_what_the_model_computes(tiny_vlm, tmp_path):
    """The pixels the collator adds reach the forward: the loss moves when they are left out."""
    import torch

    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_model, load_tokenizer

    config = sft_config(tiny_vlm, tmp_path, "gemma3")
    train = load_processed(build_dataset(config))["train"]
    tokenizer = load_tokenizer(config.model)
    collator = build_collator("sft", tokenizer, media=dataset_media(config, tokenizer, [train]))
    batch = collator([train[0], train[1]])
    model = load_model(config, tokenizer, is_trainable=False)
    with torch.no_grad():
        seen = model(**batch).loss
        blind = model(**{k: v for k, v in batch.items() if k not in ("pixel_values", "token_type_ids")}).loss
    assert not torch.isclose(seen, blind)


def test_image_rows_need_a_vision_template_and_model(tiny_vlm, tiny_model_dir, tmp_path):
    from tuneline.data import build_dataset
    from tuneline.data.template_catalog import VISION

    with pytest.raises(ConfigError, match="'template: chatml' reads text only") as refused:
        build_dataset(sft_config(tiny_vlm, tmp_path, "gemma3", template="chatml"))
    assert f"({', '.join(VISION)})" in str(refused.value) and "mllama" in VISION  # every vision template built
    text_model = sft_config(tiny_vlm, tmp_path, "gemma3", model_name_or_path=str(tiny_model_dir))
    with pytest.raises(ConfigError, match="text-only model"):
        build_dataset(text_model)
    with pytest.raises(ConfigError, match="'stage: pt' does not train on"):
        build_dataset(sft_config(tiny_vlm, tmp_path, "gemma3", stage="pt"))


def test_pan_and_scan_trains_gemma3_on_each_image_and_its_crops(tiny_vlm, tmp_path):
    """`image_do_pan_and_scan: true`: the batch carries every image and its crops, one begin-of-image each, and
    training steps on them (images grown to 400 x 400 pixels first, so the wide demo images are cut)."""
    from tuneline.data import build_dataset, load_processed
    from tuneline.model.processor import load_processor
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path, "gemma3", image_do_pan_and_scan=True, image_min_pixels=400 * 400,
                        per_device_train_batch_size=4, save_steps=2)
    ref = build_dataset(config)
    assert load_processed(ref)["train"].num_rows == 4
    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch, tokenizer = keeper.batch, load_processor(config).tokenizer
    begins = int((batch["input_ids"] == tokenizer.convert_tokens_to_ids("<start_of_image>")).sum())
    images = sum(len(row["images"]) for row in load_processed(ref)["train"])
    assert batch["pixel_values"].shape[0] == begins > images  # the 4 rows' images, then their crops
    assert batch["token_type_ids"].sum() == (batch["input_ids"] == tokenizer.convert_tokens_to_ids(
        "<image_soft_token>")).sum()
    assert result["global_step"] == 2


@pytest.mark.parametrize("preset", ["qwen2_vl", "qwen3_vl"])
def test_qwen_vl_trains_on_images_with_the_image_half_of_its_processor(tiny_vlm, tmp_path, preset):
    """Without torchvision (here) a Qwen-VL processor cannot be built, but image rows need only its image processor
    and tokenizer: the pads equal the grids' merged patches, the pixels reach the forward, the run trains, and its
    folders (checkpoints, output, export) hold processor files that load again."""
    from transformers import AutoImageProcessor

    from tuneline.export.merge import export_model
    from tuneline.train.sft import run

    config, ref, tokenizer, train, media = built_with_image_half(tiny_vlm, tmp_path, preset)
    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = media.processor.image_processor.merge_size ** 2
    pads = int((batch["input_ids"] == pad).sum())
    assert pads == int(batch["image_grid_thw"].prod(-1).sum()) // merge > 0
    assert int((batch["mm_token_type_ids"] == 1).sum()) == pads
    assert result["global_step"] == 2

    out = tmp_path / "out"
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        assert AutoImageProcessor.from_pretrained(folder).merge_size ** 2 == merge, folder
    assert_pixels_reach_forward(config, tokenizer, media, [train[0], train[1]], out)
    merged = export_model(sft_config(tiny_vlm, tmp_path / "export", preset, adapter_name_or_path=str(out),
                                     export_dir=str(tmp_path / "merged")))
    assert (merged / "processor_config.json").is_file() and AutoImageProcessor.from_pretrained(merged)


def test_llava_next_trains_on_each_image_at_its_own_grid(tiny_vlm, tmp_path):
    """LLaVA-NeXT's image tokens depend on each image's shape (the grid that fits it best, its letterbox cut away):
    the rows are expanded at build time, from sizes alone, to the counts the processor itself writes from pixels, the batch holds every image's
    tiles and size, the pixels reach the forward, and the run trains and saves its processor."""
    from PIL import Image

    from tuneline.data import build_dataset, load_processed
    from tuneline.model import load_tokenizer
    from tuneline.model.processor import load_processor
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path, "llava_next")
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    processor = load_processor(config)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    for row in train:  # the processor's own expansion of the same images, image by image
        own = [processor(text="<image>", images=[Image.open(path).convert("RGB")])["input_ids"][0].count(image_token)
               for path in row["images"]]
        assert row["input_ids"].count(image_token) == sum(own)
    assert min(row["input_ids"].count(image_token) // len(row["images"]) for row in train) > 16  # base view's 16

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    assert batch["pixel_values"].shape[0] == batch["image_sizes"].shape[0] >= 2
    assert batch["pixel_values"].shape[2:] == (3, 32, 32)  # 32-pixel tiles: the base view, then the grid's
    assert result["global_step"] == 2 and (tmp_path / "out" / "processor_config.json").is_file()

    assert_pixels_reach_the_forward(config, load_tokenizer(config.model), train, tmp_path / "out")


def assert_pixels_reach_the_forward(config, tokenizer, train, adapters) -> None:
    """The trained model's loss on the first two rows moves when the collator's pixels are zeroed."""
    from tuneline.data.mm.run_media import dataset_media

    assert_pixels_reach_forward(config, tokenizer, dataset_media(config, tokenizer, [train]), [train[0], train[1]],
                                adapters)


def test_llava_next_on_qwen_turns_expands_the_same_images(tiny_vlm, tmp_path):
    """`template: llava_next_qwen`: Qwen's ChatML turns around the same any-resolution image tokens."""
    from tuneline.data import build_dataset, load_processed
    from tuneline.model import load_tokenizer

    rows = {}
    for template in ("llava_next", "llava_next_qwen"):
        config = sft_config(tiny_vlm, tmp_path / template, "llava_next", template=template)
        rows[template] = load_processed(build_dataset(config))["train"]
    tokenizer = load_tokenizer(config.model)
    image = tokenizer.convert_tokens_to_ids("<image>")
    assert [r["input_ids"].count(image) for r in rows["llava_next"]] == [
        r["input_ids"].count(image) for r in rows["llava_next_qwen"]]
    text = tokenizer.decode(rows["llava_next_qwen"][0]["input_ids"])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<image>")


def test_minicpm_v_4_6_trains_on_overviews_and_slices_with_the_image_half_of_its_processor(tiny_vlm, tmp_path):
    """MiniCPM-V 4.6 (its processor needs torchvision: the image half here): every row is expanded at build time to
    one pad per 16 patches of its image's overview and slices, the batch packs all of them with their grids and the
    downsample mode, the pixels reach the forward, and the run trains, freezing the tower and merger as
    LLaMA-Factory does, and saves processor files that load again."""
    import json

    from transformers import AutoImageProcessor

    from tuneline.train.sft import run

    config, ref, tokenizer, train, media = built_with_image_half(tiny_vlm, tmp_path, "minicpm_v_4_6")
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for row in train:
        views = media.processor.image_processor(row["images"], return_tensors="pt")["target_sizes"]
        assert row["input_ids"].count(pad) == int(views.prod(-1).sum()) // 16
        assert row["input_ids"].count(tokenizer.convert_tokens_to_ids("<slice>")) > 0

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    assert int((batch["input_ids"] == pad).sum()) == int(batch["target_sizes"].prod(-1).sum()) // 16 > 0
    assert batch["pixel_values"].shape[:3] == (1, 3, 8) and batch["downsample_mode"] == "16x"
    assert result["global_step"] == 2
    out = tmp_path / "out"
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        assert AutoImageProcessor.from_pretrained(folder).scale_resolution == 64, folder

    adapted = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert adapted and all(name.startswith("model.language_model.") for name in adapted)  # tower and merger frozen
    assert_pixels_reach_forward(config, tokenizer, media, [train[0], train[1]], out)


def test_mllama_trains_reading_its_images_through_cross_attention(tiny_vlm, tmp_path):
    """Llama 3.2 Vision: one <|image|> per image in the rows; the batch holds each row's images as tiles with
    their aspect ratios, and the cross-attention mask padded as the ids; the pixels reach the forward; the run
    trains, saves its processor, scores the held-out rows with their images and exports."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tuneline.data import build_dataset, load_processed
    from tuneline.evaluation.run import run_evaluation
    from tuneline.export.merge import export_model
    from tuneline.model import load_tokenizer
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path, "mllama")
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    tokenizer = load_tokenizer(config.model)
    image = tokenizer.convert_tokens_to_ids("<|image|>")
    assert all(row["input_ids"].count(image) == len(row["images"]) for row in train)

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    rows, length = batch["input_ids"].shape
    most = int((batch["input_ids"] == image).sum(-1).max())
    assert batch["cross_attention_mask"].shape == (rows, length, most, 4)
    assert batch["pixel_values"].shape == (rows, most, 4, 3, 32, 32) and batch["aspect_ratio_ids"].shape == (rows, most)
    for ids, mask in zip(batch["input_ids"].tolist(), batch["cross_attention_mask"], strict=True):
        first = ids.index(image)  # the text before a row's first image sees none, from it on the image's tiles
        assert not mask[:first].any() and mask[first, 0].all()
    assert result["global_step"] == 2 and (tmp_path / "out" / "processor_config.json").is_file()

    assert_pixels_reach_the_forward(config, tokenizer, train, tmp_path / "out")

    scored = run_evaluation(config, ref, str(tmp_path / "out"))
    assert scored["num_samples"] == 2 and "eval_loss" in scored["metrics"]
    merged = export_model(sft_config(tiny_vlm, tmp_path / "export", "mllama", adapter_name_or_path=str(tmp_path / "out"),
                                     export_dir=str(tmp_path / "merged")))
    assert AutoProcessor.from_pretrained(merged).image_processor.max_image_tiles == 4
    assert AutoModelForImageTextToText.from_pretrained(merged).config.model_type == "mllama"


@pytest.mark.parametrize("crop_to_patches", [False, True])
def test_intern_vl_trains_on_each_images_tiles(tiny_vlm, tmp_path, crop_to_patches):
    """InternVL's processor needs torchvision (its video processor), its image half does not: each image is expanded
    at build time to 4 context tokens per tile (one tile, or with `crop_to_patches` its grid and a thumbnail), the
    batch holds every tile, the pixels reach the forward, and the run trains and saves processor files that load."""
    import json

    from tuneline.data import build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path, "intern_vl", crop_to_patches=crop_to_patches)
    ref = build_dataset(config)
    tokenizer = load_tokenizer(config.model)
    train = load_processed(ref)["train"]
    media = dataset_media(config, tokenizer, [train])
    context = tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    per_image = [row["input_ids"].count(context) / len(row["images"]) for row in train]
    assert (max(per_image) > 4) == crop_to_patches and min(per_image) >= 4
    assert sum(row["input_ids"].count(tokenizer.convert_tokens_to_ids("<img>")) for row in train) == sum(
        len(row["images"]) for row in train)

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    assert batch["pixel_values"].shape[0] * 4 == int((batch["input_ids"] == context).sum())
    assert batch["pixel_values"].shape[1:] == (3, 32, 32) and result["global_step"] == 2
    out = tmp_path / "out"
    for folder in (out, out / "checkpoint-2"):
        assert json.loads((folder / "processor_config.json").read_text())["image_seq_length"] == 4, folder

    assert_pixels_reach_forward(config, tokenizer, media, [train[0], train[1]], out)


def test_intern_vl_trains_on_videos_without_torchvision(tiny_vlm, tmp_path):
    """InternVL's frames go through its image processor, not a video processor: LLaMA-Factory's video demo trains
    here, where torchvision does not load, each sampled frame a `FrameN: <img>...</img>` line of 4 context tokens
    whose pixels reach the forward."""

    from tuneline.data import build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer
    from tuneline.train.sft import run

    config = vlm_config(tiny_vlm, tmp_path, "intern_vl", dataset="mllm_video_demo", dataset_dir=str(MM_DATA),
                        video_fps=1.0, video_maxlen=3)
    ref = build_dataset(config)
    tokenizer = load_tokenizer(config.model)
    train = load_processed(ref)["train"]
    assert [tokenizer.decode(row["input_ids"]).count("Frame") for row in train] == [3, 3, 3]
    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    context = tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    batch = keeper.batch
    assert batch["pixel_values"].shape == (2 * 3, 3, 32, 32) and int((batch["input_ids"] == context).sum()) == 24
    assert result["global_step"] == 2

    assert_pixels_reach_forward(config, tokenizer, dataset_media(config, tokenizer, [train]), [train[0]],
                                tmp_path / "out")


@pytest.mark.parametrize("preset", ["glm4v", "glm4_5v"])
def test_glm4v_trains_on_images_with_the_image_half_of_its_processor(tiny_vlm, tmp_path, preset):
    """GLM-4.1V's processor needs torchvision (its video processor), its image half does not: each image is one
    <|image|> per merged block of its grid between begin and end of image, marked in `mm_token_type_ids` for the
    multimodal rotary positions; the pixels reach the forward (GLM-4.5V's mixture of experts too), and the run
    trains and saves processor files that load."""
    from transformers import AutoImageProcessor

    from tuneline.data import build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer
    from tuneline.train.sft import run

    config = sft_config(tiny_vlm, tmp_path, preset)
    ref = build_dataset(config)
    tokenizer = load_tokenizer(config.model)
    train = load_processed(ref)["train"]
    media = dataset_media(config, tokenizer, [train])
    text = tokenizer.decode(train[0]["input_ids"])
    assert text.startswith("[gMASK]<sop><|user|>\n<|begin_of_image|><|image|>")
    # an empty thought is trained on before the answer slot's newline, as LLaMA-Factory puts it
    assert "<|end_of_image|>" in text and "<|assistant|><think>\n\n</think>\n\n\nThey" in text

    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    image = tokenizer.convert_tokens_to_ids("<|image|>")
    pads = int((batch["input_ids"] == image).sum())
    assert pads == int(batch["image_grid_thw"].prod(-1).sum()) // 4 > 0
    assert int((batch["mm_token_type_ids"] == 1).sum()) == pads and result["global_step"] == 2
    out = tmp_path / "out"
    for folder in (out, out / "checkpoint-2"):
        assert AutoImageProcessor.from_pretrained(folder).merge_size == 2, folder

    assert_pixels_reach_forward(config, tokenizer, media, [train[0], train[1]], out)

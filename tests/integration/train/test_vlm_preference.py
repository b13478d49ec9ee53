"""dpo, kto and rm with images on the tiny vision-language models: rlhf_v pairs built with each sequence's image tokens,
batched with the pixels of both halves, the reference precomputed with the images, trained, and the held-out pairs
scored with their images; rm on the same pairs, scored by the family's sequence classifier with the images."""

from __future__ import annotations

import pytest

from tests.support.training import (
    MM_DATA,
    FirstBatch,
    kto_image_data,
    make_config,
    scores_with_and_without_pixels,
    vlm_config,
)


def pref_config(tiny_vlm, tmp_path, preset: str, **keys):
    return vlm_config(tiny_vlm, tmp_path, preset, **{"stage": "dpo", "dataset": "rlhf_v", "dataset_dir": str(MM_DATA),
                                                     "val_size": 1, "pref_beta": 0.1, **keys})


IMAGE_TOKENS = {"gemma3": "<image_soft_token>", "pixtral": "[IMG]", "intern_vl": "<IMG_CONTEXT>"}  # the others': the processor's image_token


def image_token_id(config, preset: str) -> int:
    from tuneline.model.processor import load_processor

    processor = load_processor(config)
    return processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKENS.get(preset) or processor.image_token)


def blanked(dataset):
    """The split with every image replaced by a black one of the same size: same tokens, other pixels."""
    from PIL import Image

    def blank(row):
        paths = []
        for path in row["images"]:
            out = f"{path}.black.png"
            with Image.open(path) as image:
                Image.new("RGB", image.size).save(out)
            paths.append(out)
        return {"images": paths}

    return dataset.map(blank)


@pytest.mark.parametrize("preset", ["gemma3", "llava", "llava_next", "pixtral", "paligemma", "intern_vl"])
def test_dpo_trains_on_the_images_with_a_reference_precomputed_from_them(tiny_vlm, tmp_path, preset):
    import math
    import shutil

    from tuneline.data import build_dataset, load_processed
    from tuneline.evaluation.run import run_evaluation
    from tuneline.objectives.logps import MEDIA_INPUTS
    from tuneline.reference import build_reference_logps
    from tuneline.reference.compute import compute_rows

    data = tmp_path / "data"  # a copy: the test writes blanked images beside the demo's
    shutil.copytree(MM_DATA, data)
    config = pref_config(tiny_vlm, tmp_path, preset, dataset_dir=str(data))
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    token = image_token_id(config, preset)
    for row in train:  # both sequences carry the expanded image tokens of the row's images
        count = row["chosen_input_ids"].count(token)
        assert count > len(row["images"]) and count == row["rejected_input_ids"].count(token)

    reference = build_reference_logps(config, ref)
    assert reference["needed"] and reference["computed_rows"] == 4  # three pairs to train on, one held out
    stored = load_processed(reference["path"])["train"]
    rows = {"train": list(range(len(train)))}
    seen = compute_rows(config, {"train": train}, rows)[0]["train"]
    blind = compute_rows(config, {"train": blanked(train)}, rows)[0]["train"]
    assert [v for r in stored for v in (r["ref_chosen_logps"], r["ref_rejected_logps"])] == pytest.approx(
        [v for pair in seen for v in pair])
    assert all(not math.isclose(a, b, rel_tol=1e-6) for pair, other in zip(seen, blind, strict=True)
               for a, b in zip(pair, other, strict=True)), "the pixels reach the reference's forward"

    from tuneline.train.dpo import run

    keeper = FirstBatch()
    result = run(config, reference, [keeper])
    batch = keeper.batch
    media = batch[MEDIA_INPUTS]
    rows_in_batch = batch["chosen_input_ids"].shape[0]
    images = (batch["chosen_input_ids"] == token).sum() + (batch["rejected_input_ids"] == token).sum()
    per_image = train[0]["chosen_input_ids"].count(token) // len(train[0]["images"])
    assert media["pixel_values"].shape[0] == int(images) // per_image >= 2 * rows_in_batch  # both halves' images
    if preset == "gemma3":  # one token-type row per sequence of [chosen; rejected]
        assert media["token_type_ids"].shape == (2 * rows_in_batch, batch["chosen_input_ids"].shape[1])
        assert media["token_type_ids"].sum() == images
    assert result["global_step"] == 2
    logged = [entry for entry in result["metrics"].items() if entry[0].endswith("loss")]
    assert logged and all(math.isfinite(value) for _, value in logged)
    assert (tmp_path / "out" / "processor_config.json").is_file()
    from safetensors import safe_open

    with safe_open(tmp_path / "out" / "adapter_model.safetensors", "pt") as adapter:  # freeze defaults: text only
        names = list(adapter.keys())
    assert names and not any("vision" in name or "multi_modal_projector" in name for name in names)

    scored = run_evaluation(config, ref, str(tmp_path / "out"))  # held-out pairs scored with their images
    assert scored["num_samples"] == 1 and {"reward_accuracy", "reward_margin"} <= set(scored["metrics"])


def test_the_live_reference_and_the_policy_see_the_images_of_both_halves(tiny_vlm, tmp_path):
    """pair_logps over the collated batch differs when the pixels are blanked (token types kept): they reach the
    forward of both halves; the precompute, batching sequences its own way, computes the same log-probs."""
    import torch

    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_model, load_tokenizer
    from tuneline.objectives.logps import MEDIA_INPUTS, pair_logps

    config = pref_config(tiny_vlm, tmp_path, "gemma3", val_size=0)
    train = load_processed(build_dataset(config))["train"]
    tokenizer = load_tokenizer(config.model)
    collator = build_collator("dpo", tokenizer, media=dataset_media(config, tokenizer, [train]))
    batch = collator([train[0], train[1]])
    model = load_model(config, tokenizer, is_trainable=False)
    with torch.no_grad():
        seen = pair_logps(model, batch)
        media = batch[MEDIA_INPUTS]
        blind = pair_logps(model, {**batch, MEDIA_INPUTS: {**media, "pixel_values": media["pixel_values"] * 0}})
    assert not torch.allclose(seen[0], blind[0]) and not torch.allclose(seen[1], blind[1])

    from tuneline.reference.compute import compute_rows  # the precompute's own batches give the same numbers

    precomputed = compute_rows(config, {"train": train}, {"train": [0, 1]})[0]["train"]
    assert torch.allclose(torch.tensor(precomputed), torch.stack(seen[:2], -1), rtol=1e-4)


def test_kto_trains_on_the_images_of_its_own_and_its_mismatched_completions(tiny_vlm, tmp_path):
    import math

    from tuneline.data import build_dataset, load_processed
    from tuneline.objectives.logps import MEDIA_INPUTS
    from tuneline.reference import build_reference_logps
    from tuneline.train.kto import run

    data = kto_image_data(tmp_path / "data")
    config = pref_config(tiny_vlm, tmp_path, "gemma3", stage="kto", dataset="kto_images", dataset_dir=str(data),
                         val_size=0)
    ref = build_dataset(config)
    reference = build_reference_logps(config, ref)
    keeper = FirstBatch()
    result = run(config, reference, [keeper])
    batch = keeper.batch
    first = load_processed(ref)["train"][0]
    token = image_token_id(config, "gemma3")
    per_image = first["input_ids"].count(token) // len(first["images"])
    for prefix in ("", "kl_"):  # each forward with the row's images and its own token types
        media, ids = batch[f"{prefix}{MEDIA_INPUTS}"], batch[f"{prefix}input_ids"]
        assert media["token_type_ids"].shape == ids.shape and media["token_type_ids"].sum() == (ids == token).sum()
        assert media["pixel_values"].shape[0] * per_image == (ids == token).sum() > 0
    assert result["global_step"] == 2
    assert all(math.isfinite(v) for k, v in result["metrics"].items() if k.endswith("loss"))


@pytest.mark.parametrize("preset", ["gemma3", "llava", "llava_next", "pixtral", "paligemma", "intern_vl"])
def test_rm_scores_each_pair_with_its_images_and_exports_a_scorer_that_reloads(tiny_vlm, tmp_path, preset):
    """The reward model is the family's sequence classifier over the whole image-text backbone (transformers' own for
    gemma3, ours for llava): its batches carry both halves' pixels, the pixels change the scores, the held-out
    pairs are scored with their images, and the exported model reloads to the same scores."""
    import math

    import torch

    from tuneline.data import build_dataset, load_processed
    from tuneline.evaluation.run import run_evaluation
    from tuneline.export.merge import export_model
    from tuneline.model import load_model, load_tokenizer
    from tuneline.objectives.logps import MEDIA_INPUTS
    from tuneline.train.rm import pair_scores, run

    config = pref_config(tiny_vlm, tmp_path, preset, stage="rm")
    ref = build_dataset(config)
    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    token = image_token_id(config, preset)
    images = (batch["chosen_input_ids"] == token).sum() + (batch["rejected_input_ids"] == token).sum()
    per_image = (batch["chosen_input_ids"][0] == token).sum()
    assert batch[MEDIA_INPUTS]["pixel_values"].shape[0] == images // per_image == 2 * len(batch["chosen_input_ids"])
    assert result["global_step"] == 2 and math.isfinite(result["metrics"]["train_loss"])
    out = tmp_path / "out"
    assert (out / "processor_config.json").is_file()

    tokenizer = load_tokenizer(config.model)
    trained = load_model(config, tokenizer, is_trainable=False, add_valuehead=True, adapters=str(out))
    family = {"gemma3": "Gemma3", "llava": "Llava", "llava_next": "LlavaNext", "pixtral": "Llava",
              "paligemma": "PaliGemma", "intern_vl": "InternVL"}[preset]
    assert type(trained).__name__ == f"{family}ForSequenceClassification"
    train = load_processed(ref)["train"]
    pairs, seen, blind = scores_with_and_without_pixels(trained, config, tokenizer, train)
    assert not torch.allclose(seen, blind), "the pixels reach the reward model's forward"

    scored = run_evaluation(config, ref, str(out))  # the held-out pair, scored with its image
    assert scored["num_samples"] == 1 and {"reward_accuracy", "reward_margin"} <= set(scored["metrics"])

    from dataclasses import replace

    exported = export_model(replace(config, model=replace(config.model, adapter_name_or_path=str(out),
                                                          export_dir=str(tmp_path / "merged"))))
    merged = load_model(make_config(exported, tmp_path / "again", stage="rm", template=preset), tokenizer,
                        is_trainable=False, add_valuehead=True)
    with torch.no_grad():
        assert torch.allclose(torch.cat(pair_scores(merged, pairs)), seen, atol=1e-4)


def test_an_edited_image_recomputes_the_reference_of_the_rows_that_name_it(tiny_vlm, tmp_path):
    """The reference's per-row store is keyed by the images' content too: the same tokens with another picture at the
    same path are computed again, the rows without it are reused."""
    import shutil

    from tuneline.data import build_dataset, load_processed
    from tuneline.reference import build_reference_logps

    data = tmp_path / "data"
    shutil.copytree(MM_DATA, data)
    config = pref_config(tiny_vlm, tmp_path, "gemma3", dataset_dir=str(data), val_size=0, max_steps=-1,
                         num_train_epochs=1)
    first = build_reference_logps(config, build_dataset(config))
    assert first["computed_rows"] == 4
    shutil.copy(data / "mllm_demo_data" / "3.jpg", data / "mllm_demo_data" / "1.jpg")
    second = build_reference_logps(config, build_dataset(config))
    naming = [i for i, row in enumerate(load_processed(second["path"])["train"])
              if any(path.endswith("/1.jpg") for path in row["images"])]
    assert second["computed_rows"] == len(naming) == 2  # of four rows, two show 1.jpg
    before, after = (load_processed(ref["path"])["train"]["ref_chosen_logps"] for ref in (first, second))
    assert [i for i in range(4) if before[i] != after[i]] == naming


def test_minicpm_v_4_6_trains_dpo_and_rm_on_both_halves_images(tiny_vlm, tmp_path):
    """MiniCPM-V 4.6 packs every image of a batch into one row of patches: for [chosen; rejected] that is each row's
    images twice, one pad per 16 patches of their views; the reference and the reward model read the pixels."""
    import math
    import shutil

    import torch

    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_model, load_tokenizer
    from tuneline.objectives.logps import MEDIA_INPUTS
    from tuneline.reference import build_reference_logps
    from tuneline.reference.compute import compute_rows
    from tuneline.train import dpo, rm

    data = shutil.copytree(MM_DATA, tmp_path / "data")  # a copy: blanked images are written beside the demo's
    config = pref_config(tiny_vlm, tmp_path / "dpo", "minicpm_v_4_6", dataset_dir=str(data))
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    rows = {"train": list(range(len(train)))}
    seen = compute_rows(config, {"train": train}, rows)[0]["train"]
    blind = compute_rows(config, {"train": blanked(train)}, rows)[0]["train"]
    assert all(not math.isclose(a, b, rel_tol=1e-6) for pair, other in zip(seen, blind, strict=True)
               for a, b in zip(pair, other, strict=True)), "the pixels reach the reference's forward"
    keeper = FirstBatch()
    assert dpo.run(config, build_reference_logps(config, ref), [keeper])["global_step"] == 2
    tokenizer = load_tokenizer(config.model)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    batch = keeper.batch
    media = batch[MEDIA_INPUTS]
    pads = int((batch["chosen_input_ids"] == pad).sum() + (batch["rejected_input_ids"] == pad).sum())
    assert pads == int(media["target_sizes"].prod(-1).sum()) // 16 > 0 and media["pixel_values"].shape[0] == 1

    config = pref_config(tiny_vlm, tmp_path / "rm", "minicpm_v_4_6", stage="rm")
    ref = build_dataset(config)
    result = rm.run(config, ref, [])
    assert result["global_step"] == 2 and math.isfinite(result["metrics"]["train_loss"])
    scorer = load_model(config, tokenizer, is_trainable=False, add_valuehead=True, adapters=str(tmp_path / "rm" / "out"))
    train = load_processed(ref)["train"]
    pairs = build_collator("rm", tokenizer, media=dataset_media(config, tokenizer, [train]))([train[0], train[1]])
    media = pairs[MEDIA_INPUTS]
    with torch.no_grad():
        scores = torch.cat(rm.pair_scores(scorer, pairs))
        blind = torch.cat(rm.pair_scores(scorer, {**pairs, MEDIA_INPUTS: {**media, "pixel_values": 0 * media[
            "pixel_values"]}}))
    assert not torch.allclose(scores, blind), "the pixels reach the reward model's forward"


@pytest.mark.parametrize("stage", ["dpo", "rm"])
def test_glm4v_pairs_carry_both_halves_grids_and_token_types(tiny_vlm, tmp_path, stage):
    """GLM-4.1V's images are grids of merged patches, and its rotary positions need `mm_token_type_ids`: a pair's
    batch holds both halves' grids and one token-type row per sequence of [chosen; rejected], and dpo (its reference
    precomputed with the images) and rm (GLM-4.1V's sequence classifier) train on them."""
    from tuneline.data import build_dataset
    from tuneline.objectives.logps import MEDIA_INPUTS

    config = pref_config(tiny_vlm, tmp_path, "glm4v", stage=stage)
    ref = build_dataset(config)
    if stage == "dpo":
        from tuneline.reference import build_reference_logps
        from tuneline.train.dpo import run

        ref = build_reference_logps(config, ref)
    else:
        from tuneline.train.rm import run
    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    media, rows = batch[MEDIA_INPUTS], batch["chosen_input_ids"].shape[0]
    assert media["image_grid_thw"].shape[0] == 2 * rows  # one image a row, in each half
    assert media["mm_token_type_ids"].shape == (2 * rows, batch["chosen_input_ids"].shape[1])
    assert int(media["mm_token_type_ids"].sum()) == int(media["image_grid_thw"].prod(-1).sum()) // 4
    assert result["global_step"] == 2

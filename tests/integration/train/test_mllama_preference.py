"""dpo, kto and rm on the tiny Llama 3.2 Vision: both halves of a pair (and kto's mismatched completion) carry their
row's images with a cross-attention mask as long as their own padded ids, the pixels reach the reference's, the
policy's and the reward model's forward, and the runs train."""

from __future__ import annotations

import math
import shutil

import torch

from tests.support.training import MM_DATA, FirstBatch, kto_image_data, scores_with_and_without_pixels, vlm_config
from tuneline.objectives.logps import MEDIA_INPUTS


def pref_config(tiny_vlm, tmp_path, **keys):
    return vlm_config(tiny_vlm, tmp_path, "mllama", **{"stage": "dpo", "dataset": "rlhf_v",
                                                       "dataset_dir": str(MM_DATA), "pref_beta": 0.1, **keys})


def image_id(config) -> int:
    from tuneline.model import load_tokenizer

    return load_tokenizer(config.model).convert_tokens_to_ids("<|image|>")


def assert_masked_as_its_ids(media: dict, ids: torch.Tensor, image: int) -> None:
    """One mask row per sequence, as long as the ids; the text from a sequence's first image on sees its tiles."""
    mask = media["cross_attention_mask"]
    assert mask.shape[:2] == ids.shape and media["pixel_values"].shape[0] == ids.shape[0]
    for row, sequence in zip(mask, ids.tolist(), strict=True):
        first = sequence.index(image)
        assert not row[:first].any() and row[first, 0].all()


def test_dpo_trains_with_each_halfs_images_and_a_reference_that_sees_them(tiny_vlm, tmp_path):
    from tuneline.data import build_dataset, load_processed
    from tuneline.reference import build_reference_logps
    from tuneline.reference.compute import compute_rows
    from tuneline.train.dpo import run

    config = pref_config(tiny_vlm, tmp_path, val_size=1)
    ref = build_dataset(config)
    train = load_processed(ref)["train"]
    image = image_id(config)
    assert all(row["chosen_input_ids"].count(image) == row["rejected_input_ids"].count(image) == len(row["images"])
               for row in train)
    reference = build_reference_logps(config, ref)
    stored = load_processed(reference["path"])["train"]
    rows = {"train": list(range(len(train)))}
    black = tmp_path / "black.png"
    from PIL import Image

    Image.new("RGB", (64, 64)).save(black)
    blind = compute_rows(config, {"train": train.map(lambda r: {"images": [str(black)] * len(r["images"])})},
                         rows)[0]["train"]
    assert all(not math.isclose(row["ref_chosen_logps"], pair[0], rel_tol=1e-6)
               for row, pair in zip(stored, blind, strict=True)), "the pixels reach the reference's forward"

    keeper = FirstBatch()
    result = run(config, reference, [keeper])
    batch = keeper.batch
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])  # the one forward's sequences
    assert_masked_as_its_ids(batch[MEDIA_INPUTS], ids, image)
    assert result["global_step"] == 2
    assert all(math.isfinite(v) for k, v in result["metrics"].items() if k.endswith("loss"))


def test_kto_gives_the_mismatched_completion_its_own_mask(tiny_vlm, tmp_path):
    from tuneline.data import build_dataset
    from tuneline.reference import build_reference_logps
    from tuneline.train.kto import run

    data = kto_image_data(tmp_path / "data")
    config = pref_config(tiny_vlm, tmp_path, stage="kto", dataset="kto_images", dataset_dir=str(data), val_size=0)
    ref = build_dataset(config)
    keeper = FirstBatch()
    result = run(config, build_reference_logps(config, ref), [keeper])
    for prefix in ("", "kl_"):
        assert_masked_as_its_ids(keeper.batch[f"{prefix}{MEDIA_INPUTS}"], keeper.batch[f"{prefix}input_ids"],
                                 image_id(config))
    assert result["global_step"] == 2


def test_rm_scores_pairs_with_their_images(tiny_vlm, tmp_path):
    """The reward model is Mllama's backbone under a one-label score head: the pixels change its scores."""
    from tuneline.data import build_dataset, load_processed
    from tuneline.evaluation.run import run_evaluation
    from tuneline.model import load_model, load_tokenizer
    from tuneline.train.rm import run

    data = tmp_path / "data"
    shutil.copytree(MM_DATA, data)
    config = pref_config(tiny_vlm, tmp_path, stage="rm", dataset_dir=str(data), val_size=1)
    ref = build_dataset(config)
    keeper = FirstBatch()
    result = run(config, ref, [keeper])
    batch = keeper.batch
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    assert_masked_as_its_ids(batch[MEDIA_INPUTS], ids, image_id(config))
    assert result["global_step"] == 2 and math.isfinite(result["metrics"]["train_loss"])

    tokenizer = load_tokenizer(config.model)
    trained = load_model(config, tokenizer, is_trainable=False, add_valuehead=True, adapters=str(tmp_path / "out"))
    assert type(trained).__name__ == "MllamaForSequenceClassification"
    train = load_processed(ref)["train"]
    pairs, seen, blind = scores_with_and_without_pixels(trained, config, tokenizer, train)
    assert not torch.allclose(seen, blind), "the pixels reach the reward model's forward"
    scored = run_evaluation(config, ref, str(tmp_path / "out"))
    assert scored["num_samples"] == 1 and {"reward_accuracy", "reward_margin"} <= set(scored["metrics"])

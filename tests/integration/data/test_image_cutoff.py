"""A cutoff_len that cuts into a row's image tokens is a bad row, found when the dataset is built: the model needs one
token per image feature, and LLaMA-Factory 0.9.5, which cuts such a row all the same, fails inside the forward
("Image features and image tokens do not match"). Refused by default naming the row, the tokens its images need, the
tokens kept and the cutoff_len that keeps them; `on_bad_rows: skip` drops such rows and counts them."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.data import write_dataset
from tuneline.data import build_dataset, load_processed
from tuneline.errors import DataError
from tuneline.model import load_tokenizer

PRESETS = ["gemma3", "llava", "llava_next", "minicpm_v_4_6", "qwen2_vl", "qwen3_vl"]  # every built vision family
CUT = 24  # within every preset's first prompt: the first row's image tokens are cut
KEEPS_SOME = 128  # gemma3 and minicpm_v_4_6: rows of one image fit, the second image of a longer row does not
REASON = "image tokens cut by cutoff_len"


def config_for(make_config, tiny_vlm, preset: str, **keys):
    return make_config(**{"dataset": "mllm_demo", "model_name_or_path": str(tiny_vlm(preset)), "template": preset,
                          **keys})


@pytest.mark.parametrize("preset", PRESETS)
def test_a_row_whose_image_tokens_are_cut_is_refused_with_the_cutoff_that_keeps_them(media_data_dir, make_config,
                                                                                      tiny_vlm, preset):
    whole = load_processed(build_dataset(config_for(make_config, tiny_vlm, preset)))["train"]
    with pytest.raises(DataError) as refused:
        build_dataset(config_for(make_config, tiny_vlm, preset, cutoff_len=CUT))
    message = str(refused.value)
    found = re.search(rf"mllm_demo\.json: row 1: {REASON}: its 2 images need (\d+) image tokens, and cutoff_len {CUT} "
                      rf"keeps (\d+) of them; set cutoff_len to (\d+) or more \(the row's length\)", message)
    assert found, message
    needed, kept, length = map(int, found.groups())
    assert kept < needed and length == len(whole[0]["input_ids"]) > CUT
    assert "other bad rows" in message and "on_bad_rows: skip" in message and "\n" not in message


@pytest.mark.parametrize("preset", ["gemma3", "minicpm_v_4_6"])
def test_skip_drops_the_rows_whose_images_do_not_fit_and_counts_them(media_data_dir, make_config, tiny_vlm, preset):
    built = build_dataset(config_for(make_config, tiny_vlm, preset, cutoff_len=KEEPS_SOME, on_bad_rows="skip"))
    dropped = built["bad_rows"][REASON]
    assert dropped >= 1 and built["train_rows"] == 6 - dropped
    pad = {"gemma3": "<image_soft_token>", "minicpm_v_4_6": "<|image_pad|>"}[preset]
    pad_id = load_tokenizer(config_for(make_config, tiny_vlm, preset).model).convert_tokens_to_ids(pad)
    kept = load_processed(built)["train"]
    whole = {tuple(row["images"]): row["input_ids"].count(pad_id)
             for row in load_processed(build_dataset(config_for(make_config, tiny_vlm, preset)))["train"]}
    assert kept and all(row["input_ids"].count(pad_id) == whole[tuple(row["images"])] > 0 for row in kept)


def kto_rows(data_dir) -> str:
    """rlhf_v's pairs as KTO rows (each answer alone, labelled), registered beside them: the dataset's name."""
    pairs = json.loads((data_dir / "rlhf_v_demo.json").read_text())
    rows = [{"messages": [{"role": "user", "content": p["conversations"][0]["value"]},
                          {"role": "assistant", "content": p[side]["value"]}],
             "label": side == "chosen", "images": p["images"]} for p in pairs for side in ("chosen", "rejected")]
    write_dataset(data_dir, "kto_images", rows, {
        "formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}})
    return "kto_images"


@pytest.mark.parametrize("stage", ["dpo", "kto"])
def test_preference_rows_whose_prompt_image_is_cut_are_refused_too(media_data_dir, make_config, tiny_vlm, stage):
    """The prompt (and its image) is cut for both answers of a pair, and for KTO's own and mismatched answers."""
    dataset = "rlhf_v" if stage == "dpo" else kto_rows(media_data_dir)
    config = config_for(make_config, tiny_vlm, "gemma3", dataset=dataset, stage=stage, cutoff_len=CUT)
    with pytest.raises(DataError, match=rf"json: row \d+: {REASON}: its \d+ images? needs? \d+ image tokens, and "
                                        rf"cutoff_len {CUT} keeps \d+ of them"):
        build_dataset(config)
    assert build_dataset(config_for(make_config, tiny_vlm, "gemma3", dataset=dataset, stage=stage))["train_rows"]

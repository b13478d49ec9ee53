"""Packing isolation on the tiny model, every stage built from the demo data, and the preview text."""

from __future__ import annotations

import pytest

from tuneline.data import build_collator, build_dataset, load_processed, preview
from tuneline.data.processors import STAGE_COLUMNS

DEMO = {"pt": "demo_pt", "sft": "demo_sft,demo_sharegpt", "rm": "demo_pref", "dpo": "demo_pref_sharegpt",
        "kto": "demo_kto", "ppo": "demo_sft"}


@pytest.fixture
def demo_config(make_config, tiny_model_dir, demo_data_dir):
    def make(stage, **kw):
        extra = {"reward_model": str(tiny_model_dir)} if stage == "ppo" else {}
        return make_config(model_name_or_path=str(tiny_model_dir), dataset_dir=str(demo_data_dir),
                           dataset=DEMO[stage], stage=stage, template="auto", cutoff_len=256, **extra, **kw)

    return make


def _per_example_losses(model, input_ids, labels, position_ids=None, **batch):
    """Mean next-token loss of each stretch of labels, split at label gaps (one stretch per example)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=position_ids, **batch).logits[0, :-1]
    targets = labels[0, 1:]
    losses = torch.nn.functional.cross_entropy(logits.float(), targets.clamp(min=0), reduction="none")
    starts = [0] if position_ids is None else (position_ids[0] == 0).nonzero().flatten().tolist()
    bounds = starts + [input_ids.shape[1]]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        keep = targets[a:b - 1] != -100
        out.append((losses[a:b - 1][keep].sum() / keep.sum()).item())
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager", "sdpa_packed"])
def test_packed_examples_have_the_losses_they_have_alone(demo_config, tiny_model_dir, attn):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuneline.model.packed_attention import register_packed_sdpa

    register_packed_sdpa()  # sdpa_packed: causal sdpa on each example of the row (packed sft training on CPU)
    config = demo_config("sft", packing=True, max_samples=12)
    packed = load_processed(build_dataset(config))["train"]
    row = max(packed, key=lambda r: sum(1 for p in r["position_ids"] if p == 0))
    assert sum(1 for p in row["position_ids"] if p == 0) >= 2  # several examples in one row
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn).train()
    collate = build_collator("sft", AutoTokenizer.from_pretrained(tiny_model_dir))
    batch = collate([row])
    packed_losses = _per_example_losses(model, batch.pop("input_ids"), batch.pop("labels"), **batch)
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(row["input_ids"])]
    alone = []
    for a, b in zip(starts, starts[1:], strict=False):
        ids = torch.tensor([row["input_ids"][a:b]])
        alone += _per_example_losses(model, ids, torch.tensor([row["labels"][a:b]]))
    assert packed_losses == pytest.approx(alone, rel=1e-4, abs=1e-5)
    leaky = _per_example_losses(model, torch.tensor([row["input_ids"]]), torch.tensor([row["labels"]]),
                                position_ids=torch.tensor([row["position_ids"]]),
                                attention_mask=torch.ones(1, len(row["input_ids"]), dtype=torch.long))
    assert leaky != pytest.approx(alone, rel=1e-4)  # proves the test can fail: a mask lets examples mix


@pytest.mark.parametrize("stage", sorted(DEMO))
def test_every_stage_builds_from_the_demo_data(demo_config, tiny_model_dir, stage):
    from transformers import AutoTokenizer

    ref = build_dataset(demo_config(stage, max_samples=8))
    train = load_processed(ref)["train"]
    expected = set(STAGE_COLUMNS[stage])
    assert set(train.column_names) == expected and ref["train_rows"] == len(train) > 0
    batch = build_collator(stage, AutoTokenizer.from_pretrained(tiny_model_dir))([train[0], train[len(train) - 1]])
    ids_key = "chosen_input_ids" if stage in ("rm", "dpo") else "input_ids"
    assert batch[ids_key].shape[0] == 2


def test_preview_shows_ids_and_trained_spans(demo_config):
    text = preview(demo_config("sft"), n=2)
    assert "--- example 2 (sft)" in text and "input_ids (" in text and "labels: [-100" in text
    assert "[[" in text and "]]" in text
    pair = preview(demo_config("dpo"), n=1)
    assert "chosen_input_ids" in pair and "rejected_labels" in pair

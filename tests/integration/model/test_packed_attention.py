"""sdpa_packed: the same logits, loss and gradients as sdpa on packed batches, sdpa itself everywhere else, and
chosen by load_model for sft training on CPU only (packed rows, or padded batches flattened into one row)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.model_steps import logits
from tuneline.data import build_collator
from tuneline.model import load_model
from tuneline.model.packed_attention import PACKED_SDPA, block_diagonal_segments, register_packed_sdpa

# Example lengths of each packed row; the collator pads the shorter rows with one more "example" (0, 1, 2, ...).
ROWS = [[9, 6, 1, 8], [11, 13], [20]]


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    """The tiny model (4 query heads sharing 2 key/value heads) with sdpa and with sdpa_packed, same weights."""
    from transformers import AutoModelForCausalLM

    register_packed_sdpa()
    return {name: AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=name)
            for name in ("sdpa", PACKED_SDPA)}


@pytest.fixture(scope="module")
def packed_batch(tokenizer):
    generator = torch.Generator().manual_seed(0)
    features = []
    for lengths in ROWS:
        ids = torch.randint(4, 500, (sum(lengths),), generator=generator).tolist()
        labels = [-100 if i in {sum(lengths[:k]) for k in range(len(lengths))} else t for i, t in enumerate(ids)]
        features.append({"input_ids": ids, "labels": labels,
                         "position_ids": [p for n in lengths for p in range(n)]})
    return build_collator("sft", tokenizer)(features)


def _loss_logits_grads(model, batch):
    model.train()
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_transformers_mask_of_a_packed_batch_splits_into_its_examples(models, packed_batch):
    from transformers.masking_utils import create_causal_mask

    model = models[PACKED_SDPA]
    embeds = model.get_input_embeddings()(packed_batch["input_ids"])
    mask = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None,
                              past_key_values=None, position_ids=packed_batch["position_ids"])
    expected = [(0, 0, 9), (0, 9, 15), (0, 15, 16), (0, 16, 24), (1, 0, 11), (1, 11, 24), (2, 0, 20), (2, 20, 24)]
    assert block_diagonal_segments(mask, packed_batch["position_ids"]) == expected
    last_padded = torch.ones(3, 24, dtype=torch.long)
    last_padded[:, -1] = 0
    padded = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=last_padded,
                                past_key_values=None, position_ids=packed_batch["position_ids"])
    assert block_diagonal_segments(padded, packed_batch["position_ids"]) == []  # a padding mask: sdpa's way


@pytest.mark.parametrize("rows", ["as packed", "reversed"])  # reversed: the same shapes, other examples per row
def test_packed_batch_has_the_loss_logits_and_gradients_of_masked_sdpa(models, packed_batch, rows):
    batch = {k: v.flip(0) if rows == "reversed" and torch.is_tensor(v) else v for k, v in packed_batch.items()}
    loss, out, grads = _loss_logits_grads(models["sdpa"], batch)
    packed_loss, packed_out, packed_grads = _loss_logits_grads(models[PACKED_SDPA], batch)
    assert packed_loss.item() == pytest.approx(loss.item(), abs=1e-5)
    torch.testing.assert_close(packed_out, out, rtol=0, atol=1e-5)
    assert packed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for n, g in packed_grads.items() if "q_proj" in n)  # attention did get gradients


def test_padded_batches_and_masked_packed_rows_run_plain_sdpa(models, packed_batch):
    ids = torch.randint(4, 500, (2, 10), generator=torch.Generator().manual_seed(1))
    for mask in ([[1] * 10, [1] * 6 + [0] * 4], [[1] * 10, [0] * 3 + [1] * 7]):  # right and left padding
        batch = {"input_ids": ids, "attention_mask": torch.tensor(mask)}
        assert torch.equal(logits(models[PACKED_SDPA], batch), logits(models["sdpa"], batch))
    # A packed batch that keeps its attention mask lets examples see each other under sdpa: the same here.
    leaky = {k: v for k, v in packed_batch.items() if k != "labels"}
    leaky["attention_mask"] = torch.ones_like(leaky["input_ids"])
    assert torch.equal(logits(models[PACKED_SDPA], leaky), logits(models["sdpa"], leaky))


def test_generation_with_a_kv_cache_runs_plain_sdpa(models, tokenizer):
    prompts = torch.tensor([[0, 0, 0, 17, 42, 99, 7], [5, 8, 13, 21, 34, 55, 89]])  # the first left-padded
    inputs = {"input_ids": prompts, "attention_mask": (prompts != 0).long()}
    generated = {}
    for name, model in models.items():
        model.eval()
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                             output_scores=True, return_dict_in_generate=True)
        generated[name] = (out.sequences, torch.stack(out.scores))
    assert torch.equal(generated[PACKED_SDPA][0], generated["sdpa"][0])
    assert torch.equal(generated[PACKED_SDPA][1], generated["sdpa"][1])


def test_sft_training_on_cpu_loads_sdpa_packed(make_config, tokenizer, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, also on a GPU runner
    packed = make_config(packing=True, finetuning_type="full")
    model = load_model(packed, tokenizer)
    assert model.config._attn_implementation == PACKED_SDPA
    assert load_model(packed, tokenizer, is_trainable=False).config._attn_implementation == "sdpa"
    assert load_model(make_config(), tokenizer).config._attn_implementation == PACKED_SDPA  # flattened batches
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert PACKED_SDPA not in json.dumps(saved)  # the name stays in this process: the model loads anywhere
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "saved").config._attn_implementation == "sdpa"

"""Per-stage encoding (hand-written ids and label masks with the char tokenizer), truncation and collators."""

from __future__ import annotations

import pytest

from tests.support.data import EOS, PAD, ids, masked
from tuneline.data.collators import build_collator
from tuneline.data.processors import Encoder, split_budget
from tuneline.data.template_catalog import get_template


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


def batch(*examples):
    rows = [{"_prompt": p, "_response": r, "_system": s, "_tools": "", "_kto_tag": k} for p, r, s, k in examples]
    return {key: [row[key] for row in rows] for key in rows[0]}


def encoder(tok, stage, template="default", **kw):
    return Encoder(tok, get_template(template, tok), stage, kw.pop("cutoff_len", 1024), **kw)


H = "Human: "  # default template: "Human: {q}</s>\nAssistant:" then "{a}</s>\n"


def prompt_ids(q):
    return ids(H + q) + [EOS] + ids("\nAssistant:")


def answer_ids(a):
    return ids(a) + [EOS] + ids("\n")


def test_sft_masks_every_prompt_token(char_tokenizer):
    out = encoder(char_tokenizer, "sft")(batch(([user("hi"), bot("yo"), user("q")], [bot("a")], "", None)))
    p1, a1, p2, a2 = prompt_ids("hi"), answer_ids("yo"), prompt_ids("q"), answer_ids("a")
    assert out["input_ids"] == [p1 + a1 + p2 + a2]
    assert out["labels"] == [[-100] * len(p1) + a1 + [-100] * len(p2) + a2]
    assert out["attention_mask"] == [[1] * len(p1 + a1 + p2 + a2)]


def test_sft_system_prompt_is_masked(char_tokenizer):
    out = encoder(char_tokenizer, "sft")(batch(([user("hi")], [bot("yo")], "S", None)))
    system = ids("System: S") + [EOS] + ids("\n")
    assert out["input_ids"] == [system + prompt_ids("hi") + answer_ids("yo")]
    assert out["labels"] == [masked("x" * len(system + prompt_ids("hi"))) + answer_ids("yo")]


def test_train_on_prompt_and_mask_history(char_tokenizer):
    example = batch(([user("hi"), bot("yo"), user("q")], [bot("a")], "", None))
    p1, a1, p2, a2 = prompt_ids("hi"), answer_ids("yo"), prompt_ids("q"), answer_ids("a")
    assert encoder(char_tokenizer, "sft", train_on_prompt=True)(example)["labels"] == [p1 + a1 + p2 + a2]
    out = encoder(char_tokenizer, "sft", mask_history=True)(example)
    assert out["input_ids"] == [p1 + a1 + p2 + a2]
    assert out["labels"] == [[-100] * len(p1 + a1 + p2) + a2]


def test_split_budget_cases():
    assert split_budget(10, 3, 8) == (5, 3)  # short answer kept whole, prompt cut
    assert split_budget(3, 10, 8) == (3, 5)  # short prompt kept whole, answer cut
    assert split_budget(10, 10, 8) == (4, 4)  # both long: in proportion
    assert split_budget(2, 2, 8) == (2, 2)


def test_sft_truncation_splits_cutoff_between_prompt_and_answer(char_tokenizer):
    enc = encoder(char_tokenizer, "sft", template="empty", cutoff_len=8)
    out = enc(batch(([user("PPPPPPPPPP")], [bot("AAAAAAAAAA")], "", None)))
    assert out["input_ids"] == [ids("PPPP") + ids("AAAA")]
    assert out["labels"] == [masked("PPPP") + ids("AAAA")]
    out = enc(batch(([user("PPPPPPPPPP")], [bot("AAA")], "", None)))
    assert out["input_ids"] == [ids("PPPPP") + ids("AAA")]


def test_mask_history_gives_the_budget_to_the_last_turn(char_tokenizer):
    enc = encoder(char_tokenizer, "sft", template="empty", cutoff_len=4, mask_history=True)
    out = enc(batch(([user("aa"), bot("bb"), user("cc")], [bot("dd")], "", None)))
    assert out["input_ids"] == [ids("ccdd")]
    assert out["labels"] == [masked("cc") + ids("dd")]


def test_pairwise_encoding(char_tokenizer):
    out = encoder(char_tokenizer, "dpo")(batch(([user("q")], [bot("good"), bot("bad")], "", None)))
    p = prompt_ids("q")
    assert out["chosen_input_ids"] == [p + answer_ids("good")]
    assert out["chosen_labels"] == [[-100] * len(p) + answer_ids("good")]
    assert out["rejected_input_ids"] == [p + answer_ids("bad")]
    assert out["rejected_labels"] == [[-100] * len(p) + answer_ids("bad")]
    assert out["rejected_attention_mask"] == [[1] * len(p + answer_ids("bad"))]


def test_kto_pairs_each_prompt_with_another_rows_answer(char_tokenizer):
    out = encoder(char_tokenizer, "kto", template="empty")(batch(
        ([user("p1")], [bot("r1")], "", True), ([user("p2")], [bot("r2")], "", False)))
    assert out["input_ids"] == [ids("p1r1"), ids("p2r2")]
    assert out["labels"] == [masked("p1") + ids("r1"), masked("p2") + ids("r2")]
    assert out["kto_tags"] == [True, False]
    assert out["kl_input_ids"] == [ids("p1r2"), ids("p2r1")]
    assert out["kl_labels"] == [masked("p1") + ids("r2"), masked("p2") + ids("r1")]


def test_ppo_keeps_the_prompt_with_generation_prompt(char_tokenizer):
    out = encoder(char_tokenizer, "ppo")(batch(([user("q")], [], "", None)))
    assert out == {"input_ids": [prompt_ids("q")], "attention_mask": [[1] * len(prompt_ids("q"))],
                   "_truncated": [0]}


def test_pt_concatenates_with_eos_into_blocks(char_tokenizer):
    enc = encoder(char_tokenizer, "pt", template="empty", cutoff_len=4, packing=True)
    out = enc(batch(([user("abc")], [], "", None), ([user("de")], [], "", None)))
    stream = ids("abc") + [EOS] + ids("de") + [EOS]
    assert out["input_ids"] == [stream[:4], stream[4:]]
    assert out["labels"] == out["input_ids"]
    unpacked = encoder(char_tokenizer, "pt", template="empty", cutoff_len=3)(batch(([user("abcd")], [], "", None)))
    assert unpacked["input_ids"] == [ids("abc")]


def test_sft_collator_pads_to_longest_and_multiple(char_tokenizer):
    rows = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [-100, 6, 7]},
            {"input_ids": [8], "attention_mask": [1], "labels": [8]}]
    out = build_collator("sft", char_tokenizer)(rows)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert build_collator("sft", char_tokenizer, pad_to_multiple_of=8)(rows)["input_ids"].shape == (2, 8)


def test_pairwise_kto_and_ppo_collators(char_tokenizer):
    pair = {"chosen_input_ids": [5, 6], "chosen_attention_mask": [1, 1], "chosen_labels": [-100, 6],
            "rejected_input_ids": [5], "rejected_attention_mask": [1], "rejected_labels": [-100]}
    out = build_collator("dpo", char_tokenizer)([pair])
    assert out["rejected_input_ids"].tolist() == [[5, PAD]] and out["rejected_labels"].tolist() == [[-100, -100]]
    kto = {"input_ids": [5], "attention_mask": [1], "labels": [5], "kto_tags": True,
           "kl_input_ids": [7, 8, 9], "kl_attention_mask": [1, 1, 1], "kl_labels": [-100, 8, 9]}
    out = build_collator("kto", char_tokenizer)([kto, {**kto, "input_ids": [5, 6], "attention_mask": [1, 1],
                                                       "labels": [5, 6], "kto_tags": False}])
    assert out["input_ids"].tolist() == [[5, PAD], [5, 6]] and out["kto_tags"].tolist() == [True, False]
    assert out["kl_input_ids"].shape == (2, 3)
    out = build_collator("ppo", char_tokenizer)([{"input_ids": [5], "attention_mask": [1]},
                                                 {"input_ids": [6, 7], "attention_mask": [1, 1]}])
    assert out["input_ids"].tolist() == [[PAD, 5], [6, 7]] and out["attention_mask"].tolist() == [[0, 1], [1, 1]]


def test_packed_collator_passes_positions_without_mask(char_tokenizer):
    rows = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [-100, 6, 7], "position_ids": [0, 0, 1]},
            {"input_ids": [8], "attention_mask": [1], "labels": [-100], "position_ids": [0]}]
    out = build_collator("sft", char_tokenizer)(rows)
    assert "attention_mask" not in out and out["use_cache"] is False
    assert out["position_ids"].tolist() == [[0, 0, 1], [0, 0, 1]]


def test_unknown_stage_collator(char_tokenizer):
    with pytest.raises(ValueError, match="no collator"):
        build_collator("nope", char_tokenizer)

"""The offline tiny model: loads with Auto classes, chats through its template, and rebuilds byte for byte."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tuneline.demo.tiny_model import IM_END, IM_START, TINY_PRESETS, build_tiny_model

CHAT = [
    {"role": "system", "content": "Answer with the result only."},
    {"role": "user", "content": "Is the number even or odd?\n37"},
    {"role": "assistant", "content": "odd"},
    {"role": "user", "content": "Use the tool to add 2 and 3."},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "content": '{"result": 5}'},
    {"role": "assistant", "content": "5"},
]


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_files_are_hf_format_with_safetensors(tiny_model_dir):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "generation_config.json"} <= names
    assert not any(n.endswith(".bin") for n in names)


def test_special_tokens_are_set_and_match_the_model(tokenizer, model):
    assert tokenizer.bos_token and tokenizer.eos_token == IM_END and tokenizer.pad_token
    ids = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert len(ids) == 3 and None not in ids
    assert tokenizer.convert_tokens_to_ids(IM_START) not in ids | {tokenizer.unk_token_id}
    assert model.config.bos_token_id == tokenizer.bos_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert len(tokenizer) <= model.config.vocab_size


def test_model_is_a_small_llama(model):
    assert model.config.model_type == "llama"
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 <= n_params <= 300_000, n_params


def test_chat_template_renders_every_role(tokenizer):
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, tools=[{"name": "add"}])
    assert text.startswith(f"{IM_START}system\nAnswer with the result only.\n\nTools: ")
    assert f"{IM_START}user\nIs the number even or odd?\n37{IM_END}\n" in text
    assert f"{IM_START}assistant\nodd{IM_END}\n" in text
    assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in text
    assert f'{IM_START}tool\n{{"result": 5}}{IM_END}\n' in text
    prompt = tokenizer.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith(f"{IM_START}assistant\n") and "Tools" not in prompt


def test_chat_template_round_trips_through_ids(tokenizer):
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == text.count(IM_START)


def test_assistant_mask_covers_only_the_answers(tokenizer):
    out = tokenizer.apply_chat_template(CHAT, return_dict=True, return_assistant_tokens_mask=True)
    kept = [i for i, keep in zip(out["input_ids"], out["assistant_masks"], strict=True) if keep]
    assert tokenizer.decode(kept) == (
        f'odd{IM_END}<tool_call>{{"name": "add", "arguments": {{"a": 2, "b": 3}}}}</tool_call>{IM_END}5{IM_END}'
    )


def test_digits_are_split_one_by_one(tokenizer):
    assert tokenizer.tokenize("372")[-3:] == ["3", "7", "2"]


def test_generate_runs_and_stops_at_the_length_limit(tokenizer, model):
    prompt = tokenizer.apply_chat_template(CHAT[1:2], add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert 1 <= out.shape[1] - prompt["input_ids"].shape[1] <= 4


def test_same_seed_same_bytes_and_replacing_leaves_no_temp_dirs(tiny_model_dir, tmp_path):
    out = build_tiny_model(tmp_path / "again", **TINY_PRESETS["test"])
    assert _hashes(out) == _hashes(tiny_model_dir)
    (out / "stale.txt").write_text("left from an older build")
    build_tiny_model(out, **TINY_PRESETS["test"], seed=1)
    assert not (out / "stale.txt").exists()
    changed = {k for k, v in _hashes(out).items() if v != _hashes(tiny_model_dir)[k]}
    assert changed == {"model.safetensors"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]


def test_missing_corpus_dir_falls_back_to_generated_text(tiny_model_dir, tmp_path):
    out = build_tiny_model(tmp_path / "m", **TINY_PRESETS["test"], corpus_dir=tmp_path / "nowhere")
    assert _hashes(out)["tokenizer.json"] == _hashes(tiny_model_dir)["tokenizer.json"]


def test_import_is_cheap():
    code = "import sys, tuneline.demo.tiny_model; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""Built-in templates against hand-written ids (char tokenizer: id = code point, <s>=1, </s>=2), tool turns,
the tokenizer-derived template, and turn-by-turn == whole encoding."""

from __future__ import annotations

import pytest
from data_helpers import BOS, EOS, ids

from tuneline.data.template_catalog import TEMPLATES, get_template
from tuneline.errors import ConfigError

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_names_cover_the_required_templates():
    assert {"empty", "default", "alpaca", "chatml", "llama3", "qwen", "mistral"} <= set(TEMPLATES)


def test_default_template_multiturn_with_system(char_tokenizer):
    pairs = get_template("default", char_tokenizer).encode_multiturn(char_tokenizer, CHAT, system="S")
    assert pairs[0] == (ids("System: S") + [EOS] + ids("\n") + ids("Human: hi") + [EOS] + ids("\nAssistant:"),
                        ids("yo") + [EOS] + ids("\n"))
    assert pairs[1] == (ids("Human: q") + [EOS] + ids("\nAssistant:"), ids("a") + [EOS] + ids("\n"))


def test_alpaca_uses_its_default_system(char_tokenizer):
    template = get_template("alpaca", char_tokenizer)
    prompt, answer = template.encode_oneturn(char_tokenizer, CHAT[:2])
    assert prompt == ids(template.default_system + "### Instruction:\nhi\n\n### Response:\n")
    assert answer == ids("yo") + [EOS] + ids("\n\n")


def test_empty_template_adds_nothing(char_tokenizer):
    assert get_template("empty", char_tokenizer).encode_oneturn(char_tokenizer, CHAT[:2]) == (ids("hi"), ids("yo"))


def test_chatml_and_qwen(char_tokenizer):
    pairs = get_template("chatml", char_tokenizer).encode_multiturn(char_tokenizer, CHAT[:2], system="S")
    assert pairs == [(ids("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
                      ids("yo<|im_end|>\n"))]
    prompt, _ = get_template("qwen", char_tokenizer).encode_oneturn(char_tokenizer, CHAT[:2])
    assert prompt[:len(ids("<|im_start|>system\nYou are Qwen"))] == ids("<|im_start|>system\nYou are Qwen")


def test_llama3_starts_with_bos(char_tokenizer):
    prompt, answer = get_template("llama3", char_tokenizer).encode_oneturn(char_tokenizer, CHAT[:2])
    head = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert prompt == [BOS] + ids(head)
    assert answer == ids("yo<|eot_id|>")


def test_mistral_fuses_system_into_first_user_turn(char_tokenizer):
    pairs = get_template("mistral", char_tokenizer).encode_multiturn(char_tokenizer, CHAT, system="S")
    assert pairs[0] == ([BOS] + ids("[INST] S\n\nhi[/INST]"), ids(" yo") + [EOS])
    assert pairs[1] == (ids("[INST] q[/INST]"), ids(" a") + [EOS])


def test_tools_function_call_and_observation_in_qwen(char_tokenizer):
    template = get_template("qwen", char_tokenizer)
    tools = '[{"name": "add", "description": "sum", "parameters": {"type": "object"}}]'
    msgs = [{"role": "user", "content": "1+1?"},
            {"role": "function", "content": '{"name": "add", "arguments": {"a": 1}}'},
            {"role": "observation", "content": "2"}, {"role": "assistant", "content": "2"}]
    pairs = template.encode_multiturn(char_tokenizer, msgs, system="S", tools=tools)
    system_text = char_tokenizer.decode(pairs[0][0])
    assert system_text.startswith("<|im_start|>system\nS\n\n# Tools") and '"name": "add"' in system_text
    assert pairs[0][1] == ids('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n')
    assert pairs[1] == (ids("<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n"
                            "<|im_start|>assistant\n"), ids("2<|im_end|>\n"))


def test_default_tool_format_writes_action_lines(char_tokenizer):
    template = get_template("default", char_tokenizer)
    msgs = [{"role": "user", "content": "x"}, {"role": "function", "content": '{"name": "f", "arguments": {}}'}]
    _, answer = template.encode_oneturn(char_tokenizer, msgs)
    assert answer == ids("Action: f\nAction Input: {}\n") + [EOS] + ids("\n")


def test_overrides_and_unknown_name(char_tokenizer):
    template = get_template("chatml", char_tokenizer, tool_format="qwen", default_system="D")
    assert template.tool_format == "qwen" and template.default_system == "D"
    with pytest.raises(ConfigError, match="did you mean 'chatml'"):
        get_template("chatmll", char_tokenizer)


def _chat_template_ids(tokenizer, messages, **kwargs) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("tokenizer_name", ["char", "tiny"])
def test_auto_template_matches_the_tokenizers_chat_template(tokenizer_name, char_tokenizer, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = char_tokenizer if tokenizer_name == "char" else AutoTokenizer.from_pretrained(tiny_model_dir)
    template = get_template("auto", tok)
    messages = [{"role": "system", "content": "Be brief."}, *CHAT]
    prompt, answer = template.encode_oneturn(tok, messages[1:], system="Be brief.")
    assert prompt + answer == _chat_template_ids(tok, messages)
    open_turn = messages[1:4] + [{"role": "assistant", "content": ""}]
    prompt, _ = template.encode_oneturn(tok, open_turn, system="Be brief.")
    assert prompt == _chat_template_ids(tok, messages[:4], add_generation_prompt=True)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_turn_by_turn_equals_whole(name, char_tokenizer):
    template = get_template(name, char_tokenizer)
    whole = [t for pair in template.encode_multiturn(char_tokenizer, CHAT, system="S") for part in pair for t in part]
    first_pairs = template.encode_multiturn(char_tokenizer, CHAT[:2], system="S")
    first = [t for pair in first_pairs for part in pair for t in part]
    second = template.encode_multiturn(char_tokenizer, CHAT, system="S")[1]
    assert whole == first + second[0] + second[1]
    prompt, answer = template.encode_oneturn(char_tokenizer, CHAT, system="S")
    assert prompt + answer == whole


@pytest.mark.parametrize("tokenizer_name", ["char", "tiny"])
def test_batch_ids_equal_the_tokenizers_own_call(tokenizer_name, char_tokenizer, tiny_model_dir):
    """The direct Rust-backend path gives what `tokenizer(...)` gives, and falls back when truncation is set."""
    from transformers import AutoTokenizer

    from tuneline.data.templates import batch_ids

    tok = char_tokenizer if tokenizer_name == "char" else AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["Hello there, 12 + 30 = 42!", "<s>keep</s> specials", " \n", "caf\u00e9 \u4f60\u597d"]
    expected = tok(texts, add_special_tokens=False)["input_ids"]
    assert batch_ids(tok, texts) == expected
    tok._tokenizer.enable_truncation(3)
    try:
        assert batch_ids(tok, texts) == expected  # the wrapper resets truncation on its own calls
    finally:
        tok._tokenizer.no_truncation()

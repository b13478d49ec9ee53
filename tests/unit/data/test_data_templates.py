"""Built-in templates against hand-written ids (char tokenizer: id = code point, <s>=1, </s>=2), tool turns,
the tokenizer-derived template, and turn-by-turn == whole encoding.

The expected texts of the newer templates are written from LLaMA-Factory 0.9.5's slot definitions of the same
names (baichuan2 and qwen2 from its earlier releases), with the char tokenizer's bos/eos spelled <s> and </s>."""

from __future__ import annotations

import copy

import pytest

from tests.support.data import BOS, EOS, ids
from tuneline.data.processors import Encoder
from tuneline.data.template_catalog import TEMPLATES, get_template
from tuneline.errors import ConfigError

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_names_cover_the_required_templates():
    assert {"empty", "default", "alpaca", "chatml", "llama3", "qwen", "mistral"} <= set(TEMPLATES)
    assert set(EXPECTED) <= set(TEMPLATES)


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
    assert answer == ids("Action: f\nAction Input: {}") + [EOS] + ids("\n")


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


def _flat(pairs) -> list[int]:
    return [t for pair in pairs for part in pair for t in part]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_turn_by_turn_equals_whole(name, char_tokenizer):
    """One-turn encoding is multi-turn encoding without history thoughts (LLaMA-Factory's), equal to it for all
    but reasoning templates."""
    template = get_template(name, char_tokenizer)
    whole = _flat(template.encode_multiturn(char_tokenizer, CHAT, system="S"))
    first = _flat(template.encode_multiturn(char_tokenizer, CHAT[:2], system="S"))
    second = template.encode_multiturn(char_tokenizer, CHAT, system="S")[1]
    assert whole == first + second[0] + second[1]
    prompt, answer = template.encode_oneturn(char_tokenizer, CHAT, system="S")
    dropped = _flat(template.encode_multiturn(char_tokenizer, CHAT, system="S", last_turn_only=True))
    assert prompt + answer == dropped
    assert (dropped == whole) != template.reasoning


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


IM = "<|im_start|>{}\n{}<|im_end|>\n".format
IM_ANSWER = "<|im_start|>assistant\n"
THINK = "<think>\n\n</think>\n\n"
QWEN3_NOTHINK = [IM("system", "S") + IM("user", "hi") + IM_ANSWER, "yo<|im_end|>\n",
                 IM("user", "q") + IM_ANSWER, "a<|im_end|>\n"]
L4 = "<|header_start|>{}<|header_end|>\n\n{}<|eot|>".format
L4_ANSWER = "<|header_start|>assistant<|header_end|>\n\n"
GEMMA = ["<s><start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\n", "yo<end_of_turn>\n",
         "<start_of_turn>user\nq<end_of_turn>\n<start_of_turn>model\n", "a<end_of_turn>\n"]
COHERE = "<|START_OF_TURN_TOKEN|><|{}_TOKEN|>{}<|END_OF_TURN_TOKEN|>".format
COHERE_ANSWER = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
GRANITE = "<|start_of_role|>{}<|end_of_role|>{}<|end_of_text|>\n".format
GRANITE_ANSWER = "<|start_of_role|>assistant<|end_of_role|>"

# CHAT with system "S": [prompt 1, answer 1, prompt 2, answer 2], as LLaMA-Factory renders them
EXPECTED = {
    "qwen3_nothink": QWEN3_NOTHINK,
    "qwen2": QWEN3_NOTHINK,
    "yi": QWEN3_NOTHINK,
    "qwen3": [QWEN3_NOTHINK[0], THINK + "yo<|im_end|>\n", QWEN3_NOTHINK[2], THINK + "a<|im_end|>\n"],
    "intern2": ["<s>" + QWEN3_NOTHINK[0], *QWEN3_NOTHINK[1:]],
    "phi4": ["<|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>hi<|im_end|>"
             "<|im_start|>assistant<|im_sep|>", "yo<|im_end|>",
             "<|im_start|>user<|im_sep|>q<|im_end|><|im_start|>assistant<|im_sep|>", "a<|im_end|>"],
    "llama2": ["<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST]", "yo</s>", "<s>[INST] q [/INST]", "a</s>"],
    "llama4": ["<s>" + L4("system", "S") + L4("user", "hi") + L4_ANSWER, "yo<|eot|>", L4("user", "q") + L4_ANSWER,
               "a<|eot|>"],
    "gemma": GEMMA,
    "gemma3": GEMMA,
    "mistral_small": ["<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]hi[/INST]", "yo</s>", "[INST]q[/INST]", "a</s>"],
    "deepseek3": ["<s>S<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c>", "yo</s>", "<\uff5cUser\uff5c>q<\uff5cAssistant\uff5c>",
                  "a</s>"],
    "deepseekr1": ["<s>S<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c>", THINK + "yo</s>",
                   "<\uff5cUser\uff5c>q<\uff5cAssistant\uff5c>", THINK + "a</s>"],
    "glm4": ["[gMASK]<sop><|system|>\nS<|user|>\nhi<|assistant|>", "\nyo", "<|user|>\nq<|assistant|>", "\na"],
    "baichuan2": ["S<reserved_106>hi<reserved_107>", "yo", "<reserved_106>q<reserved_107>", "a"],
    "cohere": ["<s>" + COHERE("SYSTEM", "S") + COHERE("USER", "hi") + COHERE_ANSWER, "yo</s>",
               COHERE("USER", "q") + COHERE_ANSWER, "a</s>"],
    "granite3": [GRANITE("system", "S") + GRANITE("user", "hi") + GRANITE_ANSWER, "yo<|end_of_text|>\n",
                 GRANITE("user", "q") + GRANITE_ANSWER, "a<|end_of_text|>\n"],
    "olmo": ["</s>S<|user|>\nhi<|assistant|>\n", "yo</s>", "<|user|>\nq<|assistant|>\n", "a</s>"],
}

# a tool's result "2" (the third message, after a question and a function call) as LLaMA-Factory renders it
OBSERVATION = {
    "qwen3": "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n" + IM_ANSWER,
    "yi": IM("user", "2") + IM_ANSWER,
    "phi4": "<|im_start|>user<|im_sep|>2<|im_end|><|im_start|>assistant<|im_sep|>",
    "llama4": L4("ipython", "2") + L4_ANSWER,
    "gemma": "<start_of_turn>tool\n2<end_of_turn>\n<start_of_turn>model\n",
    "mistral_small": '[TOOL_RESULTS]{"content": 2}[/TOOL_RESULTS]',
    "glm4": "<|observation|>\n2<|assistant|>",
    "llama2": "<s>[INST] 2 [/INST]",
    "granite3": GRANITE("user", "2") + GRANITE_ANSWER,
}


def _render(template, tokenizer, messages, system="S", **kwargs) -> list[str]:
    """The text of each message, bos/eos spelled as the tokenizer's tokens."""
    names = {"bos": tokenizer.bos_token, "eos": tokenizer.eos_token}
    pieces = template.pieces(messages, system, None, **kwargs)
    return ["".join(p if isinstance(p, str) else names.get(p.name, p.name) for p in message) for message in pieces]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_renders_as_llamafactory(name, char_tokenizer):
    assert _render(get_template(name, char_tokenizer), char_tokenizer, CHAT) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(OBSERVATION))
def test_observation_turn(name, char_tokenizer):
    messages = [CHAT[0], {"role": "function", "content": '{"name": "f", "arguments": {}}'},
                {"role": "observation", "content": "2"}, CHAT[1]]
    assert _render(get_template(name, char_tokenizer), char_tokenizer, messages, system="")[2] == OBSERVATION[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sft_labels_train_the_answers_only(name, char_tokenizer):
    """Prompts are masked, answers trained; with efficient_eos one eos ends the sequence and each later prompt's
    first label is eos (the previous answer's end), as LLaMA-Factory does."""
    template = get_template(name, char_tokenizer)
    p1, a1, p2, a2 = (_ids(char_tokenizer, text) for text in EXPECTED[name])
    batch = {"_prompt": [CHAT[:3]], "_response": [CHAT[3:]], "_system": ["S"], "_tools": [""]}
    out = Encoder(char_tokenizer, template, "sft", 1024)(batch)
    eos = [EOS] if template.efficient_eos else []
    second_prompt = eos + [-100] * (len(p2) - len(eos))
    assert out["input_ids"] == [p1 + a1 + p2 + a2 + eos]
    assert out["labels"] == [[-100] * len(p1) + a1 + second_prompt + a2 + eos]


def test_reasoning_keeps_a_given_thought_and_drops_history_thoughts(char_tokenizer):
    template = get_template("qwen3", char_tokenizer)
    thought = "<think>\nr\n</think>\n\n"
    chat = [CHAT[0], {"role": "assistant", "content": thought + "yo"}, *CHAT[2:]]
    assert _render(template, char_tokenizer, chat)[1] == thought + "yo<|im_end|>\n"
    dropped = _render(template, char_tokenizer, chat, last_turn_only=True)
    assert dropped[1] == "yo<|im_end|>\n" and dropped[3] == THINK + "a<|im_end|>\n"
    prompt, answer = template.encode_oneturn(char_tokenizer, chat, system="S")
    assert char_tokenizer.decode(prompt) == "".join(dropped[:3])


@pytest.mark.parametrize(("name", "start"), [
    ("qwen2", IM("system", "You are a helpful assistant.") + IM("user", "hi")),
    ("qwen3", IM("user", "hi")),
    ("intern2", "<s><|im_start|>system\nYou are an AI assistant whose name is InternLM"),
])
def test_default_system(name, start, char_tokenizer):
    assert _render(get_template(name, char_tokenizer), char_tokenizer, CHAT, system=None)[0].startswith(start)


@pytest.mark.parametrize("name", sorted(n for n, t in TEMPLATES.items() if t.replace_eos))
def test_replacing_eos_changes_no_ids(name, char_tokenizer):
    """LLaMA-Factory makes the first stop word the eos of a replace_eos template's tokenizer; the ids are the same
    either way (both tokenizers have the stop words as tokens, as a real model's has)."""
    template = get_template(name, char_tokenizer)
    ours = copy.deepcopy(char_tokenizer)
    ours.add_tokens(list(template.stop_words), special_tokens=True)
    theirs = copy.deepcopy(ours)
    theirs.add_special_tokens({"eos_token": template.stop_words[0]})
    assert theirs.eos_token_id != ours.eos_token_id
    chat = CHAT + [{"role": "user", "content": "x"}, {"role": "function", "content": '{"name": "f", "arguments": {}}'}]
    assert template.encode_multiturn(ours, chat, system="S") == template.encode_multiturn(theirs, chat, system="S")


def test_auto_without_a_chat_template_is_empty(char_tokenizer):
    tokenizer = copy.deepcopy(char_tokenizer)
    tokenizer.chat_template = None
    assert get_template("auto", tokenizer).replace(today=None) == TEMPLATES["empty"]


@pytest.mark.parametrize("thinking", [{}, {"enable_thinking": False}, {"preserve_thinking": True}])
def test_auto_reads_a_chat_template_that_thinks_as_a_reasoning_template(char_tokenizer, thinking):
    """Qwen3's own chat template (as trl ships it) writes an empty thought into the answer it is probed with: auto
    reads it as a reasoning template with the thought off the answer slot, as LLaMA-Factory does, so it encodes as
    the catalogue's qwen3 does and the thinking keys apply; before, every answer got a literal thought."""
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = copy.deepcopy(char_tokenizer)
    tokenizer.chat_template = qwen3_chat_template
    auto, named = get_template("auto", tokenizer, **thinking), get_template("qwen3", tokenizer, **thinking)
    assert auto.reasoning and auto.slots["assistant"] == ("{{content}}<|im_end|>\n",)
    thought = "<think>\nr\n</think>\n\n"
    chats = [CHAT, [CHAT[0], {"role": "assistant", "content": thought + "yo"}, *CHAT[2:]]]
    for chat in chats:
        for system in ("S", None):
            assert (auto.encode_multiturn(tokenizer, chat, system=system)
                    == named.encode_multiturn(tokenizer, chat, system=system)), (chat, system)
            assert auto.encode_oneturn(tokenizer, chat, system) == named.encode_oneturn(tokenizer, chat, system)
    assert "".join(_render(auto, tokenizer, CHAT)).count("<think>") == 2


def test_an_empty_tool_list_writes_no_tool_section():
    """LLaMA-Factory's demo sharegpt rows carry `"tools": "[]"`: no tools, so no tool text in the system turn (it
    still opens a system turn, empty where the template has no default system prompt, as LLaMA-Factory does)."""
    from tuneline.data import TEMPLATES

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    for name in ("qwen", "default", "llama3"):
        template = TEMPLATES[name]
        empty = "".join(p for p in template.pieces(messages, None, "[]")[0] if isinstance(p, str))
        assert "ools" not in empty, name
        with_tool = template.pieces(messages, None, '[{"name": "add", "description": "sum"}]')
        assert "add" in "".join(p for p in with_tool[0] if isinstance(p, str)), name


def test_enable_thinking_false_drops_thoughts_and_closes_the_prompt_with_an_empty_one(char_tokenizer):
    """Qwen3 users' `enable_thinking: false`: every thought goes and the empty one ends each prompt, so the model
    learns to answer without thinking and is never trained on the empty thought (LLaMA-Factory's encoding)."""
    template = get_template("qwen3", char_tokenizer, enable_thinking=False)
    chat = [CHAT[0], {"role": "assistant", "content": "<think>\nr\n</think>\n\nyo"}, *CHAT[2:]]
    assert _render(template, char_tokenizer, chat) == [QWEN3_NOTHINK[0] + THINK, "yo<|im_end|>\n",
                                                       QWEN3_NOTHINK[2] + THINK, "a<|im_end|>\n"]
    assert _render(get_template("qwen3_nothink", char_tokenizer, enable_thinking=False), char_tokenizer,
                   CHAT) == QWEN3_NOTHINK, "a template that is not a reasoning one ignores the key"


def test_preserve_thinking_keeps_earlier_thoughts_in_a_prompt(char_tokenizer):
    thought = "<think>\nr\n</think>\n\n"
    chat = [CHAT[0], {"role": "assistant", "content": thought + "yo"}, *CHAT[2:]]
    kept = get_template("qwen3", char_tokenizer, preserve_thinking=True)
    assert _render(kept, char_tokenizer, chat, last_turn_only=True)[1] == thought + "yo<|im_end|>\n"
    assert _render(get_template("qwen3", char_tokenizer), char_tokenizer, chat,
                   last_turn_only=True)[1] == "yo<|im_end|>\n"


def test_the_thinking_keys_are_read_from_a_llamafactory_yaml(tmp_path):
    from tuneline.config import load_config

    config = load_config(overrides={"model_name_or_path": "m", "dataset": "d", "template": "qwen3",
                                    "enable_thinking": False, "preserve_thinking": True,
                                    "output_dir": str(tmp_path)}, check_paths=False)
    assert (config.data.enable_thinking, config.data.preserve_thinking) == (False, True)

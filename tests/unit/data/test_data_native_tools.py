"""Tool conversations under `template: auto`: the tiny model's own chat template writes the tool list, calls and
results ("Tools: ..." in the system turn, `<tool_call>{...}</tool_call>`, a `tool` turn), cut into turns."""

from __future__ import annotations

import copy
import json

import pytest

from tuneline.data.processors import IGNORE, Encoder
from tuneline.data.template_catalog import get_template
from tuneline.data.tools import FunctionCall
from tuneline.errors import ConfigError, DataError

TOOL = {"name": "add", "description": "sum two numbers", "parameters": {"type": "object"}}
TOOLS = json.dumps([TOOL])
CALL = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
MESSAGES = [{"role": "user", "content": "Add 2 and 3."}, {"role": "function", "content": CALL},
            {"role": "observation", "content": '{"result": 5}'}, {"role": "assistant", "content": "5"}]
# the same conversation as transformers writes it for apply_chat_template
HF_MESSAGES = [
    {"role": "system", "content": "S"}, MESSAGES[0],
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "content": '{"result": 5}'}, MESSAGES[3],
]
HF_TOOLS = [{"type": "function", "function": TOOL}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _chat_template_ids(tokenizer, messages, **kwargs) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _sft(tokenizer, template, messages=MESSAGES, tools=TOOLS) -> dict:
    batch = {"_prompt": [messages[:-1]], "_response": [messages[-1:]], "_system": ["S"], "_tools": [tools],
             "_file": ["tools.json"], "_row": [7]}
    return Encoder(tokenizer, template, "sft", 1024)(batch)


def test_the_chat_templates_tool_format_is_read_once(tokenizer, char_tokenizer):
    template = get_template("auto", tokenizer)
    assert template.native is not None and template.tool_format == "qwen"  # it writes <tool_call>{json}</tool_call>
    assert template.extract_calls(f"<tool_call>{CALL}</tool_call>") == [FunctionCall("add", '{"a": 2, "b": 3}')]
    plain = get_template("auto", char_tokenizer)  # its template writes no tool list: tools keep the default format
    assert plain.native is None and plain.tool_format == "default"


def test_tool_conversation_ids_are_the_chat_templates(tokenizer):
    out = _sft(tokenizer, get_template("auto", tokenizer))
    assert out["input_ids"] == [_chat_template_ids(tokenizer, HF_MESSAGES, tools=HF_TOOLS)]


def test_labels_train_the_call_and_the_answer_only(tokenizer):
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    tools_text = json.dumps(HF_TOOLS)
    segments = [  # (text, trained)
        (f"<|im_start|>system\nS\n\nTools: {tools_text}<|im_end|>\n<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
         "<|im_start|>assistant\n", False),
        (f"<tool_call>{CALL}</tool_call><|im_end|>\n", True),
        ('<|im_start|>tool\n{"result": 5}<|im_end|>\n<|im_start|>assistant\n', False),
        ("5<|im_end|>\n", True),
    ]
    out = _sft(tokenizer, get_template("auto", tokenizer))
    assert out["input_ids"] == [[t for text, _ in segments for t in ids(text)]]
    assert out["labels"] == [[t if trained else IGNORE for text, trained in segments for t in ids(text)]]


def test_a_prompt_for_generation_ends_with_the_generation_prompt(tokenizer):
    """What `tuneline chat` and ppo prompts are: the conversation so far and an empty answer."""
    template = get_template("auto", tokenizer)
    prompt, _ = template.encode_oneturn(tokenizer, [*MESSAGES[:3], {"role": "assistant", "content": ""}], "S", TOOLS)
    assert prompt == _chat_template_ids(tokenizer, HF_MESSAGES[:4], tools=HF_TOOLS, add_generation_prompt=True)


def test_conversations_without_tools_keep_the_slots(tokenizer):
    template = get_template("auto", tokenizer)
    slots_only = template.replace(native=None)
    chat = [MESSAGES[0], {"role": "assistant", "content": "5"}]
    for tools in (None, "", "[]"):
        assert template.pieces(chat, "S", tools) == slots_only.pieces(chat, "S", tools)


def test_a_tool_format_in_the_config_writes_tools_with_the_slots(tokenizer):
    template = get_template("auto", tokenizer, tool_format="qwen")
    assert template.native is None
    first = "".join(p for p in template.pieces(MESSAGES, "S", TOOLS)[0] if isinstance(p, str))
    assert "# Tools" in first and "Tools: [" not in first


def test_a_bad_call_names_its_row(tokenizer):
    bad = [MESSAGES[0], {"role": "function", "content": '{"name": "add"}'}, *MESSAGES[2:]]
    with pytest.raises(DataError, match=r"tools\.json.*7"):
        _sft(tokenizer, get_template("auto", tokenizer), bad)


# like the tiny template, but an answer that ends the conversation gets an empty thought first (as Qwen3's does):
# rendering a call alone and then with its result writes the call turn two ways
REWRITING = (
    "{%- if tools -%}{{- '<|im_start|>system\\nTools: ' ~ (tools | tojson) ~ '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{{- '<|im_start|>' ~ m['role'] ~ '\\n' -}}"
    "{%- if m['role'] == 'assistant' and loop.last -%}{{- '<think></think>' -}}{%- endif -%}"
    "{{- m['content'] -}}"
    "{%- for c in m.get('tool_calls') or [] -%}{{- '<tool_call>' ~ (c['function'] | tojson) ~ '</tool_call>' -}}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_a_chat_template_that_rewrites_earlier_turns_cannot_be_cut(tokenizer):
    rewriting = copy.deepcopy(tokenizer)
    rewriting.chat_template = REWRITING
    template = get_template("auto", rewriting)
    assert template.native is not None
    with pytest.raises(ConfigError, match="cannot be cut into turns.*<think></think>.*`template:`.*`tool_format:`"):
        _sft(rewriting, template)
    _sft(rewriting, get_template("auto", rewriting, tool_format="qwen"))  # the way out the message names

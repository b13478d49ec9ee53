"""Tool formats (tuneline/data/tools.py): every format reads back the calls it writes, the strings are the models'
own, and bad tool data is a bad row named by file, row and column. Ids against LLaMA-Factory's own encoding of tool
rows are checked in test_tool_parity.py."""

from __future__ import annotations

import json

import pytest

from tests.support.data import write_dataset
from tuneline.data import build_dataset
from tuneline.data.loader import load_examples
from tuneline.data.template_catalog import TEMPLATES, get_template
from tuneline.data.tools import TOOL_FORMATS, FunctionCall, calls_as_json, parse_calls
from tuneline.errors import ConfigError, DataError

SHAREGPT_TOOLS = {"formatting": "sharegpt", "columns": {"messages": "conversations", "tools": "tools"}}
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}
TWO_CALLS = [FunctionCall("get_weather", json.dumps({"city": "Paris", "unit": "c"})),
             FunctionCall("get_weather", json.dumps({"city": "北京", "days": [1, 2], "exact": True}, ensure_ascii=False))]


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_every_format_reads_back_the_calls_it_writes(name):
    """LLaMA-Factory's extractor is the inverse of its call writer, format by format; so is ours."""
    tool_format = TOOL_FORMATS[name]
    calls = TWO_CALLS[:1] if name == "glm4" else TWO_CALLS  # GLM-4 writes one call per turn
    extracted = tool_format.extract(tool_format.calls(calls))
    assert calls_as_json(extracted) == calls_as_json(calls)
    assert tool_format.extract("Just an answer.") == "Just an answer."


def test_the_formats_are_llamafactorys_thirteen():
    assert set(TOOL_FORMATS) == {"default", "glm4", "llama3", "mistral", "qwen", "qwen3_5", "gemma4", "lfm2",
                                 "minimax1", "minimax2", "glm4_moe", "seed_oss", "ling"}


def test_each_template_names_llamafactorys_tool_format():
    named = {"qwen": "qwen", "qwen3": "qwen", "qwen3_nothink": "qwen", "llama3": "llama3", "llama4": "llama3",
             "mistral": "mistral", "mistral_small": "mistral", "glm4": "glm4", "glm4_moe": "glm4_moe",
             "qwen3_5": "qwen3_5", "lfm2": "lfm2", "minimax1": "minimax1", "minimax2": "minimax2",
             "seed_oss": "seed_oss", "bailing_v2": "ling", "gemma4": "gemma4", "chatml": "default", "yi": "default"}
    assert {name: TEMPLATES[name].tool_format for name in named} == named


def test_qwen_writes_its_tool_prompt_and_calls():
    template = TEMPLATES["qwen3_nothink"]
    text = template.tool_text(json.dumps([TOOL]))
    assert text.startswith("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                           '{"type": "function", "function": {"name": "get_weather"')
    assert text.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    call = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    assert template.function_text(call) == ('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
                                            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>')


def test_llama3_writes_the_date_it_is_given(char_tokenizer):
    template = get_template("llama3", char_tokenizer, today="26 Jul 2024")
    text = template.tool_text(json.dumps([TOOL]))
    assert text.startswith("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n")
    assert template.function_text('{"name": "a", "arguments": {"x": 1}}') == '{"name": "a", "parameters": {"x": 1}}'


def test_a_call_after_a_thought_or_inside_tool_call_words_keeps_the_text_before_it():
    assert parse_calls('<think>\nhm\n</think>\n\n{"name": "a", "arguments": {}}', ("<think>\n", "\n</think>\n\n"),
                       ("<tool_call>", "</tool_call>")) == ("<think>\nhm\n</think>\n\n", [FunctionCall("a", "{}")])
    assert parse_calls('Let me look. <tool_call>{"name": "a", "arguments": {}}</tool_call>', None,
                       ("<tool_call>", "</tool_call>")) == ("Let me look. ", [FunctionCall("a", "{}")])


def test_an_empty_tool_list_writes_nothing_for_every_format():
    for name, tool_format in TOOL_FORMATS.items():
        assert tool_format.tool_text("[]") == "" and tool_format.tool_text("") == "", name


BAD_ROWS = [
    ("not json", {"tools": "[{name: get_weather}]"}, "bad tool list", "tools", "not JSON"),
    ("not a list", {"tools": '{"name": "get_weather"}'}, "bad tool list", "tools", "JSON list"),
    ("nameless tool", {"tools": '[{"description": "x"}]'}, "bad tool list", "tools", "tool 1 of the list"),
    ("call not json", {"call": "get_weather(city=Paris)"}, "bad function call", "conversations", "not JSON"),
    ("call without arguments", {"call": '{"name": "get_weather"}'}, "bad function call", "conversations",
     '{"name": "...", "arguments": {...}}'),
    ("observation first", {"observation_first": True}, "observation without a call", "conversations",
     "message 1"),
]


def _tool_row(tools: str = json.dumps([TOOL]), call: str = '{"name": "get_weather", "arguments": {"city": "Paris"}}',
              observation_first: bool = False) -> dict:
    turns = [{"from": "human", "value": "Weather in Paris?"}, {"from": "function_call", "value": call},
             {"from": "observation", "value": '{"temp": 21}'}, {"from": "gpt", "value": "It is 21 degrees."}]
    if observation_first:
        turns = [{"from": "observation", "value": "21"}, {"from": "gpt", "value": "It is 21 degrees."}]
    return {"conversations": turns, "tools": tools}


@pytest.mark.parametrize(("case", "change", "reason", "column", "detail"), BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_bad_tool_data_is_a_bad_row_named_by_file_row_and_column(case, change, reason, column, detail, tmp_path,
                                                                 make_config):
    write_dataset(tmp_path / "data", "t", [_tool_row(), _tool_row(**change)], SHAREGPT_TOOLS)
    config = make_config(dataset="t", template="qwen")
    loaded = load_examples(config, config.dataset_names)
    assert len(loaded.per_dataset[0]) == 1
    (bad,) = loaded.bad
    assert (bad.row, bad.reason, bad.column) == (2, reason, column)
    assert detail in bad.detail and "t.json: row 2" in bad.message()
    with pytest.raises(DataError, match=reason):
        build_dataset(config)


def test_several_calls_in_a_glm4_turn_stop_the_build_naming_the_row(tmp_path, make_config):
    """GLM-4 was trained with one call per turn (LLaMA-Factory raises); the row is named, nothing is written."""
    two = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {}}]'
    write_dataset(tmp_path / "data", "t", [_tool_row(), _tool_row(call=two)], SHAREGPT_TOOLS)
    with pytest.raises(DataError, match=r"t\.json: row 2: bad function call: GLM-4's tool format writes one"):
        build_dataset(make_config(dataset="t", template="glm4"))
    assert build_dataset(make_config(dataset="t", template="qwen"))["train_rows"] == 2


def test_tool_date_pins_llama3s_date_and_a_bad_one_is_refused(tmp_path, make_config):
    from tuneline.data import load_processed
    from tuneline.pipeline.preflight import template_problems

    write_dataset(tmp_path / "data", "t", [_tool_row()], SHAREGPT_TOOLS)
    config = make_config(dataset="t", template="llama3", tool_date="26 Jul 2024", cutoff_len=4096)
    ids = load_processed(build_dataset(config))["train"][0]["input_ids"]
    assert "Today Date: 26 Jul 2024\n" in "".join(map(chr, ids))  # the char tokenizer: id = code point
    assert template_problems(make_config(dataset="t", tool_date="2024-07-26")) == [
        "'tool_date: 2024-07-26' is not a date as llama3's tool prompt writes it; use day, month abbreviation and "
        "year, e.g. '26 Jul 2024'"]
    with pytest.raises(ConfigError, match="tool_format 'qwen4' is not known"):
        get_template("qwen", None, tool_format="qwen4")

"""Every catalogue template, written as jinja (`jinja_template.chat_template`), renders through the tokenizer's own
`apply_chat_template` exactly the text training encodes: each turn's prompt (add_generation_prompt) and the whole
conversation, on the demo rows, LLaMA-Factory's tool-call and image/video demo rows and tests/fixtures/tool_rows.json.

Parametrised over the catalogue, so a template added to it is covered without a line here. Tokenizer only (the fixed
parity tokenizer): no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.data.jinja_template import (
    PROCESSOR_PLACED,
    PROCESSOR_PLACEHOLDERS,
    chat_template,
    special_text,
    unwritable,
)
from tuneline.data.media import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from tuneline.data.native_tools import chat_message
from tuneline.data.readers import read_rows
from tuneline.data.registry import parse_entry
from tuneline.data.template_catalog import TEMPLATES, get_template
from tuneline.data.tools import ToolDataError, load_tools

REPO = Path(__file__).resolve().parents[3]
LLAMAFACTORY_DATA = REPO.parent.parent / "shared" / "llamafactory-data"
if not LLAMAFACTORY_DATA.is_dir():  # the main checkout sits beside shared/, a worktree two levels deeper
    LLAMAFACTORY_DATA = Path("/work/shared/llamafactory-data")
TODAY = "26 Jul 2024"
ROWS_PER_FILE = 40  # enough rows for every shape in each file (several turns, parallel calls, non-ASCII, "[]")
TEXT_ROWS = {
    "demo_sft": (REPO / "data", {"file_name": "demo_sft.json"}),
    "demo_sharegpt": (REPO / "data", {"file_name": "demo_sharegpt.json", "formatting": "sharegpt",
                                      "columns": {"messages": "conversations", "system": "system", "tools": "tools"}}),
    "glaive_toolcall_en_demo": (LLAMAFACTORY_DATA, None),
    "tool_rows": (REPO / "tests" / "fixtures", {"file_name": "tool_rows.json", "formatting": "sharegpt", "columns": {
        "messages": "conversations", "system": "system", "tools": "tools"}}),
}
MEDIA_ROWS = {"mllm_demo": (LLAMAFACTORY_DATA, None), "mllm_video_demo": (LLAMAFACTORY_DATA, None)}


def _examples(name: str, folder: Path, entry: dict | None) -> list[dict]:
    from tuneline.data.converters import CONVERTERS

    entry = entry or json.loads((folder / "dataset_info.json").read_text())[name]
    attr = parse_entry(name, entry)
    rows, bad = read_rows(attr, folder)
    assert not bad
    return [CONVERTERS[attr.formatting](attr, row.data, "sft") for row in rows[:ROWS_PER_FILE]]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REPO / "tests" / "fixtures" / "parity_tokenizer")


@pytest.fixture(scope="module")
def text_rows() -> list[dict]:
    return [example for name, (folder, entry) in TEXT_ROWS.items() for example in _examples(name, folder, entry)]


@pytest.fixture(scope="module")
def media_rows() -> list[dict]:
    return [example for name, (folder, entry) in MEDIA_ROWS.items() for example in _examples(name, folder, entry)]


def rendered(tokenizer, template, messages, system, tools, generation_prompt: bool) -> str:
    words = (None, None) if template.fuse_system else (template.thought_words, template.tool_call_words)
    chat = ([{"role": "system", "content": system}] if system else []) + [chat_message(m, words) for m in messages]
    return tokenizer.apply_chat_template(chat, tools=load_tools(tools) if tools else None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def check_row(tokenizer, template, example, as_trained=lambda message: message) -> None:
    """Each turn's prompt and the whole conversation; a row training refuses (GLM-4's one call a turn) is refused.
    `as_trained` turns a message as a client sends it into the message training encodes."""
    from jinja2 import TemplateError

    messages = example["_prompt"] + example["_response"]
    system, tools = example["_system"], example["_tools"]
    for end in range(2, len(messages) + 1, 2):
        turn = messages[:end]
        try:
            pieces = template.pieces([as_trained(m) for m in turn], system, tools, True)  # one-turn encoding
        except ToolDataError:
            with pytest.raises((TemplateError, ToolDataError)):  # a call only the data form holds, or one the format refuses
                rendered(tokenizer, template, turn, system, tools, False)
            return
        texts = ["".join(p if isinstance(p, str) else special_text(tokenizer, p) for p in message) for message in pieces]
        prompt = rendered(tokenizer, template, turn[:-1], system, tools, True)
        assert prompt == "".join(texts[:-1]), f"turn {end // 2}: the prompt differs"
        whole = "".join(texts) + (tokenizer.eos_token if template.efficient_eos else "")
        assert rendered(tokenizer, template, turn, system, tools, False) == whole, f"turn {end // 2}"


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_exported_template_renders_as_training_encodes(name, tokenizer, text_rows, media_rows):
    template = get_template(name, tokenizer, today=TODAY)
    placed = template.mm_plugin in PROCESSOR_PLACED  # its images go where no chat template writes (PaliGemma's)
    assert [gap.part for gap in unwritable(template)] == ([f"media plugin '{template.mm_plugin}'"] if placed else []), \
        "every catalogue template is written whole, its images too where the processor reads them in the text"
    tokenizer.chat_template = chat_template(template, tokenizer, TODAY)
    for example in text_rows:
        check_row(tokenizer, template, example)
    if template.mm_plugin and not placed:
        image, video = PROCESSOR_PLACEHOLDERS[template.mm_plugin]

        def as_trained(message):
            """Before the plugin expands a placeholder to the image's tokens: the form the model's processor expands
            (the same expansion; the export test checks it against the processor)."""
            content = message["content"].replace(IMAGE_PLACEHOLDER, image)
            return {**message, "content": content.replace(VIDEO_PLACEHOLDER, video) if video else content}

        rows = [row for row in media_rows if video or not any(VIDEO_PLACEHOLDER in m["content"] for m in row["_prompt"])]
        assert rows
        for example in rows:
            check_row(tokenizer, template, example, as_trained)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_call_arguments_as_json_text_render_as_objects_do_or_are_refused(name, tokenizer):
    """OpenAI clients send a call's arguments as JSON text: formats that write the arguments as JSON take it as it is;
    formats that write them key by key refuse it by name, never misrender it."""
    from jinja2 import TemplateError

    template = get_template(name, tokenizer, today=TODAY)
    tokenizer.chat_template = chat_template(template, tokenizer, TODAY)
    arguments = {"city": "Zürich", "days": 2}
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]

    def render(value):
        call = {"type": "function", "function": {"name": "forecast", "arguments": value}}
        chat = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "sunny"}]
        return tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)

    as_object = render(arguments)
    assert "Zürich" in as_object
    try:
        as_text = render(json.dumps(arguments, ensure_ascii=False))
    except TemplateError as exc:
        assert "argument by argument" in str(exc)
    else:
        assert as_text == as_object


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_has_an_ollama_modelfile(name, tokenizer):
    """The Modelfile's Go template opens and closes its actions in pairs and holds each turn's slot text."""
    import re

    from tuneline.export.ollama_modelfile import modelfile

    template = get_template(name, tokenizer, today=TODAY)
    text = modelfile(template, tokenizer, 2048)
    body = re.search(r'TEMPLATE """(.*?)"""', text, re.DOTALL).group(1)
    actions = re.findall(r"\{\{ ?(if|range|end|else)", body)
    assert actions.count("end") == actions.count("if") + actions.count("range")
    assert body.count("{{") == body.count("}}")
    user_text = template.slots["user"][-1].split("{{content}}")[0] if isinstance(template.slots["user"][-1], str) else ""
    assert user_text in body and text.startswith("# Ollama Modelfile") and "FROM .\n" in text
    assert f"PARAMETER stop \"{tokenizer.eos_token}\"" in text and text.endswith("PARAMETER num_ctx 2048\n")


def test_several_tool_messages_in_a_row_are_refused_not_misrendered(tokenizer):
    """Training rows hold one observation for a turn's calls; two tool messages in a row have no trained form."""
    from jinja2 import TemplateError

    template = get_template("qwen", tokenizer)
    tokenizer.chat_template = chat_template(template, tokenizer)
    calls = [{"type": "function", "function": {"name": name, "arguments": {}}} for name in ("a", "b")]
    chat = [{"role": "user", "content": "both"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    with pytest.raises(TemplateError, match="one tool message"):
        tokenizer.apply_chat_template(chat, tokenize=False)
    one = [*chat[:2], {"role": "tool", "content": "[1, 2]"}]
    assert tokenizer.apply_chat_template(one, tokenize=False).endswith(
        "<tool_response>\n[1, 2]\n</tool_response><|im_end|>\n<|im_start|>assistant\n")

"""`tuneline export` writes the training template into the export: the tokenizer's chat_template (a model trained on
llama3 over a ChatML base is served in llama3, not ChatML), an Ollama Modelfile, and a warning plus SERVING.md for a
template the jinja cannot write. A random adapter in output_dir stands for the trained one, as in test_export."""

from __future__ import annotations

import json

import pytest
import yaml

from cli.main import run
from tests.support.model_steps import make_adapter
from tuneline.data.native_tools import chat_message

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "function", "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
    {"role": "observation", "content": '{"temperature": 18}'},
    {"role": "assistant", "content": "18 degrees."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module")
def trained_on_llama3(tiny_model_dir, demo_data_dir, tmp_path_factory):
    """A finished LoRA training with `template: llama3` on the tiny model, whose tokenizer's chat template is ChatML."""
    root = tmp_path_factory.mktemp("export_chat")
    out = make_adapter(tiny_model_dir, root / "out", seed=5, targets=("q_proj", "v_proj"))
    (out / "run.json").write_text(json.dumps({"status": "complete"}))
    config = {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "dataset": "demo_sft",
              "dataset_dir": str(demo_data_dir), "template": "llama3", "output_dir": str(out),
              "tool_date": "26 Jul 2024", "export_dir": str(root / "export")}
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, root / "export"


def test_a_llama3_run_on_a_chatml_base_exports_a_llama3_chat_template(trained_on_llama3, tiny_model_dir, capsys):
    from transformers import AutoTokenizer

    from tuneline.data.template_catalog import get_template

    path, export = trained_on_llama3
    base = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "<|im_start|>" in base.apply_chat_template(CONVERSATION[:1], tokenize=False)  # the base speaks ChatML
    assert run(["export", str(path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(export)
    exported = AutoTokenizer.from_pretrained(export)
    template = get_template("llama3", exported, today="26 Jul 2024")
    chat = [chat_message(m) for m in CONVERSATION]
    prompt = exported.apply_chat_template(chat, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>" not in prompt and prompt.startswith(exported.bos_token + "<|start_header_id|>system")
    trained_ids, _ = template.encode_oneturn(exported, [*CONVERSATION, {"role": "assistant", "content": ""}],
                                             None, json.dumps(TOOLS))
    assert prompt == exported.decode(trained_ids)
    assert exported(prompt, add_special_tokens=False)["input_ids"] == trained_ids  # what a server feeds the model
    record = json.loads((export / "tuneline_export.json").read_text())
    assert (record["template"], record["chat_template"], record["unwritable"]) == (
        "llama3", "written from the training template", [])
    modelfile = (export / "Modelfile").read_text()
    assert "FROM .\n" in modelfile and 'PARAMETER stop "<|eot_id|>"' in modelfile
    assert '{{ if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Content }}<|eot_id|>' in modelfile
    assert not (export / "SERVING.md").exists()


def test_a_template_the_jinja_cannot_write_is_named_at_export(trained_on_llama3, monkeypatch, capsys):
    """A catalogue template whose tool format has no jinja writer (stands for one added later): the export warns,
    says what it means in SERVING.md and its record, and the chat template refuses tools instead of misrendering."""
    from jinja2 import TemplateError
    from transformers import AutoTokenizer

    from tuneline.data import template_catalog

    path, export = trained_on_llama3
    unknown = template_catalog.TEMPLATES["chatml"].replace(name="chatml_future", tool_format="future_format")
    monkeypatch.setitem(template_catalog.TEMPLATES, "chatml_future", unknown)
    assert run(["export", str(path), "template=chatml_future"]) == 0
    warning = capsys.readouterr().err
    assert "tool format 'future_format'" in warning and "tuneline api" in warning
    assert "tool format 'future_format'" in (export / "SERVING.md").read_text()
    tokenizer = AutoTokenizer.from_pretrained(export)
    plain = tokenizer.apply_chat_template(CONVERSATION[:1], tokenize=False)
    assert plain == "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(TemplateError, match="future_format"):
        tokenizer.apply_chat_template(CONVERSATION[:1], tools=TOOLS, tokenize=False)


def test_an_auto_template_run_keeps_the_tokenizers_own_chat_template(tiny_model_dir):
    """`template: auto` trained with the tokenizer's chat template: the export keeps it, and says so."""
    from transformers import AutoTokenizer

    from tuneline.config import load_config
    from tuneline.export.chat_template import prepare_chat

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    own = tokenizer.chat_template
    config = load_config(None, {"model_name_or_path": str(tiny_model_dir), "dataset": "unused", "template": "auto"},
                         check_paths=False)
    chat, _ = prepare_chat(config, tokenizer)
    assert tokenizer.chat_template == own and chat.record() == {
        "template": "auto", "chat_template": "the tokenizer's own", "unwritable": []}

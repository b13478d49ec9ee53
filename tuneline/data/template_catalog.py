"""The built-in chat templates by name, and `get_template`, which picks one for a run."""

from __future__ import annotations

from typing import Any

from tuneline.data.templates import BOS, EOS, Template, template_from_tokenizer
from tuneline.data.tools import TOOL_FORMATS
from tuneline.errors import ConfigError, did_you_mean

_IM = "<|im_start|>{role}\n{{{{content}}}}<|im_end|>\n"
_IM_ASSISTANT = "<|im_start|>assistant\n"
_L3 = "<|start_header_id|>{role}<|end_header_id|>\n\n{{{{content}}}}<|eot_id|>"
_L3_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"

TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("empty", assistant=("{{content}}",)),
    Template("default", user=("Human: {{content}}", EOS, "\nAssistant:"), assistant=("{{content}}", EOS, "\n"),
             system=("System: {{content}}", EOS, "\n")),
    Template("alpaca", user=("### Instruction:\n{{content}}\n\n### Response:\n",),
             assistant=("{{content}}", EOS, "\n\n"),
             default_system="Below is an instruction that describes a task. "
                            "Write a response that appropriately completes the request.\n\n"),
    Template("chatml", user=(_IM.format(role="user") + _IM_ASSISTANT,), assistant=("{{content}}<|im_end|>\n",),
             system=(_IM.format(role="system"),), observation=(_IM.format(role="tool") + _IM_ASSISTANT,),
             stop_words=("<|im_end|>", "<|im_start|>")),
    Template("qwen", user=(_IM.format(role="user") + _IM_ASSISTANT,), assistant=("{{content}}<|im_end|>\n",),
             system=(_IM.format(role="system"),),
             observation=("<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n"
                          + _IM_ASSISTANT,),
             default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
             stop_words=("<|im_end|>",), tool_format="qwen"),
    Template("llama3", user=(_L3.format(role="user") + _L3_ASSISTANT,), assistant=("{{content}}<|eot_id|>",),
             system=(_L3.format(role="system"),), observation=(_L3.format(role="ipython") + _L3_ASSISTANT,),
             prefix=(BOS,), stop_words=("<|eot_id|>", "<|eom_id|>"), tool_format="llama3",
             pt_eos="<|end_of_text|>"),
    Template("mistral", user=("[INST] {{content}}[/INST]",), assistant=(" {{content}}", EOS),
             system=("{{content}}\n\n",), function=("[TOOL_CALLS] {{content}}", EOS),
             observation=('[TOOL_RESULTS] {"content": {{content}}}[/TOOL_RESULTS]',),
             prefix=(BOS,), fuse_system=True, tool_format="mistral"),
)}

AUTO = ("auto", None, "")


def get_template(name: str | None, tokenizer, tool_format: str | None = None,
                 default_system: str | None = None) -> Template:
    """A named built-in template, or (None/'auto') one read from the tokenizer's own chat template."""
    if name in AUTO:
        template = template_from_tokenizer(tokenizer) or TEMPLATES["empty"]
    elif name in TEMPLATES:
        template = TEMPLATES[name]
    else:
        raise ConfigError(f"template '{name}' is not known{did_you_mean(name, TEMPLATES)}; "
                          f"use one of {sorted(TEMPLATES)} or 'auto' for the tokenizer's own")
    changes: dict[str, Any] = {}
    if tool_format:
        if tool_format not in TOOL_FORMATS:
            raise ConfigError(f"tool_format '{tool_format}' is not known; use one of {sorted(TOOL_FORMATS)}")
        changes["tool_format"] = tool_format
    if default_system is not None:
        changes["default_system"] = default_system
    return template.replace(**changes) if changes else template

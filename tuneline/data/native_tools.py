"""Tool conversations in the model's own words: the tokenizer's jinja chat template renders them, cut into turns.

A template read off the tokenizer (`template: auto`) cannot say with its slots how the chat template writes a tool
list, a call or a result, so such conversations are rendered by `apply_chat_template(..., tools=...)` and cut into
per-message pieces by rendering growing prefixes and taking the differences. A chat template that rewrites an
earlier turn once a later one follows cannot be cut, and says so."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tuneline.data.tools import TOOL_FORMATS, FunctionCall, load_tools, parse_calls, wrapped_tool
from tuneline.errors import ConfigError

TOOL_ROLES = ("function", "observation")
FALLBACK_FORMAT = "default"  # LLaMA-Factory's ReAct lines: what the slots write when the chat template writes no tools
_INSTEAD = ("set `template:` to a named template for this model or `tool_format:` (one of {formats}) to write tools "
            "with tuneline's own turns instead")

_PROBE_TOOL = {"name": "probe_tool", "description": "probe tool description",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
_PROBE_CALL = FunctionCall("probe_tool", '{"a": 1}')
_PROBE_ANSWER = "probe answer"


def uses_tools(messages: list[dict], tools: str | list | None) -> bool:
    """Whether a conversation needs the chat template's tool writing: a tool list, a call or a tool's result."""
    return any(m["role"] in TOOL_ROLES for m in messages) or bool(load_tools(tools))


def chat_message(message: dict, words: tuple[Any, Any] = (None, None)) -> dict:
    """A tuneline message in transformers' format; `words` (thought, tool-call) let a call sit after a thought or
    inside tags, as the slot path reads it."""
    role, content = message["role"], message["content"]
    if role == "function":
        before, calls = parse_calls(content, *words)
        return {"role": "assistant", "content": before,
                "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                               for c in calls]}
    if role == "observation":
        return {"role": "tool", "content": content}
    return {"role": role, "content": content}


def _divergence(earlier: str, later: str) -> str:
    """Where two renders part, quoted briefly, so the error shows what the chat template rewrote."""
    at = max(len(os.path.commonprefix([earlier, later])) - 20, 0)
    return f"from character {at}, {earlier[at:at + 60]!r} became {later[at:at + 60]!r}"


@dataclass(frozen=True)
class NativeTools:
    """The tokenizer whose chat template writes tool conversations (held by a `Template` read off it)."""

    tokenizer: Any

    def render(self, chat: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(chat, tools=tools, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
        except Exception as exc:  # jinja errors and the template's own raise_exception
            raise ConfigError(f"the model's chat template cannot render a conversation with tools ({exc}); "
                              + _INSTEAD.format(formats=sorted(TOOL_FORMATS))) from exc

    def pieces(self, messages: list[dict], system: str | None, tools: str | list | None,
               words: tuple[Any, Any] = (None, None)) -> list[list[str]]:
        """[[text of message 0], [text of message 1], ...]: each message's part of the whole render, a prompt's
        ending with the generation prompt. Calls and tool lists are checked first, so a bad row is named as such."""
        chat = ([{"role": "system", "content": system}] if system else []) + [chat_message(m, words) for m in messages]
        specs = [wrapped_tool(tool) for tool in load_tools(tools)] or None
        start, done, out = len(chat) - len(messages), "", []
        for i in range(len(messages)):
            text = self.render(chat[:start + i + 1], specs, generation_prompt=i % 2 == 0)
            if not text.startswith(done):
                raise ConfigError(
                    f"the model's chat template cannot be cut into turns: rendering the conversation's first {i} "
                    f"messages does not give the start of rendering {i + 1} ({_divergence(done, text)}), so the "
                    "prompt and answer of each turn are not known; " + _INSTEAD.format(formats=sorted(TOOL_FORMATS)))
            out.append([text[len(done):]] if len(text) > len(done) else [])
            done = text
        return out


def _call_text(native: NativeTools) -> str | None:
    """How the chat template writes the probe call as an answer: None where it writes no tool list or no call, ""
    where its renders do not grow turn by turn (tool rows then get the clear error when they are encoded)."""
    question, tools = {"role": "user", "content": "q"}, [wrapped_tool(_PROBE_TOOL)]
    call = chat_message({"role": "function", "content": json.dumps({"name": _PROBE_CALL.name, "arguments": {"a": 1}})})
    answer = {"role": "assistant", "content": _PROBE_ANSWER}
    try:
        prompt, called = native.render([question], tools, True), native.render([question, call], tools, False)
        bare, plain = native.render([question], None, True), native.render([question, answer], None, False)
    except ConfigError:
        return None
    if _PROBE_TOOL["description"] not in prompt or _PROBE_CALL.name not in called.replace(prompt, "", 1):
        return None
    if not (called.startswith(prompt) and plain.startswith(bare)):
        return ""
    end = plain[len(bare):].partition(_PROBE_ANSWER)[2]  # what closes an answer turn, which generation stops before
    text = called[len(prompt):]
    return (text[:-len(end)] if end and text.endswith(end) else text).strip()


def probe(tokenizer) -> tuple[NativeTools | None, str]:
    """(renderer, tool format that reads its calls back), found once by rendering one call; (None, 'default') where the
    chat template writes no tools, so tool rows keep LLaMA-Factory's default format."""
    native = NativeTools(tokenizer)
    text = _call_text(native)
    if text is None:
        return None, FALLBACK_FORMAT
    for name, tool_format in TOOL_FORMATS.items():
        try:
            if text and tool_format.extract(text) == [_PROBE_CALL]:
                return native, name
        except Exception:  # an extractor that chokes on another format's text does not read it
            continue
    return native, FALLBACK_FORMAT

"""Tool-calling text: how a template shows the tool list to the model and how it writes a function call.

A tool format is a pair of functions (tool list -> system text, call JSON -> assistant text), chosen by name
in `TOOL_FORMATS`; templates name theirs and `tool_format` in the config overrides it. Tool calls arrive as
the JSON text of one call `{"name", "arguments"}` or a list of them, as in LLaMA-Factory's sharegpt data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass


def _load_tools(tools: str) -> list[dict]:
    try:
        parsed = json.loads(tools) if isinstance(tools, str) else tools
    except json.JSONDecodeError:
        return []
    parsed = parsed if isinstance(parsed, list) else [parsed]
    return [t.get("function", t) for t in parsed if isinstance(t, dict)]


def _load_calls(content: str) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) pairs, or None when the text is not a call (then it is kept verbatim)."""
    try:
        parsed = json.loads(content)
    except json.JSONDecodeError:
        return None
    calls = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for call in calls:
        if not isinstance(call, dict) or "name" not in call:
            return None
        out.append((call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))
    return out


def _default_tools(tools: str) -> str:
    specs = _load_tools(tools)
    if not specs:  # "[]": no tool section, as LLaMA-Factory
        return ""
    lines = []
    for spec in specs:
        params = json.dumps(spec.get("parameters", {}), ensure_ascii=False)
        lines.append(f"> Tool: {spec.get('name', '')}\n  Purpose: {spec.get('description', '')}\n"
                     f"  Arguments: {params}")
    names = ", ".join(str(s.get("name", "")) for s in specs)
    return (
        "\n\nTools you may call:\n" + "\n".join(lines) +
        f"\nTo call one, answer with:\nAction: <one of [{names}]>\nAction Input: <the arguments as JSON>\n"
    )


def _default_call(content: str) -> str:
    calls = _load_calls(content)
    if calls is None:
        return content
    return "".join(f"Action: {name}\nAction Input: {args}\n" for name, args in calls)


def _json_tools(tools: str) -> str:
    specs = _load_tools(tools)
    if not specs:
        return ""
    body = "\n".join(json.dumps({"type": "function", "function": s}, ensure_ascii=False) for s in specs)
    return f"\n\n# Tools\n\nYou may call these functions:\n<tools>\n{body}\n</tools>\n"


def _tagged_call(content: str) -> str:
    calls = _load_calls(content)
    if calls is None:
        return content
    return "\n".join(f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>' for name, args in calls)


def _plain_json_call(content: str) -> str:
    calls = _load_calls(content)
    if calls is None:
        return content
    items = [f'{{"name": "{name}", "parameters": {args}}}' for name, args in calls]
    return items[0] if len(items) == 1 else "[" + ", ".join(items) + "]"


def _list_json_call(content: str) -> str:
    calls = _load_calls(content)
    if calls is None:
        return content
    return "[" + ", ".join(f'{{"name": "{name}", "arguments": {args}}}' for name, args in calls) + "]"


@dataclass(frozen=True)
class ToolFormat:
    tools: Callable[[str], str]
    call: Callable[[str], str]


TOOL_FORMATS: dict[str, ToolFormat] = {
    "default": ToolFormat(_default_tools, _default_call),
    "qwen": ToolFormat(_json_tools, _tagged_call),
    "llama3": ToolFormat(_json_tools, _plain_json_call),
    "mistral": ToolFormat(_json_tools, _list_json_call),
}

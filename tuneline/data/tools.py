"""Tool calling in each model's own words: the tool list, function calls, and reading calls back out of an answer.

The strings are written as LLaMA-Factory 0.9.5's `tool_utils.py` writes them for the format of the same name, so a
model tuned here sees the prompt LLaMA-Factory users tune with; arguments travel as JSON text, as there."""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any, NamedTuple


class FunctionCall(NamedTuple):
    name: str
    arguments: str  # JSON text


class ToolDataError(ValueError):
    """A tool list or call that cannot be encoded; the message says what is wrong with it."""


# --- reading the data
def load_tools(tools: str | list | dict | None) -> list[dict]:
    """The tool list of a row ([] for none), or ToolDataError naming what is wrong."""
    if tools is None or (isinstance(tools, str) and not tools.strip()):
        return []
    try:
        parsed = json.loads(tools) if isinstance(tools, str) else tools
    except json.JSONDecodeError as exc:
        raise ToolDataError(f"the tool list is not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, list):
        raise ToolDataError(f"the tool list must be a JSON list of tool objects, got {type(parsed).__name__}")
    for i, tool in enumerate(parsed):
        spec = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else tool
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ToolDataError(f"tool {i + 1} of the list must be an object with a 'name' (or "
                                '{"type": "function", "function": {"name": ...}})')
    return parsed


def _calls_from_json(text: str) -> list[FunctionCall]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolDataError(f"the function call is not JSON ({exc.msg} at character {exc.pos})") from None
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("arguments"), dict)):
            raise ToolDataError('a function call must be {"name": "...", "arguments": {...}} (or a list of them), '
                                f"got {json.dumps(item, ensure_ascii=False)[:80]}")
        calls.append(FunctionCall(item["name"], json.dumps(item["arguments"], ensure_ascii=False)))
    if not calls:
        raise ToolDataError("the function call is an empty list")
    return calls


@functools.cache
def between_words(words: tuple[str, str]) -> re.Pattern:
    """What stands between a pair of words (a thought's, the tool-call tags), as LLaMA-Factory matches it."""
    return re.compile(re.escape(words[0]) + "(.*?)" + re.escape(words[1]), re.DOTALL)


def _between(words: tuple[str, str] | None, text: str) -> re.Match | None:
    return between_words(tuple(words)).search(text) if words else None


def parse_calls(content: str, thought_words: tuple[str, str] | None = None,
                tool_call_words: tuple[str, str] | None = None) -> tuple[str, list[FunctionCall]]:
    """(text before the calls, the calls) of a function message, as LLaMA-Factory reads one: the JSON inside the
    template's tool-call words when present, else the content less a leading thought."""
    wrapped = _between(tool_call_words, content)
    if wrapped:
        return content.replace(wrapped.group(0), ""), _calls_from_json(wrapped.group(1))
    thought = _between(thought_words, content)
    if thought:
        return thought.group(0), _calls_from_json(content.replace(thought.group(0), ""))
    return "", _calls_from_json(content)


DATA_THOUGHT_WORDS = ("<think>", "</think>")
DATA_TOOL_CALL_WORDS = (("<tool_call>", "</tool_call>"), ("<|tool_call_start|>", "<|tool_call_end|>"))


def check_call_content(content: str) -> None:
    """ToolDataError unless some template can read the calls in `content` (checked before a template is known)."""
    first_error = None
    for words in (None, *DATA_TOOL_CALL_WORDS):
        try:
            parse_calls(content, DATA_THOUGHT_WORDS, words)
            return
        except ToolDataError as exc:
            first_error = first_error or exc
    raise first_error


# --- writing and reading, format by format
def _function(tool: dict) -> dict:
    """The function object of a tool, whether or not it is wrapped in {"type": "function", "function": ...}."""
    return tool.get("function", tool) if tool.get("type") == "function" else tool


def wrapped_tool(tool: dict) -> dict:
    """A tool in the JSON-schema shape chat templates and most formats write: {"type": "function", "function": ...}."""
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def _dumps(value: Any, **kwargs) -> str:
    return json.dumps(value, ensure_ascii=False, **kwargs)


def _text_value(value: Any) -> str:
    """An argument value as XML-style formats write it: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else _dumps(value)


def _loads_or_text(raw: str, strip_text: bool = True) -> Any:
    try:
        return json.loads(raw.strip())
    except json.JSONDecodeError:
        return raw.strip() if strip_text else raw


def _arguments(call: FunctionCall) -> dict:
    return json.loads(call.arguments)


def _tagged_calls(opening: str, argument: str, closing: str) -> Callable[[list[FunctionCall]], str]:
    """The XML-style formats' call writer: per call an opening with its name, a piece per argument (strings as they
    are, anything else as JSON), a closing; calls one per line."""
    def write(calls: list[FunctionCall]) -> str:
        return "\n".join(opening.format(name=call.name) + "".join(
            argument.format(key=key, value=_text_value(value)) for key, value in _arguments(call).items()) + closing
            for call in calls)
    return write


# default: ReAct-style "Action:" lines
_DEFAULT_PROMPT = (
    "You have access to the following tools:\n{tool_text}"
    "Use the following format if using a tool:\n```\n"
    "Action: tool name (one of [{tool_names}])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{{"input": "hello world", "num_beams": 5}}```)\n```\n'
)


def _default_tools(tools: list[dict], today: str) -> str:
    tool_text, names = "", []
    for tool in tools:
        spec = _function(tool)
        params = spec.get("parameters") or {}
        lines = ""
        for name, param in (params.get("properties") or {}).items():
            required = ", required" if name in params.get("required", []) else ""
            enum = f", should be one of [{', '.join(map(str, param['enum']))}]" if param.get("enum") else ""
            items = f", where each item should be {param['items'].get('type', '')}" if param.get("items") else ""
            lines += f"  - {name} ({param.get('type', '')}{required}): {param.get('description', '')}{enum}{items}\n"
        tool_text += f"> Tool Name: {spec['name']}\nTool Description: {spec.get('description', '')}\nTool Args:\n{lines}\n"
        names.append(spec["name"])
    return _DEFAULT_PROMPT.format(tool_text=tool_text, tool_names=", ".join(names))


def _default_calls(calls: list[FunctionCall]) -> str:
    return "\n".join(f"Action: {name}\nAction Input: {arguments}" for name, arguments in calls)


_ACTION = re.compile(r"Action:\s*([a-zA-Z0-9_]+)\s*Action Input:\s*(.+?)(?=\s*Action:|\s*$)", re.DOTALL)


def _default_extract(text: str) -> str | list[FunctionCall]:
    calls = []
    for name, raw in _ACTION.findall(text):
        try:
            arguments = json.loads(raw.strip().strip('"').strip("`"))  # LLaMA-Factory strips '```', a set of one character
        except json.JSONDecodeError:
            return text
        calls.append(FunctionCall(name.strip(), _dumps(arguments)))
    return calls or text


# qwen (Qwen 2.5 / 3): JSON in <tool_call> tags; ling and glm4_moe share its prompt's shape
_QWEN_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}\n</tools>\n\n"
)
_QWEN_PROMPT = "\n\n" + _QWEN_TOOLS_HEAD + (
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_LING_PROMPT = _QWEN_PROMPT[2:] + "\ndetailed thinking off"
_GLM4_MOE_PROMPT = "\n\n" + _QWEN_TOOLS_HEAD + (
    "For each function call, output the function name and arguments within the following XML format:"
    "\n<tool_call>{{function-name}}\n<arg_key>{{arg-key-1}}</arg_key>\n<arg_value>{{arg-value-1}}</arg_value>"
    "\n<arg_key>{{arg-key-2}}</arg_key>\n<arg_value>{{arg-value-2}}</arg_value>\n...\n</tool_call>\n"
)


def _wrapped_lines(tools: list[dict]) -> str:
    return "".join("\n" + _dumps(wrapped_tool(tool)) for tool in tools)


def _qwen_calls(calls: list[FunctionCall]) -> str:
    return "\n".join(f"<tool_call>\n{_dumps({'name': c.name, 'arguments': _arguments(c)})}\n</tool_call>" for c in calls)


_QWEN_CALL = re.compile(r"<tool_call>(.+?)</tool_call>(?=\s*<tool_call>|\s*$)", re.DOTALL)


def _qwen_extract(text: str) -> str | list[FunctionCall]:
    calls = []
    for raw in _QWEN_CALL.findall(text):
        try:
            call = json.loads(raw.strip())
        except json.JSONDecodeError:
            return text
        if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
            return text
        calls.append(FunctionCall(call["name"], _dumps(call["arguments"])))
    return calls or text


_GLM4_MOE_CALL = re.compile(r"<tool_call>([^\n<]+)(.*?)(?=</tool_call>|<tool_call>|$)", re.DOTALL)
_GLM4_MOE_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm4_moe_extract(text: str) -> str | list[FunctionCall]:
    """GLM-4.5's `<tool_call>name` and key/value tags. LLaMA-Factory reads these with Qwen's JSON extractor, which
    finds no call in what its own glm4_moe writer writes; this reads what the writer (and the model) write."""
    calls = []
    for name, body in _GLM4_MOE_CALL.findall(text):
        arguments = {key.strip(): _loads_or_text(raw, False) for key, raw in _GLM4_MOE_ARG.findall(body)}
        calls.append(FunctionCall(name.strip(), _dumps(arguments)))
    return calls or text



# qwen3_5: XML function blocks
_QWEN35_PROMPT = (
    "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>{tool_text}"
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: "
    "an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)



_PARAMETER = re.compile(r"<parameter=(.*?)>(.*?)</parameter>", re.DOTALL)


def _function_blocks(pattern: re.Pattern, text: str, strip_text: bool) -> str | list[FunctionCall]:
    calls = []
    for name, block in pattern.findall(text):
        arguments = {key: _loads_or_text(raw, strip_text) for key, raw in _PARAMETER.findall(block.strip())}
        calls.append(FunctionCall(name.strip(), _dumps(arguments)))
    return calls or text


_QWEN35_CALL = re.compile(r"<tool_call>\s*<function=\s*([^\s<>]+)\s*(.*?)\s*</function>\s*</tool_call>", re.DOTALL)
_SEED_CALL = re.compile(r"<seed:tool_call>\s*<function=\s*([^\s<]+)\s*(.*?)\s*</function>\s*</seed:tool_call>",
                        re.DOTALL)


# seed_oss (Seed-OSS): the whole system turn's text, then XML function blocks
_SEED_PROMPT = (
    "system\nYou are Doubao, a helpful AI assistant. You may call one or more functions to assist with the user query."
    "Tool List:\nYou are authorized to use the following tools (described in JSON Schema format). Before performing "
    "any task, you must decide how to call them based on the descriptions and parameters of these tools.{tool_text}\n"
    "工具调用请遵循如下格式:\n<seed:tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>value_1"
    "</parameter>\n<parameter=example_parameter_2>This is the value for the second parameter\nthat can span\nmultiple "
    "lines</parameter>\n</function>\n</seed:tool_call>\n"
)



# glm4 (GLM-4 / ChatGLM3): its own Chinese system text; one call per turn, name then arguments
_GLM4_PROMPT = (
    "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱 AI 公司训练的语言模型 GLM-4 模型开发的，"
    "你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具{tool_text}"
)


def _glm4_tools(tools: list[dict], today: str) -> str:
    text = ""
    for tool in tools:
        spec = _function(tool)
        text += (f"\n\n## {spec['name']}\n\n{_dumps(spec, indent=4)}\n"
                 "在调用上述函数时，请使用 Json 格式表示调用的参数。")
    return _GLM4_PROMPT.format(tool_text=text)


def _glm4_calls(calls: list[FunctionCall]) -> str:
    if len(calls) > 1:
        raise ToolDataError(f"GLM-4's tool format writes one function call per turn; this turn has {len(calls)} "
                            "(split them into turns with their observations)")
    return f"{calls[0].name}\n{calls[0].arguments}"


def _glm4_extract(text: str) -> str | list[FunctionCall]:
    if "\n" not in text:
        return text
    name, raw = text.split("\n", maxsplit=1)
    try:
        arguments = json.loads(raw.strip())
    except json.JSONDecodeError:
        return text
    return [FunctionCall(name, _dumps(arguments))]


# llama3 (Llama 3.1+ JSON tool calling, tools in the system turn): the prompt carries the date
_LLAMA3_PROMPT = (
    "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
    "You have access to the following functions. To call a function, please respond with JSON for a function call. "
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}. '
    "Do not use variables.\n\n{tool_text}"
)


def _llama3_tools(tools: list[dict], today: str) -> str:
    text = "".join(_dumps(wrapped_tool(tool), indent=4) + "\n\n" for tool in tools)
    return _LLAMA3_PROMPT.format(date=today, tool_text=text)


def _llama3_calls(calls: list[FunctionCall]) -> str:
    objects = [{"name": c.name, "parameters": _arguments(c)} for c in calls]
    return _dumps(objects[0] if len(objects) == 1 else objects)


def _json_list_extract(key: str) -> Callable[[str], str | list[FunctionCall]]:
    """Answers that are one JSON call object or a list of them, the arguments under `key`."""
    def extract(text: str) -> str | list[FunctionCall]:
        try:
            parsed = json.loads(text.strip())
        except json.JSONDecodeError:
            return text
        items = parsed if isinstance(parsed, list) else [parsed]
        try:
            return [FunctionCall(item["name"], _dumps(item[key])) for item in items]
        except (KeyError, TypeError):
            return text
    return extract


# mistral (v0.3 and later): the tool list in [AVAILABLE_TOOLS], calls as a JSON list
def _mistral_tools(tools: list[dict], today: str) -> str:
    return "[AVAILABLE_TOOLS] " + _dumps([wrapped_tool(tool) for tool in tools]) + "[/AVAILABLE_TOOLS]"


def _mistral_calls(calls: list[FunctionCall]) -> str:
    return _dumps([{"name": c.name, "arguments": _arguments(c)} for c in calls])


# minimax1 (MiniMax-M1): JSON lines in <tool_calls>
_MINIMAX1_PROMPT = (
    "You are provided with these tools:\n<tools>\n{tool_text}</tools>\n\n"
    "If you need to call tools, please respond with <tool_calls></tool_calls> XML tags, and provide tool-name and "
    "json-object of arguments, following the format below:\n<tool_calls>\n"
    '{{"name": <tool-name-1>, "arguments": <args-json-object-1>}}\n...\n</tool_calls>'
)


def _minimax1_calls(calls: list[FunctionCall]) -> str:
    lines = [_dumps({"name": c.name, "arguments": _arguments(c)}) for c in calls]
    return "<tool_calls>\n" + "\n".join(lines) + "\n</tool_calls>"


def _minimax1_extract(text: str) -> str | list[FunctionCall]:
    block = re.search(r"<tool_calls>\s*(.+?)\s*</tool_calls>", text, re.DOTALL)
    if not block:
        return text
    calls = []
    for line in filter(None, (raw.strip() for raw in block.group(1).split("\n"))):
        try:
            call = json.loads(line)
            calls.append(FunctionCall(call["name"], _dumps(call["arguments"])))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return calls


# minimax2 (MiniMax-M2): XML invoke blocks
_MINIMAX2_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more tools to assist with the user query.\n"
    "Here are the tools available in JSONSchema format:\n\n<tools>\n{tool_text}</tools>\n\n"
    "When making tool calls, use XML format to invoke tools and pass parameters:\n"
    '\n<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n'
    '<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>'
)



def _minimax2_extract(text: str) -> str | list[FunctionCall]:
    """The invoke blocks inside `<minimax:tool_call>` (the model's own output), or bare ones: LLaMA-Factory's writer
    leaves the wrapper out, so a model tuned on its format answers without it."""
    block = re.search(r"<minimax:tool_call>\s*(.+?)\s*</minimax:tool_call>", text, re.DOTALL)
    calls = []
    for name, params in re.findall(r"<invoke name=\"(.*?)\">(.*?)</invoke>", block.group(1) if block else text,
                                   re.DOTALL):
        pairs = re.findall(r"<parameter name=\"(.*?)\">(.*?)</parameter>", params, re.DOTALL)
        calls.append(FunctionCall(name.strip(), _dumps({key: _loads_or_text(raw, False) for key, raw in pairs})))
    return calls if block else calls or text


# lfm2 (LFM2.5): a Python-call list between tool-call tokens
def _lfm2_tools(tools: list[dict], today: str) -> str:
    return f"List of tools: <|tool_list_start|>{_dumps([_function(tool) for tool in tools])}<|tool_list_end|>"


def _lfm2_calls(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        kwargs = [f'{key}="{value}"' if isinstance(value, str) else f"{key}={_dumps(value)}"
                  for key, value in _arguments(call).items()]
        texts.append(f"{call.name}({', '.join(kwargs)})")
    return f"<|tool_call_start|>[{', '.join(texts)}]<|tool_call_end|>"


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _lfm2_value(node: ast.AST) -> Any:
    if isinstance(node, ast.Name):
        if node.id not in _JSON_NAMES:
            raise ValueError(node.id)
        return _JSON_NAMES[node.id]
    return ast.literal_eval(node)


def _lfm2_extract(text: str) -> str | list[FunctionCall]:
    start = text.find("<|tool_call_start|>")
    end = text.find("<|tool_call_end|>", start)
    if start == -1 or end == -1:
        return text
    try:
        body = ast.parse(text[start + len("<|tool_call_start|>"):end].strip(), mode="eval").body
    except SyntaxError:
        return text
    nodes = body.elts if isinstance(body, ast.List) else [body]
    calls = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            return text
        try:
            arguments = {kw.arg: _lfm2_value(kw.value) for kw in node.keywords}
        except (ValueError, SyntaxError):
            return text
        calls.append(FunctionCall(node.func.id, _dumps(arguments)))
    return calls or text


# gemma4 (Gemma 4): declarations and calls in Gemma's own object notation, strings between <|"|> marks
_GEMMA_QUOTE = '<|"|>'


def _gemma_quoted(text: Any) -> str:
    return f"{_GEMMA_QUOTE}{text}{_GEMMA_QUOTE}"


def _gemma4_tools(tools: list[dict], today: str) -> str:
    def properties(props: dict) -> str:
        parts = []
        for name, schema in props.items():
            items = ([f"description:{_gemma_quoted(schema['description'])}"] if schema.get("description") else []) + (
                [f"type:{_gemma_quoted(str(schema['type']).upper())}"] if schema.get("type") else [])
            parts.append(f"{name}:{{{','.join(items)}}}")
        return ",".join(parts)

    declarations = []
    for tool in tools:
        spec = _function(tool)
        text = f"declaration:{spec['name']}{{description:{_gemma_quoted(spec.get('description', ''))}"
        params = spec.get("parameters")
        if params:
            parts = [f"properties:{{{properties(params['properties'])}}}"] if params.get("properties") else []
            if params.get("required"):
                parts.append(f"required:[{','.join(_gemma_quoted(item) for item in params['required'])}]")
            if params.get("type"):
                parts.append(f"type:{_gemma_quoted(str(params['type']).upper())}")
            text += f",parameters:{{{','.join(parts)}}}"
        response = spec.get("response")
        if response:
            parts = [f"description:{_gemma_quoted(response['description'])}"] if response.get("description") else []
            if str(response.get("type", "")).upper() == "OBJECT":
                parts.append(f"type:{_gemma_quoted('OBJECT')}")
            text += f",response:{{{','.join(parts)}}}"
        declarations.append(text + "}")
    return "\n".join(declarations)


def _gemma_value(value: Any, quote_keys: bool) -> str:
    if isinstance(value, str):
        return _gemma_quoted(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        items = [f"{_gemma_quoted(key) if quote_keys else key}:{_gemma_value(value[key], quote_keys)}"
                 for key in sorted(value)]
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_gemma_value(item, quote_keys) for item in value) + "]"
    return "null" if value is None else str(value)


def _gemma4_calls(calls: list[FunctionCall]) -> str:
    out = []
    for call in calls:
        arguments = _arguments(call)
        body = ",".join(f"{key}:{_gemma_value(arguments[key], False)}" for key in sorted(arguments))
        out.append(f"<|tool_call>call:{call.name}{{{body}}}<tool_call|>")
    return "".join(out)


def _gemma4_arguments(text: str) -> Any:
    text = text.strip()
    if not text:
        return {}
    normalized = re.sub(r"<\|\"\|\>(.*?)<\|\"\|\>", lambda m: _dumps(m.group(1)), "{" + text + "}", flags=re.DOTALL)
    normalized = re.sub(r"(^|[{\s,])([A-Za-z_][A-Za-z0-9_]*)(\s*:)", r'\1"\2"\3', normalized)
    for candidate in (normalized, text):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return text


def _gemma4_extract(text: str) -> str | list[FunctionCall]:
    matches = re.findall(r"<\|tool_call\>call:([^{\s]+)\{(.*?)\}<tool_call\|>", text, re.DOTALL)
    calls = []
    for name, block in matches:
        arguments = _gemma4_arguments(block)
        calls.append(FunctionCall(name.strip(), arguments if isinstance(arguments, str) else _dumps(arguments)))
    return calls or text


@dataclass(frozen=True)
class ToolFormat:
    tools: Callable[[list[dict], str], str]  # (tool list, today's date as "%d %b %Y") -> system text
    calls: Callable[[list[FunctionCall]], str]
    extract: Callable[[str], str | list[FunctionCall]]

    def tool_text(self, tools: str | list | None, today: str | None = None) -> str:
        """The system text for a row's tool list: "" for none (LLaMA-Factory's "[]" rows)."""
        specs = load_tools(tools)
        return self.tools(specs, today or tool_date()) if specs else ""


def _prompt_with_specs(prompt: str, render: Callable[[list[dict]], str]) -> Callable[[list[dict], str], str]:
    return lambda tools, today: prompt.format(tool_text=render(tools))


TOOL_FORMATS: dict[str, ToolFormat] = {
    "default": ToolFormat(_default_tools, _default_calls, _default_extract),
    "gemma4": ToolFormat(_gemma4_tools, _gemma4_calls, _gemma4_extract),
    "glm4": ToolFormat(_glm4_tools, _glm4_calls, _glm4_extract),
    "llama3": ToolFormat(_llama3_tools, _llama3_calls, _json_list_extract("parameters")),
    "lfm2": ToolFormat(_lfm2_tools, _lfm2_calls, _lfm2_extract),
    "minimax1": ToolFormat(_prompt_with_specs(_MINIMAX1_PROMPT, lambda ts: "".join(_dumps(_function(t)) + "\n"
                                                                                   for t in ts)),
                           _minimax1_calls, _minimax1_extract),
    "minimax2": ToolFormat(_prompt_with_specs(_MINIMAX2_PROMPT, lambda ts: "".join(
        "<tool>" + _dumps(_function(t)) + "</tool>\n" for t in ts)),
        _tagged_calls('<invoke name="{name}">', '\n<parameter name="{key}">{value}</parameter>', "\n</invoke>"),
        _minimax2_extract),
    "mistral": ToolFormat(_mistral_tools, _mistral_calls, _json_list_extract("arguments")),
    "qwen": ToolFormat(_prompt_with_specs(_QWEN_PROMPT, _wrapped_lines), _qwen_calls, _qwen_extract),
    "qwen3_5": ToolFormat(_prompt_with_specs(_QWEN35_PROMPT, lambda ts: "".join("\n" + _dumps(_function(t))
                                                                                for t in ts)),
                          _tagged_calls("<tool_call>\n<function={name}>", "\n<parameter={key}>\n{value}\n</parameter>",
                                        "\n</function>\n</tool_call>"), lambda text: _function_blocks(_QWEN35_CALL, text, strip_text=True)),
    "glm4_moe": ToolFormat(_prompt_with_specs(_GLM4_MOE_PROMPT, _wrapped_lines), _tagged_calls(
        "\n<tool_call>{name}", "\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>", ""), _glm4_moe_extract),
    "seed_oss": ToolFormat(_prompt_with_specs(_SEED_PROMPT, lambda ts: "\n" + _dumps(ts)),
                           _tagged_calls("\n<seed:tool_call>\n<function={name}", "\n<parameter={key}>{value}</parameter>",
                                         "\n</function>\n</seed:tool_call>"),
                           lambda text: _function_blocks(_SEED_CALL, text, strip_text=False)),
    "ling": ToolFormat(_prompt_with_specs(_LING_PROMPT, _wrapped_lines), _qwen_calls, _qwen_extract),
}


def tool_date(setting: str | None = None) -> str:
    """The date llama3's tool prompt writes ("%d %b %Y", as LLaMA-Factory): `tool_date` from the config, else today."""
    return setting or date.today().strftime("%d %b %Y")


def calls_as_json(calls: list[FunctionCall]) -> list[dict]:
    """Calls as OpenAI-style objects `{"name", "arguments"}` with the arguments parsed back where they are JSON."""
    return [{"name": c.name, "arguments": _loads_or_text(c.arguments)} for c in calls]

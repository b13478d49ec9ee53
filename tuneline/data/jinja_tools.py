"""Each tool format of `tools.py` as two jinja macros, `tool_text(tools)` and `tool_calls(calls)`, for the chat template
an export carries.

A served model is prompted by its chat template alone, so the template must write a tool list and a call exactly as
training wrote them. The prompts' fixed text is taken from `tools.py` itself (split around its fields), so the two
never drift; what varies per tool or per call is written here in jinja, against transformers' `tojson` (which is
`json.dumps(..., ensure_ascii=False)`, as the training writers). Calls arrive as OpenAI's `tool_calls`; their
`arguments` may be an object (transformers' convention) or JSON text (OpenAI's): text is written as it is where a
format writes the arguments as JSON, and refused where a format writes them key by key.
A format missing from `JINJA_TOOL_FORMATS` has no jinja writer: the generated template refuses tools, and the export
says so (`jinja_template.unwritable`)."""

from __future__ import annotations

from tuneline.data import tools as python_formats

_MARK = "\x00field\x00"


def literal(text: str) -> str:
    """A jinja string literal holding `text` exactly (jinja decodes backslash escapes in literals)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return "'" + escaped.replace("\t", "\\t") + "'"


def _around(prompt: str, **fields: str) -> list[str]:
    """The fixed pieces of a `str.format` prompt, between its fields in the order they stand."""
    marked = prompt.format(**{name: _MARK for name in fields})
    return marked.split(_MARK)


def _prompt(prompt: str, per_tool: str) -> str:
    """A tool_text macro for a prompt with one `{tool_text}` field made of `per_tool` (an expression of `tool`)."""
    head, tail = _around(prompt, tool_text="")
    return ("{%- macro tool_text(tools) -%}{{- " + literal(head) + " -}}{%- for tool in tools -%}{{- " + per_tool
            + " -}}{%- endfor -%}{{- " + literal(tail) + " -}}{%- endmacro -%}")


SPEC = "(tool.get('function', tool) if tool.get('type') == 'function' else tool)"
WRAPPED = "(tool if tool.get('type') == 'function' else {'type': 'function', 'function': tool})"
_FN = "{%- set fn = call.get('function', call) -%}"
_ARGS = "(fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson)"
_SEP = "{%- if not loop.first -%}{{- SEP -}}{%- endif -%}"
_KEYED = ("{%- if fn['arguments'] is string -%}{{- raise_exception('this tool format writes a call argument by argument: "
          "give tool_calls[].function.arguments as an object, not JSON text') -}}{%- endif -%}")
_VALUE = "(value if value is string else value | tojson)"


def _call_json(key: str) -> str:
    """`{"name": ..., "<key>": <arguments>}` as json.dumps writes it."""
    return "'{\"name\": ' ~ fn['name'] | tojson ~ ', \"" + key + "\": ' ~ " + _ARGS + " ~ '}'"


def _calls(each: str, sep: str = "\n", head: str = "", tail: str = "") -> str:
    """A tool_calls macro writing `each` (an expression of `fn`) per call, `sep` between, `head`/`tail` around."""
    return ("{%- macro tool_calls(calls) -%}{{- " + literal(head) + " -}}{%- for call in calls -%}" + _FN
            + _SEP.replace("SEP", literal(sep)) + "{{- " + each + " -}}{%- endfor -%}{{- " + literal(tail)
            + " -}}{%- endmacro -%}")


def _tagged(opening: str, argument: str, closing: str) -> str:
    """XML-style calls: `opening` with {name}, `argument` with {key} and {value} per argument, `closing`; one a line."""
    open_head, open_tail = opening.split("{name}")
    key_at, value_at = argument.index("{key}"), argument.index("{value}")
    pieces = (argument[:key_at], argument[key_at + 5:value_at], argument[value_at + 7:])
    return ("{%- macro tool_calls(calls) -%}{%- for call in calls -%}" + _FN + _KEYED
            + _SEP.replace("SEP", literal("\n")) + "{{- " + literal(open_head) + " ~ fn['name'] ~ " + literal(open_tail)
            + " -}}{%- for key, value in fn['arguments'].items() -%}{{- " + literal(pieces[0]) + " ~ key ~ "
            + literal(pieces[1]) + " ~ " + _VALUE + " ~ " + literal(pieces[2]) + " -}}{%- endfor -%}{{- "
            + literal(closing) + " -}}{%- endfor -%}{%- endmacro -%}")


def _default() -> str:
    head, middle, tail = _around(python_formats._DEFAULT_PROMPT, tool_text="", tool_names="")
    params = (
        "{%- set params = spec.get('parameters') or {} -%}"
        "{%- for name, param in (params.get('properties') or {}).items() -%}"
        "{{- '  - ' ~ name ~ ' (' ~ param.get('type', '') ~ (', required' if name in params.get('required', []) "
        "else '') ~ '): ' ~ param.get('description', '') -}}"
        "{%- if param.get('enum') -%}{{- ', should be one of [' ~ param['enum'] | map('string') | join(', ') ~ ']' -}}"
        "{%- endif -%}"
        "{%- if param.get('items') -%}{{- ', where each item should be ' ~ param['items'].get('type', '') -}}"
        "{%- endif -%}{{- '\\n' -}}{%- endfor -%}"
    )
    tool_text = ("{%- macro tool_text(tools) -%}{{- " + literal(head) + " -}}{%- for tool in tools -%}"
                 "{%- set spec = " + SPEC + " -%}"
                 "{{- '> Tool Name: ' ~ spec['name'] ~ '\\nTool Description: ' ~ spec.get('description', '') ~ "
                 "'\\nTool Args:\\n' -}}" + params + "{{- '\\n' -}}{%- endfor -%}{{- " + literal(middle) + " -}}"
                 "{%- for tool in tools -%}{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}{{- " + SPEC
                 + "['name'] -}}{%- endfor -%}{{- " + literal(tail) + " -}}{%- endmacro -%}")
    return tool_text + _calls("'Action: ' ~ fn['name'] ~ '\\nAction Input: ' ~ " + _ARGS)


def _llama3() -> str:
    head, middle, tail = _around(python_formats._LLAMA3_PROMPT, date="", tool_text="")
    tool_text = ("{%- macro tool_text(tools) -%}{{- " + literal(head) + " ~ today ~ " + literal(middle) + " -}}"
                 "{%- for tool in tools -%}{{- " + WRAPPED + " | tojson(indent=4) ~ '\\n\\n' -}}{%- endfor -%}"
                 "{{- " + literal(tail) + " -}}{%- endmacro -%}")
    calls = ("{%- macro tool_calls(calls) -%}{%- if calls | length > 1 -%}{{- '[' -}}{%- endif -%}"
             "{%- for call in calls -%}" + _FN + _SEP.replace("SEP", "', '") + "{{- " + _call_json("parameters")
             + " -}}{%- endfor -%}{%- if calls | length > 1 -%}{{- ']' -}}{%- endif -%}{%- endmacro -%}")
    return tool_text + calls


def _glm4() -> str:
    head, tail = _around(python_formats._GLM4_PROMPT, tool_text="")
    per_tool = ("'\\n\\n## ' ~ " + SPEC + "['name'] ~ '\\n\\n' ~ " + SPEC + " | tojson(indent=4) ~ "
                + literal("\n在调用上述函数时，请使用 Json 格式表示调用的参数。"))
    tool_text = ("{%- macro tool_text(tools) -%}{{- " + literal(head) + " -}}{%- for tool in tools -%}{{- " + per_tool
                 + " -}}{%- endfor -%}{{- " + literal(tail) + " -}}{%- endmacro -%}")
    calls = ("{%- macro tool_calls(calls) -%}{%- if calls | length > 1 -%}{{- raise_exception(\"GLM-4's tool format "
             "writes one function call per turn\") -}}{%- endif -%}{%- for call in calls -%}" + _FN
             + "{{- fn['name'] ~ '\\n' ~ " + _ARGS + " -}}{%- endfor -%}{%- endmacro -%}")
    return tool_text + calls


def _mistral() -> str:
    tool_text = ("{%- macro tool_text(tools) -%}{{- '[AVAILABLE_TOOLS] [' -}}{%- for tool in tools -%}"
                 "{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}{{- " + WRAPPED + " | tojson -}}{%- endfor -%}"
                 "{{- '][/AVAILABLE_TOOLS]' -}}{%- endmacro -%}")
    return tool_text + _calls(_call_json("arguments"), ", ", "[", "]")


def _lfm2() -> str:
    tool_text = ("{%- macro tool_text(tools) -%}{{- 'List of tools: <|tool_list_start|>[' -}}{%- for tool in tools -%}"
                 "{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}{{- " + SPEC + " | tojson -}}{%- endfor -%}"
                 "{{- ']<|tool_list_end|>' -}}{%- endmacro -%}")
    each = ("fn['name'] ~ '(' -}}{%- for key, value in fn['arguments'].items() -%}{%- if not loop.first -%}"
            "{{- ', ' -}}{%- endif -%}{{- key ~ ('=\"' ~ value ~ '\"' if value is string else '=' ~ value | tojson) -}}"
            "{%- endfor -%}{{- ')'")
    calls = ("{%- macro tool_calls(calls) -%}{{- '<|tool_call_start|>[' -}}{%- for call in calls -%}" + _FN + _KEYED
             + _SEP.replace("SEP", "', '") + "{{- " + each + " -}}{%- endfor -%}{{- ']<|tool_call_end|>' -}}"
             "{%- endmacro -%}")
    return tool_text + calls


_GEMMA_QUOTE = python_formats._GEMMA_QUOTE


def _quoted(expression: str) -> str:
    return f"{literal(_GEMMA_QUOTE)} ~ {expression} ~ {literal(_GEMMA_QUOTE)}"


def _gemma4() -> str:
    """Gemma 4's declarations and its object notation (keys sorted as Python sorts them, case first)."""
    value = (
        "{%- macro gemma_value(value) -%}"
        "{%- if value is string -%}{{- " + _quoted("value") + " -}}"
        "{%- elif value is boolean -%}{{- 'true' if value else 'false' -}}"
        "{%- elif value is mapping -%}{{- '{' -}}{%- for key, item in value | dictsort(true) -%}"
        "{%- if not loop.first -%}{{- ',' -}}{%- endif -%}{{- key ~ ':' ~ gemma_value(item) -}}{%- endfor -%}"
        "{{- '}' -}}"
        "{%- elif value is none -%}{{- 'null' -}}"
        "{%- elif value is iterable -%}{{- '[' -}}{%- for item in value -%}{%- if not loop.first -%}{{- ',' -}}"
        "{%- endif -%}{{- gemma_value(item) -}}{%- endfor -%}{{- ']' -}}"
        "{%- else -%}{{- value | string -}}{%- endif -%}{%- endmacro -%}"
    )
    upper_type = _quoted("(schema['type'] | string).upper()")
    props = (
        "{%- macro gemma_properties(props) -%}{%- for name, schema in props.items() -%}"
        "{%- if not loop.first -%}{{- ',' -}}{%- endif -%}{{- name ~ ':{' -}}"
        "{%- if schema.get('description') -%}{{- 'description:' ~ " + _quoted("schema['description']") + " -}}"
        "{%- endif -%}{%- if schema.get('type') -%}{{- (',' if schema.get('description') else '') ~ 'type:' ~ "
        + upper_type + " -}}{%- endif -%}{{- '}' -}}{%- endfor -%}{%- endmacro -%}"
    )
    params = (
        "{%- set params = spec.get('parameters') -%}{%- if params -%}{%- set ns = namespace(first=true) -%}"
        "{{- ',parameters:{' -}}"
        "{%- if params.get('properties') -%}{{- 'properties:{' ~ gemma_properties(params['properties']) ~ '}' -}}"
        "{%- set ns.first = false -%}{%- endif -%}"
        "{%- if params.get('required') -%}{{- ('' if ns.first else ',') ~ 'required:[' -}}"
        "{%- for item in params['required'] -%}{%- if not loop.first -%}{{- ',' -}}{%- endif -%}{{- "
        + _quoted("item") + " -}}{%- endfor -%}{{- ']' -}}{%- set ns.first = false -%}{%- endif -%}"
        "{%- if params.get('type') -%}{{- ('' if ns.first else ',') ~ 'type:' ~ "
        + _quoted("(params['type'] | string).upper()") + " -}}{%- endif -%}{{- '}' -}}{%- endif -%}"
    )
    response = (
        "{%- set response = spec.get('response') -%}{%- if response -%}{{- ',response:{' -}}"
        "{%- if response.get('description') -%}{{- 'description:' ~ " + _quoted("response['description']")
        + " -}}{%- endif -%}{%- if (response.get('type', '') | string).upper() == 'OBJECT' -%}"
        "{{- (',' if response.get('description') else '') ~ 'type:' ~ " + _quoted("'OBJECT'") + " -}}{%- endif -%}"
        "{{- '}' -}}{%- endif -%}"
    )
    tool_text = ("{%- macro tool_text(tools) -%}{%- for tool in tools -%}{%- set spec = " + SPEC + " -%}"
                 "{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}"
                 "{{- 'declaration:' ~ spec['name'] ~ '{description:' ~ " + _quoted("spec.get('description', '')")
                 + " -}}" + params + response + "{{- '}' -}}{%- endfor -%}{%- endmacro -%}")
    calls = ("{%- macro tool_calls(calls) -%}{%- for call in calls -%}" + _FN + _KEYED
             + "{{- '<|tool_call>call:' ~ fn['name'] ~ '{' -}}{%- for key, value in fn['arguments'] | dictsort(true) -%}"
             "{%- if not loop.first -%}{{- ',' -}}{%- endif -%}{{- key ~ ':' ~ gemma_value(value) -}}{%- endfor -%}"
             "{{- '}<tool_call|>' -}}{%- endfor -%}{%- endmacro -%}")
    return value + props + tool_text + calls


def _qwen_calls() -> str:
    return _calls("'<tool_call>\\n' ~ " + _call_json("arguments") + " ~ '\\n</tool_call>'")


JINJA_TOOL_FORMATS: dict[str, str] = {
    "default": _default(),
    "gemma4": _gemma4(),
    "glm4": _glm4(),
    "llama3": _llama3(),
    "lfm2": _lfm2(),
    "minimax1": _prompt(python_formats._MINIMAX1_PROMPT, SPEC + " | tojson ~ '\\n'")
    + _calls(_call_json("arguments"), "\n", "<tool_calls>\n", "\n</tool_calls>"),
    "minimax2": _prompt(python_formats._MINIMAX2_PROMPT, "'<tool>' ~ " + SPEC + " | tojson ~ '</tool>\\n'")
    + _tagged('<invoke name="{name}">', '\n<parameter name="{key}">{value}</parameter>', "\n</invoke>"),
    "mistral": _mistral(),
    "qwen": _prompt(python_formats._QWEN_PROMPT, "'\\n' ~ " + WRAPPED + " | tojson") + _qwen_calls(),
    "qwen3_5": _prompt(python_formats._QWEN35_PROMPT, "'\\n' ~ " + SPEC + " | tojson")
    + _tagged("<tool_call>\n<function={name}>", "\n<parameter={key}>\n{value}\n</parameter>",
              "\n</function>\n</tool_call>"),
    "glm4_moe": _prompt(python_formats._GLM4_MOE_PROMPT, "'\\n' ~ " + WRAPPED + " | tojson")
    + _tagged("\n<tool_call>{name}", "\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>", ""),
    "seed_oss": "{%- macro tool_text(tools) -%}{{- " + " ~ '\\n' ~ tools | tojson ~ ".join(
        literal(piece) for piece in _around(python_formats._SEED_PROMPT, tool_text="")) + " -}}{%- endmacro -%}"
    + _tagged("\n<seed:tool_call>\n<function={name}", "\n<parameter={key}>{value}</parameter>",
              "\n</function>\n</seed:tool_call>"),
    "ling": _prompt(python_formats._LING_PROMPT, "'\\n' ~ " + WRAPPED + " | tojson") + _qwen_calls(),
}


def refusing_tools(reason: str) -> str:
    """Macros for a format with no jinja writer: any tool list or call stops the render with `reason`."""
    stop = "{{- raise_exception(" + literal(reason) + ") -}}"
    return ("{%- macro tool_text(tools) -%}" + stop + "{%- endmacro -%}{%- macro tool_calls(calls) -%}" + stop
            + "{%- endmacro -%}")

"""Rows in alpaca or sharegpt format -> one standard example, or the reason the row is bad.

A standard example is `{"_prompt", "_response", "_system", "_tools", "_kto_tag", "_images", "_videos", "_file",
"_row"}`; pairwise data has [chosen, rejected] as `_response`. `_images`/`_videos` are lists of absolute file paths,
empty for a text row, so text and media rows mix. `_file`/`_row` travel along for checks that can only run after
tokenization."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuneline.data.media import MEDIA_KINDS, MediaChecker, MediaProblem, check_count, row_media
from tuneline.data.readers import BadRow, Row
from tuneline.data.registry import DatasetAttr
from tuneline.data.tools import ToolDataError, check_call_content, load_tools
from tuneline.errors import DataError

PROMPT_ROLES = ("user", "observation")
ANSWER_ROLES = ("assistant", "function")


class _Bad(Exception):
    def __init__(self, reason: str, column: str | None = None, detail: str = ""):
        super().__init__(reason)
        self.reason, self.column, self.detail = reason, column, detail


def check_stage(attr: DatasetAttr, stage: str) -> None:
    """Dataset-level fit between an entry and the stage (row checks come later)."""
    pairwise = stage in ("rm", "dpo")
    if pairwise and not attr.ranking:
        raise DataError(f"dataset '{attr.name}': stage '{stage}' needs preference pairs; set \"ranking\": true and "
                        "the 'chosen'/'rejected' columns in its dataset_info.json entry")
    if not pairwise and attr.ranking:
        raise DataError(f"dataset '{attr.name}' is a ranking dataset; stage '{stage}' cannot use it (use rm or dpo)")
    if pairwise and not (attr.chosen and attr.rejected):
        raise DataError(f"dataset '{attr.name}': a ranking entry needs columns 'chosen' and 'rejected'")
    if stage == "kto" and not attr.kto_tag:
        raise DataError(f"dataset '{attr.name}': stage 'kto' needs a boolean label column: set columns.kto_tag")
    needed = NEEDED_COLUMNS.get((attr.formatting, "pairwise" if pairwise else stage), ())
    missing = [key for key in needed if not getattr(attr, key)]
    if missing:
        raise DataError(f"dataset '{attr.name}': stage '{stage}' needs columns {missing} in its dataset_info.json "
                        "entry (an entry that lists 'columns' uses only those it lists, as in LLaMA-Factory)")


NEEDED_COLUMNS = {  # (formatting, stage) -> columns an entry must name; pairwise stages check chosen/rejected above
    ("alpaca", "sft"): ("response",), ("alpaca", "kto"): ("response",),
    ("sharegpt", "sft"): ("messages",), ("sharegpt", "kto"): ("messages",), ("sharegpt", "pairwise"): ("messages",),
    ("sharegpt", "ppo"): ("messages",), ("sharegpt", "grpo"): ("messages",), ("sharegpt", "rloo"): ("messages",),
    ("sharegpt", "pt"): ("messages",),
}


def convert_rows(attr: DatasetAttr, rows: list[Row], stage: str,
                 media_dir: str | Path) -> tuple[list[dict], list[BadRow]]:
    """Standard examples and bad rows; `media_dir` is where relative media paths start."""
    convert = CONVERTERS[attr.formatting]
    examples, bad = [], []
    checker = MediaChecker()
    for row in rows:
        try:
            example = convert(attr, row.data, stage)
            example.update(_media(attr, row.data, example, stage, Path(media_dir), checker))
        except _Bad as exc:
            bad.append(BadRow(row.file, row.row, exc.reason, exc.column, exc.detail))
            continue
        example.update(_file=row.file, _row=row.row)
        examples.append(example)
    return examples, bad


def _media(attr: DatasetAttr, data: dict, example: dict, stage: str, root: Path, checker: MediaChecker) -> dict:
    """`_images`/`_videos` of a converted row: placeholders counted against the media, then each file checked."""
    response = example["_response"]
    pairwise = stage in ("rm", "dpo")
    sequences = [example["_prompt"] + [answer] for answer in response] if pairwise else [
        example["_prompt"] + response]
    media = {}
    for kind in MEDIA_KINDS:
        column = getattr(attr, kind)
        paths: list[str] = []
        if column:
            try:
                paths = row_media(data.get(column), kind, root)
                check_count(sequences, paths, kind)
                checker.check(paths, kind)
            except MediaProblem as exc:
                raise _Bad(exc.reason, column, exc.detail) from None
        media[f"_{kind}"] = paths
    return media


def _value(data: dict, column: str | None, types: tuple, required: bool = False) -> Any:
    if not column:
        return None
    if column not in data:
        if required:
            raise _Bad("missing column", column, f"the row has no '{column}' (it has {sorted(data)[:8]})")
        return None
    value = data[column]
    if value is None:  # JSON null, or a CSV row with too few fields
        if required:
            raise _Bad("missing column", column, f"'{column}' is null")
        return None
    if not isinstance(value, types):
        names = "/".join(t.__name__ for t in types)
        raise _Bad("wrong type", column, f"expected {names}, got {type(value).__name__}")
    return value


def _text(data: dict, column: str | None, required: bool = True, empty_reason: str = "empty response") -> str:
    value = _value(data, column, (str,), required=required)
    if required and not (value or "").strip():
        raise _Bad(empty_reason, column, "the text is empty")
    return value or ""


def _tools(data: dict, column: str | None) -> str:
    """The row's tool list as JSON text, kept as written when it is text ("[]": none, as LLaMA-Factory reads it)."""
    value = _value(data, column, (str, list, dict))
    try:
        load_tools(value)
    except ToolDataError as exc:
        raise _Bad("bad tool list", column, str(exc)) from None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else (value or "")


def _check_tool_turns(messages: list[dict], column: str | None) -> None:
    """Every function message holds calls a template can write, and every observation answers a call."""
    for i, message in enumerate(messages):
        if message["role"] == "function":
            try:
                check_call_content(message["content"])
            except ToolDataError as exc:
                raise _Bad("bad function call", column, f"message {i + 1}: {exc}") from None
        elif message["role"] == "observation" and (i == 0 or messages[i - 1]["role"] != "function"):
            raise _Bad("observation without a call", column,
                       f"message {i + 1} is a tool's result, but the message before it is not a function call")


def _kto_tag(attr: DatasetAttr, data: dict, stage: str) -> bool | None:
    if stage != "kto":
        return None
    return _value(data, attr.kto_tag, (bool,), required=True)


def _msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def _distinct_pair(attr: DatasetAttr, chosen: dict, rejected: dict) -> list[dict]:
    """[chosen, rejected]; a pair whose answers are the same text teaches nothing and is a bad row."""
    if chosen["content"].strip() == rejected["content"].strip():
        raise _Bad("chosen equals rejected", attr.rejected, f"both answers are {chosen['content'][:40]!r}")
    return [chosen, rejected]


# --- alpaca
def _alpaca_history(attr: DatasetAttr, data: dict) -> list[dict]:
    history = _value(data, attr.history, (list,))
    out = []
    for turn in history or []:
        if not (isinstance(turn, (list, tuple)) and len(turn) == 2 and all(isinstance(t, str) for t in turn)):
            raise _Bad("wrong type", attr.history, "each history turn must be a [prompt, response] pair of strings")
        out += [_msg("user", turn[0]), _msg("assistant", turn[1])]
    return out


def convert_alpaca(attr: DatasetAttr, data: dict, stage: str) -> dict:
    prompt_text = _value(data, attr.prompt, (str,), required=bool(attr.prompt)) or ""
    query = _value(data, attr.query, (str,)) or ""
    user = "\n".join(t for t in (prompt_text, query) if t)
    if stage == "pt" and not user.strip():
        raise _Bad("empty text", attr.prompt, "the text is empty")
    prompt = _alpaca_history(attr, data) + [_msg("user", user)]
    response: list[dict] = []
    if stage in ("rm", "dpo"):
        chosen, rejected = _text(data, attr.chosen), _text(data, attr.rejected)
        response = _distinct_pair(attr, _msg("assistant", chosen), _msg("assistant", rejected))
    elif stage in ("sft", "kto"):
        response = [_msg("assistant", _text(data, attr.response))]
    elif stage in ("ppo", "grpo", "rloo"):  # grpo, rloo: the answer, when there is one, is the rewards' solution
        answer = _value(data, attr.response, (str,))
        response = [_msg("assistant", answer)] if answer else []
    return {"_prompt": prompt, "_response": response, "_system": _value(data, attr.system, (str,)) or "",
            "_tools": _tools(data, attr.tools), "_kto_tag": _kto_tag(attr, data, stage)}


# --- sharegpt
def _sharegpt_message(attr: DatasetAttr, message: Any, column: str) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise _Bad("wrong type", column, f"each message must be an object, got {type(message).__name__}")
    if attr.role_tag not in message or attr.content_tag not in message:
        raise _Bad("missing column", column, f"a message lacks '{attr.role_tag}' or '{attr.content_tag}'")
    content = message[attr.content_tag]
    if not isinstance(content, str):
        raise _Bad("wrong type", column, f"'{attr.content_tag}' must be a string, got {type(content).__name__}")
    return message[attr.role_tag], content


def _role_map(attr: DatasetAttr) -> dict[str, str]:
    return {attr.user_tag: "user", attr.assistant_tag: "assistant", attr.observation_tag: "observation",
            attr.function_tag: "function", attr.system_tag: "system"}


def _aligned(attr: DatasetAttr, data: dict) -> tuple[list[dict], str]:
    column = attr.messages
    raw = _value(data, column, (list,), required=True)
    roles = _role_map(attr)
    pairs = [_sharegpt_message(attr, m, column) for m in raw]
    system = _value(data, attr.system, (str,)) or ""
    if pairs and pairs[0][0] == attr.system_tag:
        system, pairs = pairs[0][1], pairs[1:]
    messages = []
    for i, (tag, content) in enumerate(pairs):
        allowed = PROMPT_ROLES if i % 2 == 0 else ANSWER_ROLES
        if roles.get(tag) not in allowed:
            want = " or ".join(k for k, v in roles.items() if v in allowed)
            raise _Bad("roles out of order", column, f"message {i + 1} has role '{tag}' where {want} belongs")
        messages.append(_msg(roles[tag], content))
    if not messages:
        raise _Bad("empty response", column, "the conversation has no messages")
    _check_tool_turns(messages, column)
    return messages, system


def _pair_answer(attr: DatasetAttr, data: dict, column: str) -> dict:
    value = _value(data, column, (dict,), required=True)
    tag, content = _sharegpt_message(attr, value, column)
    role = _role_map(attr).get(tag)
    if role not in ANSWER_ROLES:
        raise _Bad("roles out of order", column, f"a chosen/rejected answer must have an assistant role, not '{tag}'")
    if not content.strip():
        raise _Bad("empty response", column, "the text is empty")
    if role == "function":
        _check_tool_turns([_msg(role, content)], column)
    return _msg(role, content)


def convert_sharegpt(attr: DatasetAttr, data: dict, stage: str) -> dict:
    messages, system = _aligned(attr, data)
    ends_with_answer = len(messages) % 2 == 0
    if stage in ("rm", "dpo"):
        if ends_with_answer:
            raise _Bad("roles out of order", attr.messages, "a ranking conversation must end with a user turn")
        chosen, rejected = _pair_answer(attr, data, attr.chosen), _pair_answer(attr, data, attr.rejected)
        prompt, response = messages, _distinct_pair(attr, chosen, rejected)
    elif ends_with_answer:
        prompt, response = messages[:-1], messages[-1:]
        if stage in ("sft", "kto") and not response[0]["content"].strip():
            raise _Bad("empty response", attr.messages, "the last answer is empty")
    elif stage in ("ppo", "grpo", "rloo", "pt"):
        prompt, response = messages, []
    else:
        raise _Bad("roles out of order", attr.messages, "the conversation must end with an assistant turn")
    return {"_prompt": prompt, "_response": response, "_system": system, "_tools": _tools(data, attr.tools),
            "_kto_tag": _kto_tag(attr, data, stage)}


CONVERTERS = {"alpaca": convert_alpaca, "sharegpt": convert_sharegpt}

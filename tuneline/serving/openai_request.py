"""An OpenAI chat-completion request read into what `Chat.prepare` takes, and errors as OpenAI writes them.

Messages keep OpenAI's roles until `tuneline.serving.mlflow_model.conversation` maps them to the template's (an assistant's
`tool_calls` become a function message, a `tool` message an observation), as the MLflow model reads them. Content
given as parts keeps its order: an image part becomes an `<image>` placeholder where it stands, its picture read by
the same reader as `tuneline chat --image` (base64 or a data URI, or a path inside SAFE_MEDIA_PATH; never a URL)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuneline.data.media import IMAGE_PLACEHOLDER
from tuneline.errors import UserError


class ApiError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class ChatRequest:
    """The parts of a request an answer depends on."""

    messages: list[dict]
    system: str | None
    tools: list | None
    images: list = field(default_factory=list)
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)


def read_request(body, model_id: str) -> ChatRequest:
    """The request, or ApiError naming the field that is wrong (404 for a model this server does not serve)."""
    from tuneline.serving.mlflow_model import conversation

    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    if body.get("model") != model_id:
        raise ApiError(404, f"the model '{body.get('model')}' does not exist; this server serves '{model_id}'",
                       param="model", code="model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise bad_request("'messages' must be a non-empty list of message objects", param="messages")
    if (body.get("n") or 1) != 1:
        raise bad_request("only one choice is generated per request ('n': 1)", param="n")
    images: list = []
    flat = [_flat_message(message, i, images) for i, message in enumerate(messages)]
    try:
        flat, system = conversation({"messages": flat})
    except UserError as exc:
        raise bad_request("; ".join(exc.problems), param="messages") from None
    tools = body.get("tools") or None
    if tools is not None and body.get("tool_choice") == "none":
        tools = None
    return ChatRequest(flat, system, tools, images, bool(body.get("stream")), **_sampling(body))


def _flat_message(message: dict, index: int, images: list) -> dict:
    """The message with list content made text: text parts joined, an image part a placeholder, its image read."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    text = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "image_url":
            images.append(_image(part.get("image_url"), f"messages[{index}].content[{j}]"))
            text.append(IMAGE_PLACEHOLDER)
        else:
            raise bad_request(f"messages[{index}].content[{j}] must be a text or image_url part, got {kind!r}",
                              param=f"messages[{index}].content")
    return {**message, "content": "".join(text)}


def _image(image_url, where: str):
    from tuneline.data.mm.request_images import read_image
    from tuneline.serving.mlflow_model import request_paths

    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    try:
        return read_image(url, where, request_paths())
    except UserError as exc:
        raise bad_request("; ".join(exc.problems), param=where, code="invalid_image") from None


def _sampling(body: dict) -> dict:
    """max_tokens (or max_completion_tokens), temperature, top_p, stop and logit_bias, each checked."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad_request(f"'max_tokens' must be a positive integer, got {max_tokens!r}", param="max_tokens")
    numbers = {}
    for key, low, high in (("temperature", 0, 2), ("top_p", 0, 1)):
        value = body.get(key)
        if value is not None and (not isinstance(value, (int, float)) or not low <= value <= high):
            raise bad_request(f"'{key}' must be a number from {low} to {high}, got {value!r}", param=key)
        numbers[key] = value
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a string or a list of strings", param="stop")
    return {"max_tokens": max_tokens, "stop": stop, "logit_bias": _logit_bias(body.get("logit_bias")), **numbers}


def _logit_bias(given) -> dict[int, float]:
    """OpenAI's `logit_bias`: token id (as text) to a bias from -100 to 100 added to its logit."""
    try:
        bias = {int(token): float(value) for token, value in (given or {}).items()}
    except (AttributeError, TypeError, ValueError):
        bias = None
    if bias is None or not all(-100 <= value <= 100 for value in bias.values()):
        raise bad_request(f"'logit_bias' must map token ids to numbers from -100 to 100, got {given!r}",
                          param="logit_bias")
    return bias

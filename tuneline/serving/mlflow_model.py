"""What `mlflow.pyfunc.load_model` and `mlflow models serve` run to answer with a registered tuneline model
(docs/serving-and-hub.md).

Answers come from `tuneline.serving.chat.Chat`, so a served model prompts with its training template. MLflow's transformers
flavour was not used: its pyfunc prompts with the tokenizer's chat template (not always the training template) and
cannot stack a LoRA adapter on the adapters it was trained on top of."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tuneline.errors import UserError

INPUT_HELP = ("each input row needs 'messages' (a list of {role, content}, a leading system message allowed) or "
              "'prompt' (a string), and may set 'system' (a string), 'tools' (a list of tool objects) and 'images' "
              "(a list of base64 texts or paths inside SAFE_MEDIA_PATH, one per <image> in the messages)")
ANSWER_TURNS, QUESTION_TURNS = ("assistant", "function"), ("user", "observation")
OPENAI_ROLES = {"tool": "observation"}
SAFE_MEDIA_PATH = "SAFE_MEDIA_PATH"  # the folder whose image files requests may name


def _load_pyfunc(data_path: str, model_config: dict | None = None) -> ServedChat:
    """MLflow's loader-module entry point: `data_path` is the trained folder, `model_config` the run's config."""
    from tuneline.config import load_config
    from tuneline.serving.chat import Chat

    config = load_config(None, dict(model_config or {}), check_paths=False)
    folder = Path(data_path)
    _check_base_reachable(config, folder)
    return ServedChat(Chat(config, model_folder=folder))


def _check_base_reachable(config, folder: Path) -> None:
    """An adapter on a base that was a local folder when it trained, and is not here: say how to point at it."""
    from tuneline.evaluation.loading import ADAPTER_CONFIG

    base = str(config.model.model_name_or_path)
    if (folder / ADAPTER_CONFIG).is_file() and Path(base).is_absolute() and not Path(base).exists():
        raise UserError(f"this model is a LoRA adapter on the base '{base}', which is not on this machine; pass its "
                        "new place as model_config={'model_name_or_path': ...} to mlflow.pyfunc.load_model, or set "
                        "MLFLOW_PYFUNC_INFERENCE_CONFIG='{\"model_name_or_path\": \"...\"}' for mlflow models serve",
                        title="cannot load the registered model")


def conversation(row: dict) -> tuple[list[dict], str | None]:
    """(messages, system) of one input row: its `messages`, or its `prompt` as the one user message."""
    messages, prompt, system = row.get("messages"), row.get("prompt"), row.get("system")
    system = system if isinstance(system, str) else None  # an absent column reads as NaN
    if messages is not None and hasattr(messages, "__len__") and not isinstance(messages, str):
        messages = [dict(message) for message in messages]
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        raise UserError(f"{INPUT_HELP}; got {sorted(row)}", title="cannot answer")
    if messages and messages[0].get("role") == "system":
        first = messages.pop(0)["content"]
        system = system if system is not None else first
    messages = [_template_message(message) for message in messages]
    _check_turns(messages)
    return messages, system


def row_tools(row: dict) -> list | str | None:
    """The row's tool list as given (None when it has none: an absent column reads as NaN)."""
    tools = row.get("tools")
    if tools is None or (isinstance(tools, float) and math.isnan(tools)):
        return None
    return tools.tolist() if hasattr(tools, "tolist") else tools  # MLflow may hand a list over as a numpy array


def request_paths():
    """The image files a request may name: those inside SAFE_MEDIA_PATH (LLaMA-Factory's API reads the same
    variable), none when it is unset."""
    from tuneline.data.mm.request_images import LocalPaths

    root = os.environ.get(SAFE_MEDIA_PATH)
    return LocalPaths(any_path=False, root=Path(root) if root else None, setting=SAFE_MEDIA_PATH)


def row_images(row: dict) -> list:
    """The row's images decoded (a path inside SAFE_MEDIA_PATH, or base64 text or a data URI), each checked; [] for
    none."""
    from tuneline.data.mm.request_images import read_image

    images = row.get("images")
    if images is None or (isinstance(images, float) and math.isnan(images)):
        return []
    images = images.tolist() if hasattr(images, "tolist") else images  # MLflow may hand a numpy array over
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list):
        raise UserError(f"'images' must be a list of image paths or base64 texts; got {type(images).__name__}",
                        title="cannot answer")
    paths = request_paths()
    return [read_image(image, f"image {i + 1} of the request's 'images'", paths) for i, image in enumerate(images)]


def _template_message(message: dict) -> dict:
    """A message in the template's roles: an OpenAI assistant message with `tool_calls` is a function message
    holding the calls' JSON, a `tool` message an observation."""
    role, calls = message.get("role"), message.get("tool_calls")
    if role == "assistant" and calls is not None and len(calls):
        return {"role": "function", "content": json.dumps([_call(call) for call in calls], ensure_ascii=False)}
    content = message.get("content")
    if not isinstance(content, str):
        raise UserError(f"a '{role}' message needs 'content' (a string); got {content!r}", title="cannot answer")
    return {"role": OPENAI_ROLES.get(role, role), "content": content}


def _call(call: dict) -> dict:
    """One OpenAI tool call, `{"function": {"name", "arguments": JSON text}}`, as the `{"name", "arguments"}` a
    function message holds."""
    function = call.get("function") or call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise UserError(f"the arguments of the tool call '{function.get('name')}' are not JSON ({exc.msg})",
                            title="cannot answer") from None
    return {"name": function.get("name"), "arguments": arguments}


def _check_turns(messages: list[dict]) -> None:
    """Turns alternate as the template writes them (LLaMA-Factory's API checks the same): a question (user or
    observation), an answer (assistant or function), ..., ending on a question."""
    for i, message in enumerate(messages):
        allowed = ANSWER_TURNS if i % 2 else QUESTION_TURNS
        if message["role"] not in allowed:
            raise UserError(f"message {i + 1} is a '{message['role']}' message where one of {list(allowed)} comes "
                            "(turns alternate, a question first and last; several tool results go in one message)",
                            title="cannot answer")
    if not messages or len(messages) % 2 == 0:
        raise UserError("the conversation must end on a user or tool message, which the answer follows",
                        title="cannot answer")


class ServedChat:
    """The pyfunc model: per input row, the answer's text and the tool calls it makes."""

    def __init__(self, chat):
        self.chat = chat

    def get_raw_model(self):
        """The loaded `Chat`, as `mlflow.pyfunc.load_model(uri).get_raw_model()` hands it out (`tuneline api
        models:/NAME@ALIAS` serves it)."""
        return self.chat

    def predict(self, model_input, params=None) -> list[dict]:
        if hasattr(model_input, "to_dict"):  # MLflow's schema check hands over a DataFrame of the known columns
            if not {"messages", "prompt"} & set(model_input.columns):
                raise UserError(f"{INPUT_HELP}; got none of them", title="cannot answer")
            rows = model_input.to_dict(orient="records")
        else:
            rows = list(model_input)
        return [self._answer(row) for row in rows]

    def _answer(self, row: dict) -> dict:
        messages, system = conversation(row)
        answer = self.chat.respond(messages, system, tools=row_tools(row), tools_source="the request's 'tools'",
                                   images=row_images(row))
        return {"answer": answer.text, "tool_calls": answer.calls}

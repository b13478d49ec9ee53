"""`tuneline chat CONFIG [--tools tools.json] [--image PATH ...]`: talk to the trained model through its training
template, as `llamafactory-cli chat` does; the user plays the tools, and a vision-language model sees the images
attached with `--image` or `/image PATH` (docs/serving-and-hub.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from tuneline.config import RunConfig
from tuneline.data.media import IMAGE_PLACEHOLDER
from tuneline.data.tools import ToolDataError, calls_as_json, load_tools
from tuneline.errors import ConfigError, UserError
from tuneline.export.trained_model import trained_model_config

CLEAR, EXIT, IMAGE = "clear", "exit", "/image"
TOOLS_TITLE = "cannot use the tool list"


class Answer(NamedTuple):
    """A generated answer: its text as decoded, and the tool calls it makes, `{"name", "arguments"}` with the
    arguments parsed where they are JSON ([] when it makes none, or when no tools were offered)."""

    text: str
    calls: list[dict]


def tool_specs(tools, where: str) -> list[dict]:
    """A tool list given as a list of specs (plain, or {"type": "function", "function": {...}}) or as JSON text of
    one, checked; [] for none. UserError naming `where` and what is wrong otherwise."""
    try:
        return load_tools(tools)
    except ToolDataError as exc:
        raise UserError(f"{where}: {exc}", title=TOOLS_TITLE) from None


def read_tools(path: str | Path) -> list[dict]:
    """The tool list in the JSON file `path`, read before the model loads, so that a bad file costs no loading."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}", title=TOOLS_TITLE) from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; it must hold a JSON list of tools", title=TOOLS_TITLE) from None
    if not text.strip():
        raise UserError(f"{path}: the file is empty; it must hold a JSON list of tools", title=TOOLS_TITLE)
    return tool_specs(text, str(path))


def calls_line(calls: list[dict]) -> str:
    return f"Tool calls: {json.dumps(calls, ensure_ascii=False)}"


class Chat:
    """A loaded model and its template; `respond` answers the conversation so far. The tool list is checked before the
    model loads, so a list the template cannot write fails fast."""

    def __init__(self, config: RunConfig, scratch: Path | None = None, model_folder: Path | None = None,
                 tools: list | str | None = None, tools_source: str = "the tool list", images: bool = False):
        from tuneline.data import run_template
        from tuneline.evaluation.generation import eos_token_ids
        from tuneline.evaluation.loading import load_eval_model
        from tuneline.evaluation.prediction import generation_config
        from tuneline.model.tokenizer import load_tokenizer

        if config.stage == "rm":
            raise ConfigError("'stage: rm' trains a reward model, which scores answers and writes none; chat with the "
                              "config of a model trained to answer (pt, sft, dpo, kto, ppo)")
        loading, self.source = trained_model_config(config, scratch, model_folder)
        self.tokenizer = load_tokenizer(loading.model)
        data = config.data
        self.template = run_template(data, self.tokenizer)
        self.tools = self.prompt_tools(tools, tools_source)
        self.vision, self.no_images = answer_vision(loading, self.tokenizer, self.template)
        if images:  # refused before the model loads
            self.check_images()
        self.model = load_eval_model(loading, self.tokenizer, None)
        self.eos_ids = eos_token_ids(self.tokenizer, self.model) | self._stop_word_ids()
        self.settings = generation_config(config, self.tokenizer, self.eos_ids)
        self.skip_special_tokens = config.generating.skip_special_tokens

    def _stop_word_ids(self) -> set[int]:
        """The template's stop words that are single tokens end an answer too, as the model's turn ends there."""
        vocab = self.tokenizer.get_vocab()
        return {vocab[word] for word in self.template.stop_words if word in vocab}

    def prompt_tools(self, tools, where: str) -> str | None:
        """The JSON text of a tool list as templates take it (None for none), written into a prompt once here so that a
        list the template cannot write is refused before anything is generated."""
        specs = tool_specs(tools, where)
        if not specs:
            return None
        text = json.dumps(specs, ensure_ascii=False)
        probe = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
        try:
            self.template.encode_oneturn(self.tokenizer, probe, None, text)
        except (ToolDataError, AttributeError, KeyError, TypeError) as exc:
            raise UserError(f"{where}: the '{self.template.name}' template cannot write it ({exc!r}); a tool's "
                            "'parameters' must be a JSON schema object, each of its 'properties' an object",
                            title=TOOLS_TITLE) from None
        return text

    def check_images(self) -> None:
        """Refuses images when this model or template reads text only."""
        if self.vision is None:
            raise UserError(f"images were given, but {self.no_images}", title="cannot answer")

    def respond(self, messages: list[dict], system: str | None = None, tools=None,
                tools_source: str = "'tools'", images: list = ()) -> Answer:
        """The answer to the conversation so far and the calls it makes. Calls are looked for only when tools were
        offered, so a plain answer that happens to read like one stays an answer. `images` (PIL images, paths or
        bytes) go where the messages' <image> placeholders are, in order; with none written, before the first
        message's text, as LLaMA-Factory's chat engine puts them."""
        from tuneline.evaluation.generation import generate_batches

        prompt, pixels, tools = self.prepare(messages, system, tools, tools_source, images)
        [ids] = generate_batches(self.model, [prompt], self.settings, self.tokenizer.pad_token_id, self.eos_ids, 1,
                                 row_inputs=pixels)
        return self.read_answer(ids, tools)

    def prepare(self, messages: list[dict], system: str | None = None, tools=None, tools_source: str = "'tools'",
                images: list = ()) -> tuple[list[int], object, str | None]:
        """(prompt ids, `row_inputs` for the images or None, the tool text): what `respond` generates from, for a
        caller that generates itself (the API server streams)."""
        tools = self.tools if tools is None else self.prompt_tools(tools, tools_source)
        images = list(images)
        if images:
            self.check_images()
        if self.vision is not None:  # placeholders checked even without images: a stray one is no image token
            messages = self.vision.expand_safely(with_placeholders(messages, len(images)), images)
        prompt = self._prompt(messages, system, tools)
        return prompt, self.vision.pixel_inputs(prompt, images) if images else None, tools

    def read_answer(self, ids: list[int], tools: str | None) -> Answer:
        """The generated ids as text, and the calls in it when tools were offered."""
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens).strip()
        calls = self.template.extract_calls(text) if tools else text
        return Answer(text, calls_as_json(calls) if isinstance(calls, list) else [])

    def reply(self, messages: list[dict], system: str | None = None) -> str:
        """The answer's text alone, for callers that offer no tools."""
        return self.respond(messages, system).text

    def _prompt(self, messages: list[dict], system: str | None, tools: str | None) -> list[int]:
        """The prompt ids, up to the answer's opening; a function message that is no call is the caller's error."""
        try:
            prompt, _ = self.template.encode_oneturn(self.tokenizer, [*messages, {"role": "assistant", "content": ""}],
                                                     system, tools)
        except ToolDataError as exc:
            raise UserError(f"a function message cannot be written: {exc}", title="cannot answer") from None
        return prompt


class AnswerVision:
    """A vision-language model's image side at answer time: the template's plugin and the model's processor, the
    same `expand_messages`/`batch_inputs` (through the collator) that built and batched its training rows."""

    def __init__(self, media, tokenizer):
        from tuneline.data import build_collator

        self.media = media
        self.collator = build_collator("sft", tokenizer, media=media)

    def expand_safely(self, messages: list[dict], images: list) -> list[dict]:
        """The messages with each placeholder expanded to the model's image tokens; a count that does not match the
        images is the caller's error."""
        try:
            return self.media.expand(messages, images, [])
        except UserError as exc:
            raise UserError(exc.problems, title="cannot answer") from None

    def pixel_inputs(self, prompt: list[int], images: list):
        """`row_inputs` for generate_batches: the pixels (and per-token inputs) of the one prompt, left padded."""
        def inputs(chunk: list[int], length: int, left: bool) -> dict:
            return self.collator.media_inputs([{"input_ids": prompt, "images": images, "videos": []}], length, left)

        return inputs


def answer_vision(config, tokenizer, template) -> tuple[AnswerVision | None, str]:
    """The image side of a chat model, or None and why it reads text only."""
    from tuneline.data.mm import get_mm_plugin
    from tuneline.data.mm.run_media import RunMedia, media_settings
    from tuneline.model.processor import load_processor

    if template.mm_plugin is None:
        from tuneline.data.template_catalog import VISION

        return None, (f"'template: {template.name}' reads text only; use the model's vision-language template "
                      f"({', '.join(VISION)})")
    processor = load_processor(config, tokenizer)
    if processor is None:
        return None, f"'{config.model.model_name_or_path}' is a text-only model"
    media = RunMedia(get_mm_plugin(template.mm_plugin), processor, media_settings(config))
    return AnswerVision(media, tokenizer), ""


def with_placeholders(messages: list[dict], count: int) -> list[dict]:
    """Messages that write no <image> get `count` of them before the first message's text."""
    if count == 0 or any(IMAGE_PLACEHOLDER in message["content"] for message in messages):
        return messages
    first = messages[0]
    return [{**first, "content": IMAGE_PLACEHOLDER * count + first["content"]}, *messages[1:]]


def chat_loop(chat: Chat, read, write, images: list = ()) -> None:
    """Turn after turn until `exit` or end of input; `clear` starts a new conversation. After an answer that calls
    tools, what is typed next is their result. `/image PATH` (and `images`, for the first message) attaches an image
    to the next message, at its <image> placeholders or before its text."""
    history: list[dict] = []
    shown: list = []  # the images of the conversation, in the order their placeholders come
    pending = list(images)
    write(f"chatting with {chat.source or 'the adapters the config names'}; '{CLEAR}' starts over, '{EXIT}' "
          f"ends{f', {IMAGE!r} PATH attaches an image' if chat.vision else ''}\n")
    role = "user"
    while True:
        try:
            said = read("Observation: " if role == "observation" else "User: ").strip()
        except EOFError:
            return
        if said == EXIT:
            return
        if said == CLEAR:
            history, shown, pending, role = [], [], [], "user"
            continue
        if said.split(maxsplit=1)[:1] == [IMAGE]:
            pending += _attached(chat, said[len(IMAGE):].strip(), write)
            continue
        if not said:
            continue
        history.append({"role": role, "content": said if IMAGE_PLACEHOLDER in said else
                        IMAGE_PLACEHOLDER * len(pending) + said})
        try:
            answer = chat.respond(history, images=shown + pending)
        except UserError as error:  # a placeholder count that does not match: say so, forget the message
            write(f"{error}\n")
            history.pop()
            continue
        shown, pending = shown + pending, []
        if _answerable(answer.calls):
            history.append({"role": "function", "content": json.dumps(answer.calls, ensure_ascii=False)})
            write(calls_line(answer.calls) + "\n")
            role = "observation"
        else:
            history.append({"role": "assistant", "content": answer.text})
            write(f"Assistant: {answer.text}\n")
            role = "user"


def _attached(chat: Chat, path: str, write) -> list:
    """The image at `path`, read now, or nothing and why (the conversation goes on)."""
    from tuneline.data.mm.request_images import read_image

    try:
        chat.check_images()
        image = read_image(path, f"{IMAGE} {path}" if path else IMAGE)
    except UserError as error:
        write(f"{error}\n")
        return []
    write(f"attached {path}; it goes with your next message\n")
    return [image]


def _answerable(calls: list[dict]) -> bool:
    """Calls a function message can carry back to the model: the template writes arguments that are objects, so
    a call with other arguments is left as the answer's text."""
    return bool(calls) and all(isinstance(call["arguments"], dict) for call in calls)

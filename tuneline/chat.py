"""`tuneline chat CONFIG [--tools tools.json]`: talk to the trained model through its training template, as
`llamafactory-cli chat` does; the user plays the tools (docs/serving-and-hub.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from tuneline.config import RunConfig
from tuneline.data.tools import ToolDataError, calls_as_json, load_tools
from tuneline.errors import ConfigError, UserError
from tuneline.trained_model import trained_model_config

CLEAR, EXIT = "clear", "exit"
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
                 tools: list | str | None = None, tools_source: str = "the tool list"):
        from tuneline.data import get_template
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
        self.template = get_template(data.template, self.tokenizer, data.tool_format, data.default_system,
                                     data.tool_date)
        self.tools = self.prompt_tools(tools, tools_source)
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

    def respond(self, messages: list[dict], system: str | None = None, tools=None,
                tools_source: str = "'tools'") -> Answer:
        """The answer to the conversation so far and the calls it makes. Calls are looked for only when tools were
        offered, so a plain answer that happens to read like one stays an answer."""
        from tuneline.evaluation.generation import generate_batches

        tools = self.tools if tools is None else self.prompt_tools(tools, tools_source)
        prompt = self._prompt(messages, system, tools)
        [ids] = generate_batches(self.model, [prompt], self.settings, self.tokenizer.pad_token_id, self.eos_ids, 1)
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


def chat_loop(chat: Chat, read, write) -> None:
    """Turn after turn until `exit` or end of input; `clear` starts a new conversation. After an answer that calls
    tools, what is typed next is their result."""
    history: list[dict] = []
    write(f"chatting with {chat.source or 'the adapters the config names'}; '{CLEAR}' starts over, '{EXIT}' "
          "ends\n")
    role = "user"
    while True:
        try:
            said = read("Observation: " if role == "observation" else "User: ").strip()
        except EOFError:
            return
        if said == EXIT:
            return
        if said == CLEAR:
            history, role = [], "user"
            continue
        if not said:
            continue
        history.append({"role": role, "content": said})
        answer = chat.respond(history)
        if _answerable(answer.calls):
            history.append({"role": "function", "content": json.dumps(answer.calls, ensure_ascii=False)})
            write(calls_line(answer.calls) + "\n")
            role = "observation"
        else:
            history.append({"role": "assistant", "content": answer.text})
            write(f"Assistant: {answer.text}\n")
            role = "user"


def _answerable(calls: list[dict]) -> bool:
    """Calls a function message can carry back to the model: the template writes arguments that are objects, so
    a call with other arguments is left as the answer's text."""
    return bool(calls) and all(isinstance(call["arguments"], dict) for call in calls)

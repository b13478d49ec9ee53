"""What an export carries so that servers prompt the model as it was trained: the training template as the tokenizer's
(and processor's) jinja `chat_template`, an Ollama `Modelfile`, and SERVING.md when part of the template cannot be
written as jinja.

Without this a model trained with `template: llama3` on a base whose tokenizer speaks ChatML would be served in ChatML
by every server that reads the tokenizer, silently. A run on `template: auto` trained with the tokenizer's own chat
template, which the export keeps."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from tuneline.config import RunConfig
from tuneline.data.jinja_template import Unwritable, chat_template, unwritable
from tuneline.data.template_catalog import AUTO, get_template
from tuneline.export.ollama_modelfile import modelfile

logger = logging.getLogger("tuneline")

SERVING_NOTE = "SERVING.md"
MODELFILE = "Modelfile"


@dataclass(frozen=True)
class ChatExport:
    """The template an export speaks, where its chat_template came from, and what of it the jinja cannot write."""

    template: str
    chat_template: str  # "written from the training template" or "the tokenizer's own"
    unwritable: list[Unwritable] = field(default_factory=list)

    def record(self) -> dict:
        return {"template": self.template, "chat_template": self.chat_template,
                "unwritable": [dataclasses.asdict(gap) for gap in self.unwritable]}

    def warnings(self) -> list[str]:
        return [f"the chat template cannot write {gap.part}: {gap.consequence}" for gap in self.unwritable]


def _run_template(data, tokenizer):
    """The run's template as training built it, with the thinking switches where the config has them."""
    switches = {key: getattr(data, key) for key in ("enable_thinking", "preserve_thinking") if hasattr(data, key)}
    return get_template(data.template, tokenizer, data.tool_format, data.default_system, data.tool_date, **switches)


def prepare_chat(config: RunConfig, tokenizer, processor=None) -> tuple[ChatExport, object]:
    """Sets the training template as `tokenizer`'s (and `processor`'s) chat_template before they are saved; returns
    what was done and the template, for `write_chat_files`."""
    data = config.data
    template = _run_template(data, tokenizer)
    if data.template in AUTO and isinstance(getattr(tokenizer, "chat_template", None), str):
        return ChatExport(template.name, "the tokenizer's own"), template
    jinja = chat_template(template, tokenizer, data.tool_date)
    tokenizer.chat_template = jinja
    if processor is not None:
        processor.chat_template = jinja
    gaps = unwritable(template)
    for warning in (result := ChatExport(template.name, "written from the training template", gaps)).warnings():
        logger.warning(warning)
    return result, template


def stop_at_turn_ends(model, template, tokenizer) -> None:
    """The template's stop words that are single tokens join the model's eos in its generation config, so a server
    that stops at the config's eos (transformers serve, vLLM) ends an answer where `tuneline chat` does."""
    from tuneline.evaluation.generation import eos_token_ids

    if getattr(model, "generation_config", None) is None:  # a reward model scores, it does not generate
        return
    vocab = tokenizer.get_vocab()
    ids = eos_token_ids(tokenizer, model) | {vocab[word] for word in template.stop_words if word in vocab}
    if ids:
        model.generation_config.eos_token_id = sorted(ids) if len(ids) > 1 else ids.pop()


def write_chat_files(folder: Path, chat: ChatExport, template, tokenizer, config: RunConfig) -> None:
    """The Modelfile, and SERVING.md naming what the chat template cannot write (only when something)."""
    (folder / MODELFILE).write_text(modelfile(template, tokenizer, config.data.cutoff_len), encoding="utf-8")
    if chat.unwritable:
        lines = [f"# Serving this model\n\nIt was trained with the '{chat.template}' template. Its chat_template "
                 "renders conversations as training encoded them, except:\n"]
        lines += [f"- {gap.part}: {gap.consequence}." for gap in chat.unwritable]
        (folder / SERVING_NOTE).write_text("\n".join(lines) + "\n", encoding="utf-8")

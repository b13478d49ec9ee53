"""The Ollama `Modelfile` an export carries: `ollama create NAME -f Modelfile` in the export folder serves the model with
its training template, as LLaMA-Factory's exports allow.

Ollama formats prompts with a Go template of its own, not the jinja chat template, so this writes one from the same
declarative slots: prefix, system turn (or the system text fused into the first user turn), user, assistant and tool
turns, and the empty thought that closes a prompt when thinking is off. Go templates cannot write the tool formats or
strip earlier thoughts, so tool lists, tool calls and earlier thoughts are left to the jinja chat template (and to
`tuneline api`); the file says so in its header."""

from __future__ import annotations

from tuneline.data.jinja_template import special_text
from tuneline.data.templates import Special, Template

HEADER = ("# Ollama Modelfile written by `tuneline export`: `ollama create NAME -f Modelfile` in this folder.\n"
          "# The TEMPLATE writes the '{name}' template's turns; tool lists, tool calls and thoughts are not written\n"
          "# here (Ollama's Go templates cannot write them as training did): use the folder's chat_template with\n"
          "# transformers serve, vLLM or `tuneline api` for tool use.\n\n")


def _go_slots(slots, tokenizer, content: str) -> str:
    """Slots as Go template text: literal text as it is, `{{content}}` as the `content` action."""
    out = []
    for slot in slots:
        out.append(special_text(tokenizer, slot) if isinstance(slot, Special) else slot.replace("{{content}}", content))
    return "".join(out)


def go_template(template: Template, tokenizer) -> str:
    """Ollama's TEMPLATE for `template`: its prefix, system, then every message in its role's slots."""
    system = "{{ $.System }}"
    prefix = _go_slots(template.prefix, tokenizer, "")
    user_content = "{{ .Content }}"
    head = prefix
    if template.fuse_system:
        fused = _go_slots(tuple(s for s in template.slots["system"] if isinstance(s, str)), tokenizer, system)
        head += "{{ $first := true }}"  # .Messages may hold the system message too: the first user turn, not index 0
        user_content = "{{ if and $first $.System }}" + fused + "{{ end }}{{ $first = false }}{{ .Content }}"
    else:
        head += "{{ if .System }}" + _go_slots(template.slots["system"], tokenizer, system) + "{{ end }}"
    closing = _prompt_closing(template)
    return (head + "{{ range $i, $m := .Messages }}"
            + '{{ if eq .Role "user" }}' + _go_slots(template.slots["user"], tokenizer, user_content) + closing
            + '{{ else if eq .Role "assistant" }}' + _go_slots(template.slots["assistant"], tokenizer, "{{ .Content }}")
            + '{{ else if eq .Role "tool" }}' + _go_slots(template.slots["observation"], tokenizer, "{{ .Content }}")
            + closing + "{{ end }}{{ end }}")


def _prompt_closing(template: Template) -> str:
    """The empty thought that ends a prompt when a reasoning template's thinking is off, after the last message."""
    if not template.reasoning or getattr(template, "enable_thinking", True):
        return ""
    opening, closing = template.thought_words
    empty = getattr(template, "empty_thought", None) or opening + closing
    return "{{ if eq (len (slice $.Messages $i)) 1 }}" + empty + "{{ end }}"


def modelfile(template: Template, tokenizer, context_length: int) -> str:
    """The whole Modelfile: the folder as the model, the template, the default system prompt, the stop words."""
    text = HEADER.format(name=template.name) + f'FROM .\n\nTEMPLATE """{go_template(template, tokenizer)}"""\n\n'
    if template.default_system:
        text += f'SYSTEM """{template.default_system}"""\n\n'
    stops = dict.fromkeys([*template.stop_words, tokenizer.eos_token or ""])
    text += "".join(f"PARAMETER stop {_quoted(stop)}\n" for stop in stops if stop)
    return text + f"PARAMETER num_ctx {context_length}\n"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

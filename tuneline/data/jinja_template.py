"""A catalogue template written as a jinja chat template, so that an export renders prompts as training encoded them.

Every server (transformers serve, vLLM, TGI, any chat client) formats a conversation with the tokenizer's
`chat_template` alone. One generator reads a `Template`'s declarative definition (slots, prefix, default system,
fused system, thoughts, tool format, media plugin) and writes the jinja; no template has a hand-written one.

What a render equals: `Template.encode_oneturn`'s text, the prompt `tuneline chat` and LLaMA-Factory's inference write.
For a reasoning template that means earlier answers lose their thoughts (as the families' own templates do), and the
last answer without one gets the empty thought training added. A full conversation (ending with an answer) adds the
eos of an `efficient_eos` template, as training did. Messages are OpenAI's: `system`, `user`, `assistant` (with
`tool_calls`), `tool` (one message for a turn's results, as training rows hold them); content a string (with
`<image>`/`<video>` placeholders) or a list of text/image/video parts.

What cannot be written is named by `unwritable`: a tool format with no jinja writer, a media plugin whose processor
form is unknown here, or a template field this generator does not read. The export reports it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tuneline.data.jinja_tools import JINJA_TOOL_FORMATS, literal, refusing_tools
from tuneline.data.media import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from tuneline.data.templates import Special, Template

# the text a model's processor expands into the image's (video's) tokens, per media plugin of tuneline.data.mm
_QWEN_VISION = ("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>")
PROCESSOR_PLACEHOLDERS: dict[str, tuple[str | None, str | None]] = {
    "llava": ("<image>", None),
    "llava_next": ("<image>", None),
    "gemma3": ("<start_of_image>", None),
    "qwen2_vl": _QWEN_VISION,
    "qwen3_vl": _QWEN_VISION,
    "pixtral": ("[IMG]", None),
    "minicpm_v_4_6": ("<|image_pad|>", None),
    "mllama": ("<|image|>", None),
    "intern_vl": ("<IMG_CONTEXT>", "<video>"),
    "glm4v": ("<|begin_of_image|><|image|><|end_of_image|>", None),
}
# plugins whose images the model's processor places outside the text, and where: no chat template writes them there
PROCESSOR_PLACED = {"paligemma": "PaliGemma's processor puts the image tokens, then its own beginning of sequence, "
                                 "before the whole text"}
# the Template fields this generator reads; a new field set away from its default is reported, not silently dropped
READ_FIELDS = {"name", "user", "assistant", "system", "function", "observation", "prefix", "default_system",
               "stop_words", "efficient_eos", "fuse_system", "replace_eos", "reasoning", "tool_format",
               "thought_words", "tool_call_words", "today", "pt_eos", "mm_plugin", "slots", "native",
               "empty_thought", "enable_thinking", "preserve_thinking", "tools_slot"}


@dataclass(frozen=True)
class Unwritable:
    """A part of a template the jinja cannot write, and what that means for whoever serves the export."""

    part: str
    consequence: str


def unwritable(template: Template) -> list[Unwritable]:
    """What of `template` the generated chat template cannot render as training did ([] when it renders it all)."""
    found = []
    if template.tool_format not in JINJA_TOOL_FORMATS:
        found.append(Unwritable(f"tool format '{template.tool_format}'",
                                "the chat template refuses requests with tools or tool calls; serve tool use through "
                                "`tuneline api`, which writes them with the training code"))
    if template.mm_plugin in PROCESSOR_PLACED:
        found.append(Unwritable(f"media plugin '{template.mm_plugin}'",
                                f"{PROCESSOR_PLACED[template.mm_plugin]}, which a chat template cannot write as "
                                "training placed them; serve images through `tuneline api`"))
    elif template.mm_plugin is not None and template.mm_plugin not in PROCESSOR_PLACEHOLDERS:
        found.append(Unwritable(f"media plugin '{template.mm_plugin}'",
                                "images and videos are left as <image>/<video> text; serve them through `tuneline api`"))
    defaults = Template(name=template.name)
    for spec in dataclasses.fields(Template):
        if spec.name not in READ_FIELDS and getattr(template, spec.name) != getattr(defaults, spec.name):
            found.append(Unwritable(f"template field '{spec.name}'",
                                    "the chat template ignores it, so prompts may differ from training's"))
    return found


def _slots_expression(slots, tokenizer, content: str, idx: str | None = None) -> str:
    """A jinja expression for filled slots: literal text, the `content` variable, special tokens as their text."""
    parts = []
    for slot in slots:
        if isinstance(slot, Special):
            token = special_text(tokenizer, slot)
            if token:
                parts.append(literal(token))
            continue
        for k, piece in enumerate(slot.split("{{content}}")):
            if k:
                parts.append(content)
            for j, text in enumerate(piece.split("{{idx}}") if idx else [piece]):
                if j:
                    parts.append(f"({idx} | string)")
                if text:
                    parts.append(literal(text))
    return " ~ ".join(parts) or "''"


def special_text(tokenizer, special: Special) -> str:
    """A special slot's token as text, as training put its id: "" for a bos or eos the tokenizer lacks."""
    if special.name in ("bos", "eos"):
        token_id = tokenizer.bos_token_id if special.name == "bos" else tokenizer.eos_token_id
        return "" if token_id is None else tokenizer.convert_ids_to_tokens(token_id)
    return special.name


def _content_macro(template: Template) -> str:
    """`text_of(content)`: a message's text, media written as the model's processor expects them."""
    image, video = PROCESSOR_PLACEHOLDERS.get(template.mm_plugin or "", (None, None))
    refuse = ("{{- raise_exception('this chat template writes no ' ~ part['type'] ~ ' part: the model was trained on "
              "text only, or with a media plugin it has no writer for') -}}")
    image_part = "{{- " + literal(image) + " -}}" if image else refuse
    video_part = "{{- " + literal(video) + " -}}" if video else refuse
    string = "content"
    if image:
        string += f".replace({literal(IMAGE_PLACEHOLDER)}, {literal(image)})"
    if video:
        string += f".replace({literal(VIDEO_PLACEHOLDER)}, {literal(video)})"
    return ("{%- macro text_of(content) -%}{%- if content is none -%}{%- elif content is string -%}{{- " + string
            + " -}}{%- else -%}{%- for part in content -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
            "{%- elif part['type'] in ('image', 'image_url') -%}" + image_part
            + "{%- elif part['type'] in ('video', 'video_url') -%}" + video_part
            + "{%- else -%}{{- raise_exception('a message part of type ' ~ part['type'] ~ ' cannot be written') -}}"
            "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}")


def _thought_macro(template: Template) -> str:
    """`drop_thoughts(text)`: every opening...closing thought removed, as `between_words(...).sub` does."""
    opening, closing = template.thought_words
    return ("{%- macro drop_thoughts(text) -%}{%- set ns = namespace(rest=text, out='', going=true) -%}"
            "{%- for _ in range(text.count(" + literal(opening) + ")) -%}{%- if ns.going and " + literal(opening)
            + " in ns.rest -%}{%- set start = ns.rest.find(" + literal(opening) + ") -%}{%- set after = ns.rest[start + "
            + str(len(opening)) + ":] -%}{%- if " + literal(closing) + " in after -%}"
            "{%- set ns.out = ns.out ~ ns.rest[:start] -%}{%- set ns.rest = after[after.find(" + literal(closing)
            + ") + " + str(len(closing)) + ":] -%}{%- else -%}{%- set ns.going = false -%}{%- endif -%}{%- endif -%}"
            "{%- endfor -%}{{- (ns.out ~ ns.rest).lstrip('\\n') -}}{%- endmacro -%}")


def _thinking(template: Template) -> tuple[str, bool | None, bool]:
    """(the empty thought, enable_thinking, preserve_thinking), with the defaults of templates that lack the switches."""
    opening, closing = template.thought_words
    empty = getattr(template, "empty_thought", None) or opening + closing
    return empty, getattr(template, "enable_thinking", True), getattr(template, "preserve_thinking", False)


def _answer(template: Template, tokenizer) -> str:
    """The assistant branch: thoughts, then the answer or the calls in the template's tool format. Thoughts as the
    one-turn encoding writes them: earlier answers lose theirs (unless preserve_thinking), the last loses its own with
    thinking off, and gets the empty thought when it has none."""
    out = ""
    if template.reasoning:
        opening, closing = template.thought_words
        empty, enable, preserve = _thinking(template)
        drop_last = "true" if enable is False else "false"
        drop_history = "false" if preserve else "true"
        out += ("{%- if (loop.last and " + drop_last + ") or (not loop.last and " + drop_history + ") -%}"
                "{%- set content = drop_thoughts(content) -%}{%- endif -%}{%- if loop.last and "
                + literal(opening.strip()) + " not in content and " + literal(closing.strip())
                + " not in content -%}{{- " + literal(empty) + " -}}{%- endif -%}")
    function = _slots_expression(template.slots["function"], tokenizer, "content", "idx")
    assistant = _slots_expression(template.slots["assistant"], tokenizer, "content", "idx")
    return (out + "{%- if message.get('tool_calls') -%}{%- set content = content ~ tool_calls(message['tool_calls']) -%}"
            "{{- " + function + " -}}{%- else -%}{{- " + assistant + " -}}{%- endif -%}")


def _closing(template: Template, tokenizer) -> str:
    """After the messages: the empty thought that closes a prompt when thinking is off, or the eos an
    `efficient_eos` template adds once after a whole conversation."""
    out = ""
    if template.reasoning and not _thinking(template)[1]:
        out += ("{%- if add_generation_prompt and loop_messages and loop_messages[-1]['role'] != 'assistant' -%}"
                "{{- " + literal(_thinking(template)[0]) + " -}}{%- endif -%}")
    if template.efficient_eos:
        eos = _slots_expression((Special("eos"),), tokenizer, "''")
        out += "{%- if loop_messages and loop_messages[-1]['role'] == 'assistant' -%}{{- " + eos + " -}}{%- endif -%}"
    return out


def _tools_given(template: Template) -> str:
    """When the tool list is written: a format writes nothing for an empty list, a tools slot writes "[]" too."""
    return "tools is not none" if getattr(template, "tools_slot", None) else "tools"


def _first_turn(template: Template, tokenizer) -> str:
    """The prefix, then the system text (with the tool list) as its own turn or inside the first message. A tool list
    given, even empty, opens the system turn, as a row whose tools are "[]" does in training."""
    prefix = _slots_expression(template.prefix, tokenizer, "''")
    system = _slots_expression(template.slots["system"], tokenizer, "sys_text")
    if template.fuse_system:
        texts = tuple(s for s in template.slots["system"] if isinstance(s, str))
        place = "{%- set content = " + _slots_expression(texts, tokenizer, "sys_text") + " ~ content -%}"
    else:
        place = "{{- " + system + " -}}"
    return ("{%- if loop.first -%}{{- " + prefix + " -}}{%- if system or tools is not none -%}"
            "{%- set sys_text = system ~ (tool_text(tools) if " + _tools_given(template) + " else '') -%}" + place + "{%- endif -%}{%- endif -%}")


_TOOL_ROLES = "('tool', 'observation', 'ipython')"
_ONE_RESULT = ("{%- if loop.previtem is defined and loop.previtem['role'] in " + _TOOL_ROLES + " -%}"
               "{{- raise_exception('several tool messages in a row: send the results of the calls of one turn as "
               "one tool message (a JSON list of them), as training rows hold them') -}}{%- endif -%}")


def chat_template(template: Template, tokenizer, today: str | None = None) -> str:
    """The jinja chat template that renders conversations as `template` encodes them for `tokenizer`. `today` is the
    date llama3's tool prompt writes; None writes the date of each render (`strftime_now`), as Llama's own does."""
    tools = JINJA_TOOL_FORMATS.get(template.tool_format) or refusing_tools(
        f"tool format '{template.tool_format}' has no chat-template writer")
    if slot := getattr(template, "tools_slot", None):  # the tool list as JSON in a slot, not in the format's words
        head, _, tail = slot.partition("{{content}}")
        tools += ("{%- macro tool_text(tools) -%}{{- " + literal(head) + " ~ tools | tojson ~ " + literal(tail)
                  + " -}}{%- endmacro -%}")  # defined after the format's, so this one is called
    date = literal(today) if today else "strftime_now('%d %b %Y')"
    user = _slots_expression(template.slots["user"], tokenizer, "content", "idx")
    observation = _slots_expression(template.slots["observation"], tokenizer, "content", "idx")
    body = (
        "{%- set today = " + date + " -%}"
        "{%- if messages and messages[0]['role'] == 'system' -%}{%- set system = text_of(messages[0]['content']) -%}"
        "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set system = '' -%}"
        "{%- set loop_messages = messages -%}{%- endif -%}"
        "{%- set system = system or " + literal(template.default_system) + " -%}"
        "{%- for message in loop_messages -%}{%- set idx = loop.index0 // 2 -%}"
        "{%- set content = text_of(message['content']) -%}" + _first_turn(template, tokenizer)
        + "{%- if message['role'] == 'assistant' -%}" + _answer(template, tokenizer)
        + "{%- elif message['role'] in " + _TOOL_ROLES + " -%}" + _ONE_RESULT + "{{- " + observation + " -}}"
        "{%- elif message['role'] == 'user' -%}{{- " + user + " -}}"
        "{%- else -%}{{- raise_exception('a ' ~ message['role'] ~ ' message cannot stand here: after an optional "
        "first system message, messages are user, assistant and tool') -}}{%- endif -%}{%- endfor -%}"
    )
    header = (f"{{#- tuneline's '{template.name}' template, written from the definition training encoded with: "
              "OpenAI-style messages (system, user, assistant with tool_calls, tool), tools=, add_generation_prompt "
              "-#}")
    return header + _content_macro(template) + _thought_macro(template) + tools + body + _closing(template, tokenizer)
